"""``gemm_batched``: Z independent GEMMs of one shape in one launch, grid (x, y, Z), through the batched operand
mappings of ``mappings_batched`` (the GEMM kernels unchanged: the mappings pick the GEMM by ``cuda.blockIdx.z``).
An explicit K split composes with the batch: grid z = b * S + s, chunk s of pair b, partial products stored
apart (``partial`` or ``batch_t``) for the caller's fixed-order sum.

An operand may be stored as BF16 bits (uint16) for the version that rounds its inputs to BF16 anyway
(``tensor_bf16``; ``conv.winograd``'s ``storage="bf16"``): the kernel reads the buffer as uint32 words of BF16 pairs
through the mapping's ``_bf16x2`` twin and puts them in its tile as they are, where the pairs cannot straddle
(``mappings_batched.pair_map``); else it reads each element back as the float32 it stands for and rounds it again
to the same bits. Either way the product is bit for bit the one of the float32 operand the bits were rounded
from."""

from __future__ import annotations

import numpy as np

from ..common import cdiv, epilogue_args
from ..launch import Launch, bind
from .mappings_batched import BATCH_A_MAPS, BATCH_B_MAPS, batched_problem, pair_map
from .problem import U32_LIMIT
from .versions import lookup

__all__ = ["BATCH_VERSIONS", "MAX_BATCH", "batch_chunks", "gemm_batched"]

# the versions whose kernels leave grid z to the mappings (split-K's chunks come from k_range_fn, not used here)
BATCH_VERSIONS = ("naive", "tiled16", "regblock", "regblock128", "coalesced128", "tensor_tf32", "tensor_bf16")
MAX_BATCH = 65535  # grid z limit: batches * splits
_STORES = ("batch_t", "partial")


def batch_chunks(k_total: int, splits: int, k_step: int) -> tuple[int, int]:
    """(splits used, k_len): K_total in chunks of ceil(K_total / splits) rounded up to the K step, every one
    non-empty (fewer than asked where the rounding covers K_total sooner), as ``split_k.split_k_chunks``."""
    k_len = cdiv(cdiv(k_total, splits), k_step) * k_step
    return cdiv(k_total, k_len), k_len


def gemm_batched(version, m, n, k_total, batches, a, b, out, *, a_map, b_map, store, splits=1, aux=None,
                 epilogue="none", block=None, stream=0, launch=True, op=None, name=None) -> Launch:
    """C_z = A_z @ B_z for z < batches * S (S the splits used, ``batch_chunks``): A_z (m, k_len), B_z (k_len, n)
    read through the batched mappings from flat float32 (tensor_bf16: or BF16-bit uint16) buffers a and b (shapes:
    ``mappings_batched``), C_z stored through `store` (``batch_t``: out (Z, n, m); ``partial``: out (Z, m, n)).
    The caller sizes out for ``batch_chunks(k_total, splits, k_step)[0]`` splits. ``block``: the version's (None: its
    default)."""
    op = op or "gemm_batched"
    if version not in BATCH_VERSIONS:
        raise ValueError(f"{op}: version {version!r} cannot run batched; choose from {BATCH_VERSIONS}")
    spec = lookup(version, op)
    if a_map not in BATCH_A_MAPS or b_map not in BATCH_B_MAPS or store not in _STORES:
        raise ValueError(f"{op}: batched mappings are A {BATCH_A_MAPS}, B {BATCH_B_MAPS}, store {_STORES}; got "
                         f"{a_map!r}, {b_map!r}, {store!r}")
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or splits < 1:
        raise ValueError(f"{op}: splits must be a positive int, got {splits!r}")
    for what, x in (("a", a), ("b", b)):
        if getattr(x, "dtype", None) == np.uint16 and spec.inputs != "bf16":
            raise ValueError(f"{op}: operand {what} holds BF16 bits (uint16); only a version rounding to BF16 "
                             f"(tensor_bf16) reads them, got {version!r}")
    splits, k_len = batch_chunks(int(k_total), int(splits), spec.k_step)
    z = int(batches) * splits
    if not 1 <= z <= MAX_BATCH:
        raise ValueError(f"{op}: batches x splits = {z} must lie in [1, {MAX_BATCH}]")
    for what, size in (("a", int(batches) * m * k_total), ("b", int(batches) * k_total * n), ("out", z * m * n)):
        if size >= U32_LIMIT:
            raise ValueError(f"{op}: operand {what} has {size} elements; flat offsets must fit in 31 bits")
    problem = batched_problem(m, n, k_len, splits, k_total)
    if aux is None:
        aux = epilogue_args(op)[1]
    a, a_map = _pairs(a, "a", a_map, m, k_total)
    b, b_map = _pairs(b, "b", b_map, n, k_total)
    kernel = spec.kernel(a_map, b_map, store, 1, epilogue)
    grid, threads = spec.config(op, spec.block if block is None else block, m, n, kernel)
    name = name or f"{op}[{version},{a_map},{b_map}->{store},{batches}x{splits}]"
    return bind(kernel, (*grid, z), threads, (a, b, out, aux, problem.dims), stream, launch, name)


def _pairs(x, side, kind, outer, k_total):
    """(buffer, mapping) the kernel reads: a uint16 operand as uint32 words through the ``_bf16x2`` twin where its
    pairs cannot straddle (and its size is even), else as it is."""
    if getattr(x, "dtype", None) != np.uint16 or x.size % 2:
        return x, kind
    twin = pair_map(side, kind, outer, k_total)
    return (x, kind) if twin is None else (x.view(np.uint32), twin)
