"""Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a) for numba.cuda kernels: numba intrinsics emitting inline PTX,
and under numba's CUDA simulator a NumPy emulation with the same shared-memory layout and register fragments.

A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies a 64 x K slice of A by a 128 x K slice of B,
both K-major tiles in shared memory, into 64 float32 accumulators a thread (D = A B^T + D, 64 x 128):

* ``wgmma_tf32(acc, a_tile, a_byte, b_tile, b_byte)``: K = 8 TF32; ``wgmma_bf16(...)``: K = 16 BF16 (uint32 words
  of two); ``wgmma_bf16_sw128(...)``: K = 16 BF16 from tiles of 128-byte rows (64 K), the 128-byte swizzle. ``acc``
  is the thread's local float32 array of 64; ``a_tile`` / ``b_tile`` shared arrays; ``a_byte`` / ``b_byte`` the
  byte offset of the slice's first row and K in its tile (a multiple of 32 within a row).
* ``wgmma256_tf32(...)``, ``wgmma256_bf16_sw128(...)``: the same as m64n256 (a 256 x K slice of B), 128 accumulators
  a thread (``ACC256``), with ``wgmma256_wait(acc)`` / ``wgmma256_wait1(acc)`` for them.
* ``wgmma_fence()`` before the first MMA of a batch, ``wgmma_commit()`` after its last, ``wgmma_wait(acc)`` for the
  batch to finish (the accumulators are the MMAs' only after it), ``wgmma_wait1(acc)`` for all but the last batch
  committed (its accumulators stay in flight: nothing but further MMAs may touch them); ``fence_proxy_async()`` in
  every thread that stored to a tile the MMAs read next, before the barrier.

Tiles (``LAYOUTS[fmt]``): rows of ``row_bytes`` (an M index of A, an N index of B: TF32 32 K = 128 B, BF16 32 K =
64 B), row r at byte r x row_bytes from a 1024-byte aligned base, each 16-byte chunk swizzled by the row: byte x is
stored at ``swizzle(fmt, x)`` = x XOR ((x >> 7) & mask) << 4 (the 128-byte or 64-byte swizzle of the descriptor);
``bf16_sw128``: BF16 in TF32's layout, rows of 64 K = 128 B.
Fragments of D: thread t of the warpgroup (warp w = t // 32, g = t % 32 // 4, q = t % 4) holds acc[4j + 2h + e] =
D[16w + g + 8h, 8j + 2q + e], j = 0..15 (m64n256: 0..31). Under the simulator the warpgroup's fragments meet at a
block barrier (``gpunn.kernels.mma.collective``): every thread of the block must reach each MMA, or, on gpunn's
greenlet block runner (where a barrier is the end of a thread's turn), every thread of the warpgroup in one turn,
the others yielding theirs elsewhere (warp specialization: ``gpunn.kernels.mbarrier``'s waits).
"""

from __future__ import annotations

import numpy as np

from gpunn import device

from .mma import WARP, collective

__all__ = ["ACC", "ACC256", "LAYOUTS", "N", "fence_proxy_async", "swizzle", "wgmma256_bf16_sw128", "wgmma256_tf32",
           "wgmma256_wait", "wgmma256_wait1", "wgmma_bf16", "wgmma_bf16_sw128", "wgmma_commit", "wgmma_fence",
           "wgmma_tf32", "wgmma_wait", "wgmma_wait1"]

N = 128  # the MMAs' N (m64n128)
ACC = 64  # accumulators a thread: 64 x 128 / 128 threads
ACC256 = 128  # the m64n256 MMAs' (``wgmma256_*``): 64 x 256 / 128 threads
WARPGROUP = 4 * WARP
LAYOUTS = {  # format: (row bytes, swizzle mask, descriptor swizzle mode, stride byte offset of 8 rows, K an MMA)
    "tf32": (128, 7, 1, 1024, 8),
    "bf16": (64, 3, 2, 512, 16),
    "bf16_sw128": (128, 7, 1, 1024, 16),
}


