"""GEMM kernels: ``C = op(A) @ op(B)`` followed by a fused epilogue, with compile-time operand mappings.

Operands and output are float32 2-D numba device arrays: C-contiguous, or strided views (``big[:, :784]``
of a (B, 785) array, a reshaped slice of a flat parameter buffer). ``op(A)`` is (M, K): A is stored (M, K),
or (K, M) with ``trans_a=True``; ``op(B)`` is (K, N): B is stored (K, N), or (N, K) with ``trans_b=True``.
Transposed operands are read in place, never copied. C is (M, N).

Epilogues (``EPILOGUES``, one per launch): ``none``; ``bias`` (C = acc + bias[col], bias (N,));
``bias_relu``; ``relu``; ``mask`` (C = acc where mask[row, col] > 0 else 0, mask (M, N) float32: the ReLU
backward fused into dH = dZ @ W2^T, with mask = the forward ReLU output H). ReLU keeps NaN (np.maximum).

Versions (llm.c ``dev/cuda`` style, each a kernel factory plus a launcher ``gemm_vN``):

1. ``naive``: one thread per output element on a 2-D grid, block size (bx, by) a parameter.
2. ``tiled16``: 16x16 shared-memory tiles, zero-filled edge loads, coalesced loads for every transpose.
3. ``regblock``: 64x64 block tile, BK 8, 4x4 outputs per thread in registers, 256 threads, k-major shared
   tiles, contiguous per-thread tile loads; the variant for small N (the 10-wide output layer).
4. ``regblock128``: 128x128 block tile, BK 8, 8x8 outputs per thread (four 4x4 quadrants 64 apart, so
   shared reads are conflict-free float4s), 256 threads; the next tile is loaded into registers while the
   current one is multiplied.
5. ``skinny``: for N <= 4 (a convolution with 1-3 output channels): a thread per row of C with 4 columns
   in registers, B staged in shared memory, A streamed from global memory. Mapped problems only
   (``gemm_mapped``, ``gemm_split_k``: ``MAPPED_VERSIONS``); the dense launchers and ``VERSIONS`` are v1-v4.

Every launcher is ``gemm_vN(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False,
relu_mask=None, block=..., stream=0, launch=True, splits=1) -> Launch``: it checks the operands, then binds
the launch (``gpunn.kernels.launch.bind``) and, unless ``launch=False``, runs it once. ``splits`` other than 1
(None: automatic; an int: that many) runs split-K (below) and returns a ``LaunchGroup``. The bound ``Launch``
holds the live device arrays, so calling it again recomputes from their current contents (the training
step binds once and replays; a CUDA graph can capture it). Host NumPy arrays are refused: numba would copy
them to the device and back at every launch.

Operand mappings. A kernel never indexes its operands itself: it asks three compile-time mappings, each
written once below and shared by all four versions:

* the A loader (``A_MAPS``) gives op(A)[i, p]: ``dense`` a[i, p]; ``dense_t`` a[p, i]; ``im2col``
  the implicit im2col matrix of an NCHW tensor with zero padding, rows (n, oh, ow), columns (c, kh, kw);
  ``channels`` an NCHW tensor seen as (C, N*H*W), rows c, columns (n, h, w);
* the B loader (``B_MAPS``) gives op(B)[p, j]: ``dense``; ``dense_t``; ``weight_t`` a (Cout, Cin, k, k)
  weight as B[(ci, kh, kw), co]; ``weight_flip_t`` B[(co, kh, kw), ci] = w[co, ci, k-1-kh, k-1-kw];
  ``im2col_k`` the im2col matrix in the K-rows role, B[(n, oh, ow), (c, kh, kw)];
* the store (``STORES``) puts C[i, j] (and reads the ``mask`` epilogue's aux at the same place): ``dense``
  c[i, j]; ``nchw`` row i = (n, oh, ow), column j = channel -> c[n, j, oh, ow] of a flat NCHW buffer;
  ``weight4`` row co, column (ci, kh, kw) -> c[co, ci, kh, kw]; ``partial`` the split-K scratch, C[i, j] of
  block z -> c[(z*M + i)*N + j] of a flat (splits, M, N) buffer.

A loader is ``outer(dims, index) -> state`` for the index that stays fixed through the K loop (the row of
A, the column of B), ``inner(dims, p) -> state`` for the K index, and ``get(array, dims, outer, inner)`` the
element, zero outside the matrix (and in the padding). Tiles are loaded so that each thread reads
consecutive elements along the axis the loader says is contiguous (``Loader.contig_k``): with a K-contiguous
loader a thread's outer index is fixed, so ``outer`` (e.g. the division of a pixel index by the output
width) runs once before the K loop. M, N, K and the mapping geometry come from a ``GemmProblem``, passed to
the kernel as one tuple of uint32 (``dims``), never from the arrays' shapes. ``gemm_mapped`` is the entry
taking a problem and mappings (``gpunn.kernels.conv_gemm`` builds its three convolutions on it).

Specialisation happens at compile time: a cached factory per (A map, B map, store, kernel size, epilogue)
returns a kernel whose mappings and flags are closure constants (numba prunes the dead branches, LLVM
inlines the mapping functions, so no flag is tested in the loops), and every kernel takes (a, b, c, aux,
dims). ``aux`` is the bias, the mask or a cached 1-element dummy.

Split-K (``gemm_split_k``, for few output tiles over a long K, e.g. the conv weight gradient): every version
runs its own K loop on chunk z of K (grid z, chunk length appended to ``dims``; a compile-time flag, so the
single-launch kernels compile to the same PTX as before), stores partial tiles into a (splits, M, N) scratch
buffer allocated at bind time, and a second launch sums them in the fixed order z = 0, 1, ... (no atomics,
bit-identical run to run) through the real epilogue and store. Both launches come back as one
``LaunchGroup``; one split is ``gemm_mapped``'s single launch. PTX facts are at the split-K section. The dense
launchers reach it through ``splits`` (the CNN's FC forward, 64 x 10 over K = 4608: 4 tiles of 16x16; the
engine's rule is ``gpunn.backends.gpu.policy.gemm_splits``).

``gemm(a, b, out, variant=...)`` dispatches through ``VERSIONS``; ``gemm_reference`` is the float64 NumPy
reference the kernels are validated against.

The family's float64 member lives next door, in ``gpunn.kernels.gemm_rbf``: ``A @ B^T`` of two row-major
sample matrices, accumulated in float64, with an RBF epilogue (``exp(-gamma * max(|a_i|^2 + |b_j|^2 -
2 a_i.b_j, 0))``; naive, 16x16 tiles, a 64x64 register-blocked version), E6's SVM kernel matrix. It has its
own kernels because everything here is float32 and built around operand mappings it does not need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32, uint64

from gpunn import device

from .launch import Launch, LaunchGroup, bind, check_device_array, grid_for

__all__ = [
    "A_MAPS",
    "BK",
    "BK4",
    "BM",
    "BM4",
    "BN",
    "BN4",
    "B_MAPS",
    "CONV_FIELDS",
    "EPILOGUES",
    "K_STEPS",
    "MAPPED_VERSIONS",
    "RB_THREADS",
    "SK_N",
    "SK_THREADS",
    "STORES",
    "TILE",
    "TM",
    "TN",
    "V4_THREADS",
    "VERSIONS",
    "GemmProblem",
    "auto_splits",
    "conv_problem",
    "fast_divmod_constants",
    "gemm",
    "gemm_mapped",
    "gemm_split_k",
    "gemm_reference",
    "gemm_shapes",
    "gemm_v1",
    "gemm_v2",
    "gemm_v3",
    "gemm_v4",
    "multiprocessors",
    "output_tiles",
    "split_k_chunks",
    "check_operand",
    "epilogue_args",
]

EPILOGUES = ("none", "bias", "bias_relu", "relu", "mask")
A_MAPS = ("dense", "dense_t", "im2col", "channels")
B_MAPS = ("dense", "dense_t", "weight_t", "weight_flip_t", "im2col_k")
STORES = ("dense", "nchw", "weight4", "partial")

# ---------------------------------------------------------------------------------------------------------
# CPU reference


def gemm_reference(a, b, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None):
    """``op(A) @ op(B)`` (+ bias) (ReLU) or masked by ``relu_mask > 0``, in float64 NumPy (host arrays)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    c = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    if bias is not None:
        c = c + np.asarray(bias, dtype=np.float64)[None, :]
    if relu:
        c = np.maximum(c, 0.0)
    if relu_mask is not None:
        c = np.where(np.asarray(relu_mask) > 0, c, 0.0)
    return c


