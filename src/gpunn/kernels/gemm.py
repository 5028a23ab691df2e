"""GEMM kernels: ``C = op(A) @ op(B)``, optionally followed by ``C += bias[col]`` and ReLU.

All arrays are float32, row-major (C-contiguous) device arrays. ``op(A)`` is (M, K): A is stored (M, K),
or (K, M) with ``trans_a=True``; ``op(B)`` is (K, N): B is stored (K, N), or (N, K) with ``trans_b=True``.
Transposed operands are read in place, never copied. C is (M, N); bias, when given, is (N,).

Versions (llm.c ``dev/cuda`` style, each a kernel plus a launcher ``gemm_vN``):

1. ``naive``: one thread per output element on a 2-D grid, block size (bx, by) a parameter.
2. ``tiled16``: 16x16 shared-memory tiles (``TILE``), zero-filled edge loads, coalesced tile loads for
   every transpose combination.
3. ``regblock``: register blocking: a block of ``RB_THREADS`` threads computes a ``BM x BN`` tile of C,
   stepping K by ``BK`` through shared tiles; each thread accumulates ``TM x TN`` outputs in a local
   array; each thread loads contiguous elements of the tiles; 32-bit index arithmetic.

``gemm(a, b, out, variant=...)`` dispatches through ``VARIANTS``; ``gemm_reference`` is the float64
NumPy reference the kernels are validated against.

The epilogue (bias, ReLU) is selected by boolean kernel arguments: the branch is uniform across the grid
and runs once per output element, after the inner product. Without a bias a 1-element dummy array is
passed so that every call has the same signature (one compiled specialisation per kernel).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

__all__ = [
    "TILE",
    "BM",
    "BN",
    "BK",
    "TM",
    "TN",
    "RB_THREADS",
    "VARIANTS",
    "gemm",
    "gemm_reference",
    "gemm_v1",
    "gemm_v2",
    "gemm_v3",
    "gemm_shapes",
]

# ---------------------------------------------------------------------------------------------------------
# CPU reference


def gemm_reference(a, b, trans_a=False, trans_b=False, bias=None, relu=False):
    """``op(A) @ op(B) (+ bias) (ReLU)`` in float64 NumPy (host arrays)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    c = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    if bias is not None:
        c = c + np.asarray(bias, dtype=np.float64)[None, :]
    if relu:
        c = np.maximum(c, 0.0)
    return c


# ---------------------------------------------------------------------------------------------------------
# Shape checks shared by the launchers


def _shape(x):
    return tuple(int(s) for s in x.shape)


def gemm_shapes(a, b, out, trans_a=False, trans_b=False, bias=None):
    """Validate the operands and return ``(M, N, K)``; raise ``ValueError`` naming the shapes."""
    what = (
        f"gemm: a{_shape(a)}{'^T' if trans_a else ''} @ b{_shape(b)}{'^T' if trans_b else ''}"
        f" -> out{_shape(out)}" + ("" if bias is None else f", bias{_shape(bias)}")
    )
    for name, x in (("a", a), ("b", b), ("out", out)):
        if len(x.shape) != 2:
            raise ValueError(f"{what}: {name} must be 2-D")
        if np.dtype(x.dtype) != np.float32:
            raise ValueError(f"{what}: {name} must be float32, got {x.dtype}")
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    m, n, k, kb = int(m), int(n), int(k), int(kb)
    if min(m, n, k, kb) == 0:
        raise ValueError(f"{what}: zero-sized dimension (M={m}, N={n}, K={k})")
    if k != kb:
        raise ValueError(f"{what}: inner dimensions differ ({k} != {kb})")
    if _shape(out) != (m, n):
        raise ValueError(f"{what}: out must be ({m}, {n})")
    if bias is not None:
        if _shape(bias) != (n,):
            raise ValueError(f"{what}: bias must be ({n},)")
        if np.dtype(bias.dtype) != np.float32:
            raise ValueError(f"{what}: bias must be float32, got {bias.dtype}")
    if max(m, n, k) >= 2**31:
        raise ValueError(f"{what}: dimensions must fit in int32")
    return m, n, k


