"""The CUDA device gpunn runs on: a description for logs and benchmark outputs, launch-configuration checks
that turn impossible block sizes into one clear error before launching, and a clear error when a GPU
variant is asked for on a machine without a GPU.

numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set before numba is imported) runs kernels on the CPU,
about 1e5 times slower: fine for tiny shapes in tests, meaningless for timing.
"""

from __future__ import annotations

import functools
import threading

from gpunn.errors import GpunnError

# CUDA's per-block thread limit on every architecture gpunn targets; the simulator reports no limits.
DEFAULT_MAX_THREADS_PER_BLOCK = 1024

# FP32 lanes per SM by compute capability (CUDA C Programming Guide, arithmetic instructions table); a newer
# architecture not listed takes its major version's entry, else the last one's
FP32_LANES = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128,
              (12, 0): 128}


def fp32_lanes(compute_capability: tuple[int, int]) -> int:
    """FP32 lanes per SM of an architecture."""
    if compute_capability in FP32_LANES:
        return FP32_LANES[compute_capability]
    same_major = [lanes for (major, _), lanes in FP32_LANES.items() if major == compute_capability[0]]
    return same_major[0] if same_major else list(FP32_LANES.values())[-1]


def fp32_peak_tflops(multiprocessors: int, compute_capability: tuple[int, int], clock_khz: int) -> float:
    """The FP32 peak without tensor cores in TFLOP/s: SMs x FP32 lanes per SM x 2 (a fused multiply-add) x the boost
    clock; 132 x 128 x 2 x 1.98 GHz = 66.9 TFLOP/s on an H100 SXM."""
    return multiprocessors * fp32_lanes(compute_capability) * 2 * clock_khz * 1e3 / 1e12


# Dense tensor-core FLOP per SM per clock by input format (float32 accumulation), from NVIDIA's architecture
# whitepapers: A100 312 TFLOP/s BF16 and 156 TF32 (108 SMs, 1.41 GHz); H100 SXM5 989.4 BF16 and 494.7 TF32 (132 SMs,
# quoted at 1.83 GHz). Architectures not listed: no tensor peak (None).
TENSOR_FLOPS = {(8, 0): {"tf32": 1024, "bf16": 2048}, (9, 0): {"tf32": 2048, "bf16": 4096}}
TENSOR_FORMATS = ("tf32", "bf16")
TENSOR_CORE_MIN_CC = (8, 0)  # mma.sync with TF32 and BF16 inputs: Ampere and newer


def tensor_peak_tflops(multiprocessors: int, compute_capability: tuple[int, int], clock_khz: int,
                       fmt: str) -> float | None:
    """The dense tensor-core peak in `fmt` ("tf32", "bf16") in TFLOP/s at `clock_khz`, None for an architecture
    TENSOR_FLOPS does not list: SMs x FLOP per SM per clock x clock. At the boost clock a device reports (an H100 or
    H200 SXM: 1.98 GHz) that is 1070 TFLOP/s BF16; the data sheets quote 989.4 at 1.83 GHz."""
    if fmt not in TENSOR_FORMATS:
        raise ValueError(f"tensor_peak_tflops: unknown format {fmt!r}; choose from {TENSOR_FORMATS}")
    per_clock = TENSOR_FLOPS.get(tuple(compute_capability), {}).get(fmt)
    return None if per_clock is None else multiprocessors * per_clock * clock_khz * 1e3 / 1e12


def simulator_enabled() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def require_gpu(what: str) -> None:
    """Raise a one-line GpunnError unless a CUDA GPU (or the simulator) is usable."""
    from numba import cuda

    if not cuda.is_available():
        raise GpunnError(
            f"{what} needs a CUDA GPU and none is usable here (no driver or no device); run it on a GPU "
            "machine, or for tiny shapes only, under numba's CUDA simulator: config key `gpu.simulator: true` "
            "in the pipeline, NUMBA_ENABLE_CUDASIM=1 by hand (about 1e5 times slower, timings meaningless)"
        )


def require_tensor_cores(what: str) -> None:
    """Raise a one-line GpunnError unless the GPU has TF32 and BF16 tensor cores (compute capability
    TENSOR_CORE_MIN_CC or newer; the simulator emulates them)."""
    if simulator_enabled():
        return
    from numba import cuda

    gpu = cuda.get_current_device()
    cc = tuple(gpu.compute_capability)
    if cc < TENSOR_CORE_MIN_CC:
        name = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name
        raise GpunnError(f"{what} multiplies in TF32 or BF16 on the tensor cores, which need a GPU of compute "
                         f"capability {TENSOR_CORE_MIN_CC[0]}.{TENSOR_CORE_MIN_CC[1]} or newer ({name} is "
                         f"{cc[0]}.{cc[1]}); choose a float32 variant such as gpu-graph")