# ---------------------------------------------------------------------------------------------------------
# Problem description

_U32_LIMIT = 2**31  # every index and every flat offset must stay below this (uint32 arithmetic, see below)

# Fields of ``GemmProblem.dims`` after (M, N, K) for the convolution mappings: the spatial grid (gh, gw) the
# pixel index (n, oh, ow) runs over, with the magic numbers of a division by gh*gw and by gw; the tensor the
# im2col mappings read (src: C, H, W); the zero padding (mod 2^32: negative in the backward-data GEMM when
# p > k - 1); and out_chw = C*gh*gw of the NCHW tensor on the pixel grid (the ``channels`` operand and the
# ``nchw`` store).
CONV_FIELDS = ("ghw", "ghw_mul", "ghw_shift", "gw", "gw_mul", "gw_shift", "src_chw", "src_hw", "src_h",
               "src_w", "pad", "out_chw")
_M, _N, _K = 0, 1, 2
(_GHW, _GHW_MUL, _GHW_SHIFT, _GW, _GW_MUL, _GW_SHIFT, _SRC_CHW, _SRC_HW, _SRC_H, _SRC_W, _PAD,
 _OUT_CHW) = range(3, 3 + len(CONV_FIELDS))


@dataclass(frozen=True)
class GemmProblem:
    """M, N, K and the extra geometry the operand mappings read (``CONV_FIELDS`` for the conv mappings)."""

    m: int
    n: int
    k: int
    geometry: tuple = ()

    def __post_init__(self):
        if min(self.m, self.n, self.k) < 1 or max(self.m, self.n, self.k) >= _U32_LIMIT:
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
    if not 1 <= d < _U32_LIMIT:
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


# ---------------------------------------------------------------------------------------------------------
# Checks shared by the launchers


def _shape(x):
    return tuple(int(s) for s in x.shape)


def check_operand(op, name, x, ndim):
    check_device_array(op, name, x, ndim)


def gemm_shapes(a, b, out, trans_a=False, trans_b=False, bias=None, relu_mask=None, op="gemm"):
    """Validate the operands and return ``(M, N, K)``; raise ``ValueError`` naming the shapes."""
    for name, x in (("a", a), ("b", b), ("out", out)):
        check_operand(op, name, x, 2)
    what = (
        f"{op}: a{_shape(a)}{'^T' if trans_a else ''} @ b{_shape(b)}{'^T' if trans_b else ''}"
        f" -> out{_shape(out)}"
    )
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    m, n, k, kb = int(m), int(n), int(k), int(kb)
    if k != kb:
        raise ValueError(f"{what}: inner dimensions differ ({k} != {kb})")
    if _shape(out) != (m, n):
        raise ValueError(f"{what}: out must be ({m}, {n})")
    if bias is not None:
        check_operand(op, "bias", bias, 1)
        if _shape(bias) != (n,):
            raise ValueError(f"{what}: bias must be ({n},), got {_shape(bias)}")
    if relu_mask is not None:
        check_operand(op, "relu_mask", relu_mask, 2)
        if _shape(relu_mask) != (m, n):
            raise ValueError(f"{what}: relu_mask must have out's shape ({m}, {n}), got {_shape(relu_mask)}")
    if max(m, n, k) >= _U32_LIMIT:
        raise ValueError(f"{what}: dimensions must fit in int32")
    return m, n, k


_DUMMY_AUX = None


def epilogue_args(op, bias, relu, relu_mask):
    """The epilogue name and the kernel's ``aux`` argument (bias, mask or a cached 1-element dummy)."""
    global _DUMMY_AUX
    if relu_mask is not None:
        if bias is not None or relu:
            raise ValueError(f"{op}: relu_mask (the ReLU backward) excludes bias and relu")
        return "mask", relu_mask
    if bias is not None:
        return ("bias_relu" if relu else "bias"), bias
    if _DUMMY_AUX is None:
        _DUMMY_AUX = cuda.to_device(np.zeros(1, dtype=np.float32))
    return ("relu" if relu else "none"), _DUMMY_AUX


