"""GEMM versions ``regblock128`` and ``coalesced128``: register blocking with a 128x128 block tile, 8x8 outputs per
thread, one kernel body.

regblock128: thread t = 16 * ty + tx owns rows {ty*4 + r, 64 + ty*4 + r} and columns {tx*4 + s, 64 + tx*4 + s}, r, s
in 0..3. Per k it reads two float4 of the A column and two of the B row from the k-major shared tiles: the 16 threads
of a half-warp read 256 consecutive bytes of Bs (no bank conflict) and 2 distinct addresses of As (broadcast). Tile
loads: each thread moves 4 consecutive elements along the operand's contiguous axis; the (128, 8) tiles are written
transposed into rows padded to ROW floats, so the 32 stores of a warp hit 32 banks. The loads of tile k+1 are issued
before the outer products of tile k and stored to shared memory after them, so their latency hides behind 512 FMAs.

coalesced128: the same tile and pipeline with each warp request reading whole cache lines where the operand allows:
an operand whose K axis is truly contiguous with a plain outer index (mappings.DENSE_K_A / DENSE_K_B: a dense A, a
transposed dense B, a conv weight) is read 8 consecutive K of 4 outer indices per request (thread: K t % 8, outer
t // 8 + 32u), an operand contiguous along its outer axis 32 consecutive outer indices per request (t % 32 + 32u);
the other mappings (im2col, channels) keep regblock128's loads. Warp-tiled thread layout: warp w owns 16 rows of each
half from (w // 2) * 16 and 32 columns of each half from (w % 2) * 32 (lane l: 4 rows from (l // 8) * 4, 4 columns
from (l % 8) * 4), so a k reads 4 shared wavefronts per warp instead of 6. Its K step is written out (8 inlined
outer products with constant k, `max_registers` 128), and its dense launcher passes a C-contiguous K-contiguous
operand flat (gemm.dense: 32-bit element offsets). The results are regblock128's, bit for bit (the same sums in the
same order). Napkin math, PTX facts and measurements: NOTES.md."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from ..jit import jit
from .mappings import DENSE_K_A, DENSE_K_B, SMEM_ALIGN, U0, U2, U4, U32, device_function, k_range_fn, kernel_parts
from .problem import D_M, D_N

BM = 128
BN = 128
BK = 8
THREADS = 256
ACC = 64  # 8x8 outputs per thread (local-array sizes: plain constants)
FRAG = 8  # A column / B row fragment per k
LD = 4  # elements of A (and of B) each thread loads per K step: 128 * 8 / 256
ROW = 132  # shared tile row: 128 floats + 4 of padding (rows stay 16-byte aligned); shapes: constants too
assert ACC == FRAG * FRAG and LD * THREADS == BM * BK == BN * BK and BM == BN < ROW
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_HALF = np.uint32(BM // 2)
_U16 = np.uint32(16)
_U8 = np.uint32(8)
UNROLL = 2  # k steps per iteration of the inner loop (as regblock's)
_UNROLL = np.uint32(UNROLL)
MAX_REGISTERS = 128  # ptxas's cap for the unrolled K step (2 blocks of 256 threads per SM)
assert BK == 8  # coalesced128's K step is written out as 8 outer products


def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    """regblock128's kernel for one specialisation."""
    return _kernel(False, False, a_map, b_map, store, ksize, epilogue, split_k)


def kernel_coalesced(a_map, b_map, store, ksize, epilogue, split_k=False):
    """coalesced128's kernel for one specialisation."""
    return _kernel(True, True, a_map, b_map, store, ksize, epilogue, split_k)


@device_function
def _outer_product(As, Bs, acc, ra, rb, p, ty4, tx4):
    """acc += A[:, p] B[p, :] for the thread's 8 rows and 8 columns, from the k-major shared tiles."""
    for u in range(4):
        ra[u] = As[p, ty4 + uint32(u)]
        ra[u + 4] = As[p, ty4 + _HALF + uint32(u)]
        rb[u] = Bs[p, tx4 + uint32(u)]
        rb[u + 4] = Bs[p, tx4 + _HALF + uint32(u)]
    for i in range(FRAG):
        for j in range(FRAG):
            acc[i * FRAG + j] += ra[i] * rb[j]


