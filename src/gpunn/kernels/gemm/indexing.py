"""Index arithmetic every GEMM mapping is built from: uint32 constants, inlined device functions, the magic-number
division, the conv pixel and patch decompositions, the im2col element, and the ``Loader`` record of an operand
mapping (``mappings``, ``mappings_up`` and the kernels import these; this module imports no mapping)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32, uint64

from gpunn import device

from .problem import (
    D_GHW,
    D_GHW_MUL,
    D_GHW_SHIFT,
    D_GW,
    D_GW_MUL,
    D_GW_SHIFT,
    D_OUT_CHW,
    D_PAD,
    D_SRC_CHW,
    D_SRC_H,
    D_SRC_HW,
    D_SRC_W,
)

# Index arithmetic. numba widens every integer operation to 64 bits (uint32 + uint32 -> uint64) and, for
# signed indices, adds a negative-index wraparound select to each array access. Wrapping an expression in
# uint32(...) truncates it, and LLVM then narrows the whole expression back to 32-bit instructions;
# unsigned indices need no wraparound. Constants are np.uint32 so that they do not widen what they touch.
# The conv mappings also rely on the wrap: a window origin above or left of the image is oh - pad mod 2^32,
# huge, so one unsigned compare (ih < H) rejects both sides of the padding.
U0 = np.uint32(0)
U1 = np.uint32(1)
U2 = np.uint32(2)
U4 = np.uint32(4)
U32 = np.uint32(32)
SHIFT32 = np.uint64(32)
F0 = float32(0.0)
# 16-byte aligned shared tiles let NVVM read 4 consecutive floats as one ld.shared.v4; the simulator rejects
# any alignment argument (None means the default there).
SMEM_ALIGN = None if device.simulator_enabled() else 16


def device_function(fn):
    """A device function; on a GPU inlined at the NVVM level (the simulator has no forceinline)."""
    if device.simulator_enabled():
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


@device_function
def _divmod(x, d, mul, shift):
    """(x // d, x % d) for x < 2^31 with the constants of fast_divmod_constants(d)."""
    hi = uint32((uint64(x) * uint64(mul)) >> SHIFT32)
    q = uint32(uint32(hi + x) >> shift)
    return q, uint32(x - q * d)


@device_function
def _pixel(dims, r):
    """Pixel r = (n, oh, ow) of the grid: (r, offset of its window origin (oh - pad, ow - pad) in src,
    oh - pad, ow - pad), all mod 2^32. Two multiplications by magic numbers instead of two divisions."""
    n, s = _divmod(r, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    oh, ow = _divmod(s, dims[D_GW], dims[D_GW_MUL], dims[D_GW_SHIFT])
    ohp = uint32(oh - dims[D_PAD])
    owp = uint32(ow - dims[D_PAD])
    return r, uint32(n * dims[D_SRC_CHW] + ohp * dims[D_SRC_W] + owp), ohp, owp


@device_function
def _channel_pixel(dims, q):
    """Column q = (n, s) of an NCHW tensor seen as (C, N*gh*gw): (q, offset of [n, 0, s])."""
    n, s = _divmod(q, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    return q, uint32(n * dims[D_OUT_CHW] + s)


@functools.cache
def _patch_fns(ksize):
    """Decompositions of a patch index (c, kh, kw) of a ksize x ksize kernel: divisions by constants."""
    kk = np.uint32(ksize * ksize)
    ks = np.uint32(ksize)
    last = np.uint32(ksize - 1)

    @device_function
    def patch(dims, q):
        """Column q = (c, kh, kw) of the im2col matrix: (q, offset of (c, kh, kw) from the window origin,
        kh, kw)."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        kw = uint32(rem - kh * ks)
        return q, uint32(c * dims[D_SRC_HW] + kh * dims[D_SRC_W] + kw), kh, kw

    @device_function
    def weight_index(q):
        """q = (c, kh, kw) -> (c, kh, kw)."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return c, kh, uint32(rem - kh * ks)

    @device_function
    def flipped_index(q):
        """q = (c, kh, kw) -> (c, k-1-kh, k-1-kw): the spatially flipped kernel."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return c, uint32(last - kh), uint32(last - uint32(rem - kh * ks))

    return patch, weight_index, flipped_index


@device_function
def _im2col_get(x, dims, pix, pat):
    """x_flat[n, c, oh + kh - pad, ow + kw - pad], 0 in the padding (pix from _pixel, pat from patch)."""
    ih = uint32(pix[2] + pat[2])
    iw = uint32(pix[3] + pat[3])
    if ih < dims[D_SRC_H] and iw < dims[D_SRC_W]:
        return x[uint32(pix[1] + pat[1])]
    return F0


@device_function
def _index1(dims, i):
    """The state of a dense index: the index itself."""
    return i


class Loader(NamedTuple):
    """One operand mapping (see the module docstring)."""

    contig_k: bool  # consecutive K indices are (about) consecutive in memory: a thread's outer index is fixed
    outer: object
    inner: object
    get: object
