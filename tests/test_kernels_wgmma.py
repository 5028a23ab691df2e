"""Hopper's warpgroup MMA (gpunn.kernels.wgmma): the swizzle against the PTX ISA's definition written out chunk by
chunk, and one warpgroup multiplying tiles the host laid out (under the simulator: the emulation; on an H100/H200:
the hardware, so the tile layout, the descriptors and the accumulator fragments are checked against float64)."""

import numpy as np
import pytest
from numba import cuda, float32

from gpunn.device import simulator_enabled
from gpunn.kernels import mma as M
from gpunn.kernels import wgmma as W

W_ALIGN = None if simulator_enabled() else 1024  # the swizzle's period (the simulator takes no alignment)
ACC = W.ACC  # a local array's size: a plain module constant


def _rng(*key):
    return np.random.default_rng([ord(c) for c in "".join(map(str, key))])


@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_swizzle_is_the_descriptors(fmt):
    """128-byte swizzle: 16-byte chunk c of row r (rows of 128 B) sits at chunk c ^ (r % 8); 64-byte swizzle: chunk c
    of row r (rows of 64 B) at c ^ ((r // 2) % 4); bytes inside a chunk stay."""
    row_bytes = W.LAYOUTS[fmt][0]
    for r in range(16):
        for byte in range(row_bytes):
            chunk, inside = divmod(byte, 16)
            moved = chunk ^ (r % 8 if fmt == "tf32" else (r // 2) % 4)
            assert W.swizzle(fmt, r * row_bytes + byte) == r * row_bytes + 16 * moved + inside


def _layout(fmt, x):
    """rows x 32 K of float32 -> the swizzled K-major tile's words (float32 TF32 or uint32 BF16 pairs)."""
    rows = x.shape[0]
    if fmt == "tf32":
        words = M.round_tf32(x).reshape(-1)
    else:
        bits = M._bf16_bits(x).astype(np.uint32).reshape(rows, 16, 2)
        words = (bits[..., 0] | (bits[..., 1] << np.uint32(16))).reshape(-1)
    tile = np.zeros_like(words)
    for i in range(words.size):
        tile[W.swizzle(fmt, 4 * i) // 4] = words[i]
    return tile


def _warpgroup_kernel(fmt):
    mma = W.wgmma_tf32 if fmt == "tf32" else W.wgmma_bf16
    word = float32 if fmt == "tf32" else np.uint32
    words = W.LAYOUTS[fmt][0] // 4 * 128  # B's tile: 128 rows; A's 64 rows use the first half
    slices = 32 // W.LAYOUTS[fmt][4]

    @cuda.jit
    def kernel(a_tile, b_tile, out):
        As = cuda.shared.array(words, word, alignment=W_ALIGN)
        Bs = cuda.shared.array(words, word, alignment=W_ALIGN)
        acc = cuda.local.array(ACC, float32)
        t = cuda.threadIdx.x
        for i in range(t, words, 128):
            As[i] = a_tile[i] if i < a_tile.size else word(0)
            Bs[i] = b_tile[i]
        for i in range(ACC):
            acc[i] = float32(0.0)
        W.fence_proxy_async()
        cuda.syncthreads()
        W.wgmma_fence()
        for s in range(slices):
            mma(acc, As, np.uint32(32 * s), Bs, np.uint32(32 * s))
        W.wgmma_commit()
        W.wgmma_wait(acc)
        for i in range(ACC):
            out[t, i] = acc[i]

    return kernel


@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_one_warpgroup_multiplies_host_laid_tiles(fmt):
    if not simulator_enabled() and tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")
    rng = _rng("warpgroup", fmt)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((128, 32)).astype(np.float32)
    round_ = M.round_tf32 if fmt == "tf32" else M.round_bf16
    ref = round_(a).astype(np.float64) @ round_(b).astype(np.float64).T
    out = cuda.to_device(np.full((128, W.ACC), np.nan, np.float32))
    _warpgroup_kernel(fmt)[1, 128](cuda.to_device(_layout(fmt, a)), cuda.to_device(_layout(fmt, b)), out)
    got = np.full((64, 128), np.nan)
    t = np.arange(128)[:, None]
    i = np.arange(W.ACC)[None, :]
    rows = 16 * (t // 32) + t % 32 // 4 + 8 * (i % 4 // 2)
    cols = 8 * (i // 4) + 2 * (t % 4) + i % 2
    got[rows, cols] = out.copy_to_host()
    assert np.isfinite(got).all()
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-6
