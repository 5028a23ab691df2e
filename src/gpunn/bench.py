"""Kernel benchmarks in the llm.c ``dev/cuda`` style: validate every version against its float64 reference
first, then time every version x block size with CUDA events, one line each.

    python -m gpunn.bench {gemm,elementwise,softmax,reduce,sgd,all} [--out CSV] [--quick] [--repeats N]
                          [--blocks 32,64,...]
    python -m gpunn.bench mlp [--variants gpu-fused,...] [--samples 60000] [--batch 64] [--epochs 3]

What is benchmarked
    gemm         every variant in ``gemm.VERSIONS`` (variants added there are picked up) on 4096^3, the
                 MLP 784-256-10 at batch 64 (both layers' forward with bias (+ ReLU), the weight gradients
                 x^T dy, the hidden-layer input gradient dy W^T) and an odd validation shape 257x129x301.
                 Block sizes: the variant's own default block, plus every ``--blocks`` size the variant
                 accepts (a 2-D block is laid out 32 x threads/32; fixed-block variants reject the others).
    elementwise  bias_add, relu_forward, relu_backward, bias_relu
    softmax      softmax_rows, softmax_ce_grad (logits and int32 labels), loss_mean (of the batch's losses)
    reduce       colsum_atomic, colsum_tree
    sgd          sgd_step over a flat buffer of rows * cols parameters
    The memory-bound ops run on the MLP's hidden activation 64x256 (launch-bound: what training sees) and
    on a large odd 8191x4099. ``--quick``: tiny shapes, 2 repeats, blocks 32,64 (what the simulator tests run).

How
    1. Validation (``validate``): fixed-seed random non-zero float32 inputs and the float64 reference; for
       every variant x block, fresh device inputs, outputs poisoned with NaN (in-place ops overwrite their
       input instead), one launch; the relative error max|out - ref| / max|ref| must stay below the op's
       limit (``TOLERANCE``; GEMM: ``gemm_tolerance``, growing with sqrt(K)). The first mismatch stops
       everything with a ``BenchMismatch`` naming op, variant, block and shape and the first differing
       elements. "all results match" is printed before any timing.
    2. Timing (``median_launch_ms``): ``WARMUP_LAUNCHES`` launches (the first one compiles), then a CUDA
       event pair recorded on the launch's stream around each of ``repeats`` launches, one synchronisation,
       the median in ms. A launch slower than ``TIME_BUDGET_MS / repeats`` (naive GEMM at 4096^3) gets fewer
       repeats, at least ``MIN_REPEATS``. A kernel shorter than the host's launch cost leaves the GPU
       waiting for its launch between the events, so its time includes that overhead (what training sees).
       GFLOP/s = 2MNK / time (GEMM); GB/s = bytes read plus bytes written, each array counted once, / time
       (memory-bound ops).
    3. Reference: when torch with CUDA is importable, the equivalent torch op (GEMM: torch.matmul / addmm,
       cuBLAS with TF32 off) is timed the same way with torch.cuda.Event; pct_of_ref = 100 * ref_ms / ms.
    Under numba's CUDA simulator events carry no time: the host clock is used instead, and a warning says
    the timings are meaningless; the code path still runs.
    Validation and timing run under the machine-wide timing lock (gpunn.timing_lock: one timed job at a time),
    and every CSV row ends with the provenance columns (gpunn.provenance.CSV_COLUMNS: device by name, thread
    counts, versions, commit).

``mlp`` times whole training epochs of the MLP per variant (gpunn.timing.time_mlp_epochs: same random
MNIST-shaped data, init and batch order for every variant; PyTorch eager and CUDA-graph epochs in the same run
when torch is importable, and each variant's ratio to PyTorch eager).

``block_sweep`` is the E3 block-size sweep of the memory-bound kernels (``gpunn sweep-blocks``).
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numba import cuda

from gpunn import device, io, provenance
from gpunn.cli import OneLineErrorParser, int_at_least
from gpunn.errors import GpunnError
from gpunn.kernels import elementwise, gemm, reduce, sgd, softmax
from gpunn.timing_lock import timing_lock
from gpunn.backends.registry import check_variant

OPS = ("gemm", "elementwise", "softmax", "reduce", "sgd")
DEFAULT_BLOCKS = (32, 64, 128, 256, 512, 1024)
QUICK_BLOCKS = (32, 64)
DEFAULT_REPEATS = 20
QUICK_REPEATS = 2
WARMUP_LAUNCHES = 2
MIN_REPEATS = 3
TIME_BUDGET_MS = 2000.0  # timed launches per configuration stop around this (naive GEMM at 4096^3)
TOLERANCE = 1e-5  # relative error of the memory-bound ops: a few float32 roundings
WARP = 32
SGD_LR = 0.01

# every row ends with the provenance columns (device, thread counts, versions, commit: gpunn.provenance)
BENCH_COLUMNS = ["op", "case", "variant", "block", "block_dims", "m", "n", "k", "rows", "cols", "n_elements", "ms",
                 "gflops", "gbps", "ref_name", "ref_ms", "pct_of_ref", "repeats", *provenance.CSV_COLUMNS]
SWEEP_COLUMNS = ["op", "block", "rows", "cols", "n_elements", "ms", "gb_per_s", "repeats", *provenance.CSV_COLUMNS]
SIMULATOR_WARNING = ("WARNING: numba CUDA simulator: kernels run as Python threads on the CPU; the timings "
                     "below are host-clock times and meaningless")


class BenchMismatch(GpunnError):
    """A kernel's output differs from its float64 reference beyond the op's tolerance."""


def gemm_tolerance(k: int) -> float:
    """Relative-error limit of an fp32 GEMM with fp32 accumulation over K terms.

    Rounding errors of a K-term dot product grow like sqrt(K). Measured for sequential fp32 accumulation
    (no FMA, the worst order the kernels use) on standard-normal inputs: 3.4e-7 at K=64, 1.2e-6 at K=784,
    2.6e-6 at K=4096; the limit, 5e-5 at K=4096 scaled by sqrt(K / 4096) and never below 1e-5, leaves a
    margin of about 20x, while a wrong index or a skipped tile gives errors of order 1."""
    return max(TOLERANCE, 5e-5 * math.sqrt(k / 4096))


# --------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One op on one shape: host inputs, float64 expected outputs, and how to bind a launch of a variant.

    ``bind(launcher, block, stream)`` copies fresh inputs to the device, poisons the outputs with NaN and
    returns ``(launch, outputs)`` without launching; ``torch_ref(torch)`` returns the name of the equivalent
    torch op and a zero-argument callable running it on device tensors."""

    op: str
    case: str
    variants: dict
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