def _flags(epilogue):
    """(add bias, ReLU, mask) closure constants of a kernel specialisation."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm: unknown epilogue {epilogue!r}; choose from {EPILOGUES}")
    return epilogue in ("bias", "bias_relu"), epilogue in ("bias_relu", "relu"), epilogue == "mask"


def _cdiv(x, y):
    return (x + y - 1) // y


def _fixed_block(op, block, threads, kernel):
    """Versions 2-4 run a fixed number of threads (1-D or 2-D ``block`` of that total)."""
    dims = (block,) if isinstance(block, (int, np.integer)) else tuple(block)
    if int(np.prod(dims)) != threads:
        raise ValueError(f"{op}: block must be {threads} threads, got {block}")
    device.check_block(op, threads, kernel)


# Index arithmetic. numba widens every integer operation to 64 bits (uint32 + uint32 -> uint64) and, for
# signed indices, adds a negative-index wraparound select to each array access. Wrapping an expression in
# uint32(...) truncates it, and LLVM then narrows the whole expression back to 32-bit instructions;
# unsigned indices need no wraparound. Constants are np.uint32 so that they do not widen what they touch.
# The conv mappings also rely on the wrap: a window origin above or left of the image is oh - pad mod 2^32,
# huge, so one unsigned compare (ih < H) rejects both sides of the padding.
_U0 = np.uint32(0)
_U1 = np.uint32(1)
_U2 = np.uint32(2)
_U4 = np.uint32(4)
_U32 = np.uint32(32)
_SHIFT32 = np.uint64(32)
_F0 = float32(0.0)
# 16-byte aligned shared tiles let NVVM read 4 consecutive floats as one ld.shared.v4; the simulator rejects
# any alignment argument (None means the default there).
_SMEM_ALIGN = None if device.simulator_enabled() else 16


def _device(fn):
    """A device function; on a GPU inlined at the NVVM level (the simulator has no forceinline)."""
    if device.simulator_enabled():
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


# ---------------------------------------------------------------------------------------------------------
# Operand mappings (written once; the kernels below only call them)


@_device
def _divmod(x, d, mul, shift):
    """(x // d, x % d) for x < 2^31 with the constants of fast_divmod_constants(d)."""
    hi = uint32((uint64(x) * uint64(mul)) >> _SHIFT32)
    q = uint32(uint32(hi + x) >> shift)
    return q, uint32(x - q * d)


@_device
def _pixel(dims, r):
    """Pixel r = (n, oh, ow) of the grid: (r, offset of its window origin (oh - pad, ow - pad) in src,
    oh - pad, ow - pad), all mod 2^32. Two multiplications by magic numbers instead of two divisions."""
    n, s = _divmod(r, dims[_GHW], dims[_GHW_MUL], dims[_GHW_SHIFT])
    oh, ow = _divmod(s, dims[_GW], dims[_GW_MUL], dims[_GW_SHIFT])
    ohp = uint32(oh - dims[_PAD])
    owp = uint32(ow - dims[_PAD])
    return r, uint32(n * dims[_SRC_CHW] + ohp * dims[_SRC_W] + owp), ohp, owp


@_device
def _channel_pixel(dims, q):
    """Column q = (n, s) of an NCHW tensor seen as (C, N*gh*gw): (q, offset of [n, 0, s])."""
    n, s = _divmod(q, dims[_GHW], dims[_GHW_MUL], dims[_GHW_SHIFT])
    return q, uint32(n * dims[_OUT_CHW] + s)


@functools.cache
def _patch_fns(ksize):
    """Decompositions of a patch index (c, kh, kw) of a ksize x ksize kernel: divisions by constants."""
    kk = np.uint32(ksize * ksize)
    ks = np.uint32(ksize)
    last = np.uint32(ksize - 1)

    @_device
    def patch(dims, q):
        """Column q = (c, kh, kw) of the im2col matrix: (q, offset of (c, kh, kw) from the window origin,
        kh, kw)."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        kw = uint32(rem - kh * ks)
        return q, uint32(c * dims[_SRC_HW] + kh * dims[_SRC_W] + kw), kh, kw

    @_device
    def weight_index(q):
        """q = (c, kh, kw) -> (c, kh, kw)."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return c, kh, uint32(rem - kh * ks)

    @_device
    def flipped_index(q):
        """q = (c, kh, kw) -> (c, k-1-kh, k-1-kw): the spatially flipped kernel."""
        c = uint32(q // kk)
        rem = uint32(q - c * kk)
        kh = uint32(rem // ks)
        return c, uint32(last - kh), uint32(last - uint32(rem - kh * ks))

    return patch, weight_index, flipped_index


@_device
def _im2col_get(x, dims, pix, pat):
    """x_flat[n, c, oh + kh - pad, ow + kw - pad], 0 in the padding (pix from _pixel, pat from patch)."""
    ih = uint32(pix[2] + pat[2])
    iw = uint32(pix[3] + pat[3])
    if ih < dims[_SRC_H] and iw < dims[_SRC_W]:
        return x[uint32(pix[1] + pat[1])]
    return _F0


@_device
def _index1(dims, i):
    """The state of a dense index: the index itself."""
    return i


class Loader(NamedTuple):
    """One operand mapping: see the module docstring."""

    contig_k: bool  # consecutive K indices are (about) consecutive in memory: a thread's outer index is fixed
    outer: object
    inner: object
    get: object


@functools.cache
def _a_loader(kind, ksize):
    """op(A)[i, p] of an A mapping; outer index i < M, inner p < K."""
    if kind == "dense":  # a (M, K)

        @_device
        def get(a, dims, i, p):
            return a[i, p] if (i < dims[_M] and p < dims[_K]) else _F0

        return Loader(True, _index1, _index1, get)
    if kind == "dense_t":  # a (K, M)

        @_device
        def get(a, dims, i, p):
            return a[p, i] if (p < dims[_K] and i < dims[_M]) else _F0

        return Loader(False, _index1, _index1, get)
    if kind == "im2col":  # x flat NCHW (src); rows pixels of the grid, columns (c, kh, kw)
        patch = _patch_fns(ksize)[0]

        @_device
        def get(x, dims, pix, pat):
            if pix[0] < dims[_M] and pat[0] < dims[_K]:
                return _im2col_get(x, dims, pix, pat)
            return _F0

        return Loader(True, _pixel, patch, get)
    if kind == "channels":  # flat NCHW tensor on the grid with M channels, as (M, N*gh*gw)

        @_device
        def outer(dims, c):
            return c, uint32(c * dims[_GHW])

        @_device
        def get(t, dims, row, col):
            return t[uint32(row[1] + col[1])] if (row[0] < dims[_M] and col[0] < dims[_K]) else _F0

        return Loader(True, outer, _channel_pixel, get)
    raise ValueError(f"gemm: unknown A mapping {kind!r}; choose from {A_MAPS}")


@functools.cache
def _b_loader(kind, ksize):
    """op(B)[p, j] of a B mapping; outer index j < N, inner p < K."""
    if kind == "dense":  # b (K, N)

        @_device
        def get(b, dims, j, p):
            return b[p, j] if (p < dims[_K] and j < dims[_N]) else _F0

        return Loader(False, _index1, _index1, get)
    if kind == "dense_t":  # b (N, K)

        @_device
        def get(b, dims, j, p):
            return b[j, p] if (j < dims[_N] and p < dims[_K]) else _F0

        return Loader(True, _index1, _index1, get)
    patch, weight_index, flipped_index = _patch_fns(ksize)
    if kind in ("weight_t", "weight_flip_t"):  # w (Cout, Cin, k, k), any strides
        flip = kind == "weight_flip_t"

        @_device
        def get(w, dims, j, p):
            if j < dims[_N] and p < dims[_K]:
                if flip:  # B[(co, kh, kw), ci] = w[co, ci, k-1-kh, k-1-kw]
                    co, kh, kw = flipped_index(p)
                    return w[co, j, kh, kw]
                ci, kh, kw = weight_index(p)  # B[(ci, kh, kw), co] = w[co, ci, kh, kw]
                return w[j, ci, kh, kw]
            return _F0

        return Loader(True, _index1, _index1, get)
    if kind == "im2col_k":  # x flat NCHW (src); K rows pixels of the grid, N columns (c, kh, kw)

        @_device
        def get(x, dims, pat, pix):
            if pat[0] < dims[_N] and pix[0] < dims[_K]:
                return _im2col_get(x, dims, pix, pat)
            return _F0

        return Loader(True, patch, _pixel, get)
    raise ValueError(f"gemm: unknown B mapping {kind!r}; choose from {B_MAPS}")


@functools.cache
def _store_fns(kind, ksize):
    """(row(dims, i) -> state, at(dims, state, j) -> index of C[i, j] in c and in the mask)."""
    if kind == "dense":  # c (M, N), any strides

        @_device
        def at(dims, i, j):
            return i, j

        return _index1, at
    if kind == "nchw":  # c flat NCHW on the grid, N channels; row i = pixel (n, oh, ow)

        @_device
        def row(dims, i):
            n, s = _divmod(i, dims[_GHW], dims[_GHW_MUL], dims[_GHW_SHIFT])
            return uint32(n * dims[_OUT_CHW] + s)

        @_device
        def at(dims, base, j):
            return uint32(base + j * dims[_GHW])

        return row, at
    if kind == "weight4":  # c (Cout, Cin, k, k), any strides; row co, column (ci, kh, kw)
        weight_index = _patch_fns(ksize)[1]

        @_device
        def at(dims, co, j):
            ci, kh, kw = weight_index(j)
            return co, ci, kh, kw

        return _index1, at
    if kind == "partial":  # split-K scratch: c flat (splits, M, N), slice blockIdx.z holds this block's sums

        @_device
        def row(dims, i):
            return uint32(uint32(uint32(cuda.blockIdx.z) * dims[_M] + i) * dims[_N])

        @_device
        def at(dims, base, j):
            return uint32(base + j)

        return row, at
    raise ValueError(f"gemm: unknown store {kind!r}; choose from {STORES}")


@functools.cache
def _finish(store, ksize, epilogue):
    """The epilogue and the store, one device function: C[i, j] = epilogue(acc) for a row state of i."""
    has_bias, relu, mask = _flags(epilogue)
    at = _store_fns(store, ksize)[1]

    @_device
    def finish(c, aux, dims, row, j, v):
        idx = at(dims, row, j)
        if has_bias:
            v += aux[j]
        if relu and v < _F0:
            v = _F0
        if mask and not aux[idx] > _F0:
            v = _F0
        c[idx] = v

    return finish


# The K range of a block. Without split-K it is all of K, and k_begin is the constant 0: the kernels compile to
# what they were before split-K. With split-K the last element of dims is the chunk length k_len (a multiple
# of the version's K step, so a block's tiles never reach into the next chunk) and block z runs
# [z * k_len, min(K, (z + 1) * k_len)); the loaders still zero-fill against the whole K. Two uint32
# multiply-adds and a min, once per thread, outside the K loop.
_KLEN = -1  # static index: the tuple's length is part of its type


@_device
def _k_range_all(dims):
    return _U0, dims[_K]


@_device
def _k_range_chunk(dims):
    k_begin = uint32(uint32(cuda.blockIdx.z) * dims[_KLEN])
    return k_begin, uint32(min(dims[_K], uint32(k_begin + dims[_KLEN])))


def _k_range_fn(split_k):
    return _k_range_chunk if split_k else _k_range_all


def _parts(a_map, b_map, store, ksize, epilogue):
    """The compile-time pieces of one kernel specialisation, flat (numba takes device functions as closure
    constants, not inside a tuple): A contig_k, outer, inner, get; the same for B; the store's row
    function; the epilogue + store."""
    la, lb = _a_loader(a_map, ksize), _b_loader(b_map, ksize)
    return (*la, *lb, _store_fns(store, ksize)[0], _finish(store, ksize, epilogue))


# ---------------------------------------------------------------------------------------------------------
# Version 1: naive, one thread per output element.


@functools.cache
def _kernel1(a_map, b_map, store, ksize, epilogue, split_k=False):
    _, a_outer, a_inner, a_get, _, b_outer, b_inner, b_get, out_row, finish = _parts(
        a_map, b_map, store, ksize, epilogue)
    k_range = _k_range_fn(split_k)

    @cuda.jit
    def gemm_kernel1(a, b, c, aux, dims):
        # x runs along the columns of C so that a warp writes C (and reads B) contiguously.
        col = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        row = uint32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
        k_begin, k = k_range(dims)
        if row < dims[_M] and col < dims[_N]:
            ao = a_outer(dims, row)
            bo = b_outer(dims, col)
            acc = float32(0.0)
            p = k_begin
            while p < k:
                acc += a_get(a, dims, ao, a_inner(dims, p)) * b_get(b, dims, bo, b_inner(dims, p))
                p = uint32(p + _U1)
            finish(c, aux, dims, out_row(dims, row), col, acc)

    return gemm_kernel1


def _config1(op, block, m, n, kernel):
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0 for x in block)):
        raise ValueError(f"{op}: block must be (bx, by), two positive ints, got {block!r}")
    bx, by = int(block[0]), int(block[1])
    device.check_block(op, bx * by, kernel)
    return (_cdiv(n, bx), _cdiv(m, by)), (bx, by)


# ---------------------------------------------------------------------------------------------------------
# Version 2: 16x16 shared-memory tiles.

TILE = 16
_UT = np.uint32(TILE)


@functools.cache
def _kernel2(a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = _parts(a_map, b_map, store, ksize, epilogue)
    k_range = _k_range_fn(split_k)

    @cuda.jit
    def gemm_kernel2(a, b, c, aux, dims):
        # sa[i, p] = op(A)[row0 + i, k0 + p]; sb[p, j] = op(B)[k0 + p, col0 + j].
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        sa = cuda.shared.array((TILE, TILE), float32)
        sb = cuda.shared.array((TILE, TILE), float32)
        k_begin, k = k_range(dims)
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        row0 = uint32(cuda.blockIdx.y * _UT)
        col0 = uint32(cuda.blockIdx.x * _UT)
        # Each load has tx running along the operand's contiguous axis (coalesced); where that is the outer
        # axis (M of A, N of B) the tile is written transposed. The outer index of a thread is fixed.
        if a_contig_k:
            ao = a_outer(dims, uint32(row0 + ty))
        else:
            ao = a_outer(dims, uint32(row0 + tx))
        if b_contig_k:
            bo = b_outer(dims, uint32(col0 + ty))
        else:
            bo = b_outer(dims, uint32(col0 + tx))
        acc = float32(0.0)
        k0 = k_begin
        while k0 < k:
            if a_contig_k:
                sa[ty, tx] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + tx)))
            else:
                sa[tx, ty] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + ty)))
            if b_contig_k:
                sb[tx, ty] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + tx)))
            else:
                sb[ty, tx] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + ty)))
            cuda.syncthreads()
            for p in range(TILE):
                acc += sa[ty, p] * sb[p, tx]
            cuda.syncthreads()
            k0 = uint32(k0 + _UT)
        row = uint32(row0 + ty)
        col = uint32(col0 + tx)
        if row < dims[_M] and col < dims[_N]:
            finish(c, aux, dims, out_row(dims, row), col, acc)

    return gemm_kernel2


