"""Bound kernel launches, and the argument checks every kernel module shares (check_array, check_block,
grid_for, flat).

Bound launches: a kernel with its grid, block and arguments fixed once, launched by a call.

Training steps launch the same kernels on the same device buffers thousands of times. Checking shapes,
computing grids and configuring the launch once, instead of at every step, is the first saving; the list of
bound launches of a step is also what a CUDA graph captures (``launch.on(graph_builder)``).

The second saving is numba's own dispatch. Every ``kernel[grid, block](*args)`` call types each argument,
looks up the compiled overload, marshals every array into its ABI fields (pointer, shape, strides ...) and
builds a launch configuration: ~60 us per launch measured on an H200 for our 4-7 argument kernels, more than
the MLP's kernels take to run. Since a bound launch's arguments never change, after its first (compiling)
launch it prepares all of that once and then launches through the driver directly. That uses two internals of
numba-cuda's compiled kernel (``_prepare_args``, ``_codelibrary``), so it is enabled only for the pinned
numba-cuda version (``DIRECT_LAUNCH_VERSION``) and otherwise falls back to the ordinary call; the GPU tests
compare both paths.

Even cuda.core's ``launch`` packs every argument again at each call (type checks, a parameter buffer): our
GEMM launches carry 37-40 scalar fields, and the fused MLP step is bound by the host (8 launches in about the
time the GPU takes to run them). So the direct path packs the kernel's parameter block once, into ctypes
values held by the launch, and each call is one ``cuLaunchKernel`` with that block's address, called through
ctypes on arguments converted once (gpunn.kernels.libcuda; through cuda.bindings where libcuda cannot be
loaded). Values of a type we do not know how to pack keep the cuda.core path (``Launch.packed`` says which path
a launch took).
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from gpunn import device

from . import libcuda, transfers

MAX_GRID = 65535  # cap for grid-stride kernels: more blocks than this only adds scheduling overhead


# --------------------------------------------------------------------------------------------- checks
def check_block(op: str, block, power_of_two: bool = False) -> int:
    """The device's limits (gpunn.device.check_block), plus a power of two for the tree reductions."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise ValueError(f"{op}: block must be an int, got {block!r}")
    block = device.check_block(op, int(block))
    if power_of_two and block & (block - 1):
        raise ValueError(f"{op}: block must be a power of two for the tree reduction, got {block}")
    return block


def check_array(op: str, name: str, a, ndim: int | None = None, dtype=np.float32):
    shape = getattr(a, "shape", None)
    if shape is None or not hasattr(a, "dtype"):
        raise ValueError(f"{op}: {name} must be a device array, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(
            f"{op}: {name} must be {np.dtype(dtype)}, got dtype {a.dtype} (shape {shape})"
        )
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(shape)}")
    if any(int(d) == 0 for d in shape):
        raise ValueError(
            f"{op}: {name} has a zero-sized dimension, shape {tuple(shape)}"
        )
    return a


def check_device_array(op: str, name: str, a, ndim: int | None = None, dtype=np.float32):
    """check_array, and a host NumPy array refused: numba would copy it to the device and back at every launch
    of a bound kernel."""
    if isinstance(a, np.ndarray):
        raise ValueError(  # noqa: TRY004
            f"{op}: {name} is a host NumPy array (shape {a.shape}); pass a device array (cuda.to_device)")
    return check_array(op, name, a, ndim, dtype)


def grid_for(n: int, block: int) -> int:
    """Blocks for a grid-stride loop over n elements."""
    return max(1, min(math.ceil(n / block), MAX_GRID))


def flat(a):
    """1-D view of a contiguous device array (no copy)."""
    return a.reshape(a.size)


def quiet_low_occupancy_warnings() -> None:
    """Small grids are the point of several of our launches (tiny batches, the 10-wide output layer, the
    simulator tests): numba's NumbaPerformanceWarning at each such launch floods benchmark and pipeline logs
    and says nothing we do not know. numba reads this setting at every launch."""
    from numba import config

    config.CUDA_LOW_OCCUPANCY_WARNINGS = False


quiet_low_occupancy_warnings()