@dataclass(frozen=True)
class GemmCase:
    case: str
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    bias: bool = False
    relu: bool = False


# The MLP 784-256-10 at batch 64: y = x @ W + b, W stored (in, out); gradients dW = x^T dy, dx = dy W^T.
GEMM_CASES = (
    GemmCase("square_4096", 4096, 4096, 4096),
    GemmCase("mlp_fc1_forward", 64, 256, 784, bias=True, relu=True),
    GemmCase("mlp_fc2_forward", 64, 10, 256, bias=True),
    GemmCase("mlp_fc2_grad_w", 256, 10, 64, trans_a=True),
    GemmCase("mlp_fc2_grad_x", 64, 256, 10, trans_b=True),
    GemmCase("mlp_fc1_grad_w", 784, 256, 64, trans_a=True),
    GemmCase("odd_validation", 257, 129, 301, bias=True, relu=True),
)
QUICK_GEMM_CASES = (
    GemmCase("quick_bias_relu", 19, 13, 11, bias=True, relu=True),
    GemmCase("quick_transposed", 13, 7, 5, trans_a=True, trans_b=True),
)
MEMORY_SHAPES = {"mlp_hidden": (64, 256), "large_odd": (8191, 4099)}
QUICK_MEMORY_SHAPES = {"quick": (3, 37)}


def _random(rng, shape, scale=1.0) -> np.ndarray:
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    a[a == 0] = 0.5  # never zero: keeps the ReLU masks and the relative errors well defined
    return a


