"""Column sums for bias gradients: db[j] = sum_i dy[i, j] for dy (B, N) row-major.

Variants:

    1 colsum_atomic  one thread per element over B*N (grid-stride), cuda.atomic.add into db after a zeroing
                     launch (none with `zeroed`: the caller keeps db zero between uses, as the training engine's
                     SGD launch does); simple, but the float add order varies run to run (not bitwise reproducible)
    2 colsum_tree    deterministic: a block of `block` threads owns TX = min(32, block) adjacent columns and
                     TY = block / TX row lanes; thread (tx, ty) sums rows ty, ty + TY, ... of its column
                     (reads coalesced across tx), then a shared-memory tree over the TY lanes; no atomics,
                     fixed add order, so bitwise identical from run to run

The float64 NumPy reference is `colsum_ref`; `VERSIONS` maps names to launchers.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from .jit import jit
from .launch import Launch, LaunchGroup, bind, check_array, check_block, flat, grid_for

__all__ = ["VERSIONS", "colsum_atomic", "colsum_ref", "colsum_tree"]

WARP = 32


# --------------------------------------------------------------------------------------------- kernels
@jit
def _zero_kernel(a, n):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        a[i] = float32(0.0)


@jit
def _colsum_atomic_kernel(dy, db, n, cols):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        cuda.atomic.add(db, i % cols, dy[i])


@functools.cache
def _colsum_tree_kernel(block: int):
    tx_count = min(WARP, block)
    ty_count = block // tx_count

    @jit
    def colsum_tree_kernel(dy, db, rows, cols):
        buf = cuda.shared.array(block, float32)
        t = cuda.threadIdx.x
        tx = t % tx_count
        ty = t // tx_count
        col = cuda.blockIdx.x * tx_count + tx
        acc = float32(0.0)
        if col < cols:
            for i in range(ty, rows, ty_count):
                acc += dy[i, col]
        buf[t] = acc
        cuda.syncthreads()
        s = ty_count // 2
        while s > 0:
            if ty < s:
                buf[t] += buf[t + s * tx_count]
            cuda.syncthreads()
            s //= 2
        if ty == 0 and col < cols:
            db[col] = buf[t]

    return colsum_tree_kernel, tx_count


# --------------------------------------------------------------------------------------------- launchers
def _check(op: str, dy, db):
    check_array(op, "dy", dy, 2)
    check_array(op, "db", db, 1)
    if db.shape[0] != dy.shape[1]:
        raise ValueError(
            f"{op}: db {tuple(db.shape)} must have shape ({dy.shape[1]},) to match dy {tuple(dy.shape)}"
        )


def colsum_atomic(dy, db, block: int = 256, stream=0, launch: bool = True, zeroed: bool = False):
    """Variant 1: db (N,) = dy (B, N).sum(0) via atomics: a LaunchGroup that zeroes db by its own launch first, or
    with `zeroed` (db is zero whenever this runs: the caller zeroes it after each use) the single atomic launch."""
    op = "colsum_atomic"
    block = check_block(op, block)
    _check(op, dy, db)
    cols = db.shape[0]
    n = dy.size
    add = bind(_colsum_atomic_kernel, grid_for(n, block), block, (flat(dy), db, n, cols), stream, False, op)
    group = add if zeroed else LaunchGroup([
        bind(_zero_kernel, grid_for(cols, block), block, (db, cols), stream, False, "zero"), add])
    if launch:
        group()
    return group


def colsum_tree(dy, db, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """Variant 2: db (N,) = dy (B, N).sum(0), deterministic shared-memory tree (block a power of two)."""
    op = "colsum_tree"
    block = check_block(op, block, power_of_two=True)
    _check(op, dy, db)
    rows, cols = dy.shape
    kernel, tx_count = _colsum_tree_kernel(block)
    return bind(kernel, math.ceil(cols / tx_count), block, (dy, db, rows, cols), stream, launch, op)


VERSIONS = {
    "colsum_atomic": colsum_atomic,
    "colsum_tree": colsum_tree,
}


# --------------------------------------------------------------------------------------------- reference
def colsum_ref(dy) -> np.ndarray:
    return np.asarray(dy, np.float64).sum(axis=0)
