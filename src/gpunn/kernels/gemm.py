"""GEMM kernels: ``C = op(A) @ op(B)`` followed by a fused epilogue.

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

Every launcher is ``gemm_vN(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False,
relu_mask=None, block=..., stream=0, launch=True) -> Launch``: it checks the operands, then binds the
launch (``gpunn.kernels.launch.bind``) and, unless ``launch=False``, runs it once. The bound ``Launch``
holds the live device arrays, so calling it again recomputes from their current contents (the training
step binds once and replays; a CUDA graph can capture it). Host NumPy arrays are refused: numba would copy
them to the device and back at every launch.

Specialisation happens at compile time: a cached factory per (trans_a, trans_b, epilogue) returns a
kernel whose flags are closure constants (numba prunes the dead branches, so no flag is tested in the
loops), and every kernel takes just (a, b, c, aux), reading M, N, K from the shapes: launch cost grows
with each argument. ``aux`` is the bias, the mask or a cached 1-element dummy.

``gemm(a, b, out, variant=...)`` dispatches through ``VERSIONS``; ``gemm_reference`` is the float64 NumPy
reference the kernels are validated against.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from .launch import Launch, bind, check_array

__all__ = [
    "BK",
    "BK4",
    "BM",
    "BM4",
    "BN",
    "BN4",
    "EPILOGUES",
    "RB_THREADS",
    "TILE",
    "TM",
    "TN",
    "V4_THREADS",
    "VERSIONS",
    "gemm",
    "gemm_reference",
    "gemm_shapes",
    "gemm_v1",
    "gemm_v2",
    "gemm_v3",
    "gemm_v4",
]

EPILOGUES = ("none", "bias", "bias_relu", "relu", "mask")

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
# Checks shared by the launchers


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _check_operand(op, name, x, ndim):
    if isinstance(x, np.ndarray):
        # numba would copy a host array to the device and back at every launch of the bound kernel
        raise ValueError(f"{op}: {name} is a host NumPy array; pass a device array (cuda.to_device)")  # noqa: TRY004
    check_array(op, name, x, ndim)


def gemm_shapes(a, b, out, trans_a=False, trans_b=False, bias=None, relu_mask=None, op="gemm"):
    """Validate the operands and return ``(M, N, K)``; raise ``ValueError`` naming the shapes."""
    for name, x in (("a", a), ("b", b), ("out", out)):
        _check_operand(op, name, x, 2)
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
        _check_operand(op, "bias", bias, 1)
        if _shape(bias) != (n,):
            raise ValueError(f"{what}: bias must be ({n},), got {_shape(bias)}")
    if relu_mask is not None:
        _check_operand(op, "relu_mask", relu_mask, 2)
        if _shape(relu_mask) != (m, n):
            raise ValueError(f"{what}: relu_mask must have out's shape ({m}, {n}), got {_shape(relu_mask)}")
    if max(m, n, k) >= 2**31:
        raise ValueError(f"{what}: dimensions must fit in int32")
    return m, n, k


_DUMMY_AUX = None


def _epilogue(op, bias, relu, relu_mask):
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
    return epilogue in ("bias", "bias_relu"), epilogue in ("bias_relu", "relu"), epilogue == "mask"


def _name(op, trans_a, trans_b, epilogue):
    return f"{op}[{'T' if trans_a else 'N'}{'T' if trans_b else 'N'},{epilogue}]"


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
_U0 = np.uint32(0)
_U1 = np.uint32(1)
_U2 = np.uint32(2)
_U4 = np.uint32(4)
_U32 = np.uint32(32)
# 16-byte aligned shared tiles let NVVM read 4 consecutive floats as one ld.shared.v4; the simulator rejects
# any alignment argument (None means the default there).
_SMEM_ALIGN = None if device.simulator_enabled() else 16


# ---------------------------------------------------------------------------------------------------------
# Version 1: naive, one thread per output element.


@functools.cache
def _kernel1(trans_a, trans_b, epilogue):
    has_bias, relu, mask = _flags(epilogue)

    @cuda.jit
    def gemm_kernel1(a, b, c, aux):
        # x runs along the columns of C so that a warp writes C (and reads B) contiguously.
        col = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        row = uint32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
        m = uint32(c.shape[0])
        n = uint32(c.shape[1])
        k = uint32(a.shape[0] if trans_a else a.shape[1])
        if row < m and col < n:
            acc = float32(0.0)
            p = _U0
            while p < k:
                av = a[p, row] if trans_a else a[row, p]
                bv = b[col, p] if trans_b else b[p, col]
                acc += av * bv
                p = uint32(p + _U1)
            if has_bias:
                acc += aux[col]
            if relu and acc < float32(0.0):
                acc = float32(0.0)
            if mask and not aux[row, col] > float32(0.0):
                acc = float32(0.0)
            c[row, col] = acc

    return gemm_kernel1


def gemm_v1(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=(16, 16), stream=0, launch=True) -> Launch:
    """Naive GEMM; ``block`` is (bx, by), bx along the columns of C."""
    op = "gemm_v1"
    m, n, _ = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = _epilogue(op, bias, relu, relu_mask)
    kernel = _kernel1(bool(trans_a), bool(trans_b), epilogue)
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0 for x in block)):
        raise ValueError(f"{op}: block must be (bx, by), two positive ints, got {block!r}")
    bx, by = int(block[0]), int(block[1])
    device.check_block(op, bx * by, kernel)
    grid = (_cdiv(n, bx), _cdiv(m, by))
    return bind(kernel, grid, (bx, by), (a, b, out, aux), stream, launch,
                _name(op, trans_a, trans_b, epilogue))


# ---------------------------------------------------------------------------------------------------------
# Version 2: 16x16 shared-memory tiles.

TILE = 16
_UT = np.uint32(TILE)


@functools.cache
def _kernel2(trans_a, trans_b, epilogue):
    has_bias, relu, mask = _flags(epilogue)

    @cuda.jit
    def gemm_kernel2(a, b, c, aux):
        # sa[i, p] = op(A)[row0 + i, k0 + p]; sb[p, j] = op(B)[k0 + p, col0 + j].
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        sa = cuda.shared.array((TILE, TILE), float32)
        sb = cuda.shared.array((TILE, TILE), float32)
        m = uint32(c.shape[0])
        n = uint32(c.shape[1])
        k = uint32(a.shape[0] if trans_a else a.shape[1])
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        row0 = uint32(cuda.blockIdx.y * _UT)
        col0 = uint32(cuda.blockIdx.x * _UT)
        row = uint32(row0 + ty)
        col = uint32(col0 + tx)
        acc = float32(0.0)
        k0 = _U0
        while k0 < k:
            # Each load has tx running along the contiguous axis of the stored array (coalesced);
            # the transposed cases write the tile transposed instead.
            if trans_a:  # A stored (K, M)
                r = uint32(k0 + ty)
                q = uint32(row0 + tx)
                sa[tx, ty] = a[r, q] if (r < k and q < m) else float32(0.0)
            else:  # A stored (M, K)
                q = uint32(k0 + tx)
                sa[ty, tx] = a[row, q] if (row < m and q < k) else float32(0.0)
            if trans_b:  # B stored (N, K)
                r = uint32(col0 + ty)
                q = uint32(k0 + tx)
                sb[tx, ty] = b[r, q] if (r < n and q < k) else float32(0.0)
            else:  # B stored (K, N)
                r = uint32(k0 + ty)
                sb[ty, tx] = b[r, col] if (r < k and col < n) else float32(0.0)
            cuda.syncthreads()
            for p in range(TILE):
                acc += sa[ty, p] * sb[p, tx]
            cuda.syncthreads()
            k0 = uint32(k0 + _UT)
        if row < m and col < n:
            if has_bias:
                acc += aux[col]
            if relu and acc < float32(0.0):
                acc = float32(0.0)
            if mask and not aux[row, col] > float32(0.0):
                acc = float32(0.0)
            c[row, col] = acc

    return gemm_kernel2


def gemm_v2(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=(TILE, TILE), stream=0, launch=True) -> Launch:
    """Shared-memory tiled GEMM; the block is fixed to (TILE, TILE)."""
    op = "gemm_v2"
    m, n, _ = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = _epilogue(op, bias, relu, relu_mask)
    kernel = _kernel2(bool(trans_a), bool(trans_b), epilogue)
    if isinstance(block, (int, np.integer)) or tuple(int(x) for x in block) != (TILE, TILE):
        raise ValueError(f"{op}: block must be ({TILE}, {TILE}), got {block}")
    device.check_block(op, TILE * TILE, kernel)
    grid = (_cdiv(n, TILE), _cdiv(m, TILE))
    return bind(kernel, grid, (TILE, TILE), (a, b, out, aux), stream, launch,
                _name(op, trans_a, trans_b, epilogue))


# ---------------------------------------------------------------------------------------------------------
# Version 3: register blocking, 64x64 block tile.
#
# Block tile BM x BN of C, K stepped by BK. Threads form a (BM/TM) x (BN/TN) grid; thread (ty, tx) owns the
# TM x TN outputs rows ty*TM.., cols tx*TN... Tiles are stored k-major (As[p, i], Bs[p, j]) so the inner
# loop reads TM (resp. TN) consecutive shared words per k. Each thread loads A_LOADS elements of A and
# B_LOADS of B per K step, consecutive along the stored array's contiguous axis. Napkin math: per k a
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
_BK_AL = np.uint32(BK // A_LOADS)  # threads per row of a non-transposed A tile
_BM_AL = np.uint32(BM // A_LOADS)  # threads per row of a transposed A tile
_BN_BL = np.uint32(BN // B_LOADS)  # threads per row of a non-transposed B tile
_BK_BL = np.uint32(BK // B_LOADS)  # threads per row of a transposed B tile
_TX = np.uint32(BN // TN)  # threads along the columns of the block tile
UNROLL = 2  # k steps per iteration of the inner loop (LLVM leaves larger unrolls rolled, 64-bit)
_UNROLL = np.uint32(UNROLL)


@functools.cache
def _kernel3(trans_a, trans_b, epilogue):
    has_bias, relu, mask = _flags(epilogue)

    @cuda.jit
    def gemm_kernel3(a, b, c, aux):
        As = cuda.shared.array((BK, BM), float32, alignment=_SMEM_ALIGN)
        Bs = cuda.shared.array((BK, BN), float32, alignment=_SMEM_ALIGN)
        acc = cuda.local.array(TMN, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        m = uint32(c.shape[0])
        n = uint32(c.shape[1])
        k = uint32(a.shape[0] if trans_a else a.shape[1])

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM)
        n0 = uint32(cuda.blockIdx.x * _BN)
        ty4 = uint32(t // _TX * _TM)  # first row and column of the thread's outputs in the tile
        tx4 = uint32(t % _TX * _TN)
        for i in range(TMN):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop.
        if trans_a:  # A stored (K, M): a row of the tile is BM consecutive floats.
            a_p = uint32(t // _BM_AL)
            a_i = uint32(t % _BM_AL * _AL)
        else:  # A stored (M, K): a row of the tile is BK consecutive floats.
            a_i = uint32(t // _BK_AL)
            a_p = uint32(t % _BK_AL * _AL)
        if trans_b:  # B stored (N, K)
            b_j = uint32(t // _BK_BL)
            b_p = uint32(t % _BK_BL * _BL)
        else:  # B stored (K, N)
            b_p = uint32(t // _BN_BL)
            b_j = uint32(t % _BN_BL * _BL)

        k0 = _U0
        while k0 < k:
            # ---- global -> shared, zero-filled outside the matrices
            if trans_a:
                gp = uint32(k0 + a_p)
                for u in range(A_LOADS):
                    gi = uint32(m0 + a_i + uint32(u))
                    As[a_p, a_i + uint32(u)] = a[gp, gi] if (gp < k and gi < m) else float32(0.0)
            else:
                gi = uint32(m0 + a_i)
                for u in range(A_LOADS):
                    gp = uint32(k0 + a_p + uint32(u))
                    As[a_p + uint32(u), a_i] = a[gi, gp] if (gi < m and gp < k) else float32(0.0)
            if trans_b:
                gj = uint32(n0 + b_j)
                for u in range(B_LOADS):
                    gp = uint32(k0 + b_p + uint32(u))
                    Bs[b_p + uint32(u), b_j] = b[gj, gp] if (gj < n and gp < k) else float32(0.0)
            else:
                gp = uint32(k0 + b_p)
                for u in range(B_LOADS):
                    gj = uint32(n0 + b_j + uint32(u))
                    Bs[b_p, b_j + uint32(u)] = b[gp, gj] if (gp < k and gj < n) else float32(0.0)
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
                for j in range(TN):
                    gj = uint32(n0 + tx4 + uint32(j))
                    if gj < n:
                        v = acc[i * TN + j]
                        if has_bias:
                            v += aux[gj]
                        if relu and v < float32(0.0):
                            v = float32(0.0)
                        if mask and not aux[gi, gj] > float32(0.0):
                            v = float32(0.0)
                        c[gi, gj] = v

    return gemm_kernel3


def gemm_v3(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=RB_THREADS, stream=0, launch=True) -> Launch:
    """Register-blocked GEMM (64x64 tile); the block is fixed to ``RB_THREADS`` threads."""
    op = "gemm_v3"
    m, n, _ = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = _epilogue(op, bias, relu, relu_mask)
    kernel = _kernel3(bool(trans_a), bool(trans_b), epilogue)
    _fixed_block(op, block, RB_THREADS, kernel)
    grid = (_cdiv(n, BN), _cdiv(m, BM))
    return bind(kernel, grid, RB_THREADS, (a, b, out, aux), stream, launch,
                _name(op, trans_a, trans_b, epilogue))


# ---------------------------------------------------------------------------------------------------------
# Version 4: register blocking, 128x128 block tile, 8x8 outputs per thread.
#
# Thread t = 16 * ty + tx owns rows {ty*4 + r, 64 + ty*4 + r} and columns {tx*4 + s, 64 + tx*4 + s},
# r, s in 0..3. Per k it reads two float4 of the A column and two of the B row from the k-major shared
# tiles: the 16 threads of a half-warp read 256 consecutive bytes of Bs (no bank conflict) and 2 distinct
# addresses of As (broadcast). Tile loads: each thread moves 4 consecutive elements of the stored array
# (a row of a (128, 8) tile is 2 threads, of an (8, 128) tile 32 threads); the (128, 8) tiles are written
# transposed into rows padded to 132 floats, so the 32 stores of a warp hit 32 different banks.
# The loads of tile k+1 are issued before the outer products of tile k and stored to shared memory after
# them, so their latency hides behind 512 FMAs.
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
def _kernel4(trans_a, trans_b, epilogue):
    has_bias, relu, mask = _flags(epilogue)

    @cuda.jit
    def gemm_kernel4(a, b, c, aux):
        As = cuda.shared.array((BK4, ROW4), float32, alignment=_SMEM_ALIGN)
        Bs = cuda.shared.array((BK4, ROW4), float32, alignment=_SMEM_ALIGN)
        acc = cuda.local.array(ACC4, float32)
        ra = cuda.local.array(FRAG4, float32)
        rb = cuda.local.array(FRAG4, float32)
        la = cuda.local.array(LD4, float32)  # tile of A in flight (global -> registers -> shared)
        lb = cuda.local.array(LD4, float32)
        m = uint32(c.shape[0])
        n = uint32(c.shape[1])
        k = uint32(a.shape[0] if trans_a else a.shape[1])

        t = uint32(cuda.threadIdx.x)
        m0 = uint32(cuda.blockIdx.y * _BM4)
        n0 = uint32(cuda.blockIdx.x * _BN4)
        ty4 = uint32(t // _U16 * _U4)
        tx4 = uint32(t % _U16 * _U4)
        for i in range(ACC4):
            acc[i] = float32(0.0)

        # Load coordinates inside the tiles, fixed for the whole K loop.
        if trans_a:  # A stored (K, M): tile rows of 128 floats, 32 threads per row
            a_p = uint32(t // _U32)
            a_i = uint32(t % _U32 * _U4)
        else:  # A stored (M, K): tile rows of 8 floats, 2 threads per row
            a_i = uint32(t // _U2)
            a_p = uint32(t % _U2 * _U4)
        if trans_b:  # B stored (N, K)
            b_j = uint32(t // _U2)
            b_p = uint32(t % _U2 * _U4)
        else:  # B stored (K, N)
            b_p = uint32(t // _U32)
            b_j = uint32(t % _U32 * _U4)

        # Pipeline: iteration s loads tile s into registers (if any), multiplies tile s-1 (if any) from
        # shared memory, then stores tile s to shared memory. One load site and one compute site.
        k0 = _U0
        while True:
            if k0 < k:
                if trans_a:
                    gp = uint32(k0 + a_p)
                    for u in range(LD4):
                        gi = uint32(m0 + a_i + uint32(u))
                        la[u] = a[gp, gi] if (gp < k and gi < m) else float32(0.0)
                else:
                    gi = uint32(m0 + a_i)
                    for u in range(LD4):
                        gp = uint32(k0 + a_p + uint32(u))
                        la[u] = a[gi, gp] if (gi < m and gp < k) else float32(0.0)
                if trans_b:
                    gj = uint32(n0 + b_j)
                    for u in range(LD4):
                        gp = uint32(k0 + b_p + uint32(u))
                        lb[u] = b[gj, gp] if (gj < n and gp < k) else float32(0.0)
                else:
                    gp = uint32(k0 + b_p)
                    for u in range(LD4):
                        gj = uint32(n0 + b_j + uint32(u))
                        lb[u] = b[gp, gj] if (gp < k and gj < n) else float32(0.0)
            if k0 > _U0:
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
                if trans_a:
                    As[a_p, a_i + uint32(u)] = la[u]
                else:
                    As[a_p + uint32(u), a_i] = la[u]
                if trans_b:
                    Bs[b_p + uint32(u), b_j] = lb[u]
                else:
                    Bs[b_p, b_j + uint32(u)] = lb[u]
            cuda.syncthreads()
            k0 = uint32(k0 + _BK4)

        # ---- epilogue and masked store
        for i in range(FRAG4):
            gi = uint32(m0 + ty4 + uint32(i // 4 * (BM4 // 2) + i % 4))
            if gi < m:
                for j in range(FRAG4):
                    gj = uint32(n0 + tx4 + uint32(j // 4 * (BN4 // 2) + j % 4))
                    if gj < n:
                        v = acc[i * FRAG4 + j]
                        if has_bias:
                            v += aux[gj]
                        if relu and v < float32(0.0):
                            v = float32(0.0)
                        if mask and not aux[gi, gj] > float32(0.0):
                            v = float32(0.0)
                        c[gi, gj] = v

    return gemm_kernel4


def gemm_v4(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
            block=V4_THREADS, stream=0, launch=True) -> Launch:
    """Register-blocked GEMM (128x128 tile, 8x8 per thread); the block is fixed to ``V4_THREADS``."""
    op = "gemm_v4"
    m, n, _ = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = _epilogue(op, bias, relu, relu_mask)
    kernel = _kernel4(bool(trans_a), bool(trans_b), epilogue)
    _fixed_block(op, block, V4_THREADS, kernel)
    grid = (_cdiv(n, BN4), _cdiv(m, BM4))
    return bind(kernel, grid, V4_THREADS, (a, b, out, aux), stream, launch,
                _name(op, trans_a, trans_b, epilogue))


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
