"""GEMM versions ``tma_tf32`` and ``tma_bf16`` (Hopper, sm_90a): ws_* (gpunn.kernels.gemm.direct_ws) with TMA as the
producer, C = A B^T of K-major operands (A (M, K), B (N, K), C-contiguous, 16-byte aligned, rows a multiple of 16
bytes: K % 4 == 0 TF32, K % 8 == 0 BF16), through ``dense.gemm_tma``.

The kernel takes the operands' tensor maps (gpunn.kernels.tma.encode_2d: boxes of 128 bytes of K by BM rows of A,
``bn`` rows of B, the 128-byte swizzle, zero fill past M, N and K) in place of the operands. Of the producer
warpgroup (after ``setmaxnreg``) one thread issues, per K step: wait empty[i], ``mbar_arrive_expect_tx(full[i],
(BM + bn) x 128)``, one bulk tensor copy of A's box and one of B's into stage i (laid out as ws's: A's rows, then
B's, 1024-byte aligned); full[i] expects that one arrival and the bytes. The consumers are ws's (no proxy fence: the
copies are async-proxy writes). ``persistent``: a grid of fewer blocks than tiles, each block taking tiles
blockIdx.x, + gridDim.x, ... (the ring's stages and phases running on across its tiles, so the producer fills the
next tile's stages during the consumers' epilogue). Measurements and design: NOTES-tensor.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..async_copy import shared_address
from ..common import cdiv
from ..jit import jit
from ..mbarrier import (
    fence_mbarrier_init,
    mbar_arrive,
    mbar_arrive_expect_tx,
    mbar_init,
    mbar_wait,
    setmaxnreg_dec,
    setmaxnreg_inc,
)
from ..tma import prefetch_tensormap, tma_load_2d
from ..wgmma import wgmma_commit, wgmma_fence
from .direct_ws import (
    A_MAP,
    ALIGN,
    B_MAP,
    BM,
    BN,
    CONSUMER_WARPS,
    DTYPES,
    MAX_REGISTERS,
    REGS,
    ROW_BYTES,
    STAGES,
    THREADS,
    check_ring,
    config_fn,
    ring_constants,
    shared_bytes,
)
from .mappings import U0, U1, U2
from .problem import D_K, D_M, D_N
from .warpgroup import DEVICES, TILE_ALIGN

__all__ = ["A_MAP", "B_MAP", "BM", "BN", "DEVICES", "DTYPES", "REGS", "STAGES", "THREADS", "config", "kernel",
           "persistent_config", "shared_bytes", "stage_bytes"]

_U7 = np.uint32(7)
config = config_fn(BN)


def stage_bytes(bn: int = BN) -> int:
    """The bytes the copies of one stage complete: A's box and B's (the expect_tx count)."""
    return (BM + bn) * ROW_BYTES


def kernel(fmt, stages=STAGES, bn=BN, regs=REGS, expect=None, persistent=False):
    """The kernel factory of one format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel`` (its
    first two arguments the tensor maps of A and B). ``expect``: the expect_tx count (None: ``stage_bytes(bn)``;
    another: a test's mutation); ``persistent``: tiles looped over a grid of (blocks, 1) (``persistent_config``)."""
    check_ring("tma", fmt, stages, bn)
    return functools.partial(_kernel, fmt, int(stages), int(bn), None if regs is None else tuple(regs),
                             stage_bytes(bn) if expect is None else int(expect), bool(persistent))


def persistent_config(blocks: int, m: int, n: int, bn: int = BN):
    """(grid, block) of a persistent launch: at most ``blocks`` blocks, no more than the tiles."""
    return (max(1, min(int(blocks), cdiv(m, BM) * cdiv(n, bn))), 1), THREADS


@functools.cache
def _kernel(fmt, stages, bn, regs, expect, persistent, a_map, b_map, store, ksize, epilogue, split_k=False):
    (store_tile, mma, wait_all, wait_but_last, acc_n, bk, slices, slice_bytes, words, b_tile, full0, empty0, wg_bytes,
     last, mask, producer, low, high, realloc) = ring_constants("tma", fmt, stages, bn, regs, a_map, b_map, store,
                                                                 ksize, epilogue, split_k)
    tx = np.uint32(expect)  # the stage's bytes (a box's K is bk)
    n_stages = stages

    @jit(max_registers=MAX_REGISTERS)
    def gemm_tma_kernel(a, b, c, aux, dims):
        smem = cuda.shared.array(0, uint32, alignment=TILE_ALIGN)
        kdim = dims[D_K]
        t = uint32(cuda.threadIdx.x)
        tiles_n = uint32((dims[D_N] + np.uint32(bn - 1)) // np.uint32(bn))
        tiles = uint32(tiles_n * ((dims[D_M] + np.uint32(BM - 1)) // np.uint32(BM)))
        if persistent:
            first = uint32(cuda.blockIdx.x)
            stride = uint32(cuda.gridDim.x)
        else:
            first = uint32(cuda.blockIdx.y * tiles_n + cuda.blockIdx.x)
            stride = tiles
        base = uint32((uint32(ALIGN) - (shared_address(smem) & mask)) & mask) >> U2  # the first aligned word
        steps = uint32((kdim + bk - U1) // bk)
        if t == U0:
            for i in range(n_stages):
                mbar_init(smem, uint32(base + full0 + uint32(2 * i)), U1)  # the producer's expect_tx arrival
                mbar_init(smem, uint32(base + empty0 + uint32(2 * i)), uint32(CONSUMER_WARPS))
            fence_mbarrier_init()
        cuda.syncthreads()

        stage = U0
        phase = U0
        s = U0
        if t >= producer:
            if realloc:
                setmaxnreg_dec(low)
            if t == producer:
                prefetch_tensormap(a)
                prefetch_tensormap(b)
                tile = first
                while tile < tiles:
                    m0 = uint32(tile // tiles_n * np.uint32(BM))
                    n0 = uint32(tile % tiles_n * np.uint32(bn))
                    s = U0
                    while s < steps:
                        mbar_wait(smem, uint32(base + empty0 + (stage << U1)), uint32(phase ^ U1))
                        full = uint32(base + full0 + (stage << U1))
                        mbar_arrive_expect_tx(smem, full, tx)
                        at = uint32(base + stage * words)
                        k0 = uint32(s * bk)
                        tma_load_2d(smem, at, a, k0, m0, full)
                        tma_load_2d(smem, uint32(at + b_tile), b, k0, n0, full)
                        if stage == last:
                            stage = U0
                            phase = uint32(phase ^ U1)
                        else:
                            stage = uint32(stage + U1)
                        s = uint32(s + U1)
                    tile = uint32(tile + stride)
        else:
            if realloc:
                setmaxnreg_inc(high)
            acc = cuda.local.array(acc_n, float32)
            a_row = uint32((t >> _U7) * wg_bytes)
            lane0 = (t & np.uint32(31)) == U0
            before = U0
            tile = first
            while tile < tiles:
                m0 = uint32(tile // tiles_n * np.uint32(BM))
                n0 = uint32(tile % tiles_n * np.uint32(bn))
                for i in range(acc_n):
                    acc[i] = float32(0.0)
                s = U0
                while s < steps:
                    mbar_wait(smem, uint32(base + full0 + (stage << U1)), phase)  # step s's bytes have landed
                    wgmma_fence()
                    a_byte = uint32(((base + stage * words) << U2) + a_row)
                    b_byte = uint32((base + stage * words + b_tile) << U2)
                    for sl in range(slices):
                        mma(acc, smem, uint32(a_byte + uint32(sl) * slice_bytes), smem,
                            uint32(b_byte + uint32(sl) * slice_bytes))
                    wgmma_commit()
                    wait_but_last(acc)
                    if s > U0 and lane0:
                        mbar_arrive(smem, uint32(base + empty0 + (before << U1)))
                    before = stage
                    if stage == last:
                        stage = U0
                        phase = uint32(phase ^ U1)
                    else:
                        stage = uint32(stage + U1)
                    s = uint32(s + U1)
                wait_all(acc)
                if lane0:
                    mbar_arrive(smem, uint32(base + empty0 + (before << U1)))  # the tile's last stage: refillable
                store_tile(c, aux, dims, acc, m0, n0, t)
                tile = uint32(tile + stride)

    return gemm_tma_kernel
