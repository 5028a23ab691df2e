"""Convolutions whose input is the nearest-neighbour 2x upsample of x, u = up(x) (N, C, 2H, 2W), never
materialised: every pass reads x (N, C, H, W) and the upsample's own launches disappear (the autoencoder's
decoder, Upsample followed by Conv2d). ``UP_VERSIONS`` in the package lists them per pass.

* ``implicit_gemm`` forward: out = conv(u, w) (+ bias) (ReLU), the implicit GEMM of ``implicit_gemm`` with the
  A loader ``im2col_up2`` (reads x[n, c, ih >> 1, iw >> 1]); any GEMM version, skinny included.
* ``implicit_gemm`` backward_data: dx (N, Cin, H, W) = the upsample backward of the input gradient of the conv at
  the upsampled size (the 2x2 block sums), computed directly on the small map as ONE stride-2 GEMM of dy with the
  (k+1) x (k+1) kernel of summed flipped taps (``gemm.mappings_up``: the identity and why it is exact):
  M = N*H*W, N = Cin, K = Cout*(k+1)^2; the ReLU mask of the layer before fused (epilogue ``mask``). The summed
  kernel is made first by a small launch into a scratch buffer (the group's), read by the plain flipped-weight
  loader.
* ``implicit_gemm`` backward_weight: dw = the weight gradient with the B loader ``im2col_k_up2``.
* ``staged`` backward_weight: the staged version (``staged``) staging the upsampled planes from x.

The bias gradient reads dy only: the plain versions serve. Float64 references: ``conv_*_up_ref``, composed of the
references of ``reference`` and ``gpunn.kernels.pool``'s upsample references.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, epilogue_args, shape
from ..gemm import auto_splits, conv_problem, gemm_split_k, multiprocessors, output_tiles
from ..launch import Launch, LaunchGroup, bind, flat
from ..pool import upsample2x_backward_ref, upsample2x_forward_ref
from .checks import _device_array, _padding, _weight, jit_for
from .checks import _geometry as _direct_geometry
from .implicit_gemm import WGRAD_SPLIT_WAVES, _activation, _expect, _geometry, _splits, _version, forward_gemm
from .reference import conv_backward_data_ref, conv_backward_weight_ref, conv_forward_ref
from .staged import staged_group

__all__ = [
    "conv_backward_data_implicit_gemm_up",
    "conv_backward_data_up_ref",
    "conv_backward_weight_implicit_gemm_up",
    "conv_backward_weight_staged_up",
    "conv_backward_weight_up_ref",
    "conv_forward_implicit_gemm_up",
    "conv_forward_up_ref",
    "upsampled_shape",
]


def upsampled_shape(x_shape) -> tuple:
    """(N, C, 2H, 2W) of an (N, C, H, W) shape."""
    n, c, h, w = (int(v) for v in x_shape)
    return n, c, 2 * h, 2 * w


def conv_forward_implicit_gemm_up(x, w, bias, out, padding, relu=False, version=None, block=None, stream=0,
                                  launch=True, splits=None) -> Launch | LaunchGroup:
    """out = conv(up(x), w) (+ bias) (ReLU): x (N, Cin, H, W), out (N, Cout, OH, OW) with OH = 2H + 2p - k + 1;
    the rest as ``conv_forward_implicit_gemm``."""
    return forward_gemm("conv_forward_implicit_gemm_up", x, w, bias, out, padding, relu, version, block, stream,
                        launch, splits, "im2col_up2", upsampled_shape(shape(x)))


def conv_backward_data_implicit_gemm_up(dy, w, dx, padding, relu_mask=None, version=None, block=None, stream=0,
                                        launch=True, splits=None) -> Launch | LaunchGroup:
    """dx = dL/dx of out = conv(up(x), w): dy (N, Cout, OH, OW), dx and ``relu_mask`` (N, Cin, H, W) (dx = 0 where
    the mask <= 0); one stride-2 GEMM with the summed kernel (module docstring)."""
    op = "conv_backward_data_implicit_gemm_up"
    _activation(op, "dy", dy)
    _activation(op, "dx", dx)
    n, cin, h, wd = shape(dx)
    k, oh, ow = _geometry(op, upsampled_shape(shape(dx)), w, padding)
    cout = int(w.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, shape(dx))
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    # dx[n, ci, h, w] = sum dy[n, co, 2h + u - (k-1-p), 2w + v - (k-1-p)] * W'[co, ci, u, v], u, v in [0, k]
    kw = k + 1
    problem = conv_problem(n * h * wd, cin, cout * kw * kw, (cout, oh, ow), (h, wd), k - 1 - padding, cin)
    version = _version(op, version, problem.m, problem.n, problem.k)
    # W' made once per step into a scratch buffer the group owns, stored flipped so that the plain flipped-weight
    # loader reads it
    summed = cuda.device_array((cout, cin, kw, kw), np.float32)
    total = cout * cin * kw * kw
    prepare = bind(_summed_flip_kernel(k), min(cdiv(total, SUMMED_THREADS), SUMMED_MAX_BLOCKS), SUMMED_THREADS,
                   (w, summed, np.uint32(cin), np.uint32(total)), stream, False, f"{op}.summed_kernel[k{k}]")
    gemm = gemm_split_k(version, problem, flat(dy), summed, flat(dx), aux, epilogue, a_map="im2col_s2",
                        b_map="weight_flip_t", store="nchw", ksize=kw, splits=_splits(op, splits, version, problem),
                        block=block, stream=stream, launch=False, op=op,
                        name=f"{op}[{version},k{k},p{padding},{epilogue}]")
    group = LaunchGroup((prepare, *(gemm.launches if isinstance(gemm, LaunchGroup) else (gemm,))))
    if launch:
        group()
    return group


SUMMED_THREADS = 256
SUMMED_MAX_BLOCKS = 1024  # grid-stride beyond this


@functools.cache
def _summed_flip_kernel(k: int):
    """ws[co, ci, k-u, k-v] = W'[co, ci, u, v] = sum over a, b in {0, 1} (a outer) with 0 <= u-a, v-b < k of
    w[co, ci, k-1-(u-a), k-1-(v-b)]: the backward-data GEMM's summed kernel, flipped (``gemm.mappings_up``)."""
    kw = np.uint32(k + 1)
    kk = np.uint32((k + 1) * (k + 1))
    ks = np.uint32(k)
    last = np.uint32(k - 1)

    @jit_for(SUMMED_THREADS)
    def summed_flip_kernel(w, ws, cin, total):
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            pair = uint32(i // kk)
            rem = uint32(i - pair * kk)
            co = uint32(pair // cin)
            ci = uint32(pair - co * cin)
            u = uint32(rem // kw)
            v = uint32(rem - u * kw)
            acc = float32(0.0)
            for a in range(2):
                uu = uint32(u - uint32(a))  # wraps above k - 1 when u = 0, a = 1
                if uu < ks:
                    for b in range(2):
                        vv = uint32(v - uint32(b))
                        if vv < ks:
                            acc += w[co, ci, uint32(last - uu), uint32(last - vv)]
            ws[co, ci, uint32(ks - u), uint32(ks - v)] = acc
            i = uint32(i + stride)

    return summed_flip_kernel


def conv_backward_weight_implicit_gemm_up(x, dy, dw, padding, version=None, block=None, stream=0, launch=True,
                                          splits=None) -> Launch | LaunchGroup:
    """dw = dL/dw of out = conv(up(x), w) (overwritten): x (N, Cin, H, W), dy (N, Cout, OH, OW), dw
    (Cout, Cin, k, k); split-K as ``conv_backward_weight_implicit_gemm``."""
    op = "conv_backward_weight_implicit_gemm_up"
    _activation(op, "x", x)
    _activation(op, "dy", dy)
    n, cin, h, wd = shape(x)
    k, oh, ow = _geometry(op, upsampled_shape(shape(x)), dw, padding, "dw")
    cout = int(dw.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    _, aux = epilogue_args(op, None, False, None)
    problem = conv_problem(cout, cin * k * k, n * oh * ow, (cin, h, wd), (oh, ow), padding, cout)
    version = _version(op, version, problem.m, problem.n, problem.k)
    if splits is None and not device.simulator_enabled():
        splits = auto_splits(problem.k, output_tiles(version, problem.m, problem.n), multiprocessors(),
                             waves=WGRAD_SPLIT_WAVES)
    return gemm_split_k(version, problem, flat(dy), flat(x), dw, aux, "none", a_map="channels",
                        b_map="im2col_k_up2", store="weight4", ksize=k, splits=splits, block=block, stream=stream,
                        launch=launch, op=op, name=f"{op}[{version},k{k},p{padding}]")


def conv_backward_weight_staged_up(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """dw of out = conv(up(x), w) by the staged version (a narrow side, ``staged.staged_fits`` at the upsampled
    size): the upsampled padded planes staged in shared memory from x."""
    op = "conv_backward_weight_staged_up"
    padding = _padding(op, padding)
    w_shape = _weight(op, "dw", dw)
    _device_array(op, "x", x, 4)
    _device_array(op, "dy", dy, 4)
    up = upsampled_shape(shape(x))
    _direct_geometry(op, "up(x)", up, "dy", shape(dy), w_shape, padding, w_name="dw")
    return staged_group(op, x, dy, dw, padding, w_shape, up[2:], block, splits, stream, launch, up=True)


# ---------------------------------------------------------------------------------------------------------
# float64 references


def conv_forward_up_ref(x, w, bias=None, padding=0, relu=False) -> np.ndarray:
    """conv(up(x), w) + bias (ReLU); float64."""
    return conv_forward_ref(upsample2x_forward_ref(x), w, bias, padding, relu)


def conv_backward_data_up_ref(dy, w, x_shape, padding=0, relu_mask=None) -> np.ndarray:
    """dx (x_shape) of conv(up(x), w) given dy: the input gradient at the upsampled size, summed over each 2x2
    block, zero where relu_mask <= 0; float64."""
    dup = conv_backward_data_ref(dy, w, upsampled_shape(x_shape), padding)
    return upsample2x_backward_ref(dup, relu_mask)


def conv_backward_weight_up_ref(x, dy, k, padding=0) -> np.ndarray:
    """dw (Cout, Cin, k, k) of conv(up(x), w) given dy; float64."""
    return conv_backward_weight_ref(upsample2x_forward_ref(x), dy, k, padding)