def _poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def gemm_problems(cases, seed=0) -> list[Problem]:
    rng = np.random.default_rng(seed)
    return [_gemm_problem(case, rng) for case in cases]


def _gemm_problem(case: GemmCase, rng) -> Problem:
    m, n, k = case.m, case.n, case.k
    a = _random(rng, (k, m) if case.trans_a else (m, k))
    b = _random(rng, (n, k) if case.trans_b else (k, n))
    bias = _random(rng, (n,)) if case.bias else None
    expected = gemm.gemm_reference(a, b, case.trans_a, case.trans_b, bias, case.relu)

    def bind(launcher, block, stream):
        out = _poisoned((m, n))
        launch = launcher(cuda.to_device(a), cuda.to_device(b), out, trans_a=case.trans_a, trans_b=case.trans_b,
                          bias=None if bias is None else cuda.to_device(bias), relu=case.relu, block=block,
                          stream=stream, launch=False)
        return launch, (out,)

    def torch_ref(torch):
        left = torch.from_numpy(a).cuda()
        right = torch.from_numpy(b).cuda()
        left = left.t() if case.trans_a else left  # transposed views, as the kernels read them in place
        right = right.t() if case.trans_b else right
        out = torch.empty((m, n), device="cuda")
        bias_t = None if bias is None else torch.from_numpy(bias).cuda()

        def run():
            if bias_t is None:
                torch.matmul(left, right, out=out)
            else:
                torch.addmm(bias_t, left, right, out=out)
            if case.relu:
                out.relu_()

        name = "torch.matmul" if bias is None else "torch.addmm"
        return name + (" + relu_" if case.relu else ""), run

    flags = ("A^T " if case.trans_a else "") + ("B^T " if case.trans_b else "") + \
            ("+bias " if case.bias else "") + ("+relu" if case.relu else "")
    return Problem(
        op="gemm", case=case.case, variants=dict(gemm.VERSIONS), dims={"m": m, "n": n, "k": k},
        shape_label=f"{m}x{n}x{k} {flags}".strip(), n_elements=m * n, output_names=("out",),
        expected=(expected,), tolerance=gemm_tolerance(k),
        bytes_moved=4 * (a.size + b.size + m * n + (n if case.bias else 0)), flops=2 * m * n * k,
        bind=bind, torch_ref=torch_ref,
    )


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
        op=op, case=case, variants={kernel: launcher}, dims={"rows": rows, "cols": cols},
        shape_label=f"{rows}x{cols}", n_elements=rows * cols if n_elements is None else n_elements,
        output_names=tuple(outputs), expected=tuple(expected), tolerance=TOLERANCE, bytes_moved=bytes_moved,
        flops=0, bind=bind, torch_ref=torch_ref,
    )


def _tensor(torch, host):
    return torch.from_numpy(host).cuda()


def elementwise_problems(rows, cols, case, rng) -> list[Problem]:
    x = _random(rng, (rows, cols))
    bias = _random(rng, (cols,))
    dy = _random(rng, (rows, cols))
    n = rows * cols

    def bias_add_ref(torch):
        x_t, b_t = _tensor(torch, x), _tensor(torch, bias)
        return "torch x.add_(bias)", lambda: x_t.add_(b_t)

    def relu_forward_ref(torch):
        x_t = _tensor(torch, x)
        return "torch.relu", lambda: torch.relu(x_t)

    def relu_backward_ref(torch):
        x_t, dy_t = _tensor(torch, x), _tensor(torch, dy)
        # the kernel autograd runs for ReLU's backward
        return "aten.threshold_backward", lambda: torch.ops.aten.threshold_backward(dy_t, x_t, 0.0)

    def bias_relu_ref(torch):
        x_t, b_t = _tensor(torch, x), _tensor(torch, bias)
        return "torch x.add_(bias).relu_()", lambda: x_t.add_(b_t).relu_()

    ew = elementwise
    return [
        _launcher_problem("elementwise", case, "bias_add", ew.bias_add, rows, cols, (x, bias), {"x": 0},
                          [ew.bias_add_ref(x, bias)], 4 * (2 * n + cols), bias_add_ref),
        _launcher_problem("elementwise", case, "relu_forward", ew.relu_forward, rows, cols, (x, _Output(rows, cols)),
                          {"out": 1}, [ew.relu_forward_ref(x)], 4 * 2 * n, relu_forward_ref),
        _launcher_problem("elementwise", case, "relu_backward", ew.relu_backward, rows, cols,
                          (x, dy, _Output(rows, cols)), {"dx": 2}, [ew.relu_backward_ref(x, dy)], 4 * 3 * n,
                          relu_backward_ref),
        _launcher_problem("elementwise", case, "bias_relu", ew.bias_relu, rows, cols, (x, bias), {"x": 0},
                          [ew.bias_relu_ref(x, bias)], 4 * (2 * n + cols), bias_relu_ref),
    ]