def swizzle(fmt: str, byte: int) -> int:
    """Where logical byte ``byte`` of a tile (row x row_bytes + offset in the row) is stored."""
    mask = LAYOUTS[fmt][1]
    return byte ^ (((byte >> 7) & mask) << 4)


# ---------------------------------------------------------------- the emulation (simulator)

def _tile_matrix(fmt, tile, byte0, rows):
    """rows x K of a swizzled K-major tile from byte ``byte0`` (float64): what one wgmma reads."""
    row_bytes, _, _, _, k = LAYOUTS[fmt]
    raw = np.ascontiguousarray(tile).reshape(-1).view(np.uint8)
    width = 4 if fmt == "tf32" else 2  # bf16, bf16_sw128
    logical = byte0 + np.arange(rows)[:, None] * row_bytes + np.arange(k)[None, :] * width
    mask = LAYOUTS[fmt][1]
    physical = logical ^ (((logical >> 7) & mask) << 4)
    if fmt == "tf32":
        words = np.stack([raw[physical + i] for i in range(4)], -1).copy().view(np.uint32)[..., 0]
        return (words & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # the 19 high bits
    halves = np.stack([raw[physical + i] for i in range(2)], -1).copy().view(np.uint16)[..., 0]
    return (halves.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _fragment_index(n=N):
    """(rows, cols), each (128, n / 2): where thread t's acc[i] sits in the 64 x n D."""
    t = np.arange(WARPGROUP)[:, None]
    i = np.arange(n // 2)[None, :]
    w, g, q = t // WARP, t % WARP // 4, t % 4
    j, h, e = i // 4, i % 4 // 2, i % 2
    return 16 * w + g + 8 * h, 8 * j + 2 * q + e


def _sim_wgmma(fmt, n=N):
    def wgmma(acc, a_tile, a_byte, b_tile, b_byte):
        def run(accs):
            a = _tile_matrix(fmt, a_tile, int(a_byte), 64)
            b = _tile_matrix(fmt, b_tile, int(b_byte), n)
            rows, cols = _fragment_index(n)
            d = np.stack([np.asarray(x, dtype=np.float64) for x in accs])
            d = d + (a @ b.T)[rows, cols]
            for x, values in zip(accs, d):
                x[:] = values.astype(np.float32)

        collective(WARPGROUP, f"wgmma_{fmt}_n{n}", acc, run)

    return wgmma


def _noop(*args):
    return None


# ---------------------------------------------------------------- the intrinsics (a Hopper GPU)

def _intrinsics():
    """(wgmma_tf32, wgmma_bf16, wgmma_bf16_sw128, wgmma_fence, wgmma_commit, wgmma_wait, wgmma_wait1,
    fence_proxy_async, wgmma256_tf32, wgmma256_bf16_sw128, wgmma256_wait, wgmma256_wait1) as numba intrinsics."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def load_acc(context, builder, arr_type, arr, count=ACC):
        ptr = context.make_array(arr_type)(context, builder, arr).data
        slots = [builder.gep(ptr, [ir.Constant(i32, i)]) for i in range(count)]
        return slots, [builder.load(s) for s in slots]

    def descriptor(context, builder, tile_type, tile, byte, fmt):
        """The 64-bit matrix descriptor of the tile slice starting at byte ``byte``."""
        _, _, mode, sbo, _ = LAYOUTS[fmt]
        data = context.make_array(tile_type)(context, builder, tile).data
        shared = builder.addrspacecast(builder.bitcast(data, ir.IntType(8).as_pointer()),
                                       ir.PointerType(ir.IntType(8), 3))
        addr = builder.add(builder.ptrtoint(shared, i32), builder.trunc(byte, i32) if byte.type.width > 32
                           else builder.zext(byte, i32) if byte.type.width < 32 else byte)
        start = builder.zext(builder.and_(builder.lshr(addr, ir.Constant(i32, 4)), ir.Constant(i32, 0x3FFF)), i64)
        fixed = (1 << 16) | ((sbo >> 4) << 32) | (mode << 62)
        return builder.or_(start, ir.Constant(i64, fixed))

    def mma(fmt, n=N):
        k = LAYOUTS[fmt][4]
        count = n // 2  # accumulators a thread
        kind = fmt.split("_")[0]  # the element type (bf16_sw128: bf16)
        tail = "p, 1, 1;" if kind == "tf32" else "p, 1, 1, 0, 0;"
        regs = ", ".join(f"${i}" for i in range(count))
        descriptors = f"${2 * count}, ${2 * count + 1}"  # after the outputs and their tied inputs
        ptx = ("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{kind}.{kind} {{{regs}}}, {descriptors}, {tail}\n}}")
        constraints = ",".join(["=f"] * count + [str(i) for i in range(count)] + ["l", "l"])

        @intrinsic
        def wgmma(typingctx, acc, a_tile, a_byte, b_tile, b_byte):
            def codegen(context, builder, sig, args):
                slots, values = load_acc(context, builder, sig.args[0], args[0], count)
                da = descriptor(context, builder, sig.args[1], args[1], args[2], fmt)
                db = descriptor(context, builder, sig.args[3], args[3], args[4], fmt)
                fnty = ir.FunctionType(ir.LiteralStructType([f32] * count), [f32] * count + [i64, i64])
                out = builder.call(ir.InlineAsm(fnty, ptx, constraints, side_effect=True), values + [da, db])
                for i, slot in enumerate(slots):
                    builder.store(builder.extract_value(out, i), slot)
                return context.get_dummy_value()
            return types.void(acc, a_tile, a_byte, b_tile, b_byte), codegen

        return wgmma

    def statement(ptx):
        @intrinsic
        def emit(typingctx):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()
            return types.void(), codegen
        return emit

    def wait(pending, count=ACC):
        @intrinsic
        def wgmma_wait(typingctx, acc):
            def codegen(context, builder, sig, args):
                slots, values = load_acc(context, builder, sig.args[0], args[0], count)
                fnty = ir.FunctionType(ir.LiteralStructType([f32] * count), [f32] * count)
                constraints = ",".join(["=f"] * count + [str(i) for i in range(count)] + ["~{memory}"])
                asm = ir.InlineAsm(fnty, f"wgmma.wait_group.sync.aligned {pending};", constraints, side_effect=True)
                out = builder.call(asm, values)
                for i, slot in enumerate(slots):
                    builder.store(builder.extract_value(out, i), slot)
                return context.get_dummy_value()
            return types.void(acc), codegen
        return wgmma_wait

    return (mma("tf32"), mma("bf16"), mma("bf16_sw128"), statement("wgmma.fence.sync.aligned;"),
            statement("wgmma.commit_group.sync.aligned;"), wait(0), wait(1),
            statement("fence.proxy.async.shared::cta;"), mma("tf32", 256), mma("bf16_sw128", 256), wait(0, ACC256),
            wait(1, ACC256))


if device.simulator_enabled():
    from .simulator import patch

    patch()  # gpunn's block runner: the emulation's barriers are its
    wgmma_tf32, wgmma_bf16, wgmma_bf16_sw128 = _sim_wgmma("tf32"), _sim_wgmma("bf16"), _sim_wgmma("bf16_sw128")
    wgmma256_tf32, wgmma256_bf16_sw128 = _sim_wgmma("tf32", 256), _sim_wgmma("bf16_sw128", 256)
    wgmma_fence = wgmma_commit = wgmma_wait = wgmma_wait1 = fence_proxy_async = _noop
    wgmma256_wait = wgmma256_wait1 = _noop
else:
    (wgmma_tf32, wgmma_bf16, wgmma_bf16_sw128, wgmma_fence, wgmma_commit, wgmma_wait, wgmma_wait1,
     fence_proxy_async, wgmma256_tf32, wgmma256_bf16_sw128, wgmma256_wait, wgmma256_wait1) = _intrinsics()
