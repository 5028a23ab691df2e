"""What every benchmark shares (the method is described in gpunn.bench): a Problem (one op on one shape, with
its float64 expected outputs and how to bind a launch of each version), the helpers that build memory-bound
problems from a kernel's launcher, validation against the references, CUDA-event timing (gpunn.kernels.launch.Clock)
with the torch reference, the CSV table of the rows (BENCH_COLUMNS), and the block-size and device lines of the
command line.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

from gpunn import device, provenance
from gpunn.errors import GpunnError
from gpunn.kernels.launch import HOLD_SLEEP_NS, Clock

DEFAULT_BLOCKS = (32, 64, 128, 256, 512, 1024)
QUICK_BLOCKS = (32, 64)
DEFAULT_REPEATS = 20
QUICK_REPEATS = 2
WARMUP_LAUNCHES = 2
SIMULATOR_WARMUP_LAUNCHES = 1  # under the simulator (a host clock) nothing compiles and no time is a measurement
MIN_REPEATS = 3
TIME_BUDGET_MS = 2000.0  # timed launches per configuration stop around this (naive GEMM at 4096^3)
HOLD_MARGIN = 2.0  # a hold lasts this many times the host's time to issue the launches queued behind it
HOLD_MIN_MS = 0.2  # ... plus this
HOLD_TRIES = 3  # holds lengthened when the host was slower than estimated (Timing.queued says if it sufficed)
TOLERANCE = 1e-5  # relative error of the memory-bound ops: a few float32 roundings
WARP = 32

# every row ends with the provenance columns (device, thread counts, versions, commit: gpunn.provenance)
BENCH_COLUMNS = ["op", "case", "version", "block", "block_dims", "m", "n", "k", "rows", "cols", "n_elements", "ms",
                 "gflops", "gbps", "ref_name", "ref_ms", "pct_of_ref", "repeats", "host_ms", "queued",
                 *provenance.CSV_COLUMNS]
SIMULATOR_NOTE = ("note: numba CUDA simulator: kernels run as Python threads on the CPU; the timings "
                     "below are host-clock times and meaningless")


class BenchMismatch(GpunnError):
    """A kernel's output differs from its float64 reference beyond the op's tolerance."""


# --------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One op on one shape: host inputs, float64 expected outputs, and how to bind a launch of a version.

    ``bind(launcher, block, stream)`` copies fresh inputs to the device, poisons the outputs with NaN and
    returns ``(launch, outputs)`` without launching; ``torch_ref(torch)`` returns the name of the equivalent
    torch op and a zero-argument callable running it on device tensors.

    A version whose inputs are rounded before they are multiplied (``input_format(version)``: "tf32", "bf16", the
    tensor-core GEMMs) is checked against ``expected_for(format)``, the reference of rounded inputs, and compared
    with ``torch_ref(torch, format)``, PyTorch in the same format; every other version against ``expected`` and
    ``torch_ref(torch)``."""

    op: str
    case: str
    versions: dict  # version name -> launcher
    dims: dict
    shape_label: str
    n_elements: int
    output_names: tuple
    expected: tuple
    tolerance: float
    bytes_moved: int
    flops: int
    bind: Callable
    torch_ref: Callable
    input_format: Callable = lambda version: "fp32"
    expected_for: Callable | None = None

    def expected_of(self, version: str) -> tuple:
        fmt = self.input_format(version)
        return self.expected if fmt == "fp32" else self.expected_for(fmt)


def _random(rng, shape, scale=1.0) -> np.ndarray:
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    a[a == 0] = 0.5  # never zero: keeps the ReLU masks and the relative errors well defined
    return a


def _poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


class _Output:
    """An output argument: `shape` filled with NaN on the device before the launch."""

    def __init__(self, *shape):
        self.shape = shape


