"""The weight gradient of convolution version ``winograd`` (F(2x2, 3x3); the other passes and the transforms
they share: ``winograd``): dM = A dy A^T per tile (4x4 from a 2x2 block of dy, zero outside the map) (dM (16, Cout,
T)), dU[pos] = V[pos] @ dM[pos]^T (Cin x Cout, K = T split into S chunks in grid z: partials (16 S, Cin, Cout)),
and one launch summing the S partials of each position in order and applying dW = G^T dU G.

With the bias gradient (``conv_backward_weight_bias_winograd``, the version's ``with_bias``): the dy transform,
which reads every element of dy once anyway, also sums it: block (b, c) of its (chunks, Cout) grid transforms tiles
b * threads + i (+ multiples of chunks * threads) of channel c, each thread adds its tiles' four dy values, and the
block adds its threads' sums in a fixed tree in shared memory into db_partials[c, b]; the finishing launch adds
those chunks in order into db. Deterministic; no launch of its own (the split bias reduction reads dy again in two
launches). The ``_up`` launchers read x through its 2x nearest upsample (``winograd``'s input transform).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, shape
from ..gemm import multiprocessors, output_tiles
from ..gemm.batched import batch_chunks, gemm_batched
from ..gemm.indexing import device_function
from ..gemm.versions import lookup
from ..jit import jit
from ..launch import LaunchGroup, bind, flat, grid_for
from .implicit_gemm import _activation, _expect, _geometry
from .pooled import _pooled_pair, _pooled_shape
from .upsampled import upsampled_shape
from .wgrad_bias import check_db
from .winograd import (
    _C,
    _F0,
    _HALF,
    _OH,
    _OW,
    _T,
    _TH,
    _TW,
    _U2,
    POSITIONS,
    TRANSFORM_THREADS,
    _bind,
    _check,
    _input_kernel,
    _put,
    _scratch,
    _storage,
    _tag,
    _tdims,
    _threads,
    _tile,
    _v_buffer,
    _version,
)

__all__ = ["WINOGRAD_MIN_K", "WINOGRAD_WGRAD_WAVES", "conv_backward_weight_bias_winograd",
           "conv_backward_weight_bias_winograd_up", "conv_backward_weight_winograd", "conv_backward_weight_winograd_up",
           "wgrad_splits"]

WINOGRAD_WGRAD_WAVES = 2  # the weight gradient's automatic split count: at most this many blocks per SM ...
WINOGRAD_MIN_K = 128  # ... and at least this many tiles per chunk (wgrad_splits)
SIMULATOR_WGRAD_SPLITS = 2
# the finishing launch's block: FINISH_ELEMENTS consecutive elements (ci, co) x the 16 positions, a thread each (a
# warp's loads: 2 positions x 16 consecutive elements)
FINISH_ELEMENTS = 16
FINISH_THREADS = FINISH_ELEMENTS * POSITIONS
FINISH_LOADS = 8  # the terms of an in-order sum a thread loads before adding them
_U0 = np.uint32(0)
_U1 = np.uint32(1)
_U3 = np.uint32(3)
_U9 = np.uint32(9)
_ELEMENTS = np.uint32(FINISH_ELEMENTS)
_LOADS = np.uint32(FINISH_LOADS)


@functools.cache
def _dy_pair(pool):
    """pair(dy, dims, n, c, ty, tx, j) -> (g0, g1): column j of tile (ty, tx)'s 2x2 block of dy in channel c of
    image n, zero outside the output grid. With `pool` dy is (dpool, route) flat on the tile grid (a tile is one
    pooling window): dpool at the position the route names, else 0."""
    if pool:

        @device_function
        def pair(dy, dims, n, c, ty, tx, j):
            i = uint32(uint32(uint32(n * dims[_C] + c) * dims[_TH] + ty) * dims[_TW] + tx)
            g = dy[0][i]
            r = uint32(dy[1][i])
            return (g if r == uint32(j) else _F0), (g if r == uint32(j + 2) else _F0)

        return pair

    @device_function
    def pair(dy, dims, n, c, ty, tx, j):
        base = uint32(uint32(n * dims[_C] + c) * dims[_OH] * dims[_OW])
        oh = uint32(ty * _U2)
        w_ = uint32(tx * _U2 + uint32(j))
        inside = w_ < dims[_OW]
        g0 = dy[uint32(base + oh * dims[_OW] + w_)] if inside and oh < dims[_OH] else _F0
        g1 = dy[uint32(base + (oh + _U1) * dims[_OW] + w_)] if inside and uint32(oh + _U1) < dims[_OH] else _F0
        return g0, g1

    return pair


@functools.cache
def _dy_kernel(storage="fp32", bias=False, pool=False):
    """The dy transform, dm in `storage`; with `bias`, on a (chunks, C) grid, each block's sum of dy into
    db_partials (module docstring); without, a flat grid over (C, T) and db_partials unused. `pool`: dy read
    through (dpool, route) (``_dy_pair``)."""
    put = _put(storage)
    pair = _dy_pair(pool)

    @jit
    def dy_transform(dy, dm, db_partials, dims):
        """dm[pos, c, t] = (A g A^T)[pos] of the 2x2 block g of tile t in channel c of dy (flat NCHW on the output
        grid, zero outside it; a pair with `pool`)."""
        h = cuda.local.array(8, float32)
        sums = cuda.shared.array(TRANSFORM_THREADS, float32)
        t_all = dims[_T]
        ct = uint32(dims[_C] * t_all)
        tt = uint32(dims[_TH] * dims[_TW])
        i = uint32(cuda.threadIdx.x)
        q = uint32(cuda.blockIdx.x * cuda.blockDim.x + i)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        first = uint32(uint32(cuda.blockIdx.y) * t_all) if bias else _U0  # element c * T + t of the block's channel
        limit = t_all if bias else ct
        total = _F0
        while q < limit:
            e = uint32(first + q)
            c, n, ty, tx = _tile(e, t_all, tt, dims)
            for j in range(2):  # A g (4x2): A = [[1, 0], [1, 1], [1, -1], [0, -1]]
                g0, g1 = pair(dy, dims, n, c, ty, tx, j)
                h[j] = g0
                h[2 + j] = g0 + g1
                h[4 + j] = g0 - g1
                h[6 + j] = -g1
                if bias:
                    total += g0 + g1
            for r in range(4):  # (A g) A^T
                h0, h1 = h[2 * r], h[2 * r + 1]
                base_out = uint32(uint32(4 * r) * ct + e)
                put(dm, base_out, h0)
                put(dm, uint32(base_out + ct), h0 + h1)
                put(dm, uint32(base_out + _U2 * ct), h0 - h1)
                put(dm, uint32(base_out + np.uint32(3) * ct), -h1)
            q = uint32(q + stride)
        if bias:  # the block's threads' sums in a fixed tree (blockDim a power of two)
            sums[i] = total
            cuda.syncthreads()
            half = uint32(cuda.blockDim.x >> 1)
            while half > _U0:
                if i < half:
                    sums[i] += sums[uint32(i + half)]
                cuda.syncthreads()
                half = uint32(half >> 1)
            if i == _U0:
                db_partials[uint32(uint32(cuda.blockIdx.y) * cuda.gridDim.x + cuda.blockIdx.x)] = sums[0]

    return dy_transform


@device_function
def _add_in_order(buf, first, step, count, acc):
    """acc + buf[first] + buf[first + step] + ... (`count` terms) in float32, added in that order; the loads of
    FINISH_LOADS terms are issued before their adds (in flight together)."""
    v = cuda.local.array(FINISH_LOADS, float32)
    s = _U0
    idx = first
    while s < count:
        n = uint32(min(uint32(count - s), _LOADS))
        for k in range(FINISH_LOADS):
            if uint32(k) < n:
                v[k] = buf[uint32(idx + uint32(k) * step)]
        for k in range(FINISH_LOADS):
            if uint32(k) < n:
                acc += v[k]
        s = uint32(s + _LOADS)
        idx = uint32(idx + _LOADS * step)
    return acc


@device_function
def _gt_du(du, el, i, j):
    """Row i, column j of G^T dU (3x4), G^T = [[1, .5, .5, 0], [0, .5, -.5, 0], [0, .5, .5, 1]], dU[r, j] the
    summed position 4 r + j of element el in du (pos * FINISH_ELEMENTS + el)."""
    u1 = du[uint32(uint32(4 + j) * _ELEMENTS + el)]
    u2 = du[uint32(uint32(8 + j) * _ELEMENTS + el)]
    if i == 0:
        return du[uint32(uint32(j) * _ELEMENTS + el)] + _HALF * (u1 + u2)
    if i == 1:
        return _HALF * (u1 - u2)
    return _HALF * (u1 + u2) + du[uint32(uint32(12 + j) * _ELEMENTS + el)]


@functools.cache
def _finish_kernel(bias=False):
    """The finishing launch (``_finish_launch``); with `bias`, db[c] the sum of db_partials[c, :chunks] in order
    too (a grid-stride over c)."""

    @jit
    def wgrad_finish(partials, dw, db_partials, db, cin, cout, splits, chunks):
        """dw[co, ci] = G^T dU G, dU[pos] the sum of the splits' partials (16*splits, Cin, Cout) in split order. A
        block (FINISH_THREADS) takes FINISH_ELEMENTS consecutive elements e = ci * Cout + co at a time: thread
        pos * FINISH_ELEMENTS + el sums position pos of element el into shared memory, then thread 9 el + 3 i + k
        (t < 9 FINISH_ELEMENTS) makes dw[co, ci, i, k] of element el."""
        du = cuda.shared.array(FINISH_THREADS, float32)
        cc = uint32(cin * cout)
        pos_stride = uint32(splits * cc)
        t = uint32(cuda.threadIdx.x)
        pos = uint32(t // _ELEMENTS)
        el = uint32(t - pos * _ELEMENTS)
        out_el = uint32(t // _U9)  # the transform's element and output (i, k) of thread t
        ik = uint32(t - out_el * _U9)
        i = uint32(ik // _U3)
        k = uint32(ik - i * _U3)
        groups = uint32(uint32(cc + _ELEMENTS - _U1) // _ELEMENTS)
        g = uint32(cuda.blockIdx.x)
        while g < groups:
            e0 = uint32(g * _ELEMENTS)
            e = uint32(e0 + el)
            if e < cc:
                idx = uint32(pos * pos_stride + e)
                du[t] = _add_in_order(partials, uint32(idx + cc), cc, uint32(splits - _U1), partials[idx])
            cuda.syncthreads()
            e = uint32(e0 + out_el)
            if out_el < _ELEMENTS and e < cc:  # (G^T dU) G: dw[.., i, k] from row i of G^T dU
                a0, a1 = _gt_du(du, out_el, i, 0), _gt_du(du, out_el, i, 1)
                a2, a3 = _gt_du(du, out_el, i, 2), _gt_du(du, out_el, i, 3)
                ci = uint32(e // cout)
                co = uint32(e - ci * cout)
                if k == _U0:
                    dw[co, ci, i, 0] = a0 + _HALF * (a1 + a2)
                elif k == _U1:
                    dw[co, ci, i, 1] = _HALF * (a1 - a2)
                else:
                    dw[co, ci, i, 2] = _HALF * (a1 + a2) + a3
            cuda.syncthreads()
            g = uint32(g + cuda.gridDim.x)
        if bias:
            stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
            c = uint32(cuda.blockIdx.x * cuda.blockDim.x + t)
            while c < cout:
                db[c] = _add_in_order(db_partials, uint32(c * chunks), _U1, chunks, _F0)
                c = uint32(c + stride)

    return wgrad_finish


def _finish_launch(bias, args, stream, name):
    """The finishing launch bound to `args` (partials, dw, db_partials, db, cin, cout, splits, chunks: uint32
    sizes): a block per FINISH_ELEMENTS elements (ci, co)."""
    groups = cdiv(int(args[4]) * int(args[5]), FINISH_ELEMENTS)
    return bind(_finish_kernel(bias), grid_for(groups, 1), FINISH_THREADS, args, stream, False, name)


def wgrad_splits(tiles: int, out_tiles: int, multiprocessors: int, waves: int = None, min_k: int = None) -> int:
    """The weight gradient's split count: as many chunks as keep the 16 positions' output tiles x splits within
    `waves` blocks per SM (no second, nearly empty wave), each chunk at least `min_k` tiles deep."""
    waves = WINOGRAD_WGRAD_WAVES if waves is None else waves
    min_k = WINOGRAD_MIN_K if min_k is None else min_k
    return max(1, min((waves * multiprocessors) // max(1, POSITIONS * out_tiles), tiles // min_k))


def conv_backward_weight_winograd(x, dy, dw, padding, version=None, block=None, stream=0, launch=True,
                                  splits=None, v=None, storage="fp32") -> LaunchGroup:
    """dw = dL/dw of out = conv(x, w) (overwritten): x (N, Cin, H, W), dy (N, Cout, OH, OW), dw (Cout, Cin, 3, 3)
    (any strides). ``splits``: the chunks of the tile sum (K of the batched GEMM) per position (None:
    ``wgrad_splits``; SIMULATOR_WGRAD_SPLITS under the simulator), summed in a fixed order. ``v``: the transformed
    x kept by this step's forward (its ``v``, of the same ``storage``; written before this group runs): no input
    transform here. ``storage``: V's and dM's (as the forward's)."""
    op = "conv_backward_weight_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    return _winograd_wgrad(op, x, dy, dw, padding, k, oh, ow, version, block, stream, launch, splits, False, v,
                           storage)


