"""Report of each experiment E1..E6: a summary table (CSV + Markdown) and its figures, built from the
outputs of finished runs, and paper_vs_ours (CSV + Markdown): the seed's numbers (gpunn.report.papers) beside ours
(gpunn.report.paper_vs_ours).

    e1  MLP per variant and loss reduction (mean, sum): time, time per epoch, accuracy, speedups and accuracy
        difference to cpu-numpy of the same reduction; loss curves; time per epoch (bars); sample predictions;
        seed 000's CPU-GPU accuracy gap tested against the loss reduction (gap.md: e1_gap_sentence and its runs;
        reduction_gap figure: their train loss per epoch beside the seed's)
    e2  MLP hidden x batch sweep on the e2 split: train / forward / backward time, accuracy, speedups
        (tidy summary, and the papers' wide layout in paper_table); heatmaps; training, forward and
        backward time against hidden size
    e3  MLP step per batch size and variant: throughput (ms per step, samples/s), forward / backward split, latency
        (gpunn.batch_timing); with --blocks, the kernels' time per block size (blocks table: the fastest block per
        op and shape; block_sweep figure)
    e4  CNN on MNIST and Fashion-MNIST: training / testing time, accuracy, speedups over cpu-numpy and gpu-naive,
        accuracy difference to cpu-numpy per variant and dataset (summary; paper_table in seed 001's Tables 3-6
        layout); cumulative training time and loss per epoch (its Figures 1-2); sample predictions; with a
        block-size study (runs with a block), time, loss and accuracy per variant and block size (blocks table;
        block_time and block_loss figures: its Figures 3-4)
    e5  autoencoder: epoch time, its full-set (50 000-image) epoch, measured or extrapolated as seed 004 did its
        CPU's, speedups over cpu-numpy and gpu-naive per full-set epoch, train / test MSE, peak GPU memory
        (summary; paper_table in its sections 2.4 and 3.1 layout); train and test MSE per epoch; the first test
        image of each class and its reconstruction; training time and speedup per variant (its section 3.2)
    e6  SVM on encoder features: accuracy, per-class accuracy, fit time; the confusion matrix of the first SVM
        run (from the svm step's confusion.csv)
    e1, e4 and e5 with step profiles (--profiles): where each GPU variant's training step spends its time
        (gpunn.report.step_profile: step_profile.png, step_profile.csv/.md)

Titles are built from the rows shown (gpunn.report.titles): model widths, dataset, split sizes, batch and
epochs as run, the device that timed them and, for anything timed under the CUDA simulator, a warning that its
timings are not meaningful. Every table with timings has `device` and `simulator` columns; every figure is written as
PNG and as PDF. Each report ends with provenance.json (gpunn.report.sources): the devices, drivers, package
versions and commits of its inputs. make_report returns the title of every table and figure it wrote, by file name.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn import io
from gpunn.backends.registry import uses_gpu
from gpunn.errors import GpunnError
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.report import (divergence, figures, job_times, paper_vs_ours, papers, sources, step_profile, tables,
                          titles)
from gpunn.report.tables import format_ratio, ordered_variants
from gpunn.runspec import RunSpec, format_widths, parse_run_path
from gpunn.targets import REPORT_PROVENANCE


_read_json = sources.read_json  # one reader, one error line, for every report input


def run_row(run_dir) -> dict:
    """One tidy row describing a finished training run."""
    path = Path(run_dir) / "metrics.json"
    summary = _read_json(path)
    try:
        return _run_row(summary)
    except KeyError as exc:
        raise GpunnError(f"{path}: lacks key {exc}; rerun its training step") from None
    except GpunnError as exc:  # a spec the run path grammar no longer reads
        raise GpunnError(f"{path}: {exc}; rerun its training step") from None


def _run_row(summary: dict) -> dict:
    """The spec, sizes, times and final metrics of a run; its device and whether it ran under the simulator
    (unknown and false for runs recorded before metrics.json had provenance); the MLP's input and output sizes
    for titles. The testing time is None for runs recorded before it was measured; the peak GPU memory in bytes
    is None where the run did not record it (CPU variants, the simulator, older runs); whether it diverged and
    ended at chance (gpunn.report.divergence)."""
    spec = RunSpec.from_dict(summary["spec"])
    return {
        "dataset": spec.dataset, "split": spec.split, "model": spec.model, "variant": spec.variant,
        "widths": format_widths(spec.widths), "batch": spec.batch, "lr": spec.lr,
        "epochs": spec.epochs, "seed": spec.seed, "n_train": summary["n_train"], "n_test": summary["n_test"],
        "parameters": summary["num_parameters"], "train_time_s": summary["total_train_time_s"],
        "time_per_epoch_s": summary["mean_epoch_time_s"], "test_time_s": summary.get("test_time_s"),
        "block": spec.block, "reduction": spec.reduction, "forward_time_s": summary["forward_time_s"],
        "backward_time_s": summary["backward_time_s"], "final_train_loss": summary["final_train_loss"],
        "test_loss": summary["final_test_loss"], "test_accuracy": summary["final_test_accuracy"],
        **titles.device_fields(summary.get("provenance")),
        "in_features": titles.mlp_in_features(summary, spec.widths[0]) if spec.model == "mlp" else None,
        "classes": summary.get("num_classes"),
        "peak_gpu_memory_bytes": summary.get("peak_gpu_memory_bytes"),
        **divergence.run_fields(summary),
    }


BASELINES = ("cpu-serial", "cpu-numpy")
# A correct port matches the reference's test accuracy; E1's paper lost 4 pp on the GPU.
ACCURACY_TOLERANCE_PP = 0.1


def _speedup_column(baseline: str) -> str:
    return f"speedup_vs_{baseline.replace('-', '_')}"


def baseline_value(frame: pd.DataFrame, baseline: str, column: str, keys: Sequence[str]) -> pd.Series:
    """For every row, `column` of the `baseline` variant's run with the same `keys`; NaN where it did not run."""
    of_baseline = frame[column].where(frame["variant"] == baseline)
    return of_baseline.groupby([frame[k] for k in keys]).transform("first")


def add_baseline_comparisons(frame: pd.DataFrame, keys: Sequence[str],
                             baselines: Sequence[str] = BASELINES) -> pd.DataFrame:
    """Speedup in training time over each of the `baselines` (default: the CPU ones) run with the same `keys`,
    and the test-accuracy comparison with cpu-numpy's run (add_accuracy_comparison); NaN without the baseline."""
    frame = frame.copy()
    for baseline in baselines:
        frame[_speedup_column(baseline)] = baseline_value(frame, baseline, "train_time_s", keys) / frame["train_time_s"]
    return add_accuracy_comparison(frame, baseline_value(frame, "cpu-numpy", "test_accuracy", keys))


def add_accuracy_comparison(frame: pd.DataFrame, reference: pd.Series) -> pd.DataFrame:
    """`frame` with the test-accuracy difference to `reference` (cpu-numpy's accuracy for each row, NaN where it
    did not run) in percentage points, and whether it is within ACCURACY_TOLERANCE_PP."""
    diff = 100.0 * (frame["test_accuracy"] - reference)
    # accuracies are counts / n: allow for the rounding of their difference
    matches = [None if pd.isna(d) else bool(abs(d) <= ACCURACY_TOLERANCE_PP + 1e-9) for d in diff]
    return frame.assign(accuracy_diff_vs_cpu_numpy_pp=diff, accuracy_matches_cpu_numpy=matches)


def _sorted(frame: pd.DataFrame, columns: Sequence[str], appearance: Sequence[str] = ()) -> pd.DataFrame:
    """Rows ordered by `columns`, the variant column in report order (baselines first), not alphabetically, and
    the columns in `appearance` in the order their values first appear (the config's order of datasets)."""
    ranks = {"variant": {v: i for i, v in enumerate(ordered_variants(frame["variant"]))}}
    ranks.update({c: {v: i for i, v in enumerate(dict.fromkeys(frame[c]))} for c in appearance})
    return frame.sort_values(list(columns), key=lambda col: col.map(ranks[col.name]) if col.name in ranks else col,
                             kind="stable").reset_index(drop=True)


