"""Convolution version ``winograd``: 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3), float32, deterministic.

Each 2x2 block of the output (a tile; the map's last tiles partial where its size is odd) comes from the 4x4
input window at (2*ty - p, 2*tx - p), zero outside the image. With the constant matrices B^T (4x4), G (4x3) and
A^T (2x4) of F(2, 3), every pass is transforms around ONE batched GEMM of the 16 positions (``gemm.batched``):

* forward: V = B^T d B per tile and input channel (V (16, Cin, T), T tiles), U = G g G^T per (ci, co)
  (U (16, Cin, Cout)), M[pos] = V[pos]^T @ U[pos] (M (16, Cout, T)), y = A^T M A per tile with the bias and
  ReLU, stored NCHW (the tile's elements inside the map only);
* input gradient: the same on dy with the 180-degree rotated, in/out-swapped weights (the full correlation,
  padding 2 - p), the ReLU mask applied by the output transform;
* weight gradient (``winograd_wgrad``, with its dy transform): dU[pos] = V[pos] @ dM[pos]^T, dM the transform of
  dy, then dW = G^T dU G.

The ``_up`` launchers run the passes of a conv on the 2x nearest upsample of x (``conv.upsampled``'s twins): the input
transform reads through the upsample; the input gradient's output transform sums each tile's 2x2 outputs (one pixel of
x). Transforms are elementwise kernels, one thread per (channel, tile), consecutive threads on consecutive tiles (the
scratch buffers' writes coalesced). The scratch buffers are allocated when a launch is bound (NaN-filled) and held by
its ``LaunchGroup``. Padding 0..2 (the input gradient's is 2 - p). Measurements: NOTES.md.

Storage (``storage``, compile time): the buffers the batched GEMM reads as A or B and a transform writes (V, the
weight gradient's dM; not U, M or the partials) are float32 (``fp32``) or, with the GEMM version ``tensor_bf16``
only, BF16 bits in uint16 (``bf16``, half the bytes): the transform rounds each value as that GEMM rounds it when it
stores a tile to shared memory (``mma.bf16_bits``, the same instruction, to nearest even) and the GEMM reads the
bits back exactly (as BF16 pairs where they cannot straddle: ``gemm.batched``), so every pass gives bit for bit
the result of its ``fp32`` storage on tensor_bf16. The forward's kept ``v`` then holds uint16 (``transform_dtype``).
The training engine uses it for a bf16 policy where backends/gpu/layers.py's WINOGRAD_BF16_STORAGE is on (the
default).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import epilogue_args, epilogue_flags, shape
from ..gemm.batched import gemm_batched
from ..gemm.indexing import device_function
from ..jit import jit
from ..launch import LaunchGroup, bind, check_device_array, flat, grid_for
from ..mma import bf16_bits
from .implicit_gemm import _activation, _expect, _geometry
from .upsampled import upsampled_shape

__all__ = ["STORAGES", "TRANSFORM_THREADS", "conv_backward_data_winograd", "conv_backward_data_winograd_up",
           "conv_forward_winograd", "conv_forward_winograd_up", "input_transform_size", "transform_dtype",
           "winograd_fits", "winograd_version"]

TRANSFORM_THREADS = 256
POSITIONS = 16  # the 4x4 transformed tile
STORAGES = {"fp32": np.float32, "bf16": np.uint16}  # a transform buffer's storage -> its dtype
BF16_NAN = np.uint16(0x7FC0)
_HALF = float32(0.5)
_F0 = float32(0.0)
_U1 = np.uint32(1)
_U2 = np.uint32(2)
# transform dims: (N, C, H, W) of the map the input transform reads, (OH, OW) of the output grid, tiles (th, tw),
# T = N * th * tw, the padding
_N, _C, _H, _W, _OH, _OW, _TH, _TW, _T, _P = range(10)


def winograd_fits(cin, cout, k, padding, height=None, width=None) -> bool:
    """Whether the version handles a layer: 3x3 kernels, padding 0..2 (its input gradient's is 2 - padding)."""
    return k == 3 and 0 <= padding <= 2


def winograd_version(m: int, n: int) -> str:
    """The batched GEMM's version: the 128x128 tiles (coalesced128) where both sides fill them, else regblock."""
    return "coalesced128" if min(m, n) >= 128 else "regblock"


def _tdims(n, c, h, w, oh, ow, padding):
    th, tw = -(-oh // 2), -(-ow // 2)
    return tuple(np.uint32(v) for v in (n, c, h, w, oh, ow, th, tw, n * th * tw, padding))


def _threads():
    return 32 if device.simulator_enabled() else TRANSFORM_THREADS  # the simulator runs a thread per block slot


def _scratch(size, storage="fp32"):
    """A NaN-filled buffer of the storage's dtype (an element no kernel wrote would poison the result)."""
    if storage == "bf16":
        return cuda.to_device(np.full(int(size), BF16_NAN, dtype=np.uint16))
    return cuda.to_device(np.full(int(size), np.nan, dtype=np.float32))


def _tag(storage):
    """A transform launch's name suffix: its storage where not float32."""
    return "" if storage == "fp32" else f",{storage}"


def transform_dtype(storage: str):
    """The dtype of a transform buffer (V, dM) in `storage`: float32, or uint16 holding BF16 bits."""
    return STORAGES[storage]


@functools.cache
def _put(storage):
    """put(buf, i, x): buf[i] = x as `storage` holds it (float32, or its BF16 bits)."""
    if storage == "bf16":

        @device_function
        def put(buf, i, x):
            buf[i] = bf16_bits(x)

        return put

    @device_function
    def put(buf, i, x):
        buf[i] = x

    return put


@device_function
def _tile(e, t_all, tt, dims):
    """(channel, image, tile row, tile column) of element e = c * T + t of a transform's (C, T) grid."""
    c = uint32(e // t_all)
    t = uint32(e - c * t_all)
    n = uint32(t // tt)
    r = uint32(t - n * tt)
    ty = uint32(r // dims[_TW])
    return c, n, ty, uint32(r - ty * dims[_TW])


@functools.cache
def _reader(pool):
    """get(src, i, h, w): element i of the flat source at (h, w) of the map the window reads. Plain: src[i]. With
    `pool` src is (dpool, route) flat and (h, w) a pixel of the expanded gradient (2PH, 2PW): dpool[i] where route[i]
    names (h % 2, w % 2), else 0 (ROUTE_NONE names none)."""
    if pool:

        @device_function
        def get(src, i, h, w):
            return src[0][i] if uint32(src[1][i]) == uint32(((h & _U1) << _U1) | (w & _U1)) else _F0

        return get

    @device_function
    def get(src, i, h, w):
        return src[i]

    return get


@functools.cache
def _input_kernel(up, storage="fp32", pool=False):
    """The input transform; with `up` it reads the 2x nearest upsample of x (the window's bounds (2H, 2W)); with
    `pool`, x is (dpool, route) of shape (PH, PW) read as the expanded gradient (2PH, 2PW) (``_reader``); v in
    `storage`."""
    shift = np.uint32(1 if up or pool else 0)
    put = _put(storage)
    get = _reader(pool)

    @jit
    def input_transform(x, v, dims):
        """v[pos, c, t] = (B^T d B)[pos] of the 4x4 window d of tile t in channel c of x (flat NCHW; a pair with
        `pool`)."""
        d = cuda.local.array(POSITIONS, float32)
        t_all = dims[_T]
        ct = uint32(dims[_C] * t_all)
        tt = uint32(dims[_TH] * dims[_TW])
        h_in = uint32(dims[_H] << shift)
        w_in = uint32(dims[_W] << shift)
        e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while e < ct:
            c, n, ty, tx = _tile(e, t_all, tt, dims)
            h0 = uint32(ty * _U2 - dims[_P])  # mod 2^32: one unsigned compare rejects both sides of the padding
            w0 = uint32(tx * _U2 - dims[_P])
            base = uint32(uint32(n * dims[_C] + c) * dims[_H] * dims[_W])
            for i in range(4):
                hi = uint32(h0 + uint32(i))
                for j in range(4):
                    wj = uint32(w0 + uint32(j))
                    d[i * 4 + j] = (get(x, uint32(base + (hi >> shift) * dims[_W] + (wj >> shift)), hi, wj)
                                    if hi < h_in and wj < w_in else _F0)
            for j in range(4):  # B^T d: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
                a0, a1, a2, a3 = d[j], d[4 + j], d[8 + j], d[12 + j]
                d[j] = a0 - a2
                d[4 + j] = a1 + a2
                d[8 + j] = a2 - a1
                d[12 + j] = a1 - a3
            for i in range(4):  # (B^T d) B
                a0, a1, a2, a3 = d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]
                d[4 * i] = a0 - a2
                d[4 * i + 1] = a1 + a2
                d[4 * i + 2] = a2 - a1
                d[4 * i + 3] = a1 - a3
            for pos in range(POSITIONS):
                put(v, uint32(uint32(pos) * ct + e), d[pos])
            e = uint32(e + stride)

    return input_transform


@jit
def _weight_transform(w, u, rows, cols, flip):
    """u[pos, r, c] = (G g G^T)[pos]: g = w[c, r] (forward: rows Cin, cols Cout), or with `flip` g = w[r, c]
    rotated by 180 degrees (the input gradient's kernel: rows Cout, cols Cin)."""
    g = cuda.local.array(12, float32)
    rc = uint32(rows * cols)
    e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while e < rc:
        r = uint32(e // cols)
        c = uint32(e - r * cols)
        for kh in range(3):
            for kw in range(3):
                g[kh * 3 + kw] = w[r, c, 2 - kh, 2 - kw] if flip else w[c, r, kh, kw]
        for j in range(3):  # G g, rows 0..3 in the 12 slots: G = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]
            g0, g1, g2 = g[j], g[3 + j], g[6 + j]
            g[j] = g0
            g[3 + j] = _HALF * (g0 + g1 + g2)
            g[6 + j] = _HALF * (g0 - g1 + g2)
            g[9 + j] = g2
        for i in range(4):  # (G g) G^T, stored per position
            t0, t1, t2 = g[3 * i], g[3 * i + 1], g[3 * i + 2]
            base = uint32(uint32(4 * i) * rc + e)
            u[base] = t0
            u[uint32(base + rc)] = _HALF * (t0 + t1 + t2)
            u[uint32(base + _U2 * rc)] = _HALF * (t0 - t1 + t2)
            u[uint32(base + np.uint32(3) * rc)] = t2
        e = uint32(e + stride)


@device_function
def _at_m(m, ct, e, t2):
    """t2 (2x4, flat) = A^T M of element e of m (16, C, T) (ct = C * T): A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]."""
    for j in range(4):
        m0 = m[uint32(uint32(j) * ct + e)]
        m1 = m[uint32(uint32(4 + j) * ct + e)]
        m2 = m[uint32(uint32(8 + j) * ct + e)]
        m3 = m[uint32(uint32(12 + j) * ct + e)]
        t2[j] = m0 + m1 + m2
        t2[4 + j] = m1 - m2 - m3


@device_function
def _at_m_a(t2, i, j):
    """Output (i, j) of the tile: ((A^T M) A)[i, j] from t2 of ``_at_m``."""
    if j == 0:
        return t2[4 * i] + t2[4 * i + 1] + t2[4 * i + 2]
    return t2[4 * i + 1] - t2[4 * i + 2] - t2[4 * i + 3]


@functools.cache
def _output_kernel(epilogue, down=False):
    """The output transform; with `down` (the input gradient of a conv on a 2x upsample) each tile's 2x2 outputs
    are summed into one element of the (OH/2, OW/2) map (the upsample's backward; OH, OW even)."""
    has_bias, relu, mask = epilogue_flags(epilogue)

    @jit
    def output_transform(m, y, aux, dims):
        """y = A^T M A per tile and channel (m (16, C, T)), with the epilogue, into flat NCHW y on (OH, OW)."""
        t2 = cuda.local.array(8, float32)
        t_all = dims[_T]
        ct = uint32(dims[_C] * t_all)
        tt = uint32(dims[_TH] * dims[_TW])
        e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while e < ct:
            c, n, ty, tx = _tile(e, t_all, tt, dims)
            _at_m(m, ct, e, t2)
            if down:  # one element per tile: its 4 outputs summed (row 0's pair, then row 1's)
                val = _F0
                for i in range(2):
                    val += t2[4 * i] + t2[4 * i + 1] + t2[4 * i + 2]
                    val += t2[4 * i + 1] - t2[4 * i + 2] - t2[4 * i + 3]
                idx = uint32(uint32(uint32(n * dims[_C] + c) * tt + ty * dims[_TW] + tx))
                if mask and not aux[idx] > _F0:
                    val = _F0
                y[idx] = val
            else:
                base = uint32(uint32(n * dims[_C] + c) * dims[_OH] * dims[_OW])
                for i in range(2):
                    oh = uint32(ty * _U2 + uint32(i))
                    for j in range(2):  # (A^T M) A
                        ow = uint32(tx * _U2 + uint32(j))
                        if oh < dims[_OH] and ow < dims[_OW]:
                            val = _at_m_a(t2, i, j)
                            idx = uint32(base + oh * dims[_OW] + ow)
                            if has_bias:
                                val += aux[c]
                            if relu and val < _F0:
                                val = _F0
                            if mask and not aux[idx] > _F0:
                                val = _F0
                            y[idx] = val
            e = uint32(e + stride)

    return output_transform


# ---------------------------------------------------------------------------------------------------------
# Launchers


def _check(op, k, padding):
    if not winograd_fits(0, 0, k, int(padding)):
        raise ValueError(f"{op}: Winograd F(2x2, 3x3) takes 3x3 kernels with padding 0..2, got k {k}, padding "
                         f"{padding}; use the implicit_gemm version")


def _version(op, version, m, n):
    from ..gemm.batched import BATCH_VERSIONS

    if version is None:
        return winograd_version(m, n)
    if version not in BATCH_VERSIONS:
        raise ValueError(f"{op}: unknown batched GEMM version {version!r}; choose from {BATCH_VERSIONS}")
    return version


def _storage(op, storage, version):
    if storage not in STORAGES:
        raise ValueError(f"{op}: unknown storage {storage!r}; choose from {tuple(STORAGES)}")
    if storage == "bf16" and version != "tensor_bf16":
        raise ValueError(f"{op}: storage 'bf16' needs version 'tensor_bf16' (the GEMM that rounds to BF16 anyway), "
                         f"got {version!r}")
    return storage


def input_transform_size(x_shape, padding, up=False, pool=False) -> int:
    """Elements of the transformed input V (16, C, T) of a forward or weight-gradient pass on x of `x_shape`
    (N, C, H, W) (`up`: on its 2x upsample) with 3x3 kernels and `padding`: the ``v`` buffer they can share (its
    dtype ``transform_dtype(storage)``). `pool`: of the passes fused with the 2x2 pool (``winograd_pool``), whose
    tiles are the pooling windows (an odd output's last row / column has none)."""
    n, c, h, w = (int(d) for d in x_shape)
    if up:
        h, w = 2 * h, 2 * w
    oh, ow = h + 2 * int(padding) - 2, w + 2 * int(padding) - 2
    if pool:
        return POSITIONS * c * n * (oh // 2) * (ow // 2)
    return POSITIONS * c * n * (-(-oh // 2)) * (-(-ow // 2))


def _v_buffer(op, v, size, storage):
    check_device_array(op, "v", v, 1, transform_dtype(storage))
    if v.size != size:
        raise ValueError(f"{op}: v must hold the transformed input, {size} elements (input_transform_size), got "
                         f"{v.size}")
    return v


def _bind(kernel, n, args, stream, name):
    threads = _threads()
    return bind(kernel, grid_for(n, threads), threads, args, stream, False, name)


def _winograd_conv(op, src, w, out, epilogue, aux, padding, flip, version, block, stream, launch, up=False,
                   down=False, v=None, storage="fp32"):
    """out = the Winograd convolution of src (N, C, H', W') by the 3x3 kernel u made from w (``_weight_transform``,
    `flip` for the input gradient's), padding p, with the epilogue: the forward and input-gradient passes. `up`:
    src is read through its 2x upsample; `down`: the output grid is twice out's size, each 2x2 block summed; `v`:
    the buffer the input transform writes (None: a scratch buffer of its own), in `storage`."""
    oh, ow = ((2 if down else 1) * int(v) for v in shape(out)[2:])
    return winograd_group(op, flat(src), shape(src), w, shape(out)[1], oh, ow, padding, flip, version, block,
                          stream, launch, output_launch(op, epilogue, out, aux, stream, down),
                          _input_kernel(up, storage), v, storage)


def output_launch(op, epilogue, out, aux, stream, down=False):
    """``winograd_group``'s `output`: the output transform (``_output_kernel``) into out (NCHW) with the epilogue."""

    def output(m, td_out):
        return _bind(_output_kernel(epilogue, down), int(td_out[_C] * td_out[_T]), (m, flat(out), aux, td_out),
                     stream, f"{op}[output transform,{epilogue}]")

    return output


def winograd_group(op, src, src_shape, w, c_out, oh, ow, padding, flip, version, block, stream, launch, output,
                   input_kernel, v=None, storage="fp32"):
    """The launches of a forward-like pass on the (oh, ow) output grid: weight transform, `input_kernel` on `src`
    (its map (N, C, H', W') = `src_shape`), the batched GEMM into M (16, c_out, T), and `output(m, dims)` (the output
    transform's Launch; dims of the (c_out, T) grid); `v` and `storage` as ``_winograd_conv``'s."""
    n, c_in, h, wd = src_shape
    td_in = _tdims(n, c_in, h, wd, oh, ow, padding)
    td_out = _tdims(n, c_out, h, wd, oh, ow, padding)
    tiles = int(td_in[_T])
    version = _version(op, version, tiles, c_out)
    storage = _storage(op, storage, version)
    size = POSITIONS * c_in * tiles
    v = _scratch(size, storage) if v is None else _v_buffer(op, v, size, storage)
    u, m = _scratch(POSITIONS * c_in * c_out), _scratch(POSITIONS * c_out * tiles)
    group = LaunchGroup([
        _bind(_weight_transform, c_in * c_out, (w, u, np.uint32(c_in), np.uint32(c_out), bool(flip)), stream,
              f"{op}[weight transform]"),
        _bind(input_kernel, c_in * tiles, (src, v, td_in), stream, f"{op}[input transform{_tag(storage)}]"),
        gemm_batched(version, tiles, c_out, c_in, POSITIONS, v, u, m, a_map="batch_t", b_map="batch",
                     store="batch_t", block=block, stream=stream, launch=False, op=op),
        output(m, td_out),
    ])
    if launch:
        group()
    return group


def conv_forward_winograd(x, w, bias, out, padding, relu=False, version=None, block=None, stream=0,
                          launch=True, v=None, storage="fp32") -> LaunchGroup:
    """out = conv(x, w) (+ bias) (ReLU): x (N, Cin, H, W), w (Cout, Cin, 3, 3) (any strides), bias (Cout,) or
    None, out (N, Cout, OH, OW). ``version``, ``block``: the batched GEMM's (None: ``winograd_version``, its
    block). ``v``: a buffer of ``input_transform_size`` elements (dtype ``transform_dtype(storage)``) to keep the
    transformed input in (the weight gradient of the same step can then take it instead of transforming x again).
    ``storage``: the transformed input's, ``fp32`` or ``bf16`` (version tensor_bf16 only: the same result, V in half
    the bytes; module docstring)."""
    op = "conv_forward_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), w, padding)
    _check(op, k, padding)
    n, cout = shape(x)[0], int(w.shape[0])
    _activation(op, "out", out)
    _expect(op, "out", out, (n, cout, oh, ow))
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    epilogue, aux = epilogue_args(op, bias, relu, None)
    return _winograd_conv(op, x, w, out, epilogue, aux, padding, False, version, block, stream, launch, v=v,
                          storage=storage)


def conv_backward_data_winograd(dy, w, dx, padding, relu_mask=None, version=None, block=None, stream=0,
                                launch=True, storage="fp32") -> LaunchGroup:
    """dx = dL/dx of out = conv(x, w): dy (N, Cout, OH, OW), w (Cout, Cin, 3, 3), dx (N, Cin, H, W); dx = 0
    where ``relu_mask`` (dx's shape) <= 0. The forward machinery on dy with the rotated kernel, padding 2 - p;
    ``storage``: the transformed dy's (as the forward's)."""
    op = "conv_backward_data_winograd"
    _activation(op, "dy", dy)
    _activation(op, "dx", dx)
    k, oh, ow = _geometry(op, shape(dx), w, padding)
    _check(op, k, padding)
    n, cout = shape(dx)[0], int(w.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, shape(dx))
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    return _winograd_conv(op, dy, w, dx, epilogue, aux, 2 - int(padding), True, version, block, stream, launch,
                          storage=storage)


# ---------------------------------------------------------------------------------------------------------
# On a 2x nearest upsample of x (conv.upsampled's passes): the input transform reads through the upsample, and
# the input gradient's output transform sums each tile's 2x2 outputs (a tile is one upsampled pixel: its origin
# is even), so neither up(x) nor its gradient is stored.


def conv_forward_winograd_up(x, w, bias, out, padding, relu=False, version=None, block=None, stream=0,
                             launch=True, v=None, storage="fp32") -> LaunchGroup:
    """out = conv(up(x), w) (+ bias) (ReLU): x (N, Cin, H, W), out (N, Cout, OH, OW) with OH = 2H + 2p - 2; ``v``
    and ``storage`` as in ``conv_forward_winograd``."""
    op = "conv_forward_winograd_up"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, upsampled_shape(shape(x)), w, padding)
    _check(op, k, padding)
    n, cout = shape(x)[0], int(w.shape[0])
    _activation(op, "out", out)
    _expect(op, "out", out, (n, cout, oh, ow))
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    epilogue, aux = epilogue_args(op, bias, relu, None)
    return _winograd_conv(op, x, w, out, epilogue, aux, padding, False, version, block, stream, launch, up=True,
                          v=v, storage=storage)


def conv_backward_data_winograd_up(dy, w, dx, padding, relu_mask=None, version=None, block=None, stream=0,
                                   launch=True, storage="fp32") -> LaunchGroup:
    """dx = dL/dx of out = conv(up(x), w): dy (N, Cout, OH, OW), dx and ``relu_mask`` (N, Cin, H, W): the input
    gradient at the upsampled size, each 2x2 block summed by the output transform; ``storage`` as in
    ``conv_backward_data_winograd``."""
    op = "conv_backward_data_winograd_up"
    _activation(op, "dy", dy)
    _activation(op, "dx", dx)
    k, oh, ow = _geometry(op, upsampled_shape(shape(dx)), w, padding)
    _check(op, k, padding)
    n, cout = shape(dx)[0], int(w.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, shape(dx))
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    return _winograd_conv(op, dy, w, dx, epilogue, aux, 2 - int(padding), True, version, block, stream, launch,
                          down=True, storage=storage)