def softmax_problems(rows, cols, case, rng) -> list[Problem]:
    x = _random(rng, (rows, cols), scale=3.0) + np.float32(20.0)  # an offset only a max-subtracting softmax survives
    logits = _random(rng, (rows, cols), scale=3.0)
    labels = rng.integers(0, cols, size=rows).astype(np.int32)
    losses = np.abs(_random(rng, (rows,)))
    expected_dlogits, expected_losses = softmax.softmax_ce_grad_ref(logits, labels)
    n = rows * cols

    def softmax_rows_ref(torch):
        x_t = _tensor(torch, x)
        return "torch.softmax", lambda: torch.softmax(x_t, dim=1)

    def softmax_ce_grad_ref(torch):
        logits_t = _tensor(torch, logits)
        labels_t = torch.from_numpy(labels.astype(np.int64)).cuda()
        onehot = torch.nn.functional.one_hot(labels_t, cols).float()

        def run():
            torch.nn.functional.cross_entropy(logits_t, labels_t, reduction="none")
            torch.softmax(logits_t, dim=1).sub_(onehot).div_(rows)

        return "torch cross_entropy(reduction=none) + (softmax - onehot) / B", run

    def loss_mean_ref(torch):
        losses_t = _tensor(torch, losses)
        return "torch.mean", lambda: torch.mean(losses_t)

    return [
        _launcher_problem("softmax", case, "softmax_rows", softmax.softmax_rows, rows, cols,
                          (x, _Output(rows, cols)), {"out": 1}, [softmax.softmax_ref(x)], 4 * 2 * n,
                          softmax_rows_ref),
        _launcher_problem("softmax", case, "softmax_ce_grad", softmax.softmax_ce_grad, rows, cols,
                          (logits, labels, _Output(rows, cols), _Output(rows)), {"dlogits": 2, "losses": 3},
                          [expected_dlogits, expected_losses], 4 * (2 * n + 2 * rows), softmax_ce_grad_ref),
        # the mean over the batch's per-row losses, as in training: `rows` elements, one block
        _launcher_problem("softmax", case, "loss_mean", softmax.loss_mean, rows, cols, (losses, _Output(1)),
                          {"out": 1}, [softmax.loss_mean_ref(losses)], 4 * (rows + 1), loss_mean_ref,
                          n_elements=rows),
    ]


def reduce_problems(rows, cols, case, rng) -> list[Problem]:
    dy = _random(rng, (rows, cols))

    def colsum_ref(torch):
        dy_t = _tensor(torch, dy)
        return "torch.sum(dim=0)", lambda: torch.sum(dy_t, dim=0)

    return [
        _launcher_problem("reduce", case, name, launcher, rows, cols, (dy, _Output(cols)), {"db": 1},
                          [reduce.colsum_ref(dy)], 4 * (rows * cols + cols), colsum_ref)
        for name, launcher in reduce.VERSIONS.items()
    ]