def _one_run_each(frame: pd.DataFrame, experiment: str, keys: Sequence[str]) -> None:
    """Refuse two runs of one variant with the same `keys`: a table or figure would show one of them."""
    repeated = frame[frame.duplicated(["variant", *keys])]
    if not repeated.empty:
        first = repeated.iloc[0]
        at = ", ".join(f"{k} {first[k]}" for k in keys)
        raise GpunnError(f"{experiment} has two runs of {first['variant']} at {at}; "
                         f"keep one per variant, {titles.join_words(keys)}")


def _times(value) -> str:
    return format_ratio(value)


def comparison_formats(baselines: Sequence[str] = BASELINES) -> dict:
    """Markdown formats of add_baseline_comparisons' columns: speedups as '125x', differences as '+0.05'."""
    return {_speedup_column(b): _times for b in baselines} | {"accuracy_diff_vs_cpu_numpy_pp": "{:+.2f}"}


COMPARISON_FORMATS = comparison_formats()
# The columns of each summary's Markdown (MARKDOWN_COLUMNS at most; the CSV keeps every one): the settings that
# the title states (dataset, widths, batch, epochs) and the simulator flag (the device says it) are left out.
E1_SHOWN = ("variant", "reduction", "device", "train_time_s", "time_per_epoch_s", "test_accuracy",
            "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy", "diverged", "at_chance")
E2_SHOWN = ("variant", "device", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "diverged", "at_chance")
E3_SHOWN = ("variant", "device", "batch", "steps", "throughput_step_ms", "throughput_samples_per_s", "forward_ms",
            "backward_ms", "clock", "latency_ms")
E4_SHOWN = ("dataset", "variant", "device", "train_time_s", "test_time_s", "test_accuracy", "speedup_vs_cpu_numpy",
            "speedup_vs_gpu_naive", "accuracy_diff_vs_cpu_numpy_pp", "accuracy_matches_cpu_numpy", "diverged",
            "at_chance")
E4_BLOCK_SHOWN = ("dataset", "variant", "block", "device", "time_per_epoch_s", "train_time_s", "final_train_loss",
                  "test_accuracy", "accuracy_diff_vs_cpu_numpy_pp", "accuracy_matches_cpu_numpy", "diverged",
                  "at_chance")
E5_SHOWN = ("variant", "device", "n_train", "time_per_epoch_s", "full_epoch_s", "full_set_extrapolated",
            "full_train_time_s", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive", "test_mse", "peak_gpu_memory_mib",
            "diverged")
E6_SHOWN = ("method", "device", "kernel_device", "C", "gamma", "n_train", "n_test", "train_accuracy", "test_accuracy",
            "kernel_time_s", "fit_time_s", "predict_time_s")
COMPARISON_NOTE = ("Speedup: the baseline's training time over the variant's, on the same data with the same "
                   "settings. accuracy_diff_vs_cpu_numpy_pp: test accuracy minus cpu-numpy's in percentage points; "
                   f"accuracy_matches_cpu_numpy: within {ACCURACY_TOLERANCE_PP} pp. '-': that baseline did not run.")


def _note(*lines: str | None) -> str:
    return "\n\n".join(line for line in lines if line)


def _samples_missing(path: Path, out_png) -> bool:
    """True when an evaluation's samples.npz is missing but the figure drawn from it is there: a results tree returned
    from another machine without its .npz files, whose report job drew the figure (gpunn publish --rebuild keeps it);
    a missing samples.npz without the figure is one error line."""
    if path.is_file():
        return False
    if Path(out_png).is_file():
        print(f"gpunn report: kept {out_png}: {path} is not here (a results tree returned without .npz files)",
              file=sys.stderr)
        return True
    raise GpunnError(f"{path}: missing; run the evaluate step first")


def _samples_figure(eval_dir, out_png, title) -> None:
    path = Path(eval_dir) / "samples.npz"
    if _samples_missing(path, out_png):
        return
    with np.load(path, allow_pickle=False) as saved:
        if "reconstructions" in saved:
            figures.reconstruction_grid(saved["images"], saved["reconstructions"], out_png, title)
        else:
            figures.sample_classifications(saved["images"], saved["labels"], saved["predictions"],
                                           [str(c) for c in saved["class_names"]], out_png, title)


def _metrics_paths(runs) -> list[Path]:
    return [Path(r) / "metrics.csv" for r in runs]


REDUCTION_NOTE = ("reduction: the loss gradient of the batch mean (mean) or of the summed per-sample losses (sum, "
                  "a step batch times larger at the same lr); each run is compared with the baselines trained with "
                  "its reduction. Losses are per-sample means either way.")


# Seed 000's CPU-GPU accuracy gap (97.93 % against 93.86 %): its CPU curve looks like a gradient summed over the
# batch, its GPU's like the batch mean. Its CPU and GPU designs, each run under both reductions, test that.
GAP_PHASES = ("CPU", "GPU")
GAP_REDUCTIONS = ("mean", "sum")


def _gap_candidates(variants, phase: str) -> list[str]:
    """The variants among `variants` that stand for seed 000's `phase`, preferred first: its own designs
    (papers.PHASES: cpu-serial, then cpu-numpy; gpu-naive), then, for the GPU, every other GPU variant in report
    order."""
    ours = papers.PHASES[papers.SEED_E1][phase]
    others = [v for v in ordered_variants(variants) if phase == "GPU" and v not in ours and uses_gpu(v)]
    return [v for v in (*ours, *others) if v in set(variants)]


