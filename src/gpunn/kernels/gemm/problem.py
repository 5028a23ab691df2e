"""The problem a GEMM kernel is given: M, N, K and the geometry of the convolution mappings as one tuple of
uint32 (``GemmProblem.dims``), and the operand checks of the dense launchers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common import shape
from ..launch import check_device_array

__all__ = ["CONV_FIELDS", "U32_LIMIT", "GemmProblem", "conv_problem", "fast_divmod_constants", "gemm_shapes"]

U32_LIMIT = 2**31  # every index and every flat offset must stay below this (uint32 arithmetic, see below)

# Fields of ``GemmProblem.dims`` after (M, N, K) for the convolution mappings: the spatial grid (gh, gw) the
# pixel index (n, oh, ow) runs over, with the magic numbers of a division by gh*gw and by gw; the tensor the
# im2col mappings read (src: C, H, W); the zero padding (mod 2^32: negative in the backward-data GEMM when
# p > k - 1); and out_chw = C*gh*gw of the NCHW tensor on the pixel grid (the ``channels`` operand and the
# ``nchw`` store).
CONV_FIELDS = ("ghw", "ghw_mul", "ghw_shift", "gw", "gw_mul", "gw_shift", "src_chw", "src_hw", "src_h",
               "src_w", "pad", "out_chw")
D_M, D_N, D_K = 0, 1, 2
(D_GHW, D_GHW_MUL, D_GHW_SHIFT, D_GW, D_GW_MUL, D_GW_SHIFT, D_SRC_CHW, D_SRC_HW, D_SRC_H, D_SRC_W, D_PAD,
 D_OUT_CHW) = range(3, 3 + len(CONV_FIELDS))


@dataclass(frozen=True)
class GemmProblem:
    """M, N, K and the extra geometry the operand mappings read (``CONV_FIELDS`` for the conv mappings)."""

    m: int
    n: int
    k: int
    geometry: tuple = ()

    def __post_init__(self):
        if min(self.m, self.n, self.k) < 1 or max(self.m, self.n, self.k) >= U32_LIMIT:
            raise ValueError(f"gemm: M, N, K = {self.m}, {self.n}, {self.k} must lie in [1, 2^31)")

    @property
    def dims(self) -> tuple:
        """The kernel argument: (M, N, K, *geometry) as uint32 (geometry taken mod 2^32)."""
        return tuple(np.uint32(int(v) % 2**32) for v in (self.m, self.n, self.k, *self.geometry))


def fast_divmod_constants(d: int) -> tuple[int, int]:
    """(mul, shift) with x // d == (umulhi(x, mul) + x) >> shift for every 0 <= x < 2^31 (1 <= d < 2^31).

    The round-up method of Granlund and Montgomery as CUTLASS's FastDivmod writes it: shift = ceil(log2 d),
    mul = 2^32 * (2^shift - d) // d + 1 < 2^32. A division by a runtime divisor is a ~20-instruction
    subroutine; this is a mul.hi, an add and a shift."""
    if not 1 <= d < U32_LIMIT:
        raise ValueError(f"fast_divmod_constants: divisor {d} must lie in [1, 2^31)")
    shift = (d - 1).bit_length()
    return (2**32 * (2**shift - d)) // d + 1, shift


def conv_problem(m, n, k, src_chw, grid_hw, pad, out_channels) -> GemmProblem:
    """A GEMM over a convolution: ``src_chw`` the (C, H, W) of the tensor the im2col mappings read,
    ``grid_hw`` the (H, W) of the pixel grid the GEMM's pixel index (n, oh, ow) runs over, ``pad`` its zero
    padding (may be negative), ``out_channels`` the C of the NCHW tensor on that grid (the ``channels``
    operand, the ``nchw`` store)."""
    c, h, w = (int(v) for v in src_chw)
    gh, gw = (int(v) for v in grid_hw)
    geometry = (gh * gw, *fast_divmod_constants(gh * gw), gw, *fast_divmod_constants(gw), c * h * w, h * w,
                h, w, int(pad), int(out_channels) * gh * gw)
    return GemmProblem(int(m), int(n), int(k), geometry)


def gemm_shapes(a, b, out, trans_a=False, trans_b=False, bias=None, relu_mask=None, op="gemm", dtype=np.float32):
    """Validate the operands (``a`` and ``b`` of ``dtype``, the rest float32) and return ``(M, N, K)``; raise
    ``ValueError`` naming the shapes."""
    for name, x in (("a", a), ("b", b), ("out", out)):
        check_device_array(op, name, x, 2, dtype if name != "out" else np.float32)
    what = (
        f"{op}: a{shape(a)}{'^T' if trans_a else ''} @ b{shape(b)}{'^T' if trans_b else ''}"
        f" -> out{shape(out)}"
    )
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    m, n, k, kb = int(m), int(n), int(k), int(kb)
    if k != kb:
        raise ValueError(f"{what}: inner dimensions differ ({k} != {kb})")
    if shape(out) != (m, n):
        raise ValueError(f"{what}: out must be ({m}, {n})")
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        if shape(bias) != (n,):
            raise ValueError(f"{what}: bias must be ({n},), got {shape(bias)}")
    if relu_mask is not None:
        check_device_array(op, "relu_mask", relu_mask, 2)
        if shape(relu_mask) != (m, n):
            raise ValueError(f"{what}: relu_mask must have out's shape ({m}, {n}), got {shape(relu_mask)}")
    if max(m, n, k) >= U32_LIMIT:
        raise ValueError(f"{what}: dimensions must fit in int32")
    return m, n, k

