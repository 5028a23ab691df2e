"""GEMM versions ``direct_tf32`` and ``direct_bf16`` (Hopper, sm_90a): ``wgmma`` (warpgroup's 128x128 block, 2
warpgroups of 64 x 128, float32 accumulation) fed straight by ``cp.async``, for C = A B^T with K-major operands
only: A (M, K) and B (N, K), C-contiguous and 16-byte aligned, read flat (``dense_flat`` A, ``dense_t_flat`` B;
``dense.gemm_direct`` checks and passes them). direct_tf32 multiplies float32 operands whose
raw bits the tensor core reads (TF32 by truncation: inputs format ``tf32_trunc``); direct_bf16 uint16 operands of
BF16 bits (K even: 4-byte copies).

A ring of ``stages`` stages of dynamic shared memory (``shared_bytes``) from a 1024-byte aligned base, each A's and
B's 128-row tile of one K step, 128 bytes a row (32 TF32 or 64 BF16 of K), in the K-major layout with the 128-byte
swizzle (``wgmma.LAYOUTS``: ``tf32``, ``bf16_sw128``). Every 16-byte chunk goes by ``cp_async16`` from global
memory to its swizzled place; 4-byte copies with zero fill at the M, N and K tails and where a row is not a
multiple of 16 bytes. Nothing passes through registers, nothing is converted. A K step s: wait for its copies,
fence, barrier, issue its MMAs, copy step s + stages - 2 into the stage of step s - 2 (the barrier follows every
warpgroup's wait for those MMAs), wait for the MMAs of step s - 1. No split-K. Measurements: NOTES-tensor.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..async_copy import cp_async4, cp_async16, cp_async_commit, cp_async_wait, shared_address
from ..jit import jit
from ..wgmma import (
    ACC,
    LAYOUTS,
    fence_proxy_async,
    wgmma_bf16_sw128,
    wgmma_commit,
    wgmma_fence,
    wgmma_tf32,
    wgmma_wait,
    wgmma_wait1,
)
from .mappings import U0, U1, U2, device_function, kernel_parts
from .problem import D_K, D_M, D_N
from .warpgroup import BM, BN, DEVICES, THREADS, TILE_ALIGN, config, store_fn

__all__ = ["A_MAP", "B_MAP", "DEVICES", "DTYPES", "STAGES", "config", "kernel", "shared_bytes"]

STAGES = 7  # 7 x 32 KB + 1 KB of alignment slack: 225 KB, under the 227 KB a block may have on an H100 / H200
ROW_BYTES = 128  # a tile row: 32 TF32 or 64 BF16 of K (the 128-byte swizzle's period)
TILE_WORDS = BM * ROW_BYTES // 4  # one operand's tile of one stage (B's has as many rows: BN == BM)
STAGE_WORDS = 2 * TILE_WORDS  # A's tile, then B's
ALIGN = 1024  # the swizzle's period: every tile starts at a multiple of it
CHUNKS = BM * ROW_BYTES // 16 // THREADS  # 16-byte chunks a thread copies per operand and K step
TWO_BLOCKS_SHARED = 113 * 1024  # dynamic shared memory under which two blocks fit an SM (228 KB, 1 KB each reserved)
A_MAP, B_MAP = "dense_flat", "dense_t_flat"
DTYPES = {"tf32": np.float32, "bf16": np.uint16}  # the operands' element type
LAYOUT = {"tf32": "tf32", "bf16": "bf16_sw128"}  # the wgmma tile layout of each format
assert BM == BN == 128 and THREADS == 256 and CHUNKS == 4 and LAYOUTS["bf16_sw128"][0] == ROW_BYTES
_U3 = np.uint32(3)
_U5 = np.uint32(5)
_U7 = np.uint32(7)


def shared_bytes(stages: int = STAGES) -> int:
    """Dynamic shared memory of a block: the stages and the alignment's slack."""
    return stages * STAGE_WORDS * 4 + ALIGN


def kernel(fmt, stages=STAGES):
    """The kernel factory of one format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel``."""
    if fmt not in DTYPES:
        raise ValueError(f"direct GEMM: unknown format {fmt!r}; choose from {sorted(DTYPES)}")
    return functools.partial(_kernel, fmt, int(stages))


@functools.cache
def issue_fn(fmt, chunks=CHUNKS, threads=THREADS):
    """``issue(x, rows, kdim, k0, o0, smem, tile, t)``: copier t's (of `threads`, `chunks` 16-byte chunks each) cp.async
    copies of one operand's K step at k0 (tile rows o0 ..) into the swizzled tile at word ``tile``; zeros outside the
    operand. direct's every thread (of THREADS, CHUNKS each), direct_ws's producer warpgroup."""
    width = 4 // np.dtype(DTYPES[fmt]).itemsize  # elements a 4-byte word: 1 (TF32), 2 (BF16)
    per_chunk = np.uint32(4 * width)  # elements a 16-byte chunk
    vec_mask = np.uint32(4 * width - 1)
    step = np.uint32(width)
    stride = np.uint32(threads)

    @device_function
    def issue(x, rows, kdim, k0, o0, smem, tile, t):
        vec = (kdim & vec_mask) == U0  # rows of whole 16-byte chunks (given a 16-byte aligned array)
        for u in range(chunks):
            idx = uint32(t + uint32(u) * stride)  # a warp: 4 rows of 8 chunks
            r = uint32(idx >> _U3)
            c = uint32(idx & _U7)
            go = uint32(o0 + r)
            gk = uint32(k0 + c * per_chunk)
            dst = uint32(tile + (r << _U5) + ((c ^ (r & _U7)) << U2))  # the 128-byte swizzle
            inside = go < rows and gk < kdim
            src = uint32(go * kdim + gk)
            if vec or not inside:
                cp_async16(smem, dst, x, src if inside else U0, inside)
            else:  # a K tail or a row not of whole chunks: 4-byte copies, zero beyond K
                for e in range(4):
                    ok = uint32(gk + uint32(e) * step) < kdim
                    cp_async4(smem, uint32(dst + uint32(e)), x, uint32(src + uint32(e) * step) if ok else U0, ok)

    return issue


