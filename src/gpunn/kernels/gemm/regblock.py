"""GEMM version ``regblock``: register blocking with a 64x64 block tile.

Block tile BM x BN of C, K stepped by BK. Threads form a (BM/TM) x (BN/TN) grid; thread (ty, tx) owns the TM x TN
outputs rows ty*TM.., cols tx*TN... Tiles are stored k-major (As[p, i], Bs[p, j]) so the inner loop reads TM
(resp. TN) consecutive shared words per k. Each thread loads A_LOADS elements of A and B_LOADS of B per K step,
consecutive along the operand's contiguous axis. Napkin math: per k a thread does TM*TN = 16 FMAs for 2 float4
shared loads, against 1 FMA per 2 loads in ``tiled16``. Index expressions are wrapped in uint32 and the inner
loop is a uint32 while loop unrolled by UNROLL in source (why: NOTES.md)."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from ..jit import jit
from .mappings import SMEM_ALIGN, U0, k_range_fn, kernel_parts
from .problem import D_M, D_N

BM = 64
BN = 64
BK = 8
TM = 4
TN = 4
THREADS = (BM // TM) * (BN // TN)  # 256
# Local-array sizes must be plain module constants: an expression (TM * TN) types in the simulator only.
TMN = 16
A_LOADS = BM * BK // THREADS  # 2 elements of A per thread per K step
B_LOADS = BN * BK // THREADS  # 2 elements of B per thread per K step
assert TMN == TM * TN and BM % TM == 0 and BN % TN == 0
assert A_LOADS * THREADS == BM * BK and B_LOADS * THREADS == BN * BK
assert BK % A_LOADS == 0 and BM % A_LOADS == 0 and BK % B_LOADS == 0 and BN % B_LOADS == 0
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_TM = np.uint32(TM)
_TN = np.uint32(TN)
_AL = np.uint32(A_LOADS)
_BL = np.uint32(B_LOADS)
_BK_AL = np.uint32(BK // A_LOADS)  # threads per row of a K-contiguous A tile
_BM_AL = np.uint32(BM // A_LOADS)  # threads per row of an M-contiguous A tile
_BN_BL = np.uint32(BN // B_LOADS)  # threads per row of an N-contiguous B tile
_BK_BL = np.uint32(BK // B_LOADS)  # threads per row of a K-contiguous B tile
_TX = np.uint32(BN // TN)  # threads along the columns of the block tile
UNROLL = 2  # k steps per iteration of the inner loop (LLVM leaves larger unrolls rolled, 64-bit)
_UNROLL = np.uint32(UNROLL)


@functools.cache
def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)

    @jit
    def gemm_regblock_kernel(a, b, c, aux, dims):
        As = cuda.shared.array((BK, BM), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((BK, BN), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(TMN, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        ty4 = uint32(t // _TX * _TM)  # first row and column of the thread's outputs in the tile
        tx4 = uint32(t % _TX * _TN)
        for i in range(TMN):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop; so is the outer index of a
        # K-contiguous operand, whose state is computed here once.
        if a_contig_k:  # a row of the tile is BK consecutive K indices
            a_i = uint32(t // _BK_AL)
            a_p = uint32(t % _BK_AL * _AL)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:  # a row of the tile is BM consecutive M indices
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
            # ---- global -> shared, zero-filled outside the matrices
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

            # ---- outer products from shared memory into registers (a uint32 loop unrolled by 2:
            # numba's range() loop keeps a 64-bit counter and a negative-index check on p)
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

        # ---- epilogue and masked store
        for i in range(TM):
            gi = uint32(m0 + ty4 + uint32(i))
            if gi < m:
                row = out_row(dims, gi)
                for j in range(TN):
                    gj = uint32(n0 + tx4 + uint32(j))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[i * TN + j])

    return gemm_regblock_kernel


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, THREADS, kernel)
    return (cdiv(n, BN), cdiv(m, BM)), THREADS

