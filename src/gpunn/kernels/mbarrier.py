"""Shared-memory barriers (``mbarrier``, compute capability 9.0) and register reallocation (``setmaxnreg``,
sm_90a) for warp-specialized numba.cuda kernels: numba intrinsics of inline PTX, and under numba's CUDA simulator an
emulation that keeps the barrier's state in its shared-memory words.

A barrier is 8 bytes of a shared array of a 4-byte type at word ``word`` (even: 8-byte aligned). It counts arrivals
toward a phase; when the expected arrivals (and, for TMA, the expected transaction bytes) are in, the phase
completes, the count resets and the phase parity flips (phase 0, 1, 0, ...).

* ``mbar_init(smem, word, count)``: a barrier expecting ``count`` arrivals a phase (one thread, before any use;
  then ``fence_mbarrier_init()`` and a block barrier).
* ``mbar_arrive(smem, word)``: one arrival; ``mbar_arrive_expect_tx(smem, word, nbytes)``: one arrival and
  ``nbytes`` more transaction bytes expected this phase (the completion of bulk copies counts them down).
* ``cp_async_mbar_arrive(smem, word)``: an arrival made when every ``cp.async`` this thread issued before it has
  landed (``cp.async.mbarrier.arrive.noinc``: the arrival is one of the ``count`` given at init).
* ``mbar_wait(smem, word, parity)``: spin until the phase of that parity has completed (``try_wait.parity`` in a
  loop): with the phase parity p of the current phase, parity p waits and parity 1 - p passes (the phase before is
  taken as done). A waiter thus flips its parity each time round a ring of barriers. ``mbar_try_wait(smem, word,
  parity)``: one try (uint32 1: that phase has completed, 0: not yet, after the hardware's time limit), for a bounded
  wait.
* ``setmaxnreg_inc(n)`` / ``setmaxnreg_dec(n)`` (int literals, multiples of 8 in 24..256): the warpgroup's
  registers a thread raised / lowered to n (all threads of the warpgroup, at the same point).

Under the simulator (a block's threads as greenlets switched at each ``syncthreads``) word ``word`` holds the
arrivals still expected this phase and word ``word + 1`` the expected count times 2 plus the phase parity: a kernel
that overwrites its barriers corrupts them as on a GPU. A waiting thread yields its turn until the phase completes,
and after ``SPIN_LIMIT`` turns raises (a deadlock: a wrong parity, count or stage). ``cp_async_mbar_arrive`` takes
the thread's queued ``cp.async`` copies (gpunn.kernels.async_copy) as one arrival in flight; a waiter's poll lands
such arrivals (their copies, then the arrival) oldest first only until the phase completes, so a count too low
releases the waiter onto a stage whose last copies have not landed, and a waiter that does not wait reads the stage
before any. The transaction bytes are counted in a side table, ``sim_complete_tx`` standing for a bulk copy's
completion, ``sim_queue_tx`` a bulk copy in flight (landed by a waiter's poll as a cp.async arrival is)."""

from __future__ import annotations

import numpy as np

from gpunn import device

__all__ = ["SPIN_LIMIT", "cp_async_mbar_arrive", "fence_mbarrier_init", "mbar_arrive", "mbar_arrive_expect_tx",
           "mbar_init", "mbar_try_wait", "mbar_wait", "setmaxnreg_dec", "setmaxnreg_inc", "sim_complete_tx",
           "sim_queue_tx"]

SPIN_LIMIT = 2000  # simulator turns a wait may take before it is called a deadlock
_TX: dict[tuple[int, int], int] = {}  # (buffer address, word) -> transaction bytes still expected (simulator)
_PENDING: dict[tuple[int, int], list] = {}  # (buffer address, word) -> cp.async arrivals in flight, oldest first


# ---------------------------------------------------------------- the emulation (simulator)

def _words(smem):
    flat = np.asarray(getattr(smem, "_ary", smem)).reshape(-1)
    if flat.itemsize != 4:
        raise TypeError(f"mbarrier: the shared array must be of a 4-byte type, got {flat.dtype}")
    return flat.view(np.uint32)


def _key(flat, w):
    return flat.__array_interface__["data"][0], w


def _state(smem, word, op):
    flat, w = _words(smem), int(word)
    if w % 2:
        raise ValueError(f"{op}: a barrier's word must be even (8-byte aligned), got {w}")
    expected = int(flat[w + 1]) >> 1
    if op != "mbar_init" and expected == 0:
        raise RuntimeError(f"{op}: the barrier at word {w} was never initialised (or was overwritten)")
    return flat, w, expected


