"""The float64 RBF kernel matrix of E6's SVM, exp(-gamma |a_i - b_j|^2): on the CPU through NumPy's BLAS
(rbf_kernel_into) or on the GPU through our float64 RBF GEMM (rbf_kernel_gpu_into, gpunn.kernels.gemm.rbf), in
row blocks sized to the memory, streamed into one host matrix; a symmetric matrix computes its lower half once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from gpunn.errors import GpunnError


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


# GPU row blocks: at most this much float64 output per block (device buffer and host staging copy alike;
# 2 GiB is 5 300 rows of a 50 000-wide kernel) and this share of the free device memory.
_GPU_BLOCK_BYTES = 2 << 30
_GPU_MEMORY_FRACTION = 0.8


def _mirror_diagonal_block(out: np.ndarray, start: int, stop: int) -> None:
    """Symmetric kernel: rows [start, stop) hold columns [start, n); fill the columns' mirror below them
    (rows [stop, n) of columns [start, stop)) and make the diagonal block exactly symmetric, with 1 on the
    diagonal (the distance of a row to itself is 0; the expanded formula leaves rounding there)."""
    out[stop:, start:stop] = out[start:stop, stop:].T
    diag = out[start:stop, start:stop]
    lower = np.tril_indices(stop - start, -1)
    diag[lower] = diag.T[lower]  # the GEMM block itself is symmetric only up to rounding
    np.fill_diagonal(diag, 1.0)


class _Progress:
    """A progress line (row blocks done / total) at most every `every_s` seconds, none after the last block."""

    def __init__(self, log, what: str, blocks: int, rows: int, every_s: float):
        self.log, self.what, self.blocks, self.rows, self.every_s = log, what, blocks, rows, every_s
        self.t0 = self.last = time.perf_counter()

    def done(self, block: int, rows_done: int) -> None:
        now = time.perf_counter()
        if self.log is not None and now - self.last >= self.every_s and block < self.blocks:
            self.log(f"svm: {self.what}: row block {block}/{self.blocks} ({rows_done} of {self.rows} rows) "
                     f"after {now - self.t0:.0f} s")
            self.last = now


def rbf_kernel_into(out: np.ndarray, a: np.ndarray, b: np.ndarray | None, gamma: float,
                    block: int = 2048, log: Callable[[str], None] | None = None, what: str = "kernel",
                    progress_every_s: float = 15.0) -> np.ndarray:
    """exp(-gamma * ||a_i - b_j||^2) into the float64 array `out` (len(a) x len(b)), row block by row block,
    with float64 BLAS products: the same kernel libsvm evaluates, at GEMM speed. ``b=None`` means b = a: only
    the blocks on and above the diagonal are computed, the rest is mirrored (half the arithmetic). A progress
    line goes to `log` every `progress_every_s` seconds."""
    symmetric = b is None
    b64 = np.asarray(a if symmetric else b, dtype=np.float64)
    b_sq = np.einsum("ij,ij->i", b64, b64)
    progress = _Progress(log, f"{what} on the cpu", math.ceil(a.shape[0] / block), a.shape[0], progress_every_s)
    for done, start in enumerate(range(0, a.shape[0], block), 1):
        stop = min(start + block, a.shape[0])
        first = start if symmetric else 0
        a64 = b64[start:stop] if symmetric else np.asarray(a[start:stop], dtype=np.float64)
        a_sq = b_sq[start:stop] if symmetric else np.einsum("ij,ij->i", a64, a64)
        rows = out[start:stop, first:]
        np.matmul(a64, b64[first:].T, out=rows)
        rows *= -2.0
        rows += a_sq[:, None]
        rows += b_sq[None, first:]
        np.maximum(rows, 0.0, out=rows)  # rounding can make a distance slightly negative
        rows *= -gamma
        np.exp(rows, out=rows)
        if symmetric:
            _mirror_diagonal_block(out, start, stop)
        progress.done(done, stop)
    return out


def gpu_block_rows(n_cols: int, free_bytes: float, max_block_bytes: int = _GPU_BLOCK_BYTES) -> int:
    """Rows of one GPU row block of a kernel with `n_cols` columns: at most `max_block_bytes` of float64
    output (the device buffer and the host staging copy are that size) and `_GPU_MEMORY_FRACTION` of the
    free device memory, a multiple of the GEMM's 64-row tile when larger than one tile."""
    from gpunn.kernels.gemm.rbf import R_BM

    budget = max_block_bytes  # the simulator reports infinite free memory
    if math.isfinite(free_bytes):
        budget = min(max_block_bytes, _GPU_MEMORY_FRACTION * free_bytes)
    rows = int(budget // (8 * n_cols))
    if rows < 1:
        raise GpunnError(f"svm: the GPU has {gb(free_bytes)} free, not enough for one {n_cols}-wide float64 "
                         "kernel row; use a smaller train_subset or kernel_device cpu")
    return rows // R_BM * R_BM if rows > R_BM else rows


def rbf_kernel_gpu_into(out: np.ndarray, a: np.ndarray, b: np.ndarray | None, gamma: float,
                        block_rows: int | None = None, version: str | None = None,
                        log: Callable[[str], None] | None = None, what: str = "kernel",
                        progress_every_s: float = 15.0) -> np.ndarray:
    """``rbf_kernel_into`` on the GPU: the same float64 kernel (gpunn.kernels.gemm.rbf, equal to it and to
    scikit-learn's rbf_kernel up to float64 rounding), into the host float64 array `out`.

    The operands are uploaded once as float64 with their squared norms computed on the device; the output
    is computed in row blocks of `block_rows` rows (default ``gpu_block_rows``: sized from the free GPU
    memory, at most ``_GPU_BLOCK_BYTES``), each copied into `out` before the next. ``b=None`` (b = a): row
    block [s, e) computes only columns [s, n), the rest is mirrored on the host, as ``rbf_kernel_into`` does.
    A progress line (blocks done / total) goes to `log` every `progress_every_s` seconds."""
    from numba import cuda

    from gpunn.kernels.gemm import rbf

    symmetric = b is None
    m, n = a.shape[0], (a if symmetric else b).shape[0]
    if out.shape != (m, n) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"rbf_kernel_gpu_into: out must be a C-contiguous float64 ({m}, {n}) array")
    n_features = a.shape[1]
    need = 8 * n_features * (n + (0 if symmetric else m)) + 8 * (m + n)
    free = float(cuda.current_context().get_memory_info()[0])
    if need + 8 * n > _GPU_MEMORY_FRACTION * free:
        raise GpunnError(f"svm: the float64 features of the {what} take {gb(need)} of GPU memory, "
                         f"{gb(free)} free; use a smaller train_subset or kernel_device cpu")
    d_b = cuda.to_device(np.ascontiguousarray(a if symmetric else b, dtype=np.float64))
    d_a = d_b if symmetric else cuda.to_device(np.ascontiguousarray(a, dtype=np.float64))
    b_sq = cuda.device_array(n, dtype=np.float64)
    rbf.row_sq_norms(d_b, b_sq)
    a_sq = b_sq
    if not symmetric:
        a_sq = cuda.device_array(m, dtype=np.float64)
        rbf.row_sq_norms(d_a, a_sq)
    if block_rows is None:
        block_rows = gpu_block_rows(n, float(cuda.current_context().get_memory_info()[0]))
    rows = max(1, min(int(block_rows), m))
    buffer = cuda.device_array(rows * n, dtype=np.float64)
    staging = np.empty(rows * n, dtype=np.float64) if symmetric else None
    starts = range(0, m, rows)
    progress = _Progress(log, f"{what} on the gpu", len(starts), m, progress_every_s)
    for done, start in enumerate(starts, 1):
        stop = min(start + rows, m)
        first = start if symmetric else 0
        shape = (stop - start, n - first)
        block = buffer[:shape[0] * shape[1]].reshape(shape)
        rbf.rbf_gemm(d_a[start:stop], d_b[first:], block, a_sq[start:stop], b_sq[first:], gamma,
                     version=version or rbf.DEFAULT_VERSION)
        if symmetric:  # out[start:stop, start:] is not contiguous: through a contiguous staging copy
            host = staging[:shape[0] * shape[1]].reshape(shape)
            block.copy_to_host(host)
            out[start:stop, first:] = host
            _mirror_diagonal_block(out, start, stop)
        else:
            block.copy_to_host(out[start:stop])
        progress.done(done, stop)
    return out
