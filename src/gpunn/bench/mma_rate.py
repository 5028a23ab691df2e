"""The MMA route's cost: tensor-core rate of ``mma.sync`` issued through gpunn's numba intrinsics (gpunn.kernels.mma)
against the same loop in CUDA C (NVRTC through CuPy, where installed), and cuBLAS (torch.matmul) at 4096^3 in FP32,
TF32 and BF16 for scale.

Each kernel: every warp of a full grid runs ``iters`` rounds of CHAINS independent MMAs on register fragments (no
memory traffic in the loop), then stores its accumulators so nothing is dead code. Times: CUDA events around one
launch after a warm-up launch, median of ``repeats``; TFLOP/s = 2 M N K x MMAs / time.
``python -m gpunn.bench mma [--repeats N] [--out CSV]`` (default results/bench/mma.csv); needs a GPU of compute
capability 8.0 or newer, and refuses the simulator (its timings would be meaningless)."""

from __future__ import annotations

import statistics
import sys

import numpy as np

CHAINS = 8  # independent accumulators per warp: enough MMAs in flight to hide the tensor core's latency
THREADS = 128  # 4 warps a block
BLOCKS_PER_SM = 8
ITERS = 4096
REPEATS = 9
ACC = 32  # 4 x CHAINS accumulator registers (a local array's size must be a plain constant)
assert ACC == 4 * CHAINS


def numba_kernels():
    """{format: kernel(out, iters)} through gpunn.kernels.mma."""
    from numba import cuda, float32

    from gpunn.kernels.mma import mma_bf16, mma_tf32, pack_bf16, to_tf32

    @cuda.jit(device=True)
    def bf16_pair(v):
        return pack_bf16(v, v)

    def loop_kernel(mma, operand):
        @cuda.jit
        def loop(out, iters):
            t = cuda.grid(1)
            x = operand(float32(t % 7) * float32(1e-3))
            acc = cuda.local.array(ACC, float32)
            for j in range(ACC):
                acc[j] = float32(0.0)
            for _ in range(iters):
                for j in range(CHAINS):
                    d = mma(x, x, x, x, x, x, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                    acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3] = d
            total = float32(0.0)
            for j in range(ACC):
                total += acc[j]
            out[t] = total

        return loop

    return {"tf32": loop_kernel(mma_tf32, to_tf32), "bf16": loop_kernel(mma_bf16, bf16_pair)}