def _complete_if_done(flat, w, expected):
    if int(flat[w]) == 0 and _TX.get(_key(flat, w), 0) == 0:
        flat[w] = expected
        flat[w + 1] = np.uint32(int(flat[w + 1]) ^ 1)


def _sim_init(smem, word, count):
    flat, w, _ = _state(smem, word, "mbar_init")
    if not 0 < int(count) < 2**20:
        raise ValueError(f"mbar_init: count {count} out of range")
    flat[w] = int(count)
    flat[w + 1] = int(count) << 1
    _TX.pop(_key(flat, w), None)
    _PENDING.pop(_key(flat, w), None)


def _arrive(smem, word, op, tx=0):
    flat, w, expected = _state(smem, word, op)
    if int(flat[w]) == 0:
        raise RuntimeError(f"{op}: the barrier at word {w} has no arrival left in this phase")
    if tx:
        _TX[_key(flat, w)] = _TX.get(_key(flat, w), 0) + int(tx)
    flat[w] = int(flat[w]) - 1
    _complete_if_done(flat, w, expected)


def _sim_arrive(smem, word):
    _arrive(smem, word, "mbar_arrive")


def _sim_arrive_expect_tx(smem, word, nbytes):
    _arrive(smem, word, "mbar_arrive_expect_tx", nbytes)


def sim_complete_tx(smem, word, nbytes):
    """Under the simulator: ``nbytes`` of a bulk copy have landed (what a TMA copy's completion does)."""
    flat, w, expected = _state(smem, word, "complete_tx")
    _TX[_key(flat, w)] = _TX.get(_key(flat, w), 0) - int(nbytes)
    _complete_if_done(flat, w, expected)


def _sim_cp_async_arrive(smem, word):
    from .async_copy import sim_take_all

    flat, w, _ = _state(smem, word, "cp_async_mbar_arrive")
    _PENDING.setdefault(_key(flat, w), []).append((sim_take_all(), None))


def sim_queue_tx(smem, word, land, nbytes):
    """Under the simulator: a bulk copy in flight on the barrier at ``word`` (gpunn.kernels.tma): ``land()`` writes
    it, then its ``nbytes`` complete transactions, when a waiter's poll reaches it."""
    flat, w, _ = _state(smem, word, "complete_tx")
    _PENDING.setdefault(_key(flat, w), []).append(([land], int(nbytes)))


def _complete_pending(smem, flat, w, parity):
    """The poll of a waiter for the phase of ``parity``: while that is the current phase, the barrier's pending
    cp.async arrivals and bulk copies land (copies, then the arrival or the bytes) one by one, oldest first; those
    after stay in flight."""
    pending = _PENDING.get(_key(flat, w))
    while pending and (int(flat[w + 1]) & 1) == parity:
        lands, nbytes = pending.pop(0)
        for land in lands:
            land()
        if nbytes is None:
            _arrive(smem, w, "cp_async_mbar_arrive")
        else:
            sim_complete_tx(smem, w, nbytes)


def _sim_wait(smem, word, parity):
    from .simulator import current_thread

    flat, w, _ = _state(smem, word, "mbar_wait")
    thread = None
    turns = 0
    _complete_pending(smem, flat, w, int(parity) & 1)
    while (int(flat[w + 1]) & 1) == (int(parity) & 1):  # the phase of this parity is the current one
        turns += 1
        if turns > SPIN_LIMIT:
            raise RuntimeError(f"mbar_wait: the phase of parity {int(parity) & 1} of the barrier at word {w} did not "
                               f"complete in {SPIN_LIMIT} turns (a deadlock: wrong parity, count or stage?)")
        thread = thread or current_thread()
        thread.syncthreads()  # a greenlet's turn ends here; the others run
        _complete_pending(smem, flat, w, int(parity) & 1)


def _sim_try_wait(smem, word, parity):
    from .simulator import current_thread

    flat, w, _ = _state(smem, word, "mbar_try_wait")
    _complete_pending(smem, flat, w, int(parity) & 1)
    if (int(flat[w + 1]) & 1) != (int(parity) & 1):
        return np.uint32(1)
    current_thread().syncthreads()  # the try's time limit: its turn ends, the others run
    return np.uint32(0)