def e1_gap_runs(frame: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """The runs that test seed 000's CPU-GPU gap by (phase, reduction), CPU then GPU, mean then sum; a pair that did
    not run is absent. Each phase takes one variant, its runs under both reductions: of _gap_candidates, the first
    that ran with the most of them (cpu-serial, else cpu-numpy; gpu-naive, else the first GPU variant in report
    order). `frame`: E1's rows (run_row's, or summary.csv's) with variant, test_accuracy and reduction (a table
    without it: the mean's)."""
    reductions = (frame["reduction"].fillna(DEFAULT_REDUCTION) if "reduction" in frame
                  else pd.Series(DEFAULT_REDUCTION, index=frame.index))
    ran = {v: set(reductions[frame["variant"] == v]) for v in titles.distinct(frame["variant"])}
    chosen = {}
    for phase in GAP_PHASES:
        candidates = _gap_candidates(list(ran), phase)
        if not candidates:
            continue
        variant = max(candidates, key=lambda v: len(ran[v] & set(GAP_REDUCTIONS)))  # ties: the first
        for reduction in GAP_REDUCTIONS:
            rows = frame[(frame["variant"] == variant) & (reductions == reduction)]
            if not rows.empty:
                chosen[(phase, reduction)] = rows.iloc[0]
    return chosen


def _gap_missing(frame: pd.DataFrame, gap_runs: dict) -> str | None:
    """Why E1's runs cannot test the gap, and what to configure; None when they can."""
    ran = titles.join_words(titles.distinct(frame["variant"]))
    phases = {phase for phase, _ in gap_runs}
    if "CPU" not in phases:
        return f"no CPU baseline ran (E1 ran {ran}); add cpu-serial or cpu-numpy to experiments.e1.variants"
    if "GPU" not in phases:
        return f"no GPU variant ran (E1 ran {ran}); add gpu-naive (or another GPU variant) to experiments.e1.variants"
    reductions = titles.distinct(reduction for _, reduction in gap_runs)
    if len(reductions) < len(GAP_REDUCTIONS):
        return (f"E1 ran only with reduction {titles.join_words(reductions)}; set experiments.e1.reductions to "
                f"[{', '.join(GAP_REDUCTIONS)}]")
    variant_of = {phase: row["variant"] for (phase, _), row in gap_runs.items()}
    absent = [f"{variant_of[p]} with reduction {r}" for p in GAP_PHASES for r in GAP_REDUCTIONS
              if (p, r) not in gap_runs]
    if absent:
        return (f"no run of {titles.join_words(absent)} among the report's inputs; rerun E1 so that both have a "
                "run with every reduction")
    return None


def _gap_absent(gap_runs: dict) -> list[str]:
    """What reduction_gap.png lacks: 'any GPU run', 'the sum runs', 'gpu-naive (sum)'."""
    phases = titles.distinct(phase for phase, _ in gap_runs)
    reductions = titles.distinct(reduction for _, reduction in gap_runs)
    variant_of = {phase: row["variant"] for (phase, _), row in gap_runs.items()}
    return ([f"any {p} run" for p in GAP_PHASES if p not in phases]
            + [f"the {r} runs" for r in GAP_REDUCTIONS if r not in reductions]
            + [f"{variant_of[p]} ({r})" for p in phases for r in reductions if (p, r) not in gap_runs])


def e1_gap_sentence(frame: pd.DataFrame) -> str:
    """One sentence on what E1's runs say about seed 000's CPU-GPU accuracy gap, from the runs of e1_gap_runs:
    whether our CPU and GPU runs agree within ACCURACY_TOLERANCE_PP under each reduction and how far the sum's
    accuracy lies from the mean's; where the data does not support the gap following the reduction (the devices
    differ, or the reductions do not), it says so; where the runs cannot test it, why and what to configure.
    `frame`: as e1_gap_runs takes it (E1's summary frame or summary.csv)."""
    seed_gap = papers.paper_value("e1", "accuracy_gap").text
    gap_runs = e1_gap_runs(frame)
    missing = _gap_missing(frame, gap_runs)
    if missing:
        return f"Seed 000's {seed_gap}-point CPU-GPU accuracy gap cannot be tested here: {missing}."
    accuracy = {key: 100.0 * float(row["test_accuracy"]) for key, row in gap_runs.items()}
    cpu, gpu = gap_runs[("CPU", "mean")]["variant"], gap_runs[("GPU", "mean")]["variant"]
    device_diff = {r: accuracy[("GPU", r)] - accuracy[("CPU", r)] for r in GAP_REDUCTIONS}
    reduction_diff = {p: accuracy[(p, "sum")] - accuracy[(p, "mean")] for p in GAP_PHASES}
    tolerance = ACCURACY_TOLERANCE_PP + 1e-9  # accuracies are counts / n: allow for the rounding of a difference
    pair = f"our CPU ({cpu}) and GPU ({gpu}) runs"
    each = "; ".join(f"{r}: {accuracy[('CPU', r)]:.2f} % vs {accuracy[('GPU', r)]:.2f} %" for r in GAP_REDUCTIONS)
    effect = sum(reduction_diff.values()) / len(reduction_diff)
    apart = [r for r in GAP_REDUCTIONS if abs(device_diff[r]) > tolerance]
    if apart:
        return (f"Under reduction {titles.join_words(apart)} {pair} differ by more than {ACCURACY_TOLERANCE_PP} "
                f"points ({each}): the device changes the accuracy here, so these runs do not show the seed's "
                f"{seed_gap}-point CPU-GPU gap following the loss reduction alone (sum minus mean: {effect:+.2f} "
                "points).")
    worst = max(abs(d) for d in device_diff.values())
    agree = f"Under either reduction {pair} agree " + (f"within {worst:.2f} points" if worst else "exactly")
    if min(reduction_diff.values()) <= tolerance:
        return (f"{agree} ({each}), but sum minus mean is {reduction_diff['CPU']:+.2f} points on the CPU and "
                f"{reduction_diff['GPU']:+.2f} on the GPU, not the seed's +{seed_gap}: these runs do not show the "
                "loss reduction behind the seed's CPU-GPU gap.")
    if effect < float(seed_gap) / 2:
        return (f"{agree} ({each}), while sum vs mean differs by only {effect:.2f} points: the device does not "
                f"explain the seed's {seed_gap}-point CPU-GPU gap, and the loss reduction explains less than half "
                "of it here.")
    return (f"{agree} ({each}), while sum vs mean differs by {effect:.1f} points: the seed's {seed_gap}-point "
            "CPU-GPU gap follows the loss reduction, not the device.")


GAP_COLUMNS = ("phase", "variant", "reduction", "device", "final_train_loss", "test_accuracy")


def _seed_gap_note() -> str:
    """Seed 000's own numbers (papers.py) and which of our runs stand for its CPU and GPU."""
    def phase(name):
        accuracy = papers.paper_value("e1", "test_accuracy", phase=name).text
        losses = ", ".join(f"{v.text} (epoch {v.epoch})" for v in papers.paper_values("e1", "train_loss", phase=name))
        return f"{name} {accuracy} %, train loss {losses}"

    return (f"Seed 000: {phase('CPU')}; {phase('GPU')}. Ours: its CPU as cpu-serial (its serial loops), else "
            "cpu-numpy; its GPU as gpu-naive (its design), else the first GPU variant that ran (report order); each "
            "the variant's runs under both loss reductions. final_train_loss: the last epoch's mean per-sample loss.")


def _e1_gap_report(frame: pd.DataFrame, out_dir: Path) -> dict[str, str]:
    """gap.md (a heading, e1_gap_sentence and the runs that test the gap: phase, variant, reduction, device,
    final train loss, test accuracy) and reduction_gap.png (their train loss per epoch on one axis, with seed
    000's CPU and GPU losses as points; its title names the runs missing). Returns both titles by file name."""
    gap_runs = e1_gap_runs(frame)
    shown = pd.DataFrame(list(gap_runs.values())).assign(phase=[phase for phase, _ in gap_runs])
    absent = _gap_absent(gap_runs)
    written = {
        "gap.md": titles.runs_head("E1", shown, "seed 000's CPU-GPU accuracy gap and the loss reduction"),
        "reduction_gap.png": titles.figure_title(titles.runs_head(
            "E1", shown, "train loss per epoch of the CPU and GPU runs under each loss reduction, and seed 000's"
            + (f" (missing: {titles.join_words(absent)})" if absent else ""))),
    }
    io.write_text(out_dir / "gap.md", f"## {written['gap.md']}\n\n{e1_gap_sentence(frame)}\n\n"
                  + tables.markdown_table(shown[list(GAP_COLUMNS)]) + f"\n{_seed_gap_note()}\n")
    series, variant_of = {}, {}
    for (phase, reduction), row in gap_runs.items():
        epochs = tables.read_table(row["metrics_csv"], ("epoch", "train_loss"), "per-epoch metrics CSV")
        label = divergence.marked(f"{row['variant']} ({reduction})", row)
        series[label] = (epochs["epoch"], epochs["train_loss"])
        variant_of[label] = row["variant"]
    references = {}
    for phase in GAP_PHASES:
        points = papers.paper_values("e1", "train_loss", phase=phase)
        references[f"seed 000 {phase} (paper)"] = ([p.epoch for p in points], [p.value for p in points])
    figures.epoch_series(series, out_dir / "reduction_gap.png", written["reduction_gap.png"],
                         "average train loss per sample", references=references, variants=variant_of)
    return written


def report_e1(runs, evals, out_dir, profiles=(), **_) -> dict[str, str]:
    """Every variant once per loss reduction (experiments.e1.reductions): each run compared with the baselines of
    its own reduction, and named 'variant (reduction)' in the figures where runs differ in it."""
    frame = pd.DataFrame([run_row(r) for r in runs]).assign(metrics_csv=_metrics_paths(runs))
    frame = frame.assign(label=tables.run_labels(frame))
    curves = dict(zip(frame["label"], frame["metrics_csv"]))  # in the runs' order, as the config lists them
    variant_of = dict(zip(frame["label"], frame["variant"]))
    frame = _sorted(add_baseline_comparisons(frame, keys=("dataset", "widths", "batch", "reduction")),
                    ["variant", "reduction"], appearance=["reduction"])
    cols = ["variant", "reduction", "device", "dataset", "widths", "batch", "lr", "epochs", "train_time_s",
            "time_per_epoch_s", "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy",
            "accuracy_diff_vs_cpu_numpy_pp", "accuracy_matches_cpu_numpy", "diverged", "at_chance", "simulator"]
    timing = titles.timing_parts(frame)
    per = "per variant" + (" and loss reduction" if frame["reduction"].nunique() > 1 else "")
    written = {
        "summary.md": titles.table_title(titles.runs_head("E1", frame, per), timing),
        "loss_curves.png": titles.figure_title(titles.runs_head("E1", frame, f"training {per}")),
        "epoch_time.png": titles.figure_title(titles.runs_head("E1", frame, "time per epoch"), timing),
        "samples.png": f"E1: sample test classifications, {titles.model_description(frame)} on "
                       f"{titles.join_words(titles.distinct(frame['dataset']))}",
    }
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=cols, formats=COMPARISON_FORMATS, shown=E1_SHOWN,
                         note=_note(COMPARISON_NOTE, REDUCTION_NOTE, e1_gap_sentence(frame),
                                    divergence.summary_note(frame), titles.simulated_note(frame)))
    written.update(_e1_gap_report(frame, out_dir))
    figures.loss_curves(curves, out_dir / "loss_curves.png", written["loss_curves.png"], variants=variant_of,
                        legend=divergence.legend(frame, "label"))
    figures.epoch_time_bars(out_dir / "summary.csv", out_dir / "epoch_time.png", written["epoch_time.png"])
    _samples_figure(evals[0], out_dir / "samples.png", written["samples.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report(
        "e1", paper_vs_ours.rows_for("e1", paper_vs_ours.OursE1(frame)), out_dir, titles.runs_head("E1", frame))
    written.update(step_profile.report("e1", profiles, out_dir))
    return written


E2_CELL = ("batch", "hidden")
# summary column -> its short name in the wide table (the suffix keeps the Markdown formatting: seconds, %)
E2_WIDE_METRICS = {"train_time_s": "train_s", "forward_time_s": "forward_s", "backward_time_s": "backward_s",
                   "test_accuracy": "accuracy"}
E2_WIDE_SPEEDUP = "speedup_vs_serial"


def e2_paper_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The paper's E2 layout: one row per (batch, hidden) cell and, per variant, the columns '<variant> train_s',
    'forward_s', 'backward_s' (totals over training), 'accuracy' (test) and, but for cpu-serial itself,
    '<variant> speedup_vs_serial' (cpu-serial's training time over the variant's in that cell). NaN where a
    run or the baseline is missing."""
    _one_run_each(frame, "E2", E2_CELL)
    wide = frame.pivot(index=list(E2_CELL), columns="variant", values=list(E2_WIDE_METRICS))
    variants = ordered_variants(frame["variant"])
    serial_time = wide[("train_time_s", "cpu-serial")] if "cpu-serial" in variants else np.nan
    columns = {}
    for variant in variants:
        for metric, short in E2_WIDE_METRICS.items():
            columns[f"{variant} {short}"] = wide[(metric, variant)]
        if variant != "cpu-serial":
            columns[f"{variant} {E2_WIDE_SPEEDUP}"] = serial_time / wide[("train_time_s", variant)]
    return pd.DataFrame(columns, index=wide.index).reset_index()


def e2_head(frame: pd.DataFrame) -> str:
    """'E2: MLP 784-hidden-10, hidden {32, 64} x batch {32, 128} on mnist (e2 split, 37 800 train / 4 200
    test), 5 epochs': the sweep as run, not as the paper ran it. `frame` has the runs' rows (widths as hidden)."""
    rows = frame.rename(columns={"hidden": "widths"}).assign(widths=lambda f: f["widths"].astype(str))
    sweep = f"hidden {titles.one_or_set(frame['hidden'])} x batch {titles.one_or_set(frame['batch'])}"
    return (f"E2: {titles.model_description(rows)}, {sweep} on {titles.data_description(rows)}, "
            f"{titles.training_description(rows, sweep=('batch',))}")


def report_e2(runs, out_dir, **_) -> dict[str, str]:
    frame = pd.DataFrame([run_row(r) for r in runs]).rename(columns={"widths": "hidden"})
    frame["hidden"] = frame["hidden"].astype(int)
    frame = _sorted(add_baseline_comparisons(frame, keys=E2_CELL), ["variant", "hidden", "batch"])
    cols = ["variant", "device", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy", "diverged", "at_chance", "simulator"]
    head, timing = e2_head(frame), titles.timing_parts(frame)
    written = {
        "summary.md": titles.table_title(head, timing),
        "paper_table.md": titles.table_title(f"{head}, laid out as in the paper", timing),
        "heatmaps.png": titles.figure_title(f"{head}: training time and test accuracy", timing),
        "forward_backward.png": titles.figure_title(f"{head}: training time and its forward and backward parts "
                                                    "against hidden size", timing),
    }
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=cols, formats=COMPARISON_FORMATS, shown=E2_SHOWN,
                         note=_note(COMPARISON_NOTE, divergence.summary_note(frame), titles.simulated_note(frame)))
    paper = e2_paper_table(frame)
    tables.summary_table(paper.to_dict("records"), out_dir / "paper_table.csv", out_dir / "paper_table.md",
                         written["paper_table.md"],
                         formats={c: _times for c in paper.columns if c.endswith(E2_WIDE_SPEEDUP)},
                         note=_note("Times in seconds, summed over all epochs; accuracy on the test split; "
                                    f"{E2_WIDE_SPEEDUP}: cpu-serial's training time over the variant's in the "
                                    "same cell.", titles.simulated_note(frame)))
    figures.e2_heatmaps(out_dir / "summary.csv", out_dir / "heatmaps.png", written["heatmaps.png"])
    figures.e2_phase_times(out_dir / "summary.csv", out_dir / "forward_backward.png",
                           written["forward_backward.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report("e2", paper_vs_ours.rows_for("e2", paper_vs_ours.OursE2(frame)),
                                                       out_dir, head)
    return written


BLOCK_KEYS = ("op", "rows", "cols")


def block_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per op and shape (in the sweep's op order, then by size): the time at every block size
    ('block_<b>_ms', NaN where that block did not run) and the fastest block with its time and bandwidth
    (ties go to the smaller block)."""
    repeated = sweep[sweep.duplicated([*BLOCK_KEYS, "block"])]
    if not repeated.empty:
        first = repeated.iloc[0]
        raise GpunnError(f"block sweep has two rows for {first['op']} {first['rows']}x{first['cols']} block "
                         f"{first['block']}; keep one")
    wide = sweep.pivot(index=list(BLOCK_KEYS), columns="block", values="ms")
    table = pd.DataFrame({f"block_{int(b)}_ms": wide[b] for b in sorted(wide.columns)}, index=wide.index)
    fastest = (sweep.dropna(subset=["ms"]).sort_values(["ms", "block"], kind="stable")
               .drop_duplicates(list(BLOCK_KEYS)).set_index(list(BLOCK_KEYS)))
    table["best_block"] = fastest["block"].reindex(table.index)
    table["best_ms"] = fastest["ms"].reindex(table.index)
    table["best_gb_per_s"] = fastest["gb_per_s"].reindex(table.index)
    op_order = {op: i for i, op in enumerate(dict.fromkeys(sweep["op"]))}
    table = table.reset_index()
    return table.sort_values(["op", "rows", "cols"], key=lambda col: col.map(op_order) if col.name == "op" else col,
                             kind="stable").reset_index(drop=True)


