"""RBF kernel matrices by GEMM, in float64: the GEMM family's member for E6's support-vector machine.

    out[i, j] = exp(-gamma * max(a_sq[i] + b_sq[j] - 2 * sum_p a[i, p] * b[j, p], 0))

A (M, K) and B (N, K) are float64 device arrays whose rows are samples (the product is A @ B^T, both operands
read along K, in place); ``a_sq`` (M,) and ``b_sq`` (N,) their squared row norms (``row_sq_norms``); out (M, N)
float64, or float32 (the same float64 sums and epilogue, rounded once as they are stored: the GPU SVM solver's
resident kernel matrix, gpunn.smo). The products accumulate in float64 and the epilogue (the distance clamped at 0,
times -gamma, exp) is fused into the store. This is the formula scikit-learn's ``rbf_kernel`` evaluates, so the two
agree to rounding. Float64 because the cancellation in a_sq + b_sq - 2 a.b loses the digits of near neighbours in
float32. Own kernels, not the float32 versions: those are built around operand mappings this product does not need.

Versions (``VERSIONS``, dispatcher ``rbf_gemm(..., version=...)``), launchers ``rbf_gemm_<version>``:

    naive       one thread per output element, block (bx, by) a parameter
    tiled16     16x16 shared-memory tiles of A and B, both loaded along K (coalesced), zero-filled edges
    regblock64  64x64 block tile, BK 16, 4x4 outputs per thread, the next K tile loaded while this one is
                multiplied (``DEFAULT_VERSION``)

``rbf_reference`` is the float64 NumPy reference; ``row_sq_norms`` the norm kernel (one thread per row, summed in
order: the same bits at every launch). Napkin math and PTX facts: NOTES.md.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, uint32

from gpunn import device

from ..common import cdiv, check_fixed_block, shape
from ..jit import jit
from ..launch import Launch, bind, check_block, check_device_array, grid_for
from . import naive
from .mappings import SMEM_ALIGN, device_function
from .problem import U32_LIMIT

__all__ = [
    "DEFAULT_VERSION",
    "NORM_THREADS",
    "R_BK",
    "R_BM",
    "R_THREADS",
    "SIMULATOR_NORM_THREADS",
    "VERSIONS",
    "mirror_upper",
    "mirror_upper_reference",
    "rbf_gemm",
    "rbf_gemm_naive",
    "rbf_gemm_regblock64",
    "rbf_gemm_tiled16",
    "rbf_reference",
    "rbf_shapes",
    "row_sq_norms",
    "row_sq_norms_reference",
]

DEFAULT_VERSION = "regblock64"


# ---------------------------------------------------------------------------------------------------------
# CPU reference


def row_sq_norms_reference(x) -> np.ndarray:
    """Squared row norms of a (M, K) host array, in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    return np.einsum("ij,ij->i", x64, x64)