def _sim_setmaxnreg(n):
    if not (24 <= int(n) <= 256 and int(n) % 8 == 0):
        raise ValueError(f"setmaxnreg: {n} is not a multiple of 8 in 24..256")


def _noop(*args):
    return None


# ---------------------------------------------------------------- the intrinsics (a GPU)

def _intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)

    def address(context, builder, array_type, array, index):
        """The shared-memory address (32 bits) of element ``index`` of a shared array."""
        data = context.make_array(array_type)(context, builder, array).data
        offset = builder.zext(index, i64) if index.type.width < 64 else index
        ptr = builder.bitcast(builder.gep(data, [offset]), i8.as_pointer())
        return builder.ptrtoint(builder.addrspacecast(ptr, ir.PointerType(i8, 3)), i32)

    def check(op, smem):
        if not isinstance(smem, types.Array) or smem.dtype.bitwidth != 32:
            raise TypingError(f"{op}: smem must be a shared array of a 4-byte type, got {smem}")

    def barrier_op(op, ptx, extra):
        """An intrinsic ``op(smem, word, *extra uint32 operands)`` emitting ``ptx`` ($0 the barrier's address)."""
        if extra == 0:
            @intrinsic
            def emit(typingctx, smem, word):
                check(op, smem)
                return types.void(smem, types.uint32), codegen
        else:
            @intrinsic
            def emit(typingctx, smem, word, value):
                check(op, smem)
                return types.void(smem, types.uint32, types.uint32), codegen

        def codegen(context, builder, sig, args):
            operands = [address(context, builder, sig.args[0], args[0], args[1]), *args[2:]]
            constraints = ",".join(["r"] * len(operands) + ["~{memory}"])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] * len(operands)), ptx, constraints,
                               side_effect=True)
            builder.call(asm, operands)
            return context.get_dummy_value()

        return emit

    def statement(ptx):
        @intrinsic
        def emit(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return emit

    def setmaxnreg(direction):
        @intrinsic
        def emit(typingctx, n):
            if not isinstance(n, types.IntegerLiteral) or not (24 <= n.literal_value <= 256 and
                                                               n.literal_value % 8 == 0):
                raise TypingError(f"setmaxnreg_{direction}: n must be an int literal, a multiple of 8 in 24..256")
            ptx = f"setmaxnreg.{direction}.sync.aligned.u32 {n.literal_value};"

            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(n), codegen
        return emit

    @intrinsic
    def mbar_try_wait(typingctx, smem, word, parity):
        check("mbar_try_wait", smem)

        def codegen(context, builder, sig, args):
            ptx = ("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n"
                   "selp.u32 $0, 1, 0, p;\n}")
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32]), ptx, "=r,r,r,~{memory}", side_effect=True)
            return builder.call(asm, [address(context, builder, sig.args[0], args[0], args[1]), args[2]])

        return types.uint32(smem, types.uint32, types.uint32), codegen

    wait_ptx = ("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n@!p bra WAIT;\n}")
    return (barrier_op("mbar_init", "mbarrier.init.shared::cta.b64 [$0], $1;", 1),
            barrier_op("mbar_arrive", "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [$0];\n}", 0),
            barrier_op("mbar_arrive_expect_tx",
                       "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1;\n}", 1),
            barrier_op("cp_async_mbar_arrive", "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];", 0),
            barrier_op("mbar_wait", wait_ptx, 1),
            statement("fence.mbarrier_init.release.cluster;"), setmaxnreg("inc"), setmaxnreg("dec"), mbar_try_wait)


if device.simulator_enabled():
    from .simulator import patch

    patch()  # gpunn's block runner: a waiting thread yields its turn
    mbar_init, mbar_arrive, mbar_arrive_expect_tx = _sim_init, _sim_arrive, _sim_arrive_expect_tx
    cp_async_mbar_arrive, mbar_wait, mbar_try_wait = _sim_cp_async_arrive, _sim_wait, _sim_try_wait
    fence_mbarrier_init = _noop
    setmaxnreg_inc = setmaxnreg_dec = _sim_setmaxnreg
else:
    (mbar_init, mbar_arrive, mbar_arrive_expect_tx, cp_async_mbar_arrive, mbar_wait, fence_mbarrier_init,
     setmaxnreg_inc, setmaxnreg_dec, mbar_try_wait) = _intrinsics()
