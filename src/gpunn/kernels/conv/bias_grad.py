"""Convolution bias gradient, versions ``block`` and ``split`` (the ``naive`` one is in naive.py). Both are
deterministic (fixed reduction trees, no atomics).

``block``: one block per channel, a shared-memory tree.

``split``: a (Cout, S) grid over batch splits. Block (co, s) sums images [s * per, (s + 1) * per) of channel co as
one flat range of per*OH*OW elements, thread t taking elements t, t + T, ... (coalesced). The element's
(n, oy, ox) is found by division once per thread, then stepped by T written as (dn, doy, dox), one carry per
coordinate: no division per element, and dy is indexed 4-D (any strides). The loop issues BIAS_UNROLL loads before
adding them in order. The block's sum is a fixed tree; thread 0 writes partials[co, s] (db[co] with one split), and
a second launch, one block per channel, adds a channel's S partials by a fixed tree. Split rule
(``bias_grad_splits``): S = ceil(BIAS_BLOCKS_PER_SM * SMs / Cout), whole images per split, none empty; examples,
napkin math and PTX facts: NOTES.md.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import shape
from ..gemm import multiprocessors as gemm_multiprocessors
from ..launch import Launch, LaunchGroup, bind, check_block
from ..softmax import _block_sum
from .checks import (
    U0,
    U1,
    bias_grad_args,
    check_grid_y,
    check_splits,
    jit_for,
)
from .weight_grad import weight_grad_splits

__all__ = ["BIAS_BLOCKS_PER_SM", "SIMULATOR_BIAS_SPLITS", "bias_grad_splits", "conv_bias_grad_block",
           "conv_bias_grad_split"]

@functools.cache
def _block_kernel(threads):
    T = np.uint32(threads)
    block_sum = _block_sum(threads)

    @jit_for(threads)
    def conv_bias_grad_block_kernel(dy, db):
        buf = cuda.shared.array(threads, float32)
        n_img = uint32(dy.shape[0])
        ow_n = uint32(dy.shape[3])
        plane = uint32(dy.shape[2] * dy.shape[3])
        t = uint32(cuda.threadIdx.x)
        co = uint32(cuda.blockIdx.x)
        acc = float32(0.0)
        n = U0
        while n < n_img:
            e = t
            while e < plane:
                acc += dy[n, co, uint32(e // ow_n), uint32(e % ow_n)]
                e = uint32(e + T)
            n = uint32(n + U1)
        buf[t] = acc
        acc = block_sum(buf, t)  # a fixed tree: deterministic
        if t == U0:
            db[co] = acc

    return conv_bias_grad_block_kernel


def conv_bias_grad_block(dy, db, block=256, stream=0, launch=True) -> Launch:
    """Bias gradient: one block per channel, shared-memory tree reduction (block a power of two)."""
    op = "conv_bias_grad_block"
    bias_grad_args(op, dy, db)
    block = check_block(op, block, power_of_two=True)
    kernel = _block_kernel(block)
    return bind(kernel, db.shape[0], block, (dy, db), stream, launch, op)



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
        oy = uint32(oy + U1)
    n = uint32(n + dn)
    if oy >= oh_n:
        oy = uint32(oy - oh_n)
        n = uint32(n + U1)
    return n, oy, ox


@functools.cache
def _split_kernel(threads, partial):
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

    @jit_for(threads)
    def conv_bias_grad_split_kernel(dy, out, per):
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
        if t == U0:
            write(out, co, split, acc)

    return conv_bias_grad_split_kernel


@functools.cache
def _split_sum_kernel(threads):
    T = np.uint32(threads)
    block_sum = _block_sum(threads)

    @jit_for(threads)
    def conv_bias_grad_split_sum(partials, db):
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
        if t == U0:
            db[co] = acc

    return conv_bias_grad_split_sum


def conv_bias_grad_split(dy, db, block=256, splits=None, stream=0, launch=True) -> Launch | LaunchGroup:
    """Bias gradient split over the batch: a (Cout, S) grid of blocks (block a power of two) writing partial sums,
    added per channel in a fixed order by a second launch (deterministic). ``splits``: None chooses by the
    device (``bias_grad_splits``), an int asks for that many (at most one per image); one split is a single
    launch writing db."""
    op = "conv_bias_grad_split"
    bias_grad_args(op, dy, db)
    block = check_block(op, block, power_of_two=True)
    check_splits(op, splits)
    n_img, cout = shape(dy)[:2]
    splits, per = bias_grad_splits(n_img, cout, splits)
    check_grid_y(op, splits)
    name = f"{op}[splits{splits}]"
    if splits == 1:
        return bind(_split_kernel(block, False), (cout, 1), block, (dy, db, np.uint32(per)), stream, launch, name)
    # scratch for the splits' partial sums: owned by the bound launch, allocated once, NaN (unwritten = visible)
    partials = cuda.to_device(np.full((cout, splits), np.nan, np.float32))
    sum_threads = min(BIAS_SUM_MAX_THREADS, 1 << (splits - 1).bit_length())
    group = LaunchGroup([
        bind(_split_kernel(block, True), (cout, splits), block, (dy, partials, np.uint32(per)), stream, False, name),
        bind(_split_sum_kernel(sum_threads), cout, sum_threads, (partials, db), stream, False, f"{op}.sum_partials"),
    ])
    if launch:
        group()
    return group

