"""The CUDA driver's per-step calls through ctypes: kernel launches, asynchronous copies, event records and waits,
stream and event synchronisation, and event readings.

A bound launch, copy or clock mark calls the driver with the same arguments at every step. Through cuda.bindings
each call converts every argument through Python wrappers and builds a result enum: 4 to 7 us per call from
Python on an H100 machine (issue 22), 16 launches, 3 copies and 3 marks a step for the MLP's per-step variants,
more than the step's kernels take. Here the arguments are converted to ctypes values once (``bound``) and each
call is one foreign function call (about 1 us). ``library()`` is None under numba's simulator or where libcuda
cannot be loaded; callers then keep their cuda.bindings or numba path.
"""

from __future__ import annotations

import ctypes
import functools

from gpunn import device

_VP, _U = ctypes.c_void_p, ctypes.c_uint
SIGNATURES = {  # the driver API's exported names (the _v2 entry points are what cuda.h maps the copies to)
    "cuLaunchKernel": (_VP, _U, _U, _U, _U, _U, _U, _U, _VP, _VP, _VP),
    "cuMemcpyHtoDAsync_v2": (ctypes.c_uint64, _VP, ctypes.c_size_t, _VP),
    "cuMemcpyDtoHAsync_v2": (_VP, ctypes.c_uint64, ctypes.c_size_t, _VP),
    "cuEventRecord": (_VP, _VP),
    "cuStreamWaitEvent": (_VP, _VP, _U),
    "cuEventSynchronize": (_VP,),
    "cuEventQuery": (_VP,),
    "cuStreamSynchronize": (_VP,),
    "cuStreamQuery": (_VP,),
    "cuEventElapsedTime": (ctypes.POINTER(ctypes.c_float), _VP, _VP),
    "cuEventRecordWithFlags": (_VP, _VP, _U),
    "cuGraphLaunch": (_VP, _VP),
}
CU_EVENT_RECORD_EXTERNAL = 1  # cuEventRecordWithFlags while a stream captures: the record is an event node


@functools.cache
def library():
    """libcuda with SIGNATURES declared, or None (the simulator, no driver, a symbol missing)."""
    if device.simulator_enabled():
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, argtypes in SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def bound(name: str, *args):
    """A zero-argument call of driver function `name` on `args`, converted to its ctypes types now (None: a NULL
    pointer); it raises RuntimeError naming the function on a non-zero CUresult."""
    function = getattr(library(), name)
    values = tuple(a if isinstance(a, t) else t(a) for t, a in zip(function.argtypes, args))

    def call() -> None:
        err = function(*values)
        if err:
            raise RuntimeError(f"{name} failed: CUDA error {err}")

    call.values = values  # (keeps the ctypes values alive with the call)
    return call


CUDA_ERROR_NOT_READY = 600  # cuStreamQuery / cuEventQuery: work still pending


def spinner(name: str, handle: int):
    """A call that waits by polling driver query `name` (cuStreamQuery, cuEventQuery) on `handle` until the work
    is done: the host thread stays busy but is back as soon as the GPU is (13-26 us a step sooner than the
    driver's blocking wait on the H100 machine, issue 22)."""
    query, not_ready = getattr(library(), name), CUDA_ERROR_NOT_READY
    handle = ctypes.c_void_p(handle or None)

    def wait() -> None:
        err = query(handle)
        while err == not_ready:
            err = query(handle)
        if err:
            raise RuntimeError(f"{name} failed: CUDA error {err}")

    return wait
_ELAPSED = ctypes.c_float()


def elapsed_ms(start: int, end: int) -> float:
    """Milliseconds between two recorded, completed events (their driver handles)."""
    err = library().cuEventElapsedTime(ctypes.byref(_ELAPSED), start, end)
    if err:
        raise RuntimeError(f"cuEventElapsedTime failed: CUDA error {err}")
    return _ELAPSED.value
