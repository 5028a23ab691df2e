"""Operand mappings of convolutions whose input is a nearest-neighbour 2x upsampled map, read without
materialising it (``gpunn.kernels.conv.upsampled`` builds the conv passes on them).

The ``src`` fields of ``GemmProblem.dims`` (``problem.CONV_FIELDS``) keep their meaning: the tensor the loader
reads, here the map BEFORE the upsample, x (C, H, W). The upsampled map u = up(x) (C, 2H, 2W) is virtual:

* ``im2col_up2`` (A): the im2col matrix of u, rows (n, oh, ow) of the output grid, columns (c, kh, kw):
  u[n, c, oh + kh - pad, ow + kw - pad] = x[n, c, ih >> 1, iw >> 1] for (ih, iw) inside (2H, 2W), else 0;
* ``im2col_k_up2`` (B): the same matrix in the K-rows role (the weight gradient), B[(n, oh, ow), (c, kh, kw)];
* ``im2col_s2`` (A): a stride-2 im2col of the source, rows (n, h, w), columns (c, u, v) of a ksize x ksize
  window: src[n, c, 2h + u - pad, 2w + v - pad], 0 outside (the backward-data GEMM below reads dy with it);
  with the "summed" kernel W'[co, ci, u, v] = sum over a, b in {0, 1} with 0 <= u - a < k, 0 <= v - b < k of
  w[co, ci, k-1-(u-a), k-1-(v-b)] as its B (ksize = k + 1; ``conv.upsampled`` makes W' by a small launch and reads
  it flipped through the plain ``weight_flip_t`` loader).

Why: the input gradient of a conv on up(x) is the usual one at the upsampled size, d(up x), summed
over each 2x2 block (the upsample backward). For stride 1, with P' = k - 1 - pad,
  dx[n, ci, h, w] = sum_{a,b} sum_{co,kh,kw} dy[n, co, 2h+a+kh-P', 2w+b+kw-P'] w[co, ci, k-1-kh, k-1-kw]
and with u = a + kh, v = b + kw in [0, k] this is a stride-2 correlation of dy with a (k+1) x (k+1) kernel whose
taps are sums of up to 4 flipped taps: one GEMM over the small map, M = N*H*W, K = Cout*(k+1)^2 (16 Cout for
k = 3, against 36 Cout for the conv at the upsampled size followed by the 2x2 sum). Exact for any padding: dy's
zero padding is the loader's zero fill. The 2x2 sum happens in the K loop (no atomics, a fixed order).
(The taps were first summed inside a B loader, 4 weight loads per element: 325 us for the autoencoder's
128 -> 256 layer at batch 64 on an H100, 7 + 209 us with W' made once per step.)
"""

from __future__ import annotations

import functools

import numpy as np
from numba import uint32

from .indexing import F0, U1, Loader, _divmod, _im2col_get, _patch_fns, device_function
from .problem import (
    D_GHW,
    D_GHW_MUL,
    D_GHW_SHIFT,
    D_GW,
    D_GW_MUL,
    D_GW_SHIFT,
    D_K,
    D_M,
    D_N,
    D_PAD,
    D_SRC_CHW,
    D_SRC_H,
    D_SRC_HW,
    D_SRC_W,
)

__all__ = ["UP_A_MAPS", "UP_B_MAPS", "up_a_loader", "up_b_loader"]

UP_A_MAPS = ("im2col_up2", "im2col_s2")
UP_B_MAPS = ("im2col_k_up2",)


@device_function
def _pixel_up2(dims, r):
    """Pixel r = (n, oh, ow) of the output grid: (r, offset of x[n], oh - pad, ow - pad) (mod 2^32)."""
    n, s = _divmod(r, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    oh, ow = _divmod(s, dims[D_GW], dims[D_GW_MUL], dims[D_GW_SHIFT])
    return r, uint32(n * dims[D_SRC_CHW]), uint32(oh - dims[D_PAD]), uint32(ow - dims[D_PAD])


@device_function
def _pixel_s2(dims, r):
    """Pixel r = (n, h, w) of the grid, a window origin (2h - pad, 2w - pad) of src: the state of
    ``mappings._pixel`` (r, offset of the origin, its row, its column), all mod 2^32."""
    n, s = _divmod(r, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    h, w = _divmod(s, dims[D_GW], dims[D_GW_MUL], dims[D_GW_SHIFT])
    ohp = uint32(uint32(h + h) - dims[D_PAD])
    owp = uint32(uint32(w + w) - dims[D_PAD])
    return r, uint32(n * dims[D_SRC_CHW] + ohp * dims[D_SRC_W] + owp), ohp, owp


@functools.cache
def _patch_up2(ksize):
    """Column q = (c, kh, kw): (q, offset of x[., c], kh, kw)."""
    kk = np.uint32(ksize * ksize)
    ks = np.uint32(ksize)

    @device_function
    def patch(dims, q):
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return q, uint32(c * dims[D_SRC_HW]), kh, uint32(rem - kh * ks)

    return patch


@device_function
def _up2_get(x, dims, pix, pat):
    """u[n, c, ih, iw] = x[n, c, ih >> 1, iw >> 1] for (ih, iw) = (oh + kh - pad, ow + kw - pad) inside the
    upsampled (2H, 2W); 0 in the padding (one unsigned compare per axis, as mappings._im2col_get)."""
    ih = uint32(pix[2] + pat[2])
    iw = uint32(pix[3] + pat[3])
    if ih < uint32(dims[D_SRC_H] << U1) and iw < uint32(dims[D_SRC_W] << U1):
        return x[uint32(pix[1] + pat[1] + uint32(ih >> U1) * dims[D_SRC_W] + uint32(iw >> U1))]
    return F0


@functools.cache
def up_a_loader(kind, ksize):
    """The A loader (``mappings.Loader``) of an upsample mapping."""
    if kind == "im2col_up2":

        @device_function
        def get(x, dims, pix, pat):
            if pix[0] < dims[D_M] and pat[0] < dims[D_K]:
                return _up2_get(x, dims, pix, pat)
            return F0

        return Loader(True, _pixel_up2, _patch_up2(ksize), get)
    if kind == "im2col_s2":

        @device_function
        def get(x, dims, pix, pat):
            if pix[0] < dims[D_M] and pat[0] < dims[D_K]:
                return _im2col_get(x, dims, pix, pat)
            return F0

        return Loader(True, _pixel_s2, _patch_fns(ksize)[0], get)
    raise ValueError(f"gemm: unknown A mapping {kind!r}; choose from {UP_A_MAPS}")


@functools.cache
def up_b_loader(kind, ksize):
    """The B loader of an upsample mapping."""
    if kind == "im2col_k_up2":

        @device_function
        def get(x, dims, pat, pix):
            if pat[0] < dims[D_N] and pix[0] < dims[D_K]:
                return _up2_get(x, dims, pix, pat)
            return F0

        return Loader(True, _patch_up2(ksize), _pixel_up2, get)
    raise ValueError(f"gemm: unknown B mapping {kind!r}; choose from {UP_B_MAPS}")
