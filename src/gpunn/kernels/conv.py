"""Direct convolution kernels: stride-1 2-D convolution (cross-correlation, as PyTorch), its input gradient,
weight gradient and bias gradient, NCHW float32.

Layouts (those of ``gpunn.nn.functional``): x (N, Cin, H, W), w (Cout, Cin, k, k) with an odd k, y and dy
(N, Cout, OH, OW) with OH = H + 2p - k + 1 (zero padding p >= 0 on each side). Every array is a numba device
array, C-contiguous or a strided view ('A' layout: w may be a reshaped slice of a flat parameter buffer); all
are indexed 4-D, never flattened. Outputs are overwritten.

Passes and launchers (``block``/``stream``/``launch`` as the GEMM launchers; each returns a bound ``Launch``
or ``LaunchGroup`` and runs it once unless ``launch=False``):

* forward         ``conv_forward_vN(x, w, bias, out, padding, relu=False, ...)``: out = conv(x, w) + bias
                  (bias (Cout,) or None), then ReLU if ``relu``.
* backward_data   ``conv_backward_data_vN(dy, w, dx, padding, relu_mask=None, ...)``: dx (N, Cin, H, W); with
                  ``relu_mask`` (dx's shape) dx = 0 where mask <= 0 (or NaN): the previous layer's ReLU
                  backward fused into this pass.
* backward_weight ``conv_backward_weight_vN(x, dy, dw, padding, ...)``: dw (Cout, Cin, k, k).
* bias_grad       ``conv_bias_grad_vN(dy, db)``: db (Cout,) = sum of dy over n, oh, ow (v3 also takes ``splits``).

Versions (llm.c ``dev/cuda`` style; the papers' naive and optimized CUDA kernels, papers 001 and 004), one line each:

    v1 naive          all passes: one thread per output element (dx gathered, no atomics; dw one per weight)
    v2 tiled          forward / backward-data: TH x TW output tile x COG channels per block, input tile + halo
                      and weights in shared memory; bias + ReLU (forward) or the ReLU mask (backward) fused
    v2 block          weight gradient: block per (co, ci) slice and batch split, shared-memory tree, atomics
                      across splits (bias gradient: block per channel, tree, deterministic)
    v2 shuffle        weight gradient as block, reduced by warp shuffles then shared memory (real GPU only)
    v2 deterministic  weight gradient as block, splits' partial sums added in a fixed order: bit-identical
    v3 implicit_gemm  implicit-im2col GEMM for all three passes (``conv_forward_v3`` ...; kernels/conv_gemm.py, next
                      to the GEMM operand loaders it is made of)
    v3 split          bias gradient: (Cout, S) blocks over batch splits (S by the SM count), elements stepped
                      without divisions, 4 loads in flight; partials added in a fixed order by a second launch
    v4 staged         weight gradient of a layer with a narrow side (<= 4 channels in or out): block per wide-side
                      channel and batch split, padded input planes staged in shared memory, narrow*k*k sums per
                      thread in registers, partials added in a fixed order (deterministic)

Details sit above each version's kernels. Registry names: ``naive``, ``tiled``, ``block``, ``shuffle``,
``deterministic`` (and ``implicit_gemm`` for v3; ``split`` for the v3 bias gradient; ``staged`` for v4). With one split (large
Cout*Cin, or ``splits=1``) the block and shuffle weight gradients need no atomics and are deterministic too.

``VERSIONS[pass][name]`` -> launcher; ``NEEDS_GPU`` holds the (pass, name) pairs that cannot run under the
simulator, ``APPLIES`` those made for some layers only (``runnable_versions`` filters by both);
``conv_launcher(pass, name)`` looks one up. The float64 NumPy references (``conv_forward_ref``,
``conv_backward_data_ref``, ``conv_backward_weight_ref``, ``conv_bias_grad_ref``) build on
``gpunn.nn.functional.conv2d_forward/backward`` in float64.

Compile-time specialisation: cached factories per (k, padding, tile, flags) return kernels with these as
closure constants (loops over the window unroll, dead branches are pruned); shapes are read from the
arrays, so kernels take at most four arguments. Index arithmetic is uint32 (see gemm.py): the padded
coordinate ``oy + kh`` is compared against [p, H + p) instead of subtracting p first, so no index is ever
negative.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device
from gpunn.nn import functional as F

from .conv_gemm import conv_backward_data_v3, conv_backward_weight_v3, conv_forward_v3
from .gemm import multiprocessors as gemm_multiprocessors
from .launch import Launch, LaunchGroup, bind, check_block, check_device_array, grid_for
from .softmax import _block_sum

__all__ = [
    "CI_CHUNK",
    "COG",
    "APPLIES",
    "NEEDS_GPU",
    "PASSES",
    "SMEM_LIMIT",
    "VERSIONS",
    "bias_grad_splits",
    "conv_backward_data_ref",
    "conv_backward_data_v1",
    "conv_backward_data_v2",
    "conv_backward_weight_ref",
    "conv_backward_weight_v1",
    "conv_backward_weight_v2_block",
    "conv_backward_weight_v2_deterministic",
    "conv_backward_weight_v2_shuffle",
    "conv_backward_weight_v4_staged",
    "conv_bias_grad_ref",
    "conv_bias_grad_v1",
    "conv_bias_grad_v2",
    "conv_bias_grad_v3",
    "conv_forward_ref",
    "conv_forward_v1",
    "conv_forward_v2",
    "conv_launcher",
    "conv_output_size",
    "runnable_versions",
    "staged_fits",
    "tile_shape",
    "weight_grad_splits",
]

PASSES = ("forward", "backward_data", "backward_weight", "bias_grad")
COG = 8  # output channels per thread (and per block) in the tiled kernels: each staged input value feeds COG FMAs
# (fewer where the output has fewer channels: channel_group)
CI_CHUNK = 8  # input channels staged in shared memory per barrier pair (fewer if the tile would not fit)
MAX_TILE_W = 32  # tile width: a warp covers (at most) one 32-wide row of outputs, loads and stores coalesced
SMEM_LIMIT = 48 * 1024  # static shared memory per block
WGRAD_TARGET_BLOCKS = 1024  # weight gradient: split the batch until about this many blocks (8 per SM on 132 SMs)
# ... but under the simulator, where every thread of every block is a Python thread, one split: the engine tests'
# weight gradients cost a fraction (the split paths have kernel tests of their own, with splits asked explicitly)
SIMULATOR_WGRAD_SPLITS = 1
TILED_THREADS = 256  # the tiled forward / backward-data block, unless the output plane is smaller (fitted_threads)
MAX_GRID_YZ = 65535
WARP = 32
FULL_MASK = 0xFFFFFFFF
_U0 = np.uint32(0)
_U1 = np.uint32(1)


# ---------------------------------------------------------------------------------------------------------
# float64 references (host arrays)


def conv_output_size(size: int, k: int, padding: int) -> int:
    return F.conv2d_output_size(size, k, padding)


def conv_forward_ref(x, w, bias, padding, relu=False) -> np.ndarray:
    """out = conv(x, w) + bias (None: no bias), ReLU if `relu`; float64."""
    x64 = np.asarray(x, np.float64)
    w64 = np.asarray(w, np.float64)
    b64 = np.zeros(w64.shape[0]) if bias is None else np.asarray(bias, np.float64)
    y, _ = F.conv2d_forward(x64, w64, b64, padding)
    return np.maximum(y, 0.0) if relu else y


def conv_backward_data_ref(dy, w, x_shape, padding, relu_mask=None) -> np.ndarray:
    """dx (x_shape) of conv(x, w) given dy; zero where relu_mask <= 0 (or NaN) when given; float64."""
    dy64 = np.asarray(dy, np.float64)
    w64 = np.asarray(w, np.float64)
    n, cin, h, wd = x_shape
    # conv2d_backward needs the padded input only for dw, which is discarded here: zeros do
    xp = np.zeros((n, cin, h + 2 * padding, wd + 2 * padding))
    dx, _, _ = F.conv2d_backward(dy64, (xp, w64, padding, tuple(x_shape)))
    if relu_mask is not None:
        dx = np.where(np.asarray(relu_mask) > 0, dx, 0.0)
    return dx


def conv_backward_weight_ref(x, dy, k, padding) -> np.ndarray:
    """dw (Cout, Cin, k, k) of conv(x, w) given dy; float64."""
    x64 = np.asarray(x, np.float64)
    dy64 = np.asarray(dy, np.float64)
    xp = np.pad(x64, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    w_shape = (dy64.shape[1], x64.shape[1], k, k)
    _, dw, _ = F.conv2d_backward(dy64, (xp, np.zeros(w_shape), padding, x64.shape))
    return dw


def conv_bias_grad_ref(dy) -> np.ndarray:
    return np.asarray(dy, np.float64).sum(axis=(0, 2, 3))


# ---------------------------------------------------------------------------------------------------------
# Argument checks


def _shape(a):
    return tuple(int(s) for s in a.shape)


def _device_array(op, name, a, ndim):
    check_device_array(op, name, a, ndim)
    if a.size >= 2**31:
        raise ValueError(f"{op}: {name} {_shape(a)} has 2**31 or more elements (indices are 32-bit)")
    return a


def _padding(op, padding) -> int:
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"{op}: padding must be a non-negative int, got {padding!r}")
    return int(padding)


def _weight(op, name, w):
    """(Cout, Cin, k) of a (Cout, Cin, k, k) weight array with an odd k."""
    _device_array(op, name, w, 4)
    cout, cin, kh, kw = _shape(w)
    if kh != kw or kh % 2 == 0:
        raise ValueError(f"{op}: {name} {_shape(w)} must be (Cout, Cin, k, k) with one odd k")
    return cout, cin, kh


def _geometry(op, x_name, x_shape, y_name, y_shape, w_shape, padding, w_name="w"):
    """Check that x (N, Cin, H, W) convolved with a (Cout, Cin, k, k) weight and padding gives y's shape
    (N, Cout, OH, OW); return (OH, OW)."""
    cout, cin, k = w_shape
    n, x_cin, h, wd = x_shape
    what = (f"{op}: {x_name}{x_shape} (N, Cin, H, W), {w_name}{(cout, cin, k, k)} (Cout, Cin, k, k), "
            f"padding {padding} -> {y_name}{y_shape}")
    if x_cin != cin:
        raise ValueError(f"{what}: {x_name} has {x_cin} channels, {w_name} expects Cin = {cin}")
    oh, ow = conv_output_size(h, k, padding), conv_output_size(wd, k, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"{what}: the {h}x{wd} input with padding {padding} is smaller than the {k}x{k} kernel")
    if y_shape != (n, cout, oh, ow):
        raise ValueError(f"{what}: {y_name} must be {(n, cout, oh, ow)}")
    return oh, ow


def _forward_args(op, x, w, bias, out, padding):
    padding = _padding(op, padding)
    w_shape = _weight(op, "w", w)
    _device_array(op, "x", x, 4)
    _device_array(op, "out", out, 4)
    _geometry(op, "x", _shape(x), "out", _shape(out), w_shape, padding)
    if bias is not None:
        _device_array(op, "bias", bias, 1)
        if _shape(bias) != (w_shape[0],):
            raise ValueError(f"{op}: bias must be ({w_shape[0]},) for w {_shape(w)}, got {_shape(bias)}")
    return padding, w_shape


def _backward_data_args(op, dy, w, dx, padding, relu_mask):
    padding = _padding(op, padding)
    w_shape = _weight(op, "w", w)
    _device_array(op, "dy", dy, 4)
    _device_array(op, "dx", dx, 4)
    _geometry(op, "dx", _shape(dx), "dy", _shape(dy), w_shape, padding)
    if relu_mask is not None:
        _device_array(op, "relu_mask", relu_mask, 4)
        if _shape(relu_mask) != _shape(dx):
            raise ValueError(f"{op}: relu_mask must have dx's shape {_shape(dx)}, got {_shape(relu_mask)}")
    return padding, w_shape


def _backward_weight_args(op, x, dy, dw, padding):
    padding = _padding(op, padding)
    w_shape = _weight(op, "dw", dw)
    _device_array(op, "x", x, 4)
    _device_array(op, "dy", dy, 4)
    _geometry(op, "x", _shape(x), "dy", _shape(dy), w_shape, padding, w_name="dw")
    return padding, w_shape


def _bias_grad_args(op, dy, db):
    _device_array(op, "dy", dy, 4)
    _device_array(op, "db", db, 1)
    if _shape(db) != (_shape(dy)[1],):
        raise ValueError(f"{op}: db must be ({_shape(dy)[1]},) for dy {_shape(dy)} (N, Cout, OH, OW), "
                         f"got {_shape(db)}")


_DUMMY_AUX = None


def _epilogue(bias=None, relu=False, relu_mask=None):
    """The epilogue name and the kernel's ``aux`` argument (bias, mask or a cached 1-element dummy)."""
    global _DUMMY_AUX
    if relu_mask is not None:
        return "mask", relu_mask
    if bias is not None:
        return ("bias_relu" if relu else "bias"), bias
    if _DUMMY_AUX is None:
        _DUMMY_AUX = cuda.to_device(np.zeros(1, dtype=np.float32))
    return ("relu" if relu else "none"), _DUMMY_AUX


