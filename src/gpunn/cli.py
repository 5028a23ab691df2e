"""Command line of gpunn: one subcommand per pipeline step. The Snakemake rules call these; they work
just as well by hand. Errors a user can fix print one line (`gpunn: error: ...`) and exit with status 2:
bad arguments too (`gpunn: error: ... (see gpunn COMMAND --help)`, no usage block), numbers checked before
any work. The timed commands (train, svm, time-batches, sweep-blocks, profile) run their timed part under the
machine-wide timing lock (gpunn.timing_lock) and record where their results came from (gpunn.provenance).

    gpunn make-offline NAME --out DIR          write an offline dataset in its true on-disk format
    gpunn download NAME --dest DIR [--mirror M] fetch and md5-verify a dataset's files
    gpunn prepare NAME --raw DIR --out FILE    parse, check and cache a dataset split as arrays
    gpunn train RUN --data FILE --out DIR [--keep-diverged]
                                               train one run (RUN = dataset/split/model/variant/hparams)
    gpunn evaluate --run DIR --data FILE --out DIR
    gpunn features --run DIR --data FILE --out DIR
    gpunn svm --features DIR --out DIR
    gpunn time-batches --variants V.. --batches B.. --out CSV
    gpunn sweep-blocks --blocks 32,64,.. --shapes 64x256,.. --repeats N --out CSV
    gpunn profile --model M --variants V,.. --dataset D --batch B --widths W,.. --out CSV
                                               each launch of one training step of GPU variants, timed alone
    gpunn report EXP --out DIR [--runs ..] [--evals ..] [--timings ..] [--svm ..] [--blocks ..] [--profiles ..]
                     [--jobs ..]
    gpunn index --out DIR --ran E.. [--not-run E=WHY ..] [--note TEXT ..]
                                               the entry page over the experiments' reports in DIR
    gpunn publish --configfile F.. --to DIR [--machine M] [--results DIR] [--readme README.md] [--rebuild]
                                               a run's reports in a folder of the repository, the README's Results
    gpunn captions --out DIR                   the figures' caption files for snakemake --report
    gpunn overlap-check --cpu RUN --cpu-data F --gpu RUN --gpu-data F --out DIR [--threads T] [--repeats 3]
                                               the same runs timed alone and side by side (config key timing)
    gpunn overlap-verdict --results DIR [--out DIR] [--machine M] [--repeats 5] [--max-epoch-s 3]
                                               a finished run's job kinds under overlap against the same runs alone
    gpunn config-doc [--out FILE] [--check]    the configuration reference (docs/configuration.md) from the schema
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from gpunn.errors import GpunnError
from gpunn.heap import keep_freed_memory
from gpunn.orphans import exit_with_snakemake


def _log(message: str) -> None:
    print(message, flush=True)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument error is one line on stderr and exit status 2: ``gpunn: error: MESSAGE (see PROG --help)``,
    without argparse's usage block (PROG names the subcommand: ``gpunn train``)."""

    error_name = "gpunn"

    def error(self, message):
        message = " ".join(str(message).split())
        self.exit(2, f"{self.error_name}: error: {message} (see {self.prog} --help)\n")