def quiet_simulated_wraparound() -> None:
    """The implicit-im2col index math (gemm, conv) computes in uint32 modulo 2^32 on purpose: a padded window's
    negative offset wraps to a large number that the bounds check then rejects. On a GPU that wraps silently;
    numba's simulator runs it on numpy scalars, which warn "overflow encountered in scalar add" at each wrap. Under
    the simulator those warnings from gpunn's kernel modules are ignored (a float overflow in a kernel shows as a
    non-finite loss, which gpunn.epochs.DivergenceRule stops)."""
    import warnings

    if device.simulator_enabled():
        warnings.filterwarnings("ignore", message=r"overflow encountered in scalar", category=RuntimeWarning,
                                module=r"gpunn\.kernels\.")


quiet_simulated_wraparound()


def _fix_simulator() -> None:
    """Under numba's CUDA simulator, make its shared-memory allocation thread-safe before any of our kernels
    runs (see gpunn.kernels.simulator: without it a block's threads can end up with private "shared"
    arrays, rarely and at random)."""
    from numba import config

    if config.ENABLE_CUDASIM:
        from . import simulator

        simulator.patch()


_fix_simulator()

DIRECT_LAUNCH_VERSION = "0.30.4"  # the numba-cuda whose kernel internals the direct launch relies on


class Launch:
    """``kernel[grid, block, stream, shared](*args)``, configured once; ``launch()`` runs it again. ``shared``: bytes
    of dynamic shared memory a block (over 48 KB the kernel's limit is raised before its first launch). ``keep``:
    arrays the arguments point into without holding them (a TMA tensor map's operand), kept alive with the launch."""

    __slots__ = ("kernel", "grid", "block", "args", "stream", "name", "shared", "keep", "_configured", "_direct")

    def __init__(self, kernel, grid, block, args, stream=0, name: str = "", shared: int = 0, keep=()):
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.args = tuple(args)
        self.stream = stream
        self.name = name or getattr(kernel, "__name__", "kernel")
        self.shared = int(shared)
        self.keep = tuple(keep)
        # The simulator's kernel object keeps a single mutable configuration, so it is configured anew at
        # every call there; on a GPU the configured launch object is reusable.
        self._configured = None if device.simulator_enabled() else kernel[grid, block, stream, self.shared]
        self._direct = None  # None: not prepared yet; False: not available (ordinary calls)

    def __call__(self) -> None:
        if self._direct:
            self._direct()
        elif self._configured is None:
            self.kernel[self.grid, self.block, self.stream, self.shared](*self.args)
        else:
            if self._direct is None and self.shared > STATIC_SHARED_LIMIT:
                allow_dynamic_shared(self.kernel, self.args, self.shared)
            self._configured(*self.args)  # compiles on the first call
            if self._direct is None:
                self._direct = _direct_launcher(self.kernel, self._configured, self.args) or False

    @property
    def call(self):
        """What runs this launch with the least host work: its direct driver call once it has one, else itself."""
        return self._direct or self

    @property
    def direct(self) -> bool:
        """Whether calls now skip numba's dispatch (after the first call, on a GPU)."""
        return bool(self._direct)

    @property
    def packed(self) -> bool:
        """Whether calls are one cuLaunchKernel on a parameter block packed once (else cuda.core packs it)."""
        return bool(self._direct) and getattr(self._direct, "packed", False)

    def on(self, stream) -> None:
        """Launch on another stream (or a graph builder, to capture it)."""
        if self.shared > STATIC_SHARED_LIMIT:
            allow_dynamic_shared(self.kernel, self.args, self.shared)
        self.kernel[self.grid, self.block, stream, self.shared](*self.args)

    def __repr__(self) -> str:
        return f"Launch({self.name}, grid={self.grid}, block={self.block})"


STATIC_SHARED_LIMIT = 48 * 1024  # shared memory a block gets without raising the kernel's limit


def allow_dynamic_shared(kernel, args, nbytes: int) -> None:
    """Raise the dynamic shared memory limit of `kernel` compiled for `args` to `nbytes`
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, needed over 48 KB), once per kernel and size. Compiles the
    kernel if it is not yet. Nothing to do under the simulator."""
    if device.simulator_enabled():
        return
    from cuda.bindings import driver

    compiled = kernel.compile(tuple(kernel.typeof_pyval(arg) for arg in args))
    function = compiled._codelibrary.get_cufunc()
    key = (int(function.handle), nbytes)
    if key in _RAISED:
        return
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = function.handle
    if type(handle).__name__ == "CUkernel":  # a library kernel: its function in the current context
        err, handle = driver.cuKernelGetFunction(handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuKernelGetFunction failed: {err}")
    (err,) = driver.cuFuncSetAttribute(handle, attribute, int(nbytes))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes}) failed: {err}")
    _RAISED.add(key)


