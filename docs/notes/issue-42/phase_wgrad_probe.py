"""Issue 42 probe (device): the weight gradient of the autoencoder's last conv, Upsample(2) then 256 -> 3 (3x3,
padding 1), x (64, 256, 16, 16) -> dy (64, 3, 32, 32): the phase version (kernels/conv/phase_up.py) in a few
block / channel-group / split configurations beside the staged and implicit-GEMM versions on the upsampled input.
Each launch group checked against the float64 reference (max|dw - ref| / max|ref|), then timed with CUDA events:
3 warm-up calls, the median of 50 samples of REPEAT back-to-back calls (per call), the block launch alone too; the
phase kernels' registers and local memory.

    PYTHONPATH=src python docs/notes/issue-42/phase_wgrad_probe.py"""
import functools
import statistics

import numpy as np
from numba import cuda

from gpunn.kernels.conv import phase_up as PH
from gpunn.kernels.conv import upsampled as U

N, CIN, COUT, H, W = 64, 256, 3, 16, 16
SAMPLES, REPEAT, WARMUP = 50, 10, 3
PHASE = [(256, 16, None), (256, 16, 8), (256, 16, 32), (256, 8, None), (128, 8, None), (64, 4, None)]


def _time(run) -> float:
    """ms per call: median over SAMPLES of REPEAT calls between two events."""
    for _ in range(WARMUP):
        run()
    start, end = cuda.event(), cuda.event()
    times = []
    for _ in range(SAMPLES):
        start.record()
        for _ in range(REPEAT):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / REPEAT)
    return statistics.median(times)


def main():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((N, CIN, H, W)).astype(np.float32)
    dy = rng.standard_normal((N, COUT, 2 * H, 2 * W)).astype(np.float32)
    ref = U.conv_backward_weight_up_ref(x, dy, 3, 1)
    dx, ddy = cuda.to_device(x), cuda.to_device(dy)
    launchers = {"staged_up": U.conv_backward_weight_staged_up,
                 "implicit_gemm_up": U.conv_backward_weight_implicit_gemm_up}
    for block, group, splits in PHASE:
        launchers[f"phase b{block} g{group} s{splits}"] = functools.partial(
            PH.conv_backward_weight_phase_up, block=block, group=group, splits=splits)
    for name, launcher in launchers.items():
        dw = cuda.to_device(np.full((COUT, CIN, 3, 3), np.nan, np.float32))
        run = launcher(dx, ddy, dw, 1)
        cuda.synchronize()
        got = dw.copy_to_host()
        err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else float("nan")
        dw.copy_to_device(np.full(got.shape, np.nan, np.float32))
        run()
        same = dw.copy_to_host().tobytes() == got.tobytes()
        ms = _time(run)
        parts = getattr(run, "launches", (run,))
        first_ms = _time(parts[0]) if len(parts) > 1 else ms
        print(f"{name:28s} {ms:.4f} ms (first launch {first_ms:.4f} ms, {len(parts)} launches)  rel err {err:.2e}  "
              f"rerun bit-identical {same}  [{parts[0].name if hasattr(parts[0], 'name') else ''}]", flush=True)
    for block, group in dict.fromkeys((block, group) for block, group, _ in PHASE):
        kernel = PH._wgrad_phase(COUT, H, W, block, group)
        regs, local, smem = (_one(f()) for f in (kernel.get_regs_per_thread, kernel.get_local_mem_per_thread,
                                                 kernel.get_shared_mem_per_block))
        print(f"phase kernel b{block} g{group}: regs {regs}, local {local} B, shared {smem} B")


def _one(value):
    """The value of a dispatcher's per-signature dict (one signature compiled)."""
    return next(iter(value.values())) if isinstance(value, dict) else value


if __name__ == "__main__":
    main()
