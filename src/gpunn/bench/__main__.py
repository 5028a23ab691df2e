"""Command line of the kernel benchmarks: ``python -m gpunn.bench <op> ...`` (see gpunn.bench)."""

from __future__ import annotations

import argparse
import inspect
import sys

import pandas as pd

from gpunn import bench, device, io
from gpunn.backends.registry import VARIANTS, check_variant
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
from gpunn.cli import OneLineErrorParser, int_at_least, positive_float, positive_int_list
from gpunn.errors import GpunnError
from gpunn.nn import build_model, model_spec
from gpunn.timing import EPOCH_MODELS, TORCH_SETTINGS
from gpunn.timing_lock import timing_lock


class BenchParser(OneLineErrorParser):
    """Argument errors as one line: ``gpunn.bench: error: ... (see python -m gpunn.bench --help)``."""

    error_name = "gpunn.bench"


def build_parser() -> argparse.ArgumentParser:
    parser = BenchParser(prog="python -m gpunn.bench", description=bench.__doc__.split("\n\n")[0])
    parser.add_argument("op", choices=(*OPS, "all", *EPOCH_MODELS, "mma"),
                        help="an op family, all of them, a model (mlp, cnn, autoencoder): whole training epochs per "
                             "variant, or mma: the tensor cores' MMA rate through gpunn's intrinsics against CUDA C "
                             "and cuBLAS (gpunn.bench.mma_rate)")
    parser.add_argument("--out", help="output CSV (default results/bench/<op>.csv, one per op with 'all')")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats, blocks 32,64 (simulator tests)")
    parser.add_argument("--repeats", type=int_at_least(1),
                        help=f"timed launches per configuration (default {DEFAULT_REPEATS})")
    parser.add_argument("--blocks", help="block sizes, e.g. 32,64,128 (default 32,...,1024)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    epochs = parser.add_argument_group(
        "mlp, cnn, autoencoder: training epochs of the model on random data of its real shapes (MNIST's 60 000 x 784 "
        "or 1x28x28; CIFAR-10's 50 000 x 3x32x32 for the autoencoder, whose target is its input), PyTorch eager and "
        "CUDA graph too (in each --torch-settings), from the same weights, data and batch order")
    epochs.add_argument("--variants", help="training variants (gpunn.backends.registry), comma-separated (default: "
                                           "every variant that trains the model, but the single-threaded ones; for "
                                           "the autoencoder only the GPU ones: cpu-numpy takes hours per epoch)")
    epochs.add_argument("--samples", type=int_at_least(1),
                        help="training samples per epoch (default: the real set's, 60 000 or 50 000)")
    epochs.add_argument("--batch", type=positive_int_list,
                        help="batch sizes, comma-separated (default 64; autoencoder 64,1)")
    epochs.add_argument("--max-steps", type=int_at_least(1),
                        help="time at most this many steps per epoch: an epoch with more (batch 1: one step per "
                             "sample) is timed over its first max-steps x batch samples and scaled by its steps; "
                             "such rows are marked extrapolated (default: whole epochs)")
    epochs.add_argument("--hidden", type=int_at_least(1), help="the MLP's hidden width (default 256)")
    epochs.add_argument("--channels", type=positive_int_list,
                        help="cnn, autoencoder: the convolutions' widths (default 16,32; 256,128)")
    epochs.add_argument("--image-size", type=int_at_least(4),
                        help="cnn, autoencoder: the images' side (default 28; 32)")
    epochs.add_argument("--lr", type=positive_float,
                        help="SGD learning rate (default the experiment's: 0.01; autoencoder 0.002, as E5's "
                             "config: it diverges at 0.01, and a diverged epoch is an error, not a timing)")
    epochs.add_argument("--epochs", type=int_at_least(1), default=3,
                        help="epochs per variant and batch size; the median after the first is kept")
    epochs.add_argument("--torch-settings", type=torch_settings, default=tuple(TORCH_SETTINGS),
                        help="PyTorch's rows, eager and CUDA graph, in each of these settings, comma-separated: fp32 "
                             "(TF32 off everywhere), default (PyTorch's defaults: cuDNN convolutions in TF32), tf32 "
                             "(TF32 everywhere), bf16 (torch.autocast(bfloat16)); default all four")
    epochs.add_argument("--profile", action="store_true",
                        help="instead of epochs: each launch of one training step of every GPU variant timed alone "
                             "(GPU time, median of --repeats), written to results/bench/<model>_step.csv")
    return parser


