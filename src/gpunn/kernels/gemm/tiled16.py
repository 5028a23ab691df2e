"""GEMM version ``tiled16``: 16x16 shared-memory tiles of op(A) and op(B), zero-filled edge loads, each load
coalesced along its operand's contiguous axis (a tile is written transposed where that axis is the outer one);
the block is fixed to (16, 16)."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv
from ..jit import jit
from .mappings import k_range_fn, kernel_parts
from .problem import D_M, D_N

TILE = 16
_UT = np.uint32(TILE)


@functools.cache
def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)

    @jit
    def gemm_tiled16_kernel(a, b, c, aux, dims):
        # sa[i, p] = op(A)[row0 + i, k0 + p]; sb[p, j] = op(B)[k0 + p, col0 + j].
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        sa = cuda.shared.array((TILE, TILE), float32)
        sb = cuda.shared.array((TILE, TILE), float32)
        k_begin, k = k_range(dims)
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        row0 = uint32(cuda.blockIdx.y * _UT)
        col0 = uint32(cuda.blockIdx.x * _UT)
        # Each load has tx running along the operand's contiguous axis (coalesced); where that is the outer
        # axis (M of A, N of B) the tile is written transposed. The outer index of a thread is fixed.
        if a_contig_k:
            ao = a_outer(dims, uint32(row0 + ty))
        else:
            ao = a_outer(dims, uint32(row0 + tx))
        if b_contig_k:
            bo = b_outer(dims, uint32(col0 + ty))
        else:
            bo = b_outer(dims, uint32(col0 + tx))
        acc = float32(0.0)
        k0 = k_begin
        while k0 < k:
            if a_contig_k:
                sa[ty, tx] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + tx)))
            else:
                sa[tx, ty] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + ty)))
            if b_contig_k:
                sb[tx, ty] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + tx)))
            else:
                sb[ty, tx] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + ty)))
            cuda.syncthreads()
            for p in range(TILE):
                acc += sa[ty, p] * sb[p, tx]
            cuda.syncthreads()
            k0 = uint32(k0 + _UT)
        row = uint32(row0 + ty)
        col = uint32(col0 + tx)
        if row < dims[D_M] and col < dims[D_N]:
            finish(c, aux, dims, out_row(dims, row), col, acc)

    return gemm_tiled16_kernel


def config(op, block, m, n, kernel):
    if isinstance(block, (int, np.integer)) or tuple(int(x) for x in block) != (TILE, TILE):
        raise ValueError(f"{op}: block must be ({TILE}, {TILE}), got {block}")
    device.check_block(op, TILE * TILE, kernel)
    return (cdiv(n, TILE), cdiv(m, TILE)), (TILE, TILE)

