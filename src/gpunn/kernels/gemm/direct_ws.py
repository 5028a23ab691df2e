"""GEMM versions ``ws_tf32`` and ``ws_bf16`` (Hopper, sm_90a): warp-specialized wgmma, C = A B^T of K-major operands
only, read as direct_* reads them (A (M, K), B (N, K), C-contiguous, 16-byte aligned, flat; float32 read as TF32
by truncation, uint16 BF16 bits, K even), through ``dense.gemm_ws``.

A block of 384 threads computes a BM x ``bn`` tile (128 x 256 by default; 128 x 128 as an experiment): warpgroups
0 and 1 consume, each the wgmma m64n``bn`` of its 64 rows of A (``bn`` / 2 float32 accumulators a thread);
warpgroup 2 produces, its 128 threads issuing every ``cp_async16`` (4-byte copies with zero fill at tails, as
direct's) of a K step into one stage of a ring of ``stages`` in dynamic shared memory (the 128-byte swizzle,
``wgmma.LAYOUTS``; a stage: A's 128 rows, then B's ``bn`` rows, 128 bytes each: 32 TF32 or 64 BF16 of K). No block
barrier in the K loop: two mbarriers a stage (``gpunn.kernels.mbarrier``), after the stages,

* full[i]: 128 arrivals, one ``cp.async.mbarrier.arrive.noinc`` a producer thread after its copies of the stage;
* empty[i]: 8 arrivals, lane 0 of each consumer warp once its warpgroup's MMAs reading the stage are done.

The producer waits empty[i] (parity phase ^ 1: the first round passes), copies, arrives on full[i]. A consumer
waits full[i] (parity phase), fences the async proxy, issues the stage's 4 MMAs, commits, waits for all but them
(the step before's are done) and releases the stage before. ``regs`` = (producer, consumer) registers a thread set
by ``setmaxnreg`` (None: none, every thread under MAX_REGISTERS). Measurements and design: NOTES-tensor.md."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32

from ..async_copy import cp_async_commit, cp_async_wait, shared_address
from ..common import cdiv, check_fixed_block
from ..jit import jit
from ..mbarrier import (
    cp_async_mbar_arrive,
    fence_mbarrier_init,
    mbar_arrive,
    mbar_init,
    mbar_wait,
    setmaxnreg_dec,
    setmaxnreg_inc,
)
from ..wgmma import (
    LAYOUTS,
    fence_proxy_async,
    wgmma256_bf16_sw128,
    wgmma256_tf32,
    wgmma256_wait,
    wgmma256_wait1,
    wgmma_bf16_sw128,
    wgmma_commit,
    wgmma_fence,
    wgmma_tf32,
    wgmma_wait,
    wgmma_wait1,
)
from . import direct
from .mappings import U0, U1, U2, kernel_parts
from .problem import D_K, D_M, D_N
from .warpgroup import DEVICES, TILE_ALIGN, store_fn

__all__ = ["A_MAP", "B_MAP", "BM", "BN", "DEVICES", "DTYPES", "REGS", "STAGES", "THREADS", "config", "kernel",
           "shared_bytes"]

BM = 128  # rows of A a block: 2 consumer warpgroups of 64
BN = 256  # the default tile's columns (each consumer an m64n256 MMA); 128 also builds
STAGES = 4  # 4 x 48 KB + 1 KB of alignment slack + the barriers: 193 KB of the 227 KB a block may have
THREADS = 384  # consumer warpgroups 0 and 1, producer warpgroup 2
PRODUCER = 256  # the producer's first thread
ROW_BYTES = 128  # a tile row: 32 TF32 or 64 BF16 of K (the 128-byte swizzle's period)
ALIGN = 1024  # the swizzle's period: every tile starts at a multiple of it
MAX_REGISTERS = 168  # 65536 / 384, down to a multiple of 8: one block an SM
REGS = (40, 232)  # setmaxnreg: producer, consumers (128 x 40 + 256 x 232 = 64512 of 65536)
CONSUMER_WARPS = 8  # empty[i]'s arrivals a phase
A_MAP, B_MAP = "dense_flat", "dense_t_flat"
DTYPES = {"tf32": np.float32, "bf16": np.uint16}  # the operands' element type
LAYOUT = {"tf32": "tf32", "bf16": "bf16_sw128"}
assert LAYOUTS["tf32"][0] == LAYOUTS["bf16_sw128"][0] == ROW_BYTES
_U7 = np.uint32(7)
_U16 = np.uint32(16)
_U64 = np.uint32(64)


def stage_words(bn: int = BN) -> int:
    """4-byte words of one stage: A's 128 rows and B's ``bn``, 128 bytes each."""
    return (BM + bn) * ROW_BYTES // 4


def shared_bytes(stages: int = STAGES, bn: int = BN) -> int:
    """Dynamic shared memory of a block: the stages, the alignment's slack, two 8-byte barriers a stage."""
    return stages * stage_words(bn) * 4 + ALIGN + 16 * stages