_RAISED: set = set()  # (kernel handle, bytes) raised so far


def _direct_launcher(kernel, configured, args):
    """``cuda.core.launch`` with this launch's prepared arguments, or None where numba must do it itself."""
    try:
        import numba_cuda
        from cuda.core import LaunchConfig, launch

        if numba_cuda.__version__ != DIRECT_LAUNCH_VERSION:
            return None
        compiled = kernel.overloads[tuple(kernel.typeof_pyval(arg) for arg in args)]
        if compiled.debug or compiled.cooperative:
            return None
        prepared, writeback = [], []
        for arg_type, arg in zip(compiled.argument_types, args):
            compiled._prepare_args(arg_type, arg, configured.stream, writeback, prepared)
        if writeback:  # a host array: numba copies it back after every launch
            return None
        config = LaunchConfig(grid=configured.griddim, block=configured.blockdim, shmem_size=configured.sharedmem)
        function = compiled._codelibrary.get_cufunc().kernel
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return (_driver_launcher(configured.stream, config, function, prepared, configured.sharedmem)
            or functools.partial(launch, configured.stream, config, function, *prepared))


def _driver_launcher(stream, config, kernel, prepared, shared=0):
    """A call doing ``cuLaunchKernel`` with the parameter block packed here, once; None where a value's
    type is not one we pack (cuda.core's launch then packs it at every call)."""
    import ctypes

    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    values = []
    for value in prepared:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):  # numba's pointers, sizes, shapes, strides: 8-byte fields
            values.append(ctypes.c_int64(value) if value < 2**63 else ctypes.c_uint64(value))
        elif isinstance(value, ctypes._SimpleCData):  # sized scalars (c_uint32, c_float ...) as they are
            values.append(type(value)(value.value))
        else:
            return None
    pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    try:
        handle = kernel.handle
        if type(handle).__name__ == "CUkernel":  # a library kernel: its function in the current context
            err, handle = driver.cuKernelGetFunction(handle)
            if err != driver.CUresult.CUDA_SUCCESS:
                return None
        stream_handle = stream.handle
        function_handle = int(handle)
        grid = tuple(config.grid) + (1,) * (3 - len(tuple(config.grid)))
        block = tuple(config.block) + (1,) * (3 - len(tuple(config.block)))
    except (AttributeError, TypeError):
        return None
    address = ctypes.addressof(pointers)
    gx, gy, gz = (int(v) for v in grid)
    bx, by, bz = (int(v) for v in block)
    if libcuda.library() is not None:  # one ctypes call on arguments converted once (gpunn.kernels.libcuda)
        run = libcuda.bound("cuLaunchKernel", function_handle, gx, gy, gz, bx, by, bz, shared,
                            transfers.stream_handle(stream), address, None)
        run.parameters = (values, pointers)  # the packed parameter block lives as long as the launch
        run.packed = True
        return run
    cu_launch = driver.cuLaunchKernel
    success = driver.CUresult.CUDA_SUCCESS

    def run(_keep=(values, pointers)):  # the ctypes values live as long as the launch
        (err,) = cu_launch(handle, gx, gy, gz, bx, by, bz, shared, stream_handle, address, 0)
        if err != success:
            raise RuntimeError(f"cuLaunchKernel failed: {err}")

    run.packed = True
    return run


class LaunchGroup:
    """Several bound launches run in order as one (e.g. zeroing a buffer, then accumulating into it)."""

    __slots__ = ("launches",)

    def __init__(self, launches):
        self.launches = tuple(launches)

    @property
    def block(self):
        """The block of the group's main (first) launch, as reported by benchmarks."""
        return self.launches[0].block

    def __call__(self) -> None:
        for launch in self.launches:
            launch()

    def on(self, stream) -> None:
        for launch in self.launches:
            launch.on(stream)

    def __repr__(self) -> str:
        return f"LaunchGroup({', '.join(map(repr, self.launches))})"


def bind(kernel, grid, block, args, stream=0, launch: bool = True, name: str = "", shared: int = 0,
         keep=()) -> Launch:
    """A bound launch of `kernel` (`shared`: bytes of dynamic shared memory a block; `keep`: as Launch's); launched
    once now unless `launch` is False."""
    bound = Launch(kernel, grid, block, args, stream, name, shared, keep)
    if launch:
        bound()
    return bound


