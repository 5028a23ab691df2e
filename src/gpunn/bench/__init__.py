# ruff: noqa: E402  (blas_idle runs before the imports that load NumPy)
"""Kernel benchmarks in the llm.c ``dev/cuda`` style: validate every version against its float64 reference
first, then time every version x block size with CUDA events, one line each.

    python -m gpunn.bench {gemm,conv,pool,elementwise,softmax,reduce,sgd,all} [--out CSV] [--quick] [--repeats N]
                          [--blocks 32,64,...]
    python -m gpunn.bench {mlp,cnn,autoencoder} [--variants gpu-fused,...] [--samples N] [--batch 64,1]
                          [--epochs 3] [--max-steps N] [--hidden H | --channels C0,C1 --image-size S] [--profile]

What is benchmarked
    gemm         every version in ``gemm.DENSE_LAUNCHERS`` (versions added there are picked up) on 4096^3, the
                 MLP 784-256-10 at batch 64 (both layers' forward with bias (+ ReLU), the weight gradients
                 x^T dy, the hidden-layer input gradient dy W^T) and an odd validation shape 257x129x301.
                 Block sizes: the version's own default block, plus every ``--blocks`` size the version
                 accepts (a 2-D block is laid out 32 x threads/32; fixed-block versions reject the others).
    elementwise  bias_add, relu_forward, relu_backward, bias_relu
    softmax      softmax_rows, softmax_ce_grad (logits and int32 labels), loss_mean (of the batch's losses)
    reduce       colsum_atomic, colsum_tree
    sgd          sgd_step over a flat buffer of rows * cols parameters
    The memory-bound ops run on the MLP's hidden activation 64x256 (launch-bound: what training sees) and
    on a large odd 8191x4099. ``--quick``: tiny shapes, 2 repeats, blocks 32,64 (what the simulator tests run).

How
    1. Validation (``validate``): fixed-seed random non-zero float32 inputs and the float64 reference; for
       every version x block, fresh device inputs, outputs poisoned with NaN (in-place ops overwrite their
       input instead), one launch; the relative error max|out - ref| / max|ref| must stay below the op's
       limit (``TOLERANCE``; GEMM: ``gemm_tolerance``, growing with sqrt(K)). The first mismatch stops
       everything with a ``BenchMismatch`` naming op, version, block and shape and the first differing
       elements. "all results match" is printed before any timing.
    2. Timing (``median_launch_ms``): ``WARMUP_LAUNCHES`` launches (the first one compiles), then
       ``repeats`` launches with a CUDA event pair recorded on the launch's stream around each, one
       synchronisation, the median in ms. A launch slower than ``TIME_BUDGET_MS / repeats`` (naive GEMM at
       4096^3) gets fewer repeats, at least ``MIN_REPEATS``. The timed launches are queued behind a GPU
       hold (``Clock.hold``: a one-thread kernel that sleeps about twice as long as the host takes to issue
       them), so the GPU runs them back to back and each event pair times the GPU's work alone: without
       it, a kernel shorter than the host's launch cost (20-40 us from Python; most kernels at the MLP's
       and the CNN's shapes) leaves the GPU idle between the events, and a version made of two launches
       (split K and its sum) would be charged the host's time between them. ``queued`` in the CSV says the
       whole batch was issued before the hold ended (the hold is lengthened up to ``HOLD_TRIES`` times
       until it is); ``host_ms`` is the host's time to issue one launch, the cost that training pays per
       launch unless the step runs as a CUDA graph.
       GFLOP/s = 2MNK / time (GEMM); GB/s = bytes read plus bytes written, each array counted once, / time
       (memory-bound ops).
    3. Reference: when torch with CUDA is importable, the equivalent torch op (GEMM: torch.matmul / addmm,
       cuBLAS with TF32 off) is timed the same way with torch.cuda.Event; pct_of_ref = 100 * ref_ms / ms.
    Under numba's CUDA simulator events carry no time: the host clock is used instead, and a warning says
    the timings are meaningless; the code path still runs.
    Validation and timing run under the machine-wide timing lock (gpunn.timing_lock: one timed job at a time),
    and every CSV row ends with the provenance columns (gpunn.provenance.CSV_COLUMNS: device by name, thread
    counts, versions, commit).

``mlp``, ``cnn`` and ``autoencoder`` time whole training epochs of the model per variant and batch size
(gpunn.timing.time_epochs: same random data of the real set's shapes, init and batch order for every variant: 60 000
MNIST-shaped samples at batch 64; 50 000 CIFAR-shaped images at batches 64 and 1 for the autoencoder, whose MSE
target is its input; PyTorch eager and CUDA-graph epochs of the same network, loss and initial weights
(gpunn.timing.torch_trainer) in the same run when torch has a GPU, in each setting of --torch-settings (fp32: TF32
off; default: PyTorch's defaults, cuDNN convolutions in TF32; tf32; bf16: torch.autocast), and each variant's ratio
to PyTorch eager in fp32 and to PyTorch's fastest row (named) at that batch size; GPU memory per variant, labelled
with what it measures). A warm-up compiles first; the median epoch after the first is kept. Without --variants:
every registered variant that trains the model, but the single-threaded serial baseline, and for the autoencoder
only the GPU ones (cpu-numpy takes hours per 50 000-image epoch: ask for it with --variants and a small --samples).
``--max-steps N`` times at most N steps of an epoch (batch 1 of the autoencoder is 50 000 steps) and scales the time
by the epoch's steps: those rows say ``extrapolated`` in the CSV and carry a ``*`` in the printed table.

``block_sweep`` is the E3 block-size sweep of the memory-bound kernels (``gpunn sweep-blocks``).

Modules
    core       Problem, the memory-bound problem builder (_launcher_problem), validation, timing (the one event
               clock, gpunn.kernels.launch.Clock), the CSV table (BENCH_COLUMNS), --blocks and the device header
    gemm       GEMM problems (GemmCase, gemm_tolerance)
    conv       convolution problems: every pass and version at the CNN's and the autoencoder's shapes, % of cuDNN
    pool       max-pool, upsample and MSE-head problems at the same shapes
    ops        memory-bound problems: elementwise, softmax, reduce, sgd (MEMORY_BOUND_BUILDERS)
    sweep      the E3 block-size sweep (block_sweep, --shapes)
    __main__   the command line
The names callers use are importable from gpunn.bench itself (__all__): op_problems and OPS (the op families),
and the benchmark's pieces the command line and the tests use (Problem, validate, benchmark, ...); a new family's
problem module builds on gpunn.bench.core (Problem, _launcher_problem, _Output, ...).
"""

