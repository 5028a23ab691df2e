"""Hopper's tensor memory accelerator (TMA, sm_90) for numba.cuda kernels: 2-D tiled tensor maps encoded on the host,
the bulk tensor copy global -> shared completing bytes on an mbarrier, and under numba's CUDA simulator an emulation.

* ``encode_2d(x, box_rows, swizzle=128)``: the tensor map (a device array of 16 uint64: 128 bytes) of a C-contiguous
  2-D device array ``x`` (rows, K) of float32 or uint16 (BF16 bits): dims (K, rows), box (128 bytes of K, ``box_rows``
  rows), swizzle 128 B (``swizzle`` 0 / 32 / 64: other layouts, for tests), L2 promotion 256 B, zero fill out of
  bounds. ValueError where TMA cannot read ``x`` (16-byte aligned address, row stride a multiple of 16 bytes, box
  rows 1..256, a box row within the swizzle's span). On a GPU: ``cuTensorMapEncodeTiled`` (cuda.bindings), the
  maps cached by (address, shape, dtype, box, swizzle): a map is kept alive for the kernels that read it. numba has
  no ``__grid_constant__`` parameter, so a map is passed as a global array (written before the kernel starts: valid
  without fence.proxy.tensormap).
* ``tma_load_2d(smem, word, tmap, k0, row0, bar)``: the box at element (k0, row0) of the map's tensor into ``smem``
  (a shared array of a 4-byte type) from word ``word`` (1024-byte aligned for the 128-byte swizzle), its bytes (the
  whole box, zero-filled parts included) completing transactions on the mbarrier at word ``bar``
  (``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes``). One thread issues it, after
  ``mbar_arrive_expect_tx`` of the stage's bytes (gpunn.kernels.mbarrier).
* ``prefetch_tensormap(tmap)``: ``prefetch.tensormap`` of a map (once, before its first copy).

The swizzle: byte address a of a box row's bytes is stored at a ^ (((a >> 7) & 7) << 4) (128 B: the 16-byte chunk
XORed with the row within 8-row, 1024-byte atoms; 64 B: & 3, 32 B: & 1), exactly ``wgmma.swizzle``'s of descriptor
mode 1 for 128-byte rows from a 1024-byte aligned tile.

Under the simulator a map's words hold this module's own fields (``FIELDS``) and the source's address, looked up in
a registry of the encoded arrays; a copy is queued on its barrier and lands (the box read, swizzled and written, then
its bytes completed) when a waiter polls the barrier, oldest first, as ``cp_async_mbar_arrive``'s arrivals."""

from __future__ import annotations

import numpy as np

from gpunn import device

__all__ = ["FIELDS", "MAGIC", "encode_2d", "prefetch_tensormap", "tma_load_2d"]

MAGIC = 0x746D61325F73696D  # the simulator's maps: "tma2_sim"
FIELDS = ("magic", "address", "itemsize", "k", "rows", "stride", "box_k", "box_rows", "swizzle")  # words 0..8
BOX_BYTES = 128  # a box row: the 128-byte swizzle's span
_SWIZZLES = (0, 32, 64, 128)
_SOURCES: dict[int, np.ndarray] = {}  # address -> the simulated array's bytes (simulator)
_MAPS: dict[tuple, object] = {}  # (address, rows, k, dtype, box_rows, swizzle) -> the map's device array (GPU)


def _address(x) -> int:
    interface = getattr(x, "__cuda_array_interface__", None)
    return interface["data"][0] if interface else np.asarray(getattr(x, "_ary", x)).__array_interface__["data"][0]


