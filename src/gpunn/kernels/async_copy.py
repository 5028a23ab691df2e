"""Asynchronous copies from global to shared memory (``cp.async``, compute capability 8.0 or newer) for numba.cuda
kernels, as numba intrinsics of inline PTX, and under numba's CUDA simulator an emulation of their groups.

* ``cp_async4(dst, dst_index, src, src_index, valid)``: the 4 bytes at element ``src_index`` of ``src`` (a 1-D global
  array of a 4-byte or 2-byte type: one float32 / uint32, or two uint16) to element ``dst_index`` of ``dst`` (a shared
  array of a 4-byte type), or 4 zero bytes where ``valid`` is false (PTX src-size 0: nothing is read, so
  ``src_index`` may then be out of range). Both addresses must be 4-byte aligned. The copy lands later; the issuing
  thread sees it after ``cp_async_wait``, the block after that and a barrier.
* ``cp_async16(dst, dst_index, src, src_index, valid)``: the same for 16 bytes (``cp.async.cg``: through L2 only);
  both addresses must be 16-byte aligned.
* ``cp_async_commit()``: the copies issued since the last commit form a group.
* ``cp_async_wait(n)``: wait until at most ``n`` (an int literal) of this thread's groups are still in flight.
* ``shared_address(array)``: the shared-memory address of a shared array's first element (uint32; 0 under the
  simulator), e.g. to align a dynamic shared buffer at run time.

Under the simulator a copy is queued by its thread, its group formed at the commit, and it lands (the bytes read and
written then) when a ``cp_async_wait`` of that thread retires its group: a kernel that reads a stage before its wait
retires the group reads what was there before, as a GPU may.

What the tensor-core GEMMs want them for (several K steps of tiles in flight without registers):
gpunn/kernels/gemm/NOTES-tensor.md."""

from __future__ import annotations

import functools

import numpy as np

from gpunn import device

__all__ = ["cp_async16", "cp_async4", "cp_async_commit", "cp_async_wait", "shared_address"]


def _bytes(array, index):
    """(a flat uint8 view of a simulated array's memory, the byte offset of element ``index``)."""
    flat = np.asarray(getattr(array, "_ary", array)).reshape(-1)
    return flat.view(np.uint8), int(index) * flat.itemsize


def _queue():
    """This simulated thread's copies: [issued, not committed], [committed groups, oldest first]."""
    from .simulator import current_thread

    thread = current_thread()
    state = getattr(thread, "_gpunn_cp_async", None)
    if state is None:
        state = thread._gpunn_cp_async = ([], [])
    return state


def _sim_copy_fn(nbytes):
    def copy(dst, dst_index, src, src_index, valid):
        d, start = _bytes(dst, dst_index)
        s, first = _bytes(src, src_index) if valid else (None, 0)
        if s is not None and first + nbytes > s.size:
            raise IndexError(f"cp_async{nbytes}: bytes {first}..{first + nbytes} of a {s.size}-byte source")
        _queue()[0].append((d, start, s, first, nbytes))

    return copy


def _sim_commit():
    issued, groups = _queue()
    groups.append(list(issued))
    issued.clear()


def _sim_wait(n):
    _, groups = _queue()
    while len(groups) > int(n):
        for copy in groups.pop(0):
            _land(*copy)


def _land(d, start, s, first, nbytes):
    d[start:start + nbytes] = 0 if s is None else s[first:first + nbytes]


def sim_take_all():
    """Under the simulator: every copy this thread issued, committed or not, taken off its queue as landing
    functions, oldest first (what ``cp.async.mbarrier.arrive`` waits for: gpunn.kernels.mbarrier lands them)."""
    issued, groups = _queue()
    lands = [functools.partial(_land, *copy) for group in [*groups, issued] for copy in group]
    groups.clear()
    issued.clear()
    return lands


def _sim_address(array):
    return np.uint32(0)


def _intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)

    def element(context, builder, array_type, array, index):
        data = context.make_array(array_type)(context, builder, array).data
        offset = builder.zext(index, i64) if index.type.width < 64 else index
        return builder.bitcast(builder.gep(data, [offset]), i8.as_pointer())

    def copy(nbytes, cache):
        op = f"cp_async{nbytes}"

        @intrinsic
        def cp_async(typingctx, dst, dst_index, src, src_index, valid):
            for name, array, widths in (("dst", dst, (32,)), ("src", src, (16, 32))):
                if not isinstance(array, types.Array) or array.dtype.bitwidth not in widths:
                    raise TypingError(f"{op}: {name} must be an array of a {' or '.join(str(w // 8) for w in widths)}"
                                      f"-byte type, got {array}")
            if src.ndim != 1:
                raise TypingError(f"{op}: src must be 1-D (a flat view), got {src.ndim}-D")

            def codegen(context, builder, sig, args):
                dst_ptr = element(context, builder, sig.args[0], args[0], args[1])
                src_ptr = element(context, builder, sig.args[2], args[2], args[3])
                shared = builder.ptrtoint(builder.addrspacecast(dst_ptr, ir.PointerType(i8, 3)), i32)
                size = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                      ir.Constant(i32, nbytes), ir.Constant(i32, 0))
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                                   f"cp.async.{cache}.shared.global [$0], [$1], {nbytes}, $2;", "r,l,r,~{memory}",
                                   side_effect=True)
                builder.call(asm, [shared, builder.ptrtoint(src_ptr, i64), size])
                return context.get_dummy_value()

            return types.void(dst, types.uint32, src, types.uint32, types.boolean), codegen

        return cp_async

    @intrinsic
    def shared_address(typingctx, array):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            shared = builder.addrspacecast(builder.bitcast(data, i8.as_pointer()), ir.PointerType(i8, 3))
            return builder.ptrtoint(shared, i32)

        return types.uint32(array), codegen

    @intrinsic
    def cp_async_commit(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def cp_async_wait(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            raise TypingError("cp_async_wait: n must be an int literal (the groups left in flight)")
        pending = int(n.literal_value)

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {pending};", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(n), codegen

    return copy(4, "ca"), copy(16, "cg"), cp_async_commit, cp_async_wait, shared_address


if device.simulator_enabled():
    cp_async4, cp_async16, cp_async_commit, cp_async_wait = _sim_copy_fn(4), _sim_copy_fn(16), _sim_commit, _sim_wait
    shared_address = _sim_address
else:
    cp_async4, cp_async16, cp_async_commit, cp_async_wait, shared_address = _intrinsics()
