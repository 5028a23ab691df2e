"""Rows moved between 2-D device arrays by index lists: ``dst[dst_idx[i], :] = src[src_idx[i], :]``.

gpu-smo's kernel-row cache (gpunn.smo_rows) gathers the feature rows of the training points whose kernel rows it
must compute, and scatters the computed rows into the cache slots they take. One version: a block of ROW_THREADS
a row, a grid-stride loop over its columns (coalesced reads and writes along the row). ``copy_rows_reference``
is the NumPy statement it carries out.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .jit import jit
from .launch import MAX_GRID, bind, check_array

__all__ = ["copy_rows", "copy_rows_reference"]

ROW_THREADS = 256


@jit
def _copy_rows_kernel(src, src_idx, dst, dst_idx):
    for i in range(cuda.blockIdx.x, src_idx.shape[0], cuda.gridDim.x):
        a, b = src_idx[i], dst_idx[i]
        for j in range(cuda.threadIdx.x, src.shape[1], cuda.blockDim.x):
            dst[b, j] = src[a, j]


def copy_rows(src, src_idx, dst, dst_idx, stream=0, launch=True):
    """dst[dst_idx[i]] = src[src_idx[i]] for every i (int32 index lists of one length; src and dst of one width and
    dtype; the dst rows must be distinct)."""
    op = "copy_rows"
    check_array(op, "src", src, 2, src.dtype)
    check_array(op, "dst", dst, 2, src.dtype)
    check_array(op, "src_idx", src_idx, 1, np.int32)
    check_array(op, "dst_idx", dst_idx, 1, np.int32)
    if src.shape[1] != dst.shape[1] or src_idx.shape[0] != dst_idx.shape[0]:
        raise ValueError(f"{op}: src {tuple(src.shape)} and dst {tuple(dst.shape)} need one width, src_idx "
                         f"({src_idx.shape[0]}) and dst_idx ({dst_idx.shape[0]}) one length")
    grid = max(1, min(src_idx.shape[0], MAX_GRID))
    return bind(_copy_rows_kernel, grid, ROW_THREADS, (src, src_idx, dst, dst_idx), stream, launch, op)


def copy_rows_reference(src, src_idx, dst, dst_idx) -> np.ndarray:
    """A copy of host array dst with rows dst_idx set to src's rows src_idx."""
    out = np.array(dst)
    out[np.asarray(dst_idx)] = np.asarray(src)[np.asarray(src_idx)]
    return out