def encode_2d(x, box_rows: int, swizzle: int = 128):
    """The tensor map of 2-D device array ``x`` (rows, K) read in boxes of 128 bytes of K by ``box_rows`` rows."""
    dtype = np.dtype(x.dtype)
    if dtype not in (np.float32, np.uint16):
        raise ValueError(f"tma: float32 or uint16 (BF16 bits) operands only, got {dtype}")
    if len(x.shape) != 2 or not x.is_c_contiguous():
        raise ValueError(f"tma: a C-contiguous 2-D array, got shape {x.shape}")
    rows, k = (int(d) for d in x.shape)
    address = _address(x)
    if address % 16:
        raise ValueError(f"tma: the array's address must be 16-byte aligned, got {address:#x}")
    if (k * dtype.itemsize) % 16:
        raise ValueError(f"tma: a row must be a multiple of 16 bytes (K a multiple of {16 // dtype.itemsize}), got "
                         f"K = {k} ({k * dtype.itemsize} bytes)")
    if not 1 <= int(box_rows) <= 256 or swizzle not in _SWIZZLES:
        raise ValueError(f"tma: box rows 1..256 and swizzle one of {_SWIZZLES}, got {box_rows}, {swizzle}")
    if not (0 < rows < 2**32 and 0 < k < 2**32):
        raise ValueError(f"tma: dimensions 1..2**32 - 1, got {rows} x {k}")
    if swizzle and swizzle < BOX_BYTES:
        raise ValueError(f"tma: a box row of {BOX_BYTES} bytes is over the {swizzle}-byte swizzle's span")
    box_k = BOX_BYTES // dtype.itemsize
    if device.simulator_enabled():
        from numba import cuda

        _SOURCES[address] = np.asarray(getattr(x, "_ary", x)).reshape(-1).view(np.uint8)
        words = np.zeros(16, np.uint64)
        words[:len(FIELDS)] = (MAGIC, address, dtype.itemsize, k, rows, k * dtype.itemsize, box_k, box_rows, swizzle)
        return cuda.to_device(words)
    key = (address, rows, k, dtype.str, int(box_rows), swizzle)
    if key not in _MAPS:
        _MAPS[key] = _encode_driver(address, dtype, rows, k, box_k, int(box_rows), swizzle)
    return _MAPS[key]


def _encode_driver(address, dtype, rows, k, box_k, box_rows, swizzle):
    """The map's 16 words by the driver's cuTensorMapEncodeTiled: through cuda.bindings, else libcuda by ctypes."""
    from numba import cuda

    cuda.current_context()  # the driver initialised (numba's context)
    # CUtensorMapDataType FLOAT32 = 7, BFLOAT16 = 9; CUtensorMapSwizzle NONE, 32B, 64B, 128B = 0..3; L2 promotion
    # 256B = 3; interleave NONE = 0; OOB fill NONE (zeros) = 0
    args = (7 if dtype == np.float32 else 9, 2, address, (k, rows), (k * dtype.itemsize,), (box_k, box_rows), (1, 1),
            0, {0: 0, 32: 1, 64: 2, 128: 3}[swizzle], 3, 0)
    try:
        words = _encode_bindings(*args)
    except RuntimeError:
        raise
    except Exception:  # noqa: BLE001 (cuda.bindings missing or not taking these arguments: the C entry point)
        words = _encode_ctypes(*args)
    return cuda.to_device(words)


def _fail(err, args):
    raise RuntimeError(f"tma: cuTensorMapEncodeTiled failed ({err!r}) for dims {args[3]}, strides {args[4]}, box "
                       f"{args[5]}, swizzle mode {args[8]}")


def _encode_bindings(*args):
    from cuda.bindings import driver as drv

    kind, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill = args
    err, tmap = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(kind), rank, address, [drv.cuuint64_t(d) for d in dims],
        [drv.cuuint64_t(s) for s in strides], [drv.cuuint32_t(b) for b in box], [drv.cuuint32_t(e) for e in steps],
        drv.CUtensorMapInterleave(interleave), drv.CUtensorMapSwizzle(swizzle), drv.CUtensorMapL2promotion(l2),
        drv.CUtensorMapFloatOOBfill(fill))
    if err != drv.CUresult.CUDA_SUCCESS:
        _fail(err, args)
    return np.array([int(w) for w in tmap.opaque], np.uint64)