def sgd_problems(rows, cols, case, rng) -> list[Problem]:
    params = _random(rng, (rows * cols,))
    grad = _random(rng, (rows * cols,))

    def sgd_ref(torch):
        params_t, grad_t = _tensor(torch, params), _tensor(torch, grad)

        def run():
            params_t.add_(grad_t, alpha=-SGD_LR)
            grad_t.zero_()

        return "torch p.add_(g, alpha=-lr); g.zero_()", run

    # reads and writes both buffers: the update and the fused zero_grad
    return [_launcher_problem("sgd", case, "sgd_step", sgd.sgd_step, rows, cols, (params, grad, SGD_LR),
                              {"flat": 0, "grad": 1},
                              [sgd.sgd_step_ref64(params, grad, SGD_LR), np.zeros(rows * cols)],
                              4 * 4 * rows * cols, sgd_ref)]


MEMORY_BOUND_BUILDERS = {"elementwise": elementwise_problems, "softmax": softmax_problems,
                         "reduce": reduce_problems, "sgd": sgd_problems}


def op_problems(op: str, quick: bool = False, seed: int = 0) -> list[Problem]:
    """The problems of one op group at the benchmark's shapes (tiny ones with `quick`)."""
    if op == "gemm":
        return gemm_problems(QUICK_GEMM_CASES if quick else GEMM_CASES, seed)
    rng = np.random.default_rng(seed)
    shapes = QUICK_MEMORY_SHAPES if quick else MEMORY_SHAPES
    return [p for case, (rows, cols) in shapes.items() for p in MEMORY_BOUND_BUILDERS[op](rows, cols, case, rng)]


# --------------------------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class Configuration:
    problem: Problem
    variant: str
    block: object


def block_dims(block) -> str:
    return "x".join(str(b) for b in _dims(block))


def block_threads(block) -> int:
    return math.prod(_dims(block))


def _dims(block) -> tuple:
    return tuple(int(b) for b in block) if isinstance(block, tuple) else (int(block),)