def _config2(op, block, m, n, kernel):
    if isinstance(block, (int, np.integer)) or tuple(int(x) for x in block) != (TILE, TILE):
        raise ValueError(f"{op}: block must be ({TILE}, {TILE}), got {block}")
    device.check_block(op, TILE * TILE, kernel)
    return (_cdiv(n, TILE), _cdiv(m, TILE)), (TILE, TILE)


# ---------------------------------------------------------------------------------------------------------
# Version 3: register blocking, 64x64 block tile.
#
# Block tile BM x BN of C, K stepped by BK. Threads form a (BM/TM) x (BN/TN) grid; thread (ty, tx) owns the
# TM x TN outputs rows ty*TM.., cols tx*TN... Tiles are stored k-major (As[p, i], Bs[p, j]) so the inner
# loop reads TM (resp. TN) consecutive shared words per k. Each thread loads A_LOADS elements of A and
# B_LOADS of B per K step, consecutive along the operand's contiguous axis. Napkin math: per k a
# thread does TM*TN = 16 FMAs for 2 float4 shared loads, against 1 FMA per 2 loads in version 2.

BM = 64
BN = 64
BK = 8
TM = 4
TN = 4
RB_THREADS = (BM // TM) * (BN // TN)  # 256
# Local-array sizes must be plain module constants: an expression (TM * TN) types in the simulator only.
TMN = 16
A_LOADS = BM * BK // RB_THREADS  # 2 elements of A per thread per K step
B_LOADS = BN * BK // RB_THREADS  # 2 elements of B per thread per K step
assert TMN == TM * TN and BM % TM == 0 and BN % TN == 0
assert A_LOADS * RB_THREADS == BM * BK and B_LOADS * RB_THREADS == BN * BK
assert BK % A_LOADS == 0 and BM % A_LOADS == 0 and BK % B_LOADS == 0 and BN % B_LOADS == 0
_BM = np.uint32(BM)
_BN = np.uint32(BN)
_BK = np.uint32(BK)
_TM = np.uint32(TM)
_TN = np.uint32(TN)
_AL = np.uint32(A_LOADS)
_BL = np.uint32(B_LOADS)
_BK_AL = np.uint32(BK // A_LOADS)  # threads per row of a K-contiguous A tile
_BM_AL = np.uint32(BM // A_LOADS)  # threads per row of an M-contiguous A tile
_BN_BL = np.uint32(BN // B_LOADS)  # threads per row of an N-contiguous B tile
_BK_BL = np.uint32(BK // B_LOADS)  # threads per row of a K-contiguous B tile
_TX = np.uint32(BN // TN)  # threads along the columns of the block tile
UNROLL = 2  # k steps per iteration of the inner loop (LLVM leaves larger unrolls rolled, 64-bit)
_UNROLL = np.uint32(UNROLL)


@functools.cache
def _kernel3(a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = _parts(a_map, b_map, store, ksize, epilogue)
    k_range = _k_range_fn(split_k)

    @cuda.jit
    def gemm_kernel3(a, b, c, aux, dims):
        As = cuda.shared.array((BK, BM), float32, alignment=_SMEM_ALIGN)
        Bs = cuda.shared.array((BK, BN), float32, alignment=_SMEM_ALIGN)
        acc = cuda.local.array(TMN, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        m = dims[_M]
        n = dims[_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        ty4 = uint32(t // _TX * _TM)  # first row and column of the thread's outputs in the tile
        tx4 = uint32(t % _TX * _TN)
        for i in range(TMN):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop; so is the outer index of a
        # K-contiguous operand, whose state is computed here once.
        if a_contig_k:  # a row of the tile is BK consecutive K indices
            a_i = uint32(t // _BK_AL)
            a_p = uint32(t % _BK_AL * _AL)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:  # a row of the tile is BM consecutive M indices
            a_p = uint32(t // _BM_AL)
            a_i = uint32(t % _BM_AL * _AL)
        if b_contig_k:
            b_j = uint32(t // _BK_BL)
            b_p = uint32(t % _BK_BL * _BL)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _BN_BL)
            b_j = uint32(t % _BN_BL * _BL)

        k0 = k_begin
        while k0 < k:
            # ---- global -> shared, zero-filled outside the matrices
            if a_contig_k:
                for u in range(A_LOADS):
                    As[a_p + uint32(u), a_i] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + a_p + uint32(u))))
            else:
                ai = a_inner(dims, uint32(k0 + a_p))
                for u in range(A_LOADS):
                    As[a_p, a_i + uint32(u)] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(u))), ai)
            if b_contig_k:
                for u in range(B_LOADS):
                    Bs[b_p + uint32(u), b_j] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p + uint32(u))))
            else:
                bi = b_inner(dims, uint32(k0 + b_p))
                for u in range(B_LOADS):
                    Bs[b_p, b_j + uint32(u)] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(u))), bi)
            cuda.syncthreads()

            # ---- outer products from shared memory into registers (a uint32 loop unrolled by 2:
            # numba's range() loop keeps a 64-bit counter and a negative-index check on p)
            p0 = _U0
            while p0 < _BK:
                for q in range(UNROLL):
                    p = p0 + uint32(q)
                    for i in range(TM):
                        ra[i] = As[p, ty4 + uint32(i)]
                    for j in range(TN):
                        rb[j] = Bs[p, tx4 + uint32(j)]
                    for i in range(TM):
                        for j in range(TN):
                            acc[i * TN + j] += ra[i] * rb[j]
                p0 = uint32(p0 + _UNROLL)
            cuda.syncthreads()
            k0 = uint32(k0 + _BK)

        # ---- epilogue and masked store
        for i in range(TM):
            gi = uint32(m0 + ty4 + uint32(i))
            if gi < m:
                row = out_row(dims, gi)
                for j in range(TN):
                    gj = uint32(n0 + tx4 + uint32(j))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[i * TN + j])

    return gemm_kernel3


