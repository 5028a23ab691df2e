"""Warp-level tensor-core MMA for numba.cuda kernels: ``mma.sync`` and the input roundings as numba intrinsics (inline
PTX), and under numba's CUDA simulator a NumPy emulation with the same fragment layout and rounding.

* ``mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``: one ``m16n8k8`` TF32 MMA with float32
  accumulation, D = A (16x8) @ B (8x8) + C. A and B are float32 values holding TF32 numbers (``to_tf32``); the
  tensor core reads the 19 high bits of each (a value not rounded first is truncated).
* ``mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``: one ``m16n8k16`` BF16 MMA, float32
  accumulation; A and B are uint32 registers of two BF16 numbers each (``pack_bf16``).
* ``to_tf32(x)``: x rounded to TF32 (10-bit mantissa, to nearest, ties away from zero: ``cvt.rna.tf32.f32``), as a
  float32. ``pack_bf16(lo, hi)``: two float32 rounded to BF16 (7-bit mantissa, to nearest even:
  ``cvt.rn.bf16x2.f32``) in one uint32, ``lo`` in the low half.
* ``bf16_bits(x) -> uint16``: x rounded to BF16 as ``pack_bf16`` rounds it (the same instruction: the low half of
  ``pack_bf16(x, 0)``), its 16 bits, for a buffer stored in BF16. ``bf16_float(bits) -> float32``: the inverse, the
  bits in the high half of a float32 (exact); a float32 passes unchanged (a loader reads either storage).

Fragments (PTX ISA, "Matrix fragments for mma.m16n8k8 / m16n8k16"): lane = 4 g + t (g = lane // 4, t = lane % 4).
TF32 A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (k=t, n=g), b1 (t+4, g). BF16 A: register r holds
elements (row g + 8 (r % 2), columns 2t + 8 (r // 2) and the next); B: register r holds (k = 2t + 8r and the next,
n = g). C and D: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).

Every lane of the warp must call an MMA together (``.sync.aligned``). Under the simulator the emulation exchanges
the warp's fragments at a block barrier, so every thread of the block must reach each MMA call, and blocks are whole
warps. Why an intrinsic and not the foreign-function route, with its measured cost: NOTES-tensor.md in ``kernels/gemm``.
"""

from __future__ import annotations

import threading

import numpy as np

from gpunn import device

__all__ = ["MMA_SHAPES", "bf16_bits", "bf16_float", "emulate_mma", "mma_bf16", "mma_tf32", "pack_bf16", "round_bf16",
           "round_tf32", "to_tf32"]

MMA_SHAPES = {"tf32": (16, 8, 8), "bf16": (16, 8, 16)}  # (M, N, K) of one MMA per input format
WARP = 32


# ---------------------------------------------------------------- roundings on host arrays (the emulation's, and
# the references')

def round_tf32(x) -> np.ndarray:
    """float32 array rounded to TF32 as ``cvt.rna.tf32.f32`` does: 13 low mantissa bits dropped, to nearest, ties
    away from zero (the magnitude bits plus half an ulp, then truncated); infinities and NaNs kept."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def round_bf16(x) -> np.ndarray:
    """float32 array rounded to BF16 as ``cvt.rn.bf16x2.f32`` does (to nearest even), returned as float32."""
    return (_bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bf16_bits(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def _bf16_values(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------- the emulation (simulator)

def emulate_mma(fmt: str, a_frags, b_frags, c_frags) -> np.ndarray:
    """A warp's MMA from its 32 lanes' fragments, as the tensor core computes it: ``a_frags`` (32, 4), ``b_frags``
    (32, 2), ``c_frags`` (32, 4) -> d (32, 4) float32. TF32 fragments are float32 (their 13 low bits ignored,
    as the hardware does); BF16 ones uint32 of two BF16 each. Products and sums in float64, rounded once."""
    a_mat, b_mat = _operands(fmt, np.asarray(a_frags), np.asarray(b_frags))
    c = np.asarray(c_frags, dtype=np.float32).astype(np.float64)
    lane = np.arange(WARP)
    g, t = lane // 4, lane % 4
    c_mat = np.zeros((16, 8))
    rows, cols = _cd_index(g, t)
    c_mat[rows, cols] = c
    d_mat = a_mat @ b_mat + c_mat
    return d_mat[rows, cols].astype(np.float32)


def _cd_index(g, t):
    """(rows, cols), each (32, 4): where lane's c0..c3 sit in the 16x8 C."""
    rows = np.stack([g, g, g + 8, g + 8], axis=1)
    cols = np.stack([2 * t, 2 * t + 1, 2 * t, 2 * t + 1], axis=1)
    return rows, cols