def check_ring(family, fmt, stages, bn) -> None:
    """ValueError naming `family` (ws, tma) unless `fmt`, the `stages` and the tile width `bn` build a ring."""
    if fmt not in DTYPES:
        raise ValueError(f"{family} GEMM: unknown format {fmt!r}; choose from {sorted(DTYPES)}")
    if bn not in (128, 256):
        raise ValueError(f"{family} GEMM: bn must be 128 or 256, got {bn}")
    if int(stages) < 2 or shared_bytes(int(stages), bn) > 227 * 1024:
        raise ValueError(f"{family} GEMM: 2 stages or more, within 227 KB of shared memory (bn {bn}: at most "
                         f"{(227 * 1024 - ALIGN) // (stage_words(bn) * 4 + 16)}), got {stages}")


def kernel(fmt, stages=STAGES, bn=BN, regs=REGS):
    """The kernel factory of one format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel``."""
    check_ring("ws", fmt, stages, bn)
    return functools.partial(_kernel, fmt, int(stages), int(bn), None if regs is None else tuple(regs))


def config_fn(bn: int = BN):
    """``config(op, block, m, n, kernel) -> (grid, block)`` of the BM x ``bn`` tile."""
    def config(op, block, m, n, kernel):
        check_fixed_block(op, block, THREADS, kernel)
        return (cdiv(n, bn), cdiv(m, BM)), THREADS
    return config


config = config_fn(BN)


def issue_fn(fmt, rows):
    """``issue(x, xrows, kdim, k0, o0, smem, tile, p)``: producer thread p's cp.async copies of one operand's K step
    at k0 (tile rows o0 .. o0 + rows) into the swizzled tile at word ``tile``; zeros outside the operand (direct's
    copy code, spread over the producer warpgroup)."""
    producers = THREADS - PRODUCER
    chunks = rows * ROW_BYTES // 16 // producers  # a producer thread's chunks per K step
    assert chunks * producers * 16 == rows * ROW_BYTES
    return direct.issue_fn(fmt, chunks, producers)


class Ring(NamedTuple):
    """What a ws_* or tma_* kernel closes over (ring_constants), in the order its builders unpack it."""

    store_tile: object     # the consumers' epilogue and store (store_fn)
    mma: object            # the m64n<bn> MMA of the format
    wait_all: object       # wgmma.wait_group 0 of that accumulator
    wait_but_last: object  # wgmma.wait_group 1
    acc_n: int             # accumulators a consumer thread
    bk: np.uint32          # K a step: 32 TF32, 64 BF16
    slices: int            # MMAs a K step and warpgroup (each 32 bytes of every row)
    slice_bytes: np.uint32
    words: np.uint32       # 4-byte words of a stage
    b_tile: np.uint32      # B's tile after A's
    full0: np.uint32       # the barriers after the stages: full[i], then empty[i]
    empty0: np.uint32
    wg_bytes: np.uint32    # a consumer warpgroup's rows of A
    last: np.uint32        # the last stage
    mask: np.uint32        # the swizzle's alignment
    producer: np.uint32    # the producer's first thread
    low: int               # setmaxnreg of the producer, the consumers (valid literals where unused)
    high: int
    realloc: bool          # whether the kernel reallocates registers