def device_info() -> dict:
    """Name, compute capability, SM count, per-block limits, memory, boost clock, FP32 peak (gpunn.flops) and the
    TF32 and BF16 tensor-core peaks (None where unknown) of the current device."""
    from numba import cuda

    require_gpu("device_info")
    if simulator_enabled():
        return {"name": "numba CUDA simulator", "simulator": True, "compute_capability": "sim",
                "multiprocessors": 1, "max_threads_per_block": DEFAULT_MAX_THREADS_PER_BLOCK,
                "max_shared_memory_per_block": 48 * 1024, "memory_total_gib": None, "clock_khz": None,
                "fp32_peak_tflops": None, "tf32_peak_tflops": None, "bf16_peak_tflops": None}
    device = cuda.get_current_device()
    _, total = cuda.current_context().get_memory_info()
    major, minor = device.compute_capability
    return {
        "name": device.name.decode() if isinstance(device.name, bytes) else str(device.name),
        "simulator": False,
        "compute_capability": f"{major}.{minor}",
        "multiprocessors": int(device.MULTIPROCESSOR_COUNT),
        "max_threads_per_block": int(device.MAX_THREADS_PER_BLOCK),
        "max_shared_memory_per_block": int(device.MAX_SHARED_MEMORY_PER_BLOCK),
        "memory_total_gib": round(total / 2**30, 1),
        "clock_khz": int(device.CLOCK_RATE),
        "fp32_peak_tflops": fp32_peak_tflops(int(device.MULTIPROCESSOR_COUNT), (major, minor), int(device.CLOCK_RATE)),
        **{f"{fmt}_peak_tflops": tensor_peak_tflops(int(device.MULTIPROCESSOR_COUNT), (major, minor),
                                                    int(device.CLOCK_RATE), fmt) for fmt in TENSOR_FORMATS},
    }


def open_cuda() -> None:
    """Makes this process's CUDA context while a second thread sets up numba's CUDA target, so that the two overlap:
    the context is driver work that releases the GIL (about 0.6 s on an H200 machine), the set-up is the imports and
    registries numba's first kernel load or compile makes (about 0.5 s). Returns when both are done. Nothing under
    the simulator; without a GPU, the caller's next CUDA call reports it as before. An error in the set-up is left
    to numba's first kernel load, which repeats it and raises."""
    if simulator_enabled():
        return

    def set_up_target():
        try:
            from numba.cuda.descriptor import cuda_target

            cuda_target.target_context.refresh()
        except Exception:  # noqa: BLE001 (repeated, and reported, by the first kernel load)
            pass

    thread = threading.Thread(target=set_up_target, name="gpunn-cuda-target", daemon=True)
    thread.start()
    try:
        from numba import cuda

        if cuda.is_available():
            cuda.current_context()
    finally:
        thread.join()


class MemoryPeak:
    """The most device memory a run's own buffers held at once: `sample()` adds up the sizes of the device buffers
    this process's numba context holds (its live cuMemAlloc allocations) that were not there when the object was
    made, and keeps the largest sum; `peak_bytes` is that sum. So the figure is the run's parameters, gradients,
    activations, resident data and workspaces, like PyTorch's max_memory_allocated: not the CUDA context, kernel
    modules or graph executables, and other processes on the device (a parallel test run, a second job) do not
    count. gpunn's engines allocate their buffers once and reuse them, so readings after each epoch and evaluation
    see the peak. None without a real GPU (the simulator has no device memory) and under an external numba memory
    manager (it keeps no allocation table)."""

    def __init__(self):
        table = self._device_buffers()
        self._before = table  # holding the objects keeps their ids unique: a reused address is a new object
        self._peak = 0

    @staticmethod
    def _device_buffers() -> dict | None:
        """{address: numba memory object} of this process's live device allocations; None where not known."""
        from numba import cuda

        if simulator_enabled() or not cuda.is_available():
            return None
        # numba's default manager keys every live allocation by its address and drops it when its last reference
        # goes (the frees themselves are queued and run in batches later: the table, not cuMemGetInfo, is what
        # is live); host memory mapped for the device is in it too
        table = getattr(getattr(cuda.current_context(), "memory_manager", None), "allocations", None)
        if table is None:
            return None
        from numba.cuda.cudadrv.driver import MappedMemory

        return {key: mem for key, mem in table.items() if not isinstance(mem, MappedMemory)}

    def sample(self) -> None:
        table = self._device_buffers()
        if table is None or self._before is None:
            return
        new = sum(mem.size for key, mem in table.items() if self._before.get(key) is not mem)
        self._peak = max(self._peak, int(new))

    @property
    def peak_bytes(self) -> int | None:
        return None if self._before is None else self._peak


def describe_device() -> str:
    info = device_info()
    if info["simulator"]:
        return "numba CUDA simulator (CPU; timings meaningless)"
    return (f"{info['name']} (compute capability {info['compute_capability']}, {info['multiprocessors']} SMs, "
            f"{info['memory_total_gib']} GiB)")


@functools.lru_cache(maxsize=1)
def _device_thread_limit() -> int:
    # asked once per process: launchers call check_block on every launch
    return DEFAULT_MAX_THREADS_PER_BLOCK if simulator_enabled() else device_info()["max_threads_per_block"]


def check_block(op: str, threads: int, kernel=None) -> int:
    """Validate a block size (total threads per block) before launching `kernel` for `op`.

    Checks the device's per-block limit and, on a real GPU, the compiled kernel's own limit (registers and
    shared memory can make it lower than the device's); returns `threads` or raises one clear ValueError."""
    if int(threads) != threads or threads <= 0:
        raise ValueError(f"{op}: block size must be a positive integer, got {threads}")
    limit = _device_thread_limit()
    if threads > limit:
        raise ValueError(f"{op}: block size {threads} exceeds this device's limit of {limit} threads per block")
    if kernel is not None and not simulator_enabled() and kernel.overloads:
        kernel_limit = min(int(compiled.max_threads_per_block) for compiled in kernel.overloads.values())
        if threads > kernel_limit:
            raise ValueError(
                f"{op}: block size {threads} exceeds what this kernel can launch with ({kernel_limit} threads: "
                "limited by its registers / shared memory); choose a smaller block"
            )
    return int(threads)