def _launcher_problem(op, case, kernel, launcher, rows, cols, args, outputs, expected, bytes_moved, torch_ref,
                      n_elements=None) -> Problem:
    """A memory-bound kernel: `args` are its positional arguments (host arrays are copied to the device
    fresh at every bind, ``_Output``s are poisoned, anything else is passed as is); `outputs` names the
    checked arguments by position (an in-place op names one of its inputs)."""

    def bind(launcher, block, stream):
        device_args = [cuda.to_device(arg) if isinstance(arg, np.ndarray) else
                       _poisoned(arg.shape) if isinstance(arg, _Output) else arg for arg in args]
        launch = launcher(*device_args, block=block, stream=stream, launch=False)
        return launch, tuple(device_args[i] for i in outputs.values())

    return Problem(
        op=op, case=case, versions={kernel: launcher}, dims={"rows": rows, "cols": cols},
        shape_label=f"{rows}x{cols}", n_elements=rows * cols if n_elements is None else n_elements,
        output_names=tuple(outputs), expected=tuple(expected), tolerance=TOLERANCE, bytes_moved=bytes_moved,
        flops=0, bind=bind, torch_ref=torch_ref,
    )


def _tensor(torch, host):
    return torch.from_numpy(host).cuda()


# --------------------------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class Configuration:
    problem: Problem
    version: str
    block: object


def block_dims(block) -> str:
    """'16x16', '256', or 'auto' for a version that picks its own block (block None)."""
    return "auto" if block is None else "x".join(str(b) for b in _dims(block))


def block_threads(block) -> int:
    """Threads per block; 0 for a version that picks its own (block None)."""
    return 0 if block is None else math.prod(_dims(block))


def _dims(block) -> tuple:
    return tuple(int(b) for b in block) if isinstance(block, tuple) else (int(block),)