_DUMMY_BIAS = None


def _bias_arg(bias):
    """The bias array, or a cached 1-element dummy when there is none; plus the has_bias flag."""
    global _DUMMY_BIAS
    if bias is not None:
        return bias, True
    if _DUMMY_BIAS is None:
        _DUMMY_BIAS = cuda.to_device(np.zeros(1, dtype=np.float32))
    return _DUMMY_BIAS, False


def _cdiv(x, y):
    return (x + y - 1) // y


# ---------------------------------------------------------------------------------------------------------
# Version 1: naive, one thread per output element.


@cuda.jit
def gemm_kernel1(a, b, c, bias, m, n, k, trans_a, trans_b, has_bias, relu):
    # x runs along the columns of C so that a warp writes C (and reads B) contiguously.
    col, row = cuda.grid(2)
    if row < m and col < n:
        acc = float32(0.0)
        for p in range(k):
            av = a[p, row] if trans_a else a[row, p]
            bv = b[col, p] if trans_b else b[p, col]
            acc += av * bv
        if has_bias:
            acc += bias[col]
        if relu and acc < float32(0.0):
            acc = float32(0.0)
        c[row, col] = acc


def gemm_v1(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, block=(16, 16)):
    """Naive GEMM; ``block`` is (bx, by), bx along the columns of C."""
    m, n, k = gemm_shapes(a, b, out, trans_a, trans_b, bias)
    bx, by = int(block[0]), int(block[1])
    if bx <= 0 or by <= 0 or bx * by > 1024:
        raise ValueError(f"gemm_v1: bad block {block} (need bx*by <= 1024)")
    grid = (_cdiv(n, bx), _cdiv(m, by))
    bias_arr, has_bias = _bias_arg(bias)
    gemm_kernel1[grid, (bx, by)](
        a, b, out, bias_arr, np.int32(m), np.int32(n), np.int32(k),
        bool(trans_a), bool(trans_b), has_bias, bool(relu),
    )
    return out


# ---------------------------------------------------------------------------------------------------------
# Version 2: 16x16 shared-memory tiles.

TILE = 16


@cuda.jit
def gemm_kernel2(a, b, c, bias, m, n, k, trans_a, trans_b, has_bias, relu):
    # sa[i, p] = op(A)[row0 + i, k0 + p]; sb[p, j] = op(B)[k0 + p, col0 + j].
    # Separate lines: the simulator aliases static shared arrays declared on one line.
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row0 = cuda.blockIdx.y * TILE
    col0 = cuda.blockIdx.x * TILE
    row = row0 + ty
    col = col0 + tx
    acc = float32(0.0)
    for k0 in range(0, k, TILE):
        # Each load has tx running along the contiguous axis of the stored array (coalesced);
        # the transposed cases write the tile transposed instead.
        if trans_a:  # A stored (K, M)
            r = k0 + ty
            q = row0 + tx
            sa[tx, ty] = a[r, q] if (r < k and q < m) else float32(0.0)
        else:  # A stored (M, K)
            q = k0 + tx
            sa[ty, tx] = a[row, q] if (row < m and q < k) else float32(0.0)
        if trans_b:  # B stored (N, K)
            r = col0 + ty
            q = k0 + tx
            sb[tx, ty] = b[r, q] if (r < n and q < k) else float32(0.0)
        else:  # B stored (K, N)
            r = k0 + ty
            sb[ty, tx] = b[r, col] if (r < k and col < n) else float32(0.0)
        cuda.syncthreads()
        for p in range(TILE):
            acc += sa[ty, p] * sb[p, tx]
        cuda.syncthreads()
    if row < m and col < n:
        if has_bias:
            acc += bias[col]
        if relu and acc < float32(0.0):
            acc = float32(0.0)
        c[row, col] = acc


