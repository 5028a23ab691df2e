"""GEMM version ``naive``: one thread per output element on a 2-D grid; the block (bx, by) is a parameter, x
along the columns of C so that a warp writes C (and reads B) contiguously."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv
from ..jit import jit
from .mappings import U1, k_range_fn, kernel_parts
from .problem import D_M, D_N


@functools.cache
def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    _, a_outer, a_inner, a_get, _, b_outer, b_inner, b_get, out_row, finish = kernel_parts(
        a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)

    @jit
    def gemm_naive_kernel(a, b, c, aux, dims):
        # x runs along the columns of C so that a warp writes C (and reads B) contiguously.
        col = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        row = uint32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
        k_begin, k = k_range(dims)
        if row < dims[D_M] and col < dims[D_N]:
            ao = a_outer(dims, row)
            bo = b_outer(dims, col)
            acc = float32(0.0)
            p = k_begin
            while p < k:
                acc += a_get(a, dims, ao, a_inner(dims, p)) * b_get(b, dims, bo, b_inner(dims, p))
                p = uint32(p + U1)
            finish(c, aux, dims, out_row(dims, row), col, acc)

    return gemm_naive_kernel


def config(op, block, m, n, kernel):
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0 for x in block)):
        raise ValueError(f"{op}: block must be (bx, by), two positive ints, got {block!r}")
    bx, by = int(block[0]), int(block[1])
    device.check_block(op, bx * by, kernel)
    return (cdiv(n, bx), cdiv(m, by)), (bx, by)

