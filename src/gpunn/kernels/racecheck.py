"""A data-race checker for kernels run under numba's CUDA simulator (like compute-sanitizer's racecheck).

Why: a kernel with a race (a missing `syncthreads`, two threads writing one element, a non-atomic
read-modify-write) gives a result that depends on the order the simulator happens to run its threads in: on
numba's OS threads right almost every time, wrong under load; on gpunn's greenlets (gpunn.kernels.simulator)
one fixed order, right or wrong for reasons unrelated to a GPU's. A test that only compares outputs is then flaky
or blind instead of failing. This checker makes such a kernel fail every time,
whatever the scheduling, by recording every element access and reporting two that are not ordered.

Inside `racecheck()` every kernel launch records, per element (by byte address), the accesses to shared
arrays (`cuda.shared.array`) and to global arrays (kernel arguments). Two accesses to one element race
when they come from different threads, at least one is a write, not both are atomics, and nothing orders
them: threads of one block are ordered only by a `syncthreads` between the two accesses (each thread
counts the barriers it has passed; equal counts mean the same barrier interval), threads of different
blocks are never ordered within one launch (the simulator runs blocks one after another, a GPU does not).
The first race raises `RaceError` naming the kernel, the memory space, both threads and both accesses.
It also reports uninitialised reads, which the simulator turns into scheduling- and allocation-dependent
results too (its shared and local arrays are `np.empty`, so they hold whatever the allocator hands back):
a shared element read before any thread of the block wrote it, a local array element read before its
thread wrote it.

Limits: it checks one launch at a time (launches on one stream are ordered); warp-synchronous code and
`threadfence`-based inter-block protocols are reported as races (we use neither); local arrays are private
and not recorded. It needs NUMBA_ENABLE_CUDASIM=1.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..errors import GpunnError
from . import simulator

__all__ = ["RaceError", "racecheck"]


class RaceError(AssertionError):
    """Two unordered accesses to one element, at least one a write (raised inside the kernel's thread)."""


class _Access:
    __slots__ = ("block", "thread", "epoch", "atomic", "write")

    def __init__(self, block, thread, epoch, atomic, write):
        self.block = block
        self.thread = thread
        self.epoch = epoch
        self.atomic = atomic
        self.write = write

    def ordered_with(self, other: _Access) -> bool:
        if self.block == other.block and self.thread == other.thread:
            return True  # program order
        if self.atomic and other.atomic:
            return True  # atomics to one element serialise
        # threads of one block: only a barrier orders them; threads of different blocks: nothing does
        return self.block == other.block and self.epoch != other.epoch

    def __str__(self):
        kind = ("atomic " if self.atomic else "") + ("write" if self.write else "read")
        return f"{kind} by block {self.block} thread {self.thread} after {self.epoch} syncthreads"


class _Log:
    """Accesses of one launch, per element address: the last write and the reads since it."""

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.lock = threading.Lock()
        self.last_write: dict = {}  # element -> _Access
        self.reads: dict = {}  # element -> {(block, thread): _Access}

    def record(self, space: str, address, access: _Access, where: str):
        with self.lock:
            previous = self.last_write.get(address)
            if previous is None and space == "shared" and not access.write:
                # a block's shared memory starts as garbage: what was read is whatever the last user left
                raise RaceError(f"uninitialised read in kernel {self.kernel_name}: shared memory {where}: "
                                f"{access}, before any thread of the block wrote it")
            if previous is not None and not access.ordered_with(previous):
                self._fail(space, where, previous, access)
            if access.write:
                for read in self.reads.pop(address, {}).values():
                    if not access.ordered_with(read):
                        self._fail(space, where, read, access)
                self.last_write[address] = access
            else:
                self.reads.setdefault(address, {})[(access.block, access.thread)] = access

    def _fail(self, space, where, first, second):
        raise RaceError(f"race in kernel {self.kernel_name}: {space} memory {where}: {first}, then "
                        f"{second}, with no syncthreads between them")


_state = threading.local()  # per simulator thread: inside an atomic operation or not
_current: dict = {"log": None}  # the launch being checked (the simulator runs one launch at a time)


def _element_address(ary: np.ndarray, idx):
    """Byte address of ary[idx] when idx selects one element, else None (a view: its elements are
    recorded when the kernel indexes it)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if len(idx) != ary.ndim:
        return None
    address = ary.__array_interface__["data"][0]
    for i, extent, stride in zip(idx, ary.shape, ary.strides):
        if not isinstance(i, (int, np.integer)):
            return None
        i = int(i)
        if i < 0:
            i += extent
        address += i * stride
    return address


def _note(space: str, ary: np.ndarray, idx, write: bool):
    log = _current["log"]
    if log is None:
        return
    address = _element_address(ary, idx)
    if address is None:
        return
    thread = simulator.current_thread()
    epoch = getattr(thread, "_racecheck_barriers", 0)
    block = tuple(thread.blockIdx)
    access = _Access(block, tuple(thread.threadIdx), epoch, getattr(_state, "atomic", False), write)
    # the simulator hands every block of a launch the same shared arrays; on a GPU each block has its own
    key = (block, address) if space == "shared" else address
    log.record(space, key, access, f"element {idx} of a {ary.dtype}{list(ary.shape)} array")


class _SharedArray(np.ndarray):
    """A shared array whose element reads and writes are recorded."""

    def __getitem__(self, idx):
        _note("shared", self, idx, write=False)
        return super().__getitem__(idx)

    def __setitem__(self, idx, value):
        _note("shared", self, idx, write=True)
        super().__setitem__(idx, value)


class _LocalArray(np.ndarray):
    """A thread's local array that remembers which elements were written: reading one that was not is reading
    whatever the registers or stack held (on a GPU as in the simulator, whose local arrays are np.empty)."""

    def __getitem__(self, idx):
        written = getattr(self, "_written", None)
        if written is not None and _current["log"] is not None and _element_address(self, idx) is not None \
                and not written[idx]:
            raise RaceError(f"uninitialised read: local array element {idx} of a {self.dtype}{list(self.shape)} "
                            "array, before this thread wrote it")
        return super().__getitem__(idx)

    def __setitem__(self, idx, value):
        super().__setitem__(idx, value)
        written = getattr(self, "_written", None)
        if written is not None:
            written[idx] = True


@contextlib.contextmanager
def racecheck():
    """Record the memory accesses of every simulated kernel launched inside the block; raise RaceError on
    the first race (see the module docstring)."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        raise GpunnError("racecheck works under the CUDA simulator only: set NUMBA_ENABLE_CUDASIM=1 "
                         "before numba is imported")
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi as sim_api
    from numba.cuda.simulator.cudadrv import devicearray as sim_arrays

    simulator.patch()  # first, so that the shared-array method saved and restored below is the fixed one
    within = sim_arrays.FakeWithinKernelCUDAArray
    originals = {
        "getitem": within.__getitem__,
        "setitem": within.__setitem__,
        "shared": sim_api.FakeCUDAShared.array,
        "local": sim_api.FakeCUDALocal.array,
        "sync": sim_kernel.BlockThread.syncthreads,
        "run": sim_kernel.BlockManager.run,
        "atomics": {name: getattr(sim_api.FakeCUDAAtomic, name) for name in dir(sim_api.FakeCUDAAtomic)
                    if not name.startswith("_")},
    }

    def getitem(self, idx):
        _note("global", self._item._ary, idx, write=False)
        return originals["getitem"](self, idx)

    def setitem(self, idx, value):
        _note("global", self._item._ary, idx, write=True)
        originals["setitem"](self, idx, value)

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0:  # dynamic shared memory: one buffer, whoever asks
            return originals["shared"](self, shape, dtype, alignment).view(_SharedArray)
        # keyed by the kernel's line (called through this wrapper the simulator would see this line),
        # created under the allocation lock of gpunn.kernels.simulator
        return simulator.static_shared_array(self, simulator.caller_key(), shape, dtype,
                                             wrap=lambda a: a.view(_SharedArray))

    def local_array(self, shape, dtype, alignment=None):
        ary = originals["local"](self, shape, dtype, alignment).view(_LocalArray)
        ary._written = np.zeros(ary.shape, dtype=bool)
        return ary

    def syncthreads(self):
        originals["sync"](self)
        self._racecheck_barriers = getattr(self, "_racecheck_barriers", 0) + 1

    def run(self, grid_point, *args):
        # one log per launch: a launch's blocks run one after another, the first starts a new log
        if grid_point == (0,) * len(grid_point) or _current["log"] is None:
            _current["log"] = _Log(getattr(self._f, "__qualname__", str(self._f)))
        return originals["run"](self, grid_point, *args)

    def atomic(name):
        op = originals["atomics"][name]

        def checked(self, *args, **kwargs):
            _state.atomic = True
            try:
                return op(self, *args, **kwargs)
            finally:
                _state.atomic = False

        return checked

    within.__getitem__ = getitem
    within.__setitem__ = setitem
    sim_api.FakeCUDAShared.array = shared_array
    sim_api.FakeCUDALocal.array = local_array
    sim_kernel.BlockThread.syncthreads = syncthreads
    sim_kernel.BlockManager.run = run
    for name in originals["atomics"]:
        setattr(sim_api.FakeCUDAAtomic, name, atomic(name))
    try:
        yield
    finally:
        within.__getitem__ = originals["getitem"]
        within.__setitem__ = originals["setitem"]
        sim_api.FakeCUDAShared.array = originals["shared"]
        sim_api.FakeCUDALocal.array = originals["local"]
        sim_kernel.BlockThread.syncthreads = originals["sync"]
        sim_kernel.BlockManager.run = originals["run"]
        for name, op in originals["atomics"].items():
            setattr(sim_api.FakeCUDAAtomic, name, op)
        _current["log"] = None