CUDA_C = r"""
extern "C" __global__ void loop_%(fmt)s(float* out, int iters) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (float)(t %% 7) * 1e-3f;
    unsigned x;
    %(convert)s
    float acc[4 * %(chains)d];
    #pragma unroll
    for (int j = 0; j < 4 * %(chains)d; ++j) acc[j] = 0.0f;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int j = 0; j < %(chains)d; ++j) {
            asm volatile("%(ptx)s {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, {%%8, %%9}, {%%0, %%1, %%2, %%3};"
                : "+f"(acc[4 * j]), "+f"(acc[4 * j + 1]), "+f"(acc[4 * j + 2]), "+f"(acc[4 * j + 3])
                : "r"(x), "r"(x), "r"(x), "r"(x), "r"(x), "r"(x));
        }
    }
    float total = 0.0f;
    #pragma unroll
    for (int j = 0; j < 4 * %(chains)d; ++j) total += acc[j];
    out[t] = total;
}
"""
PTX = {"tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
       "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}
CONVERT = {"tf32": 'asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(x) : "f"(v));',
           "bf16": 'asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(x) : "f"(v), "f"(v));'}


def _median_ms(launch, repeats, event, sync):
    launch()
    sync()
    times = []
    for _ in range(repeats):
        start, end = event(), event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(repeats: int = 9, iters: int = ITERS, log=print) -> list[dict]:
    from numba import cuda

    from gpunn.kernels.mma import MMA_SHAPES

    dev = cuda.get_current_device()
    sms = dev.MULTIPROCESSOR_COUNT
    blocks = sms * BLOCKS_PER_SM
    n_threads = blocks * THREADS
    mmas = blocks * (THREADS // 32) * iters * CHAINS
    rows = []
    out = cuda.device_array(n_threads, np.float32)

    def numba_event():
        return cuda.event(timing=True)

    for fmt, kernel in numba_kernels().items():
        m, n, k = MMA_SHAPES[fmt]
        ms = _median_ms(lambda kernel=kernel: kernel[blocks, THREADS](out, iters), repeats,
                        numba_event, cuda.synchronize)
        ptx = kernel.inspect_asm(kernel.signatures[0])
        target = next((line.split()[1] for line in ptx.splitlines() if line.startswith(".target")), "?")
        rows.append(dict(route="numba intrinsic (inline PTX)", format=fmt, ms=ms,
                         tflops=2 * m * n * k * mmas / ms / 1e9, target=target,
                         mma_in_ptx=ptx.count("mma.sync"), local_memory=("ld.local" in ptx or "st.local" in ptx)))
        log(f"numba {fmt}: {ms:.3f} ms, {rows[-1]['tflops']:.1f} TFLOP/s, PTX target {target}")
    rows += _cuda_c_rows(blocks, n_threads, mmas, iters, repeats, log)
    rows += _cublas_rows(repeats, log)
    return rows


def _cuda_c_rows(blocks, n_threads, mmas, iters, repeats, log) -> list[dict]:
    try:
        import cupy
    except ImportError:
        log("CUDA C baseline skipped: CuPy is not installed")
        return []
    from gpunn.kernels.mma import MMA_SHAPES

    rows = []
    out = cupy.empty(n_threads, dtype=cupy.float32)
    cc = "".join(str(v) for v in cupy.cuda.Device().compute_capability)
    for fmt in ("tf32", "bf16"):
        src = CUDA_C % dict(fmt=fmt, chains=CHAINS, ptx=PTX[fmt], convert=CONVERT[fmt])
        kernel = cupy.RawKernel(src, f"loop_{fmt}", options=(f"--gpu-architecture=sm_{cc}",))
        m, n, k = MMA_SHAPES[fmt]
        ms = _median_ms(lambda kernel=kernel: kernel((blocks,), (THREADS,), (out, np.int32(iters))), repeats,
                        _CupyEvent, cupy.cuda.Device().synchronize)
        rows.append(dict(route="CUDA C (NVRTC, asm volatile)", format=fmt, ms=ms,
                         tflops=2 * m * n * k * mmas / ms / 1e9, target=f"sm_{cc}"))
        log(f"CUDA C {fmt}: {ms:.3f} ms, {rows[-1]['tflops']:.1f} TFLOP/s")
    return rows


class _CupyEvent:
    def __init__(self):
        import cupy

        self._event = cupy.cuda.Event()
        self._cupy = cupy

    def record(self):
        self._event.record()

    def synchronize(self):
        self._event.synchronize()

    def elapsed_time(self, end):
        return self._cupy.cuda.get_elapsed_time(self._event, end._event)


def _cublas_rows(repeats, log) -> list[dict]:
    try:
        import torch
    except ImportError:
        log("cuBLAS rows skipped: torch is not installed")
        return []
    size = 4096
    rows = []
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(size, size, device="cuda").to(dtype)
        b = torch.randn(size, size, device="cuda").to(dtype)
        c = torch.empty(size, size, device="cuda", dtype=dtype)

        def launch(a=a, b=b, c=c):
            torch.matmul(a, b, out=c)

        ms = _median_ms(launch, repeats, lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)
        rows.append(dict(route=f"cuBLAS torch.matmul 4096^3 ({name})", format=name, ms=ms,
                         tflops=2 * size ** 3 / ms / 1e9))
        log(f"cuBLAS {name}: {ms:.3f} ms, {rows[-1]['tflops']:.1f} TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def rate_frame(repeats: int = REPEATS, iters: int = ITERS, log=None):
    """The rows of ``measure`` as a frame, printed; GpunnError (one line) under the simulator or on a GPU older
    than compute capability 8.0."""
    import pandas as pd
    from numba import cuda

    from gpunn.device import simulator_enabled
    from gpunn.errors import GpunnError

    if simulator_enabled():
        raise GpunnError("bench mma times the tensor cores: it needs a real GPU, not numba's CUDA simulator")
    cc = tuple(cuda.get_current_device().compute_capability)
    if cc < (8, 0):
        raise GpunnError(f"bench mma: mma.sync with TF32 and BF16 needs compute capability 8.0 or newer, this GPU "
                         f"has {cc[0]}.{cc[1]}")
    frame = pd.DataFrame(measure(repeats, iters, log=log or (lambda line: print(line, file=sys.stderr))))
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)
    return frame
