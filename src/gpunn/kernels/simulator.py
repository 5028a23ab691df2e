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
waits for, and every thread is an OS thread whose turn costs a context switch. Here a block's threads are
greenlets that the launching thread switches in turn (`_run_greenlets`): each runs to its next `syncthreads` or
its end, and a round in which every live thread has had its turn is the barrier (a thread that exits leaves it, as
on a GPU). numba's fake CUDA module and the race checker find the running thread through `current_thread()`. An
exception in one thread aborts the others at their next `syncthreads`, and the launch raises the first thread's
exception, as numba's does. Debug launches, and launches inside `os_threads()` (a test that needs the interpreter
to switch threads anywhere), keep numba's OS threads, meeting at a `_Barrier`. A simulated launch's result is
unchanged; its time drops (a tiny softmax-CE launch 3x, a CNN step under gpu-im2col 1.7x with the OS-thread
barrier: docs/notes/issue-24-first-hour.md; a thread's turn from about 30 to 12 us with greenlets:
docs/notes/issue-38-suite-time.md).

Two more costs of numba's simulator are cut, none of them changing what a kernel computes:
- a device function called inside a launch: numba swaps its module's `cuda` globals for the launch's fake module
  and back around every call (a lock, a scan of the module's globals, a context manager); here a module is
  swapped at its first call in a launch and restored when the launch ends (`_kernel_call`);
- a scalar cast such as `uint32(i)` goes through numba's `Type.__call__` (an import, an ABC instance check, a
  method lookup); here a plain Python or NumPy scalar goes straight to the NumPy type numba itself casts to.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading

import numpy as np

__all__ = ["current_thread", "os_threads", "patch", "static_shared_array"]

_ALLOCATION_LOCK = threading.Lock()  # guards every FakeCUDAShared._allocations check-and-store
_state = {"original": None, "thread_run": None, "kernel_call": None, "type_call": None, "sim_thread_class": None,
          "os_threads": False}
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


def _syncthreads(thread) -> None:
    if thread._gpunn_parent is not None:  # a simulated thread on a greenlet: back to its block's scheduler
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        thread._gpunn_parent.switch()
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads clear")
    else:
        thread._gpunn_barrier.wait()


def _thread_run(thread) -> None:
    try:
        _state["thread_run"](thread)  # numba's: runs the kernel, records an exception in thread.exception
    finally:
        thread._gpunn_barrier.leave(thread.exception)


def current_thread():
    """The simulated thread running now (its CUDA indices): the greenlet's, else the OS thread (a debug launch's
    numba BlockThread). Stands for `threading.current_thread` in numba's fake CUDA module and the race checker."""
    return getattr(_getcurrent(), "sim_thread", None) or threading.current_thread()


def _getcurrent():
    from greenlet import getcurrent

    globals()["_getcurrent"] = getcurrent  # the import once
    return getcurrent()


@contextlib.contextmanager
def os_threads():
    """Launches inside run their threads on OS threads at a `_Barrier` (numba's scheduling: the interpreter may
    switch threads anywhere), not on greenlets; for a test that needs such a switch."""
    before, _state["os_threads"] = _state["os_threads"], True
    try:
        yield
    finally:
        _state["os_threads"] = before


def _run_block(manager, grid_point, *args) -> None:
    """One block of a simulated launch: a thread per CUDA thread, each on a greenlet (_run_greenlets); debug
    launches (numba's debug wrapper) and those inside `os_threads()` on numba's own OS threads at a `_Barrier`."""
    def target():
        manager._f(*args)

    if not (manager._debug or _state["os_threads"]):
        _run_greenlets(manager, grid_point, target)
        return
    from numba.cuda.simulator.kernel import BlockThread

    barrier = _Barrier(int(np.prod(manager._block_dim)))
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


def _run_greenlets(manager, grid_point, target) -> None:
    """A block's threads as greenlets switched in turn by this (the launching) thread: each runs until its next
    `syncthreads` (which switches back here) or its end; a round ends when every live thread has had its turn,
    which is the barrier (a thread that ended left it, as on a GPU). The first thread to raise aborts the others at
    their next `syncthreads`, and the launch raises its error. A switch costs a few microseconds, where an OS thread
    waking for its turn costs tens."""
    from greenlet import greenlet
    from numba.cuda.simulator.kernelapi import Dim3

    parent = _getcurrent()
    bx, by, _ = manager._block_dim
    block_idx = Dim3(*grid_point)
    threads = []
    for x, y, z in np.ndindex(*manager._block_dim):
        thread = _state["sim_thread_class"].__new__(_state["sim_thread_class"])
        thread._manager = manager
        thread.blockIdx = block_idx
        thread.threadIdx = Dim3(x, y, z)
        thread.thread_id = x + bx * (y + by * z)
        thread.syncthreads_blocked = False
        thread.exception = None
        thread.abort = False
        thread.debug = False
        thread._target, thread._args, thread._kwargs = target, (), {}
        thread._gpunn_parent = parent
        runner = greenlet(functools.partial(_green_run, thread), parent)
        runner.sim_thread = thread
        threads.append((thread, runner))
    error = None
    live = threads
    while live:
        waiting = []
        for thread, runner in live:
            runner.switch()
            if not runner.dead:
                waiting.append((thread, runner))
            elif thread.exception is not None and error is None:
                error = thread.exception
                for other, _ in threads:
                    other.abort = True
        live = waiting
    if error is not None:
        raise error[0].with_traceback(error[1])


def _green_run(thread) -> None:
    # numba's BlockThread.run: the kernel, an Exception recorded in thread.exception. SystemExit ends the thread
    # alone, as it ends numba's OS thread; KeyboardInterrupt goes on to the launch.
    with contextlib.suppress(SystemExit):
        _state["thread_run"](thread)


def _sim_thread_class(base):
    """numba's BlockThread, made without starting an OS thread (never `Thread.__init__`): the fields numba's
    simulator and the race checker read, its `syncthreads_*` methods, its `run` (called on a greenlet)."""

    class SimThread(base):
        def __repr__(self):
            return base.__str__(self)

    return SimThread


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


class _ThreadingView:
    """numba's fake CUDA module's `threading`: `current_thread()` is the simulated thread (`current_thread`),
    the rest is the threading module."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


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
        kernel.BlockThread._gpunn_parent = None  # an OS thread's: its syncthreads waits at the _Barrier
        kernel.BlockManager.run = _run_block
        _state["sim_thread_class"] = _sim_thread_class(kernel.BlockThread)
        kernelapi.threading = _ThreadingView()
        _state["kernel_call"] = kernel.FakeCUDAKernel.__call__
        kernel.FakeCUDAKernel.__call__ = _kernel_call
        _state["type_call"] = scalars.Integer.__call__
        scalars.Integer.__call__ = _scalar_call
        scalars.Float.__call__ = _scalar_call


def unpatched():
    """numba's own FakeCUDAShared.array (for the test that shows the race)."""
    return _state["original"]
