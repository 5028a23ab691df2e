"""Weight and bias gradients of a convolution in one pass (the bias gradient "made by the weight-gradient pass":
no launches of its own). The bias gradient db[co] = sum over K of dy[co, :] is the weight-gradient GEMM
(M = Cout, N = Cin*k*k, K = pixels) against one more column of ones, N -> N + 1; the split pass writes partial
sums of the (Cout, N + 1) matrix, and one sum launch adds them in a fixed order into dw and db.

* ``conv_backward_weight_bias_pool``: the fused conv + ReLU + pool stage's weight gradient
  (``pooled.conv_backward_weight_pool_implicit_gemm``) with B = ``im2col_k_window_ones`` (the last column ones)
  into a (splits, Cout, N + 1) scratch: the bias column lies inside the last N tile (the CNN's conv2: N = 144 in
  5 tiles of 32 either way).
* ``conv_backward_weight_bias_deterministic``: the block-reduction weight gradient (``weight_grad``, store
  "bias_partial"): each block sums dy beside its k*k products, the last input-channel slice of each output
  channel writes that sum as the bias column.

The sum launch (``_sum_kernel``): a block takes SUM_COLUMNS consecutive elements of the (Cout, N + 1) matrix and
``sum_lanes`` lanes each; lane l adds splits l, l + L, ... in order (SUM_UNROLL loads in flight), then the lanes'
sums are added by a fixed tree in shared memory. Deterministic (fixed orders, no atomics); the bits may differ from
the separate launches' (another summation order). References: ``conv_backward_weight_ref`` and
``conv_bias_grad_ref`` of the (expanded) output gradient.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, epilogue_args, shape
from ..gemm import (
    MAX_SPLITS,
    SIMULATOR_SPLITS,
    auto_splits,
    conv_problem,
    lookup,
    multiprocessors,
    output_tiles,
    split_k_chunks,
)
from ..launch import LaunchGroup, bind, check_block, check_device_array, flat
from .checks import U0, U1, backward_weight_args, check_grid_y, check_splits, jit_for
from .implicit_gemm import WGRAD_SPLIT_WAVES, _activation, _expect, _geometry, _version
from .pooled import WGRAD_MIN_K, WGRAD_VERSION, WGRAD_WAVES, _pooled_pair, _pooled_shape, pool_wgrad_version
from .weight_grad import SIMULATOR_WGRAD_SPLITS, _wgrad, weight_grad_splits

__all__ = ["SUM_COLUMNS", "SUM_LANES", "check_db", "conv_backward_weight_bias_deterministic",
           "conv_backward_weight_bias_pool", "sum_lanes", "sum_launch"]

SUM_COLUMNS = 32  # elements of the (Cout, N + 1) matrix per sum block: a warp reads 32 consecutive partials
SUM_LANES = 16  # ... and lanes per element: each adds every SUM_LANES-th split (SUM_LANES_MANY from SUM_MANY)
SUM_LANES_MANY = 32
SUM_MANY = 256
SUM_UNROLL = 4
BIAS_WGRAD_TARGET_BLOCKS = 512  # the block reduction's automatic splits: about this many blocks (H100, CNN conv1:
# 32 splits of 16 slices 16.5 us with the sum, 64 splits 17.7)
_COLS = np.uint32(SUM_COLUMNS)
_UNROLL = np.uint32(SUM_UNROLL)


def sum_lanes(splits: int) -> int:
    """Lanes per element of the sum launch over `splits` partial slices."""
    return SUM_LANES_MANY if splits >= SUM_MANY else SUM_LANES


@functools.cache
def _sum_kernel(k, lanes=SUM_LANES):
    KK = np.uint32(k * k)
    K = np.uint32(k)
    threads = SUM_COLUMNS * lanes
    _LANES = np.uint32(lanes)

    @jit_for(threads)
    def wgrad_bias_sum(partials, dw, db, splits):
        """dw[co, ci, kh, kw] and db[co] = the sums over the splits of the flat (splits, Cout, Cin*k*k + 1)
        partials: (co, ci*k*k + kh*k + kw) and (co, Cin*k*k)."""
        buf = cuda.shared.array(threads, float32)
        vals = cuda.local.array(SUM_UNROLL, float32)
        t = uint32(cuda.threadIdx.x)
        lane = uint32(t // _COLS)
        nw = uint32(dw.shape[1] * KK)
        mn = uint32(dw.shape[0] * uint32(nw + U1))
        e = uint32(cuda.blockIdx.x * _COLS + t % _COLS)
        acc = float32(0.0)
        if e < mn:
            z = lane
            idx = uint32(z * mn + e)
            stride = uint32(mn * _LANES)
            while uint32(z + uint32(_LANES * uint32(_UNROLL - U1))) < splits:
                for u in range(SUM_UNROLL):  # the loads first (in flight together), then the sums in order
                    vals[u] = partials[uint32(idx + uint32(u) * stride)]
                for u in range(SUM_UNROLL):
                    acc += vals[u]
                idx = uint32(idx + _UNROLL * stride)
                z = uint32(z + _UNROLL * _LANES)
            while z < splits:
                acc += partials[idx]
                idx = uint32(idx + stride)
                z = uint32(z + _LANES)
        buf[t] = acc
        cuda.syncthreads()
        s = _LANES >> U1
        while s > U0:  # a fixed tree over the lanes
            if lane < s:
                buf[t] += buf[uint32(t + s * _COLS)]
            cuda.syncthreads()
            s = uint32(s >> U1)
        if lane == U0 and e < mn:
            co = uint32(e // uint32(nw + U1))
            j = uint32(e - co * uint32(nw + U1))
            if j < nw:
                ci = uint32(j // KK)
                rem = uint32(j - ci * KK)
                kh = uint32(rem // K)
                dw[co, ci, kh, uint32(rem - kh * K)] = buf[t]
            else:
                db[co] = buf[t]

    return wgrad_bias_sum


def sum_launch(k, partials, dw, db, splits, stream, name):
    """The bound sum launch: dw and db from the flat (splits, Cout, Cin*k*k + 1) partials."""
    cout, cin = int(dw.shape[0]), int(dw.shape[1])
    lanes = sum_lanes(splits)
    return bind(_sum_kernel(k, lanes), cdiv(cout * (cin * k * k + 1), SUM_COLUMNS), SUM_COLUMNS * lanes,
                (partials, dw, db, np.uint32(splits)), stream, False, name)


def check_db(op, db, cout):
    check_device_array(op, "db", db, 1)
    _expect(op, "db", db, (cout,))


def conv_backward_weight_bias_pool(x, dpool, route, dw, db, padding, version=None, block=None, stream=0,
                                   launch=True, splits=None) -> LaunchGroup:
    """dw (Cout, Cin, k, k) and db (Cout,) (overwritten) of the fused conv + ReLU + pool given dpool and its route;
    x (N, Cin, H, W). The split GEMM of ``conv_backward_weight_pool_implicit_gemm`` (``version`` and ``splits`` as
    there; None: its rules) on N + 1 columns, then one sum launch into dw and db: two launches."""
    op = "conv_backward_weight_bias_pool"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    n, cin, h, wd = shape(x)
    cout = int(dw.shape[0])
    check_db(op, db, cout)
    pooled = _pooled_shape(op, n, cout, oh, ow)
    a = _pooled_pair(op, "dpool", dpool, route, pooled)
    check_splits(op, splits)
    ph, pw = pooled[2:]
    nw = cin * k * k
    problem = conv_problem(cout, nw + 1, n * ph * pw * 4, (cin, h, wd), (ph, pw), padding, cout)
    # the version and the split count as the weight gradient alone has them (its N, without the ones column)
    version = pool_wgrad_version(cout, nw, problem.k) if version is None else _version(
        op, version, cout, nw, problem.k)
    if splits is None:
        splits = (SIMULATOR_SPLITS if device.simulator_enabled() else
                  auto_splits(problem.k, output_tiles(version, cout, nw), multiprocessors(),
                              waves=WGRAD_WAVES if version == WGRAD_VERSION else WGRAD_SPLIT_WAVES,
                              min_k=WGRAD_MIN_K))
    spec = lookup(version, op)
    splits, k_len = split_k_chunks(problem.k, min(int(splits), MAX_SPLITS), spec.k_step)
    # the split pass (gemm.split_k's, store "partial") into a (splits, Cout, N + 1) scratch, NaN: unwritten
    kernel = spec.kernel("pool_grad_channels", "im2col_k_window_ones", "partial", k, "none", True)
    grid, threads = spec.config(op, spec.block if block is None else block, problem.m, problem.n, kernel)
    partials = cuda.to_device(np.full(splits * cout * (nw + 1), np.nan, np.float32))
    aux = epilogue_args(op)[1]  # the "none" epilogue's dummy
    group = LaunchGroup([
        bind(kernel, (*grid, splits), threads, (a, flat(x), partials, aux, (*problem.dims, np.uint32(k_len))),
             stream, False, f"{op}[{version},k{k},p{padding}][split {splits} x {k_len}]"),
        sum_launch(k, partials, dw, db, splits, stream, f"{op}.sum[{splits}]"),
    ])
    if launch:
        group()
    return group


def conv_backward_weight_bias_deterministic(x, dy, dw, db, padding, block=256, splits=None, stream=0,
                                            launch=True) -> LaunchGroup:
    """dw (Cout, Cin, k, k) and db (Cout,) of a stride-1 conv given dy: the ``deterministic`` block reduction
    (``splits`` as there) with dy's own sum beside the k*k products, then one sum launch into dw and db."""
    op = "conv_backward_weight_bias_deterministic"
    padding, (cout, cin, k) = backward_weight_args(op, x, dy, dw, padding)
    check_db(op, db, cout)
    block = check_block(op, block, power_of_two=True)
    check_splits(op, splits)
    slices = cout * cin
    if splits is None:
        splits = SIMULATOR_WGRAD_SPLITS if device.simulator_enabled() else math.ceil(BIAS_WGRAD_TARGET_BLOCKS / slices)
    splits, per = weight_grad_splits(shape(x)[0], slices, splits)
    check_grid_y(op, splits)
    partials = cuda.to_device(np.full((splits, cout * (cin * k * k + 1)), np.nan, np.float32))  # NaN: unwritten
    group = LaunchGroup([
        bind(_wgrad(k, padding, block, "tree", "bias_partial"), (slices, splits), block,
             (x, dy, partials, np.uint32(per)), stream, False, f"{op}[k{k},p{padding},splits{splits}]"),
        sum_launch(k, partials.reshape(partials.size), dw, db, splits, stream, f"{op}.sum[{splits}]"),
    ])
    if launch:
        group()
    return group