def _operands(fmt, a_frags, b_frags):
    lane = np.arange(WARP)
    g, t = lane // 4, lane % 4
    if fmt == "tf32":
        a_vals = (a_frags.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
        b_vals = (b_frags.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
        a_mat = np.zeros((16, 8))
        a_mat[np.stack([g, g + 8, g, g + 8], 1), np.stack([t, t, t + 4, t + 4], 1)] = a_vals
        b_mat = np.zeros((8, 8))
        b_mat[np.stack([t, t + 4], 1), np.stack([g, g], 1)] = b_vals
        return a_mat, b_mat
    if fmt != "bf16":
        raise ValueError(f"mma: unknown format {fmt!r}; choose from {sorted(MMA_SHAPES)}")
    a_regs = np.asarray(a_frags, dtype=np.uint32)
    b_regs = np.asarray(b_frags, dtype=np.uint32)
    a_mat = np.zeros((16, 16))
    for r in range(4):
        row = g + 8 * (r % 2)
        col = 2 * t + 8 * (r // 2)
        a_mat[row, col] = _bf16_values(a_regs[:, r] & 0xFFFF)
        a_mat[row, col + 1] = _bf16_values(a_regs[:, r] >> 16)
    b_mat = np.zeros((16, 8))
    for r in range(2):
        k = 2 * t + 8 * r
        b_mat[k, g] = _bf16_values(b_regs[:, r] & 0xFFFF)
        b_mat[k + 1, g] = _bf16_values(b_regs[:, r] >> 16)
    return a_mat, b_mat


_LOCK = threading.Lock()
_exchange: dict = {}  # (launch, block, group, call, what) -> the group's values, then what compute made of them


def collective(size: int, what: str, value, compute):
    """Under the simulator, one thread's part in an operation of a group of `size` consecutive threads (a warp, a
    warpgroup): every thread deposits `value`, waits at the block barrier, the first one past it calls
    `compute(values)` (the group's values in thread order) once for all, and each gets (that result, its own
    place in the group); a second barrier lets the group's slot go. Every thread of the block must take part (the
    barrier is the block's); a group member that did not is an error naming `what`."""
    from .simulator import current_thread

    thread = current_thread()
    bx, by, bz = thread._manager._block_dim
    if (bx * by * bz) % size:
        raise ValueError(f"{what}: a block of {bx * by * bz} threads is not whole groups of {size}")
    flat = thread.threadIdx.x + bx * (thread.threadIdx.y + by * thread.threadIdx.z)
    calls = getattr(thread, "_gpunn_collectives", 0)
    thread._gpunn_collectives = calls + 1
    blk = thread.blockIdx
    key = (id(thread._manager), blk.x, blk.y, blk.z, flat // size, calls, what)
    _exchange.setdefault(key, [None] * size)[flat % size] = value
    thread.syncthreads()
    with _LOCK:  # the first thread past the barrier computes (under OS threads too)
        slot = _exchange[key]
        if isinstance(slot, list):
            if any(v is None for v in slot):
                raise RuntimeError(f"{what}: not every thread of group {flat // size} reached it")
            slot = _exchange[key] = (compute(slot),)
    thread.syncthreads()  # every member has its result
    if flat % size == 0:
        _exchange.pop(key, None)
    return slot[0], flat % size


def _warp_mma(fmt, a, b, c):
    """One lane's part of an emulated MMA: its row of the warp's D."""
    warp_d, lane = collective(WARP, f"mma_{fmt}", (a, b, c), lambda frags: emulate_mma(
        fmt, [f[0] for f in frags], [f[1] for f in frags], [f[2] for f in frags]))
    d = warp_d[lane]
    return np.float32(d[0]), np.float32(d[1]), np.float32(d[2]), np.float32(d[3])


def _sim_mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_mma("tf32", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))


def _sim_mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_mma("bf16", (int(a0), int(a1), int(a2), int(a3)), (int(b0), int(b1)), (c0, c1, c2, c3))


def _sim_to_tf32(x):
    return np.float32(round_tf32(np.float32(x)))


def _sim_pack_bf16(lo, hi):
    bits = _bf16_bits(np.array([lo, hi], dtype=np.float32)).astype(np.uint32)
    return np.uint32(bits[0] | (bits[1] << np.uint32(16)))


def _sim_bf16_bits(x):
    return np.uint16(_bf16_bits(np.float32(x)))


def _sim_bf16_float(x):
    x = np.asarray(x)
    return np.float32(_bf16_values(x) if x.dtype == np.uint16 else x)


# ---------------------------------------------------------------- the intrinsics (a GPU)

def _intrinsics():
    """(mma_tf32, mma_bf16, to_tf32, pack_bf16, bf16_bits, bf16_float) as numba intrinsics (inline PTX, or LLVM
    bit operations)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i16, i32, f32 = ir.IntType(16), ir.IntType(32), ir.FloatType()
    quad = types.UniTuple(types.float32, 4)

    def mma_codegen(ptx, cast_ab):
        def codegen(context, builder, sig, args):
            ab = [builder.bitcast(v, i32) if cast_ab else v for v in args[:6]]
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(fnty, ptx + " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                               "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4))
            out = builder.call(asm, ab + list(args[6:]))
            return context.make_tuple(builder, quad, [builder.extract_value(out, i) for i in range(4)])
        return codegen

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = quad(*([types.float32] * 10))
        return sig, mma_codegen("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", True)

    @intrinsic
    def mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = quad(*([types.uint32] * 6 + [types.float32] * 4))
        return sig, mma_codegen("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", False)

    @intrinsic
    def to_tf32(typingctx, x):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.bitcast(builder.call(asm, [args[0]]), f32)
        return types.float32(types.float32), codegen

    def cvt_bf16x2(builder, lo, hi):
        asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
        return builder.call(asm, [hi, lo])  # the first source goes to the high half

    @intrinsic
    def pack_bf16(typingctx, lo, hi):
        def codegen(context, builder, sig, args):
            return cvt_bf16x2(builder, args[0], args[1])
        return types.uint32(types.float32, types.float32), codegen

    @intrinsic
    def bf16_bits(typingctx, x):
        def codegen(context, builder, sig, args):
            return builder.trunc(cvt_bf16x2(builder, args[0], ir.Constant(f32, 0.0)), i16)
        return types.uint16(types.float32), codegen

    @intrinsic
    def bf16_float(typingctx, x):
        if x == types.float32:
            return types.float32(x), lambda context, builder, sig, args: args[0]
        if x != types.uint16:
            return None
        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16)), f32)
        return types.float32(x), codegen

    return mma_tf32, mma_bf16, to_tf32, pack_bf16, bf16_bits, bf16_float


if device.simulator_enabled():
    from .simulator import patch

    patch()  # gpunn's block runner: the emulation's barriers are its
    mma_tf32, mma_bf16, to_tf32, pack_bf16 = _sim_mma_tf32, _sim_mma_bf16, _sim_to_tf32, _sim_pack_bf16
    bf16_bits, bf16_float = _sim_bf16_bits, _sim_bf16_float
else:
    mma_tf32, mma_bf16, to_tf32, pack_bf16, bf16_bits, bf16_float = _intrinsics()