def ring_constants(family, fmt, stages, bn, regs, a_map, b_map, store, ksize, epilogue, split_k) -> Ring:
    """The closure constants of a `family` (ws, tma) kernel for dense K-major operands (ValueError otherwise)."""
    if (a_map, b_map) != (A_MAP, B_MAP):
        raise ValueError(f"{family} GEMM: K-major flat operands only (A {A_MAP!r}, B {B_MAP!r}), got {a_map!r}, "
                         f"{b_map!r}")
    if split_k:
        raise ValueError(f"{family} GEMM: no split-K")
    (*_, out_row, finish) = kernel_parts("dense", "dense", store, ksize, epilogue)
    mma = {("tf32", 128): wgmma_tf32, ("bf16", 128): wgmma_bf16_sw128, ("tf32", 256): wgmma256_tf32,
           ("bf16", 256): wgmma256_bf16_sw128}[fmt, bn]
    waits = (wgmma_wait, wgmma_wait1) if bn == 128 else (wgmma256_wait, wgmma256_wait1)
    bk = np.uint32(ROW_BYTES // np.dtype(DTYPES[fmt]).itemsize)
    slices = ROW_BYTES // 32
    assert slices * LAYOUTS[LAYOUT[fmt]][4] == int(bk)
    low, high = regs or (24, 24)
    return Ring(store_fn(out_row, finish, bn), mma, *waits, bn // 2, bk, slices, np.uint32(32),
                np.uint32(stage_words(bn)), np.uint32(BM * ROW_BYTES // 4), np.uint32(stages * stage_words(bn)),
                np.uint32(stages * stage_words(bn) + 2 * stages), np.uint32(64 * ROW_BYTES), np.uint32(stages - 1),
                np.uint32(ALIGN - 1), np.uint32(PRODUCER), low, high, regs is not None)


@functools.cache
def _kernel(fmt, stages, bn, regs, a_map, b_map, store, ksize, epilogue, split_k=False):
    (store_tile, mma, wait_all, wait_but_last, acc_n, bk, slices, slice_bytes, words, b_tile, full0, empty0, wg_bytes,
     last, mask, producer, low, high, realloc) = ring_constants("ws", fmt, stages, bn, regs, a_map, b_map, store,
                                                                 ksize, epilogue, split_k)
    issue_a, issue_b = issue_fn(fmt, BM), issue_fn(fmt, bn)
    n_stages = stages

    @jit(max_registers=MAX_REGISTERS)
    def gemm_ws_kernel(a, b, c, aux, dims):
        smem = cuda.shared.array(0, uint32, alignment=TILE_ALIGN)
        m = dims[D_M]
        n = dims[D_N]
        kdim = dims[D_K]
        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * np.uint32(BM))
        n0 = uint32(cuda.blockIdx.x * np.uint32(bn))
        base = uint32((uint32(ALIGN) - (shared_address(smem) & mask)) & mask) >> U2  # the first aligned word
        steps = uint32((kdim + bk - U1) // bk)
        if t == U0:
            for i in range(n_stages):
                mbar_init(smem, uint32(base + full0 + uint32(2 * i)), uint32(THREADS - PRODUCER))
                mbar_init(smem, uint32(base + empty0 + uint32(2 * i)), uint32(CONSUMER_WARPS))
            fence_mbarrier_init()
        cuda.syncthreads()  # the barriers are initialised for all; the last block barrier

        stage = U0
        phase = U0
        s = U0
        if t >= producer:
            if realloc:
                setmaxnreg_dec(low)
            p = uint32(t - producer)
            while s < steps:
                mbar_wait(smem, uint32(base + empty0 + (stage << U1)), uint32(phase ^ U1))  # its last reader is done
                at = uint32(base + stage * words)
                k0 = uint32(s * bk)
                issue_a(a, m, kdim, k0, m0, smem, at, p)
                issue_b(b, n, kdim, k0, n0, smem, uint32(at + b_tile), p)
                cp_async_mbar_arrive(smem, uint32(base + full0 + (stage << U1)))  # when this thread's copies land
                if stage == last:
                    stage = U0
                    phase = uint32(phase ^ U1)
                else:
                    stage = uint32(stage + U1)
                s = uint32(s + U1)
            cp_async_commit()
            cp_async_wait(0)  # nothing in flight when the thread exits
        else:
            if realloc:
                setmaxnreg_inc(high)
            acc = cuda.local.array(acc_n, float32)
            for i in range(acc_n):
                acc[i] = float32(0.0)
            a_row = uint32((t >> _U7) * wg_bytes)  # this warpgroup's rows of A
            lane0 = (t & np.uint32(31)) == U0
            before = U0  # the stage of step s - 1
            while s < steps:
                mbar_wait(smem, uint32(base + full0 + (stage << U1)), phase)  # step s's copies have landed
                fence_proxy_async()  # ... and are visible to the MMAs (the async proxy)
                wgmma_fence()
                a_byte = uint32(((base + stage * words) << U2) + a_row)
                b_byte = uint32((base + stage * words + b_tile) << U2)
                for sl in range(slices):
                    mma(acc, smem, uint32(a_byte + uint32(sl) * slice_bytes), smem,
                        uint32(b_byte + uint32(sl) * slice_bytes))
                wgmma_commit()
                wait_but_last(acc)  # the MMAs of step s - 1 are done (this warpgroup's)
                if s > U0 and lane0:
                    mbar_arrive(smem, uint32(base + empty0 + (before << U1)))  # its stage may be refilled
                before = stage
                if stage == last:
                    stage = U0
                    phase = uint32(phase ^ U1)
                else:
                    stage = uint32(stage + U1)
                s = uint32(s + U1)
            wait_all(acc)
            store_tile(c, aux, dims, acc, m0, n0, t)

    return gemm_ws_kernel
