"""Convolution + ReLU + 2x2 max pool fused (version ``implicit_gemm_pool``): the forward writes only the pooled
output and its route, and the backward passes read the pooled gradient through the route, so neither the conv's
full-size output nor its gradient is ever stored.

Layouts: x (N, Cin, H, W), w (Cout, Cin, k, k) (any strides), the conv output (N, Cout, OH, OW) never stored;
pooled and dpool (N, Cout, OH//2, OW//2) float32, route of the same shape, int8: the winner's position 2*dy + dx
inside its window, or ROUTE_NONE (4) where the pooled value is not > 0 (the ReLU passed no gradient). Odd OH or OW
floor like MaxPool2d: the last conv row / column is not computed and gets zero gradient.

* forward: one GEMM over the conv pixels in pooling-window order (``gemm.mappings``: ``im2col_window``), the
  window store ``pool_nchw`` doing bias, ReLU, max and route; run by a window version (default the deep-K
  ``deep128x32``), one launch.
* input gradient: dx = the input-gradient GEMM of ``implicit_gemm`` with its A operand the pooled gradient
  expanded through the route (``pool_grad_im2col``); ``relu_mask`` fuses the previous layer's ReLU as there.
* weight gradient: dw as ``implicit_gemm``'s, K the window-order pixels, A = the expanded gradient
  (``pool_grad_channels``), B = the input's im2col in the same order (``im2col_k_window``); split-K.
* bias gradient: db[c] = the sum of dpool over the windows whose route is not ROUTE_NONE (each window sends its
  gradient to exactly one conv pixel), split over the batch as ``bias_grad.conv_bias_grad_split``, partial sums
  added in a fixed order (deterministic).

The GEMM's A operand (c of the forward) is a tuple of the two flat arrays (dpool, route) ((pooled, route)).
References: ``conv_relu_pool_forward_ref`` and ``pooled_grad_ref`` (the expanded dy), composed from
``conv_forward_ref`` and the pool references; the backward passes are then ``conv_backward_*_ref`` of it.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import epilogue_args, shape
from ..gemm import auto_splits, conv_problem, gemm_mapped, gemm_split_k, multiprocessors, output_tiles
from ..gemm.mappings import ROUTE_NONE, WINDOW_VERSIONS
from ..launch import Launch, LaunchGroup, bind, check_block, check_device_array, flat
from ..pool import maxpool2x2_backward_ref, maxpool2x2_forward_ref
from ..softmax import _block_sum
from .bias_grad import BIAS_SUM_MAX_THREADS, _split_sum_kernel, bias_grad_splits
from .checks import U0, U1, check_splits, jit_for
from .implicit_gemm import WGRAD_SPLIT_WAVES, _activation, _expect, _geometry, _version
from .reference import conv_forward_ref

__all__ = [
    "ROUTE_NONE",
    "conv_backward_data_pool_implicit_gemm",
    "conv_backward_weight_pool_implicit_gemm",
    "conv_bias_grad_pool",
    "conv_forward_pool_implicit_gemm",
    "conv_relu_pool_forward_ref",
    "pool_gemm_version",
    "pool_wgrad_version",
    "pooled_grad_ref",
]

NARROW_MAX_N = 32  # the backward GEMMs run the 128x32 tiles up to this N (else implicit_gemm's default)
DEEP16_MAX_N = 16  # ... and the 128x16 ones up to this N
FORWARD_VERSION = "deep128x32"  # the forward's default window version
WGRAD_VERSION = "deep32x32"  # the weight gradient's default up to WGRAD_MAX_M output channels ...
WGRAD_MAX_M = 32
WGRAD_WAVES = 6  # ... split K for about this many blocks per SM (auto_splits), in chunks of at least
WGRAD_MIN_K = 256  # this many pixels (the CNN's conv2 on an H100: 144 chunks of 256; timings: gemm/NOTES.md)


def pool_gemm_version(m: int, n: int, k: int) -> str:
    """The GEMM version of a pooled input gradient: the deep-K tiles 128x16 for N <= DEEP16_MAX_N, 128x32 for
    N <= NARROW_MAX_N, else ``implicit_gemm.default_version``'s (timings: gemm/NOTES.md)."""
    if n <= DEEP16_MAX_N:
        return "deep128x16"
    return "deep128x32" if n <= NARROW_MAX_N else _version("pool", None, m, n, k)


def pool_wgrad_version(m: int, n: int, k: int) -> str:
    """The GEMM version of a pooled weight gradient (M = Cout, N = Cin*k*k, K = pixels): the deep-K 32x32 tiles
    for M <= WGRAD_MAX_M, else ``implicit_gemm.default_version``'s."""
    return WGRAD_VERSION if m <= WGRAD_MAX_M else _version("pool", None, m, n, k)


