"""Issue 42 probe (device, Hopper): direct_tf32 / direct_bf16 (wgmma fed straight by cp.async; several ring depths)
beside wgmma_tf32 / wgmma_bf16 and cuBLAS (torch.matmul on the same layout, A @ B.t() with B stored (N, K): TF32 on
/ bf16 tensors) at 4096^3, and at 257 x 129 x 302 as a check. CUDA events after 2 warm-up calls, median of 20.
Every result is checked against the float64 product of its inputs as that kernel's MMA reads them (direct_tf32:
TF32 truncated; wgmma_tf32: rounded to nearest; BF16: the BF16 values), max|out - ref| / max|ref| under TOL, and
every kernel's registers, local memory (spills) and shared memory are reported. CSV to OUT/direct_probe.csv; the
script exits with status 1, naming them, if any result is wrong, missing or spills.

    python docs/notes/issue-42/direct_probe.py OUT [tf32:7,tf32:4,tf32:3,bf16:7,bf16:4,bf16:3] [case,...]

(the second argument: format:stages of the direct rings to time). Under NUMBA_ENABLE_CUDASIM=1 it is a dry run of
the numba side only (the check case, one repeat, no torch, no cuBLAS)."""
import csv
import os
import sys

import numpy as np
from numba import cuda

from gpunn import device
from gpunn.bench.mma_rate import _median_ms
from gpunn.kernels import gemm as G

DRY = device.simulator_enabled()
OUT = sys.argv[1]
RINGS = [(f, int(s)) for f, s in (x.split(":") for x in sys.argv[2].split(","))] if len(sys.argv) > 2 and \
    sys.argv[2] else [("tf32", 7), ("tf32", 4), ("tf32", 3), ("bf16", 7), ("bf16", 4), ("bf16", 3)]
CASES = {"square_4096": (4096, 4096, 4096), "odd_check": (257, 129, 302)}  # (M, N, K); C = A (M, K) @ B (N, K)^T
if len(sys.argv) > 3:
    CASES = {k: v for k, v in CASES.items() if k in sys.argv[3].split(",")}
if DRY:
    CASES = {"odd_check": CASES.get("odd_check", (257, 129, 302))}
REPEATS = 1 if DRY else 20
TOL = 1e-4  # GPU float32 accumulation is not IEEE round-to-nearest; observed wgmma errors at K = 4096: ~1e-5
FAILURES = []

if not DRY:
    cc = tuple(cuda.get_current_device().compute_capability)
    if cc != (9, 0):
        sys.exit(f"direct_probe: needs a Hopper GPU (compute capability 9.0: wgmma, 227 KB of shared memory a block); "
                 f"this one is {cc[0]}.{cc[1]}")
    import torch

    if not torch.cuda.is_available():
        sys.exit("direct_probe: torch sees no CUDA device (cuBLAS is the reference of the timing)")


def median_ms(run, event=cuda.event, synchronize=cuda.synchronize):
    """Median of REPEATS event-timed calls after a warm-up call (numba's events, or torch's for cuBLAS)."""
    run()  # the first call compiles / picks cuBLAS's kernel; _median_ms warms up once more
    return _median_ms(run, REPEATS, event, synchronize)


def facts(kernel):
    """(registers, local memory bytes, static shared bytes) of the kernel's one compiled signature."""
    if DRY:
        return ("", "", "")
    compiled = next(iter(kernel.overloads.values()))  # keyed by the argument types' tuple
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


rows = []
rng = np.random.default_rng(0)
for case, (m, n, k) in CASES.items():
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)  # B stored (N, K): C = A @ B^T
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    bits_a, bits_b = bf16_bits(a), bf16_bits(b)
    d_bits_a, d_bits_b = cuda.to_device(bits_a), cuda.to_device(bits_b)
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
        got = out_t.float().cpu().numpy()
        # cuBLAS's TF32 rounds its inputs (H200, stop 56: 2.9e-5 against the rounded inputs' product, 9.1e-4
        # against the truncated ones', beside it); its BF16 output is bfloat16 (half a unit: 2^-9 relative)
        err = check(f"{case} cublas_{fmt}", got, refs["tf32" if fmt == "tf32" else "bf16"],
                    TOL if fmt == "tf32" else 2.0**-8)
        trunc = refs["tf32_trunc"]
        extra = (f" (vs truncated inputs {float(np.abs(got - trunc).max() / np.abs(trunc).max()):.2e})"
                 if fmt == "tf32" else " (its output in bfloat16)")
        cublas[fmt] = ms
        rows.append(dict(case=case, m=m, n=n, k=k, version=f"cublas_{fmt}", stages="", ms=ms,
                         tflops=2 * m * n * k / ms / 1e9, pct_cublas=100.0, rel_err=err))
        print(f"{case:12s} cublas_{fmt:5s}       {ms:8.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s  err {err:.2e}{extra}",
              flush=True)
    if not DRY:
        torch.backends.cuda.matmul.allow_tf32 = False

    launches = [(f"wgmma_{fmt}", "", fmt) for fmt in ("tf32", "bf16")] + [(f"direct_{f}", s, f) for f, s in RINGS]
    for version, stages, fmt in launches:
        name = f"{case} {version}{f' x{stages}' if stages else ''}"
        out = cuda.to_device(np.full((m, n), np.nan, np.float32))
        try:
            if version.startswith("wgmma"):
                launch = G.gemm(d_a, d_b, out, version=version, trans_b=True, launch=False)
                inputs = fmt
            else:
                left, right = (d_a, d_b) if fmt == "tf32" else (d_bits_a, d_bits_b)
                launch = G.gemm_direct(fmt, left, right, out, stages=stages, launch=False)
                inputs = G.VERSIONS[version].inputs
            launch()
            cuda.synchronize()
            err = check(name, out.copy_to_host(), refs[inputs])
            ms = median_ms(launch.call)
        except Exception as exc:  # noqa: BLE001 (a probe: one failing kernel must not hide the others; reported)
            FAILURES.append(f"{name}: {exc!r}"[:400])
            print(name, "FAILED", repr(exc)[:400], flush=True)
            rows.append(dict(case=case, m=m, n=n, k=k, version=version, stages=stages, error=repr(exc)[:400]))
            continue
        regs, local, static = facts(launch.kernel)
        if local:
            FAILURES.append(f"{name}: {local} bytes of local memory a thread (spills)")
        pct = 100 * cublas[fmt] / ms if fmt in cublas else ""
        rows.append(dict(case=case, m=m, n=n, k=k, version=version, stages=stages, ms=ms,
                         tflops=2 * m * n * k / ms / 1e9, pct_cublas=pct, rel_err=err, regs=regs, local=local,
                         shared=launch.shared or static, direct=launch.direct))
        r = rows[-1]
        print(f"{name:28s} {ms:8.3f} ms {r['tflops']:7.1f} TFLOP/s {pct if pct == '' else f'{pct:5.1f} %'} of cuBLAS  "
              f"err {err:.2e}  regs {regs} local {local} smem {r['shared']}", flush=True)

fields = ["case", "m", "n", "k", "version", "stages", "ms", "tflops", "pct_cublas", "rel_err", "regs", "local",
          "shared", "direct", "error"]
os.makedirs(OUT, exist_ok=True)
with open(f"{OUT}/direct_probe.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
print("wrote", f"{OUT}/direct_probe.csv")
if FAILURES:
    print(f"direct_probe: {len(FAILURES)} FAILURE(S):", *FAILURES, sep="\n  ", file=sys.stderr)
    sys.exit(1)