@functools.cache
def _kernel(fmt, stages, a_map, b_map, store, ksize, epilogue, split_k=False):
    if (a_map, b_map) != (A_MAP, B_MAP):
        raise ValueError(f"direct GEMM: K-major flat operands only (A {A_MAP!r}, B {B_MAP!r}), got {a_map!r}, "
                         f"{b_map!r}")
    if split_k:
        raise ValueError("direct GEMM: no split-K")
    if stages < 3:
        raise ValueError(f"direct GEMM: 3 stages or more (one read by the MMAs in flight, one by the next), got "
                         f"{stages}")
    (*_, out_row, finish) = kernel_parts("dense", "dense", store, ksize, epilogue)
    store_tile = store_fn(out_row, finish)
    issue = issue_fn(fmt)
    mma = wgmma_tf32 if fmt == "tf32" else wgmma_bf16_sw128
    mma_k = LAYOUTS[LAYOUT[fmt]][4]
    bk = np.uint32(ROW_BYTES // np.dtype(DTYPES[fmt]).itemsize)  # K a step: 32 TF32, 64 BF16
    slices = ROW_BYTES // 32  # MMAs a K step and warpgroup (each 32 bytes of every row)
    assert slices * mma_k == int(bk)
    slice_bytes = np.uint32(32)
    stage_words = np.uint32(STAGE_WORDS)
    b_tile = np.uint32(TILE_WORDS)
    wg_bytes = np.uint32(64 * ROW_BYTES)  # a warpgroup's rows of A
    pending = stages - 3  # copy groups left in flight at a step's wait: those of the steps after it
    ahead = np.uint32(stages - 2)  # the copies run this many steps ahead of the MMAs
    last = np.uint32(stages - 1)
    mask = np.uint32(ALIGN - 1)
    max_registers = 128 if shared_bytes(stages) <= TWO_BLOCKS_SHARED else 248

    @jit(max_registers=max_registers)
    def gemm_direct_kernel(a, b, c, aux, dims):
        smem = cuda.shared.array(0, uint32, alignment=TILE_ALIGN)
        acc = cuda.local.array(ACC, float32)
        for i in range(ACC):
            acc[i] = float32(0.0)
        m = dims[D_M]
        n = dims[D_N]
        kdim = dims[D_K]
        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * np.uint32(BM))
        n0 = uint32(cuda.blockIdx.x * np.uint32(BN))
        base = uint32((uint32(ALIGN) - (shared_address(smem) & mask)) & mask) >> U2  # the first aligned word
        steps = uint32((kdim + bk - U1) // bk)
        a_row = uint32(uint32(t >> _U7) * wg_bytes)  # this warpgroup's rows of A

        for j in range(stages - 2):  # the prologue: steps 0 .. stages - 3 in flight
            if uint32(j) < steps:
                at = uint32(base + uint32(j) * stage_words)
                issue(a, m, kdim, uint32(uint32(j) * bk), m0, smem, at, t)
                issue(b, n, kdim, uint32(uint32(j) * bk), n0, smem, uint32(at + b_tile), t)
            cp_async_commit()

        read = U0  # the stage of step s
        write = ahead  # the stage of step s + stages - 2 (step s - 2's)
        s = U0
        while s < steps:
            cp_async_wait(pending)  # this thread's copies of step s have landed
            fence_proxy_async()  # ... visible to the MMAs (the async proxy)
            cuda.syncthreads()  # everyone's; and every warpgroup is past its wait for the MMAs of step s - 2
            wgmma_fence()
            a_byte = uint32(((base + read * stage_words) << U2) + a_row)
            b_byte = uint32((base + read * stage_words + b_tile) << U2)
            for sl in range(slices):
                mma(acc, smem, uint32(a_byte + uint32(sl) * slice_bytes), smem,
                    uint32(b_byte + uint32(sl) * slice_bytes))
            wgmma_commit()
            if uint32(s + ahead) < steps:
                at = uint32(base + write * stage_words)
                k_next = uint32((s + ahead) * bk)
                issue(a, m, kdim, k_next, m0, smem, at, t)
                issue(b, n, kdim, k_next, n0, smem, uint32(at + b_tile), t)
            cp_async_commit()  # a group every step, empty or not: the wait's count stays right
            wgmma_wait1(acc)  # the MMAs of step s - 1 are done (this warpgroup's)
            read = U0 if read == last else uint32(read + U1)
            write = U0 if write == last else uint32(write + U1)
            s = uint32(s + U1)

        wgmma_wait(acc)
        cp_async_wait(0)
        store_tile(c, aux, dims, acc, m0, n0, t)

    return gemm_direct_kernel

