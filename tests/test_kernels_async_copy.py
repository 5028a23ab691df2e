"""Asynchronous global -> shared copies (gpunn.kernels.async_copy): a tile of a strided matrix gathered element by
element into shared memory with zero fill outside it, two groups in flight, read back after the wait and a barrier
(under the simulator the copies land at once; on a GPU, -m gpu, the real cp.async)."""

import numpy as np
from numba import cuda, float32, uint32

from gpunn.kernels.async_copy import cp_async4, cp_async16, cp_async_commit, cp_async_wait, shared_address

TILE = 64  # elements a block stages: 2 groups of 32


@cuda.jit
def _stage(src, cols, rows_in, out):
    """Thread t copies element (t // 8, t % 8) of two 4 x 8 tiles of src (cols wide, rows_in rows), zero beyond."""
    buf = cuda.shared.array(TILE, float32)
    t = uint32(cuda.threadIdx.x)
    for group in range(2):
        r = uint32(4 * group) + t // uint32(8)
        c = t % uint32(8)
        cp_async4(buf, uint32(32 * group) + t, src, r * uint32(cols) + c, r < uint32(rows_in))
        cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    for i in range(2):
        out[32 * i + t] = buf[32 * i + t]


def test_copies_land_with_zero_fill():
    rows, cols = 6, 8  # the second group's last two rows lie outside: zero
    src = np.random.default_rng(0).standard_normal(rows * cols).astype(np.float32)
    out = cuda.to_device(np.full(TILE, np.nan, np.float32))
    _stage[1, 32](cuda.to_device(src), cols, rows, out)
    expected = np.zeros(TILE, np.float32)
    expected[: rows * cols] = src
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@cuda.jit
def _stage16(src, chunks_in, out):
    """Thread t copies 16-byte chunk t of src (chunks_in of them, zero beyond) into a dynamic shared buffer, at the
    buffer's first 16-byte aligned word."""
    buf = cuda.shared.array(0, float32)
    t = uint32(cuda.threadIdx.x)
    first = ((uint32(16) - (shared_address(buf) & uint32(15))) & uint32(15)) >> uint32(2)
    cp_async16(buf, first + uint32(4) * t, src, uint32(4) * t if t < chunks_in else uint32(0), t < chunks_in)
    cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    for e in range(4):
        out[4 * t + e] = buf[first + uint32(4) * t + uint32(e)]


def test_16_byte_copies_land_with_zero_fill():
    src = np.random.default_rng(1).standard_normal(4 * 5).astype(np.float32)
    out = cuda.to_device(np.full(4 * 8, np.nan, np.float32))
    _stage16[1, 8, 0, 4 * 4 * 8 + 16](cuda.to_device(src), 5, out)  # dynamic shared memory, 16 bytes of slack
    expected = np.zeros(4 * 8, np.float32)
    expected[: src.size] = src
    np.testing.assert_array_equal(out.copy_to_host(), expected)