def _pooled_shape(op, n, cout, oh, ow):
    if oh < 2 or ow < 2:
        raise ValueError(f"{op}: the conv output {oh}x{ow} is smaller than the 2x2 pooling window")
    return (n, cout, oh // 2, ow // 2)


def _pooled_pair(op, pooled_name, pooled, route, want):
    _activation(op, pooled_name, pooled)
    _expect(op, pooled_name, pooled, want)
    check_device_array(op, "route", route, 4, np.int8)
    if not route.is_c_contiguous():
        raise ValueError(f"{op}: route must be C-contiguous, got a strided view of shape {shape(route)}")
    _expect(op, "route", route, want)
    return flat(pooled), flat(route)


def _dgrad_checks(op, dpool, route, w, dx, padding, relu_mask):
    """A pooled input gradient's argument checks (dx, w, dpool and route, the ReLU mask): (k, the pooled shape
    (N, Cout, PH, PW), the flat (dpool, route) pair)."""
    _activation(op, "dx", dx)
    k, oh, ow = _geometry(op, shape(dx), w, padding)
    pooled = _pooled_shape(op, shape(dx)[0], int(w.shape[0]), oh, ow)
    pair = _pooled_pair(op, "dpool", dpool, route, pooled)
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, shape(dx))
    return k, pooled, pair


def conv_forward_pool_implicit_gemm(x, w, bias, out, route, padding, relu=True, version=None, block=None,
                                    stream=0, launch=True) -> Launch:
    """out, route (N, Cout, OH//2, OW//2) = maxpool2x2(ReLU(conv(x, w) + bias)) and its route; x (N, Cin, H, W),
    w (Cout, Cin, k, k), bias (Cout,) or None; ``relu=False`` pools the conv itself (route: the winner always).
    ``version``: a window version (``gemm.mappings.WINDOW_VERSIONS``; default FORWARD_VERSION)."""
    op = "conv_forward_pool_implicit_gemm"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), w, padding)
    n, cin, h, wd = shape(x)
    cout = int(w.shape[0])
    pooled = _pooled_shape(op, n, cout, oh, ow)
    c = _pooled_pair(op, "out", out, route, pooled)
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    version = FORWARD_VERSION if version is None else version
    if version not in WINDOW_VERSIONS:
        raise ValueError(f"{op}: version {version!r} has no window epilogue; choose from {WINDOW_VERSIONS}")
    epilogue, aux = epilogue_args(op, bias, relu, None)
    ph, pw = pooled[2:]
    problem = conv_problem(n * ph * pw * 4, cout, cin * k * k, (cin, h, wd), (ph, pw), padding, cout)
    return gemm_mapped(version, problem, flat(x), w, c, aux, epilogue, a_map="im2col_window", b_map="weight_t",
                       store="pool_nchw", ksize=k, block=block, stream=stream, launch=launch, op=op,
                       name=f"{op}[{version},k{k},p{padding},{epilogue}]")


