"""A fix to numba's CUDA simulator that every simulated gpunn kernel relies on.

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

It also shortens the interpreter's thread switch interval to SWITCH_INTERVAL_S: the simulator's launch loop
(`kernel.BlockManager.run`) polls its block's threads without ever waiting, so at CPython's default 5 ms each
turn of the loop holds the interpreter for a whole interval while the simulated threads wait; every simulated
launch ran about twice as long as it needs to.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["patch", "static_shared_array"]

_ALLOCATION_LOCK = threading.Lock()  # guards every FakeCUDAShared._allocations check-and-store
_state = {"original": None}


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


SWITCH_INTERVAL_S = 0.0005  # under the simulator (CPython's default: 5 ms); docs/notes/issue-24-first-hour.md


def patch() -> None:
    """Install the locked allocation and the shorter switch interval (idempotent). Needs NUMBA_ENABLE_CUDASIM=1."""
    from numba.cuda.simulator import kernelapi

    if _state["original"] is None:
        _state["original"] = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = _shared_array
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


def unpatched():
    """numba's own FakeCUDAShared.array (for the test that shows the race)."""
    return _state["original"]