def _read_csvs(paths, columns, what) -> pd.DataFrame:
    """The CSVs' rows, with device and simulator columns normalised (filled in for CSVs written before the
    timings recorded their provenance)."""
    frame = pd.concat([tables.read_table(p, columns, what) for p in paths], ignore_index=True)
    return titles.with_device_fields(frame)


E3_SUMMARY_COLUMNS = ("variant", "device", "batch", "hidden", "features", "steps", "timed_epochs",
                      "throughput_step_ms", "throughput_samples_per_s", "forward_ms", "backward_ms", "clock",
                      "latency_ms", "repeats", "simulator")


def e3_head(frame: pd.DataFrame) -> str:
    """'E3: MLP training step per batch size and variant (hidden 256, inputs 784, throughput over 100 steps,
    latency median of 20 calls)', from the columns the timing CSVs have."""
    sizes = [f"{name} {titles.one_or_set(frame[column])}" for column, name in (("hidden", "hidden"),
                                                                            ("features", "inputs"))
             if column in frame]
    if "steps" in frame:
        sizes.append(f"throughput over {titles.one_or_set(frame['steps'])} steps")
    if "repeats" in frame:
        calls = titles.one_or_set(frame["repeats"])
        sizes.append(f"latency median of {calls} call{'' if calls == '1' else 's'}")
    return "E3: MLP training step per batch size and variant" + (f" ({', '.join(sizes)})" if sizes else "")