def _encode_ctypes(*args):
    import ctypes

    kind, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill = args
    buffer = np.zeros(24, np.uint64)
    words = buffer[(-buffer.ctypes.data % 64) // 8:][:16]  # the map's host copy: 64-byte aligned
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    err = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled(
        ctypes.c_void_p(words.ctypes.data), ctypes.c_int(kind), u32(rank), ctypes.c_void_p(address),
        (u64 * 2)(*dims), (u64 * 1)(*strides), (u32 * 2)(*box), (u32 * 2)(*steps), ctypes.c_int(interleave),
        ctypes.c_int(swizzle), ctypes.c_int(l2), ctypes.c_int(fill))
    if err:
        _fail(err, args)
    return words.copy()


# ---------------------------------------------------------------- the emulation (simulator)

def _fields(tmap):
    words = np.asarray(getattr(tmap, "_ary", tmap)).reshape(-1).view(np.uint64)
    values = dict(zip(FIELDS, (int(w) for w in words[:len(FIELDS)])))
    if values["magic"] != MAGIC or values["address"] not in _SOURCES:
        raise RuntimeError("tma_load_2d: not a tensor map of tma.encode_2d (or its array is gone)")
    return values


def _box(f, k0, row0):
    """The box's bytes (box_rows, box_k x itemsize) as the copy writes them before the swizzle; zeros outside."""
    size = f["itemsize"]
    src = _SOURCES[f["address"]].reshape(f["rows"], f["stride"])
    rows = np.arange(f["box_rows"]) + row0
    ks = np.arange(f["box_k"]) + k0
    inside = ((rows >= 0) & (rows < f["rows"]))[:, None] & ((ks >= 0) & (ks < f["k"]))[None, :]
    elements = src.view(np.uint16 if size == 2 else np.uint32)
    values = np.where(inside, elements[np.clip(rows, 0, f["rows"] - 1)][:, np.clip(ks, 0, f["k"] - 1)], 0)
    return values.astype(elements.dtype).view(np.uint8).reshape(f["box_rows"], -1)


def _sim_load_2d(smem, word, tmap, k0, row0, bar):
    from .mbarrier import sim_queue_tx

    f = _fields(tmap)
    dst = int(word) * 4
    row_bytes = f["box_k"] * f["itemsize"]
    if dst % 128 or (f["swizzle"] and row_bytes > f["swizzle"]):
        raise ValueError(f"tma_load_2d: destination byte {dst} not 128-byte aligned, or a box row of {row_bytes} "
                         f"bytes over the {f['swizzle']}-byte swizzle")
    nbytes = f["box_rows"] * row_bytes
    flat = np.asarray(getattr(smem, "_ary", smem)).reshape(-1).view(np.uint8)
    k0, row0 = int(np.int32(np.uint32(k0))), int(np.int32(np.uint32(row0)))  # PTX's .s32 coordinates

    def land():
        data = _box(f, k0, row0).reshape(-1)
        logical = dst + np.arange(nbytes)
        mask = {0: 0, 32: 1, 64: 3, 128: 7}[f["swizzle"]]
        flat[logical ^ (((logical >> 7) & mask) << 4)] = data

    sim_queue_tx(smem, bar, land, nbytes)


def _sim_prefetch(tmap):
    _fields(tmap)


# ---------------------------------------------------------------- the intrinsics (a GPU)

def _intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)

    def shared(context, builder, array_type, array, index):
        data = context.make_array(array_type)(context, builder, array).data
        ptr = builder.bitcast(builder.gep(data, [builder.zext(index, i64)]), i8.as_pointer())
        return builder.ptrtoint(builder.addrspacecast(ptr, ir.PointerType(i8, 3)), i32)

    def generic(context, builder, array_type, array):
        return builder.ptrtoint(context.make_array(array_type)(context, builder, array).data, i64)

    def check_map(op, tmap):
        if not isinstance(tmap, types.Array) or tmap.dtype.bitwidth != 64:
            raise TypingError(f"{op}: the tensor map must be a device array of 16 uint64, got {tmap}")

    ptx = ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
           "[$0], [$1, {$2, $3}], [$4];")

    @intrinsic
    def tma_load_2d(typingctx, smem, word, tmap, k0, row0, bar):
        if not isinstance(smem, types.Array) or smem.dtype.bitwidth != 32:
            raise TypingError(f"tma_load_2d: smem must be a shared array of a 4-byte type, got {smem}")
        check_map("tma_load_2d", tmap)

        def codegen(context, builder, sig, args):
            operands = [shared(context, builder, sig.args[0], args[0], args[1]),
                        generic(context, builder, sig.args[2], args[2]), args[3], args[4],
                        shared(context, builder, sig.args[0], args[0], args[5])]
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32, i32, i32]), ptx, "r,l,r,r,r,~{memory}",
                               side_effect=True)
            builder.call(asm, operands)
            return context.get_dummy_value()

        u32 = types.uint32
        return types.void(smem, u32, tmap, u32, u32, u32), codegen

    @intrinsic
    def prefetch_tensormap(typingctx, tmap):
        check_map("prefetch_tensormap", tmap)

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64]), "prefetch.tensormap [$0];", "l,~{memory}",
                               side_effect=True)
            builder.call(asm, [generic(context, builder, sig.args[0], args[0])])
            return context.get_dummy_value()

        return types.void(tmap), codegen

    return tma_load_2d, prefetch_tensormap


if device.simulator_enabled():
    tma_load_2d, prefetch_tensormap = _sim_load_2d, _sim_prefetch
else:
    tma_load_2d, prefetch_tensormap = _intrinsics()