def rbf_reference(a, b, gamma) -> np.ndarray:
    """exp(-gamma * max(||a_i||^2 + ||b_j||^2 - 2 a_i . b_j, 0)) for host (M, K) and (N, K), in float64."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    d = row_sq_norms_reference(a64)[:, None] + row_sq_norms_reference(b64)[None, :] - 2.0 * (a64 @ b64.T)
    return np.exp(-float(gamma) * np.maximum(d, 0.0))


# ---------------------------------------------------------------------------------------------------------
# Checks


def rbf_shapes(a, b, out, a_sq, b_sq, op="rbf_gemm"):
    """Validate the operands (float64 device arrays; out float64 or float32) and return ``(M, N, K)``; ValueError
    naming the shapes."""
    out_dtype = np.float32 if getattr(out, "dtype", None) == np.float32 else np.float64
    for name, x, ndim in (("a", a, 2), ("b", b, 2), ("out", out, 2), ("a_sq", a_sq, 1), ("b_sq", b_sq, 1)):
        check_device_array(op, name, x, ndim, dtype=out_dtype if name == "out" else np.float64)
    (m, k), (n, kb) = shape(a), shape(b)
    what = f"{op}: a{shape(a)} @ b{shape(b)}^T -> out{shape(out)}"
    if k != kb:
        raise ValueError(f"{what}: a and b must have the same number of columns ({k} != {kb})")
    if shape(out) != (m, n):
        raise ValueError(f"{what}: out must be ({m}, {n})")
    if shape(a_sq) != (m,) or shape(b_sq) != (n,):
        raise ValueError(f"{what}: a_sq must be ({m},) and b_sq ({n},), got {shape(a_sq)} and {shape(b_sq)}")
    if max(m, n, k) >= U32_LIMIT:
        raise ValueError(f"{what}: dimensions must fit in int32")
    return m, n, k


def _gamma(op, gamma) -> np.float64:
    value = float(gamma)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{op}: gamma must be a positive finite number, got {gamma!r}")
    return np.float64(value)


def _dims(m, n, k):
    return (np.uint32(m), np.uint32(n), np.uint32(k))


_F0 = float64(0.0)
_M2 = float64(-2.0)
_U0 = np.uint32(0)
_U1 = np.uint32(1)
_U2 = np.uint32(2)


@device_function
def _rbf(a_sq, b_sq, gamma, dot):
    """The epilogue: exp(-gamma * max(a_sq + b_sq - 2 dot, 0))."""
    d = a_sq + b_sq + _M2 * dot
    if d < _F0:
        d = _F0
    return math.exp(-gamma * d)


# ---------------------------------------------------------------------------------------------------------
# naive: one thread per output element.


@jit
def rbf_naive_kernel(a, b, c, a_sq, b_sq, gamma, dims):
    # x runs along the columns of out: a warp writes out contiguously
    j = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    i = uint32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
    if i < dims[0] and j < dims[1]:
        acc = _F0
        p = _U0
        while p < dims[2]:
            acc += a[i, p] * b[j, p]
            p = uint32(p + _U1)
        c[i, j] = _rbf(a_sq[i], b_sq[j], gamma, acc)


def rbf_gemm_naive(a, b, out, a_sq, b_sq, gamma, block=(16, 16), stream=0, launch=True) -> Launch:
    """Naive RBF GEMM; ``block`` is (bx, by), bx along the columns of out."""
    op = "rbf_gemm_naive"
    m, n, k = rbf_shapes(a, b, out, a_sq, b_sq, op)
    grid, block = naive.config(op, block, m, n, rbf_naive_kernel)  # the float32 naive GEMM's block check and grid
    return bind(rbf_naive_kernel, grid, block, (a, b, out, a_sq, b_sq, _gamma(op, gamma), _dims(m, n, k)), stream,
                launch, op)


# ---------------------------------------------------------------------------------------------------------
# tiled16: 16x16 shared-memory tiles.

R_TILE = 16
_RT = np.uint32(R_TILE)


@jit
def rbf_tiled16_kernel(a, b, c, a_sq, b_sq, gamma, dims):
    # sa[i, p] = a[row0 + i, k0 + p]; sb[p, j] = b[col0 + j, k0 + p]. Both operands are read with tx along K
    # (their contiguous axis); B's tile is stored transposed. Separate lines: the simulator aliases static
    # shared arrays declared on one line.
    sa = cuda.shared.array((R_TILE, R_TILE), float64)
    sb = cuda.shared.array((R_TILE, R_TILE), float64)
    m = dims[0]
    n = dims[1]
    k = dims[2]
    tx = uint32(cuda.threadIdx.x)
    ty = uint32(cuda.threadIdx.y)
    row0 = uint32(cuda.blockIdx.y * _RT)
    col0 = uint32(cuda.blockIdx.x * _RT)
    ai = uint32(row0 + ty)
    bj = uint32(col0 + ty)
    acc = _F0
    k0 = _U0
    while k0 < k:
        p = uint32(k0 + tx)
        sa[ty, tx] = a[ai, p] if (ai < m and p < k) else _F0
        sb[tx, ty] = b[bj, p] if (bj < n and p < k) else _F0
        cuda.syncthreads()
        for q in range(R_TILE):
            acc += sa[ty, q] * sb[q, tx]
        cuda.syncthreads()
        k0 = uint32(k0 + _RT)
    i = uint32(row0 + ty)
    j = uint32(col0 + tx)
    if i < m and j < n:
        c[i, j] = _rbf(a_sq[i], b_sq[j], gamma, acc)


def rbf_gemm_tiled16(a, b, out, a_sq, b_sq, gamma, block=(R_TILE, R_TILE), stream=0, launch=True) -> Launch:
    """Shared-memory tiled RBF GEMM; the block is fixed to (16, 16)."""
    op = "rbf_gemm_tiled16"
    m, n, k = rbf_shapes(a, b, out, a_sq, b_sq, op)
    if isinstance(block, (int, np.integer)) or tuple(int(x) for x in block) != (R_TILE, R_TILE):
        raise ValueError(f"{op}: block must be ({R_TILE}, {R_TILE}), got {block}")
    device.check_block(op, R_TILE * R_TILE, rbf_tiled16_kernel)
    return bind(rbf_tiled16_kernel, (cdiv(n, R_TILE), cdiv(m, R_TILE)), (R_TILE, R_TILE),
                (a, b, out, a_sq, b_sq, _gamma(op, gamma), _dims(m, n, k)), stream, launch, op)


# ---------------------------------------------------------------------------------------------------------
# regblock64: register blocking, 64x64 block tile, BK 16, 4x4 outputs per thread.
#
# Thread t = 16 * ty + tx owns rows {2 ty + r, 32 + 2 ty + r} and columns {2 tx + s, 32 + 2 tx + s}, r, s in
# {0, 1}. Per k it reads two pairs of the A column and two of the B row from the k-major shared tiles: the
# 16 threads of a half-warp read 256 consecutive bytes of Bs (no bank conflict; the other half-warp reads the
# same words) and one 16-byte pair of As (a broadcast). Tile loads: thread t moves elements [4q, 4q + 4) of
# K (q = t // 64) of tile row t % 64, for A and for B alike (both are read along K); a warp's shared stores
# are then 32 consecutive words of one k row (conflict-free), and its global loads are one 32-byte sector
# per row. The loads of tile s + 1 are issued before the outer products of tile s and stored after them.

R_BM = 64  # block tile (rows and columns)
R_BK = 16  # K per tile
R_THREADS = 256
R_ACC = 16  # outputs per thread (local-array sizes: plain constants)
R_FRAG = 4  # A column / B row fragment per k
R_LD = 4  # elements of A (and of B) each thread loads per K step: 64 * 16 / 256
R_UNROLL = 2  # k per trip of the inner loop
assert R_ACC == R_FRAG * R_FRAG and R_LD * R_THREADS == R_BM * R_BK and R_BK % R_UNROLL == 0
assert (R_BM // 2) * 2 == R_BM and (R_BM // 2 // 2) ** 2 == R_THREADS
_R_BM = np.uint32(R_BM)
_R_BK = np.uint32(R_BK)
_R_HALF = np.uint32(R_BM // 2)
_R_TX = np.uint32(R_BM // 2 // 2)  # threads along the columns: 16
_R_LD = np.uint32(R_LD)
_R_UNROLL = np.uint32(R_UNROLL)


@jit
def rbf_regblock64_kernel(a, b, c, a_sq, b_sq, gamma, dims):
    As = cuda.shared.array((R_BK, R_BM), float64, alignment=SMEM_ALIGN)
    Bs = cuda.shared.array((R_BK, R_BM), float64, alignment=SMEM_ALIGN)
    acc = cuda.local.array(R_ACC, float64)
    ra = cuda.local.array(R_FRAG, float64)
    rb = cuda.local.array(R_FRAG, float64)
    la = cuda.local.array(R_LD, float64)  # the tile of A in flight (global -> registers -> shared)
    lb = cuda.local.array(R_LD, float64)
    m = dims[0]
    n = dims[1]
    k = dims[2]

    t = uint32(cuda.threadIdx.x)
    m0 = uint32(cuda.blockIdx.y * _R_BM)
    n0 = uint32(cuda.blockIdx.x * _R_BM)
    ty2 = uint32(t // _R_TX * _U2)  # first row and column of the thread's outputs in each quadrant
    tx2 = uint32(t % _R_TX * _U2)
    for u in range(R_ACC):
        acc[u] = _F0
    l_row = uint32(t % _R_BM)  # load coordinates, fixed for the whole K loop
    l_p = uint32(t // _R_BM * _R_LD)
    ai = uint32(m0 + l_row)
    bj = uint32(n0 + l_row)
    a_in = ai < m
    b_in = bj < n

    # Iteration s loads tile s into registers (if any), multiplies tile s - 1 (if any) from shared memory,
    # then stores tile s to shared memory: one load site and one compute site.
    k0 = _U0
    while True:
        if k0 < k:
            for u in range(R_LD):
                p = uint32(k0 + l_p + uint32(u))
                la[u] = a[ai, p] if (a_in and p < k) else _F0
                lb[u] = b[bj, p] if (b_in and p < k) else _F0
        if k0 > _U0:
            p0 = _U0
            while p0 < _R_BK:
                for q in range(R_UNROLL):
                    p = uint32(p0 + uint32(q))
                    for u in range(2):
                        ra[u] = As[p, ty2 + uint32(u)]
                        ra[u + 2] = As[p, ty2 + _R_HALF + uint32(u)]
                        rb[u] = Bs[p, tx2 + uint32(u)]
                        rb[u + 2] = Bs[p, tx2 + _R_HALF + uint32(u)]
                    for i in range(R_FRAG):
                        for j in range(R_FRAG):
                            acc[i * R_FRAG + j] += ra[i] * rb[j]
                p0 = uint32(p0 + _R_UNROLL)
            cuda.syncthreads()
        if k0 >= k:
            break
        for u in range(R_LD):
            As[l_p + uint32(u), l_row] = la[u]
            Bs[l_p + uint32(u), l_row] = lb[u]
        cuda.syncthreads()
        k0 = uint32(k0 + _R_BK)

    # ---- epilogue and masked store
    for i in range(R_FRAG):
        gi = uint32(m0 + ty2 + uint32(i // 2 * (R_BM // 2) + i % 2))
        if gi < m:
            asq = a_sq[gi]
            for j in range(R_FRAG):
                gj = uint32(n0 + tx2 + uint32(j // 2 * (R_BM // 2) + j % 2))
                if gj < n:
                    c[gi, gj] = _rbf(asq, b_sq[gj], gamma, acc[i * R_FRAG + j])


def rbf_gemm_regblock64(a, b, out, a_sq, b_sq, gamma, block=R_THREADS, stream=0, launch=True) -> Launch:
    """Register-blocked RBF GEMM (64x64 tile, BK 16, 4x4 per thread); the block is fixed to 256 threads."""
    op = "rbf_gemm_regblock64"
    m, n, k = rbf_shapes(a, b, out, a_sq, b_sq, op)
    check_fixed_block(op, block, R_THREADS, rbf_regblock64_kernel)
    return bind(rbf_regblock64_kernel, (cdiv(n, R_BM), cdiv(m, R_BM)), R_THREADS,
                (a, b, out, a_sq, b_sq, _gamma(op, gamma), _dims(m, n, k)), stream, launch, op)


# ---------------------------------------------------------------------------------------------------------
# Squared row norms: one thread per row (grid-stride), summing its row in order, so the result has the same
# bits at every launch. A warp's loads touch 32 rows at once, one 8-byte word each, but each 32-byte sector
# fetched serves the next three iterations from L1: E6's 50 000 x 8 192 rows are read once, milliseconds
# against the seconds of the GEMM. Few threads also keep simulator launches cheap (each simulated thread is
# a Python thread: a block per row with a shared-memory tree cost 2 ms per row there).

NORM_THREADS = 128  # on a GPU
SIMULATOR_NORM_THREADS = 32  # under the simulator


@jit
def row_sq_norms_kernel(x, out, dims):
    i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while i < dims[0]:
        s = _F0
        p = _U0
        while p < dims[1]:
            v = x[i, p]
            s += v * v
            p = uint32(p + _U1)
        out[i] = s
        i = uint32(i + stride)


def row_sq_norms(x, out, threads=None, stream=0, launch=True) -> Launch:
    """out[i] = sum_p x[i, p]^2 for a float64 (M, K) device array x and a float64 (M,) device array out.
    ``threads`` per block: default ``NORM_THREADS`` (``SIMULATOR_NORM_THREADS`` under the simulator)."""
    op = "row_sq_norms"
    check_device_array(op, "x", x, 2, dtype=np.float64)
    check_device_array(op, "out", out, 1, dtype=np.float64)
    m, k = shape(x)
    if shape(out) != (m,):
        raise ValueError(f"{op}: out must be ({m},) for x{shape(x)}, got {shape(out)}")
    if m >= U32_LIMIT or k >= U32_LIMIT:
        raise ValueError(f"{op}: x{shape(x)}: dimensions must fit in int32")
    if threads is None:
        threads = SIMULATOR_NORM_THREADS if device.simulator_enabled() else NORM_THREADS
    threads = check_block(op, threads)
    device.check_block(op, threads, row_sq_norms_kernel)
    return bind(row_sq_norms_kernel, grid_for(m, threads), threads, (x, out, (np.uint32(m), np.uint32(k))),
                stream, launch, op)


# ---------------------------------------------------------------------------------------------------------
# The lower triangle from the upper: a symmetric kernel matrix computed from its diagonal on (row blocks of
# columns [start, n)) is completed on the device by a tiled transpose.

MIRROR_TILE = 32
MIRROR_ROWS = 8  # threads per tile column: a (32, 8) block moves a 32 x 32 tile
MIRROR_PITCH = MIRROR_TILE + 1  # a shared tile row one longer than the tile: no bank conflicts on the transpose


@jit
def mirror_upper_kernel(a, n):
    tile = cuda.shared.array((MIRROR_TILE, MIRROR_PITCH), float32)
    bi = cuda.blockIdx.y  # the lower tile written: rows bi, columns bj
    bj = cuda.blockIdx.x
    if bj > bi:
        return
    tx = cuda.threadIdx.x
    for r in range(cuda.threadIdx.y, MIRROR_TILE, MIRROR_ROWS):  # the upper tile (bj, bi), read along its rows
        i = bj * MIRROR_TILE + r
        j = bi * MIRROR_TILE + tx
        if i < n and j < n:
            tile[r, tx] = a[i, j]
    cuda.syncthreads()
    for r in range(cuda.threadIdx.y, MIRROR_TILE, MIRROR_ROWS):
        i = bi * MIRROR_TILE + r
        j = bj * MIRROR_TILE + tx
        if i < n and j < n and i > j:
            a[i, j] = tile[tx, r]


def mirror_upper(a, stream=0, launch=True) -> Launch:
    """a[i, j] = a[j, i] below the diagonal of a square float32 device array (the upper triangle is read, the
    diagonal and above are not written)."""
    op = "mirror_upper"
    check_device_array(op, "a", a, 2, dtype=np.float32)
    n = shape(a)[0]
    if shape(a) != (n, n):
        raise ValueError(f"{op}: a must be square, got {shape(a)}")
    tiles = cdiv(n, MIRROR_TILE)
    return bind(mirror_upper_kernel, (tiles, tiles), (MIRROR_TILE, MIRROR_ROWS), (a, np.int64(n)), stream, launch,
                op)


def mirror_upper_reference(a) -> np.ndarray:
    """The upper triangle (diagonal included) of a host array and its transpose below."""
    upper = np.triu(np.asarray(a))
    return upper + np.triu(upper, 1).T


# ---------------------------------------------------------------------------------------------------------
# Dispatcher

VERSIONS = {"naive": rbf_gemm_naive, "tiled16": rbf_gemm_tiled16, "regblock64": rbf_gemm_regblock64}


def rbf_gemm(a, b, out, a_sq, b_sq, gamma, version=DEFAULT_VERSION, **kw) -> Launch:
    """``out = exp(-gamma * max(a_sq + b_sq - 2 a @ b^T, 0))`` by the named version; kw go to its launcher."""
    if version not in VERSIONS:
        raise ValueError(f"rbf_gemm: unknown version {version!r}; choose from {sorted(VERSIONS)}")
    return VERSIONS[version](a, b, out, a_sq, b_sq, gamma, **kw)