def conv_backward_weight_bias_winograd(x, dy, dw, db, padding, version=None, block=None, stream=0, launch=True,
                                       splits=None, v=None, storage="fp32") -> LaunchGroup:
    """``conv_backward_weight_winograd`` that also makes db (Cout,) = dy summed over images and pixels (overwritten)
    in its dy transform and finishing launches (module docstring)."""
    op = "conv_backward_weight_bias_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    check_db(op, db, int(dw.shape[0]))
    return _winograd_wgrad(op, x, dy, dw, padding, k, oh, ow, version, block, stream, launch, splits, False, v,
                           storage, db)


def conv_backward_weight_winograd_up(x, dy, dw, padding, version=None, block=None, stream=0, launch=True,
                                     splits=None, v=None, storage="fp32") -> LaunchGroup:
    """dw = dL/dw of out = conv(up(x), w) (overwritten): x (N, Cin, H, W), dy (N, Cout, OH, OW); ``splits``, ``v``
    and ``storage`` as in ``conv_backward_weight_winograd``."""
    op = "conv_backward_weight_winograd_up"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, upsampled_shape(shape(x)), dw, padding, "dw")
    return _winograd_wgrad(op, x, dy, dw, padding, k, oh, ow, version, block, stream, launch, splits, True, v,
                           storage)