def _config3(op, block, m, n, kernel):
    _fixed_block(op, block, RB_THREADS, kernel)
    return (_cdiv(n, BN), _cdiv(m, BM)), RB_THREADS


# ---------------------------------------------------------------------------------------------------------
# Version 4: register blocking, 128x128 block tile, 8x8 outputs per thread.
#
# Thread t = 16 * ty + tx owns rows {ty*4 + r, 64 + ty*4 + r} and columns {tx*4 + s, 64 + tx*4 + s},
# r, s in 0..3. Per k it reads two float4 of the A column and two of the B row from the k-major shared
# tiles: the 16 threads of a half-warp read 256 consecutive bytes of Bs (no bank conflict) and 2 distinct
# addresses of As (broadcast). Tile loads: each thread moves 4 consecutive elements along the operand's
# contiguous axis (a row of a (128, 8) tile is 2 threads, of an (8, 128) tile 32 threads); the (128, 8)
# tiles are written transposed into rows padded to 132 floats, so the 32 stores of a warp hit 32 different
# banks. The loads of tile k+1 are issued before the outer products of tile k and stored to shared memory
# after them, so their latency hides behind 512 FMAs.
#
# Napkin math (H200: 132 SMs x 128 FP32 lanes x 2 FLOP x 1.98 GHz = 67 TFLOP/s fp32; cuBLAS 51, goal >= 25).
# Per thread and K step (BK = 8): 512 FMAs against 32 ld.shared.v4, 8 global loads, 2 barriers. Per warp
# and k: 64 FMA instructions = 16 cycles of the SM's four 32-lane FMA pipes, against 6 shared-memory
# wavefronts (2 broadcast As reads, 2 x 256 B of Bs) at 1 per cycle: shared bandwidth is not the limit.
# L2 -> SM: 8 KiB per block and K step for 262 kFLOP = 32 FLOP/B, 2.1 TB/s at peak. With <= 128
# registers per thread and 8.25 KiB of shared memory per block, 2 blocks (16 warps) fit on an SM.
#
# PTX / ptxas facts (numba-cuda 0.30.4 + NVVM/ptxas 13.5 from numba-cuda[cu13], cc 9.0, compile_ptx and
# nvJitLink, no GPU; per kernel: all 4 transpose combinations x epilogues none / bias_relu / mask, float32
# C-layout arrays, and 'A'-layout (strided) arrays with no epilogue):
#
#   kernel                 regs     spills  ld/st.local  inner loop (per 2 k)                 per K step
#   v4 C layout            117-119  0       0            141 instr: 128 fma, 8 ld.shared.v4,  635-641 instr,
#                                                        2 add.s64 (shared pointers), no      80% fma
#                                                        64-bit mul/mad, 32-bit counter
#   v4 A layout (strided)  121-128  0       0            same 141                             649 instr, 79%
#   v3 C / A layout        47-56    0       0            41 instr: 32 fma, 4 ld.shared.v4,    209-212 instr,
#                                                        2 add.s64                            60% fma
#   v3 before this rewrite 62-63    0       0            44 instr: 16 fma, 8 scalar           -
#     (int32 indices,                                    ld.shared, 17 64-bit integer ops
#     range() loops)                                     (counter, negative-index wrap of p)
#
# What got there: uint32(...) around every index expression (numba otherwise computes in int64 and adds
# a wraparound select for signed indices); a uint32 while loop over k unrolled by 2 in source (numba's
# range() keeps a 64-bit counter, and LLVM left unrolls by 4 or 8 rolled); alignment=16 on the shared
# tiles (ld.shared.v4; with numba's default 4-byte alignment the fragments are 16 scalar loads).
#
# Before / after the operand-mapping refactor (loaders, store and epilogue as inlined device functions,
# M/N/K from the dims tuple). Same measurement, other toolchain: NVVM (libnvvm) and ptxas 13.0 of a CUDA
# 13.0 toolkit, compile_ptx(cc=(9, 0)) without a GPU; "K loop" is the static code of the K loop, "per K
# step" adds the inner loop's 4 trips. Every one of the 32 kernels (v3, v4 x NN/NT/TN/TT x none /
# bias_relu / mask on C layout, none on 'A' layout): 0 spills, 0 ld/st.local, no 64-bit mul/mad in the
# inner loop, 0 div/rem instructions.
#
#   kernel                     regs before -> after   inner loop (per 2 k)         K loop: int64 ops, mul/mad.s64;
#                                                      before = after               per K step before -> after
#   v3 C, 12 kernels           47-55 -> 47-55         41: 32 fma, 4 ld.shared.v4   11-13, 0-2; 207-212 = same
#                              (NN bias_relu/mask 48 -> 47)
#   v3 A, 4 kernels            55-56 -> 55-56         same                         11-14, 2-4; 209-213 = same
#   v4 C, 12 kernels           119-127 -> 119-125     141: 128 fma, 8 ld.shared.v4 11-18, 0-2; 635-641 = same
#                              (TN bias_relu/mask 127 -> 125)
#   v4 A, 4 kernels            126-128 -> 126-128     same                         21-28, 2-8; 648-651 (was
#                                                                                  649-652: 1-3 fewer)