def _flags(epilogue):
    """(add bias, ReLU, mask) closure constants of a kernel specialisation."""
    return epilogue in ("bias", "bias_relu"), epilogue in ("bias_relu", "relu"), epilogue == "mask"


def _cdiv(a, b):
    return (a + b - 1) // b


def _jit_for(threads):
    """cuda.jit for a kernel always launched with `threads` threads: launch_bounds makes the compiler keep
    registers within what that block size allows (otherwise 1024-thread launches could fail for lack of
    registers). The simulator takes no launch_bounds."""
    return cuda.jit if device.simulator_enabled() else cuda.jit(launch_bounds=threads)


# ---------------------------------------------------------------------------------------------------------
# Version 1: naive, one thread per output element (grid-stride loop over a 1-D grid).


@functools.cache
def _forward1(k, pad, epilogue):
    has_bias, relu, _ = _flags(epilogue)
    P = np.uint32(pad)

    @cuda.jit
    def conv_forward_kernel1(x, w, aux, out):
        cout = uint32(out.shape[1])
        oh_n = uint32(out.shape[2])
        ow_n = uint32(out.shape[3])
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        total = uint32(out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            # x fastest, so a warp reads x and writes out along rows
            ox = uint32(i % ow_n)
            rest = uint32(i // ow_n)
            oy = uint32(rest % oh_n)
            rest = uint32(rest // oh_n)
            co = uint32(rest % cout)
            n = uint32(rest // cout)
            acc = float32(0.0)
            ci = _U0
            while ci < cin:
                for kh in range(k):
                    r = uint32(oy + uint32(kh))  # row in padded coordinates
                    if r >= P and r < h + P:
                        for kw in range(k):
                            c = uint32(ox + uint32(kw))
                            if c >= P and c < wd + P:
                                acc += x[n, ci, uint32(r - P), uint32(c - P)] * w[co, ci, kh, kw]
                ci = uint32(ci + _U1)
            if has_bias:
                acc += aux[co]
            if relu and acc < float32(0.0):
                acc = float32(0.0)
            out[n, co, oy, ox] = acc
            i = uint32(i + stride)

    return conv_forward_kernel1


@functools.cache
def _backward_data1(k, pad, epilogue):
    _, _, mask = _flags(epilogue)
    P = np.uint32(pad)

    @cuda.jit
    def conv_backward_data_kernel1(dy, w, aux, dx):
        cin = uint32(dx.shape[1])
        h = uint32(dx.shape[2])
        wd = uint32(dx.shape[3])
        cout = uint32(dy.shape[1])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        total = uint32(dx.shape[0] * dx.shape[1] * dx.shape[2] * dx.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            ix = uint32(i % wd)
            rest = uint32(i // wd)
            iy = uint32(rest % h)
            rest = uint32(rest // h)
            ci = uint32(rest % cin)
            n = uint32(rest // cin)
            acc = float32(0.0)
            masked = False
            if mask:
                masked = not aux[n, ci, iy, ix] > float32(0.0)
            if not masked:  # a masked element needs no sum
                # dx[iy, ix] gathers dy[oy, ox] * w[kh, kw] over oy = iy + p - kh in [0, OH)
                ry = uint32(iy + P)
                rx = uint32(ix + P)
                co = _U0
                while co < cout:
                    for kh in range(k):
                        if ry >= uint32(kh) and uint32(ry - uint32(kh)) < oh_n:
                            oy = uint32(ry - uint32(kh))
                            for kw in range(k):
                                if rx >= uint32(kw) and uint32(rx - uint32(kw)) < ow_n:
                                    acc += dy[n, co, oy, uint32(rx - uint32(kw))] * w[co, ci, kh, kw]
                    co = uint32(co + _U1)
            dx[n, ci, iy, ix] = acc
            i = uint32(i + stride)

    return conv_backward_data_kernel1


@functools.cache
def _backward_weight1(k, pad):
    P = np.uint32(pad)
    K = np.uint32(k)

    @cuda.jit
    def conv_backward_weight_kernel1(x, dy, dw):
        n_img = uint32(x.shape[0])
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        total = uint32(dw.shape[0] * dw.shape[1] * dw.shape[2] * dw.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            kw = uint32(i % K)
            rest = uint32(i // K)
            kh = uint32(rest % K)
            rest = uint32(rest // K)
            ci = uint32(rest % cin)
            co = uint32(rest // cin)
            acc = float32(0.0)
            n = _U0
            while n < n_img:
                oy = _U0
                while oy < oh_n:
                    r = uint32(oy + kh)
                    if r >= P and r < h + P:
                        ox = _U0
                        while ox < ow_n:
                            c = uint32(ox + kw)
                            if c >= P and c < wd + P:
                                acc += dy[n, co, oy, ox] * x[n, ci, uint32(r - P), uint32(c - P)]
                            ox = uint32(ox + _U1)
                    oy = uint32(oy + _U1)
                n = uint32(n + _U1)
            dw[co, ci, kh, kw] = acc
            i = uint32(i + stride)

    return conv_backward_weight_kernel1


@cuda.jit
def _bias_grad_kernel1(dy, db):
    n_img = uint32(dy.shape[0])
    cout = uint32(dy.shape[1])
    oh_n = uint32(dy.shape[2])
    ow_n = uint32(dy.shape[3])
    co = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while co < cout:
        acc = float32(0.0)
        n = _U0
        while n < n_img:
            oy = _U0
            while oy < oh_n:
                ox = _U0
                while ox < ow_n:
                    acc += dy[n, co, oy, ox]
                    ox = uint32(ox + _U1)
                oy = uint32(oy + _U1)
            n = uint32(n + _U1)
        db[co] = acc
        co = uint32(co + stride)


def conv_forward_v1(x, w, bias, out, padding, relu=False, block=256, stream=0, launch=True) -> Launch:
    """Naive forward: one thread per output element."""
    op = "conv_forward_v1"
    padding, (_, _, k) = _forward_args(op, x, w, bias, out, padding)
    block = check_block(op, block)
    epilogue, aux = _epilogue(bias=bias, relu=relu)
    kernel = _forward1(k, padding, epilogue)
    return bind(kernel, grid_for(out.size, block), block, (x, w, aux, out), stream, launch,
                f"{op}[k{k},p{padding},{epilogue}]")


def conv_backward_data_v1(dy, w, dx, padding, relu_mask=None, block=256, stream=0, launch=True) -> Launch:
    """Naive backward-data (gather): one thread per dx element, no atomics."""
    op = "conv_backward_data_v1"
    padding, (_, _, k) = _backward_data_args(op, dy, w, dx, padding, relu_mask)
    block = check_block(op, block)
    epilogue, aux = _epilogue(relu_mask=relu_mask)
    kernel = _backward_data1(k, padding, epilogue)
    return bind(kernel, grid_for(dx.size, block), block, (dy, w, aux, dx), stream, launch,
                f"{op}[k{k},p{padding},{epilogue}]")


def conv_backward_weight_v1(x, dy, dw, padding, block=256, stream=0, launch=True) -> Launch:
    """Naive weight gradient: one thread per weight element looping over n, oh, ow (deterministic)."""
    op = "conv_backward_weight_v1"
    padding, (_, _, k) = _backward_weight_args(op, x, dy, dw, padding)
    block = check_block(op, block)
    kernel = _backward_weight1(k, padding)
    return bind(kernel, grid_for(dw.size, block), block, (x, dy, dw), stream, launch, f"{op}[k{k},p{padding}]")


def conv_bias_grad_v1(dy, db, block=256, stream=0, launch=True) -> Launch:
    """Naive bias gradient: one thread per output channel."""
    op = "conv_bias_grad_v1"
    _bias_grad_args(op, dy, db)
    block = check_block(op, block)
    return bind(_bias_grad_kernel1, grid_for(db.shape[0], block), block, (dy, db), stream, launch, op)


# ---------------------------------------------------------------------------------------------------------
# Version 2 forward / backward-data: shared-memory input tiles with halo, COG output channels per thread.
#
# Block: T = TW * TH threads (1-D), thread t owns output pixel (oy0 + t // TW, ox0 + t % TW) of the block's
# tile and the COG channels co0 .. co0 + COG - 1. Per chunk of CIC input channels the block stages
#   s_in[cl, rr, cc] = in[n, ci0 + cl, oy0 + rr - off, ox0 + cc - off]  (rr < TH + k - 1, cc < TW + k - 1;
#                       0 outside the image, off = the padding),
#   s_w[c, cl, kh, kw] = the weight from input channel ci0 + cl to output channel co0 + c,
# then each thread reads its k x k window once per input channel into registers and does k*k*COG FMAs with
# warp-uniform (broadcast) weight reads. Napkin math at the AE's 256->128 16x16 layer (k=3): per thread and
# input channel 9 conflict-free ld.shared + 72 broadcast ld.shared for 72 FMA; the halo costs
# (TH+2)(TW+2)/(TH*TW) = 1.4x the tile's loads at 32x8.
#
# Backward-data: dx[n, ci, iy, ix] = sum_{co, kh, kw} dy[n, co, iy + p - kh, ix + p - kw] w[co, ci, kh, kw]
#              = sum_{co, a, b} dy[n, co, iy + a - (k-1-p), ix + b - (k-1-p)] w[co, ci, k-1-a, k-1-b],
# a forward convolution of dy with the transposed, flipped weight and offset k-1-p. That offset is
# negative when p > k-1: the kernel's padded coordinate is then shifted by HI = -off instead (LO = 0).


def tile_shape(block, out_width):
    """(TW, TH) of the tiled kernels for a block: an explicit (TW, TH) pair, or a thread count T, split into a
    tile as wide as the output rows need (a power of two, at most 32, dividing T) times T / TW rows."""
    if isinstance(block, (tuple, list)):
        if len(block) != 2 or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0
                                  for b in block):
            raise ValueError(f"block must be a thread count or (TW, TH), two positive ints, got {block!r}")
        return int(block[0]), int(block[1])
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block must be a thread count or (TW, TH), got {block!r}")
    threads = int(block)
    width = min(MAX_TILE_W, 1 << max(0, (int(out_width) - 1).bit_length()), threads & -threads)
    return width, threads // width


def fitted_threads(out_height: int, out_width: int) -> int:
    """The tiled kernels' default block: TILED_THREADS, or fewer where the output plane is smaller than that tile
    (a 6x6 output gets an 8x8 tile of 64 threads, not 256 threads of which 220 would idle); never under a warp."""
    def pow2(n):
        return 1 << max(0, (int(n) - 1).bit_length())

    return max(WARP, min(TILED_THREADS, pow2(min(out_width, MAX_TILE_W)) * pow2(out_height)))


def channel_group(out_ch: int) -> int:
    """Output channels per thread of the tiled kernels: COG, or the power of two covering out_ch when fewer
    (a 1-channel input gradient computes 1 channel, not 8 of which 7 are thrown away)."""
    return min(COG, 1 << max(0, (int(out_ch) - 1).bit_length()))


def _chunk(op, tw, th, k, in_ch, cog=COG):
    """Input channels per shared-memory stage: up to CI_CHUNK, as many as fit in SMEM_LIMIT."""
    region = (th + k - 1) * (tw + k - 1)
    for cic in range(min(CI_CHUNK, in_ch), 0, -1):
        if 4 * (cic * region + cog * cic * k * k) <= SMEM_LIMIT:
            return cic
    raise ValueError(f"{op}: a {tw}x{th} tile with its {k - 1} halo ({4 * region} bytes per channel) does not fit "
                     f"in {SMEM_LIMIT} bytes of shared memory; choose a smaller block")


@functools.cache
def _tiled(tw, th, k, off, cic, transposed, epilogue, cog=COG):
    has_bias, relu, mask = _flags(epilogue)
    threads = tw * th
    rh, rw = th + k - 1, tw + k - 1
    rhw = rh * rw
    kk_n = k * k
    sin_n = cic * rhw  # shared sizes: plain ints, closure constants
    sw_n = cog * cic * kk_n
    LO = np.uint32(max(off, 0))
    HI = np.uint32(max(-off, 0))
    TW = np.uint32(tw)
    TH = np.uint32(th)
    T = np.uint32(threads)
    RW = np.uint32(rw)
    RHW = np.uint32(rhw)
    K = np.uint32(k)
    KK = np.uint32(kk_n)
    CIC = np.uint32(cic)
    CWK = np.uint32(cic * kk_n)
    UCOG = np.uint32(cog)
    K1 = np.uint32(k - 1)

    @_jit_for(threads)
    def conv_tiled_kernel(inp, w, aux, out):
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        s_in = cuda.shared.array(sin_n, float32)
        s_w = cuda.shared.array(sw_n, float32)
        acc = cuda.local.array(cog, float32)
        win = cuda.local.array(kk_n, float32)
        in_ch = uint32(inp.shape[1])
        ih_n = uint32(inp.shape[2])
        iw_n = uint32(inp.shape[3])
        out_ch = uint32(out.shape[1])
        oh_n = uint32(out.shape[2])
        ow_n = uint32(out.shape[3])
        t = uint32(cuda.threadIdx.x)
        tx = uint32(t % TW)
        ty = uint32(t // TW)
        tiles_x = uint32((ow_n + TW - _U1) // TW)
        ox0 = uint32(uint32(cuda.blockIdx.x) % tiles_x * TW)
        oy0 = uint32(uint32(cuda.blockIdx.x) // tiles_x * TH)
        co0 = uint32(uint32(cuda.blockIdx.y) * UCOG)
        n = uint32(cuda.blockIdx.z)
        oy = uint32(oy0 + ty)
        ox = uint32(ox0 + tx)
        for c in range(cog):
            acc[c] = float32(0.0)

        ci0 = _U0
        while ci0 < in_ch:
            # ---- input tile + halo, zero outside the image (consecutive threads: consecutive columns)
            idx = t
            while idx < sin_n:
                cl = uint32(idx // RHW)
                rem = uint32(idx % RHW)
                r = uint32(oy0 + rem // RW + HI)  # padded coordinates
                c = uint32(ox0 + rem % RW + HI)
                ci = uint32(ci0 + cl)
                v = float32(0.0)
                if ci < in_ch and r >= LO and r < ih_n + LO and c >= LO and c < iw_n + LO:
                    v = inp[n, ci, uint32(r - LO), uint32(c - LO)]
                s_in[idx] = v
                idx = uint32(idx + T)
            # ---- the group's weights for this chunk, zero for channels past the end
            idx = t
            while idx < sw_n:
                co = uint32(co0 + idx // CWK)
                rem = uint32(idx % CWK)
                ci = uint32(ci0 + rem // KK)
                kk = uint32(rem % KK)
                v = float32(0.0)
                if co < out_ch and ci < in_ch:
                    if transposed:  # w is (forward Cout = in_ch, forward Cin = out_ch, k, k), flipped
                        v = w[ci, co, uint32(K1 - kk // K), uint32(K1 - kk % K)]
                    else:
                        v = w[co, ci, uint32(kk // K), uint32(kk % K)]
                s_w[idx] = v
                idx = uint32(idx + T)
            cuda.syncthreads()

            for cl in range(cic):
                base = uint32(uint32(cl) * RHW + ty * RW + tx)
                for kh in range(k):
                    for kw in range(k):
                        win[kh * k + kw] = s_in[uint32(base + uint32(kh) * RW + uint32(kw))]
                for c in range(cog):
                    wbase = uint32(uint32(c) * CWK + uint32(cl) * KK)
                    a = acc[c]
                    for j in range(kk_n):
                        a += win[j] * s_w[uint32(wbase + uint32(j))]
                    acc[c] = a
            cuda.syncthreads()
            ci0 = uint32(ci0 + CIC)

        if oy < oh_n and ox < ow_n:
            for c in range(cog):
                co = uint32(co0 + uint32(c))
                if co < out_ch:
                    v = acc[c]
                    if has_bias:
                        v += aux[co]
                    if relu and v < float32(0.0):
                        v = float32(0.0)
                    if mask and not aux[n, co, oy, ox] > float32(0.0):
                        v = float32(0.0)
                    out[n, co, oy, ox] = v

    return conv_tiled_kernel, threads


def _bind_tiled(op, inp, w, aux, out, k, off, transposed, epilogue, block, stream, launch):
    n, out_ch, oh, ow = _shape(out)
    in_ch = _shape(inp)[1]
    if block is None:
        block = fitted_threads(oh, ow)
    try:
        tw, th = tile_shape(block, ow)
    except ValueError as exc:
        raise ValueError(f"{op}: {exc}") from None
    device.check_block(op, tw * th)
    cog = channel_group(out_ch)
    cic = _chunk(op, tw, th, k, in_ch, cog)
    kernel, threads = _tiled(tw, th, k, off, cic, transposed, epilogue, cog)
    device.check_block(op, threads, kernel)
    grid = (_cdiv(ow, tw) * _cdiv(oh, th), _cdiv(out_ch, cog), n)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(f"{op}: grid {grid} (tiles, channel groups, images) exceeds {MAX_GRID_YZ} in y or z")
    return bind(kernel, grid, threads, (inp, w, aux, out), stream, launch,
                f"{op}[{tw}x{th},k{k},off{off},{epilogue}]")


def conv_forward_v2(x, w, bias, out, padding, relu=False, block=None, stream=0, launch=True) -> Launch:
    """Tiled forward (shared-memory input tile + halo, COG channels per thread), bias + ReLU fused.
    ``block``: threads (tile chosen by ``tile_shape``), an explicit (TW, TH) tile, or None: ``fitted_threads``."""
    op = "conv_forward_v2"
    padding, (_, _, k) = _forward_args(op, x, w, bias, out, padding)
    epilogue, aux = _epilogue(bias=bias, relu=relu)
    return _bind_tiled(op, x, w, aux, out, k, padding, False, epilogue, block, stream, launch)


def conv_backward_data_v2(dy, w, dx, padding, relu_mask=None, block=None, stream=0, launch=True) -> Launch:
    """Tiled backward-data: the tiled forward on dy with transposed, flipped weights; ReLU mask fused."""
    op = "conv_backward_data_v2"
    padding, (_, _, k) = _backward_data_args(op, dy, w, dx, padding, relu_mask)
    epilogue, aux = _epilogue(relu_mask=relu_mask)
    return _bind_tiled(op, dy, w, aux, dx, k, k - 1 - padding, True, epilogue, block, stream, launch)


# ---------------------------------------------------------------------------------------------------------
# Version 2 weight gradient: one block per (co, ci) slice and batch split, block reduction.
#
# dw[co, ci, kh, kw] = sum_{n, oy, ox} dy[n, co, oy, ox] * x[n, ci, oy + kh - p, ox + kw - p].
# Block (slice, split) sums n in [split * per, (split + 1) * per): thread t visits the elements
# e = t, t + T, ... of each image's OH*OW plane (consecutive threads: consecutive ox, coalesced dy and x reads),
# loading dy once for k*k products accumulated in k*k registers. The k*k sums are then reduced over the
# block (tree in shared memory, or warp shuffles then shared memory) and written by `store`:
#   "store": dw directly (one split); "atomic": cuda.atomic.add into dw zeroed before (several splits);
#   "partial": partials[split, slice * k*k + kk], added in split order by a second kernel (deterministic).


def _check_splits(op, splits):
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or splits < 1):
        raise ValueError(f"{op}: splits must be a positive int or None, got {splits!r}")


def _check_grid_y(op, splits):
    if splits > MAX_GRID_YZ:
        raise ValueError(f"{op}: {splits} batch splits exceed the grid's y limit {MAX_GRID_YZ}")


def weight_grad_splits(n_images, slices, splits=None):
    """(splits, images per split): splits of the batch so that slices * splits reaches WGRAD_TARGET_BLOCKS
    (None), or as asked; every split holds whole images and none is empty."""
    if splits is None:
        splits = max(1, math.ceil(WGRAD_TARGET_BLOCKS / slices))
    splits = max(1, min(int(splits), n_images))
    per = math.ceil(n_images / splits)
    return math.ceil(n_images / per), per


@functools.cache
def _tree_rows(threads, rows, count):
    """A device function tree(buf, acc, j0, t) reducing the per-thread sums acc[j0 .. j0 + rows) (those below
    `count`) over a block of `threads` threads, side by side in the shared buf (rows x threads): log2(threads)
    barriers for `rows` sums instead of per sum. Sum j0 + j ends in buf[j * threads]; every thread calls it."""
    T = np.uint32(threads)

    @cuda.jit(device=True)
    def tree(buf, acc, j0, t):
        for j in range(rows):
            if j0 + j < count:
                buf[uint32(uint32(j) * T + t)] = acc[j0 + j]
        cuda.syncthreads()
        s = threads // 2
        while s > 0:
            if t < s:
                for j in range(rows):
                    buf[uint32(uint32(j) * T + t)] += buf[uint32(uint32(j) * T + t + uint32(s))]
            cuda.syncthreads()
            s //= 2

    return tree


@functools.cache
def _wgrad(k, pad, threads, reduction, store):
    kk_n = k * k
    warps = threads // WARP
    shuffle = reduction == "shuffle"
    # tree reduction: `rows` of the k*k sums side by side in buf (rows x threads), leaving a little shared
    # memory for the other (1-element) array; shuffles: one value per sum and warp
    rows = max(1, min(kk_n, (SMEM_LIMIT - 64) // (4 * threads)))
    several_trees = rows < kk_n
    buf_n = 1 if shuffle else rows * threads
    warp_buf_n = kk_n * warps if shuffle else 1
    P = np.uint32(pad)
    K = np.uint32(k)
    KK = np.uint32(kk_n)
    T = np.uint32(threads)
    NW = np.uint32(warps)
    tree = _tree_rows(threads, rows, kk_n)

    # one store per specialisation, chosen here rather than by branches inside (out is 4-D or 2-D)
    if store == "partial":
        @cuda.jit(device=True)
        def write(out, split, co, ci, slice_, kk, value):
            out[split, uint32(slice_ * KK + kk)] = value
    elif store == "atomic":
        @cuda.jit(device=True)
        def write(out, split, co, ci, slice_, kk, value):
            cuda.atomic.add(out, (co, ci, uint32(kk // K), uint32(kk % K)), value)
    else:
        @cuda.jit(device=True)
        def write(out, split, co, ci, slice_, kk, value):
            out[co, ci, uint32(kk // K), uint32(kk % K)] = value

    @_jit_for(threads)
    def conv_wgrad_kernel(x, dy, out, per):
        buf = cuda.shared.array(buf_n, float32)
        warp_buf = cuda.shared.array(warp_buf_n, float32)
        acc = cuda.local.array(kk_n, float32)
        n_img = uint32(x.shape[0])
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        plane = uint32(oh_n * ow_n)
        t = uint32(cuda.threadIdx.x)
        slice_ = uint32(cuda.blockIdx.x)
        split = uint32(cuda.blockIdx.y)
        co = uint32(slice_ // cin)
        ci = uint32(slice_ % cin)
        for j in range(kk_n):
            acc[j] = float32(0.0)
        n = uint32(split * per)
        n_end = uint32(min(n_img, uint32(n + per)))
        while n < n_end:
            e = t
            while e < plane:
                oy = uint32(e // ow_n)
                ox = uint32(e % ow_n)
                d = dy[n, co, oy, ox]
                for kh in range(k):
                    r = uint32(oy + uint32(kh))
                    if r >= P and r < h + P:
                        for kw in range(k):
                            c = uint32(ox + uint32(kw))
                            if c >= P and c < wd + P:
                                acc[kh * k + kw] += d * x[n, ci, uint32(r - P), uint32(c - P)]
                e = uint32(e + T)
            n = uint32(n + _U1)

        if shuffle:
            lane = uint32(t % WARP)
            warp = uint32(t // WARP)
            for j in range(kk_n):
                v = acc[j]
                offset = WARP // 2
                while offset > 0:
                    v += cuda.shfl_down_sync(FULL_MASK, v, offset)
                    offset //= 2
                if lane == _U0:
                    warp_buf[uint32(uint32(j) * NW + warp)] = v
            cuda.syncthreads()
            kk = t
            while kk < KK:  # fixed order over the warps
                total = float32(0.0)
                wi = _U0
                while wi < NW:
                    total += warp_buf[uint32(kk * NW + wi)]
                    wi = uint32(wi + _U1)
                write(out, split, co, ci, slice_, kk, total)
                kk = uint32(kk + T)
        else:
            # `rows` of the k*k sums reduced side by side per tree (all of them for k = 3 and up to 1024
            # threads): log2(T) barriers per tree instead of per sum; thread j writes sum j0 + j.
            for j0 in range(0, kk_n, rows):
                tree(buf, acc, j0, t)
                if t < uint32(rows) and j0 + t < kk_n:
                    write(out, split, co, ci, slice_, uint32(j0 + t), buf[uint32(t * T)])
                if several_trees:
                    cuda.syncthreads()  # the next tree overwrites buf[j * T], read just above by thread j

    return conv_wgrad_kernel


@functools.cache
def _sum_partials(k):
    K = np.uint32(k)

    @cuda.jit
    def conv_wgrad_sum_partials(partials, dw):
        """dw = the sum of partials over the splits (rows), in row order: one thread per weight element."""
        splits = uint32(partials.shape[0])
        cin = uint32(dw.shape[1])
        total = uint32(partials.shape[1])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            acc = float32(0.0)
            s = _U0
            while s < splits:
                acc += partials[s, i]
                s = uint32(s + _U1)
            kw = uint32(i % K)
            rest = uint32(i // K)
            kh = uint32(rest % K)
            rest = uint32(rest // K)
            dw[uint32(rest // cin), uint32(rest % cin), kh, kw] = acc
            i = uint32(i + stride)

    return conv_wgrad_sum_partials


@cuda.jit
def _zero4_kernel(a):
    """a[...] = 0 for a 4-D (possibly strided) array, grid-stride."""
    d1 = uint32(a.shape[1])
    d2 = uint32(a.shape[2])
    d3 = uint32(a.shape[3])
    total = uint32(a.shape[0] * a.shape[1] * a.shape[2] * a.shape[3])
    i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while i < total:
        rest = uint32(i // d3)
        a[uint32(rest // d2 // d1), uint32(rest // d2 % d1), uint32(rest % d2), uint32(i % d3)] = float32(0.0)
        i = uint32(i + stride)


def _weight_grad_v2(op, x, dy, dw, padding, block, splits, reduction, deterministic, stream, launch):
    padding, (cout, cin, k) = _backward_weight_args(op, x, dy, dw, padding)
    if reduction == "shuffle":
        if device.simulator_enabled():
            raise ValueError(f"{op}: warp shuffles need a real GPU (numba's CUDA simulator has no shfl_down_sync)")
        block = check_block(op, block, power_of_two=True)
        if block < WARP:
            raise ValueError(f"{op}: block must be a multiple of the warp size {WARP}, got {block}")
    else:
        block = check_block(op, block, power_of_two=True)
    _check_splits(op, splits)
    slices = cout * cin
    if splits is None and device.simulator_enabled():
        splits = SIMULATOR_WGRAD_SPLITS
    splits, per = weight_grad_splits(_shape(x)[0], slices, splits)
    _check_grid_y(op, splits)
    name = f"{op}[k{k},p{padding},splits{splits}]"
    grid = (slices, splits)
    if splits == 1:
        kernel = _wgrad(k, padding, block, reduction, "store")
        return bind(kernel, grid, block, (x, dy, dw, np.uint32(per)), stream, launch, name)
    if deterministic:
        # scratch for the splits' partial sums: owned by the bound launch, allocated once
        partials = cuda.device_array((splits, slices * k * k), np.float32)
        launches = [bind(_wgrad(k, padding, block, reduction, "partial"), grid, block,
                         (x, dy, partials, np.uint32(per)), stream, False, name),
                    bind(_sum_partials(k), grid_for(slices * k * k, 256), 256, (partials, dw), stream, False,
                         f"{op}.sum_partials")]
    else:
        launches = [bind(_zero4_kernel, grid_for(dw.size, 256), 256, (dw,), stream, False, f"{op}.zero"),
                    bind(_wgrad(k, padding, block, reduction, "atomic"), grid, block, (x, dy, dw, np.uint32(per)),
                         stream, False, name)]
    group = LaunchGroup(launches)
    if launch:
        group()
    return group


def conv_backward_weight_v2_block(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """Weight gradient, block per (co, ci) slice and batch split, shared-memory tree reduction; several splits
    are added with atomics (``splits``: None chooses by size, 1 gives a deterministic single pass)."""
    return _weight_grad_v2("conv_backward_weight_v2_block", x, dy, dw, padding, block, splits, "tree", False,
                           stream, launch)


def conv_backward_weight_v2_shuffle(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """As ``conv_backward_weight_v2_block``, reduced by warp shuffles then shared memory; needs a real GPU."""
    return _weight_grad_v2("conv_backward_weight_v2_shuffle", x, dy, dw, padding, block, splits, "shuffle", False,
                           stream, launch)


def conv_backward_weight_v2_deterministic(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """As ``conv_backward_weight_v2_block``, but splits write partial sums that a second launch adds in a fixed
    order: no atomics, bit-identical across runs."""
    return _weight_grad_v2("conv_backward_weight_v2_deterministic", x, dy, dw, padding, block, splits, "tree",
                           True, stream, launch)


# ---------------------------------------------------------------------------------------------------------
# Version 4 weight gradient, "staged": for layers with a narrow side (Cin or Cout of a few channels: the
# autoencoder's 3 -> 256 and 256 -> 3), where the GEMM view (M = Cout, N = Cin*k*k, K = N*OH*OW) wastes most of
# a GEMM tile and the v2 slices re-read every input value k*k times from global memory. A block owns one channel
# of the wide side and a split of the images; per image it stages the padded input planes it reads (every Cin
# plane when Cin is the narrow side, its own plane when Cout is) in shared memory, zero halo included, then each
# thread walks output positions and accumulates all narrow * k * k weights of its channel in registers: per
# position one (or narrow) dy load(s) from global memory and k*k (or narrow*k*k) shared-memory reads, no bounds
# checks. The per-thread sums are reduced by a shared-memory tree into partials[split, ...] (v2's layout), added
# in split order by v2's sum kernel: deterministic. H100, batch 64: 256 -> 3 at 32x32 0.158 ms (v2 deterministic
# 0.472); 3 -> 256 0.276 ms, slower than the implicit GEMM's 0.156 (each of the 256 blocks re-stages the same
# three planes): policy.conv_version uses it for narrow outputs only.
STAGED_MAX_NARROW = 4  # narrow-side channels the staged weight gradient accumulates per thread (x k*k registers)


def staged_fits(cin: int, cout: int, k: int, padding: int, height: int, width: int) -> bool:
    """Whether the staged weight gradient handles this layer: a narrow side of at most STAGED_MAX_NARROW channels,
    and the padded input planes it stages (plus one reduction row) within a block's shared memory."""
    narrow = min(cin, cout)
    planes = cin if cin <= cout else 1
    staged = planes * (height + 2 * padding) * (width + 2 * padding)
    return narrow <= STAGED_MAX_NARROW and 4 * (staged + 1024) <= SMEM_LIMIT


@functools.cache
def _wgrad_staged(k, pad, threads, narrow, narrow_in, height, width):
    """narrow_in: Cin is the narrow side (block per output channel, every input plane staged); else Cout is (block
    per input channel, its plane staged, the narrow dy channels read per position)."""
    kk_n = k * k
    acc_n = narrow * kk_n
    ph, pw = height + 2 * pad, width + 2 * pad
    planes = narrow if narrow_in else 1
    stage_n = planes * ph * pw
    rows = max(1, min(acc_n, (SMEM_LIMIT - 4 * stage_n) // (4 * threads)))  # sums reduced side by side per tree
    buf_n = rows * threads  # (shared array sizes must be constants of the closure, not expressions in the kernel)
    P = np.uint32(pad)
    PH, PW = np.uint32(ph), np.uint32(pw)
    PLANE = np.uint32(ph * pw)
    H, W = np.uint32(height), np.uint32(width)
    T = np.uint32(threads)
    KK = np.uint32(kk_n)
    STAGE = np.uint32(stage_n)
    tree = _tree_rows(threads, rows, acc_n)

    @_jit_for(threads)
    def conv_wgrad_staged_kernel(x, dy, partials, per):
        xs = cuda.shared.array(stage_n, float32)
        buf = cuda.shared.array(buf_n, float32)
        acc = cuda.local.array(acc_n, float32)
        n_img = uint32(x.shape[0])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        plane = uint32(oh_n * ow_n)
        t = uint32(cuda.threadIdx.x)
        wide = uint32(cuda.blockIdx.x)  # the block's output channel (narrow_in) or input channel
        split = uint32(cuda.blockIdx.y)
        for j in range(acc_n):
            acc[j] = float32(0.0)
        n = uint32(split * per)
        n_end = uint32(min(n_img, uint32(n + per)))
        while n < n_end:
            i = t
            while i < STAGE:  # the padded planes, zeros in the halo
                c = uint32(i // PLANE)
                rest = uint32(i - c * PLANE)
                r = uint32(rest // PW)
                col = uint32(rest - r * PW)
                value = float32(0.0)
                if r >= P and r < H + P and col >= P and col < W + P:
                    value = x[n, c if narrow_in else wide, uint32(r - P), uint32(col - P)]
                xs[i] = value
                i = uint32(i + T)
            cuda.syncthreads()
            e = t
            while e < plane:
                oy = uint32(e // ow_n)
                ox = uint32(e - oy * ow_n)
                base = uint32(oy * PW + ox)
                if narrow_in:
                    d = dy[n, wide, oy, ox]
                    for c in range(narrow):
                        for kh in range(k):
                            for kw in range(k):
                                acc[(c * k + kh) * k + kw] += d * xs[uint32(c) * PLANE + base + uint32(kh) * PW + uint32(kw)]
                else:
                    for kh in range(k):
                        for kw in range(k):
                            v = xs[base + uint32(kh) * PW + uint32(kw)]
                            for c in range(narrow):
                                acc[c * kk_n + kh * k + kw] += dy[n, c, oy, ox] * v
                e = uint32(e + T)
            cuda.syncthreads()  # the next image overwrites xs
            n = uint32(n + _U1)
        for j0 in range(0, acc_n, rows):
            tree(buf, acc, j0, t)
            j = uint32(j0 + t)
            if t < uint32(rows) and j < uint32(acc_n):
                # accumulator j is (c, kk): weight (co, ci, kk) with the narrow channel c on its side
                c = uint32(j // KK)
                kk = uint32(j - c * KK)
                if narrow_in:
                    slot = uint32((wide * uint32(narrow) + c) * KK + kk)  # co = wide, ci = c
                else:
                    slot = uint32((c * uint32(x.shape[1]) + wide) * KK + kk)  # co = c, ci = wide
                partials[split, slot] = buf[uint32(t * T)]
            cuda.syncthreads()  # the next tree overwrites buf[j * T], read just above by thread j

    return conv_wgrad_staged_kernel


def conv_backward_weight_v4_staged(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """Weight gradient of a layer with a narrow side (``staged_fits``): block per wide-side channel and batch
    split, the padded input planes staged in shared memory, narrow * k * k sums per thread, partial sums added in
    a fixed order (deterministic)."""
    op = "conv_backward_weight_v4_staged"
    padding, (cout, cin, k) = _backward_weight_args(op, x, dy, dw, padding)
    block = check_block(op, block, power_of_two=True)
    _check_splits(op, splits)
    _, _, height, width = _shape(x)
    if not staged_fits(cin, cout, k, padding, height, width):
        raise ValueError(f"{op}: a {cin} -> {cout} layer on {height}x{width} inputs has no narrow side of at most "
                         f"{STAGED_MAX_NARROW} channels whose padded planes fit in shared memory; use another version")
    narrow_in = cin <= cout
    wide = cout if narrow_in else cin
    if splits is None and device.simulator_enabled():
        splits = SIMULATOR_WGRAD_SPLITS
    splits, per = weight_grad_splits(_shape(x)[0], wide, splits)
    _check_grid_y(op, splits)
    kernel = _wgrad_staged(k, padding, block, min(cin, cout), narrow_in, height, width)
    # scratch for the splits' partial sums (v2's layout): owned by the bound launch, allocated once
    partials = cuda.device_array((splits, cout * cin * k * k), np.float32)
    group = LaunchGroup([
        bind(kernel, (wide, splits), block, (x, dy, partials, np.uint32(per)), stream, False,
             f"{op}[k{k},p{padding},{'cin' if narrow_in else 'cout'}{min(cin, cout)},splits{splits}]"),
        bind(_sum_partials(k), grid_for(cout * cin * k * k, 256), 256, (partials, dw), stream, False,
             f"{op}.sum_partials"),
    ])
    if launch:
        group()
    return group


# ---------------------------------------------------------------------------------------------------------
# Version 2 bias gradient: one block per channel, tree reduction (deterministic).


@functools.cache
def _bias_grad2(threads):
    T = np.uint32(threads)
    block_sum = _block_sum(threads)

    @_jit_for(threads)
    def conv_bias_grad_kernel2(dy, db):
        buf = cuda.shared.array(threads, float32)
        n_img = uint32(dy.shape[0])
        ow_n = uint32(dy.shape[3])
        plane = uint32(dy.shape[2] * dy.shape[3])
        t = uint32(cuda.threadIdx.x)
        co = uint32(cuda.blockIdx.x)
        acc = float32(0.0)
        n = _U0
        while n < n_img:
            e = t
            while e < plane:
                acc += dy[n, co, uint32(e // ow_n), uint32(e % ow_n)]
                e = uint32(e + T)
            n = uint32(n + _U1)
        buf[t] = acc
        acc = block_sum(buf, t)  # a fixed tree: deterministic
        if t == _U0:
            db[co] = acc

    return conv_bias_grad_kernel2


def conv_bias_grad_v2(dy, db, block=256, stream=0, launch=True) -> Launch:
    """Bias gradient: one block per channel, shared-memory tree reduction (block a power of two)."""
    op = "conv_bias_grad_v2"
    _bias_grad_args(op, dy, db)
    block = check_block(op, block, power_of_two=True)
    kernel = _bias_grad2(block)
    return bind(kernel, db.shape[0], block, (dy, db), stream, launch, op)


# ---------------------------------------------------------------------------------------------------------
# Version 3 bias gradient: split over the batch, deterministic.
#
# v2 launches Cout blocks (16 or 32 for the CNN: a few of an H100's 132 SMs) and divides every element's plane
# index by OW. v3 launches a (Cout, S) grid: block (co, s) sums images [s * per, (s + 1) * per) of channel co as
# one flat range of per*OH*OW elements, thread t taking elements t, t + T, ... (consecutive threads: consecutive
# ox, coalesced). The element's (n, oy, ox) is found by division once per thread; after that it is stepped by T
# written as (dn, doy, dox) (images, rows, columns; dox < OW, doy < OH), one carry per coordinate: no division
# per element, and dy is indexed 4-D (any strides). The loop issues BIAS_UNROLL loads before adding them (in
# order), so each thread has that many loads in flight. The block's sum is a fixed shared-memory tree; thread 0
# writes partials[co, s] (db[co] itself with one split), and a second launch, one block per channel, adds a
# channel's S partials by a fixed tree. No atomics: bit-identical run to run (for a given S and block).
#
# Split rule (bias_grad_splits): S = ceil(BIAS_BLOCKS_PER_SM * SMs / Cout), so that the Cout*S blocks give about
# BIAS_BLOCKS_PER_SM blocks per SM (all resident at once at 256 threads), then whole images per split and none
# empty (weight_grad_splits): S <= N. SIMULATOR_BIAS_SPLITS under the simulator. On an H100 (132 SMs):
# dy (64, 16, 26, 26) -> 33 asked -> 2 images per split, S = 32 (512 blocks of 1352 elements);
# dy (64, 32, 24, 24) -> 17 asked -> 4 images per split, S = 16 (512 blocks of 2304 elements).
# Napkin math: 2.8 MB (1.2 M floats) of dy at ~3 TB/s is ~1 us; the rest is two launches' fixed cost.
#
# PTX / ptxas facts (numba-cuda 0.30.4, NVVM and nvJitLink's ptxas 13.5 from numba-cuda[cu13], compile_ptx(cc=(9, 0))
# without a GPU, 256 threads): the 6 div/rem of the kernel all sit before the loop (the start element and the
# stride); the loop body is 4 ld.global.f32 issued back to back, then 4 add.f32, the coordinates stepped in 32-bit
# with set/select (no branch); each load's address is 3 mul.lo.s64 (numba's 4-D index, n*C+co hoisted); 0
# ld/st.local, 32 registers, 0 spills (as v2); 8 barrier pairs of the unrolled tree. The sum kernel: 20 registers,
# no division.

BIAS_BLOCKS_PER_SM = 4
SIMULATOR_BIAS_SPLITS = 2  # automatic split count under the simulator (SM counts mean nothing there)
BIAS_UNROLL = 4  # loads in flight per thread
BIAS_SUM_MAX_THREADS = 256  # the partial-sum launch: next power of two of S threads per channel, at most this


def bias_grad_splits(n_images, cout, splits=None, multiprocessors=None):
    """(splits, images per split) of the split bias gradient: about BIAS_BLOCKS_PER_SM blocks per SM over the Cout
    channels (``multiprocessors`` None: this device's; SIMULATOR_BIAS_SPLITS under the simulator), or ``splits``
    as asked; whole images per split, none empty (at most one split per image)."""
    if splits is None:
        if multiprocessors is None and device.simulator_enabled():
            splits = SIMULATOR_BIAS_SPLITS
        else:
            if multiprocessors is None:
                multiprocessors = gemm_multiprocessors()
            splits = math.ceil(BIAS_BLOCKS_PER_SM * int(multiprocessors) / cout)
    return weight_grad_splits(n_images, cout, splits)


@cuda.jit(device=True)
def _step_nhw(n, oy, ox, dn, doy, dox, oh_n, ow_n):
    """(n, oy, ox) advanced by (dn, doy, dox) with doy < OH, dox < OW: one carry per coordinate, no division."""
    ox = uint32(ox + dox)
    oy = uint32(oy + doy)
    if ox >= ow_n:
        ox = uint32(ox - ow_n)
        oy = uint32(oy + _U1)
    n = uint32(n + dn)
    if oy >= oh_n:
        oy = uint32(oy - oh_n)
        n = uint32(n + _U1)
    return n, oy, ox


@functools.cache
def _bias_grad3(threads, partial):
    T = np.uint32(threads)
    T_UNROLLED = np.uint32(threads * BIAS_UNROLL)
    LAST = np.uint32(threads * (BIAS_UNROLL - 1))  # offset of a group's last load
    block_sum = _block_sum(threads)
    # one store per specialisation (out is 2-D or 1-D), chosen here rather than by a branch inside
    if partial:
        @cuda.jit(device=True)
        def write(out, co, split, value):
            out[co, split] = value
    else:
        @cuda.jit(device=True)
        def write(out, co, split, value):
            out[co] = value

    @_jit_for(threads)
    def conv_bias_grad_kernel3(dy, out, per):
        buf = cuda.shared.array(threads, float32)
        vals = cuda.local.array(BIAS_UNROLL, float32)
        n_img = uint32(dy.shape[0])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        plane = uint32(oh_n * ow_n)
        t = uint32(cuda.threadIdx.x)
        co = uint32(cuda.blockIdx.x)
        split = uint32(cuda.blockIdx.y)
        n0 = uint32(split * per)
        total = uint32(uint32(min(n_img, uint32(n0 + per)) - n0) * plane)  # elements of this split
        # element t of the split, and the stride T, as (images, rows, columns): the kernel's only divisions
        rest = uint32(t % plane)
        n = uint32(n0 + uint32(t // plane))
        oy = uint32(rest // ow_n)
        ox = uint32(rest % ow_n)
        rest = uint32(T % plane)
        dn = uint32(T // plane)
        doy = uint32(rest // ow_n)
        dox = uint32(rest % ow_n)
        acc = float32(0.0)
        e = t
        while uint32(e + LAST) < total:
            for u in range(BIAS_UNROLL):  # the loads first (in flight together), then the sums in order
                vals[u] = dy[n, co, oy, ox]
                n, oy, ox = _step_nhw(n, oy, ox, dn, doy, dox, oh_n, ow_n)
            for u in range(BIAS_UNROLL):
                acc += vals[u]
            e = uint32(e + T_UNROLLED)
        while e < total:
            acc += dy[n, co, oy, ox]
            n, oy, ox = _step_nhw(n, oy, ox, dn, doy, dox, oh_n, ow_n)
            e = uint32(e + T)
        buf[t] = acc
        acc = block_sum(buf, t)  # a fixed tree
        if t == _U0:
            write(out, co, split, acc)

    return conv_bias_grad_kernel3


@functools.cache
def _bias_grad_sum3(threads):
    T = np.uint32(threads)
    block_sum = _block_sum(threads)

    @_jit_for(threads)
    def conv_bias_grad_sum3(partials, db):
        """db[co] = the sum of partials[co, :], one block per channel: thread t adds splits t, t + T, ... in
        order, then a fixed tree."""
        buf = cuda.shared.array(threads, float32)
        splits = uint32(partials.shape[1])
        t = uint32(cuda.threadIdx.x)
        co = uint32(cuda.blockIdx.x)
        acc = float32(0.0)
        s = t
        while s < splits:
            acc += partials[co, s]
            s = uint32(s + T)
        buf[t] = acc
        acc = block_sum(buf, t)
        if t == _U0:
            db[co] = acc

    return conv_bias_grad_sum3


def conv_bias_grad_v3(dy, db, block=256, splits=None, stream=0, launch=True) -> Launch | LaunchGroup:
    """Bias gradient split over the batch: a (Cout, S) grid of blocks (block a power of two) writing partial sums,
    added per channel in a fixed order by a second launch (deterministic). ``splits``: None chooses by the
    device (``bias_grad_splits``), an int asks for that many (at most one per image); one split is a single
    launch writing db."""
    op = "conv_bias_grad_v3"
    _bias_grad_args(op, dy, db)
    block = check_block(op, block, power_of_two=True)
    _check_splits(op, splits)
    n_img, cout = _shape(dy)[:2]
    splits, per = bias_grad_splits(n_img, cout, splits)
    _check_grid_y(op, splits)
    name = f"{op}[splits{splits}]"
    if splits == 1:
        return bind(_bias_grad3(block, False), (cout, 1), block, (dy, db, np.uint32(per)), stream, launch, name)
    # scratch for the splits' partial sums: owned by the bound launch, allocated once, NaN (unwritten = visible)
    partials = cuda.to_device(np.full((cout, splits), np.nan, np.float32))
    sum_threads = min(BIAS_SUM_MAX_THREADS, 1 << (splits - 1).bit_length())
    group = LaunchGroup([
        bind(_bias_grad3(block, True), (cout, splits), block, (dy, partials, np.uint32(per)), stream, False, name),
        bind(_bias_grad_sum3(sum_threads), cout, sum_threads, (partials, db), stream, False, f"{op}.sum_partials"),
    ])
    if launch:
        group()
    return group


# ---------------------------------------------------------------------------------------------------------
# Registry

VERSIONS = {
    "forward": {
        "naive": conv_forward_v1,
        "tiled": conv_forward_v2,
        "implicit_gemm": conv_forward_v3,
    },
    "backward_data": {
        "naive": conv_backward_data_v1,
        "tiled": conv_backward_data_v2,
        "implicit_gemm": conv_backward_data_v3,
    },
    "backward_weight": {
        "naive": conv_backward_weight_v1,
        "block": conv_backward_weight_v2_block,
        "shuffle": conv_backward_weight_v2_shuffle,
        "deterministic": conv_backward_weight_v2_deterministic,
        "implicit_gemm": conv_backward_weight_v3,
        "staged": conv_backward_weight_v4_staged,
    },
    "bias_grad": {
        "naive": conv_bias_grad_v1,
        "block": conv_bias_grad_v2,
        "split": conv_bias_grad_v3,
    },
}

# (pass, name) of the versions that need a real GPU (warp shuffles): skipped under the simulator
NEEDS_GPU = frozenset({("backward_weight", "shuffle")})
# (pass, name) of the versions made for some layers only -> whether one (cin, cout, k, padding, height, width) is
APPLIES = {("backward_weight", "staged"): staged_fits}


def runnable_versions(pass_name: str, layer: tuple | None = None) -> dict:
    """The versions of a pass that can run here (all on a GPU; without NEEDS_GPU under the simulator) and, given a
    `layer` (cin, cout, k, padding, height, width), that handle it (APPLIES)."""
    simulator = device.simulator_enabled()
    return {name: fn for name, fn in VERSIONS[pass_name].items()
            if not (simulator and (pass_name, name) in NEEDS_GPU)
            and (layer is None or APPLIES.get((pass_name, name), lambda *shape: True)(*layer))}


def conv_launcher(pass_name: str, variant: str):
    """The launcher of one version of one pass; ValueError naming the choices otherwise."""
    if pass_name not in VERSIONS:
        raise ValueError(f"conv: unknown pass {pass_name!r}; choose from {list(VERSIONS)}")
    try:
        return VERSIONS[pass_name][variant]
    except KeyError:
        raise ValueError(f"conv: unknown {pass_name} variant {variant!r}; choose from "
                         f"{list(VERSIONS[pass_name])}") from None
