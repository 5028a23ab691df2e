"""GEMM version ``skinny``: for N <= 4 (a convolution with 1-3 output channels), and for small N with K in one
chunk (a 1->16 first layer's forward, K = 9, where the tiles would be mostly K padding). Mapped problems only
(``gemm_mapped``, ``gemm_split_k``): it has no dense launcher.

A thread owns one row of C and SK_N = 4 columns in registers; a block is SK_THREADS consecutive rows. Per K chunk
of SK_KC indices the block stages B's (SK_KC, SK_N) slice in shared memory (one element per thread) and every
thread streams its own row of A from global memory: consecutive threads are consecutive pixels, so the im2col
reads of a warp are coalesced, and each element of A is read once per column group. The B reads are broadcasts.
The A loader zero-fills beyond K, so the chunk loop needs no bounds test and its SK_UNROLL loads are in flight
together. N > SK_N runs ceil(N / SK_N) column groups along grid y, each re-reading A."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, check_fixed_block
from ..jit import jit
from .mappings import SMEM_ALIGN, U0, k_range_fn, kernel_parts
from .problem import D_M, D_N

SK_THREADS = 128
SK_N = 4  # columns of C per thread (a local-array size: a plain constant)
SK_KC = 32  # K indices per staged B chunk: SK_KC * SK_N = SK_THREADS, one element per thread
SK_UNROLL = 8  # K indices per trip of the unrolled inner loop
assert SK_KC * SK_N == SK_THREADS and SK_KC % SK_UNROLL == 0
_SK_UNROLL = np.uint32(SK_UNROLL)
_SK_THREADS = np.uint32(SK_THREADS)
_SK_N = np.uint32(SK_N)
_SK_KC = np.uint32(SK_KC)


@functools.cache
def kernel(a_map, b_map, store, ksize, epilogue, split_k=False):
    (_, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = kernel_parts(a_map, b_map, store, ksize, epilogue)
    k_range = k_range_fn(split_k)

    @jit
    def gemm_skinny_kernel(a, b, c, aux, dims):
        Bs = cuda.shared.array((SK_KC, SK_N), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(SK_N, float32)
        av = cuda.local.array(SK_UNROLL, float32)  # SK_UNROLL elements of A in flight
        m = dims[D_M]
        n = dims[D_N]
        k_begin, k = k_range(dims)
        t = uint32(cuda.threadIdx.x)
        i = uint32(cuda.blockIdx.x * _SK_THREADS + t)  # the thread's row of C (rows run along grid x)
        n0 = uint32(cuda.blockIdx.y * _SK_N)
        for j in range(SK_N):
            acc[j] = float32(0.0)
        ao = a_outer(dims, i)  # the row state, once (a_get zero-fills rows >= M: those threads only help load B)
        # B chunk coordinates of this thread, along B's contiguous axis
        if b_contig_k:
            b_j = uint32(t // _SK_KC)
            b_p = uint32(t % _SK_KC)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _SK_N)
            b_j = uint32(t % _SK_N)
        k0 = k_begin
        while k0 < k:
            if b_contig_k:
                Bs[b_p, b_j] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p)))
            else:
                Bs[b_p, b_j] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j)), b_inner(dims, uint32(k0 + b_p)))
            cuda.syncthreads()
            # a split's chunk is whole SK_KC chunks (k_len is a multiple of the K step); past K, a_get gives 0.
            # SK_UNROLL loads of A first, then their FMAs: the loads are issued back to back (NOTES.md).
            q0 = U0
            while q0 < _SK_KC:
                for u in range(SK_UNROLL):
                    av[u] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + q0 + uint32(u))))
                for u in range(SK_UNROLL):
                    for j in range(SK_N):
                        acc[j] += av[u] * Bs[q0 + uint32(u), j]
                q0 = uint32(q0 + _SK_UNROLL)
            cuda.syncthreads()
            k0 = uint32(k0 + _SK_KC)
        if i < m:
            row = out_row(dims, i)
            for j in range(SK_N):
                gj = uint32(n0 + uint32(j))
                if gj < n:
                    finish(c, aux, dims, row, gj, acc[j])

    return gemm_skinny_kernel


def config(op, block, m, n, kernel):
    check_fixed_block(op, block, SK_THREADS, kernel)
    return (cdiv(m, SK_THREADS), cdiv(n, SK_N)), SK_THREADS

