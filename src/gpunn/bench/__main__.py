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
from gpunn.backends.registry import VARIANTS, check_variant
from gpunn.timing import EPOCH_MODELS


class BenchParser(OneLineErrorParser):
    """Argument errors as one line: ``gpunn.bench: error: ... (see python -m gpunn.bench --help)``."""

    error_name = "gpunn.bench"


def build_parser() -> argparse.ArgumentParser:
    parser = BenchParser(prog="python -m gpunn.bench", description=bench.__doc__.split("\n\n")[0])
    parser.add_argument("op", choices=(*OPS, "all", *EPOCH_MODELS),
                        help="an op family, all of them, or a model (mlp, cnn): whole training epochs per variant")
    parser.add_argument("--out", help="output CSV (default results/bench/<op>.csv, one per op with 'all')")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats, blocks 32,64 (simulator tests)")
    parser.add_argument("--repeats", type=int_at_least(1),
                        help=f"timed launches per configuration (default {DEFAULT_REPEATS})")
    parser.add_argument("--blocks", help="block sizes, e.g. 32,64,128 (default 32,...,1024)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    mlp = parser.add_argument_group("mlp, cnn: training epochs of the model on MNIST-shaped random data (60 000 x "
                                    "784 or 1x28x28), PyTorch eager and CUDA graph too, from the same weights")
    mlp.add_argument("--variants", help="training variants (gpunn.backends.registry), comma-separated (default: "
                                        "every variant that trains the model, but the single-threaded ones)")
    mlp.add_argument("--samples", type=int_at_least(1), default=60000, help="training samples per epoch")
    mlp.add_argument("--batch", type=int_at_least(1), default=64)
    mlp.add_argument("--hidden", type=int_at_least(1), default=256, help="the MLP's hidden width")
    mlp.add_argument("--epochs", type=int_at_least(1), default=3,
                     help="epochs per variant; the median after the first is kept")
    mlp.add_argument("--profile", action="store_true",
                     help="instead of epochs: each launch of one training step of every GPU variant timed alone "
                          "(GPU time, median of --repeats), written to results/bench/<model>_step.csv")
    return parser


def epoch_variants(args) -> list[str]:
    """--variants, each checked against the model; by default every registered variant that trains it,
    but the single-threaded ones (the serial baseline takes minutes per epoch)."""
    if args.variants is None:
        return [name for name, entry in VARIANTS.items() if args.op in entry.models and not entry.single_thread
                and (entry.simulator or not device.simulator_enabled())]
    variants = [v for v in args.variants.split(",") if v] or [""]
    for variant in variants:
        check_variant(variant, args.op)
    return variants


def bench_epochs(args, variants) -> pd.DataFrame:
    from gpunn.timing import time_epochs

    sizes = {"hidden": args.hidden} if args.op == "mlp" else {}
    return time_epochs(args.op, variants, n=args.samples, batch=args.batch, epochs=args.epochs, seed=args.seed,
                       torch_reference=not device.simulator_enabled(), **sizes)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device.require_gpu("gpunn.bench")
        blocks = parse_blocks(args.blocks) if args.blocks else list(QUICK_BLOCKS if args.quick else DEFAULT_BLOCKS)
        repeats = args.repeats if args.repeats is not None else QUICK_REPEATS if args.quick else DEFAULT_REPEATS
        variants = epoch_variants(args) if args.op in EPOCH_MODELS else None
        log_device_header()
        with timing_lock(f"python -m gpunn.bench {args.op}"):  # one timed job at a time on this machine
            if variants is not None and args.profile:
                from gpunn.timing import step_profile

                gpu = [v for v in variants if VARIANTS[v].gpu]
                sizes = {"hidden": args.hidden} if args.op == "mlp" else {}
                io.write_csv(args.out or f"results/bench/{args.op}_step.csv",
                             step_profile(args.op, gpu, batch=args.batch, repeats=repeats, seed=args.seed, **sizes))
                return 0
            if variants is not None:
                io.write_csv(args.out or f"results/bench/{args.op}.csv", bench_epochs(args, variants))
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