class Clock:
    """Numbered time marks, read after the caller has waited for the work: CUDA events recorded on a stream
    (marking does not make the host wait), numba's or, for the benchmarks' PyTorch reference timings, torch's
    (`torch` given: recorded on torch's current stream); under numba's simulator, whose events carry no time
    and whose launches run synchronously, the host clock. The one clock of the training engine and the
    benchmarks."""

    def __init__(self, stream=0, count: int = 2, torch=None):
        self.stream = stream
        self.torch = torch
        self.host_clock = torch is None and device.simulator_enabled()
        self.events: list = []
        self.times: list = []
        # numba's events recorded and read through ctypes (gpunn.kernels.libcuda): a mark is then one driver call,
        # about a microsecond against several through numba's wrappers (three marks per training step)
        self._direct = torch is None and not self.host_clock and libcuda.library() is not None
        self._handles: list = []
        self._records: list = []
        self.resize(count)

    def resize(self, count: int) -> None:
        """At least `count` marks (events are made once and reused)."""
        while len(self.times) < count:
            self.times.append(0.0)
            if not self.host_clock:
                self.events.append(self._new_event())
                if self._direct:
                    self._handles.append(int(self.events[-1].handle))
                    self._records.append(libcuda.bound("cuEventRecord", self._handles[-1],
                                                       transfers.stream_handle(self.stream)))

    def _new_event(self):
        if self.torch is not None:
            return self.torch.cuda.Event(enable_timing=True)
        from numba import cuda

        return cuda.event()

    def __len__(self) -> int:
        return len(self.times)

    def mark(self, i: int) -> None:
        if self._direct:
            self._records[i]()
        elif self.host_clock:
            self.times[i] = time.perf_counter()
        elif self.torch is not None:
            self.events[i].record()
        else:
            self.events[i].record(self.stream)

    def capture_marks(self, stream_handle: int):
        """A mark(i) that records event i as an event node of the graph `stream_handle` is capturing (so each
        replay of the graph marks the clock), or None where the marks are not direct driver calls."""
        if not self._direct:
            return None
        calls = [libcuda.bound("cuEventRecordWithFlags", handle, stream_handle, libcuda.CU_EVENT_RECORD_EXTERNAL)
                 for handle in self._handles]
        return lambda i: calls[i]()

    def synchronize(self) -> None:
        """Wait for everything the marks were recorded behind."""
        if self.torch is not None:
            self.torch.cuda.synchronize()
        elif self.stream:
            self.stream.synchronize()
        elif not self.host_clock:
            from numba import cuda

            cuda.synchronize()

    def seconds(self, i: int, j: int) -> float:
        """Seconds from mark i to mark j (both done: the caller has waited)."""
        if self.host_clock:
            return self.times[j] - self.times[i]
        if self._direct:
            return libcuda.elapsed_ms(self._handles[i], self._handles[j]) / 1e3
        return self.events[i].elapsed_time(self.events[j]) / 1e3

    def hold(self, sleeps: int) -> None:
        """Occupy the clock's stream with `sleeps` GPU sleeps of HOLD_SLEEP_NS each (one thread), so that the
        host can queue what follows before the GPU reaches it: marks and launches queued behind a hold run
        back to back, and an event pair then times the GPU's work alone, not the host's cost of launching it
        (20-40 us from Python, longer than many of our kernels). How long a hold lasted is measured by marks
        around it (a sleep's length is only approximate). No-op on the host clock, where launches run
        synchronously."""
        if self.host_clock:
            return
        from numba import cuda

        stream = self.stream
        if self.torch is not None:  # the torch events are recorded on torch's current stream: hold that one
            stream = cuda.external_stream(self.torch.cuda.current_stream().cuda_stream)
        _hold_kernel()[1, 1, stream](np.uint32(max(1, sleeps)))


HOLD_SLEEP_NS = 10_000  # one nanosleep of the hold kernel (the instruction sleeps up to about 1 ms)


@functools.cache
def _hold_kernel():
    from numba import cuda

    from .jit import jit

    sleep_ns = np.uint32(HOLD_SLEEP_NS)

    @jit
    def hold(sleeps):
        for _ in range(sleeps):
            cuda.nanosleep(sleep_ns)

    return hold
