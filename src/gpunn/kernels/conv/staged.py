"""Convolution weight gradient, version ``staged``: for layers with a narrow side (Cin or Cout of a few channels,
the autoencoder's 3 -> 256 and 256 -> 3), where the GEMM view wastes most of a tile and the block reductions
re-read every input value k*k times from global memory.

A block owns one channel of the wide side and a split of the images; per image it stages the padded input planes
it reads (every Cin plane when Cin is the narrow side, its own plane when Cout is) in shared memory, zero halo
included, then each thread walks output positions and accumulates all narrow * k * k weights of its channel in
registers: no bounds checks. The per-thread sums are reduced by a shared-memory tree into partials[split, ...]
(the ``deterministic`` layout), added in split order by its sum kernel: deterministic. Where it is chosen
(narrow outputs only) and why: NOTES.md and ``gpunn.backends.gpu.policy.conv_version``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import shape
from ..launch import LaunchGroup, bind, check_block, grid_for
from .checks import (
    SMEM_LIMIT,
    U1,
    backward_weight_args,
    check_grid_y,
    check_splits,
    jit_for,
)
from .weight_grad import (
    SIMULATOR_WGRAD_SPLITS,
    sum_partials,
    tree_rows,
    weight_grad_splits,
)

__all__ = ["STAGED_MAX_NARROW", "conv_backward_weight_staged", "staged_fits"]

STAGED_MAX_NARROW = 4  # narrow-side channels the staged weight gradient accumulates per thread (x k*k registers)


def staged_fits(cin: int, cout: int, k: int, padding: int, height: int, width: int) -> bool:
    """Whether the staged weight gradient handles this layer: a narrow side of at most STAGED_MAX_NARROW channels,
    and the padded input planes it stages (plus one reduction row) within a block's shared memory."""
    narrow = min(cin, cout)
    planes = cin if cin <= cout else 1
    staged = planes * (height + 2 * padding) * (width + 2 * padding)
    return narrow <= STAGED_MAX_NARROW and 4 * (staged + 1024) <= SMEM_LIMIT


@functools.cache
def _wgrad_staged(k, pad, threads, narrow, narrow_in, height, width, up=False):
    """narrow_in: Cin is the narrow side (block per output channel, every input plane staged); else Cout is (block
    per input channel, its plane staged, the narrow dy channels read per position). up: the conv's input is the
    2x nearest upsample of x (height, width: the upsampled size), staged from x (gpunn.kernels.conv.upsampled)."""
    kk_n = k * k
    acc_n = narrow * kk_n
    ph, pw = height + 2 * pad, width + 2 * pad
    planes = narrow if narrow_in else 1
    stage_n = planes * ph * pw
    rows = max(1, min(acc_n, (SMEM_LIMIT - 4 * stage_n) // (4 * threads)))  # sums reduced side by side per tree
    buf_n = rows * threads  # (shared array sizes must be constants of the closure, not expressions in the kernel)
    P = np.uint32(pad)
    PW = np.uint32(pw)
    PLANE = np.uint32(ph * pw)
    H, W = np.uint32(height), np.uint32(width)
    T = np.uint32(threads)
    KK = np.uint32(kk_n)
    STAGE = np.uint32(stage_n)
    tree = tree_rows(threads, rows, acc_n)

    @jit_for(threads)
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
                    if up:
                        value = x[n, c if narrow_in else wide, uint32(r - P) >> U1, uint32(col - P) >> U1]
                    else:
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
                                at = uint32(c) * PLANE + base + uint32(kh) * PW + uint32(kw)
                                acc[(c * k + kh) * k + kw] += d * xs[at]
                else:
                    for kh in range(k):
                        for kw in range(k):
                            v = xs[base + uint32(kh) * PW + uint32(kw)]
                            for c in range(narrow):
                                acc[c * kk_n + kh * k + kw] += dy[n, c, oy, ox] * v
                e = uint32(e + T)
            cuda.syncthreads()  # the next image overwrites xs
            n = uint32(n + U1)
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


def conv_backward_weight_staged(x, dy, dw, padding, block=256, splits=None, stream=0, launch=True):
    """Weight gradient of a layer with a narrow side (``staged_fits``): block per wide-side channel and batch
    split, the padded input planes staged in shared memory, narrow * k * k sums per thread, partial sums added in
    a fixed order (deterministic)."""
    op = "conv_backward_weight_staged"
    padding, w_shape = backward_weight_args(op, x, dy, dw, padding)
    return staged_group(op, x, dy, dw, padding, w_shape, shape(x)[2:], block, splits, stream, launch)


def staged_group(op, x, dy, dw, padding, w_shape, size, block, splits, stream, launch, up=False):
    """The staged launches on checked arguments: the conv's input of `size` (height, width) is x, or with `up` the
    2x upsample of x (then size is the upsampled one)."""
    cout, cin, k = w_shape
    block = check_block(op, block, power_of_two=True)
    check_splits(op, splits)
    height, width = (int(v) for v in size)
    if not staged_fits(cin, cout, k, padding, height, width):
        raise ValueError(f"{op}: a {cin} -> {cout} layer on {height}x{width} inputs has no narrow side of at most "
                         f"{STAGED_MAX_NARROW} channels whose padded planes fit in shared memory; use another version")
    narrow_in = cin <= cout
    wide = cout if narrow_in else cin
    if splits is None and device.simulator_enabled():
        splits = SIMULATOR_WGRAD_SPLITS
    splits, per = weight_grad_splits(shape(x)[0], wide, splits)
    check_grid_y(op, splits)
    kernel = _wgrad_staged(k, padding, block, min(cin, cout), narrow_in, height, width, up)
    # scratch for the splits' partial sums (the deterministic version's layout), owned by the bound launch
    partials = cuda.device_array((splits, cout * cin * k * k), np.float32)
    group = LaunchGroup([
        bind(kernel, (wide, splits), block, (x, dy, partials, np.uint32(per)), stream, False,
             f"{op}[k{k},p{padding},{'cin' if narrow_in else 'cout'}{min(cin, cout)},splits{splits}]"),
        bind(sum_partials(k), grid_for(cout * cin * k * k, 256), 256, (partials, dw), stream, False,
             f"{op}.sum_partials"),
    ])
    if launch:
        group()
    return group