@functools.cache
def _kernel(coalesced, unrolled, a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)
    # coalesced128's load layouts (compile-time): "k8" 8 consecutive K of 4 outer indices per warp request, "s32"
    # 32 consecutive outer indices per request; neither: regblock128's
    a_k8 = coalesced and a_map in DENSE_K_A
    b_k8 = coalesced and b_map in DENSE_K_B
    a_s32 = coalesced and not a_contig_k
    b_s32 = coalesced and not b_contig_k

    @jit(max_registers=MAX_REGISTERS) if unrolled else jit
    def gemm_regblock128_kernel(a, b, c, aux, dims):
        As = cuda.shared.array((BK, ROW), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((BK, ROW), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(ACC, float32)
        ra = cuda.local.array(FRAG, float32)
        rb = cuda.local.array(FRAG, float32)
        la = cuda.local.array(LD, float32)  # tile of A in flight (global -> registers -> shared)
        lb = cuda.local.array(LD, float32)
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        if coalesced:  # warp tiles: warp w, lane l
            ty4 = uint32(t // U32 // U2 * _U16 + t % U32 // _U8 * U4)
            tx4 = uint32(t // U32 % U2 * U32 + t % _U8 * U4)
        else:
            ty4 = uint32(t // _U16 * U4)
            tx4 = uint32(t % _U16 * U4)
        for i in range(ACC):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop; so is the outer index of a
        # K-contiguous operand, whose state is computed here once.
        if a_k8:
            a_i = uint32(t // _U8)
            a_p = uint32(t % _U8)
        elif a_s32:
            a_p = uint32(t // U32)
            a_i = uint32(t % U32)
        elif a_contig_k:  # tile rows of 8 K indices, 2 threads per row
            a_i = uint32(t // U2)
            a_p = uint32(t % U2 * U4)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:  # tile rows of 128 M indices, 32 threads per row
            a_p = uint32(t // U32)
            a_i = uint32(t % U32 * U4)
        if b_k8:
            b_j = uint32(t // _U8)
            b_p = uint32(t % _U8)
        elif b_s32:
            b_p = uint32(t // U32)
            b_j = uint32(t % U32)
        elif b_contig_k:
            b_j = uint32(t // U2)
            b_p = uint32(t % U2 * U4)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // U32)
            b_j = uint32(t % U32 * U4)

        # Pipeline: iteration s loads tile s into registers (if any), multiplies tile s-1 (if any) from
        # shared memory, then stores tile s to shared memory. One load site and one compute site.
        k0 = k_begin
        while True:
            if k0 < k:
                if a_k8 or a_s32:  # outer index a_i + 32u
                    ai = a_inner(dims, uint32(k0 + a_p))
                    for u in range(LD):
                        la[u] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(32 * u))), ai)
                elif a_contig_k:
                    for u in range(LD):
                        la[u] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + a_p + uint32(u))))
                else:
                    ai = a_inner(dims, uint32(k0 + a_p))
                    for u in range(LD):
                        la[u] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(u))), ai)
                if b_k8 or b_s32:
                    bi = b_inner(dims, uint32(k0 + b_p))
                    for u in range(LD):
                        lb[u] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(32 * u))), bi)
                elif b_contig_k:
                    for u in range(LD):
                        lb[u] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p + uint32(u))))
                else:
                    bi = b_inner(dims, uint32(k0 + b_p))
                    for u in range(LD):
                        lb[u] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(u))), bi)
            if k0 > k_begin and unrolled:  # the K step written out: no loop, constant offsets
                _outer_product(As, Bs, acc, ra, rb, uint32(0), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(1), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(2), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(3), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(4), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(5), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(6), ty4, tx4)
                _outer_product(As, Bs, acc, ra, rb, uint32(7), ty4, tx4)
                cuda.syncthreads()
            elif k0 > k_begin:
                p0 = U0
                while p0 < _BK:
                    for q in range(UNROLL):
                        _outer_product(As, Bs, acc, ra, rb, uint32(p0 + uint32(q)), ty4, tx4)
                    p0 = uint32(p0 + _UNROLL)
                cuda.syncthreads()
            if k0 >= k:
                break
            for u in range(LD):
                if a_k8 or a_s32:
                    As[a_p, a_i + uint32(32 * u)] = la[u]
                elif a_contig_k:
                    As[a_p + uint32(u), a_i] = la[u]
                else:
                    As[a_p, a_i + uint32(u)] = la[u]
                if b_k8 or b_s32:
                    Bs[b_p, b_j + uint32(32 * u)] = lb[u]
                elif b_contig_k:
                    Bs[b_p + uint32(u), b_j] = lb[u]
                else:
                    Bs[b_p, b_j + uint32(u)] = lb[u]
            cuda.syncthreads()
            k0 = uint32(k0 + _BK)

        # ---- epilogue and masked store
        for i in range(FRAG):
            gi = uint32(m0 + ty4 + uint32(i // 4 * (BM // 2) + i % 4))
            if gi < m:
                row = out_row(dims, gi)
                for j in range(FRAG):
                    gj = uint32(n0 + tx4 + uint32(j // 4 * (BN // 2) + j % 4))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[i * FRAG + j])

    return gemm_regblock128_kernel


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, THREADS, kernel)
    return (cdiv(n, BN), cdiv(m, BM)), THREADS