def _block_choices(problem: Problem, launcher, blocks):
    """(block, optional) pairs to try. 1-D kernels take every size. A GEMM version, or any version whose
    block defaults to None (it picks its own, e.g. the implicit-GEMM convolution), takes its default block and,
    optionally, each size in the default's form (2-D: 32 x threads/32); an optional block the version
    rejects, or replaces by its own fixed block, is skipped."""
    default = inspect.signature(launcher).parameters["block"].default
    if problem.op != "gemm" and default is not None:
        return [(block, False) for block in blocks]
    choices = [(default, False)]
    for threads in blocks:
        block = (min(threads, WARP), threads // min(threads, WARP)) if isinstance(default, tuple) else threads
        if all(block != chosen for chosen, _ in choices):
            choices.append((block, True))
    return choices


def _label(problem: Problem, version: str, block) -> str:
    return f"{problem.op}/{version} block {block_dims(block)} on {problem.case} {problem.shape_label}"


def check_outputs(problem: Problem, label: str, outputs, version: str | None = None) -> None:
    """Raise BenchMismatch unless every output is within the problem's relative-error limit of its reference (the
    version's: see Problem)."""
    expected_outputs = problem.expected if version is None else problem.expected_of(version)
    for name, got, expected in zip(problem.output_names, outputs, expected_outputs):
        got = np.asarray(got, np.float64).reshape(expected.shape)
        scale = float(np.max(np.abs(expected))) or 1.0  # an all-zero reference (zeroed grad): absolute error
        error = np.abs(got - expected) / scale
        bad = ~(error <= problem.tolerance)  # NaN (an element never written) counts as bad
        if bad.any():
            worst = float(np.nanmax(error)) if np.isfinite(error).any() else math.nan
            first = "; ".join(f"{index.tolist()} got {got[tuple(index)]:.6g} expected {expected[tuple(index)]:.6g}"
                              for index in np.argwhere(bad)[:5])
            raise BenchMismatch(
                f"{label}: output '{name}' differs from the float64 reference at {int(bad.sum())} of {bad.size} "
                f"elements (max relative error {worst:.2e}, limit {problem.tolerance:.1e}; "
                f"{int(np.isnan(got).sum())} NaN); first: {first}"
            )


def validate(problems, blocks, log=print) -> list[Configuration]:
    """Run every version x block of every problem once and check it against the reference; stop at the
    first mismatch (BenchMismatch) or rejected block (GpunnError). Returns the validated configurations."""
    stream = cuda.stream()
    validated = []
    for problem in problems:
        for version, launcher in problem.versions.items():
            for block, optional in _block_choices(problem, launcher, blocks):
                label = _label(problem, version, block)
                try:
                    launch, outputs = problem.bind(launcher, block, stream)
                except ValueError as exc:
                    if optional:
                        continue
                    raise GpunnError(f"{label}: {exc}") from None
                if optional and _dims(launch.block) != _dims(block):
                    continue  # a fixed-block version accepted the thread count but runs its own block: a duplicate
                try:
                    launch()
                    stream.synchronize()
                except CudaAPIError as exc:  # e.g. an illegal address: the context is lost, name the culprit
                    raise GpunnError(f"{label}: the launch failed on the device: {exc}") from None
                check_outputs(problem, label, [output.copy_to_host() for output in outputs], version)
                validated.append(Configuration(problem, version, block))
    log(f"all results match ({len(validated)} configurations)")
    return validated


# --------------------------------------------------------------------------------------------- timing
def numba_clock(stream) -> Clock:
    return Clock(stream)


def torch_clock(torch) -> Clock:
    return Clock(torch=torch)


@dataclass
class Timing:
    """One configuration's timing: ``ms`` the median GPU time of one launch; ``repeats`` the timed launches;
    ``host_ms`` the median host time to issue one launch (marks included); ``queued`` whether every timed
    launch was already queued when the GPU reached it (None on the host clock)."""

    ms: float
    repeats: int
    host_ms: float
    queued: bool | None


_SLEEP_MS = [HOLD_SLEEP_NS / 1e6]  # measured length of one hold sleep, updated by every hold


def _timed_launches(launch, count: int, clock: Clock, hold_ms: float = 0.0) -> tuple[list[float], float, float]:
    """(ms of each of `count` launches between two marks, host ms to issue them all, ms the GPU spent in a
    hold of about `hold_ms` queued first; 0 without one). Host times under the simulator."""
    clock.resize(2 * count + 2)
    started = time.perf_counter()
    if hold_ms > 0:
        clock.mark(0)
        clock.hold(math.ceil(hold_ms / _SLEEP_MS[0]))
        clock.mark(1)
    host_ms = []
    for r in range(count):
        before = time.perf_counter()
        clock.mark(2 + 2 * r)
        launch()
        clock.mark(3 + 2 * r)
        host_ms.append(1e3 * (time.perf_counter() - before))
    issue_ms = 1e3 * (time.perf_counter() - started)
    clock.synchronize()  # once: the launches queue back to back
    if clock.host_clock:
        return host_ms, issue_ms, 0.0
    held_ms = 1e3 * clock.seconds(0, 1) if hold_ms > 0 else 0.0
    return [1e3 * clock.seconds(2 + 2 * r, 3 + 2 * r) for r in range(count)], issue_ms, held_ms


def median_launch_ms(launch, repeats: int, clock: Clock, warmup: int | None = None) -> Timing:
    """Warm-up launches (default WARMUP_LAUNCHES; SIMULATOR_WARMUP_LAUNCHES on a host clock), one probe when
    there is a choice of repeats, then the timed launches queued behind a GPU hold (``Clock.hold``) with an
    event pair around each: the GPU runs them back to back, so each pair times the kernels alone even where they
    are shorter than the host's cost of launching them. The hold is sized from the host's issue time and
    lengthened until the whole batch was issued before it ended (``Timing.queued``)."""
    if warmup is None:
        warmup = SIMULATOR_WARMUP_LAUNCHES if clock.host_clock else WARMUP_LAUNCHES
    issue_ms = 0.0
    for _ in range(warmup):
        before = time.perf_counter()
        launch()
        issue_ms = 1e3 * (time.perf_counter() - before)  # the last one: compiled by then
        clock.synchronize()
    if repeats > MIN_REPEATS:
        (probe_ms,), issue_ms, _ = _timed_launches(launch, 1, clock)
        repeats = min(repeats, max(MIN_REPEATS, int(TIME_BUDGET_MS / max(probe_ms, 1e-6))))
    if clock.host_clock:
        times, _, _ = _timed_launches(launch, repeats, clock)
        return Timing(float(np.median(times)), repeats, float(np.median(times)), None)
    hold_ms = HOLD_MARGIN * repeats * issue_ms + HOLD_MIN_MS
    for _ in range(HOLD_TRIES):
        times, issue_ms, held_ms = _timed_launches(launch, repeats, clock, hold_ms)
        _SLEEP_MS[0] = max(held_ms / math.ceil(hold_ms / _SLEEP_MS[0]), 1e-4)  # a floor: sleeps may return at once
        if issue_ms < held_ms:
            break
        hold_ms = HOLD_MARGIN * issue_ms + HOLD_MIN_MS
    return Timing(float(np.median(times)), repeats, issue_ms / repeats, issue_ms < held_ms)


def time_configuration(config: Configuration, repeats: int, stream) -> Timing:
    """The timing of one validated configuration, on fresh buffers bound to `stream`."""
    launch, _ = config.problem.bind(config.problem.versions[config.version], config.block, stream)
    return median_launch_ms(launch, repeats, numba_clock(stream))


def torch_on_gpu():
    """torch with a usable CUDA device, or None (not installed, no device, or the numba simulator)."""
    if device.simulator_enabled():
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32: TF32 trades precision for ~2x speed
    return torch


def reference_timing(problem: Problem, repeats: int, torch, fmt: str = "fp32") -> tuple[str, float]:
    name, run = problem.torch_ref(torch) if fmt == "fp32" else problem.torch_ref(torch, fmt)
    return name, median_launch_ms(run, repeats, torch_clock(torch)).ms


def benchmark(problems, blocks, repeats: int, log=print, compare_torch: bool = True) -> list[dict]:
    """Validate everything, then time every configuration (and the torch reference once per problem when
    `compare_torch` and torch has CUDA); one printed line and one dict per configuration."""
    configurations = validate(problems, blocks, log)
    torch = torch_on_gpu() if compare_torch else None
    provenance_columns = provenance.columns(provenance.collect(uses_gpu=True))
    stream = cuda.stream()
    references = {}
    rows = []
    for config in configurations:
        problem = config.problem
        timing = time_configuration(config, repeats, stream)
        ms, timed = timing.ms, timing.repeats
        fmt = problem.input_format(config.version)
        if torch is not None and (id(problem), fmt) not in references:
            references[id(problem), fmt] = reference_timing(problem, repeats, torch, fmt)
        ref_name, ref_ms = references.get((id(problem), fmt), (None, None))
        gflops = problem.flops / ms / 1e6 if problem.flops else None
        gbps = None if problem.flops else problem.bytes_moved / ms / 1e6
        pct = 100.0 * ref_ms / ms if ref_ms else None
        rows.append({
            "op": problem.op, "case": problem.case, "version": config.version,
            "block": block_threads(config.block), "block_dims": block_dims(config.block), **problem.dims,
            "n_elements": problem.n_elements, "ms": ms, "gflops": gflops, "gbps": gbps, "ref_name": ref_name,
            "ref_ms": ref_ms, "pct_of_ref": pct, "repeats": timed, "host_ms": timing.host_ms,
            "queued": timing.queued, **provenance_columns,
        })
        rate = f"{gflops:9.1f} GFLOP/s" if gflops is not None else f"{gbps:9.2f} GB/s"
        versus = f"  {pct:6.1f}% of {ref_name}" if pct is not None else ""
        log(f"{problem.op:<11} {problem.shape_label:<22} {config.version:<15} block {block_dims(config.block):>5}"
            f"  {ms:10.4f} ms  {rate}  ({timed} runs){versus}")
    return rows


def bench_frame(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows).reindex(columns=BENCH_COLUMNS)
    return frame.astype({c: "Int64" for c in ("block", "m", "n", "k", "rows", "cols", "n_elements", "repeats")})


# --------------------------------------------------------------------------------------------- command line
def parse_blocks(text: str) -> list[int]:
    """'32,64,...' -> block sizes; each a power of two from 1 to 1024 (CUDA's per-block limit; the tree
    reductions need powers of two)."""
    try:
        blocks = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise GpunnError(f"--blocks: expected integers separated by commas, got '{text}'") from None
    limit = device.DEFAULT_MAX_THREADS_PER_BLOCK
    bad = [b for b in blocks if b < 1 or b > limit or b & (b - 1)]
    if not blocks or bad:
        raise GpunnError(f"--blocks: block sizes must be powers of two from 1 to {limit} threads, got '{text}'")
    return blocks


def log_device_header(log=print) -> None:
    log(device.describe_device())
    if device.simulator_enabled():
        log(SIMULATOR_NOTE)
