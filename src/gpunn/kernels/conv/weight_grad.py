"""Convolution weight gradient by block reduction, versions ``block``, ``shuffle`` and ``deterministic``: one block
per (co, ci) slice and batch split.

dw[co, ci, kh, kw] = sum_{n, oy, ox} dy[n, co, oy, ox] * x[n, ci, oy + kh - p, ox + kw - p]. Block (slice, split)
sums n in [split * per, (split + 1) * per): thread t visits the elements e = t, t + T, ... of each image's OH*OW
plane (consecutive threads: consecutive ox, coalesced dy and x reads), loading dy once for k*k products
accumulated in k*k registers. The k*k sums are then reduced over the block (a tree in shared memory, or warp
shuffles then shared memory: ``shuffle``, real GPU only) and written by `store`: "store" dw directly (one split);
"atomic" cuda.atomic.add into dw zeroed before (several splits: ``block``, ``shuffle``); "partial"
partials[split, slice * k*k + kk], added in split order by a second kernel (``deterministic``: bit-identical);
"bias_partial" the same with one more sum per block, of dy itself (the bias gradient, written by the ci = Cin-1 blocks),
into partials[split, co * (Cin*k*k + 1) + ...] (the bias last in each co's row: ``wgrad_bias``).
With one split (large Cout*Cin, or ``splits=1``) every one is deterministic.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import shape
from ..jit import jit
from ..launch import LaunchGroup, bind, check_block, grid_for
from .checks import (
    SMEM_LIMIT,
    U0,
    U1,
    WARP,
    backward_weight_args,
    check_grid_y,
    check_splits,
    jit_for,
)

__all__ = ["conv_backward_weight_block", "conv_backward_weight_deterministic", "conv_backward_weight_shuffle",
           "sum_partials", "tree_rows", "weight_grad_splits"]

WGRAD_TARGET_BLOCKS = 1024  # split the batch until about this many blocks (8 per SM on 132 SMs) ...
# ... but under the simulator, where every thread of every block is a Python thread, one split: the engine tests'
# weight gradients cost a fraction (the split paths have kernel tests of their own, with splits asked explicitly)
SIMULATOR_WGRAD_SPLITS = 1
FULL_MASK = 0xFFFFFFFF


def weight_grad_splits(n_images, slices, splits=None):
    """(splits, images per split): splits of the batch so that slices * splits reaches WGRAD_TARGET_BLOCKS
    (None), or as asked; every split holds whole images and none is empty."""
    if splits is None:
        splits = max(1, math.ceil(WGRAD_TARGET_BLOCKS / slices))
    splits = max(1, min(int(splits), n_images))
    per = math.ceil(n_images / splits)
    return math.ceil(n_images / per), per


@functools.cache
def tree_rows(threads, rows, count):
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
    bias = store == "bias_partial"  # one more sum: dy's own (the bias gradient)
    sums = kk_n + 1 if bias else kk_n
    warps = threads // WARP
    shuffle = reduction == "shuffle"
    # tree reduction: `rows` of the k*k sums side by side in buf (rows x threads), leaving a little shared
    # memory for the other (1-element) array; shuffles: one value per sum and warp
    rows = max(1, min(sums, (SMEM_LIMIT - 64) // (4 * threads)))
    several_trees = rows < sums
    buf_n = 1 if shuffle else rows * threads
    warp_buf_n = kk_n * warps if shuffle else 1
    P = np.uint32(pad)
    K = np.uint32(k)
    KK = np.uint32(kk_n)
    T = np.uint32(threads)
    NW = np.uint32(warps)
    tree = tree_rows(threads, rows, sums)

    # one store per specialisation, chosen here rather than by branches inside (out is 4-D or 2-D)
    if bias:  # row co of partials: the Cin*k*k weights, then the bias (sum kk_n, written by ci = Cin - 1 only)
        @cuda.jit(device=True)
        def write(out, split, co, ci, cin, slice_, kk, value):
            # column co * (Cin*KK + 1) + ci*KK + kk = slice * KK + co + kk; the bias (kk = KK) by the last slice of co
            if kk < KK or ci == uint32(cin - U1):
                out[split, uint32(uint32(slice_ * KK + co) + kk)] = value
    elif store == "partial":
        @cuda.jit(device=True)
        def write(out, split, co, ci, cin, slice_, kk, value):
            out[split, uint32(slice_ * KK + kk)] = value
    elif store == "atomic":
        @cuda.jit(device=True)
        def write(out, split, co, ci, cin, slice_, kk, value):
            cuda.atomic.add(out, (co, ci, uint32(kk // K), uint32(kk % K)), value)
    else:
        @cuda.jit(device=True)
        def write(out, split, co, ci, cin, slice_, kk, value):
            out[co, ci, uint32(kk // K), uint32(kk % K)] = value

    @jit_for(threads)
    def conv_wgrad_kernel(x, dy, out, per):
        buf = cuda.shared.array(buf_n, float32)
        warp_buf = cuda.shared.array(warp_buf_n, float32)
        acc = cuda.local.array(sums, float32)
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
        for j in range(sums):
            acc[j] = float32(0.0)
        n = uint32(split * per)
        n_end = uint32(min(n_img, uint32(n + per)))
        while n < n_end:
            e = t
            while e < plane:
                oy = uint32(e // ow_n)
                ox = uint32(e % ow_n)
                d = dy[n, co, oy, ox]
                if bias:
                    acc[kk_n] += d
                for kh in range(k):
                    r = uint32(oy + uint32(kh))
                    if r >= P and r < h + P:
                        for kw in range(k):
                            c = uint32(ox + uint32(kw))
                            if c >= P and c < wd + P:
                                acc[kh * k + kw] += d * x[n, ci, uint32(r - P), uint32(c - P)]
                e = uint32(e + T)
            n = uint32(n + U1)

        if shuffle:
            lane = uint32(t % WARP)
            warp = uint32(t // WARP)
            for j in range(kk_n):
                v = acc[j]
                offset = WARP // 2
                while offset > 0:
                    v += cuda.shfl_down_sync(FULL_MASK, v, offset)
                    offset //= 2
                if lane == U0:
                    warp_buf[uint32(uint32(j) * NW + warp)] = v
            cuda.syncthreads()
            kk = t
            while kk < KK:  # fixed order over the warps
                total = float32(0.0)
                wi = U0
                while wi < NW:
                    total += warp_buf[uint32(kk * NW + wi)]
                    wi = uint32(wi + U1)
                write(out, split, co, ci, cin, slice_, kk, total)
                kk = uint32(kk + T)
        else:
            # `rows` of the k*k sums reduced side by side per tree (all of them for k = 3 and up to 1024
            # threads): log2(T) barriers per tree instead of per sum; thread j writes sum j0 + j.
            for j0 in range(0, sums, rows):
                tree(buf, acc, j0, t)
                if t < uint32(rows) and j0 + t < sums:
                    write(out, split, co, ci, cin, slice_, uint32(j0 + t), buf[uint32(t * T)])
                if several_trees:
                    cuda.syncthreads()  # the next tree overwrites buf[j * T], read just above by thread j

    return conv_wgrad_kernel


@functools.cache
def sum_partials(k):
    K = np.uint32(k)

    @jit
    def conv_wgrad_sum_partials(partials, dw):
        """dw = the sum of partials over the splits (rows), in row order: one thread per weight element."""
        splits = uint32(partials.shape[0])
        cin = uint32(dw.shape[1])
        total = uint32(partials.shape[1])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            acc = float32(0.0)
            s = U0
            while s < splits:
                acc += partials[s, i]
                s = uint32(s + U1)
            kw = uint32(i % K)
            rest = uint32(i // K)
            kh = uint32(rest % K)
            rest = uint32(rest // K)
            dw[uint32(rest // cin), uint32(rest % cin), kh, kw] = acc
            i = uint32(i + stride)

    return conv_wgrad_sum_partials


@jit
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


def _weight_grad_block(op, x, dy, dw, padding, block, splits, reduction, deterministic, stream, launch):
    padding, (cout, cin, k) = backward_weight_args(op, x, dy, dw, padding)
    if reduction == "shuffle":
        if device.simulator_enabled():
            raise ValueError(f"{op}: warp shuffles need a real GPU (numba's CUDA simulator has no shfl_down_sync)")
        block = check_block(op, block, power_of_two=True)
        if block < WARP:
            raise ValueError(f"{op}: block must be a multiple of the warp size {WARP}, got {block}")
    else:
        block = check_block(op, block, power_of_two=True)
    check_splits(op, splits)
    slices = cout * cin
    if splits is None and device.simulator_enabled():
        splits = SIMULATOR_WGRAD_SPLITS
    splits, per = weight_grad_splits(shape(x)[0], slices, splits)
    check_grid_y(op, splits)
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
                    bind(sum_partials(k), grid_for(slices * k * k, 256), 256, (partials, dw), stream, False,
                         f"{op}.sum_partials")]
    else:
        launches = [bind(_zero4_kernel, grid_for(dw.size, 256), 256, (dw,), stream, False, f"{op}.zero"),
                    bind(_wgrad(k, padding, block, reduction, "atomic"), grid, block, (x, dy, dw, np.uint32(per)),
                         stream, False, name)]
    group = LaunchGroup(launches)
    if launch:
        group()
    return group


def conv_backward_weight_block(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """Weight gradient, block per (co, ci) slice and batch split, shared-memory tree reduction; several splits
    are added with atomics (``splits``: None chooses by size, 1 gives a deterministic single pass)."""
    return _weight_grad_block("conv_backward_weight_block", x, dy, dw, padding, block, splits, "tree", False,
                              stream, launch)


def conv_backward_weight_shuffle(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """As ``conv_backward_weight_block``, reduced by warp shuffles then shared memory; needs a real GPU."""
    return _weight_grad_block("conv_backward_weight_shuffle", x, dy, dw, padding, block, splits, "shuffle", False,
                              stream, launch)


def conv_backward_weight_deterministic(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """As ``conv_backward_weight_block``, but splits write partial sums that a second launch adds in a fixed
    order: no atomics, bit-identical across runs."""
    return _weight_grad_block("conv_backward_weight_deterministic", x, dy, dw, padding, block, splits, "tree",
                              True, stream, launch)