def gemm_v2(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, block=(TILE, TILE)):
    """Shared-memory tiled GEMM; the block is fixed to (TILE, TILE)."""
    m, n, k = gemm_shapes(a, b, out, trans_a, trans_b, bias)
    if tuple(int(x) for x in block) != (TILE, TILE):
        raise ValueError(f"gemm_v2: block must be ({TILE}, {TILE}), got {block}")
    grid = (_cdiv(n, TILE), _cdiv(m, TILE))
    bias_arr, has_bias = _bias_arg(bias)
    gemm_kernel2[grid, (TILE, TILE)](
        a, b, out, bias_arr, np.int32(m), np.int32(n), np.int32(k),
        bool(trans_a), bool(trans_b), has_bias, bool(relu),
    )
    return out


# ---------------------------------------------------------------------------------------------------------
# Version 3: register blocking.
#
# Block tile BM x BN of C, K stepped by BK. Threads form a (BM/TM) x (BN/TN) grid; thread (ty, tx) owns the
# TM x TN outputs rows ty*TM.., cols tx*TN... Tiles are stored k-major (As[p, i], Bs[p, j]) so the inner
# loop reads TM (resp. TN) consecutive shared words per k. Each thread loads A_LOADS elements of A and
# B_LOADS of B per K step, consecutive along the stored array's contiguous axis. Napkin math: per k a
# thread does TM*TN FMAs for TM+TN shared loads (16 vs 8 at 4x4), against 1 vs 2 for version 2.

