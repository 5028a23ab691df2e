"""Asynchronous global -> shared copies (gpunn.kernels.async_copy): a tile of a strided matrix gathered element by
element into shared memory with zero fill outside it, two groups in flight, read back after the wait and a barrier
(under the simulator the copies land when a wait retires their group; on a GPU the real cp.async)."""

import numpy as np
from numba import cuda, float32, uint32

from gpunn.device import simulator_enabled
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


@cuda.jit
def _pairs(src, pairs_in, out):
    """Thread t copies BF16 pair t of a uint16 source (4 bytes: elements 2t, 2t + 1), zero beyond pairs_in."""
    buf = cuda.shared.array(16, uint32)
    t = uint32(cuda.threadIdx.x)
    cp_async4(buf, t, src, uint32(2) * t if t < pairs_in else uint32(0), t < pairs_in)
    cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    out[t] = buf[t]


def test_two_byte_sources_copy_pairs():
    src = np.arange(1, 11, dtype=np.uint16) * np.uint16(257)
    out = cuda.to_device(np.full(16, 7, np.uint32))
    _pairs[1, 16](cuda.to_device(src), 5, out)
    expected = np.zeros(16, np.uint32)
    expected[:5] = src.view(np.uint32)  # little-endian: element 2t in the low half
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@cuda.jit
def _groups(src, out):
    """Two groups of one copy each; what the thread reads after waiting for all but 1, then for all."""
    buf = cuda.shared.array(8, float32)
    t = uint32(cuda.threadIdx.x)
    buf[t] = float32(-1.0)
    buf[t + uint32(4)] = float32(-1.0)
    cp_async4(buf, t, src, t, True)
    cp_async_commit()
    cp_async4(buf, t + uint32(4), src, t + uint32(4), True)
    cp_async_commit()
    cp_async_wait(1)
    out[0, t] = buf[t]
    out[2, t] = buf[t + uint32(4)]  # may not have landed (under the simulator: has not)
    cp_async_wait(0)
    out[1, t] = buf[t + uint32(4)]


def test_a_wait_retires_the_oldest_groups():
    """The first group has landed after cp_async_wait(1), the second after cp_async_wait(0) (under the simulator
    a copy lands exactly when its group is retired: a kernel reading too early sees the old contents there)."""
    src = np.arange(8, dtype=np.float32)
    out = cuda.to_device(np.full((3, 4), np.nan, np.float32))
    _groups[1, 4](cuda.to_device(src), out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:2], src.reshape(2, 4))
    if simulator_enabled():
        np.testing.assert_array_equal(got[2], -1.0)
