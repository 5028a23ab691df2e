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

from .mappings import DENSE_K_A, DENSE_K_B, U0, U32, device_function, kernel_parts

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

    @device_function
    def first(t):
        if k_rows:
            lane = uint32(t % U32)
            return uint32(t // U32 * kp_u + lane // lanes_per_row), uint32(lane % lanes_per_row * kp_u)
        return uint32(t % rows), uint32(t // rows * k_each)

    @device_function
    def start(dims, base, c0):
        if k_rows:
            return U0
        return outer(dims, uint32(base + c0))

    @device_function
    def load(x, dims, k0, base, c0, c1, state, regs):
        if k_rows:
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
        return c0, uint32(c1 // kp_u + v)

    return first, start, load, place
