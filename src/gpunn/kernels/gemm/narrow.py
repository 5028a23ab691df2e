"""GEMM version ``narrow``: register blocking with a 128x32 block tile, for the narrow N of convolutions with
16-32 output channels (a 64x64 tile throws half its work away at N = 32).

256 threads as a 32 x 8 grid; thread (ty, tx) owns the 4x4 outputs rows ty*4.., columns tx*4.. . Per K step
(BK = 8) each thread loads 4 elements of A and 1 of B along the operand's contiguous axis; the k-major shared
tiles are padded (rows of ROW_A = 132 and ROW_B = 36 floats) so that the transposed stores of a K-contiguous
operand hit distinct banks. Per k a thread reads one float4 of A and one of B for 16 FMAs (regblock's ratio).

It is the window version (``mappings.WINDOW_VERSIONS``): with a window store (``pool_nchw``) a thread's 4 rows
are one pooling window, finished at once by ``mappings.window_fns``. Index arithmetic as regblock's (NOTES.md)."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from .mappings import SMEM_ALIGN, U0, WINDOW_STORES, k_range_fn, kernel_parts, window_fns
from .problem import D_M, D_N

BM = 128
BN = 32
BK = 8
TM = 4
TN = 4
THREADS = (BM // TM) * (BN // TN)  # 256
TMN = 16  # local-array sizes: plain constants
ROW_A = 132  # padded shared rows (16-byte multiples)
ROW_B = 36
A_LOADS = BM * BK // THREADS  # 4
B_LOADS = BN * BK // THREADS  # 1
assert TMN == TM * TN and TM == 4 and A_LOADS * THREADS == BM * BK and B_LOADS * THREADS == BN * BK
assert BK % A_LOADS == 0 and BM % A_LOADS == 0 and BK % B_LOADS == 0 and BN % B_LOADS == 0
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_TM = np.uint32(TM)
_TN = np.uint32(TN)
_AL = np.uint32(A_LOADS)
_BL = np.uint32(B_LOADS)
_BK_AL = np.uint32(BK // A_LOADS)
_BM_AL = np.uint32(BM // A_LOADS)
_BN_BL = np.uint32(BN // B_LOADS)
_BK_BL = np.uint32(BK // B_LOADS)
_TX = np.uint32(BN // TN)
UNROLL = 2
_UNROLL = np.uint32(UNROLL)


@functools.cache
def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    window = store in WINDOW_STORES
    if window and split_k:
        raise ValueError(f"gemm_narrow: the window store {store!r} finishes whole windows; it cannot split K")
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = kernel_parts(a_map, b_map, "dense" if window else store, ksize, "none" if window else epilogue)
    if window:
        out_row, finish = window_fns(store, epilogue)
    k_range = k_range_fn(split_k)

    @cuda.jit
    def gemm_narrow_kernel(a, b, c, aux, dims):
        As = cuda.shared.array((BK, ROW_A), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((BK, ROW_B), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(TMN, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        ty4 = uint32(t // _TX * _TM)
        tx4 = uint32(t % _TX * _TN)
        for i in range(TMN):
            acc[i] = float32(0.0)

        if a_contig_k:
            a_i = uint32(t // _BK_AL)
            a_p = uint32(t % _BK_AL * _AL)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:
            a_p = uint32(t // _BM_AL)
            a_i = uint32(t % _BM_AL * _AL)
        if b_contig_k:
            b_j = uint32(t // _BK_BL)
            b_p = uint32(t % _BK_BL * _BL)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _BN_BL)
            b_j = uint32(t % _BN_BL * _BL)

        k0 = k_begin
        while k0 < k:
            if a_contig_k:
                for u in range(A_LOADS):
                    As[a_p + uint32(u), a_i] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + a_p + uint32(u))))
            else:
                ai = a_inner(dims, uint32(k0 + a_p))
                for u in range(A_LOADS):
                    As[a_p, a_i + uint32(u)] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(u))), ai)
            if b_contig_k:
                for u in range(B_LOADS):
                    Bs[b_p + uint32(u), b_j] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p + uint32(u))))
            else:
                bi = b_inner(dims, uint32(k0 + b_p))
                for u in range(B_LOADS):
                    Bs[b_p, b_j + uint32(u)] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(u))), bi)
            cuda.syncthreads()

            p0 = U0
            while p0 < _BK:
                for q in range(UNROLL):
                    p = p0 + uint32(q)
                    for i in range(TM):
                        ra[i] = As[p, ty4 + uint32(i)]
                    for j in range(TN):
                        rb[j] = Bs[p, tx4 + uint32(j)]
                    for i in range(TM):
                        for j in range(TN):
                            acc[i * TN + j] += ra[i] * rb[j]
                p0 = uint32(p0 + _UNROLL)
            cuda.syncthreads()
            k0 = uint32(k0 + _BK)

        if window:  # the thread's 4 rows are one pooling window (M is a multiple of 4)
            gi = uint32(m0 + ty4)
            if gi < m:
                row = out_row(dims, gi)
                for j in range(TN):
                    gj = uint32(n0 + tx4 + uint32(j))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[j], acc[TN + j], acc[2 * TN + j], acc[3 * TN + j])
        else:
            for i in range(TM):
                gi = uint32(m0 + ty4 + uint32(i))
                if gi < m:
                    row = out_row(dims, gi)
                    for j in range(TN):
                        gj = uint32(n0 + tx4 + uint32(j))
                        if gj < n:
                            finish(c, aux, dims, row, gj, acc[i * TN + j])

    return gemm_narrow_kernel


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, THREADS, kernel)
    return (cdiv(n, BN), cdiv(m, BM)), THREADS