BM4 = 128
BN4 = 128
BK4 = 8
V4_THREADS = 256
ACC4 = 64  # 8x8 outputs per thread (local-array sizes: plain constants)
FRAG4 = 8  # A column / B row fragment per k
LD4 = 4  # elements of A (and of B) each thread loads per K step: 128 * 8 / 256
ROW4 = 132  # shared tile row: 128 floats + 4 of padding (rows stay 16-byte aligned); shapes: constants too
assert ACC4 == FRAG4 * FRAG4 and LD4 * V4_THREADS == BM4 * BK4 == BN4 * BK4 and BM4 == BN4 < ROW4
_BM4 = np.uint32(BM4)
_BN4 = np.uint32(BN4)
_BK4 = np.uint32(BK4)
_HALF4 = np.uint32(BM4 // 2)
_U16 = np.uint32(16)


@functools.cache
def _kernel4(a_map, b_map, store, ksize, epilogue, split_k=False):
    (a_contig_k, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = _parts(a_map, b_map, store, ksize, epilogue)
    k_range = _k_range_fn(split_k)

    @cuda.jit
    def gemm_kernel4(a, b, c, aux, dims):
        As = cuda.shared.array((BK4, ROW4), float32, alignment=_SMEM_ALIGN)
        Bs = cuda.shared.array((BK4, ROW4), float32, alignment=_SMEM_ALIGN)
        acc = cuda.local.array(ACC4, float32)
        ra = cuda.local.array(FRAG4, float32)
        rb = cuda.local.array(FRAG4, float32)
        la = cuda.local.array(LD4, float32)  # tile of A in flight (global -> registers -> shared)
        lb = cuda.local.array(LD4, float32)
        m = dims[_M]
        n = dims[_N]
        k_begin, k = k_range(dims)

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM4)
        n0 = uint32(cuda.blockIdx.x * _BN4)
        ty4 = uint32(t // _U16 * _U4)
        tx4 = uint32(t % _U16 * _U4)
        for i in range(ACC4):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop; so is the outer index of a
        # K-contiguous operand, whose state is computed here once.
        if a_contig_k:  # tile rows of 8 K indices, 2 threads per row
            a_i = uint32(t // _U2)
            a_p = uint32(t % _U2 * _U4)
            ao = a_outer(dims, uint32(m0 + a_i))
        else:  # tile rows of 128 M indices, 32 threads per row
            a_p = uint32(t // _U32)
            a_i = uint32(t % _U32 * _U4)
        if b_contig_k:
            b_j = uint32(t // _U2)
            b_p = uint32(t % _U2 * _U4)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _U32)
            b_j = uint32(t % _U32 * _U4)

        # Pipeline: iteration s loads tile s into registers (if any), multiplies tile s-1 (if any) from
        # shared memory, then stores tile s to shared memory. One load site and one compute site.
        k0 = k_begin
        while True:
            if k0 < k:
                if a_contig_k:
                    for u in range(LD4):
                        la[u] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + a_p + uint32(u))))
                else:
                    ai = a_inner(dims, uint32(k0 + a_p))
                    for u in range(LD4):
                        la[u] = a_get(a, dims, a_outer(dims, uint32(m0 + a_i + uint32(u))), ai)
                if b_contig_k:
                    for u in range(LD4):
                        lb[u] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p + uint32(u))))
                else:
                    bi = b_inner(dims, uint32(k0 + b_p))
                    for u in range(LD4):
                        lb[u] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j + uint32(u))), bi)
            if k0 > k_begin:
                p0 = _U0
                while p0 < _BK4:
                    for q in range(UNROLL):
                        p = p0 + uint32(q)
                        for u in range(4):
                            ra[u] = As[p, ty4 + uint32(u)]
                            ra[u + 4] = As[p, ty4 + _HALF4 + uint32(u)]
                            rb[u] = Bs[p, tx4 + uint32(u)]
                            rb[u + 4] = Bs[p, tx4 + _HALF4 + uint32(u)]
                        for i in range(FRAG4):
                            for j in range(FRAG4):
                                acc[i * FRAG4 + j] += ra[i] * rb[j]
                    p0 = uint32(p0 + _UNROLL)
                cuda.syncthreads()
            if k0 >= k:
                break
            for u in range(LD4):
                if a_contig_k:
                    As[a_p + uint32(u), a_i] = la[u]
                else:
                    As[a_p, a_i + uint32(u)] = la[u]
                if b_contig_k:
                    Bs[b_p + uint32(u), b_j] = lb[u]
                else:
                    Bs[b_p, b_j + uint32(u)] = lb[u]
            cuda.syncthreads()
            k0 = uint32(k0 + _BK4)

        # ---- epilogue and masked store
        for i in range(FRAG4):
            gi = uint32(m0 + ty4 + uint32(i // 4 * (BM4 // 2) + i % 4))
            if gi < m:
                row = out_row(dims, gi)
                for j in range(FRAG4):
                    gj = uint32(n0 + tx4 + uint32(j // 4 * (BN4 // 2) + j % 4))
                    if gj < n:
                        finish(c, aux, dims, row, gj, acc[i * FRAG4 + j])

    return gemm_kernel4


def _config4(op, block, m, n, kernel):
    _fixed_block(op, block, V4_THREADS, kernel)
    return (_cdiv(n, BN4), _cdiv(m, BM4)), V4_THREADS


# ---------------------------------------------------------------------------------------------------------
# Version 5: skinny, for N <= 4 (convolutions with 1-3 output channels: the autoencoder's last layer
# forward, the input gradient of a first layer on 1- or 3-channel images), and for small N with K in one
# chunk (a 1->16 first layer's forward, K = 9: the tiles of v3/v4 would be mostly K padding).
#
# The tiled versions waste a 64- or 128-wide column tile on N = 3 and their block count is M / 64: at
# M = 65 536 pixels, K = 2304 the 64x64 tiles ran 0.85 ms against 0.47 ms for the direct convolution (H100).
# Here a thread owns one row of C and SK_N = 4 columns in registers; a block is SK_THREADS consecutive rows.
# Per K chunk of SK_KC indices the block stages B's (SK_KC, SK_N) slice in shared memory (one element per
# thread) and every thread streams its own row of A straight from global memory: consecutive threads are
# consecutive pixels, so the im2col reads of a warp are coalesced, and each element of A is read once per
# column group instead of once per output channel as in the direct convolution. The B reads are
# broadcasts (every thread of a warp reads the same word). The A loader zero-fills beyond K, so the chunk
# loop needs no bounds test of its own and its loads can be in flight together. N > SK_N
# runs ceil(N / SK_N) column groups along grid y, each re-reading A (correct, not what it is for).

SK_THREADS = 128
SK_N = 4  # columns of C per thread (a local-array size: a plain constant)
SK_KC = 32  # K indices per staged B chunk: SK_KC * SK_N = SK_THREADS, one element per thread
SK_UNROLL = 8  # K indices per trip of the unrolled inner loop
assert SK_KC * SK_N == SK_THREADS and SK_KC % SK_UNROLL == 0
_SK_UNROLL = np.uint32(SK_UNROLL)
_SK_THREADS = np.uint32(SK_THREADS)
_SK_N = np.uint32(SK_N)
_SK_KC = np.uint32(SK_KC)


@functools.cache
def _kernel5(a_map, b_map, store, ksize, epilogue, split_k=False):
    (_, a_outer, a_inner, a_get, b_contig_k, b_outer, b_inner, b_get, out_row,
     finish) = _parts(a_map, b_map, store, ksize, epilogue)
    k_range = _k_range_fn(split_k)

    @cuda.jit
    def gemm_kernel5(a, b, c, aux, dims):
        Bs = cuda.shared.array((SK_KC, SK_N), float32, alignment=_SMEM_ALIGN)
        acc = cuda.local.array(SK_N, float32)
        av = cuda.local.array(SK_UNROLL, float32)  # SK_UNROLL elements of A in flight
        m = dims[_M]
        n = dims[_N]
        k_begin, k = k_range(dims)
        t = uint32(cuda.threadIdx.x)
        i = uint32(cuda.blockIdx.x * _SK_THREADS + t)  # the thread's row of C (rows run along grid x)
        n0 = uint32(cuda.blockIdx.y * _SK_N)
        for j in range(SK_N):
            acc[j] = float32(0.0)
        ao = a_outer(dims, i)  # the row state, once (a_get zero-fills rows >= M: those threads only help load B)
        # B chunk coordinates of this thread, along B's contiguous axis
        if b_contig_k:
            b_j = uint32(t // _SK_KC)
            b_p = uint32(t % _SK_KC)
            bo = b_outer(dims, uint32(n0 + b_j))
        else:
            b_p = uint32(t // _SK_N)
            b_j = uint32(t % _SK_N)
        k0 = k_begin
        while k0 < k:
            if b_contig_k:
                Bs[b_p, b_j] = b_get(b, dims, bo, b_inner(dims, uint32(k0 + b_p)))
            else:
                Bs[b_p, b_j] = b_get(b, dims, b_outer(dims, uint32(n0 + b_j)), b_inner(dims, uint32(k0 + b_p)))
            cuda.syncthreads()
            # a split's chunk is whole SK_KC chunks (k_len is a multiple of the K step); past K, a_get gives 0.
            # SK_UNROLL loads of A first, then their FMAs: the loads are issued back to back and their
            # latencies overlap (PTX, k = 3 im2col: 8 ld.global, then 8 ld.shared.v4 + 32 fma, no local
            # memory; one load and its FMAs per trip, as first written, left the loop unrolled by 2 only).
            q0 = _U0
            while q0 < _SK_KC:
                for u in range(SK_UNROLL):
                    av[u] = a_get(a, dims, ao, a_inner(dims, uint32(k0 + q0 + uint32(u))))
                for u in range(SK_UNROLL):
                    for j in range(SK_N):
                        acc[j] += av[u] * Bs[q0 + uint32(u), j]
                q0 = uint32(q0 + _SK_UNROLL)
            cuda.syncthreads()
            k0 = uint32(k0 + _SK_KC)
        if i < m:
            row = out_row(dims, i)
            for j in range(SK_N):
                gj = uint32(n0 + uint32(j))
                if gj < n:
                    finish(c, aux, dims, row, gj, acc[j])

    return gemm_kernel5


def _config5(op, block, m, n, kernel):
    _fixed_block(op, block, SK_THREADS, kernel)
    return (_cdiv(m, SK_THREADS), _cdiv(n, SK_N)), SK_THREADS


# ---------------------------------------------------------------------------------------------------------
# Launchers

_SPECS = {  # variant: (kernel factory, (op name, grid and block from (op, block, M, N, kernel)))
    "naive": (_kernel1, "gemm_v1", _config1),
    "tiled16": (_kernel2, "gemm_v2", _config2),
    "regblock": (_kernel3, "gemm_v3", _config3),
    "regblock128": (_kernel4, "gemm_v4", _config4),
    "skinny": (_kernel5, "gemm_v5", _config5),
}
DEFAULT_BLOCKS = {"naive": (16, 16), "tiled16": (TILE, TILE), "regblock": RB_THREADS,
                  "regblock128": V4_THREADS, "skinny": SK_THREADS}
MAPPED_VERSIONS = tuple(_SPECS)  # every version runs every mapping (gemm_mapped, gemm_split_k)


def gemm_mapped(variant, problem: GemmProblem, a, b, out, aux, epilogue="none", *, a_map="dense",
                b_map="dense", store="dense", ksize=1, block=None, stream=0, launch=True, op=None,
                name=None) -> Launch:
    """The lower-level entry: one GEMM version on a problem description and operand mappings.

    The caller has checked the arrays against the mappings (shapes, dtypes, flat views where a mapping
    indexes a flat buffer); ``aux`` is the bias (``bias``, ``bias_relu``), the mask (``mask``, indexed like
    the store) or any float32 device array (the other epilogues)."""
    try:
        factory, default_op, config = _SPECS[variant]
    except KeyError:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(_SPECS)}") from None
    op = op or default_op
    kernel = factory(a_map, b_map, store, int(ksize), epilogue)
    grid, block = config(op, DEFAULT_BLOCKS[variant] if block is None else block, problem.m, problem.n, kernel)
    name = name or f"{op}[{a_map},{b_map}->{store},k{ksize},{epilogue}]"
    return bind(kernel, grid, block, (a, b, out, aux, problem.dims), stream, launch, name)


# ---------------------------------------------------------------------------------------------------------
# Split-K: a GEMM with few output tiles and a long K (the conv weight gradient: M = Cout, N = Cin*k*k,
# K = N*OH*OW) launches a handful of blocks, each running the whole K loop. Split-K divides K into `splits`
# chunks along grid z: block (x, y, z) runs the version's own kernel on chunk z (``_k_range_chunk``) and
# stores its tile of partial sums into slice z of a scratch buffer (splits, M, N) (store ``partial``,
# epilogue none); a second launch sums the slices in the fixed order z = 0, 1, ... and applies the real
# epilogue and store. No atomics: the result is bit-identical run to run (for a given split count).
#
# Napkin math (H100, cnn_conv1's dw: M = 16, N = 9, K = 43 264): one 64x64 tile is one block on one of 132
# SMs running 5408 K steps; 169 splits of 256 K each cut that critical path 169-fold for 169 * 144 * 4 B =
# 97 KB of partial sums, written once and read once. The sum kernel issues SUM_UNROLL independent loads per
# step (the additions stay in order), so it waits on memory ceil(splits / SUM_UNROLL) times, not splits.
#
# PTX / ptxas facts (NVVM + ptxas 13.0 of the CUDA 13.0 toolkit, compile_ptx(cc=(9, 0)) without a GPU; conv
# backward weight k = 3: channels x im2col_k; the split kernels store ``partial``, the others ``weight4``):
# the single-launch kernels of all four versions (backward weight, forward im2col x weight_t, dense NT)
# compile to the same PTX as before split-K up to register names. Split kernels: 0 spills, 0 ld/st.local,
# 0 div/rem, the inner loop unchanged (v4 141 instructions per 2 k: 128 fma, 8 ld.shared.v4; v3 41).
#
#   kernel                      regs (single -> split)   K loop (static) single -> split
#   v4 backward weight          123 -> 127               368 -> 371 instr; mul.lo.s64 5 -> 8 (the 64-bit
#                                                        products of the magic-number pixel divisions,
#                                                        no new index widening)
#   v3 backward weight           40 -> 55                157 -> 159 instr; mul.lo.s64 3 -> 4
#   v4 / v3 dense NN             -                       218 -> 231 / 89 -> 94 instr (runtime K start: more
#                                                        address arithmetic), mul.lo.s64 1 = 1
#   split sum (weight4 store)    32                      no K loop; 1 division (e // N, once per element)
# v3's 55 registers still fit 4 blocks of 256 threads per SM; v4 stays at <= 128 (2 blocks per SM).
#
# The dense launchers' split path (``splits``; numba-cuda 0.30.4, NVVM and nvJitLink's ptxas 13.5 from
# numba-cuda[cu13], cc 9.0, 'A'-layout operands): the tiled16 split kernels' K loop is the single launch's,
# instruction for instruction, for NN, NT, TN and TT (73-77 instructions: 16 fma, 32 ld.shared, 2 mul.lo.s64 of
# the strided global loads); registers 30 -> 31 (NN), 0 spills, 0 ld/st.local, 0 div/rem. The dense sum with the
# bias / bias_relu / mask epilogue: 32 registers, 0 local, 1 division per element (e // N).

K_STEPS = {"naive": 1, "tiled16": TILE, "regblock": BK, "regblock128": BK4, "skinny": SK_KC}  # K per K-loop step
OUTPUT_TILES = {"naive": (16, 16), "tiled16": (TILE, TILE), "regblock": (BM, BN), "regblock128": (BM4, BN4),
                "skinny": (SK_THREADS, SK_N)}
SPLIT_WAVES = 2  # automatic split count: about this many blocks per SM ...
SPLIT_MIN_K = 256  # ... but at least this many K indices per split (partial traffic and the sum's cost)
SKINNY_BLOCKS_PER_SM = 48  # the skinny version's split target (underfilled_splits)
ONE_WAVE_SPLITS = 2  # underfilled_splits where the tiles fill between half the SMs and one wave
WGRAD_SPLIT_WAVES = 4  # a convolution weight gradient's automatic split count: blocks per SM (conv_gemm)
SIMULATOR_SPLITS = 2  # automatic split count under the simulator (tests use tiny K; SM counts mean nothing)
MAX_SPLITS = 65535  # grid z limit
SPLIT_SUM_THREADS = 128
SUM_UNROLL = 4
_SUM_UNROLL = np.uint32(SUM_UNROLL)


@functools.cache
def _split_sum_kernel(store, ksize, epilogue):
    out_row = _store_fns(store, ksize)[0]
    finish = _finish(store, ksize, epilogue)

    @cuda.jit
    def gemm_split_sum(partials, c, aux, dims, splits):
        # One thread per element e = (i, j) of C, grid-stride; consecutive threads read consecutive partials.
        vals = cuda.local.array(SUM_UNROLL, float32)
        m = dims[_M]
        n = dims[_N]
        mn = uint32(m * n)
        step = uint32(mn * _SUM_UNROLL)
        e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while e < mn:
            i = uint32(e // n)
            j = uint32(e - i * n)
            acc = partials[e]
            idx = uint32(e + mn)
            z = _U1
            while uint32(z + _SUM_UNROLL) <= splits:
                for u in range(SUM_UNROLL):  # the loads first (in flight together), then the sums in order
                    vals[u] = partials[uint32(idx + uint32(u) * mn)]
                for u in range(SUM_UNROLL):
                    acc += vals[u]
                idx = uint32(idx + step)
                z = uint32(z + _SUM_UNROLL)
            while z < splits:
                acc += partials[idx]
                idx = uint32(idx + mn)
                z = uint32(z + _U1)
            finish(c, aux, dims, out_row(dims, i), j, acc)
            e = uint32(e + stride)

    return gemm_split_sum


def split_k_chunks(k: int, splits: int, k_step: int) -> tuple[int, int]:
    """(splits used, k_len): chunks of ceil(K / splits) K indices rounded up to a multiple of the K step, so
    that no block's tile reaches into the next chunk; ceil(K / k_len) of them, every one non-empty (fewer
    than asked where the rounding covers K sooner, e.g. K = 16, 3 splits, step 8: 2 chunks of 8)."""
    k_len = _cdiv(_cdiv(k, splits), k_step) * k_step
    return _cdiv(k, k_len), k_len


def auto_splits(k: int, tiles: int, multiprocessors: int, waves: int = SPLIT_WAVES,
                min_k: int = SPLIT_MIN_K) -> int:
    """Enough splits for about ``waves`` blocks per SM over ``tiles`` output tiles, but at least ``min_k``
    K indices per split (and at least one split)."""
    return max(1, min(_cdiv(waves * multiprocessors, tiles), k // min_k))


def output_tiles(variant: str, m: int, n: int) -> int:
    """Blocks of a (default-block) launch of `variant` over an M x N output: its output tiles."""
    tm, tn = OUTPUT_TILES[variant]
    return _cdiv(m, tm) * _cdiv(n, tn)


def underfilled_splits(variant: str, problem: GemmProblem) -> int:
    """The split count for a GEMM whose output tiles may not fill the GPU (e.g. a convolution on 8x8 maps):
    ``auto_splits`` when the tiles fill at most half the SMs, else 1. Measured on an H100 (batch 64): a
    128->128 conv at 8x8 (32 tiles of 128x128) goes from 0.22 to 0.07 ms with 4 splits; splitting an output
    that fills one wave (256 tiles) made it slower, 0.34 -> 0.43 ms; at 128 tiles (256->128 at 16x16) runs
    disagreed (2 splits 0.39 vs 0.45 ms in one, 3 splits 0.50 in another), so it is left unsplit.

    The skinny version's blocks are small (128 threads, one stream of loads each), so it splits until about
    SKINNY_BLOCKS_PER_SM blocks per SM, in chunks of at least one K step. H100, batch 64, 512 row blocks,
    K = 2304 (256->3 forward at 32x32, and the 3-channel input gradient of 3->256): 1 split 0.30 ms, 2 0.25,
    4 0.23, 8 0.21, 12 0.21; K = 144 (the 1-channel input gradient of 1->16 at 28x28): 1 split 0.023 ms, 5
    chunks of 32 0.018. 1 under the simulator (its tests ask for splits explicitly).

    Between half the SMs and one wave of tiles (one 128x128 block per SM at most), ONE_WAVE_SPLITS = 2: the
    autoencoder's 256->128 forward and 128->256 input gradient at 16x16 (128 tiles of 128x128, K = 2304): 1 split
    0.447 / 0.429 ms, 2 splits 0.390 / 0.375, 3 0.505 / 0.405, 4 0.399 / 0.382 (H100, batch 64; an earlier run
    also had 2 splits ahead, 0.39 against 0.45, and 3 behind); at 256 tiles (256->128 input gradient, 128->256
    forward) 1 split stays best (0.341 / 0.370 ms, 2 splits 0.431 / 0.438)."""
    if device.simulator_enabled():
        return 1
    tiles = output_tiles(variant, problem.m, problem.n)
    multiprocessors = _multiprocessors()
    if variant == "skinny":  # as many chunks as K has K steps, at most
        return max(1, min(_cdiv(SKINNY_BLOCKS_PER_SM * multiprocessors, tiles), _cdiv(problem.k, SK_KC)))
    if 2 * tiles <= multiprocessors:
        return auto_splits(problem.k, tiles, multiprocessors)
    if tiles <= multiprocessors:  # one block per SM at most: two splits give each SM a second block
        return max(1, min(ONE_WAVE_SPLITS, problem.k // SPLIT_MIN_K))
    return 1


@functools.cache
def _multiprocessors() -> int:
    return int(device.device_info()["multiprocessors"])


def multiprocessors() -> int:
    """This device's SM count, asked once (1 under the simulator): what the split rules divide."""
    return _multiprocessors()


def gemm_split_k(variant, problem: GemmProblem, a, b, out, aux, epilogue="none", *, a_map="dense",
                 b_map="dense", store="dense", ksize=1, splits=None, block=None, stream=0, launch=True, op=None,
                 name=None) -> Launch | LaunchGroup:
    """``gemm_mapped`` with the K range split among ``splits`` blocks per output tile (see above).

    ``splits=None``: ``auto_splits`` on this device (``SIMULATOR_SPLITS`` under the simulator). The count
    used is ``split_k_chunks``'s (it can be lower than asked). One split: ``gemm_mapped``'s single launch,
    no scratch. Otherwise a ``LaunchGroup`` of the split launch and the sum launch; the (splits, M, N)
    scratch buffer is allocated here, once, NaN-filled (a partial no block wrote would poison C)."""
    try:
        factory, default_op, config = _SPECS[variant]
    except KeyError:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(_SPECS)}") from None
    op = op or default_op
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, (int, np.integer))
                               or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f"{op}: splits must be None or an int in [1, {MAX_SPLITS}], got {splits!r}")
    m, n = problem.m, problem.n
    kernel = factory(a_map, b_map, "partial", int(ksize), "none", True)
    grid, threads = config(op, DEFAULT_BLOCKS[variant] if block is None else block, m, n, kernel)
    if splits is None:
        splits = (SIMULATOR_SPLITS if device.simulator_enabled()
                  else auto_splits(problem.k, int(np.prod(grid)), _multiprocessors()))
    splits, k_len = split_k_chunks(problem.k, int(splits), K_STEPS[variant])
    name = name or f"{op}[{a_map},{b_map}->{store},k{ksize},{epilogue}]"
    if splits == 1:
        return gemm_mapped(variant, problem, a, b, out, aux, epilogue, a_map=a_map, b_map=b_map, store=store,
                           ksize=ksize, block=block, stream=stream, launch=launch, op=op, name=name)
    if splits * m * n >= _U32_LIMIT:
        raise ValueError(f"{op}: {splits} partial ({m}, {n}) tiles exceed 2^31 elements; use fewer splits")
    sum_kernel = _split_sum_kernel(store, int(ksize), epilogue)
    device.check_block(op, SPLIT_SUM_THREADS, sum_kernel)
    partials = cuda.to_device(np.full(splits * m * n, np.nan, dtype=np.float32))
    group = LaunchGroup([
        bind(kernel, (*grid, splits), threads, (a, b, partials, aux, (*problem.dims, np.uint32(k_len))), stream,
             False, f"{name}[split {splits} x {k_len}]"),
        bind(sum_kernel, grid_for(m * n, SPLIT_SUM_THREADS), SPLIT_SUM_THREADS,
             (partials, out, aux, problem.dims, np.uint32(splits)), stream, False, f"{name}[sum {splits}]"),
    ])
    if launch:
        group()
    return group


def _dense(variant, a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits):
    """A dense launcher: one launch (``splits=1``, the default: no split kernel is even compiled), or split-K
    through ``gemm_split_k`` (``splits=None``: its automatic count; an int: that many, K permitting) with the
    epilogue applied by the fixed-order sum launch."""
    op = _SPECS[variant][1]
    m, n, k = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = epilogue_args(op, bias, relu, relu_mask)
    kw = dict(a_map="dense_t" if trans_a else "dense", b_map="dense_t" if trans_b else "dense", block=block,
              stream=stream, launch=launch, op=op,
              name=f"{op}[{'T' if trans_a else 'N'}{'T' if trans_b else 'N'},{epilogue}]")
    if isinstance(splits, (int, np.integer)) and not isinstance(splits, bool) and splits == 1:
        return gemm_mapped(variant, GemmProblem(m, n, k), a, b, out, aux, epilogue, **kw)
    return gemm_split_k(variant, GemmProblem(m, n, k), a, b, out, aux, epilogue, splits=splits, **kw)


def gemm_v1(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=(16, 16), stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Naive GEMM; ``block`` is (bx, by), bx along the columns of C."""
    return _dense("naive", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_v2(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=(TILE, TILE), stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Shared-memory tiled GEMM; the block is fixed to (TILE, TILE)."""
    return _dense("tiled16", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_v3(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=RB_THREADS, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Register-blocked GEMM (64x64 tile); the block is fixed to ``RB_THREADS`` threads."""
    return _dense("regblock", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_v4(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=V4_THREADS, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Register-blocked GEMM (128x128 tile, 8x8 per thread); the block is fixed to ``V4_THREADS``."""
    return _dense("regblock128", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch,
                  splits)


# ---------------------------------------------------------------------------------------------------------
# Dispatcher

VERSIONS = {"naive": gemm_v1, "tiled16": gemm_v2, "regblock": gemm_v3, "regblock128": gemm_v4}


def gemm(a, b, out, variant="tiled16", **kw) -> Launch:
    """``out = op(a) @ op(b)`` with an epilogue, by the named version; kw go to its launcher."""
    try:
        fn = VERSIONS[variant]
    except KeyError:
        raise ValueError(f"gemm: unknown variant {variant!r}; choose from {sorted(VERSIONS)}") from None
    return fn(a, b, out, **kw)
