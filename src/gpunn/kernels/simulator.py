"""Changes to numba's CUDA simulator that every simulated gpunn kernel runs under: a fix, and a faster simulator.

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
waits for the last one to leave. An exception in one thread aborts the others at their next `syncthreads`, and the
launch raises the first thread's exception, as numba's does. A simulated launch's result is unchanged; its time drops
(a tiny softmax-CE launch 3x, a CNN step under gpu-im2col 1.7x: docs/notes/issue-24-first-hour.md).

Three more costs of numba's simulator are cut, none of them changing what a kernel computes:
- a device function called inside a launch: numba swaps its module's `cuda` globals for the launch's fake module
  and back around every call (a lock, a scan of the module's globals, a context manager); here a module is
  swapped at its first call in a launch and restored when the launch ends (`_kernel_call`);
- a scalar cast such as `uint32(i)` goes through numba's `Type.__call__` (an import, an ABC instance check, a
  method lookup); here a plain Python or NumPy scalar goes straight to the NumPy type numba itself casts to;
- a simulated thread is no longer an OS thread started for one block: a pool of threads runs block after block
  (`_worker_class`; debug launches keep numba's threads).
What each saved: docs/notes/issue-38-suite-time.md.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np

__all__ = ["patch", "static_shared_array"]

_ALLOCATION_LOCK = threading.Lock()  # guards every FakeCUDAShared._allocations check-and-store
_state = {"original": None, "thread_run": None, "kernel_call": None, "type_call": None, "thread_class": None}
_SWAP_LOCK = threading.Lock()  # guards _swapped: a block's threads make their first device calls side by side
_swapped: dict[int, tuple[dict, dict]] = {}  # id(module globals) -> (globals, the names swapped and their values)
# Arguments a scalar cast takes straight to NumPy: Python's and NumPy's scalar types (never a numba type, which
# makes a signature instead of a value).
_PLAIN_SCALARS = frozenset({int, float, bool, *np.sctypeDict.values()})
_NUMPY_TYPES: dict[str, type] = {}


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
            if not self.live:
                self.cond.notify_all()  # the launching thread, in wait_done

    def wait_done(self) -> None:
        with self.cond:
            while self.live:
                self.cond.wait()


def _syncthreads(thread) -> None:
    thread._gpunn_barrier.wait()


def _thread_run(thread) -> None:
    try:
        _state["thread_run"](thread)  # numba's: runs the kernel, records an exception in thread.exception
    finally:
        thread._gpunn_barrier.leave(thread.exception)


def _run_block(manager, grid_point, *args) -> None:
    """One block of a simulated launch: a thread per CUDA thread (pooled threads, see _worker_class), started,
    then waited for."""
    from numba.cuda.simulator.kernel import BlockThread

    barrier = _Barrier(int(np.prod(manager._block_dim)))

    def target():
        manager._f(*args)

    if manager._debug:  # numba's own threads, with its debug wrapper
        threads = []
        for block_point in np.ndindex(*manager._block_dim):
            thread = BlockThread(target, manager, grid_point, block_point, manager._debug)
            thread._gpunn_barrier = barrier
            threads.append(thread)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        workers = _take_workers(barrier.live)
        try:
            for worker, block_point in zip(workers, np.ndindex(*manager._block_dim)):
                worker.assign(target, manager, grid_point, block_point, barrier)
            barrier.wait_done()
        finally:
            _idle_workers.extend(workers)
    if barrier.error is not None:
        raise barrier.error[0].with_traceback(barrier.error[1])


WORKER_NAME = "gpunn-simulated-thread"
_idle_workers: list = []  # pooled simulated threads between blocks (only the launching thread takes and returns)


def _take_workers(count: int) -> list:
    """`count` idle pooled threads, started where the pool has too few."""
    while len(_idle_workers) < count:
        worker = _state["thread_class"]()
        worker.start()
        _idle_workers.append(worker)
    taken = _idle_workers[-count:]
    del _idle_workers[-count:]
    return taken


def _worker_class(base):
    """A numba BlockThread that runs block after block, instead of an OS thread started per simulated thread and
    block. Before each block it is reset to what a new BlockThread would be
    (its CUDA indices, no exception, and none of the attributes set on it during its last block, such as the
    race checker's barrier count); it then runs the kernel as numba's BlockThread.run does and leaves the
    block's barrier."""
    from numba.cuda.simulator.kernelapi import Dim3

    class _Worker(base):
        _job_keys = frozenset({"_manager", "blockIdx", "threadIdx", "thread_id", "syncthreads_blocked",
                               "exception", "abort", "debug", "_gpunn_barrier", "_target", "_args", "_kwargs"})

        def __init__(self):
            threading.Thread.__init__(self, daemon=True, name=WORKER_NAME)
            self._go = threading.Lock()
            self._go.acquire()  # released by assign(): one block's work at a time
            self._job = None
            self._own_keys = None
            self._own_keys = frozenset(vars(self)) | self._job_keys

        def assign(self, target, manager, block_idx, thread_idx, barrier) -> None:
            for key in [k for k in vars(self) if k not in self._own_keys]:
                delattr(self, key)  # set by others during the last block
            self._manager = manager
            self.blockIdx = Dim3(*block_idx)
            self.threadIdx = Dim3(*thread_idx)
            bx, by, _ = manager._block_dim
            self.thread_id = self.threadIdx.x + bx * (self.threadIdx.y + by * self.threadIdx.z)
            self.syncthreads_blocked = False
            self.exception = None
            self.abort = False
            self.debug = False
            self._gpunn_barrier = barrier
            self._job = target
            self._go.release()

        def run(self) -> None:
            while True:
                self._go.acquire()
                self._target, self._args, self._kwargs = self._job, (), {}
                self._job = None
                # numba's BlockThread.run (which drops _target), then leave the barrier. It lets SystemExit in a
                # kernel through, which would end its thread unnoticed: this one waits for its next block instead.
                with contextlib.suppress(BaseException):
                    _thread_run(self)

    return _Worker


def _swap_in(fn_globals: dict, fake_module) -> None:
    """Point a module's `cuda` names at the running launch's fake module until the launch ends (once per module
    and launch; the first thread to call into the module does it, the others wait for it here)."""
    from numba import cuda

    with _SWAP_LOCK:
        if id(fn_globals) in _swapped:
            return
        names = {k: v for k, v in fn_globals.items() if v is cuda}
        for k in names:
            fn_globals[k] = fake_module
        _swapped[id(fn_globals)] = (fn_globals, names)


def _restore_swapped() -> None:
    with _SWAP_LOCK:
        for fn_globals, names in _swapped.values():
            fn_globals.update(names)
        _swapped.clear()


def _kernel_call(self, *args):
    """FakeCUDAKernel.__call__: inside a launch, a device function runs with its module swapped once per launch;
    outside one, numba's own call (a launch, or a device function called from the host), then the modules its
    device functions swapped are restored."""
    from numba.cuda.simulator import kernel

    context = kernel._kernel_context
    if context is None:
        try:
            return _state["kernel_call"](self, *args)
        finally:
            if _swapped:
                _restore_swapped()
    fn = self.fn
    if id(fn.__globals__) not in _swapped:
        _swap_in(fn.__globals__, context)
    return fn(*args)


def _scalar_call(self, *args):
    """numba's Integer/Float `__call__` for a plain scalar: the NumPy type numba's cast_python_value uses."""
    if len(args) == 1 and type(args[0]) in _PLAIN_SCALARS:
        np_type = _NUMPY_TYPES.get(self.name)
        if np_type is None:
            np_type = _NUMPY_TYPES[self.name] = getattr(np, self.name)
        return np_type(args[0])
    return _state["type_call"](self, *args)


def patch() -> None:
    """Install the locked allocation, the barrier block runner and the faster device calls and casts
    (idempotent). Needs NUMBA_ENABLE_CUDASIM=1."""
    from numba.core.types import scalars
    from numba.cuda.simulator import kernel, kernelapi

    if _state["original"] is None:
        _state["original"] = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = _shared_array
        _state["thread_run"] = kernel.BlockThread.run
        kernel.BlockThread.run = _thread_run
        kernel.BlockThread.syncthreads = _syncthreads
        kernel.BlockManager.run = _run_block
        _state["thread_class"] = _worker_class(kernel.BlockThread)
        _state["kernel_call"] = kernel.FakeCUDAKernel.__call__
        kernel.FakeCUDAKernel.__call__ = _kernel_call
        _state["type_call"] = scalars.Integer.__call__
        scalars.Integer.__call__ = _scalar_call
        scalars.Float.__call__ = _scalar_call


def unpatched():
    """numba's own FakeCUDAShared.array (for the test that shows the race)."""
    return _state["original"]
