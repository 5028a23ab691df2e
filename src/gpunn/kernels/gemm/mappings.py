"""Operand mappings, the fused epilogue and the K range: the device functions every GEMM version is built from.

A kernel never indexes its operands itself: it asks three compile-time mappings, each written once here:

* the A loader (``A_MAPS``) gives op(A)[i, p]: ``dense`` a[i, p]; ``dense_t`` a[p, i]; ``dense_flat`` and
  ``dense_t_flat`` the same of a C-contiguous array passed flat (32-bit element offsets); ``im2col`` the implicit
  im2col matrix of an NCHW tensor with zero padding, rows (n, oh, ow), columns (c, kh, kw); ``channels`` an NCHW
  tensor seen as (C, N*H*W), rows c, columns (n, h, w);
* the B loader (``B_MAPS``) gives op(B)[p, j]: ``dense``; ``dense_t``; their ``_flat`` twins; ``weight_t`` a
  (Cout, Cin, k, k) weight as
  B[(ci, kh, kw), co]; ``weight_flip_t`` B[(co, kh, kw), ci] = w[co, ci, k-1-kh, k-1-kw]; ``im2col_k`` the im2col
  matrix in the K-rows role, B[(n, oh, ow), (c, kh, kw)];
* the store (``STORES``) puts C[i, j] (and reads the ``mask`` epilogue's aux at the same place): ``dense``
  c[i, j]; ``nchw`` row i = (n, oh, ow), column j = channel -> c[n, j, oh, ow] of a flat NCHW buffer; ``weight4``
  row co, column (ci, kh, kw) -> c[co, ci, kh, kw]; ``partial`` the split-K scratch, C[i, j] of block z ->
  c[(z*M + i)*N + j] of a flat (splits, M, N) buffer.
* the 2x2 max-pool fusion (``POOL_A_MAPS``, ``POOL_B_MAPS``, ``WINDOW_STORES``: bottom of the module): conv pixels
  in pooling-window order, a window store taking 4 rows at once (``window_fns``), and the pooled gradient
  expanded through the route by the backward loaders.

The batched GEMM's mappings (``batch_t``, ``batch_k``; ``batch``, ``batch_t_k``; store ``batch_t``: grid z picks
the GEMM) live in ``mappings_batched``. The mappings of a conv whose input is a 2x upsampled map (``im2col_up2``,
``im2col_s2``, ``im2col_k_up2``) live in ``mappings_up``; both are part of ``A_MAPS`` / ``B_MAPS``.

A loader is ``outer(dims, index) -> state`` for the index that stays fixed through the K loop (the row of A, the
column of B), ``inner(dims, p) -> state`` for the K index, and ``get(array, dims, outer, inner)`` the element, zero
outside the matrix (and in the padding). ``Loader.contig_k`` says which axis is contiguous, so that tiles are
loaded with each thread reading consecutive elements; with a K-contiguous loader ``outer`` (e.g. the division of a
pixel index by the output width) runs once before the K loop. Factories are cached per (mapping, kernel size,
epilogue), and the kernels take the functions as closure constants: numba prunes dead branches and LLVM inlines
them, so no flag is tested in the loops.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int8, uint32

from ..common import epilogue_flags
from .indexing import (  # noqa: F401  (re-exported: the kernels import them from here)
    F0,
    SHIFT32,
    SMEM_ALIGN,
    U0,
    U1,
    U2,
    U4,
    U32,
    Loader,
    _channel_pixel,
    _divmod,
    _im2col_get,
    _index1,
    _patch_fns,
    _pixel,
    device_function,
)
from .mappings_batched import (
    BATCH_A_MAPS,
    BATCH_B_MAPS,
    BATCH_PAIR_MAPS,
    BATCH_STORES,
    batch_a_loader,
    batch_b_loader,
    batch_pair_loader,
    batch_store_fns,
)
from .mappings_up import UP_A_MAPS as _UP_A_MAPS
from .mappings_up import UP_B_MAPS as _UP_B_MAPS
from .mappings_up import up_a_loader, up_b_loader
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
    D_OUT_CHW,
    D_PAD,
    D_SRC_CHW,
    D_SRC_H,
    D_SRC_HW,
    D_SRC_W,
)

__all__ = ["A_MAPS", "B_MAPS", "DENSE_K_A", "DENSE_K_B", "POOL_A_MAPS", "POOL_B_MAPS", "ROUTE_NONE", "STORES",
           "WINDOW_STORES", "WINDOW_VERSIONS", "device_function", "finish_fn", "k_range_fn", "kernel_parts",
           "store_fns", "window_epilogue", "window_fns", "window_max"]

A_MAPS = ("dense", "dense_t", "dense_flat", "dense_t_flat", "im2col", "channels")
B_MAPS = ("dense", "dense_t", "dense_flat", "dense_t_flat", "weight_t", "weight_flip_t", "im2col_k")
# the upsample mappings (mappings_up)
A_MAPS += _UP_A_MAPS
B_MAPS += _UP_B_MAPS
STORES = ("dense", "nchw", "weight4", "partial")
# the batched GEMM's mappings (mappings_batched: grid z picks the GEMM)
A_MAPS += BATCH_A_MAPS
B_MAPS += BATCH_B_MAPS
STORES += BATCH_STORES
# the 2x2 max-pool fusion's mappings (bottom of this module): pixels in pooling-window order, the pooled gradient
POOL_A_MAPS = ("im2col_window", "pool_grad_im2col", "pool_grad_channels")
POOL_B_MAPS = ("im2col_k_window", "im2col_k_window_ones")
WINDOW_STORES = ("pool_nchw",)
# the GEMM versions with a window epilogue (window_fns); the deep ones are deep.TILES
WINDOW_VERSIONS = ("narrow", "deep128x32", "deep128x16", "deep32x32")
A_MAPS = A_MAPS + POOL_A_MAPS
B_MAPS = B_MAPS + POOL_B_MAPS
STORES = STORES + WINDOW_STORES



@functools.cache
def _a_loader(kind, ksize):
    """op(A)[i, p] of an A mapping; outer index i < M, inner p < K."""
    if kind in POOL_A_MAPS:  # the pooling window's mappings (bottom of this module)
        return _pool_a_loader(kind, ksize)
    if kind in BATCH_A_MAPS:
        return batch_a_loader(kind)
    if kind in BATCH_PAIR_MAPS:
        return batch_pair_loader(kind)
    if kind == "dense":  # a (M, K)

        @device_function
        def get(a, dims, i, p):
            return a[i, p] if (i < dims[D_M] and p < dims[D_K]) else F0

        return Loader(True, _index1, _index1, get)
    if kind == "dense_t":  # a (K, M)

        @device_function
        def get(a, dims, i, p):
            return a[p, i] if (p < dims[D_K] and i < dims[D_M]) else F0

        return Loader(False, _index1, _index1, get)
    if kind == "dense_flat":  # a C-contiguous (M, K) as a flat buffer: 32-bit element offsets

        @device_function
        def get(a, dims, i, p):
            return a[uint32(i * dims[D_K] + p)] if (i < dims[D_M] and p < dims[D_K]) else F0

        return Loader(True, _index1, _index1, get)
    if kind == "dense_t_flat":  # a C-contiguous (K, M), flat

        @device_function
        def get(a, dims, i, p):
            return a[uint32(p * dims[D_M] + i)] if (p < dims[D_K] and i < dims[D_M]) else F0

        return Loader(False, _index1, _index1, get)
    if kind == "im2col":  # x flat NCHW (src); rows pixels of the grid, columns (c, kh, kw)
        patch = _patch_fns(ksize)[0]

        @device_function
        def get(x, dims, pix, pat):
            if pix[0] < dims[D_M] and pat[0] < dims[D_K]:
                return _im2col_get(x, dims, pix, pat)
            return F0

        return Loader(True, _pixel, patch, get)
    if kind == "channels":  # flat NCHW tensor on the grid with M channels, as (M, N*gh*gw)

        @device_function
        def outer(dims, c):
            return c, uint32(c * dims[D_GHW])

        @device_function
        def get(t, dims, row, col):
            return t[uint32(row[1] + col[1])] if (row[0] < dims[D_M] and col[0] < dims[D_K]) else F0

        return Loader(True, outer, _channel_pixel, get)
    if kind in _UP_A_MAPS:

        return up_a_loader(kind, ksize)
    raise ValueError(f"gemm: unknown A mapping {kind!r}; choose from {A_MAPS}")


# The mappings whose K axis is truly contiguous in memory with a plain outer index (coalesced128 reads them 8
# consecutive K of 4 outer indices per warp request); weight_flip_t's K runs backwards within each 3x3 window.
DENSE_K_A = frozenset({"dense", "dense_flat", "batch_k", "batch_k_bf16x2"})
DENSE_K_B = frozenset({"dense_t", "dense_t_flat", "weight_t", "batch_t_k", "batch_t_k_bf16x2"})


@functools.cache
def _b_loader(kind, ksize):
    """op(B)[p, j] of a B mapping; outer index j < N, inner p < K."""
    if kind in POOL_B_MAPS:
        return _pool_b_loader(kind, ksize)
    if kind in BATCH_B_MAPS:
        return batch_b_loader(kind)
    if kind in BATCH_PAIR_MAPS:
        return batch_pair_loader(kind)
    if kind == "dense":  # b (K, N)

        @device_function
        def get(b, dims, j, p):
            return b[p, j] if (p < dims[D_K] and j < dims[D_N]) else F0

        return Loader(False, _index1, _index1, get)
    if kind == "dense_flat":  # b C-contiguous (K, N), flat

        @device_function
        def get(b, dims, j, p):
            return b[uint32(p * dims[D_N] + j)] if (p < dims[D_K] and j < dims[D_N]) else F0

        return Loader(False, _index1, _index1, get)
    if kind == "dense_t_flat":  # b C-contiguous (N, K), flat

        @device_function
        def get(b, dims, j, p):
            return b[uint32(j * dims[D_K] + p)] if (j < dims[D_N] and p < dims[D_K]) else F0

        return Loader(True, _index1, _index1, get)
    if kind == "dense_t":  # b (N, K)

        @device_function
        def get(b, dims, j, p):
            return b[j, p] if (j < dims[D_N] and p < dims[D_K]) else F0

        return Loader(True, _index1, _index1, get)
    patch, weight_index, flipped_index = _patch_fns(ksize)
    if kind in ("weight_t", "weight_flip_t"):  # w (Cout, Cin, k, k), any strides
        flip = kind == "weight_flip_t"

        @device_function
        def get(w, dims, j, p):
            if j < dims[D_N] and p < dims[D_K]:
                if flip:  # B[(co, kh, kw), ci] = w[co, ci, k-1-kh, k-1-kw]
                    co, kh, kw = flipped_index(p)
                    return w[co, j, kh, kw]
                ci, kh, kw = weight_index(p)  # B[(ci, kh, kw), co] = w[co, ci, kh, kw]
                return w[j, ci, kh, kw]
            return F0

        return Loader(True, _index1, _index1, get)
    if kind == "im2col_k":  # x flat NCHW (src); K rows pixels of the grid, N columns (c, kh, kw)

        @device_function
        def get(x, dims, pat, pix):
            if pat[0] < dims[D_N] and pix[0] < dims[D_K]:
                return _im2col_get(x, dims, pix, pat)
            return F0

        return Loader(True, patch, _pixel, get)
    if kind in _UP_B_MAPS:

        return up_b_loader(kind, ksize)
    raise ValueError(f"gemm: unknown B mapping {kind!r}; choose from {B_MAPS}")


@functools.cache
def store_fns(kind, ksize):
    """(row(dims, i) -> state, at(dims, state, j) -> index of C[i, j] in c and in the mask)."""
    if kind in WINDOW_STORES:
        raise ValueError(f"gemm: store {kind!r} finishes 4 rows at once; run it with a version that has a window "
                         f"epilogue ({WINDOW_VERSIONS})")
    if kind in BATCH_STORES:
        return batch_store_fns(kind)
    if kind == "dense":  # c (M, N), any strides

        @device_function
        def at(dims, i, j):
            return i, j

        return _index1, at
    if kind == "nchw":  # c flat NCHW on the grid, N channels; row i = pixel (n, oh, ow)

        @device_function
        def row(dims, i):
            n, s = _divmod(i, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
            return uint32(n * dims[D_OUT_CHW] + s)

        @device_function
        def at(dims, base, j):
            return uint32(base + j * dims[D_GHW])

        return row, at
    if kind == "weight4":  # c (Cout, Cin, k, k), any strides; row co, column (ci, kh, kw)
        weight_index = _patch_fns(ksize)[1]

        @device_function
        def at(dims, co, j):
            ci, kh, kw = weight_index(j)
            return co, ci, kh, kw

        return _index1, at
    if kind == "partial":  # split-K scratch: c flat (splits, M, N), slice blockIdx.z holds this block's sums

        @device_function
        def row(dims, i):
            return uint32(uint32(uint32(cuda.blockIdx.z) * dims[D_M] + i) * dims[D_N])

        @device_function
        def at(dims, base, j):
            return uint32(base + j)

        return row, at
    raise ValueError(f"gemm: unknown store {kind!r}; choose from {STORES}")


@functools.cache
def finish_fn(store, ksize, epilogue):
    """The epilogue and the store, one device function: C[i, j] = epilogue(acc) for a row state of i."""
    has_bias, relu, mask = epilogue_flags(epilogue)
    at = store_fns(store, ksize)[1]

    @device_function
    def finish(c, aux, dims, row, j, v):
        idx = at(dims, row, j)
        if has_bias:
            v += aux[j]
        if relu and v < F0:
            v = F0
        if mask and not aux[idx] > F0:
            v = F0
        c[idx] = v

    return finish


# The K range of a block. Without split-K it is all of K, and k_begin is the constant 0. With split-K the last
# element of dims is the chunk length k_len (a multiple of the version's K step, so a block's tiles never reach
# into the next chunk) and block z runs [z * k_len, min(K, (z + 1) * k_len)); the loaders still zero-fill against
# the whole K. Two uint32 multiply-adds and a min, once per thread, outside the K loop.
D_KLEN = -1  # static index: the tuple's length is part of its type


@device_function
def _k_range_all(dims):
    return U0, dims[D_K]


@device_function
def _k_range_chunk(dims):
    k_begin = uint32(uint32(cuda.blockIdx.z) * dims[D_KLEN])
    return k_begin, uint32(min(dims[D_K], uint32(k_begin + dims[D_KLEN])))


def k_range_fn(split_k):
    return _k_range_chunk if split_k else _k_range_all


def kernel_parts(a_map, b_map, store, ksize, epilogue):
    """The compile-time pieces of one kernel specialisation, flat (numba takes device functions as closure
    constants, not inside a tuple): A contig_k, outer, inner, get; the same for B; the store's row
    function; the epilogue + store."""
    la, lb = _a_loader(a_map, ksize), _b_loader(b_map, ksize)
    return (*la, *lb, store_fns(store, ksize)[0], finish_fn(store, ksize, epilogue))



# ---------------------------------------------------------------------------------------------------------
# The 2x2 max-pool fusion (stride 2, floor: an odd map's last row / column belongs to no window).
#
# Forward: the GEMM's rows are conv output pixels in pooling-window order, row i = (n, ph, pw, q) with
# q = 2*dy + dx, on the pooled grid (gh, gw) = (PH, PW): M = N*PH*PW*4, and the 4 consecutive rows a thread of a
# window version owns are one window. The pixels of an odd map's last row / column are never computed (the pool
# drops them; their gradient is zero). The window store ``pool_nchw`` takes the window's 4 values at once
# (``window_fns``): bias, ReLU, the max (first position on ties, NaN wins, as the pool kernels), and stores the
# pooled NCHW output and the route, into c = (pooled, route) (a tuple of flat arrays: float32, int8). The route is
# the winner q, or ROUTE_NONE where the ReLU passed nothing (the pooled value not > 0).
#
# Backward: the conv output's gradient dy[n, c, h, w] = dpool[n, c, h//2, w//2] where route == 2*(h%2) + w%2,
# else 0, expanded on the fly by the A loaders from a = (dpool, route) (flat arrays of the pooled shape):
# ``pool_grad_im2col`` the input-gradient GEMM's im2col of that dy (src fields (C, 2*PH, 2*PW): the even part
# of the conv output, zero beyond); ``pool_grad_channels`` the weight-gradient GEMM's dy as (C, K) with K in
# window order on the pooled grid, against ``im2col_k_window`` (the input's im2col in the same order). Its twin
# ``im2col_k_window_ones`` adds a last column N-1 = Cin*k*k of ones, so that the same GEMM's last output column is
# the bias gradient (the sum of the expanded gradient over K).

F1 = float32(1.0)
ROUTE_NONE = 4  # the route of a window whose pooled value is not > 0: no gradient reaches the conv
_U3 = np.uint32(3)


@device_function
def _window_pixel(dims, r):
    """Pixel r = (n, ph, pw, q) in window order: as ``_pixel``'s state for conv output pixel
    (2*ph + q//2, 2*pw + q%2)."""
    sel = uint32(r & _U3)
    n, s = _divmod(uint32(r >> U2), dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    ph, pw = _divmod(s, dims[D_GW], dims[D_GW_MUL], dims[D_GW_SHIFT])
    ohp = uint32(uint32(ph * U2 + (sel >> U1)) - dims[D_PAD])
    owp = uint32(uint32(pw * U2 + (sel & U1)) - dims[D_PAD])
    return r, uint32(n * dims[D_SRC_CHW] + ohp * dims[D_SRC_W] + owp), ohp, owp


@device_function
def _pooled_pixel(dims, r):
    """Pixel r = (n, h, w) of the input-gradient grid: (r, offset of image n in the pooled gradient, h - pad,
    w - pad), the src fields being the unpooled (C, 2*PH, 2*PW)."""
    n, s = _divmod(r, dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    oh, ow = _divmod(s, dims[D_GW], dims[D_GW_MUL], dims[D_GW_SHIFT])
    return r, uint32(n * (dims[D_SRC_CHW] >> U2)), uint32(oh - dims[D_PAD]), uint32(ow - dims[D_PAD])


@functools.cache
def _pooled_patch_fn(ksize):
    """Column q = (c, kh, kw) of the pooled gradient's im2col: (q, offset of channel c in the pooled gradient,
    kh, kw)."""
    kk = np.uint32(ksize * ksize)
    ks = np.uint32(ksize)

    @device_function
    def patch(dims, q):
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return q, uint32(c * (dims[D_SRC_HW] >> U2)), kh, uint32(rem - kh * ks)

    return patch


@device_function
def _window_channel_pixel(dims, q):
    """Column q = (n, ph, pw, sel) of the pooled gradient as (C, K): (q, offset of [n, 0, ph, pw], sel)."""
    n, s = _divmod(uint32(q >> U2), dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
    return q, uint32(n * dims[D_OUT_CHW] + s), uint32(q & _U3)


@functools.cache
def _pool_a_loader(kind, ksize):
    if kind == "im2col_window":  # x flat NCHW (src); rows pixels in window order, columns (c, kh, kw)
        patch = _patch_fns(ksize)[0]

        @device_function
        def get(x, dims, pix, pat):
            if pix[0] < dims[D_M] and pat[0] < dims[D_K]:
                return _im2col_get(x, dims, pix, pat)
            return F0

        return Loader(True, _window_pixel, patch, get)
    if kind == "pool_grad_im2col":  # a = (dpool, route) flat; rows pixels of dx's grid, columns (c, kh, kw)

        @device_function
        def get(a, dims, pix, pat):
            if pix[0] < dims[D_M] and pat[0] < dims[D_K]:
                h = uint32(pix[2] + pat[2])
                w = uint32(pix[3] + pat[3])
                if h < dims[D_SRC_H] and w < dims[D_SRC_W]:
                    idx = uint32(pix[1] + pat[1] + (h >> U1) * (dims[D_SRC_W] >> U1) + (w >> U1))
                    v = a[0][idx]  # read with the route, not after it: one round trip per element, not two
                    return v if uint32(a[1][idx]) == uint32((h & U1) * U2 + (w & U1)) else F0
            return F0

        return Loader(True, _pooled_pixel, _pooled_patch_fn(ksize), get)
    if kind == "pool_grad_channels":  # a = (dpool, route) flat; rows channels, columns window-order pixels

        @device_function
        def outer(dims, c):
            return c, uint32(c * dims[D_GHW])

        @device_function
        def get(a, dims, row, col):
            if row[0] < dims[D_M] and col[0] < dims[D_K]:
                idx = uint32(row[1] + col[1])
                v = a[0][idx]  # read with the route (as pool_grad_im2col)
                return v if uint32(a[1][idx]) == col[2] else F0
            return F0

        return Loader(True, outer, _window_channel_pixel, get)
    raise ValueError(f"gemm: unknown A mapping {kind!r}; choose from {A_MAPS}")


@functools.cache
def _pool_b_loader(kind, ksize):
    patch = _patch_fns(ksize)[0]
    if kind == "im2col_k_window":  # x flat NCHW (src); K rows pixels in window order, N columns (c, kh, kw)

        @device_function
        def get(x, dims, pat, pix):
            if pat[0] < dims[D_N] and pix[0] < dims[D_K]:
                return _im2col_get(x, dims, pix, pat)
            return F0

        return Loader(True, patch, _window_pixel, get)
    if kind == "im2col_k_window_ones":  # as im2col_k_window with one more column N-1 of ones: the bias gradient

        @device_function
        def get(x, dims, pat, pix):
            if pix[0] < dims[D_K]:
                last = uint32(dims[D_N] - U1)
                if pat[0] < last:
                    return _im2col_get(x, dims, pix, pat)
                if pat[0] == last:
                    return F1
            return F0

        return Loader(True, patch, _window_pixel, get)
    raise ValueError(f"gemm: unknown B mapping {kind!r}; choose from {B_MAPS}")


@device_function
def _relu(v):
    return F0 if v < F0 else v  # NaN stays NaN, as in finish_fn


@device_function
def window_max(v0, v1, v2, v3):
    """(max, position 0..3) of a 2x2 window's values in the order (0, 0), (0, 1), (1, 0), (1, 1): strict > keeps the
    first position on ties, `v != v` lets a NaN win (pool.py's forward rule). Every window epilogue uses it."""
    best = v0
    pos = U0
    if v1 > best or v1 != v1:
        best = v1
        pos = U1
    if v2 > best or v2 != v2:
        best = v2
        pos = U2
    if v3 > best or v3 != v3:
        best = v3
        pos = _U3
    return best, pos


@functools.cache
def window_epilogue(has_bias, relu):
    """pool(aux, c, v0, v1, v2, v3) -> (max, route) of a 2x2 window's conv values of channel c (``window_max``'s
    order): + aux[c] (the bias) with `has_bias`, the ReLU with `relu` (then ROUTE_NONE where the max is not > 0)."""
    none = np.uint32(ROUTE_NONE)

    @device_function
    def pool(aux, c, v0, v1, v2, v3):
        if has_bias:
            b = aux[c]
            v0 += b
            v1 += b
            v2 += b
            v3 += b
        if relu:
            v0 = _relu(v0)
            v1 = _relu(v1)
            v2 = _relu(v2)
            v3 = _relu(v3)
        best, pos = window_max(v0, v1, v2, v3)
        if relu and not best > F0:
            pos = none
        return best, pos

    return pool


@functools.cache
def window_fns(store, epilogue):
    """(row(dims, i) -> state of the window whose first row is i, finish(c, aux, dims, state, j, v0, v1, v2, v3))
    of a window store: the epilogue (bias, ReLU) on the window's 4 values, their max into c[0], the route into
    c[1]."""
    if store not in WINDOW_STORES:
        raise ValueError(f"gemm: {store!r} is not a window store; choose from {WINDOW_STORES}")
    has_bias, relu, mask = epilogue_flags(epilogue)
    if mask:
        raise ValueError(f"gemm: the window store {store!r} takes the bias and ReLU epilogues, not {epilogue!r}")

    @device_function
    def row(dims, i):
        n, s = _divmod(uint32(i >> U2), dims[D_GHW], dims[D_GHW_MUL], dims[D_GHW_SHIFT])
        return uint32(n * dims[D_OUT_CHW] + s)

    pool = window_epilogue(has_bias, relu)

    @device_function
    def finish(c, aux, dims, base, j, v0, v1, v2, v3):
        best, pos = pool(aux, j, v0, v1, v2, v3)
        idx = uint32(base + j * dims[D_GHW])
        c[0][idx] = best
        c[1][idx] = int8(pos)

    return row, finish