def torch_settings(text: str) -> tuple:
    """--torch-settings: names of gpunn.timing.TORCH_SETTINGS, comma-separated."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in TORCH_SETTINGS]
    if unknown or not names:
        bad = ", ".join(unknown) if unknown else repr(text)
        raise argparse.ArgumentTypeError(f"unknown setting(s) {bad}; choose from {', '.join(TORCH_SETTINGS)}")
    return names


def epoch_variants(args) -> list[str]:
    """--variants, each checked against the model; by default every registered variant that trains it, but the
    single-threaded ones (the serial baseline takes minutes per epoch) and, for a model whose CPU epoch takes hours
    (EpochModel.cpu_variants false: the autoencoder), the CPU ones. Under the simulator, without what it lacks."""
    if args.variants is None:
        cpu = EPOCH_MODELS[args.op].cpu_variants
        return [name for name, entry in VARIANTS.items() if args.op in entry.models and not entry.single_thread
                and (entry.gpu or cpu) and (entry.simulator or not device.simulator_enabled())]
    variants = [v for v in args.variants.split(",") if v] or [""]
    for variant in variants:
        check_variant(variant, args.op)
    return variants


def model_sizes(args) -> dict:
    """The build_model sizes the options override (--hidden for the MLP; --channels, --image-size for the
    convolutional models), checked by building the model once: a bad size is one GpunnError line."""
    sizes = {}
    takes = inspect.signature(model_spec(args.op).builder).parameters  # the builder's keyword sizes
    if args.hidden is not None:
        if "hidden" not in takes:
            raise GpunnError(f"--hidden sets the MLP's width; {args.op} has --channels")
        sizes["hidden"] = args.hidden
    for key in ("channels", "image_size"):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in takes:
            raise GpunnError(f"--{key.replace('_', '-')} is for cnn and autoencoder; the MLP has --hidden")
        sizes[key] = tuple(value) if key == "channels" else value
    try:
        build_model(args.op, **{**EPOCH_MODELS[args.op].sizes, **sizes})
    except ValueError as exc:
        raise GpunnError(str(exc)) from None
    return sizes


def epoch_batches(args) -> list[int]:
    return list(args.batch) if args.batch else list(EPOCH_MODELS[args.op].batches)


def bench_epochs(args, variants) -> pd.DataFrame:
    from gpunn.timing import time_epochs

    return time_epochs(args.op, variants, n=args.samples, batch=epoch_batches(args), lr=args.lr, epochs=args.epochs,
                       seed=args.seed, torch_reference=not device.simulator_enabled(), max_steps=args.max_steps,
                       torch_settings=args.torch_settings, **model_sizes(args))


def profile_table(frame: pd.DataFrame) -> str:
    """Per variant and batch of a step profile: launches, kernel time (back to back, and each alone summed), step
    wall time, in-loop GPU time, host overhead."""
    lines = [f"{'variant':>14} {'batch':>5} {'launches':>8} {'kernels ms':>10} {'alone sum ms':>12} "
             f"{'step wall ms':>12} {'in-loop GPU ms':>14} {'host overhead us':>16}"]
    for (variant, batch), rows in frame.groupby(["variant", "batch"], sort=False):
        first = rows.iloc[0]
        lines.append(f"{variant:>14} {batch:>5} {len(rows):>8} {first['step_kernels_ms']:10.4f} "
                     f"{first['kernel_ms']:12.4f} {first['step_wall_ms']:12.4f} {first['step_gpu_ms']:14.4f} "
                     f"{first['host_overhead_us']:16.1f}")
    lines.append("kernels: the step's launches run back to back (GPU time, no host gaps); alone sum: each launch "
                 "timed alone, summed; step wall: epoch wall time / steps as the variant's training loop runs them; "
                 "in-loop GPU: events around the forward and backward phases in those steps; host overhead: step "
                 "wall - kernels (host work, copies, waits)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device.require_gpu("gpunn.bench")
        blocks = parse_blocks(args.blocks) if args.blocks else list(QUICK_BLOCKS if args.quick else DEFAULT_BLOCKS)
        repeats = args.repeats if args.repeats is not None else QUICK_REPEATS if args.quick else DEFAULT_REPEATS
        variants = epoch_variants(args) if args.op in EPOCH_MODELS else None
        if variants is not None:
            model_sizes(args)  # a bad size stops here, before the timing lock
        log_device_header()
        with timing_lock(f"python -m gpunn.bench {args.op}"):  # one timed job at a time on this machine
            if args.op == "mma":
                from gpunn.bench import mma_rate

                frame = mma_rate.rate_frame(repeats if args.repeats is not None else mma_rate.REPEATS)
                io.write_csv(args.out or "results/bench/mma.csv", frame)
                return 0
            if variants is not None and args.profile:
                from gpunn.timing import step_profile

                gpu = [v for v in variants if VARIANTS[v].gpu]
                frames = [step_profile(args.op, gpu, batch=batch, repeats=repeats, seed=args.seed, **model_sizes(args))
                          for batch in epoch_batches(args)]
                frame = pd.concat(frames, ignore_index=True)
                print(profile_table(frame), flush=True)
                io.write_csv(args.out or f"results/bench/{args.op}_step.csv", frame)
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
