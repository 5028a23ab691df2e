"""Issue 42 probe (device, Hopper): ws_tf32 / ws_bf16 (warp-specialized wgmma: a producer warpgroup's cp.async,
two consumer warpgroups, mbarriers; several rings, tiles and register splits) and tma_tf32 / tma_bf16 (the same with
TMA as the producer: one thread's bulk tensor copies) beside direct_tf32 / direct_bf16 and
cuBLAS (torch.matmul(A, B.t()) with B stored (N, K): TF32 on / bf16 tensors) at 4096^3, and at 257 x 129 x 302 as
a check. CUDA events after 2 warm-up calls, median of 20. Every result is checked against the float64 product of
its inputs as that kernel's MMA reads them (TF32 truncated for direct / ws; cuBLAS TF32 rounded; BF16 the BF16
values), max|out - ref| / max|ref| under TOL, and every kernel's registers, local memory (spills) and shared memory
are reported. CSV to OUT/ws_probe.csv; exit status 1, naming them, if any result is wrong, missing or spills.

    python docs/notes/issue-42/ws_probe.py OUT [ws:tf32:4:256:r,...] [case,...]

(the second argument: the kernels to time, ``ws:<fmt>:<stages>:<bn>:<r|n>`` (r: setmaxnreg 40 / 232, n: none), the
same as ``tma:...`` (``tma:...:p``: persistent, one block an SM), or ``direct:<fmt>:<stages>``; default: every
WS_RUNS, TMA_RUNS and DIRECT_RUNS entry; a tma run on a case whose rows are not a multiple of 16 bytes is
skipped). Under NUMBA_ENABLE_CUDASIM=1 a dry run of the numba side only (a tiny check case, one repeat, no torch,
no cuBLAS)."""
import csv
import os
import sys

import numpy as np
from numba import cuda

from gpunn import device
from gpunn.bench.mma_rate import _median_ms
from gpunn.kernels import gemm as G
from gpunn.kernels.gemm import direct_ws

DRY = device.simulator_enabled()
OUT = sys.argv[1]
WS_RUNS = ["ws:tf32:4:256:r", "ws:tf32:3:256:r", "ws:tf32:4:256:n", "ws:tf32:6:128:r", "ws:tf32:4:128:r",
           "ws:bf16:4:256:r", "ws:bf16:3:256:r", "ws:bf16:4:256:n", "ws:bf16:6:128:r", "ws:bf16:4:128:r"]
TMA_RUNS = ["tma:tf32:4:256:r", "tma:tf32:3:256:r", "tma:tf32:4:256:n", "tma:tf32:6:128:r", "tma:tf32:4:128:r",
            "tma:bf16:4:256:r", "tma:bf16:3:256:r", "tma:bf16:4:256:n", "tma:bf16:6:128:r", "tma:bf16:4:128:r",
            "tma:tf32:4:256:r:p", "tma:bf16:4:256:r:p"]
DIRECT_RUNS = ["direct:tf32:7", "direct:bf16:3"]  # stop 56's best of each
RUNS = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else WS_RUNS + TMA_RUNS + DIRECT_RUNS
CASES = {"square_4096": (4096, 4096, 4096), "odd_check": (257, 129, 302),  # (M, N, K); C = A (M, K) @ B (N, K)^T
         "odd_check_tma": (257, 129, 296)}  # K a multiple of 8: the tma runs' check
if len(sys.argv) > 3:
    CASES = {k: v for k, v in CASES.items() if k in sys.argv[3].split(",")}
if DRY:
    CASES = {"dry_check": (67, 260, 72)}  # 2 blocks of the 256 tile, 3 TF32 K steps, tails everywhere
    RUNS = ["ws:tf32:3:256:r", "ws:bf16:2:128:n", "tma:tf32:3:256:r:p", "tma:bf16:2:128:n", "direct:tf32:3"]
REPEATS = 1 if DRY else 20
TOL = 1e-4  # GPU float32 accumulation is not IEEE round-to-nearest; observed wgmma errors at K = 4096: ~1e-5
FAILURES = []

if not DRY:
    cc = tuple(cuda.get_current_device().compute_capability)
    if cc != (9, 0):
        sys.exit(f"ws_probe: needs a Hopper GPU (compute capability 9.0: wgmma, mbarrier, setmaxnreg); this one is "
                 f"{cc[0]}.{cc[1]}")
    import torch

    if not torch.cuda.is_available():
        sys.exit("ws_probe: torch sees no CUDA device (cuBLAS is the reference of the timing)")


def median_ms(run, event=cuda.event, synchronize=cuda.synchronize):
    """Median of REPEATS event-timed calls after a warm-up call (numba's events, or torch's for cuBLAS)."""
    run()  # the first call compiles / picks cuBLAS's kernel; _median_ms warms up once more
    return _median_ms(run, REPEATS, event, synchronize)


def facts(kernel):
    """(registers, local memory bytes, static shared bytes) of the kernel's one compiled signature."""
    if DRY:
        return ("", "", "")
    compiled = next(iter(kernel.overloads.values()))
    return (compiled.regs_per_thread, compiled.local_mem_per_thread, compiled.shared_mem_per_block)


