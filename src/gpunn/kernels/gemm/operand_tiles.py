"""Tile loads of the tensor-core GEMM versions: one operand's K step (32 K of ``rows`` outer indices: M of A, N of B)
from global memory into a thread's registers, and where each register goes in the shared tile, for ``threads``
threads. Inputs are float32 in memory whatever the format (or, through the batched mappings, BF16 bits that the
loader widens to float32: ``mappings_batched``); a word of the tile holds kp K (TF32 1, BF16 2).

Two paths, by the operand's mapping (compile time):

* K rows (``DENSE_K_A`` / ``DENSE_K_B``: dense, contiguous along K, a plain outer index): a warp request reads kp
  whole rows of 32 K (lane = K, or two consecutive K for BF16); a thread's u-th request is row
  ``first + u x round_rows``, round_rows = kp x warps;
* outer (any other mapping: contiguous along M or N, im2col, ...): a thread owns outer index ``t % rows`` (its state
  computed once, before the K loop) and loads 32 / groups consecutive K of it (groups = threads / rows); a warp
  request reads 32 consecutive outer indices.

A ``_bf16x2`` batched mapping (BF16 pairs in memory: ``mappings_batched``) loads words, not values: on the K-row
path one word a request (the lane's two K); on the outer path a thread owns an outer pair (2 (t % rows/2), + 1)
and 32 / groups consecutive K of it, loads one word (both outer indices) a K and interleaves each two into the
two K pairs (``interleave``); the words go to the tile as they are (``pairs``), no rounding.

Every thread holds ``per_thread`` = rows x 32 / threads values, ``per_thread / kp`` words, word v at (row, word) of
the tile given by ``place``. ``OperandTile(...).functions()`` -> (first, start, load, place), device functions:
``first(t) -> (c0, c1)`` the thread's coordinates; ``start(dims, base, c0)`` the outer state of the outer path;
``load(x, dims, k0, base, c0, c1, state, regs)``; ``place(c0, c1, v) -> (row, word)``. Also the formats'
facts both families share: ``FORMATS``, ``shared_word``, ``format_factory``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32, uint32

from .mappings import DENSE_K_A, DENSE_K_B, U0, U2, U32, device_function, kernel_parts
from .mappings_batched import BATCH_PAIR_MAPS, interleave

BK = 32  # K of a tile
FORMATS = ("tf32", "bf16")  # the input formats of the tensor-core versions


def shared_word(fmt: str):
    """(numba type of a shared-memory word, K indices it holds): one TF32 held in a float32, or two BF16 in a
    uint32."""
    return (uint32, 2) if fmt == "bf16" else (float32, 1)


def format_factory(family: str, fmt: str, build):
    """``build`` for one input format: ``(a_map, b_map, store, ksize, epilogue, split_k=False) -> kernel``;
    ValueError naming the formats otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"{family} GEMM: unknown format {fmt!r}; choose from {FORMATS}")
    return functools.partial(build, fmt)


@dataclass(frozen=True)
class OperandTile:
    side: str  # "a" or "b"
    mapping: str
    ksize: int
    fmt: str  # "tf32" or "bf16"
    rows: int
    threads: int

    @property
    def kp(self) -> int:
        return shared_word(self.fmt)[1]

    @property
    def pairs(self) -> bool:
        """Whether the operand's memory holds BF16 pairs (a ``_bf16x2`` mapping): the loads give words."""
        return self.mapping in BATCH_PAIR_MAPS

    @property
    def k_rows(self) -> bool:
        """Whether the operand takes the K-row path."""
        return self.mapping in (DENSE_K_A if self.side == "a" else DENSE_K_B)

    @property
    def per_thread(self) -> int:
        return self.rows * BK // self.threads

    @property
    def words(self) -> int:
        return self.per_thread // self.kp

    def __post_init__(self):
        if self.threads % self.rows or self.threads % 32 or (self.rows * self.kp) % (self.threads // 32) \
                or self.per_thread % self.kp:
            raise ValueError(f"OperandTile: {self.rows} rows do not split over {self.threads} threads")
        if self.pairs and (self.fmt != "bf16" or (not self.k_rows and (
                self.rows % 2 or self.threads % (self.rows // 2) or (BK * self.rows // 2 // self.threads) % 2))):
            raise ValueError(f"OperandTile: BF16 pairs ({self.mapping}) need the bf16 format and, outer pairs, "
                             f"{self.rows} rows in pairs over {self.threads} threads")

    def functions(self):
        return _functions(self)


@functools.cache
def _functions(tile: OperandTile):
    parts = kernel_parts(tile.mapping if tile.side == "a" else "dense", tile.mapping if tile.side == "b" else "dense",
                         "dense", tile.ksize, "none")
    _, outer, inner, get = parts[0:4] if tile.side == "a" else parts[4:8]
    kp = tile.kp
    k_rows = tile.k_rows
    per_thread = tile.per_thread
    requests = per_thread // kp  # K-row path: requests of kp K a thread makes
    lanes_per_row = np.uint32(32 // kp)
    round_rows = np.uint32(kp * tile.threads // 32)
    rows = np.uint32(tile.rows)
    k_each = np.uint32(per_thread)  # outer path: consecutive K a thread loads
    kp_u = np.uint32(kp)
    pairs = tile.pairs
    half = np.uint32(tile.rows // 2)  # outer pairs (BF16 pairs, outer path)
    k_pair_each = tile.rows // 2 * BK // tile.threads  # ... and the consecutive K each of their threads loads
    k_pair_each_u = np.uint32(k_pair_each)

    @device_function
    def first(t):
        if k_rows:
            lane = uint32(t % U32)
            return uint32(t // U32 * kp_u + lane // lanes_per_row), uint32(lane % lanes_per_row * kp_u)
        if pairs:
            return uint32(t % half * U2), uint32(t // half * k_pair_each_u)
        return uint32(t % rows), uint32(t // rows * k_each)

    @device_function
    def start(dims, base, c0):
        if k_rows:
            return U0
        return outer(dims, uint32(base + c0))

    @device_function
    def load(x, dims, k0, base, c0, c1, state, regs):
        if pairs and k_rows:  # one word (K p, p + 1) a request
            for u in range(requests):
                r = outer(dims, uint32(base + c0 + uint32(u) * round_rows))
                regs[u] = get(x, dims, r, inner(dims, uint32(k0 + c1)))
        elif pairs:  # words of the outer pair at K p and p + 1 -> the K pairs of either outer index
            for u in range(k_pair_each // 2):
                lo = get(x, dims, state, inner(dims, uint32(k0 + c1 + uint32(2 * u))))
                hi = get(x, dims, state, inner(dims, uint32(k0 + c1 + uint32(2 * u + 1))))
                regs[2 * u] = interleave(lo, hi, 0)
                regs[2 * u + 1] = interleave(lo, hi, 1)
        elif k_rows:
            for u in range(requests):
                r = outer(dims, uint32(base + c0 + uint32(u) * round_rows))
                for e in range(kp):
                    regs[kp * u + e] = get(x, dims, r, inner(dims, uint32(k0 + c1 + uint32(e))))
        else:
            for u in range(per_thread):
                regs[u] = get(x, dims, state, inner(dims, uint32(k0 + c1 + uint32(u))))

    @device_function
    def place(c0, c1, v):
        if k_rows:
            return uint32(c0 + v * round_rows), uint32(c1 // kp_u)
        if pairs:  # word v: outer index c0 + v % 2, K pair v // 2
            return uint32(c0 + v % U2), uint32(c1 // kp_u + v // U2)
        return c0, uint32(c1 // kp_u + v)

    return first, start, load, place