def _block_choices(problem: Problem, launcher, blocks):
    """(block, optional) pairs to try. 1-D kernels take every size. A GEMM variant takes its default block
    and, optionally, each size in the default's form (2-D: 32 x threads/32); an optional block the variant
    rejects, or replaces by its own fixed block, is skipped."""
    if problem.op != "gemm":
        return [(block, False) for block in blocks]
    default = inspect.signature(launcher).parameters["block"].default
    choices = [(default, False)]
    for threads in blocks:
        block = (min(threads, WARP), threads // min(threads, WARP)) if isinstance(default, tuple) else threads
        if all(block != chosen for chosen, _ in choices):
            choices.append((block, True))
    return choices


def _label(problem: Problem, variant: str, block) -> str:
    return f"{problem.op}/{variant} block {block_dims(block)} on {problem.case} {problem.shape_label}"


def check_outputs(problem: Problem, label: str, outputs) -> None:
    """Raise BenchMismatch unless every output is within the problem's relative-error limit of its reference."""
    for name, got, expected in zip(problem.output_names, outputs, problem.expected):
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
    """Run every variant x block of every problem once and check it against the reference; stop at the
    first mismatch (BenchMismatch) or rejected block (GpunnError). Returns the validated configurations."""
    stream = cuda.stream()
    validated = []
    for problem in problems:
        for variant, launcher in problem.variants.items():
            for block, optional in _block_choices(problem, launcher, blocks):
                label = _label(problem, variant, block)
                try:
                    launch, outputs = problem.bind(launcher, block, stream)
                except ValueError as exc:
                    if optional:
                        continue
                    raise GpunnError(f"{label}: {exc}") from None
                if optional and _dims(launch.block) != _dims(block):
                    continue  # a fixed-block variant accepted the thread count but runs its own block: a duplicate
                launch()
                stream.synchronize()
                check_outputs(problem, label, [output.copy_to_host() for output in outputs])
                validated.append(Configuration(problem, variant, block))
    log(f"all results match ({len(validated)} configurations)")
    return validated


# --------------------------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class EventClock:
    """How to make, record and wait for timing events: numba's on a stream, or torch's."""

    new_event: Callable
    record: Callable
    synchronize: Callable
    host_clock: bool = False  # the simulator's events carry no time (elapsed_time returns -1)


def numba_clock(stream) -> EventClock:
    return EventClock(cuda.event, lambda event: event.record(stream), stream.synchronize,
                      device.simulator_enabled())


def torch_clock(torch) -> EventClock:
    return EventClock(lambda: torch.cuda.Event(enable_timing=True), lambda event: event.record(),
                      torch.cuda.synchronize)


def _launch_times_ms(launch, count: int, clock: EventClock) -> list[float]:
    events, host_ms = [], []
    for _ in range(count):
        start, end = clock.new_event(), clock.new_event()
        started = time.perf_counter()
        clock.record(start)
        launch()
        clock.record(end)
        host_ms.append(1e3 * (time.perf_counter() - started))
        events.append((start, end))
    clock.synchronize()  # once: the launches queue back to back
    return host_ms if clock.host_clock else [start.elapsed_time(end) for start, end in events]


def median_launch_ms(launch, repeats: int, clock: EventClock, warmup: int = WARMUP_LAUNCHES) -> tuple[float, int]:
    """(median ms of one launch, timed launches): warm-up launches, one probe when there is a choice of
    repeats, then an event pair around each timed launch."""
    for _ in range(warmup):
        launch()
    clock.synchronize()
    if repeats > MIN_REPEATS:
        (probe_ms,) = _launch_times_ms(launch, 1, clock)
        repeats = min(repeats, max(MIN_REPEATS, int(TIME_BUDGET_MS / max(probe_ms, 1e-6))))
    return float(np.median(_launch_times_ms(launch, repeats, clock))), repeats


def time_configuration(config: Configuration, repeats: int, stream) -> tuple[float, int]:
    """(median ms, timed launches) of one validated configuration, on fresh buffers bound to `stream`."""
    launch, _ = config.problem.bind(config.problem.variants[config.variant], config.block, stream)
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


def reference_timing(problem: Problem, repeats: int, torch) -> tuple[str, float]:
    name, run = problem.torch_ref(torch)
    ms, _ = median_launch_ms(run, repeats, torch_clock(torch))
    return name, ms


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
        ms, timed = time_configuration(config, repeats, stream)
        if torch is not None and id(problem) not in references:
            references[id(problem)] = reference_timing(problem, repeats, torch)
        ref_name, ref_ms = references.get(id(problem), (None, None))
        gflops = problem.flops / ms / 1e6 if problem.flops else None
        gbps = None if problem.flops else problem.bytes_moved / ms / 1e6
        pct = 100.0 * ref_ms / ms if ref_ms else None
        rows.append({
            "op": problem.op, "case": problem.case, "variant": config.variant,
            "block": block_threads(config.block), "block_dims": block_dims(config.block), **problem.dims,
            "n_elements": problem.n_elements, "ms": ms, "gflops": gflops, "gbps": gbps, "ref_name": ref_name,
            "ref_ms": ref_ms, "pct_of_ref": pct, "repeats": timed, **provenance_columns,
        })
        rate = f"{gflops:9.1f} GFLOP/s" if gflops is not None else f"{gbps:9.2f} GB/s"
        versus = f"  {pct:6.1f}% of {ref_name}" if pct is not None else ""
        log(f"{problem.op:<11} {problem.shape_label:<22} {config.variant:<15} block {block_dims(config.block):>5}"
            f"  {ms:10.4f} ms  {rate}  ({timed} runs){versus}")
    return rows


def bench_frame(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows).reindex(columns=BENCH_COLUMNS)
    return frame.astype({c: "Int64" for c in ("block", "m", "n", "k", "rows", "cols", "n_elements", "repeats")})


def block_sweep(block_sizes, rows: int, cols: int, repeats: int, seed: int = 0, log=print) -> pd.DataFrame:
    """E3: every memory-bound kernel (elementwise, softmax, column sums, SGD) on (rows, cols) at each block
    size, validated first; one row per kernel x block (columns ``SWEEP_COLUMNS``)."""
    if repeats < 1:
        raise GpunnError(f"sweep: repeats must be at least 1, got {repeats}")
    rng = np.random.default_rng(seed)
    case = f"{rows}x{cols}"
    problems = [p for build in MEMORY_BOUND_BUILDERS.values() for p in build(rows, cols, case, rng)]
    results = benchmark(problems, block_sizes, repeats, log, compare_torch=False)
    return pd.DataFrame(
        [{"op": r["variant"], "block": r["block"], "rows": rows, "cols": cols, "n_elements": r["n_elements"],
          "ms": r["ms"], "gb_per_s": r["gbps"], "repeats": r["repeats"],
          **{key: r[key] for key in provenance.CSV_COLUMNS}} for r in results],
        columns=SWEEP_COLUMNS,
    )


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


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'64x256,8192x4096' -> [(64, 256), (8192, 4096)]."""
    shapes = []
    for item in text.replace(",", " ").split():
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise GpunnError(f"--shapes: expected ROWSxCOLS with positive integers (e.g. 64x256), got '{item}'")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise GpunnError("--shapes: no shape given (e.g. 64x256,8192x4096)")
    return shapes


def log_device_header(log=print) -> None:
    log(device.describe_device())
    if device.simulator_enabled():
        log(SIMULATOR_WARNING)


class BenchParser(OneLineErrorParser):
    """Argument errors as one line: ``gpunn.bench: error: ... (see python -m gpunn.bench --help)``."""

    error_name = "gpunn.bench"


def build_parser() -> argparse.ArgumentParser:
    parser = BenchParser(prog="python -m gpunn.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("op", choices=(*OPS, "all", "mlp"),
                        help="an op family, all of them, or mlp: whole MLP training epochs per variant")
    parser.add_argument("--out", help="output CSV (default results/bench/<op>.csv, one per op with 'all')")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats, blocks 32,64 (simulator tests)")
    parser.add_argument("--repeats", type=int_at_least(1),
                        help=f"timed launches per configuration (default {DEFAULT_REPEATS})")
    parser.add_argument("--blocks", help="block sizes, e.g. 32,64,128 (default 32,...,1024)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    mlp = parser.add_argument_group("mlp: epochs of the 784-hidden-10 MLP on MNIST-shaped random data, PyTorch too")
    mlp.add_argument("--variants", default="gpu-naive,gpu-tiled,gpu-fused,gpu-graph,cpu-numpy",
                     help="training variants (gpunn.backends.registry), comma-separated")
    mlp.add_argument("--samples", type=int_at_least(1), default=60000, help="training samples per epoch")
    mlp.add_argument("--batch", type=int_at_least(1), default=64)
    mlp.add_argument("--hidden", type=int_at_least(1), default=256)
    mlp.add_argument("--epochs", type=int_at_least(1), default=3,
                     help="epochs per variant; the median after the first is kept")
    return parser


def bench_mlp(args) -> pd.DataFrame:
    from gpunn.timing import time_mlp_epochs

    variants = [v for v in args.variants.split(",") if v]
    return time_mlp_epochs(variants, n=args.samples, batch=args.batch, hidden=args.hidden, epochs=args.epochs,
                           seed=args.seed, torch_reference=not device.simulator_enabled())


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device.require_gpu("gpunn.bench")
        blocks = parse_blocks(args.blocks) if args.blocks else list(QUICK_BLOCKS if args.quick else DEFAULT_BLOCKS)
        repeats = args.repeats if args.repeats is not None else QUICK_REPEATS if args.quick else DEFAULT_REPEATS
        if args.op == "mlp":
            for variant in [v for v in args.variants.split(",") if v] or [""]:
                check_variant(variant, "mlp")
        log_device_header()
        with timing_lock(f"python -m gpunn.bench {args.op}"):  # one timed job at a time on this machine
            if args.op == "mlp":
                io.write_csv(args.out or "results/bench/mlp.csv", bench_mlp(args))
                return 0
            frames = []
            for op in OPS if args.op == "all" else (args.op,):
                print(f"== {op}", flush=True)
                frames.append(bench_frame(benchmark(op_problems(op, args.quick, args.seed), blocks, repeats)))
                if not args.out:
                    io.write_csv(f"results/bench/{op}.csv", frames[-1])
        if args.out:
            io.write_csv(args.out, pd.concat(frames, ignore_index=True))
    except GpunnError as exc:
        print(f"gpunn.bench: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