from __future__ import annotations

import sys

from gpunn import blas_idle

# `python -m gpunn.bench <op>` loads NumPy here first (Python imports the package, argv[0] still "-m", before its
# __main__): as gpunn's CLI does, before that
if sys.argv[:1] == ["-m"]:
    blas_idle.sleep_when_idle(sys.argv[1:])

import numpy as np

from gpunn.bench.conv import conv_problems
from gpunn.bench.core import (
    BENCH_COLUMNS,
    DEFAULT_BLOCKS,
    DEFAULT_REPEATS,
    QUICK_BLOCKS,
    QUICK_REPEATS,
    TOLERANCE,
    BenchMismatch,
    Problem,
    bench_frame,
    benchmark,
    block_dims,
    log_device_header,
    numba_clock,
    parse_blocks,
    time_configuration,
    validate,
)
from gpunn.bench.gemm import GEMM_CASES, QUICK_GEMM_CASES, gemm_problems, gemm_tolerance
from gpunn.bench.ops import MEMORY_BOUND_BUILDERS, MEMORY_SHAPES, QUICK_MEMORY_SHAPES
from gpunn.bench.pool import pool_problems
from gpunn.bench.sweep import SWEEP_COLUMNS, block_sweep, parse_shapes

__all__ = ["BENCH_COLUMNS", "DEFAULT_BLOCKS", "DEFAULT_REPEATS", "GEMM_CASES", "OPS", "QUICK_BLOCKS",
           "QUICK_GEMM_CASES", "QUICK_REPEATS", "SWEEP_COLUMNS", "TOLERANCE", "BenchMismatch", "Problem",
           "bench_frame", "benchmark", "block_dims", "block_sweep", "gemm_problems", "gemm_tolerance",
           "log_device_header", "numba_clock", "op_problems", "parse_blocks", "parse_shapes", "time_configuration",
           "validate"]

OPS = ("gemm", "conv", "pool", *MEMORY_BOUND_BUILDERS)


def op_problems(op: str, quick: bool = False, seed: int = 0) -> list[Problem]:
    """The problems of one op group at the benchmark's shapes (tiny ones with `quick`)."""
    if op == "gemm":
        return gemm_problems(QUICK_GEMM_CASES if quick else GEMM_CASES, seed)
    if op == "conv":
        return conv_problems(quick, seed)
    if op == "pool":
        return pool_problems(quick, seed)
    rng = np.random.default_rng(seed)
    shapes = QUICK_MEMORY_SHAPES if quick else MEMORY_SHAPES
    return [p for case, (rows, cols) in shapes.items() for p in MEMORY_BOUND_BUILDERS[op](rows, cols, case, rng)]