def e3_note() -> str:
    """What each measured column of E3's table is (gpunn.batch_timing.COLUMN_NOTES)."""
    from gpunn.batch_timing import COLUMN_NOTES

    return " ".join(f"{column}: {text}." for column, text in COLUMN_NOTES.items())


def report_e3(timings, out_dir, blocks=(), **_) -> dict[str, str]:
    frame = _sorted(_read_csvs(timings, figures.E3_COLUMNS, "E3 timing CSV"), ["variant", "batch"])
    head, timing = e3_head(frame), titles.timing_parts(frame)
    written = {"summary.md": titles.table_title(head, timing),
               "batch_timing.png": titles.figure_title(head, timing)}
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=[c for c in E3_SUMMARY_COLUMNS if c in frame], shown=E3_SHOWN,
                         note=_note(e3_note(), titles.simulated_note(frame)))
    figures.batch_timing(out_dir / "summary.csv", out_dir / "batch_timing.png", written["batch_timing.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report("e3", paper_vs_ours.e3_rows(frame), out_dir, head)
    if not blocks:  # the block-size sweep is optional by hand; the workflow always passes it
        return written
    sweep = _read_csvs(blocks, figures.BLOCK_COLUMNS, "block-size sweep CSV")
    devices = titles.distinct(sweep.loc[sweep["device"] != titles.UNKNOWN_DEVICE, "device"])
    if len(devices) > 1:
        raise GpunnError(f"{', '.join(map(str, blocks))}: block sweep mixes devices {', '.join(sorted(devices))}; "
                         "the fastest block is only meaningful on one")
    table = block_table(sweep)
    timing = titles.timing_parts(sweep)
    written["blocks.md"] = titles.table_title("E3: kernel time (ms) against threads per block", timing)
    written["block_sweep.png"] = titles.figure_title("E3: kernel time against block size", timing)
    tables.summary_table(table.to_dict("records"), out_dir / "blocks.csv", out_dir / "blocks.md",
                         written["blocks.md"],
                         note=_note("One row per op and shape (rows x cols); '-': that block size did not run. "
                                    "best_gb_per_s: bandwidth at the fastest block.", titles.simulated_note(sweep)))
    figures.block_sweep(blocks, out_dir / "block_sweep.png", written["block_sweep.png"])
    return written


E4_BASELINES = ("cpu-numpy", "gpu-naive")
E4_SUMMARY_COLUMNS = ("dataset", "variant", "device", "widths", "n_train", "n_test", "batch", "lr", "epochs",
                      "parameters", "train_time_s", "time_per_epoch_s", "test_time_s", "final_train_loss",
                      "test_accuracy", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive", "accuracy_diff_vs_cpu_numpy_pp",
                      "accuracy_matches_cpu_numpy", "diverged", "at_chance", "simulator")
# seed 001's Tables 3-6 (one per dataset and version, a row per GPU) as one tidy table: CSV column -> its heading,
# the measured columns headed as the seed's Table 3 heads them
E4_PAPER_HEADERS = {"dataset": "Dataset", "variant": "Variant", "device": "Device",
                    **dict(zip(("train_time_s", "test_time_s", "test_accuracy"),
                               papers.column_labels(papers.SEED_E4, papers.E4_CUDA_TABLES[0]))),
                    "simulator": "Simulator"}
E4_BLOCK_COLUMNS = ("dataset", "variant", "block", "device", "time_per_epoch_s", "train_time_s", "final_train_loss",
                    "test_accuracy", "accuracy_diff_vs_cpu_numpy_pp", "accuracy_matches_cpu_numpy", "diverged",
                    "at_chance", "simulator")
TEST_TIME_NOTE = ("test_time_s: the whole test set through the trained model's forward pass once after training (the "
                  "seed's testing time); '-': a run recorded before it was measured.")


def _metrics_csvs(frame: pd.DataFrame, group: str, label: str) -> dict[str, dict[str, Path]]:
    """{value of `group`: {value of `label`: that run's metrics.csv}} over the rows of `frame`, in its order."""
    groups: dict[str, dict[str, Path]] = {}
    for group_value, label_value, path in frame[[group, label, "metrics_csv"]].itertuples(index=False):
        groups.setdefault(str(group_value), {})[str(label_value)] = path
    return groups


def report_e4(runs, evals, out_dir, profiles=(), **_) -> dict[str, str]:
    """The main runs (every variant on every dataset at the kernels' default block) in summary, paper_table,
    cumulative_time and loss_curves; the block-size study's runs (RunSpec.block > 0), where there are any, in
    blocks, block_time and block_loss."""
    frame = pd.DataFrame([run_row(r) for r in runs]).assign(metrics_csv=_metrics_paths(runs))
    _one_run_each(frame, "E4", ("dataset", "block"))
    if not (frame["block"] == 0).any():
        raise GpunnError("E4 report: every run sets a block size; the report needs the main runs (no _t<threads>)")
    main = add_baseline_comparisons(frame[frame["block"] == 0], keys=("dataset",), baselines=E4_BASELINES)
    main = _sorted(main, ["dataset", "variant"], appearance=("dataset",))
    timing = titles.timing_parts(main)
    written = {
        "summary.md": titles.table_title(titles.runs_head("E4", main, "per dataset and variant"), timing),
        "paper_table.md": titles.table_title(titles.runs_head("E4", main, "laid out as in the seed's Tables 3-6"),
                                             timing),
        "cumulative_time.png": titles.figure_title(titles.runs_head("E4", main, "cumulative training time per epoch"),
                                                   timing),
        "loss_curves.png": titles.figure_title(titles.runs_head("E4", main, "average train loss and test accuracy "
                                                                            "per epoch")),
    }
    tables.summary_table(main.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=E4_SUMMARY_COLUMNS, formats=comparison_formats(E4_BASELINES),
                         shown=E4_SHOWN,
                         note=_note(COMPARISON_NOTE, TEST_TIME_NOTE, divergence.summary_note(main),
                                    titles.simulated_note(main)))
    paper = main[list(E4_PAPER_HEADERS)]
    tables.summary_table(paper.to_dict("records"), out_dir / "paper_table.csv", out_dir / "paper_table.md",
                         written["paper_table.md"], headers=E4_PAPER_HEADERS,
                         note=_note("Training time summed over the epochs; testing time and accuracy on the whole "
                                    "test set after training; '-': not recorded.", titles.simulated_note(paper)))
    by_dataset = _metrics_csvs(main, "dataset", "variant")
    figures.epoch_lines(by_dataset, ["cumulative_time"], out_dir / "cumulative_time.png",
                        written["cumulative_time.png"], legend_title="variant",
                        simulated=figures.simulated_variants(main), diverged=divergence.diverged_in(main))
    figures.epoch_lines(by_dataset, ["train_loss", "test_accuracy"], out_dir / "loss_curves.png",
                        written["loss_curves.png"], legend_title="variant", diverged=divergence.diverged_in(main))
    for eval_dir in evals:
        dataset = parse_run_path(_read_json(Path(eval_dir) / "eval.json")["run"]).dataset
        of_dataset = main[main["dataset"] == dataset]
        described = titles.model_description(of_dataset if not of_dataset.empty else main)
        name = f"samples_{dataset}.png"
        written[name] = f"E4: sample test classifications, {described} on {dataset}"
        _samples_figure(eval_dir, out_dir / name, written[name])
    if (frame["block"] > 0).any():
        written.update(_e4_block_study(frame[frame["block"] > 0], main, out_dir))
    ours = paper_vs_ours.OursE4(main, frame[frame["block"] > 0])
    written["paper_vs_ours.md"] = paper_vs_ours.report("e4", paper_vs_ours.rows_for("e4", ours, paper_vs_ours.e4_keep),
                                                       out_dir, titles.runs_head("E4", main))
    written.update(step_profile.report("e4", profiles, out_dir))
    return written


def _e4_block_study(study: pd.DataFrame, main: pd.DataFrame, out_dir: Path) -> dict[str, str]:
    """Seed 001's block-size study: per variant and block size, time, final loss and test accuracy (with its
    difference to cpu-numpy's main run on the same dataset); cumulative time and loss per epoch per block."""
    reference = main.loc[main["variant"] == "cpu-numpy"].set_index("dataset")["test_accuracy"]
    study = _sorted(add_accuracy_comparison(study, study["dataset"].map(reference)), ["variant", "block"])
    sizes = f"threads per block {titles.one_or_set(study['block'])}"
    timing = titles.timing_parts(study)
    written = {
        "blocks.md": titles.table_title(titles.runs_head("E4", study, f"block-size study, {sizes}"), timing),
        "block_time.png": titles.figure_title(titles.runs_head("E4", study, "cumulative training time per epoch "
                                                                             "per block size"), timing),
        "block_loss.png": titles.figure_title(titles.runs_head("E4", study, "average train loss per epoch per "
                                                                             "block size")),
    }
    tables.summary_table(study.to_dict("records"), out_dir / "blocks.csv", out_dir / "blocks.md", written["blocks.md"],
                         columns=E4_BLOCK_COLUMNS, formats=comparison_formats(()), shown=E4_BLOCK_SHOWN,
                         note=_note("One row per variant and block (threads per block of the kernels that take "
                                    "one); accuracy_diff_vs_cpu_numpy_pp: test accuracy minus that of the cpu-numpy "
                                    "run on the same dataset, in percentage points; accuracy_matches_cpu_numpy: within "
                                    f"{ACCURACY_TOLERANCE_PP} pp; '-': cpu-numpy did not run on that dataset.",
                                    divergence.summary_note(study), titles.simulated_note(study)))
    by_variant = _metrics_csvs(study, "variant", "block")
    simulated, diverged = figures.simulated_variants(study), divergence.diverged_in(study, "block")
    figures.epoch_lines(by_variant, ["cumulative_time"], out_dir / "block_time.png", written["block_time.png"],
                        legend_title="threads per block", simulated=simulated, ordinal=True, diverged=diverged)
    figures.epoch_lines(by_variant, ["train_loss"], out_dir / "block_loss.png", written["block_loss.png"],
                        legend_title="threads per block", ordinal=True, diverged=diverged)
    return written


# E5: seed 004 trained its CPU baseline on 1 000 images and extrapolated the epoch to CIFAR-10's 50 000
E5_FULL_TRAIN = 50000
E5_BASELINES = ("cpu-numpy", "gpu-naive")
E5_SUMMARY_COLUMNS = ("variant", "device", "dataset", "n_train", "n_test", "batch", "lr", "epochs", "parameters",
                      "time_per_epoch_s", "train_time_s", "full_epoch_s", "full_train_time_s", "full_set_extrapolated",
                      "all_epochs", "train_time_extrapolated", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive", "final_train_mse", "test_mse",
                      "peak_gpu_memory_mib", "diverged", "simulator")
# seed 004's section 2.4 table: every phase's epoch time over 50 000 images (the CPU's extrapolated from 1 000)
_E5_SEED_EPOCHS = papers.paper_values("e5", "epoch_time", source=papers.E5_EPOCH_TABLE)
# seed 004's phases 2.1-2.4 by the variant that reproduces each, in its tables' order; gpu-graph is ours
E5_PHASES = {**{entry.ours[0]: entry.phase for entry in _E5_SEED_EPOCHS},
             "gpu-graph": "GPU graph (ours, not in the paper)"}
# seed 004's own epoch times, by the variant that reproduces each phase
E5_SEED_EPOCH_S = {entry.ours[0]: entry.value for entry in _E5_SEED_EPOCHS}
E5_EPOCH_HEADERS = {"implementation": "Implementation", "variant": "Variant", "full_epoch_s": "Epoch time (s)",
                    "speedup_vs_cpu": "Speedup vs CPU", "speedup_vs_previous": "Speedup vs previous phase",
                    "seed_full_epoch_s": "Seed's epoch time (s)"}
E5_TOTAL_HEADERS = {"phase": "Phase", "variant": "Variant",
                    "full_train_time_s": "Training time for all epochs (s)",
                    "training_speedup_vs_cpu": "Speedup vs CPU", "incremental_speedup": "Incremental speedup",
                    "peak_gpu_memory_mib": "Memory (VRAM, MiB)"}
MIB = 2 ** 20


def _mib(values: pd.Series) -> pd.Series:
    """Bytes as MiB; NaN where unknown (None, missing, not a number)."""
    return pd.to_numeric(values, errors="coerce") / MIB


def _extrapolated_word(flag) -> str:
    return "extrapolated" if flag else "measured"


def e5_full_set(frame: pd.DataFrame, full_train_size: int = E5_FULL_TRAIN, epochs: int | None = None) -> pd.DataFrame:
    """`frame` with each run's epoch time over `full_train_size` images (measured where it trained on that many,
    else its own scaled by full_train_size / n_train as seed 004 extrapolated its CPU epoch: full_set_extrapolated)
    and its training time for all `epochs` (all_epochs; None: the most any run trained, the experiment's `epochs`)
    on that many images: measured where the run trained all of them on the full set, else its mean epoch time
    there x all_epochs, as the seed did for its 20-epoch table (train_time_extrapolated: a run timed over fewer
    epochs, experiments.e5.variant_epochs, or a subset); the speedups over cpu-numpy and gpu-naive (same dataset)
    per such epoch, so that runs on different training-set sizes compare; the peak GPU memory in MiB."""
    scale = full_train_size / frame["n_train"]
    all_epochs = int(epochs if epochs is not None else frame["epochs"].max())
    full_epoch = frame["time_per_epoch_s"] * scale
    fewer = frame["epochs"] != all_epochs
    frame = frame.assign(full_epoch_s=full_epoch,
                         full_train_time_s=(full_epoch * all_epochs).where(fewer, frame["train_time_s"] * scale),
                         full_set_extrapolated=frame["n_train"] != full_train_size, all_epochs=all_epochs,
                         peak_gpu_memory_mib=_mib(frame["peak_gpu_memory_bytes"]))
    frame["train_time_extrapolated"] = frame["full_set_extrapolated"] | fewer
    for baseline in E5_BASELINES:
        frame[_speedup_column(baseline)] = (baseline_value(frame, baseline, "full_epoch_s", ("dataset",))
                                            / frame["full_epoch_s"])
    return frame


def e5_paper_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Seed 004's section 2.4 and 3.1 tables as one tidy table: a row per variant of E5_PHASES that ran (report
    order), named as the seed's phase ('(extrapolated)' where its times are), with its epoch time over the full
    set, speedup per such epoch over cpu-numpy and over the row above, the seed's own epoch time, the training time
    for all epochs over the full set, its speedup over cpu-numpy's and the row above's (incremental), and its
    peak GPU memory. `frame`: e5_full_set's rows of one dataset, in report order."""
    rows = frame[frame["variant"].isin(list(E5_PHASES))].reset_index(drop=True)
    cpu = rows[rows["variant"] == "cpu-numpy"]
    cpu_epoch = cpu["full_epoch_s"].iloc[0] if not cpu.empty else np.nan
    cpu_total = cpu["full_train_time_s"].iloc[0] if not cpu.empty else np.nan
    def named(flags):
        return [E5_PHASES[v] + (" (extrapolated)" if extrapolated else "") for v, extrapolated in
                zip(rows["variant"], flags)]

    return pd.DataFrame({
        "implementation": named(rows["full_set_extrapolated"]), "phase": named(rows["train_time_extrapolated"]),
        "variant": rows["variant"], "device": rows["device"],
        "full_epoch_s": rows["full_epoch_s"], "speedup_vs_cpu": cpu_epoch / rows["full_epoch_s"],
        "speedup_vs_previous": rows["full_epoch_s"].shift(1) / rows["full_epoch_s"],
        "seed_full_epoch_s": rows["variant"].map(E5_SEED_EPOCH_S),
        "full_train_time_s": rows["full_train_time_s"],
        "training_speedup_vs_cpu": cpu_total / rows["full_train_time_s"],
        "incremental_speedup": rows["full_train_time_s"].shift(1) / rows["full_train_time_s"],
        "peak_gpu_memory_mib": rows["peak_gpu_memory_mib"], "full_set_extrapolated": rows["full_set_extrapolated"],
        "train_time_extrapolated": rows["train_time_extrapolated"], "simulator": rows["simulator"],
    })


def _e5_sizes_note(frame: pd.DataFrame, full_train_size: int) -> str | None:
    """Where the runs trained on different numbers of images: the speedups compare full-set epochs."""
    if frame["n_train"].nunique() < 2:
        return None
    sizes = titles.join_words(titles.count(n) for n in sorted(titles.distinct(frame["n_train"])))
    return (f"The runs trained on {sizes} images, so every speedup compares epochs over "
            f"{titles.count(full_train_size)} images, not the runs' own epochs.")


E5_SUMMARY_NOTE = ("Speedup: the baseline's full_epoch_s over the variant's ('-': that baseline did not run). "
                   "final_train_mse: the mean training MSE over the last epoch's batches as it trained; test_mse: on "
                   "the whole test set after it. peak_gpu_memory_mib: GPU memory the process held at its peak during "
                   "training; '-': not recorded (CPU variants, the CUDA simulator, older runs).")


def report_e5(runs, evals, out_dir, full_train_size: int = E5_FULL_TRAIN, profiles=(), **_) -> dict[str, str]:
    """Summary (per variant: times, their full-set epoch, measured or extrapolated, speedups per full-set epoch,
    MSE, peak GPU memory), paper_table (seed 004's section 2.4 and 3.1 tables), mse_curves, reconstructions (the
    first test image of each class), training_time and speedup (its section 3.2 figures)."""
    frame = pd.DataFrame([run_row(r) for r in runs]).assign(metrics_csv=_metrics_paths(runs))
    if frame["dataset"].nunique() > 1:
        raise GpunnError(f"E5 report: runs on {titles.join_words(titles.distinct(frame['dataset']))}; its tables "
                         "compare the variants on one dataset")
    _one_run_each(frame, "E5", ("dataset",))
    frame = frame.rename(columns={"test_loss": "test_mse", "final_train_loss": "final_train_mse"})
    frame = _sorted(e5_full_set(frame, full_train_size), ["dataset", "variant"], appearance=("dataset",))
    timing = titles.timing_parts(frame)
    size = titles.count(full_train_size)
    written = {
        "summary.md": titles.table_title(titles.runs_head("E5", frame, "per variant"), timing),
        "paper_table.md": titles.table_title(titles.runs_head("E5", frame, "laid out as in the seed's sections 2.4 "
                                                                           "and 3.1"), timing),
        "mse_curves.png": titles.figure_title(titles.runs_head("E5", frame, "train and test MSE per epoch")),
        "training_time.png": titles.figure_title(titles.runs_head("E5", frame, f"training time for all epochs (each "
                                                                               f"of {size} images)"), timing),
        "speedup.png": titles.figure_title(titles.runs_head("E5", frame, f"speedup over cpu-numpy per epoch (of "
                                                                         f"{size} images)"), timing),
    }
    simulated, sizes = titles.simulated_note(frame), _e5_sizes_note(frame, full_train_size)
    extrapolated = {"full_set_extrapolated": _extrapolated_word, "train_time_extrapolated": _extrapolated_word}
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=E5_SUMMARY_COLUMNS, shown=E5_SHOWN,
                         formats=comparison_formats(E5_BASELINES) | extrapolated,
                         note=_note(f"full_epoch_s: one epoch over {size} training images, measured where the run "
                                    f"trained on {size} (full_set_extrapolated: 'measured'), else its own epoch x "
                                    f"{size} / n_train, as the seed extrapolated its CPU epoch ('extrapolated'). "
                                    f"full_train_time_s: all_epochs epochs over {size} images, measured where the "
                                    "run trained them all on the full set, else full_epoch_s x all_epochs "
                                    "(train_time_extrapolated; a run timed over fewer epochs, "
                                    "experiments.e5.variant_epochs, or on a subset).", sizes, E5_SUMMARY_NOTE,
                                    divergence.summary_note(frame), simulated))
    _e5_paper_tables(frame, out_dir, written["paper_table.md"],
                     _note(f"Times over {size} training images: measured where the run trained on {size}, else its "
                           f"own times x {size} / n_train, as the seed extrapolated its CPU epoch; the training time "
                           f"for all {int(frame['all_epochs'].iloc[0])} epochs of a run timed over fewer is its epoch "
                           "time x that many, as the seed's section 3.1 did; such rows read '(extrapolated)'.",
                           sizes, simulated), size)
    figures.loss_curves({row["variant"]: row["metrics_csv"] for _, row in frame.iterrows()},
                        out_dir / "mse_curves.png", written["mse_curves.png"], quantity="MSE",
                        legend={row["variant"]: divergence.marked(f"{row['variant']} ({titles.count(row['n_train'])} "
                                                                  "train images)", row)
                                for _, row in frame.iterrows()})
    figures.training_time_bars(out_dir / "summary.csv", out_dir / "training_time.png", written["training_time.png"],
                               full_train_size)
    figures.speedup_bars(out_dir / "summary.csv", out_dir / "speedup.png", written["speedup.png"], full_train_size)
    written["reconstructions.png"] = _e5_reconstructions(evals[0], frame, out_dir / "reconstructions.png")
    written["paper_vs_ours.md"] = paper_vs_ours.report("e5", paper_vs_ours.rows_for("e5", paper_vs_ours.OursE5(frame)),
                                                       out_dir, titles.runs_head("E5", frame))
    written.update(step_profile.report("e5", profiles, out_dir))
    return written


