"""GEMM versions for narrow, shallow GEMMs (``narrow``, BK 8, and the deep K steps ``deep128x32``, ``deep128x16``,
``deep32x32``): 4 x TN outputs per thread, BK = 8, 16 or 32, the next K step's tiles loaded into registers while
this one multiplies, for the latency-bound GEMMs of small convolutions (K of a few hundred, or short split-K
chunks). A K step waits about one global-load round trip and two barriers whatever its depth, so deeper steps
than narrow's (BK = 8) mean fewer waits.

One factory, ``DeepTile(name, BM, BN, BK, TN)``: a BM x BN block tile, (BM/4) x (BN/TN) threads, thread (ty, tx)
owning the 4 x TN outputs rows ty*4.., columns tx*TN... Per K step each thread moves AL = BM*BK/threads elements
of A and BL = BN*BK/threads of B into registers (issued before the outer products of the previous step, stored to
the k-major shared tiles after them). A K-contiguous operand is loaded one row (column) per thread, AL consecutive
k each, consecutive threads on consecutive rows: the transposed shared stores of a warp hit 32 distinct banks, and
the row's loader state is computed once before the K loop. Shared rows are padded by 4 floats (16-byte aligned:
one ld.shared.v4 reads a thread's 4 rows of A).

All are window versions (``mappings.WINDOW_VERSIONS``): a thread's 4 rows are one pooling window, finished at once
by ``mappings.window_fns``. Index arithmetic as regblock's (NOTES.md); the tile choices and timings: NOTES.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from ..jit import jit
from .mappings import SMEM_ALIGN, U0, WINDOW_STORES, k_range_fn, kernel_parts, window_fns
from .problem import D_M, D_N

TM = 4  # rows per thread: one 2x2 pooling window with a window store
PAD = 4  # floats of padding per shared row (rows stay 16-byte aligned)
UNROLL = 4  # k per trip of the inner loop (a uint32 while loop, as regblock's)


class DeepTile:
    """One deep-K GEMM version: the kernel factory ``kernel(a_map, b_map, store, ksize, epilogue,
    split_k=False)`` (cached) and ``config(op, block, M, N, kernel) -> (grid, threads)``."""

    def __init__(self, name: str, bm: int, bn: int, bk: int, tn: int):
        threads = (bm // TM) * (bn // tn)
        al, bl = bm * bk // threads, bn * bk // threads
        if not (bm % TM == 0 and bn % tn == 0 and al * threads == bm * bk and bl * threads == bn * bk
                and threads % bm == 0 and threads % bn == 0 and bm % al == 0 and bn % bl == 0
                and bk % UNROLL == 0 and threads <= 1024):
            raise ValueError(f"DeepTile {name}: the tile {bm}x{bn}, BK {bk}, {TM}x{tn} per thread does not divide "
                             f"into whole loads per thread; choose BM, BN, BK, TN so that the {threads} threads "
                             f"are a multiple of BM and of BN and BK a multiple of {UNROLL}")
        self.name, self.bm, self.bn, self.bk, self.tn = name, bm, bn, bk, tn
        self.threads, self.a_loads, self.b_loads = threads, al, bl
        self.kernel = functools.cache(self._build)

    def __repr__(self):
        return (f"DeepTile({self.name!r}, {self.bm}x{self.bn}, BK {self.bk}, {TM}x{self.tn} per thread, "
                f"{self.threads} threads)")

    def config(self, op, block, m, n, kernel):
        check_fixed_block(op, block, self.threads, kernel)
        return (cdiv(n, self.bn), cdiv(m, self.bm)), self.threads

    def _build(self, a_map, b_map, store, ksize, epilogue, split_k=False):
        window = store in WINDOW_STORES
        if window and split_k:
            raise ValueError(f"gemm_{self.name}: the window store {store!r} finishes whole windows; it cannot "
                             f"split K")
        (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
         finish) = kernel_parts(a_map, b_map, "dense" if window else store, ksize, "none" if window else epilogue)
        if window:
            out_row, finish = window_fns(store, epilogue)
        k_range = k_range_fn(split_k)
        return _kernel(self.bm, self.bn, self.bk, self.tn, a_contig_k, a_outer, a_inner, a_get, b_contig_k,
                       b_outer, b_inner, b_get, out_row, finish, k_range, window)


def _kernel(bm, bn, bk, tn, a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
            finish, k_range, window):
    # shapes and loop bounds: plain int closure constants (numba needs them for local / shared arrays)
    threads = (bm // TM) * (bn // tn)
    AL = bm * bk // threads
    BL = bn * bk // threads
    ACC = TM * tn
    TN = tn
    BK = bk
    ROW_A = bm + PAD
    ROW_B = bn + PAD
    _BM = np.uint32(bm)
    _BN = np.uint32(bn)
    _BK = np.uint32(bk)
    _TM = np.uint32(TM)
    _TN = np.uint32(tn)
    _TX = np.uint32(bn // tn)
    _AL = np.uint32(AL)
    _BL = np.uint32(BL)
    _BM_AL = np.uint32(bm // AL)
    _BN_BL = np.uint32(bn // BL)
    _UNROLL = np.uint32(UNROLL)

    @jit
    def gemm_deep_kernel(a, b, c, aux, dims):
        As = cuda.shared.array((BK, ROW_A), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((BK, ROW_B), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(ACC, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        la = cuda.local.array(AL, float32)  # the next K step's tiles in flight (global -> registers -> shared)
        lb = cuda.local.array(BL, float32)
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        ty4 = uint32(t // _TX * _TM)
        txn = uint32(t % _TX * _TN)
        for i in range(ACC):
            acc[i] = float32(0.0)

        # load coordinates inside the tiles, fixed for the K loop (and the outer state of a K-contiguous operand)
        if a_contig_k:  # one row per thread, AL consecutive k; a warp on 32 consecutive rows
            a_i = uint32(t % _BM)
            a_p = uint32(t // _BM * _AL)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:
            a_p = uint32(t // _BM_AL)
            a_i = uint32(t % _BM_AL * _AL)
        if b_contig_k:
            b_j = uint32(t % _BN)
            b_p = uint32(t // _BN * _BL)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _BN_BL)
            b_j = uint32(t % _BN_BL * _BL)

        # Pipeline (regblock128's): iteration s loads step s into registers (if any), multiplies step s-1 (if any)
        # from shared memory, then stores step s to shared memory.
        k0 = k_begin
        while True:
            if k0 < k:
                if a_contig_k:
                    for u in range(AL):
                        la[u] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + a_p + uint32(u))))
                else:
                    ai = a_inner(dims, uint32(k0 + a_p))
                    for u in range(AL):
                        la[u] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(u))), ai)
                if b_contig_k:
                    for u in range(BL):
                        lb[u] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p + uint32(u))))
                else:
                    bi = b_inner(dims, uint32(k0 + b_p))
                    for u in range(BL):
                        lb[u] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(u))), bi)
            if k0 > k_begin:
                p0 = U0
                while p0 < _BK:
                    for q in range(UNROLL):
                        p = p0 + uint32(q)
                        for i in range(TM):
                            ra[i] = As[p, ty4 + uint32(i)]
                        for j in range(TN):
                            rb[j] = Bs[p, txn + uint32(j)]
                        for i in range(TM):
                            for j in range(TN):
                                acc[i * TN + j] += ra[i] * rb[j]
                    p0 = uint32(p0 + _UNROLL)
                cuda.syncthreads()
            if k0 >= k:
                break
            for u in range(AL):
                if a_contig_k:
                    As[a_p + uint32(u), a_i] = la[u]
                else:
                    As[a_p, a_i + uint32(u)] = la[u]
            for u in range(BL):
                if b_contig_k:
                    Bs[b_p + uint32(u), b_j] = lb[u]
                else:
                    Bs[b_p, b_j + uint32(u)] = lb[u]
            cuda.syncthreads()
            k0 = uint32(k0 + _BK)

        if window:  # the thread's 4 rows are one pooling window (M is a multiple of 4)
            gi = uint32(m0 + ty4)
            if gi < m:
                row = out_row(dims, gi)
                for j in range(TN):
                    gj = uint32(n0 + txn + uint32(j))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[j], acc[TN + j], acc[2 * TN + j], acc[3 * TN + j])
        else:
            for i in range(TM):
                gi = uint32(m0 + ty4 + uint32(i))
                if gi < m:
                    row = out_row(dims, gi)
                    for j in range(TN):
                        gj = uint32(n0 + txn + uint32(j))
                        if gj < n:
                            finish(c, aux, dims, row, gj, acc[i * TN + j])

    return gemm_deep_kernel


# The registered versions (versions.VERSIONS): narrow, the first window version (BK 8, as regblock's steps; its own
# module until issue 26's consolidation, NOTES.md), and the deep ones for the CNN's conv2 forward (N = 32, K = 144)
# and weight gradient (M = 32, N = 144, K split), its input gradient (N = 16, K = 288).
NARROW = DeepTile("narrow", 128, 32, 8, 4)  # 256 threads, BK 8: 4 + 1 loads per thread and step
DEEP128X32 = DeepTile("deep128x32", 128, 32, 16, 4)  # 256 threads, BK 16: 8 + 2 loads per thread and step
DEEP128X16 = DeepTile("deep128x16", 128, 16, 32, 2)  # 256 threads, BK 32: 16 + 2
DEEP32X32 = DeepTile("deep32x32", 32, 32, 32, 4)  # 64 threads, BK 32: 16 + 16
TILES = (NARROW, DEEP128X32, DEEP128X16, DEEP32X32)
