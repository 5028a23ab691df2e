"""Command line of the kernel benchmarks: ``python -m gpunn.bench <op> ...`` (see gpunn.bench)."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from gpunn import bench, device, io
from gpunn.bench import (
    DEFAULT_BLOCKS,
    DEFAULT_REPEATS,
    OPS,
    QUICK_BLOCKS,
    QUICK_REPEATS,
    bench_frame,
    benchmark,
    log_device_header,
    op_problems,
    parse_blocks,
)
from gpunn.cli import OneLineErrorParser, int_at_least
from gpunn.errors import GpunnError
from gpunn.timing_lock import timing_lock
from gpunn.backends.registry import check_variant


class BenchParser(OneLineErrorParser):
    """Argument errors as one line: ``gpunn.bench: error: ... (see python -m gpunn.bench --help)``."""

    error_name = "gpunn.bench"


def build_parser() -> argparse.ArgumentParser:
    parser = BenchParser(prog="python -m gpunn.bench", description=bench.__doc__.split("\n\n")[0])
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