def _e5_paper_tables(frame: pd.DataFrame, out_dir: Path, title: str, note: str, size: str) -> None:
    """paper_table.csv (e5_paper_table, tidy) and paper_table.md: under `title` and `note`, its section 2.4 and 3.1
    tables."""
    paper = e5_paper_table(frame)
    formats = {c: _times for c in ("speedup_vs_cpu", "speedup_vs_previous", "training_speedup_vs_cpu",
                                   "incremental_speedup")} | {"seed_full_epoch_s": "{:.2f}"}  # as the seed prints them
    epoch = tables.markdown_section(
        f"Seed's section 2.4: time per epoch on {size} images", paper[list(E5_EPOCH_HEADERS)], formats,
        E5_EPOCH_HEADERS, level=3,
        note=_note("Speedup vs previous phase: the row above's epoch time over this row's ('-': first row). Seed's "
                   "epoch time: seed 004's own (its GPU; its CPU epoch extrapolated from 1 000 images); '-': not in "
                   "the seed."))
    total = tables.markdown_section(
        f"Seed's section 3.1: training time for all epochs on {size} images", paper[list(E5_TOTAL_HEADERS)],
        formats, E5_TOTAL_HEADERS, level=3,
        note=_note("Incremental speedup: the row above's training time over this row's. Memory: peak GPU memory of "
                   "the training process; '-': not recorded (CPU, the CUDA simulator, older runs)."))
    io.write_csv(out_dir / "paper_table.csv", paper)
    io.write_text(out_dir / "paper_table.md", "\n".join([f"## {title}\n", f"{note.strip()}\n", epoch, total]))