def bf16_bits(x):
    return (G.round_inputs(x, "bf16").view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def reference(a, b, inputs):
    """float64 A @ B^T of the inputs as read (on the GPU through torch when there is one: 4096^3 in float64)."""
    ra, rb = G.round_inputs(a, inputs).astype(np.float64), G.round_inputs(b, inputs).astype(np.float64)
    if DRY:
        return ra @ rb.T
    return (torch.from_numpy(ra).cuda() @ torch.from_numpy(rb).cuda().t()).cpu().numpy()


def check(name, got, ref, tol=TOL):
    """The relative error; a failure recorded when it is not finite or over `tol`."""
    err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else float("inf")
    if not err < tol:
        why = ", NaN/inf: unwritten outputs" if err == float("inf") else ""
        FAILURES.append(f"{name}: rel_err {err:.3e} (limit {tol:.0e}{why})")
    return err


def launcher(run, fmt_operands, out):
    """(launch, fmt, label, stages, bn, regs) of one RUNS entry, not launched."""
    family, fmt, stages, *rest = run.split(":")
    left, right = fmt_operands[fmt]
    if family == "direct":
        return G.gemm_direct(fmt, left, right, out, stages=int(stages), launch=False), fmt, "", ""
    bn, regs = int(rest[0]), direct_ws.REGS if rest[1] == "r" else None
    if family == "tma":
        launch = G.gemm_tma(fmt, left, right, out, stages=int(stages), bn=bn, regs=regs, launch=False,
                            persistent=-1 if rest[2:] == ["p"] else 0)
    else:
        launch = G.gemm_ws(fmt, left, right, out, stages=int(stages), bn=bn, regs=regs, launch=False)
    return launch, fmt, bn, ":".join(rest[1:])


rows = []
rng = np.random.default_rng(0)
for case, (m, n, k) in CASES.items():
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)  # B stored (N, K): C = A @ B^T
    bits_a, bits_b = bf16_bits(a), bf16_bits(b)
    operands = {"tf32": (cuda.to_device(a), cuda.to_device(b)), "bf16": (cuda.to_device(bits_a),
                                                                         cuda.to_device(bits_b))}
    refs = {inputs: reference(x, y, inputs) for inputs, x, y in (("tf32_trunc", a, b), ("tf32", a, b),
                                                                  ("bf16", bits_a, bits_b))}
    cublas = {}
    for fmt in ([] if DRY else ["tf32", "bf16"]):
        dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
        left, right = torch.from_numpy(a).cuda().to(dtype), torch.from_numpy(b).cuda().to(dtype)
        out_t = torch.empty((m, n), device="cuda", dtype=dtype)
        torch.backends.cuda.matmul.allow_tf32 = fmt == "tf32"
        ms = median_ms(lambda left=left, right=right, out_t=out_t: torch.matmul(left, right.t(), out=out_t),
                       lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)
        # cuBLAS's TF32 rounds its inputs (stop 56); its BF16 output is bfloat16 (half a unit: 2^-9 relative)
        err = check(f"{case} cublas_{fmt}", out_t.float().cpu().numpy(), refs["tf32" if fmt == "tf32" else "bf16"],
                    TOL if fmt == "tf32" else 2.0**-8)
        cublas[fmt] = ms
        rows.append(dict(case=case, m=m, n=n, k=k, version=f"cublas_{fmt}", ms=ms, tflops=2 * m * n * k / ms / 1e9,
                         pct_cublas=100.0, rel_err=err))
        print(f"{case:12s} cublas_{fmt:5s} {ms:8.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s  err {err:.2e}", flush=True)
    if not DRY:
        torch.backends.cuda.matmul.allow_tf32 = False

    for run in RUNS:
        name = f"{case} {run}"
        out = cuda.to_device(np.full((m, n), np.nan, np.float32))
        family, fmt, stages = run.split(":")[:3]
        if family == "tma" and k % 8:
            continue  # TMA: rows of a multiple of 16 bytes (odd_check_tma checks these runs)
        try:
            launch, fmt, bn, regs = launcher(run, operands, out)
            launch()
            cuda.synchronize()
            err = check(name, out.copy_to_host(), refs[G.VERSIONS[f"{family}_{fmt}"].inputs])
            ms = median_ms(launch.call)
        except Exception as exc:  # noqa: BLE001 (a probe: one failing kernel must not hide the others; reported)
            FAILURES.append(f"{name}: {exc!r}"[:400])
            print(name, "FAILED", repr(exc)[:400], flush=True)
            rows.append(dict(case=case, m=m, n=n, k=k, version=f"{family}_{fmt}", stages=stages, error=repr(exc)[:400]))
            continue
        r_regs, local, static = facts(launch.kernel)
        if local:
            FAILURES.append(f"{name}: {local} bytes of local memory a thread (spills)")
        pct = 100 * cublas[fmt] / ms if fmt in cublas else ""
        rows.append(dict(case=case, m=m, n=n, k=k, version=f"{family}_{fmt}", stages=stages, bn=bn, setmaxnreg=regs,
                         ms=ms, tflops=2 * m * n * k / ms / 1e9, pct_cublas=pct, rel_err=err, regs=r_regs,
                         local=local, shared=launch.shared or static))
        r = rows[-1]
        print(f"{name:32s} {ms:8.3f} ms {r['tflops']:7.1f} TFLOP/s {pct if pct == '' else f'{pct:5.1f} %'} of cuBLAS  "
              f"err {err:.2e}  regs {r_regs} local {local} smem {r['shared']}", flush=True)

fields = ["case", "m", "n", "k", "version", "stages", "bn", "setmaxnreg", "ms", "tflops", "pct_cublas", "rel_err",
          "regs", "local", "shared", "error"]
os.makedirs(OUT, exist_ok=True)
with open(f"{OUT}/ws_probe.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
print("wrote", f"{OUT}/ws_probe.csv")
if FAILURES:
    print(f"ws_probe: {len(FAILURES)} FAILURE(S):", *FAILURES, sep="\n  ", file=sys.stderr)
    sys.exit(1)
