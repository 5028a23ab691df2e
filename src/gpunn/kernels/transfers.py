"""Bound host<->device copies: a copy between one host buffer and one device array on one stream, fixed once and
issued by a call, as ``gpunn.kernels.launch.Launch`` is for kernels.

The per-step variants copy a batch to the GPU and read a loss back at every step. Through numba each such copy
checks contiguity and compatibility, wraps the host array in a buffer view and calls the driver through numba's
error-checking wrapper: tens of microseconds, more than many of our kernels run. A bound copy resolves both
pointers, the byte count and the stream handle once; each call is then one ``cuMemcpyHtoDAsync`` /
``cuMemcpyDtoHAsync`` through ctypes (gpunn.kernels.libcuda: about a microsecond). Host buffers should be pinned
(``cuda.pinned_array``): the copy is then truly asynchronous, so the host must not refill the buffer before the
copy is done (the engine alternates two buffers and waits for the step that read one before refilling it).

Under numba's CUDA simulator, or where libcuda cannot be loaded, the same calls go through numba's
``copy_to_device`` / ``copy_to_host`` and event methods (``BoundCopy.direct`` says which path a copy took).
"""

from __future__ import annotations

import numpy as np

from gpunn import device

from . import libcuda


def stream_handle(stream) -> int:
    """The driver handle of a numba stream as an int (0: the legacy default stream)."""
    if not stream:
        return 0
    return int(stream.handle or 0)  # numba's Stream holds a cuda.bindings CUstream


def _device_pointer(array) -> int:
    return int(array.device_ctypes_pointer.value or 0)


def _contiguous(array) -> bool:
    flags = getattr(array, "flags", None)
    return bool(flags["C_CONTIGUOUS"]) if flags is not None else array.is_c_contiguous()


class BoundCopy:
    """``device <- host`` (upload) or ``host <- device`` (download) of a whole buffer, on `stream`, bound once."""

    __slots__ = ("device_array", "host_array", "stream", "upload", "direct", "_call")

    def __init__(self, device_array, host_array: np.ndarray, stream=0, upload: bool = True):
        if tuple(device_array.shape) != tuple(host_array.shape) or np.dtype(device_array.dtype) != host_array.dtype:
            raise ValueError(f"bound copy: device {tuple(device_array.shape)} {device_array.dtype} and host "
                             f"{host_array.shape} {host_array.dtype} differ")
        if not (_contiguous(device_array) and host_array.flags["C_CONTIGUOUS"]):
            raise ValueError("bound copy: both buffers must be C-contiguous")
        self.device_array = device_array
        self.host_array = host_array
        self.stream = stream
        self.upload = upload
        self.direct = libcuda.library() is not None
        if not self.direct:
            self._call = self._through_numba
            return
        dev, host, nbytes = _device_pointer(device_array), int(host_array.ctypes.data), int(host_array.nbytes)
        if upload:
            self._call = libcuda.bound("cuMemcpyHtoDAsync_v2", dev, host, nbytes, stream_handle(stream))
        else:
            self._call = libcuda.bound("cuMemcpyDtoHAsync_v2", host, dev, nbytes, stream_handle(stream))
        self._call.buffers = (device_array, host_array)  # both buffers live as long as the bound copy

    def _through_numba(self) -> None:
        if self.upload:
            self.device_array.copy_to_device(self.host_array, stream=self.stream)
        else:
            self.device_array.copy_to_host(self.host_array, stream=self.stream)

    def __call__(self) -> None:
        self._call()


def synchronizer(stream, spin: bool = False):
    """A call that waits for everything queued on `stream`: ``cuStreamSynchronize``, or with `spin` a loop on
    ``cuStreamQuery`` (libcuda.spinner); numba's under the simulator, where copies and launches are synchronous
    anyway."""
    if libcuda.library() is None:
        from numba import cuda

        return stream.synchronize if stream else cuda.synchronize
    if not spin:
        return libcuda.bound("cuStreamSynchronize", stream_handle(stream))
    return libcuda.spinner("cuStreamQuery", stream_handle(stream))


def host_buffer(shape, dtype) -> np.ndarray:
    """A pinned (page-locked) host array on a GPU, a plain one under the simulator."""
    if device.simulator_enabled():
        return np.empty(shape, dtype)
    from numba import cuda

    return cuda.pinned_array(shape, dtype)


class BoundEvent:
    """A numba event's record on one stream, another stream's wait for it and the host's wait for it, each bound
    once to a driver call (numba's Event methods under the simulator); with `spin` the host's wait polls
    ``cuEventQuery`` (libcuda.spinner) instead of blocking in ``cuEventSynchronize``."""

    __slots__ = ("event", "record", "wait", "synchronize")

    def __init__(self, event, record_stream=0, wait_stream=0, spin: bool = False):
        self.event = event
        if libcuda.library() is None:
            self.record = lambda: event.record(record_stream)
            self.wait = lambda: event.wait(wait_stream)
            self.synchronize = event.synchronize
            return
        handle = int(event.handle)
        self.record = libcuda.bound("cuEventRecord", handle, stream_handle(record_stream))
        self.wait = libcuda.bound("cuStreamWaitEvent", stream_handle(wait_stream), handle, 0)
        self.synchronize = (libcuda.spinner("cuEventQuery", handle) if spin
                            else libcuda.bound("cuEventSynchronize", handle))