def conv_backward_data_pool_implicit_gemm(dpool, route, w, dx, padding, relu_mask=None, version=None,
                                          block=None, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """dx (N, Cin, H, W) = dL/dx of the fused forward given dpool (its pooled output's gradient) and its route;
    dx = 0 where ``relu_mask`` (dx's shape) <= 0."""
    op = "conv_backward_data_pool_implicit_gemm"
    k, pooled, a = _dgrad_checks(op, dpool, route, w, dx, padding, relu_mask)
    n, cin, h, wd = shape(dx)
    cout = int(w.shape[0])
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    # the expanded dy is the even part (2*PH, 2*PW) of the conv output; zero beyond, as in the padding
    problem = conv_problem(n * h * wd, cin, cout * k * k, (cout, 2 * pooled[2], 2 * pooled[3]), (h, wd),
                           k - 1 - padding, cin)
    version = pool_gemm_version(problem.m, problem.n, problem.k) if version is None else _version(
        op, version, problem.m, problem.n, problem.k)
    return gemm_split_k(version, problem, a, w, flat(dx), aux, epilogue, a_map="pool_grad_im2col",
                        b_map="weight_flip_t", store="nchw", ksize=k, splits=splits, block=block, stream=stream,
                        launch=launch, op=op, name=f"{op}[{version},k{k},p{padding},{epilogue}]")


def conv_backward_weight_pool_implicit_gemm(x, dpool, route, dw, padding, version=None, block=None, stream=0,
                                            launch=True, splits=None) -> Launch | LaunchGroup:
    """dw (Cout, Cin, k, k) (overwritten) of the fused forward given dpool and its route; x (N, Cin, H, W).
    ``splits`` as ``conv_backward_weight_implicit_gemm``'s (None: this device's count)."""
    op = "conv_backward_weight_pool_implicit_gemm"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    n, cin, h, wd = shape(x)
    cout = int(dw.shape[0])
    pooled = _pooled_shape(op, n, cout, oh, ow)
    a = _pooled_pair(op, "dpool", dpool, route, pooled)
    _, aux = epilogue_args(op, None, False, None)
    ph, pw = pooled[2:]
    problem = conv_problem(cout, cin * k * k, n * ph * pw * 4, (cin, h, wd), (ph, pw), padding, cout)
    version = pool_wgrad_version(problem.m, problem.n, problem.k) if version is None else _version(
        op, version, problem.m, problem.n, problem.k)
    if splits is None and not device.simulator_enabled():
        splits = auto_splits(problem.k, output_tiles(version, problem.m, problem.n), multiprocessors(),
                             waves=WGRAD_WAVES if version == WGRAD_VERSION else WGRAD_SPLIT_WAVES, min_k=WGRAD_MIN_K)
    return gemm_split_k(version, problem, a, flat(x), dw, aux, "none", a_map="pool_grad_channels",
                        b_map="im2col_k_window", store="weight4", ksize=k, splits=splits, block=block,
                        stream=stream, launch=launch, op=op, name=f"{op}[{version},k{k},p{padding}]")


_NONE = np.uint32(ROUTE_NONE)


@functools.cache
def _bias_kernel(threads):
    T = np.uint32(threads)
    block_sum = _block_sum(threads)

    @jit_for(threads)
    def conv_bias_grad_pool_kernel(dpool, route, partials, n_img, plane, per):
        """partials[c, z] = the sum over images [z*per, (z+1)*per) and pixels s of dpool[n, c, s] where
        route[n, c, s] != ROUTE_NONE; flat arrays, block (c, z), thread t taking s = t, t + T, ... of each image
        in order, then a fixed tree."""
        buf = cuda.shared.array(threads, float32)
        t = uint32(cuda.threadIdx.x)
        c = uint32(cuda.blockIdx.x)
        z = uint32(cuda.blockIdx.y)
        chw = uint32(cuda.gridDim.x * plane)
        n = uint32(z * per)
        end = uint32(min(n_img, uint32(n + per)))
        base = uint32(n * chw + c * plane)
        acc = float32(0.0)
        while n < end:
            s = t
            while s < plane:
                idx = uint32(base + s)
                if uint32(route[idx]) != _NONE:
                    acc += dpool[idx]
                s = uint32(s + T)
            base = uint32(base + chw)
            n = uint32(n + U1)
        buf[t] = acc
        acc = block_sum(buf, t)
        if t == U0:
            partials[c, z] = acc

    return conv_bias_grad_pool_kernel


def conv_bias_grad_pool(dpool, route, db, block=256, splits=None, stream=0, launch=True) -> LaunchGroup:
    """db (Cout,) = the conv bias gradient of the fused forward given dpool and its route (N, Cout, PH, PW): a
    (Cout, S) grid over batch splits (``bias_grad_splits``: about BIAS_BLOCKS_PER_SM blocks per SM; ``splits``
    asks for a count) writing partial sums, added per channel in a fixed order by the split bias gradient's sum
    launch (deterministic)."""
    op = "conv_bias_grad_pool"
    block = check_block(op, block, power_of_two=True)
    check_splits(op, splits)
    _activation(op, "dpool", dpool)
    n, cout, ph, pw = shape(dpool)
    check_device_array(op, "db", db, 1)
    _expect(op, "db", db, (cout,))
    d, r = _pooled_pair(op, "dpool", dpool, route, shape(dpool))
    splits, per = bias_grad_splits(n, cout, splits)
    partials = cuda.to_device(np.full((cout, splits), np.nan, np.float32))  # owned by the group; NaN: unwritten
    sum_threads = min(BIAS_SUM_MAX_THREADS, 1 << (splits - 1).bit_length())
    group = LaunchGroup([
        bind(_bias_kernel(block), (cout, splits), block, (d, r, partials, np.uint32(n), np.uint32(ph * pw),
                                                          np.uint32(per)), stream, False, f"{op}[splits{splits}]"),
        bind(_split_sum_kernel(sum_threads), cout, sum_threads, (partials, db), stream, False, f"{op}.sum_partials"),
    ])
    if launch:
        group()
    return group


# ---------------------------------------------------------------------------------------------------------
# float64 references (host arrays)


def conv_relu_pool_forward_ref(x, w, bias=None, padding=0, relu=True):
    """(pooled float64, route int8) of the fused forward: conv_forward_ref, then maxpool2x2_forward_ref; the
    route is the argmax, ROUTE_NONE where the pooled value is not > 0 (with the ReLU)."""
    pooled, argmax = maxpool2x2_forward_ref(conv_forward_ref(x, w, bias, padding, relu))
    route = np.where(pooled > 0, argmax, ROUTE_NONE).astype(np.int8) if relu else argmax.astype(np.int8)
    return pooled, route


def pooled_grad_ref(dpool, route, conv_shape) -> np.ndarray:
    """The conv output's gradient (conv_shape, float64) of dpool routed by route: maxpool2x2_backward_ref with the
    windows of route ROUTE_NONE sending nothing."""
    route = np.asarray(route)
    live = route != ROUTE_NONE
    dpool = np.where(live, np.asarray(dpool, np.float64), 0.0)
    return maxpool2x2_backward_ref(dpool, np.where(live, route, 0).astype(np.int8), conv_shape)