def _e5_reconstructions(eval_dir, frame: pd.DataFrame, out_png: Path) -> str:
    """reconstructions.png from the evaluation of one run: the first test image of each class above its
    reconstruction, columns titled by class (samples.npz from before it saved the classes: the first test images,
    untitled). Returns its title."""
    run = parse_run_path(_read_json(Path(eval_dir) / "eval.json")["run"])
    path = Path(eval_dir) / "samples.npz"
    if _samples_missing(path, out_png):
        return f"E5: reconstructions by {run.variant}"
    with np.load(path, allow_pickle=False) as saved:
        images, reconstructions = saved["images"], saved["reconstructions"]
        names = None
        if "labels" in saved and "class_names" in saved:
            names = [str(saved["class_names"][int(label)]) for label in saved["labels"]]
    shown = ("the first test image of each class (top) and its reconstruction" if names
             else "the first test images (top) and their reconstructions")
    title = titles.figure_title(f"E5: {shown} by {run.variant} (bottom), {titles.model_description(frame)} on "
                                f"{run.dataset}")
    figures.reconstruction_grid(images, reconstructions, out_png, title, max_columns=len(names) if names else 10,
                                column_titles=names)
    return title


def e6_head(frame: pd.DataFrame) -> str:
    """'E6: SVM (RBF, exact) on 128 autoencoder features, 1 000 train / 500 test' from the svm metrics;
    '1 000 train (a stratified subset of 50 000)' when the training set was a subset."""
    methods = titles.join_words(titles.distinct(frame["method"])) if "method" in frame else "?"
    train = f"{titles.one_or_set(frame['n_train'], titles.count)} train"
    if "subset" in frame and frame["subset"].fillna(False).astype(bool).any():
        train += f" (a stratified subset of {titles.one_or_set(frame['n_train_total'], titles.count)})"
    return (f"E6: SVM (RBF, {methods}) on {titles.one_or_set(frame['n_features'], titles.count)} autoencoder "
            f"features, {train} / {titles.one_or_set(frame['n_test'], titles.count)} test")


