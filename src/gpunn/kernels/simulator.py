"""Two changes to numba's CUDA simulator that every simulated gpunn kernel runs under: a fix, and a faster block.

The bug (numba-cuda 0.30.4, `numba.cuda.simulator.kernelapi.FakeCUDAShared.array`): the simulator runs a
block's threads as Python threads and keeps one NumPy array per `cuda.shared.array` call site, created by
the first thread that asks for it:

    res = self._allocations.get(caller)      # thread A: None ... thread switch ... thread B: None
    if res is None:
        res = np.empty(shape, dtype)         # A and B each create an array
        self._allocations[caller] = res      # the last store wins; the other thread keeps its own

Nothing locks the check against the store. When the interpreter switches threads between them (rare: the
window is a few bytecodes, once per call site and launch, in the launch's first block), the threads of
that block no longer share their "shared" memory: each reads its neighbours' slots from an `np.empty`
array nobody wrote, i.e. from whatever memory NumPy recycled. That is how
`tests/test_gpu_mlp.py::test_fused_epoch_equals_its_own_steps` once saw an epoch loss of 2.8e14 instead of
33.66 (issue 8): in the softmax-CE kernel's first row the max reduction read a garbage slot, so
`loss = log(total) - logit + rowmax` came out as that garbage. `tests/test_simulator.py` forces the thread
switch inside the window and shows the unpatched simulator failing every time and the patched one not.

`patch()` (called when `gpunn.kernels.launch` is imported under the simulator) replaces the method with
one that does the check and the store under one lock, keyed as numba keys them (the kernel's file and
line, here read with `sys._getframe`).

It also replaces how the simulator runs a block (`kernel.BlockManager.run`, `BlockThread.syncthreads`): numba's
launch loop polls its block's threads without ever waiting, and frees a `syncthreads` only when that loop
next finds every live thread blocked, so the polling thread competes for the interpreter with the threads it
waits for. Here a block's threads meet at a condition-variable barrier (`_Barrier`: the last live thread to
arrive frees the others; a thread that exits leaves the barrier, as in numba's loop) while the launching thread
waits in `join`. An exception in one thread aborts the others at their next `syncthreads`, and the launch
raises the first thread's exception, as numba's does. A simulated launch's result is unchanged; its time drops
(a tiny softmax-CE launch 3x, a CNN step under gpu-im2col 1.7x: docs/notes/issue-24-first-hour.md).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["patch", "static_shared_array"]

_ALLOCATION_LOCK = threading.Lock()  # guards every FakeCUDAShared._allocations check-and-store
_state = {"original": None, "thread_run": None}


def static_shared_array(shared, key, shape, dtype, wrap=None):
    """The array `shared` (a FakeCUDAShared, one per simulated launch) holds for call site `key`, created
    on first use; one array for all threads, whatever the thread scheduling. `wrap` (optional) turns a new
    array into what is stored (the race checker stores a recording view)."""
    with _ALLOCATION_LOCK:
        array = shared._allocations.get(key)
        if array is None:
            from numba.cuda import types as numba_types
            from numba.cuda.np import numpy_support

            if isinstance(dtype, numba_types.Type):
                dtype = numpy_support.as_dtype(dtype)
            array = np.empty(shape, dtype)
            if wrap is not None:
                array = wrap(array)
            shared._allocations[key] = array
    return array


def caller_key(depth: int = 2):
    """(file, line) where the caller of our caller is: called from a `FakeCUDAShared.array` replacement,
    the kernel line holding `cuda.shared.array`, which is the key the simulator itself uses."""
    frame = sys._getframe(depth)
    return frame.f_code.co_filename, frame.f_lineno


def _shared_array(self, shape, dtype, alignment=None):
    if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer), or the simulator's error
        return _state["original"](self, shape, dtype, alignment)
    return static_shared_array(self, caller_key(), shape, dtype)


class _Barrier:
    """`syncthreads` for one simulated block: `live` threads not yet exited, `waiting` of them arrived in
    this round (`generation`); `error`, the first exception a thread of the block raised."""

    __slots__ = ("cond", "live", "waiting", "generation", "error")

    def __init__(self, threads: int):
        self.cond = threading.Condition(threading.Lock())
        self.live = threads
        self.waiting = 0
        self.generation = 0
        self.error = None

    def _release(self) -> None:
        self.waiting = 0
        self.generation += 1
        self.cond.notify_all()

    def wait(self) -> None:
        with self.cond:
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads call")
            generation = self.generation
            self.waiting += 1
            if self.waiting == self.live:
                self._release()
            while generation == self.generation and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads clear")

    def leave(self, error) -> None:
        with self.cond:
            self.live -= 1
            if error is not None and self.error is None:
                self.error = error
                self.cond.notify_all()
            elif self.live and self.waiting == self.live:
                self._release()


def _syncthreads(thread) -> None:
    thread._gpunn_barrier.wait()


def _thread_run(thread) -> None:
    try:
        _state["thread_run"](thread)  # numba's: runs the kernel, records an exception in thread.exception
    finally:
        thread._gpunn_barrier.leave(thread.exception)


def _run_block(manager, grid_point, *args) -> None:
    """One block of a simulated launch: a thread per CUDA thread, started, then joined."""
    from numba.cuda.simulator.kernel import BlockThread

    barrier = _Barrier(int(np.prod(manager._block_dim)))

    def target():
        manager._f(*args)

    threads = []
    for block_point in np.ndindex(*manager._block_dim):
        thread = BlockThread(target, manager, grid_point, block_point, manager._debug)
        thread._gpunn_barrier = barrier
        threads.append(thread)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if barrier.error is not None:
        raise barrier.error[0].with_traceback(barrier.error[1])


def patch() -> None:
    """Install the locked allocation and the barrier block runner (idempotent). Needs NUMBA_ENABLE_CUDASIM=1."""
    from numba.cuda.simulator import kernel, kernelapi

    if _state["original"] is None:
        _state["original"] = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = _shared_array
        _state["thread_run"] = kernel.BlockThread.run
        kernel.BlockThread.run = _thread_run
        kernel.BlockThread.syncthreads = _syncthreads
        kernel.BlockManager.run = _run_block


def unpatched():
    """numba's own FakeCUDAShared.array (for the test that shows the race)."""
    return _state["original"]
