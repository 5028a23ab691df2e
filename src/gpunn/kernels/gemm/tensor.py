"""GEMM versions ``tensor_tf32`` and ``tensor_bf16``: warp-level tensor-core MMA (``mma.sync`` through
gpunn.kernels.mma), a 128x128 block tile, K steps of 32, float32 accumulation; one kernel body for both formats.

Inputs are rounded once, when a tile goes from registers to shared memory: TF32 (``to_tf32``, stored as float32)
or BF16 (``pack_bf16``, two K-consecutive numbers in one uint32 word); a batched operand held as BF16 pairs
(``mappings_batched``'s ``_bf16x2`` mappings) is loaded as words and stored as it is. 8 warps in 2 x 4, each a
64x32 warp tile of 4 x 4 MMAs (m16n8), 64 accumulators a thread; a K step is 4 TF32 (k8) or 2 BF16 (k16) slices of
16 MMAs.

Each operand takes one of two load paths (compile-time, by its mapping: ``operand_tiles``) and its tile layout:
* a dense operand contiguous along K with a plain outer index (``DENSE_K_A`` / ``DENSE_K_B``): a warp request
  reads whole K rows (TF32: a row of 32 K a request, lane = K; BF16: two rows, a lane two consecutive K); the tile
  is stored in rows of K words (an M index of A, an N index of B), 32 TF32 or 16 BF16 words plus 4 of padding;
* any other mapping (contiguous along M or N, im2col, ...): a thread owns one outer index (its state computed
  once) and loads 16 consecutive K of it, a warp request reads 32 consecutive outer indices; the tile is stored
  K-major, rows of 128 outer indices plus 8 of padding.
Both layouts make the stores of a warp and its fragment reads (group g, word t: 8 rows x 4 words) hit 32
different banks. The next tile is loaded into registers before the MMAs of this one and stored to shared memory
after them (as regblock128). Any operand mapping, epilogue and store of ``mappings`` works, and split-K (chunks
of 32). History and measurements: NOTES-tensor.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from ..jit import jit
from ..mma import mma_bf16, mma_tf32, pack_bf16, to_tf32
from .mappings import U0, U1, U2, U4, U32, k_range_fn, kernel_parts
from .operand_tiles import OperandTile, format_factory, shared_word
from .problem import D_M, D_N

BM = 128
BN = 128
BK = 32
THREADS = 256
ACC = 64  # 4 x 4 MMAs x 4 accumulators a thread (local-array sizes: plain constants)
LD = 16  # elements of A (and of B) each thread loads per K step: 128 * 32 / 256
LDW = 8  # ... the words they make in BF16 (an operand held as BF16 pairs loads them as they are)
FA = 16  # A fragment registers a slice: 4 MMA rows x 4
FB = 8  # B fragment registers a slice: 4 MMA columns x 2
ROW_PAD = 4  # words after a K row (32 TF32: 36 = 4 mod 32; 16 BF16 pairs: 20 g mod 32 = 0, 20, 8, 28, ...): the
             # fragment reads of a warp hit 32 banks
MAX_REGISTERS = 128  # two blocks of 256 threads an SM (no spills: NOTES-tensor.md)
ROW_OUTER = 136  # a K-major row: 128 outer indices + 8 (136 = 8 mod 32: word t, index g -> bank 8t + g)
assert LD * THREADS == BM * BK == BN * BK
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_U8 = np.uint32(8)


def kernel(fmt):
    """The kernel factory of one format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel``."""
    return format_factory("tensor", fmt, _kernel)


@functools.cache
def _kernel(fmt, a_map, b_map, store, ksize, epilogue, split_k=False):
    (*_, out_row, finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)
    bf16 = fmt == "bf16"
    word, kp = shared_word(fmt)
    k_words = BK // kp
    slices = k_words // 8  # MMA K slices of a K step; each is 8 words of a row
    mma = mma_bf16 if bf16 else mma_tf32
    a_tile = OperandTile("a", a_map, ksize, fmt, BM, THREADS)  # the load path and shared layout of each operand
    b_tile = OperandTile("b", b_map, ksize, fmt, BN, THREADS)
    a_rows, b_rows = a_tile.k_rows, b_tile.k_rows
    a_shape = (BM, k_words + ROW_PAD) if a_rows else (k_words, ROW_OUTER)
    b_shape = (BN, k_words + ROW_PAD) if b_rows else (k_words, ROW_OUTER)
    words = a_tile.words  # words a thread stores per operand and K step (the same for B: BM = BN)
    a_pairs, b_pairs = a_tile.pairs, b_tile.pairs  # BF16 pairs in memory: the loads give the words
    assert not (a_pairs or b_pairs) or words == LDW
    a_first, a_start, a_load, a_place = a_tile.functions()
    b_first, b_start, b_load, b_place = b_tile.functions()

    @jit(max_registers=MAX_REGISTERS)
    def gemm_tensor_kernel(a, b, c, aux, dims):
        As = cuda.shared.array(a_shape, word)
        Bs = cuda.shared.array(b_shape, word)
        acc = cuda.local.array(ACC, float32)
        fa = cuda.local.array(FA, word)
        fb = cuda.local.array(FB, word)
        la = cuda.local.array(LD, float32)  # tile of A in flight (global -> registers -> shared)
        lb = cuda.local.array(LD, float32)
        wa = cuda.local.array(LDW, uint32)  # ... as words, of an operand held as BF16 pairs
        wb = cuda.local.array(LDW, uint32)
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        w = uint32(t // U32)
        lane = uint32(t % U32)
        g = uint32(lane // U4)  # the lane's group and place in it (the fragment tables' g and t)
        q = uint32(lane % U4)
        wm = uint32(w // U4 * uint32(64))  # the warp tile's first row and column in the block tile
        wn = uint32(w % U4 * U32)
        for i in range(ACC):
            acc[i] = float32(0.0)

        a0, a1 = a_first(t)
        b0, b1 = b_first(t)
        a_state = a_start(dims, m0, a0)
        b_state = b_start(dims, n0, b0)

        # Pipeline: iteration s loads tile s into registers (if any), multiplies tile s-1 (if any) from
        # shared memory, then stores tile s to shared memory.
        k0 = k_begin
        while True:
            if k0 < k:
                if a_pairs:
                    a_load(a, dims, k0, m0, a0, a1, a_state, wa)
                else:
                    a_load(a, dims, k0, m0, a0, a1, a_state, la)
                if b_pairs:
                    b_load(b, dims, k0, n0, b0, b1, b_state, wb)
                else:
                    b_load(b, dims, k0, n0, b0, b1, b_state, lb)
            if k0 > k_begin:
                s = U0
                while s < uint32(slices):
                    kw = uint32(s * _U8 + q)
                    for i in range(4):
                        r = uint32(wm + uint32(16 * i) + g)
                        if a_rows:
                            fa[4 * i] = As[r, kw]
                            fa[4 * i + 1] = As[r + _U8, kw]
                            fa[4 * i + 2] = As[r, kw + U4]
                            fa[4 * i + 3] = As[r + _U8, kw + U4]
                        else:
                            fa[4 * i] = As[kw, r]
                            fa[4 * i + 1] = As[kw, r + _U8]
                            fa[4 * i + 2] = As[kw + U4, r]
                            fa[4 * i + 3] = As[kw + U4, r + _U8]
                    for j in range(4):
                        col = uint32(wn + uint32(8 * j) + g)
                        if b_rows:
                            fb[2 * j] = Bs[col, kw]
                            fb[2 * j + 1] = Bs[col, kw + U4]
                        else:
                            fb[2 * j] = Bs[kw, col]
                            fb[2 * j + 1] = Bs[kw + U4, col]
                    for i in range(4):
                        for j in range(4):
                            x = 4 * (4 * i + j)
                            acc[x], acc[x + 1], acc[x + 2], acc[x + 3] = mma(
                                fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], fb[2 * j], fb[2 * j + 1],
                                acc[x], acc[x + 1], acc[x + 2], acc[x + 3])
                    s = uint32(s + U1)
                cuda.syncthreads()
            if k0 >= k:
                break
            for v in range(words):
                ar, aw = a_place(a0, a1, uint32(v))
                br, bw = b_place(b0, b1, uint32(v))
                if bf16:
                    xa = wa[v] if a_pairs else pack_bf16(la[2 * v], la[2 * v + 1])
                    xb = wb[v] if b_pairs else pack_bf16(lb[2 * v], lb[2 * v + 1])
                else:
                    xa = to_tf32(la[v])
                    xb = to_tf32(lb[v])
                if a_rows:
                    As[ar, aw] = xa
                else:
                    As[aw, ar] = xa
                if b_rows:
                    Bs[br, bw] = xb
                else:
                    Bs[bw, br] = xb
            cuda.syncthreads()
            k0 = uint32(k0 + _BK)

        # ---- epilogue and masked store: accumulator 4 (4i + j) + 2h + e is C[row g + 8h, column 2q + e] of MMA (i, j)
        for i in range(4):
            for h in range(2):
                gi = uint32(m0 + wm + uint32(16 * i + 8 * h) + g)
                if gi < m:
                    row = out_row(dims, gi)
                    for j in range(4):
                        for e in range(2):
                            gj = uint32(n0 + wn + uint32(8 * j + e) + q * U2)
                            if gj < n:
                                finish(c, aux, dims, row, gj, acc[4 * (4 * i + j) + 2 * h + e])

    return gemm_tensor_kernel


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, THREADS, kernel)
    return (cdiv(n, BN), cdiv(m, BM)), THREADS