def report_e6(svm, out_dir, **_) -> dict[str, str]:
    rows = []
    for svm_dir in svm:
        metrics = _read_json(Path(svm_dir) / "metrics.json")
        fields = titles.device_fields(metrics.get("provenance"))
        rows.append({"method": metrics.get("method"), "device": fields["device"]})
        rows[-1].update({key: metrics.get(key) for key in ("C", "gamma", "n_train", "n_test", "n_features",
                                                           "subset", "n_train_total", "kernel_device",
                                                           "train_accuracy", "test_accuracy", "kernel_time_s",
                                                           "fit_time_s", "predict_time_s")})
        per_class = metrics.get("per_class_accuracy", {})
        rows[-1].update({f"{name}_accuracy": acc for name, acc in per_class.items()})
        rows[-1]["simulator"], rows[-1]["cpu"] = fields["simulator"], fields["cpu"]
    frame = pd.DataFrame(rows)
    written = {"summary.md": titles.table_title(e6_head(frame), titles.timing_parts(frame))}
    tables.summary_table([{k: v for k, v in r.items() if k != "cpu"} for r in rows], out_dir / "summary.csv",
                         out_dir / "summary.md", written["summary.md"], shown=E6_SHOWN, note=_e6_per_class(rows))
    written["paper_vs_ours.md"] = paper_vs_ours.report("e6", paper_vs_ours.rows_for("e6", paper_vs_ours.OursE6(frame)),
                                                       out_dir, e6_head(frame))
    written["confusion.png"] = _e6_confusion(svm[0], frame.iloc[0], e6_head(frame), out_dir / "confusion.png")
    return written


def _e6_per_class(rows: list[dict]) -> str | None:
    """The per-class test accuracies of the summary's rows (its <class>_accuracy columns) as a table of their own:
    a row per class, a column per SVM run."""
    classes = [key[: -len("_accuracy")] for key in rows[0] if key.endswith("_accuracy")
               and key not in ("train_accuracy", "test_accuracy")]
    if not classes:
        return None
    names = [f"{r.get('method')} ({i + 1})" if len(rows) > 1 else str(r.get("method")) for i, r in enumerate(rows)]
    frame = pd.DataFrame({"class": classes, **{f"{name} accuracy": [r.get(f"{c}_accuracy") for c in classes]
                                               for name, r in zip(names, rows)}})
    return "Test accuracy per class:\n\n" + tables.markdown_table(frame).rstrip("\n")


def _e6_confusion(svm_dir, row: pd.Series, head: str, out_png: Path) -> str:
    """confusion.png regenerated from the svm step's confusion.csv (a 'true' column of class names, then one column
    of counts per predicted class, written beside its metrics.json), titled with `head` and the test accuracy of
    `row` (that run's metrics). Returns its title."""
    path = Path(svm_dir) / "confusion.csv"
    confusion = tables.read_table(path, ("true",), "SVM confusion matrix CSV")
    names = [str(name) for name in confusion["true"]]
    if [str(c) for c in confusion.columns[1:]] != names:
        raise GpunnError(f"{path}: its columns after 'true' must be the classes {', '.join(names)} in that order, got "
                         f"{', '.join(map(str, confusion.columns[1:]))}; rerun the svm step")
    accuracy = "" if pd.isna(row["test_accuracy"]) else f", test accuracy {100 * float(row['test_accuracy']):.2f} %"
    title = titles.figure_title(f"{head}: confusion matrix on the test set{accuracy}")
    figures.confusion_matrix_figure(confusion.iloc[:, 1:].to_numpy(), names, out_png, title)
    return title


REPORTS = {"e1": report_e1, "e2": report_e2, "e3": report_e3, "e4": report_e4, "e5": report_e5, "e6": report_e6}


def make_report(experiment: str, out_dir, runs=(), evals=(), timings=(), svm=(), blocks=(), profiles=(), jobs=(),
                **options) -> dict[str, str]:
    """Write one experiment's tables and figures into `out_dir`, and the wall times of its jobs (`jobs`: their
    benchmark files) as jobs.csv/.md; returns each one's title by file name (the Markdown tables under their .md
    name)."""
    if experiment not in REPORTS:
        raise GpunnError(f"unknown experiment '{experiment}': choose one of {', '.join(REPORTS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = REPORTS[experiment](runs=list(runs), evals=list(evals), timings=list(timings), svm=list(svm),
                                  blocks=list(blocks), profiles=list(profiles), out_dir=out_dir, **options)
    if jobs:
        written.update(job_times.write(out_dir, experiment, jobs))
    # last, so that a report whose tables or figures failed has no provenance.json either (the index needs it)
    sources.write(out_dir / REPORT_PROVENANCE, experiment,
                  sources.collect(runs=runs, svm=svm, timings=timings, blocks=blocks, profiles=profiles))
    return written
