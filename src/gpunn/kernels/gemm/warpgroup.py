"""GEMM versions ``wgmma_tf32`` and ``wgmma_bf16`` (Hopper, sm_90a): Hopper's warpgroup MMA (``wgmma.mma_async``
through gpunn.kernels.wgmma) reading both operands from shared memory, a 128x128 block tile, K steps of 32, float32
accumulation; one kernel body for both formats.

WARPGROUPS warpgroups (2: 256 threads), each 64 rows of the tile x 128: a K step is 4 TF32 (k8) or 2 BF16 (k16)
MMAs a warpgroup, 64 accumulators a thread. The tiles are K-major rows of 32 K (an M index of A, an N index of B:
128 B of TF32, 64 B of BF16 pairs), 16-byte chunks swizzled by the row as the MMA's descriptor says
(``wgmma.swizzle``). Inputs are rounded once, on their way from registers to shared memory (``to_tf32``,
``pack_bf16``), and loaded as ``tensor``'s (``operand_tiles``: by the operand's mapping, whole K rows a warp request
or one outer index a thread). A K step: store the tile to shared memory, fence and barrier, issue the MMAs, load
the next tile into registers while they run, wait for them, barrier. Any operand mapping, epilogue and store of
``mappings`` works, and split-K (chunks of 32). Measurements: NOTES-tensor.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, check_fixed_block
from ..jit import jit
from ..mma import pack_bf16, to_tf32
from ..wgmma import ACC, LAYOUTS, fence_proxy_async, wgmma_bf16, wgmma_commit, wgmma_fence, wgmma_tf32, wgmma_wait
from .mappings import U2, U4, U32, device_function, k_range_fn, kernel_parts
from .operand_tiles import OperandTile, format_factory, shared_word
from .problem import D_M, D_N

WARPGROUPS = 2  # each the 64 x 128 MMA of its rows of A (4, a 256 x 128 tile: NOTES-tensor.md)
BM = 64 * WARPGROUPS
BN = 128
BK = 32
THREADS = 128 * WARPGROUPS
LA = BM * BK // THREADS  # elements of A (of B) a thread loads per K step
LB = BN * BK // THREADS
MAX_REGISTERS = 65536 // (2 * THREADS)  # two blocks an SM: one's MMAs run while the other waits for its loads
DEVICES = ((9, 0),)  # compute capabilities with wgmma (sm_90a: Hopper only)
TILE_ALIGN = None if device.simulator_enabled() else 1024  # the swizzle's period: its base must be aligned to it
assert LA * THREADS == BM * BK and LB * THREADS == BN * BK
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_U7 = np.uint32(7)
_U16 = np.uint32(16)
_U64 = np.uint32(64)
_U128 = np.uint32(128)


def kernel(fmt):
    """The kernel factory of one format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel``."""
    return format_factory("wgmma", fmt, _kernel)


@functools.cache
def _kernel(fmt, a_map, b_map, store, ksize, epilogue, split_k=False):
    (*_, out_row, finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)
    bf16 = fmt == "bf16"
    word, kp = shared_word(fmt)
    row_bytes, _, _, _, mma_k = LAYOUTS[fmt]
    slot = slot_fn(fmt)
    store_tile = store_fn(out_row, finish)
    a_words = BM * row_bytes // 4
    b_words = BN * row_bytes // 4
    slice_bytes = np.uint32(mma_k * 4 // kp)  # 32: the bytes of one MMA's K in a row
    slices = BK // mma_k
    mma = wgmma_bf16 if bf16 else wgmma_tf32
    a_tile = OperandTile("a", a_map, ksize, fmt, BM, THREADS)
    b_tile = OperandTile("b", b_map, ksize, fmt, BN, THREADS)
    a_first, a_start, a_load, a_place = a_tile.functions()
    b_first, b_start, b_load, b_place = b_tile.functions()
    a_stores, b_stores = a_tile.words, b_tile.words  # words a thread stores per K step
    wg_bytes = np.uint32(64 * row_bytes)  # a warpgroup's rows of A

    @jit(max_registers=MAX_REGISTERS)
    def gemm_wgmma_kernel(a, b, c, aux, dims):
        As = cuda.shared.array(a_words, word, alignment=TILE_ALIGN)
        Bs = cuda.shared.array(b_words, word, alignment=TILE_ALIGN)
        acc = cuda.local.array(ACC, float32)
        la = cuda.local.array(LA, float32)  # tile of A in flight (global -> registers -> shared)
        lb = cuda.local.array(LB, float32)
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        for i in range(ACC):
            acc[i] = float32(0.0)

        a0, a1 = a_first(t)
        b0, b1 = b_first(t)
        a_state = a_start(dims, m0, a0)
        b_state = b_start(dims, n0, b0)
        a_base = uint32(t // _U128 * wg_bytes)

        k0 = k_begin
        loading = k0 < k
        while loading:
            # ---- this K step's tile, loaded into registers by the last iteration (or here, the first time)
            if k0 == k_begin:
                a_load(a, dims, k0, m0, a0, a1, a_state, la)
                b_load(b, dims, k0, n0, b0, b1, b_state, lb)
            # ---- registers -> shared memory, rounded and swizzled
            for v in range(a_stores):
                ar, aw = a_place(a0, a1, uint32(v))
                As[slot(ar, aw)] = pack_bf16(la[2 * v], la[2 * v + 1]) if bf16 else to_tf32(la[v])
            for v in range(b_stores):
                br, bw = b_place(b0, b1, uint32(v))
                Bs[slot(br, bw)] = pack_bf16(lb[2 * v], lb[2 * v + 1]) if bf16 else to_tf32(lb[v])
            fence_proxy_async()
            cuda.syncthreads()
            # ---- the MMAs, asynchronous; the next tile's loads run under them
            wgmma_fence()
            for s in range(slices):
                mma(acc, As, uint32(a_base + uint32(s) * slice_bytes), Bs, uint32(uint32(s) * slice_bytes))
            wgmma_commit()
            k0 = uint32(k0 + _BK)
            loading = k0 < k
            if loading:
                a_load(a, dims, k0, m0, a0, a1, a_state, la)
                b_load(b, dims, k0, n0, b0, b1, b_state, lb)
            wgmma_wait(acc)
            cuda.syncthreads()

        store_tile(c, aux, dims, acc, m0, n0, t)

    return gemm_wgmma_kernel


@functools.cache
def slot_fn(fmt):
    """``slot(r, wd)``: the word of a swizzled ``fmt`` tile holding word ``wd`` of row ``r``."""
    row_bytes, mask, _, _, _ = LAYOUTS[fmt]
    row_shift = np.uint32(row_bytes.bit_length() - 1)
    swizzle_mask = np.uint32(mask)

    @device_function
    def slot(r, wd):
        byte = uint32((r << row_shift) + (wd << U2))
        return uint32((byte ^ (((byte >> _U7) & swizzle_mask) << U4)) >> U2)

    return slot


@functools.cache
def store_fn(out_row, finish, bn=BN):
    """``store(c, aux, dims, acc, m0, n0, t)``: the epilogue and masked store of a block's accumulators (tile at
    m0, n0; thread t): acc[4j + 2h + e] is D[16 (w % 4) + g + 8h, 8j + 2q + e] of warpgroup t // 128 (64 rows each),
    j < bn / 8 (direct_ws's consumers: bn 128 or 256)."""
    groups = bn // 8

    @device_function
    def store(c, aux, dims, acc, m0, n0, t):
        m = dims[D_M]
        n = dims[D_N]
        w = uint32(t // U32)
        lane = uint32(t % U32)
        g = uint32(lane // U4)
        q = uint32(lane % U4)
        for h in range(2):
            gi = uint32(m0 + t // _U128 * _U64 + w % U4 * _U16 + g + uint32(8 * h))
            if gi < m:
                row = out_row(dims, gi)
                for j in range(groups):
                    for e in range(2):
                        gj = uint32(n0 + uint32(8 * j + e) + q * U2)
                        if gj < n:
                            finish(c, aux, dims, row, gj, acc[4 * j + 2 * h + e])

    return store


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, THREADS, kernel)
    return (cdiv(n, BN), cdiv(m, BM)), THREADS