def int_at_least(minimum: int, meaning: str = ""):
    """argparse type: an integer >= minimum (`meaning` explains a special value, e.g. '0: all')."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{meaning}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got '{text}'")
    return value


def _gamma(text: str):
    """'scale', 'auto' or a positive number."""
    if text in ("scale", "auto"):
        return text
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'scale', 'auto' or a positive number, got '{text}'") from None


def _train_subset(text: str):
    """'auto' or an integer >= 0 (0: all rows)."""
    if text == "auto":
        return text
    try:
        return int_at_least(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0 (0: all rows), got '{text}'") from None


def positive_int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got '{text}'")
    return values


def _cmd_make_offline(args):
    from gpunn.data.offline import write_offline_dataset

    write_offline_dataset(args.name, args.out, log=_log)


def _cmd_download(args):
    from gpunn.data.download import fetch_dataset

    fetch_dataset(args.name, args.dest, mirrors=args.mirror or (), timeout=args.timeout, log=_log)


def _cmd_prepare(args):
    from gpunn.data.prepare import prepare_dataset

    prepare_dataset(args.name, args.raw, args.out, split=args.split, e2_train=args.e2_train,
                    e2_test=args.e2_test, seed=args.seed, log=_log)


def _cmd_train(args):
    from gpunn.runspec import parse_run_path
    from gpunn.train import train_run

    train_run(parse_run_path(args.run), args.data, args.out, log=_log, progress_every_s=args.progress_every,
              keep_diverged=args.keep_diverged, test_samples=args.test_samples)


def _cmd_overlap_check(args):
    from gpunn.overlap_check import run

    if args.gpus != "auto" and not args.gpus.isdigit():
        raise GpunnError(f"overlap-check --gpus {args.gpus}: give auto or a number")
    run(args, log=_log)


def _cmd_overlap_verdict(args):
    from gpunn.overlap_verdict import run

    if args.gpus != "auto" and not args.gpus.isdigit():
        raise GpunnError(f"overlap-verdict --gpus {args.gpus}: give auto or a number")
    run(args, log=_log)


def _cmd_evaluate(args):
    from gpunn.evaluate import evaluate_run

    evaluate_run(args.run, args.data, args.out, log=_log)


def _cmd_features(args):
    from gpunn.features import extract_features

    extract_features(args.run, args.data, args.out, train_limit=args.train_limit, log=_log)


def _cmd_svm(args):
    from pathlib import Path

    from gpunn.svm import run_svm

    features = Path(args.features)
    run_svm(features / "train_features.npy", features / "train_labels.npy", features / "test_features.npy",
            features / "test_labels.npy", args.out, train_subset=args.train_subset or None,
            test_subset=args.test_subset or None, method=args.method, C=args.C, gamma=args.gamma,
            nystroem_components=args.components, seed=args.seed, kernel_device=args.kernel_device,
            class_names=args.class_names.split(",") if args.class_names else None, log=_log)


def _cmd_time_batches(args):
    from gpunn import io
    from gpunn.backends.registry import check_variant, uses_gpu
    from gpunn.batch_timing import time_batches
    from gpunn.device import simulator_enabled
    from gpunn.timing_lock import timing_lock

    for variant in args.variants:
        check_variant(variant, "mlp")
    simulated = simulator_enabled() and all(uses_gpu(v) for v in args.variants)  # CPU variants' times are real
    with timing_lock(f"gpunn time-batches {','.join(args.variants)}", _log, skip=simulated):
        frame = time_batches(args.variants, args.batches, hidden=args.hidden, in_features=args.features,
                             steps=args.steps, samples=args.samples, timed_epochs=args.timed_epochs,
                             repeats=args.repeats, seed=args.seed, log=_log)
    io.write_csv(args.out, frame)


def _cmd_sweep_blocks(args):
    import pandas as pd

    from gpunn import bench, device, io
    from gpunn.timing_lock import timing_lock

    blocks = bench.parse_blocks(args.blocks)
    shapes = bench.parse_shapes(args.shapes)
    device.require_gpu("sweep-blocks (the E3 block-size sweep of the elementwise, reduction and SGD kernels)")
    bench.log_device_header(_log)
    with timing_lock(f"gpunn sweep-blocks {args.shapes}", _log, skip=device.simulator_enabled()):
        frames = [bench.block_sweep(blocks, rows, cols, args.repeats, log=_log) for rows, cols in shapes]
    io.write_csv(args.out, pd.concat(frames, ignore_index=True))


def _cmd_profile(args):
    from gpunn.profiling import write_step_profile

    write_step_profile(args.model, [v for v in args.variants.split(",") if v], args.dataset, args.widths, args.batch,
                       args.out, repeats=args.repeats, seed=args.seed, log=_log)


def _cmd_report(args):
    from gpunn.report.build import make_report

    make_report(args.experiment, args.out, runs=args.runs, evals=args.evals, timings=args.timings, svm=args.svm,
                blocks=args.blocks, profiles=args.profiles, jobs=args.jobs, verdict=args.verdict)


def _cmd_publish(args):
    from gpunn.publish import load_files, publish

    config = load_files(args.configfile, machine=args.machine, results_dir=args.results)
    publish(config, args.to, readme_path=args.readme, rebuild_reports=args.rebuild, log=_log)


def _cmd_index(args):
    from gpunn.report import index

    not_run = {}
    for item in args.not_run:
        experiment, sep, why = item.partition("=")
        if not sep or not why:
            raise GpunnError(f"--not-run '{item}': write EXPERIMENT=REASON, e.g. e5='experiments.e5.enabled is false'")
        not_run[experiment] = why
    paths = index.write(args.out, args.ran, not_run, notes=args.note, machine=args.machine)
    _log(f"wrote {paths['index.md']} ({len(args.ran)} experiment report(s), {len(not_run)} not run)")


def _cmd_captions(args):
    from gpunn import experiments
    from gpunn.report import captions

    written = captions.write_rst(args.out, {e.name: e.captions for e in experiments.ALL})
    _log(f"wrote {len(written)} caption files into {args.out}")


def _cmd_config_doc(args):
    from gpunn import configdoc

    path = args.out or configdoc.DOC_PATH
    if args.check:
        configdoc.check(path)
        _log(f"{configdoc.shown(path)} is up to date")
    else:
        _log(f"wrote {configdoc.shown(configdoc.write(path))}")


def _cmd_kernel_cache(args):
    from gpunn import kernel_cache

    kernel_cache.main(clear=args.clear, log=_log)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="gpunn", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineErrorParser)

    p = sub.add_parser("make-offline", help="write an offline dataset (synthetic_*, digits*) in its true format")
    p.add_argument("name")
    p.add_argument("--out", required=True, help="directory to write the files and manifest.json into")
    p.set_defaults(func=_cmd_make_offline)

    p = sub.add_parser("download", help="fetch a dataset's files with md5 verification, trying mirrors in order")
    p.add_argument("name")
    p.add_argument("--dest", required=True, help="directory for the verified files and manifest.json")
    p.add_argument("--mirror", action="append", help="local directory or URL base tried first (repeatable)")
    p.add_argument("--timeout", type=positive_float, default=30.0, help="seconds per connection attempt (default 30)")
    p.set_defaults(func=_cmd_download)

    p = sub.add_parser("prepare", help="parse a downloaded dataset and cache one split as arrays (.npz)")
    p.add_argument("name")
    p.add_argument("--raw", required=True, help="directory with the downloaded files")
    p.add_argument("--out", required=True, help="output .npz")
    p.add_argument("--split", choices=("standard", "e2"), default="standard")
    p.add_argument("--e2-train", type=int_at_least(1), default=37800, help="E2 split: training samples (default 37800)")
    p.add_argument("--e2-test", type=int_at_least(1), default=4200, help="E2 split: test samples (default 4200)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="E2 split: shuffle seed (default 0)")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("train", help="train one run")
    p.add_argument("run", help="dataset/split/model/variant/hparams, "
                               "e.g. mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0")
    p.add_argument("--data", required=True, help="prepared .npz of the run's dataset and split")
    p.add_argument("--out", required=True, help="run directory for metrics.csv, metrics.json, weights.npz")
    p.add_argument("--progress-every", type=positive_float, default=15.0,
                   help="seconds between progress lines inside an epoch")
    p.add_argument("--keep-diverged", action="store_true",
                   help="a diverged run (a non-finite loss, or an epoch's train loss over gpunn.epochs."
                        "DIVERGENCE_FACTOR times the first's) trains on and is written, marked diverged, instead of "
                        "stopping with an error")
    p.add_argument("--test-samples", type=int_at_least(1), default=0,
                   help="test on the first N test samples only (default: all; overlap-verdict's runs)")
    p.set_defaults(func=_cmd_train)

    for name, func, help_text in (("evaluate", _cmd_evaluate, "test-set metrics, predictions and samples of a run"),
                                  ("features", _cmd_features, "encoder features (.npy) of an autoencoder run")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--run", required=True, help="run directory (with weights.npz)")
        p.add_argument("--data", required=True, help="prepared .npz")
        p.add_argument("--out", required=True, help="output directory")
        if name == "features":
            p.add_argument("--train-limit", type=int_at_least(0, " (0: all)"), default=0,
                           help="encode only the first N training images (0: all)")
        p.set_defaults(func=func)

    p = sub.add_parser("svm", help="StandardScaler + RBF SVM on encoder features")
    p.add_argument("--features", required=True, help="directory with {train,test}_{features,labels}.npy")
    p.add_argument("--out", required=True)
    p.add_argument("--train-subset", type=_train_subset, default="auto",
                   help="stratified training subset size (0: all; auto, the default: all rows when the GPU "
                        "computes the kernel and its float64 matrix fits in memory, else 5000)")
    p.add_argument("--test-subset", type=int_at_least(0, " (0: all)"), default=0,
                   help="stratified test subset size (0: all)")
    p.add_argument("--method", choices=("exact", "nystroem", "gpu-smo"), default="exact",
                   help="exact SVC (libsvm), the approximate Nystroem + linear SVM route for large sets, or gpu-smo "
                        "(SVC's model solved on the GPU by gpunn.smo)")
    p.add_argument("--C", type=positive_float, default=10.0)
    p.add_argument("--gamma", type=_gamma, default="scale", help="'scale', 'auto' or a positive number")
    p.add_argument("--components", type=int_at_least(1), default=2000, help="Nystroem components")
    p.add_argument("--kernel-device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where the exact route's precomputed RBF kernel is computed (auto: the GPU when a real "
                        "one is present, else CPU BLAS; gpu under NUMBA_ENABLE_CUDASIM=1 for tiny sizes only)")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--class-names", default="", help="comma-separated class names")
    p.set_defaults(func=_cmd_svm)

    p = sub.add_parser("time-batches", help="E3: MLP step throughput, forward/backward split, latency per batch")
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--batches", type=positive_int_list, required=True, help="e.g. 1,8,32,128,512")
    p.add_argument("--hidden", type=int_at_least(1), default=256)
    p.add_argument("--features", type=int_at_least(1), default=784, help="inputs of the timed MLP (784: MNIST)")
    p.add_argument("--steps", type=int_at_least(1), default=100,
                   help="throughput: steps per timed epoch, run back to back (default 100)")
    p.add_argument("--samples", type=int_at_least(0), default=0,
                   help="throughput: at most this many samples per epoch, in whole batches (fewer steps at large "
                        "batches; 0: no cap, the default)")
    p.add_argument("--timed-epochs", type=int_at_least(1), default=3,
                   help="throughput: epochs timed after an untimed one, median (default 3)")
    p.add_argument("--repeats", type=int_at_least(1), default=20,
                   help="latency: synchronous steps timed one by one (default 20)")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--out", required=True, help="output CSV")
    p.set_defaults(func=_cmd_time_batches)

    p = sub.add_parser("sweep-blocks", help="E3: elementwise, reduction and SGD kernel time per block size (validated)")
    p.add_argument("--blocks", required=True, help="block sizes, powers of two up to 1024, e.g. 32,64,128,256,512,1024")
    p.add_argument("--shapes", required=True, help="ROWSxCOLS shapes, e.g. 64x256,8192x4096")
    p.add_argument("--repeats", type=int_at_least(1), default=50,
                   help="timed launches per kernel and block (default 50)")
    p.add_argument("--out", required=True, help="output CSV (all shapes)")
    p.set_defaults(func=_cmd_sweep_blocks)

    p = sub.add_parser("profile", help="E1, E4, E5: each launch of one training step of GPU variants, timed alone "
                                       "(launches listed without times under the CUDA simulator)")
    p.add_argument("--model", choices=("mlp", "cnn", "autoencoder"), required=True)
    p.add_argument("--variants", required=True, help="GPU variants, comma-separated, e.g. gpu-naive,gpu-tiled")
    p.add_argument("--dataset", required=True, help="the dataset whose sample shape and classes the model takes")
    p.add_argument("--batch", type=int_at_least(1), required=True)
    p.add_argument("--widths", type=positive_int_list, required=True,
                   help="mlp: the hidden width; cnn, autoencoder: the two convolutions' channels, e.g. 16,32")
    p.add_argument("--repeats", type=int_at_least(1), default=50, help="timed launches per launch (default 50)")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--out", required=True, help="output CSV, one row per launch")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("report", help="summary table and figures of one experiment (gpunn.experiments: e1, e2, ...)")
    p.add_argument("experiment")
    p.add_argument("--out", required=True, help="output directory")
    for option in ("runs", "evals", "timings", "svm"):
        p.add_argument(f"--{option}", nargs="*", default=[])
    p.add_argument("--blocks", nargs="*", default=[], help="E3: block-size sweep CSV(s) (results/timing/e3/blocks.csv)")
    p.add_argument("--profiles", nargs="*", default=[],
                   help="E1, E4, E5: step profile CSV(s), one per GPU variant (results/profile/<machine>/eN/)")
    p.add_argument("--jobs", nargs="*", default=[],
                   help="the benchmark files (results/benchmarks/...tsv) of the jobs the report depends on: "
                        "jobs.csv/.md")
    p.add_argument("--verdict", nargs="*", default=[],
                   help="gpunn overlap-verdict's verdict.json of a run timed under overlap: its clocks compare like "
                        "isolated ones when every job kind was within its noise")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("index", help="the report's entry page (index.md, .csv, .rst) over the experiments' reports")
    p.add_argument("--out", required=True, help="the machine's report folder, holding e1/ .. e6/")
    p.add_argument("--ran", nargs="*", default=[], help="experiments whose report folders to read (e1 .. e6)")
    p.add_argument("--not-run", nargs="*", default=[], metavar="E=WHY",
                   help="experiments that did not run, with the reason (e5='experiments.e5.enabled is false')")
    p.add_argument("--note", nargs="*", default=[], help="lines stated under the summary table")
    p.add_argument("--machine", default="", help="the machine's name, for the page title")
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("overlap-check", help="the same training runs timed alone and side by side (timing: overlap), "
                                             "with the run-to-run noise")
    p.add_argument("--cpu", required=True, help="the CPU-timed run, e.g. mnist/standard/cnn/cpu-numpy/"
                                                "w16-32_b64_lr0.01_e1_s0_n20000")
    p.add_argument("--cpu-data", required=True, help="prepared .npz of the CPU run's dataset")
    p.add_argument("--gpu", required=True, help="the GPU-timed run, e.g. synthetic_cifar10/standard/autoencoder/"
                                                "gpu-graph/w256-128_b64_lr0.002_e6_s0")
    p.add_argument("--gpu-data", required=True, help="prepared .npz of the GPU run's dataset")
    p.add_argument("--threads", type=int_at_least(1), default=14, help="the CPU run's threads and cores (default 14)")
    p.add_argument("--gpus", default="auto", help="auto (every GPU found) or N: with two, two GPU runs at once too")
    p.add_argument("--repeats", type=int_at_least(2), default=3, help="repeats of every scenario (default 3)")
    p.add_argument("--scenario", choices=("all", "cpu", "gpu", "placement", "untimed"), default="all",
                   help="cpu: the CPU run beside the GPU run; gpu: two GPU runs on two GPUs; all: both; placement: "
                        "each run alone, placed as under timing: overlap against unplaced; untimed: the CPU run "
                        "beside an untimed run on the other cores")
    p.add_argument("--neighbour", default=None, help="--scenario untimed: the untimed run (default: the CPU run)")
    p.add_argument("--neighbour-data", default=None, help="prepared .npz of --neighbour (default: --cpu-data)")
    p.add_argument("--neighbour-threads", type=int_at_least(1), default=None,
                   help="--scenario untimed: the untimed run's threads and cores (default: every core the CPU run "
                        "leaves)")
    p.add_argument("--out", required=True, help="folder for overlap.csv, overlap.md and the runs")
    p.set_defaults(func=_cmd_overlap_check)

    p = sub.add_parser("overlap-verdict", help="a finished run's every job kind timed under overlap against the "
                                               "same run timed alone: is timing: overlap honest on this machine?")
    p.add_argument("--results", required=True, help="the finished run's results tree (its runs/ and data/prepared/)")
    p.add_argument("--machine", default=None, help="its machine folder under runs/ (default: the only one there)")
    p.add_argument("--repeats", type=int_at_least(3), default=5,
                   help="rounds of alone runs, each timing every job kind once (default 5)")
    p.add_argument("--max-epoch-s", type=positive_float, default=3.0,
                   help="an alone run trains as many of the run's epochs as fit in this, a longer epoch on a subset "
                        "that keeps it near this (default 3 s)")
    p.add_argument("--threads", type=int_at_least(1), default=None,
                   help="every alone run's threads (default: the most any of the run's jobs had)")
    p.add_argument("--gpus", default="auto", help="auto (the GPUs found) or N; the alone GPU runs use the first")
    p.add_argument("--out", default=None, help="folder for verdict.csv, .md, .json and the alone runs (default: "
                                                "<results>/overlap-verdict/<machine>, where the reports read it)")
    p.set_defaults(func=_cmd_overlap_verdict)

    p = sub.add_parser("publish", help="copy a run's reports (tables, PNG figures) into a folder of the repository, "
                                        "build the entry page there and write the README's Results section from it")
    p.add_argument("--configfile", nargs="*", default=[],
                   help="the config file(s) the run used, as given to snakemake (config/config.yaml is the base)")
    p.add_argument("--machine", default=None,
                   help="the run's machine folder (e.g. nvidia-h100-80gb-hbm3); default: this machine's")
    p.add_argument("--results", default=None, help="the results tree (default: the config's results_dir)")
    p.add_argument("--to", required=True, help="the published folder, e.g. docs/results/<machine>")
    p.add_argument("--readme", default=None, help="a README whose generated Results section to rewrite")
    p.add_argument("--rebuild", action="store_true",
                   help="first rebuild every report and the entry page from the run folders (a run split over "
                        "several machines or sittings, its returned results trees merged)")
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("captions", help="write the report figures' caption files (reStructuredText)")
    p.add_argument("--out", required=True, help="folder, e.g. workflow/report/captions")
    p.set_defaults(func=_cmd_captions)

    p = sub.add_parser("kernel-cache", help="where compiled GPU kernels are kept between jobs (gpunn.kernel_cache), "
                                            "and what it holds")
    p.add_argument("--clear", action="store_true", help="remove the cache (the next GPU jobs compile again)")
    p.set_defaults(func=_cmd_kernel_cache)

    p = sub.add_parser("config-doc", help="write the configuration reference (every config key, the datasets and "
                                          "variants) from the config schema and the registries (gpunn.configdoc)")
    p.add_argument("--out", default=None, help="the page (default: the repository's docs/configuration.md)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit with one error line when the page differs from what would be written")
    p.set_defaults(func=_cmd_config_doc)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    keep_freed_memory()  # a job's NumPy buffers reused, not faulted in afresh every step (not in API users' sessions)
    exit_with_snakemake()  # a job whose Snakemake was killed ends too (gpunn.orphans)
    try:
        args.func(args)
    except GpunnError as exc:
        print(f"gpunn: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("gpunn: interrupted", file=sys.stderr)
        return 130
    _log(f"gpunn {args.command}: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