BM = 64
BN = 64
BK = 8
TM = 4
TN = 4
RB_THREADS = (BM // TM) * (BN // TN)  # 256
TMN = TM * TN  # local-array sizes must be plain module constants on the GPU (the simulator accepts expressions)
A_LOADS = BM * BK // RB_THREADS  # 2 elements of A per thread per K step
B_LOADS = BN * BK // RB_THREADS  # 2 elements of B per thread per K step
assert BM % TM == 0 and BN % TN == 0
assert A_LOADS * RB_THREADS == BM * BK and B_LOADS * RB_THREADS == BN * BK
assert BK % A_LOADS == 0 and BM % A_LOADS == 0 and BK % B_LOADS == 0 and BN % B_LOADS == 0
# 32-bit copies of the constants: mixing int32 with a plain Python int would widen to int64.
_BM = np.int32(BM)
_BN = np.int32(BN)
_BK = np.int32(BK)
_TM = np.int32(TM)
_TN = np.int32(TN)
_AL = np.int32(A_LOADS)
_BL = np.int32(B_LOADS)
_BK_AL = np.int32(BK // A_LOADS)  # threads per row of a non-transposed A tile
_BM_AL = np.int32(BM // A_LOADS)  # threads per row of a transposed A tile
_BN_BL = np.int32(BN // B_LOADS)  # threads per row of a non-transposed B tile
_BK_BL = np.int32(BK // B_LOADS)  # threads per row of a transposed B tile
_TX = np.int32(BN // TN)  # threads along the columns of the block tile
_ZERO = np.int32(0)
_ONE = np.int32(1)


@cuda.jit
def gemm_kernel3(a, b, c, bias, m, n, k, trans_a, trans_b, has_bias, relu):
    As = cuda.shared.array((BK, BM), float32)
    Bs = cuda.shared.array((BK, BN), float32)
    acc = cuda.local.array(TMN, float32)
    ra = cuda.local.array(TM, float32)
    rb = cuda.local.array(TN, float32)

    t = int32(cuda.threadIdx.x)
    m0 = int32(cuda.blockIdx.y) * _BM
    n0 = int32(cuda.blockIdx.x) * _BN
    ty = t // _TX
    tx = t - ty * _TX
    for i in range(TM * TN):
        acc[i] = float32(0.0)

    # Load coordinates inside the tiles, fixed for the whole K loop.
    if trans_a:  # A stored (K, M): a row of the tile is BM consecutive floats.
        a_p = t // _BM_AL
        a_i = (t - a_p * _BM_AL) * _AL
    else:  # A stored (M, K): a row of the tile is BK consecutive floats.
        a_i = t // _BK_AL
        a_p = (t - a_i * _BK_AL) * _AL
    if trans_b:  # B stored (N, K)
        b_j = t // _BK_BL
        b_p = (t - b_j * _BK_BL) * _BL
    else:  # B stored (K, N)
        b_p = t // _BN_BL
        b_j = (t - b_p * _BN_BL) * _BL

    k0 = _ZERO
    while k0 < k:
        # ---- global -> shared, zero-filled outside the matrices
        if trans_a:
            gp = k0 + a_p
            for u in range(A_LOADS):
                gi = m0 + a_i + int32(u)
                As[a_p, a_i + u] = a[gp, gi] if (gp < k and gi < m) else float32(0.0)
        else:
            gi = m0 + a_i
            for u in range(A_LOADS):
                gp = k0 + a_p + int32(u)
                As[a_p + u, a_i] = a[gi, gp] if (gi < m and gp < k) else float32(0.0)
        if trans_b:
            gj = n0 + b_j
            for u in range(B_LOADS):
                gp = k0 + b_p + int32(u)
                Bs[b_p + u, b_j] = b[gj, gp] if (gj < n and gp < k) else float32(0.0)
        else:
            gp = k0 + b_p
            for u in range(B_LOADS):
                gj = n0 + b_j + int32(u)
                Bs[b_p, b_j + u] = b[gp, gj] if (gp < k and gj < n) else float32(0.0)
        cuda.syncthreads()

        # ---- outer products from shared memory into registers
        for p in range(BK):
            for i in range(TM):
                ra[i] = As[p, ty * _TM + int32(i)]
            for j in range(TN):
                rb[j] = Bs[p, tx * _TN + int32(j)]
            for i in range(TM):
                for j in range(TN):
                    acc[i * TN + j] += ra[i] * rb[j]
        cuda.syncthreads()
        k0 += _BK

    # ---- epilogue and masked store
    for i in range(TM):
        gi = m0 + ty * _TM + int32(i)
        if gi < m:
            for j in range(TN):
                gj = n0 + tx * _TN + int32(j)
                if gj < n:
                    v = acc[i * TN + j]
                    if has_bias:
                        v += bias[gj]
                    if relu and v < float32(0.0):
                        v = float32(0.0)
                    c[gi, gj] = v


def gemm_v3(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, block=RB_THREADS):
    """Register-blocked GEMM; the block is fixed to ``RB_THREADS`` threads (BM x BN tile)."""
    m, n, k = gemm_shapes(a, b, out, trans_a, trans_b, bias)
    if int(np.prod(block)) != RB_THREADS:
        raise ValueError(f"gemm_v3: block must be {RB_THREADS} threads, got {block}")
    grid = (_cdiv(n, BN), _cdiv(m, BM))
    bias_arr, has_bias = _bias_arg(bias)
    gemm_kernel3[grid, RB_THREADS](
        a, b, out, bias_arr, np.int32(m), np.int32(n), np.int32(k),
        bool(trans_a), bool(trans_b), has_bias, bool(relu),
    )
    return out


# ---------------------------------------------------------------------------------------------------------
# Dispatcher

VARIANTS = {"naive": gemm_v1, "tiled16": gemm_v2, "regblock": gemm_v3}


def gemm(a, b, out, variant="tiled16", **kw):
    """``out = op(a) @ op(b)`` (+ bias, ReLU) with the named version; kw go to its launcher."""
    try:
        fn = VARIANTS[variant]
    except KeyError:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(VARIANTS)}") from None
    return fn(a, b, out, **kw)