def conv_backward_weight_bias_winograd_up(x, dy, dw, db, padding, version=None, block=None, stream=0, launch=True,
                                          splits=None, v=None, storage="fp32") -> LaunchGroup:
    """``conv_backward_weight_winograd_up`` that also makes db, as ``conv_backward_weight_bias_winograd``."""
    op = "conv_backward_weight_bias_winograd_up"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, upsampled_shape(shape(x)), dw, padding, "dw")
    check_db(op, db, int(dw.shape[0]))
    return _winograd_wgrad(op, x, dy, dw, padding, k, oh, ow, version, block, stream, launch, splits, True, v,
                           storage, db)


def _winograd_wgrad(op, x, dy, dw, padding, k, oh, ow, version, block, stream, launch, splits, up, v=None,
                    storage="fp32", db=None, route=None):
    """The weight gradient on the (oh, ow) grid of dy; `up`: x read through its 2x upsample; `v`: x transformed
    by the forward (None: transformed here); V and dM in `storage`; `db`: the bias gradient too; `route`: dy is
    the pooled gradient (N, Cout, oh//2, ow//2) of a fused conv + ReLU + 2x2 pool and `route` its route (the grid
    then the pooling windows': an odd oh's last row drops, as the pool's)."""
    _check(op, k, padding)
    n, cin, h, wd = shape(x)
    cout = int(dw.shape[0])
    pool = route is not None
    if pool:
        pooled = _pooled_shape(op, n, cout, oh, ow)
        src = _pooled_pair(op, "dpool", dy, route, pooled)
        oh, ow = 2 * pooled[2], 2 * pooled[3]
    else:
        _activation(op, "dy", dy)
        _expect(op, "dy", dy, (n, cout, oh, ow))
        src = flat(dy)
    td_x = _tdims(n, cin, h, wd, oh, ow, padding)
    td_dy = _tdims(n, cout, h, wd, oh, ow, padding)
    tiles = int(td_x[_T])
    version = _version(op, version, cin, cout)
    storage = _storage(op, storage, version)
    if splits is None:
        splits = (SIMULATOR_WGRAD_SPLITS if device.simulator_enabled() else
                  wgrad_splits(tiles, output_tiles(version, cin, cout), multiprocessors()))
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or splits < 1:
        raise ValueError(f"{op}: splits must be None or a positive int, got {splits!r}")
    splits = batch_chunks(tiles, int(splits), lookup(version).k_step)[0]
    dm = _scratch(POSITIONS * cout * tiles, storage)
    partials = _scratch(POSITIONS * splits * cin * cout)
    transform = []
    if v is None:
        v = _scratch(POSITIONS * cin * tiles, storage)
        transform = [_bind(_input_kernel(up, storage), cin * tiles, (flat(x), v, td_x), stream,
                           f"{op}[input transform{_tag(storage)}]")]
    else:
        _v_buffer(op, v, POSITIONS * cin * tiles, storage)
    threads = _threads()
    bias = db is not None
    chunks = cdiv(tiles, threads) if bias else 1
    db_partials = _scratch(cout * chunks)
    if bias:
        dy_launch = bind(_dy_kernel(storage, True, pool), (chunks, cout), threads, (src, dm, db_partials, td_dy),
                         stream, False, f"{op}[dy transform + bias sums{_tag(storage)}]")
    else:
        db = _scratch(1)  # (unused)
        dy_launch = _bind(_dy_kernel(storage, False, pool), cout * tiles, (src, dm, db_partials, td_dy), stream,
                          f"{op}[dy transform{_tag(storage)}]")
    group = LaunchGroup([
        *transform,
        dy_launch,
        gemm_batched(version, cin, cout, tiles, POSITIONS, v, dm, partials, a_map="batch_k", b_map="batch_t_k",
                     store="partial", splits=splits, block=block, stream=stream, launch=False, op=op),
        _finish_launch(bias, (partials, dw, db_partials, db, np.uint32(cin), np.uint32(cout), np.uint32(splits),
                              np.uint32(chunks)), stream,
                       f"{op}[sum {splits} + weight transform{' + bias' if bias else ''}]"),
    ])
    if launch:
        group()
    return group
