"""Operand mappings of a batched GEMM: one launch runs Z independent GEMMs C_z = A_z @ B_z, GEMM z on grid z
(``gemm.batched`` binds the launch; the kernels are unchanged, the mappings read ``cuda.blockIdx.z``).

The problem's dims are (M, N, K, S, S_mul, S_shift, K_total) (``batched_problem``; S_mul, S_shift: the magic
numbers of a division by S): each of the Z / S stored operands is K_total deep, and its K is split into S chunks of
K = k_len indices (S = 1: no split), grid z = b * S + s running chunk s of operand pair b (a fixed order:
``conv.winograd`` sums the S partial products of each b in s order afterwards).
Operands are flat C-contiguous buffers (32-bit element offsets) of float32, or of BF16 bits (uint16, a Winograd
transform's BF16 storage: ``mma.bf16_float`` widens each element to the float32 it stands for, exactly; the
kernel is specialised on the buffer's dtype):

* ``batch_t`` (A): a (Z/S, K_total, M), A_z[i, p] = a[b, s*k_len + p, i] (contiguous along M);
* ``batch_k`` (A): a (Z/S, M, K_total), A_z[i, p] = a[b, i, s*k_len + p] (contiguous along K: coalesced128's
  8-K loads, mappings.DENSE_K_A);
* ``batch`` (B): b (Z/S, K_total, N), B_z[p, j] = b[b, s*k_len + p, j] (contiguous along N);
* ``batch_t_k`` (B): b (Z/S, N, K_total), B_z[p, j] = b[b, j, s*k_len + p] (contiguous along K, DENSE_K_B);
* ``batch_t`` (store): c (Z, N, M), C_z[i, j] -> c[z, j, i]; the plain ``partial`` store (mappings) is the
  (Z, M, N) one: C_z[i, j] -> c[z, i, j].

BF16 pairs (``tensor_bf16`` only; ``gemm.batched`` picks them for a uint16 operand that allows them and passes
its buffer viewed as uint32): the ``_bf16x2`` twins of the four A / B mappings (``BATCH_PAIR_MAPS``) return a
uint32 word of two BF16, the bits the tensor tile holds, with no widening and rounding again:
* ``batch_k_bf16x2`` / ``batch_t_k_bf16x2`` (contiguous along K; K_total even): the word of K p, p+1 (p even) of
  one outer index, low half p;
* ``batch_t_bf16x2`` / ``batch_bf16x2`` (contiguous along M or N; that side even): the word of outer indices i,
  i+1 (i even) at one K, low half i (``operand_tiles`` interleaves two such words into two K pairs).

The loaders zero-fill outside the chunk (p >= k_len) and outside the operand (s*k_len + p >= K_total), so a
tile never reads the next chunk. The split-K kernels (``split_k``) use grid z for their own chunks: a batched
launch runs the plain (split_k=False) kernels, and its split is this explicit one.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint32

from ..mma import bf16_float
from .indexing import F0, U0, U1, Loader, _divmod, _index1, device_function
from .problem import D_K, D_M, D_N, GemmProblem, fast_divmod_constants

__all__ = ["BATCH_A_MAPS", "BATCH_B_MAPS", "BATCH_FIELDS", "BATCH_PAIR_MAPS", "BATCH_STORES", "batch_a_loader",
           "batch_b_loader", "batch_pair_loader", "batch_store_fns", "batched_problem", "pair_map"]

BATCH_A_MAPS = ("batch_t", "batch_k")
BATCH_B_MAPS = ("batch", "batch_t_k")
BATCH_STORES = ("batch_t",)
PAIR = "_bf16x2"  # the suffix of a mapping reading BF16 pairs (uint32 words)
BATCH_PAIR_MAPS = {f"{kind}{PAIR}": (side, kind) for side, kinds in (("a", BATCH_A_MAPS), ("b", BATCH_B_MAPS))
                   for kind in kinds}
_PAIR_ALONG_K = ("batch_k", "batch_t_k")  # the word is two K; the others' two outer indices
BATCH_FIELDS = ("splits", "splits_mul", "splits_shift", "k_total")
D_SPLITS, D_SPLITS_MUL, D_SPLITS_SHIFT, D_KTOT = 3, 4, 5, 6


def batched_problem(m: int, n: int, k_len: int, splits: int, k_total: int) -> GemmProblem:
    """dims (M, N, k_len, S, S_mul, S_shift, K_total) of a batched GEMM whose K_total is split into `splits` chunks of
    k_len (every chunk non-empty: ``gemm.batched.batch_chunks``)."""
    return GemmProblem(int(m), int(n), int(k_len), (int(splits), *fast_divmod_constants(int(splits)), int(k_total)))


@device_function
def _chunk(dims):
    """(operand pair b, first K index s*k_len of this block's chunk) of grid z = b*S + s."""
    b, s = _divmod(uint32(cuda.blockIdx.z), dims[D_SPLITS], dims[D_SPLITS_MUL], dims[D_SPLITS_SHIFT])
    return b, uint32(s * dims[D_K])


def batch_a_loader(kind):
    """op(A)[i, p] of a batched A mapping; outer i < M, inner p < k_len."""
    if kind == "batch_t":  # a (Z/S, K_total, M)

        @device_function
        def outer(dims, i):
            b, k0 = _chunk(dims)
            return i, uint32(uint32(b * dims[D_KTOT] + k0) * dims[D_M] + i), k0

        @device_function
        def get(a, dims, o, p):
            if o[0] < dims[D_M] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return bf16_float(a[uint32(o[1] + p * dims[D_M])])
            return F0

        return Loader(False, outer, _index1, get)
    if kind == "batch_k":  # a (Z/S, M, K_total)

        @device_function
        def outer(dims, i):
            b, k0 = _chunk(dims)
            return i, uint32(uint32(b * dims[D_M] + i) * dims[D_KTOT] + k0), k0

        @device_function
        def get(a, dims, o, p):
            if o[0] < dims[D_M] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return bf16_float(a[uint32(o[1] + p)])
            return F0

        return Loader(True, outer, _index1, get)
    raise ValueError(f"gemm: unknown batched A mapping {kind!r}; choose from {BATCH_A_MAPS}")


def batch_b_loader(kind):
    """op(B)[p, j] of a batched B mapping; outer j < N, inner p < k_len."""
    if kind == "batch":  # b (Z/S, K_total, N)

        @device_function
        def outer(dims, j):
            b, k0 = _chunk(dims)
            return j, uint32(uint32(b * dims[D_KTOT] + k0) * dims[D_N] + j), k0

        @device_function
        def get(b, dims, o, p):
            if o[0] < dims[D_N] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return bf16_float(b[uint32(o[1] + p * dims[D_N])])
            return F0

        return Loader(False, outer, _index1, get)
    if kind == "batch_t_k":  # b (Z/S, N, K_total)

        @device_function
        def outer(dims, j):
            b, k0 = _chunk(dims)
            return j, uint32(uint32(b * dims[D_N] + j) * dims[D_KTOT] + k0), k0

        @device_function
        def get(b, dims, o, p):
            if o[0] < dims[D_N] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return bf16_float(b[uint32(o[1] + p)])
            return F0

        return Loader(True, outer, _index1, get)
    raise ValueError(f"gemm: unknown batched B mapping {kind!r}; choose from {BATCH_B_MAPS}")


def batch_store_fns(kind):
    """(row(dims, i) -> state, at(dims, state, j) -> index of C_z[i, j]) of a batched store."""
    if kind == "batch_t":  # c (Z, N, M)

        @device_function
        def row(dims, i):
            return uint32(uint32(cuda.blockIdx.z) * dims[D_N] * dims[D_M] + i)

        @device_function
        def at(dims, base, j):
            return uint32(base + j * dims[D_M])

        return row, at
    raise ValueError(f"gemm: unknown batched store {kind!r}; choose from {BATCH_STORES}")


def pair_map(side: str, kind: str, outer: int, k_total: int) -> str | None:
    """The ``_bf16x2`` twin of batched mapping `kind` for a uint16 operand on `side` ("a": outer = M, "b": N), or
    None where its pairs could straddle: K_total odd (pairs along K) or the outer side odd (pairs along M or N)."""
    along = k_total if kind in _PAIR_ALONG_K else outer
    return f"{kind}{PAIR}" if along % 2 == 0 else None


_LO16 = np.uint32(0xFFFF)
_HI16 = np.uint32(0xFFFF0000)
_U16 = np.uint32(16)


@device_function
def interleave(lo, hi, e):
    """The K pair (low: word `lo`'s half e, high: word `hi`'s half e) of two words of an outer pair at K p, p+1."""
    if e == 0:
        return uint32((lo & _LO16) | (hi << _U16))
    return uint32((lo >> _U16) | (hi & _HI16))


def batch_pair_loader(kind):
    """The Loader of a ``_bf16x2`` mapping: outer as its twin's, get(x, dims, o, p) -> the uint32 word (zero outside
    the chunk and the operand), x the uint16 buffer viewed as uint32."""
    side, twin = BATCH_PAIR_MAPS[kind]
    loader = batch_a_loader(twin) if side == "a" else batch_b_loader(twin)
    d_outer = D_M if side == "a" else D_N
    if twin in _PAIR_ALONG_K:

        @device_function
        def get(x, dims, o, p):  # p even, K_total even: p + 1 is inside whenever p is
            if o[0] < dims[d_outer] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return x[uint32(o[1] + p) >> U1]
            return U0
    else:

        @device_function
        def get(x, dims, o, p):  # o[0] even, the outer side even: o[0] + 1 is inside whenever o[0] is
            if o[0] < dims[d_outer] and p < dims[D_K] and uint32(o[2] + p) < dims[D_KTOT]:
                return x[uint32(o[1] + p * dims[d_outer]) >> U1]
            return U0

    return Loader(loader.contig_k, loader.outer, loader.inner, get)
