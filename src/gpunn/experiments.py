"""Report of each experiment E1..E6: a summary table (CSV + Markdown) and its figures, built from the
outputs of finished runs. Paper numbers for comparison are in ../shared/ANCHORS.md and the README.

    e1  MLP on MNIST per variant: time, time per epoch, accuracy, speedups, accuracy difference to cpu-numpy;
        loss curves; time per epoch (bars); sample predictions
    e2  MLP hidden x batch sweep on the 37 800 / 4 200 split: train / forward / backward time, accuracy, speedups
        (tidy summary, and the papers' wide layout in paper_table); heatmaps; forward / backward time lines
    e3  MLP forward / backward / step time and samples/s per batch size and variant; with --blocks, the kernels'
        time per block size (blocks table: the fastest block per op and shape; block_sweep figure)
    e4  CNN on MNIST and Fashion-MNIST: accuracy and time per variant; loss curves; sample predictions
    e5  autoencoder: epoch time, test MSE; loss curves; reconstruction grid
    e6  SVM on encoder features: accuracy, per-class accuracy, fit time; confusion matrix (by the svm step)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.report import figures, tables
from gpunn.report.tables import format_significant, ordered_variants


def _read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise GpunnError(f"{path}: missing; run the step that makes it first") from None
    except json.JSONDecodeError as exc:
        raise GpunnError(f"{path}: not valid JSON ({exc}); delete it and rerun its step") from None


def run_row(run_dir) -> dict:
    """One tidy row describing a finished training run."""
    path = Path(run_dir) / "metrics.json"
    summary = _read_json(path)
    try:
        return _run_row(summary)
    except KeyError as exc:
        raise GpunnError(f"{path}: lacks key {exc}; rerun its training step") from None


def _run_row(summary: dict) -> dict:
    spec = summary["spec"]
    return {
        "dataset": spec["dataset"], "split": spec["split"], "model": spec["model"], "variant": spec["variant"],
        "widths": "-".join(str(w) for w in spec["widths"]), "batch": spec["batch"], "lr": spec["lr"],
        "epochs": spec["epochs"], "seed": spec["seed"], "n_train": summary["n_train"], "n_test": summary["n_test"],
        "parameters": summary["num_parameters"], "train_time_s": summary["total_train_time_s"],
        "time_per_epoch_s": summary["mean_epoch_time_s"], "forward_time_s": summary["forward_time_s"],
        "backward_time_s": summary["backward_time_s"], "final_train_loss": summary["final_train_loss"],
        "test_loss": summary["final_test_loss"], "test_accuracy": summary["final_test_accuracy"],
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


def add_baseline_comparisons(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Speedup in training time over each CPU baseline run with the same `keys`, the test-accuracy difference to
    cpu-numpy in percentage points and whether it is within ACCURACY_TOLERANCE_PP; NaN without the baseline."""
    frame = frame.copy()
    for baseline in BASELINES:
        frame[_speedup_column(baseline)] = baseline_value(frame, baseline, "train_time_s", keys) / frame["train_time_s"]
    diff = 100.0 * (frame["test_accuracy"] - baseline_value(frame, "cpu-numpy", "test_accuracy", keys))
    frame["accuracy_diff_vs_cpu_numpy_pp"] = diff
    # accuracies are counts / n: allow for the rounding of their difference
    frame["accuracy_matches_cpu_numpy"] = [None if pd.isna(d) else bool(abs(d) <= ACCURACY_TOLERANCE_PP + 1e-9)
                                           for d in diff]
    return frame


def _sorted(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Rows ordered by `columns`, the variant column in report order (baselines first), not alphabetically."""
    rank = {v: i for i, v in enumerate(ordered_variants(frame["variant"]))}
    return frame.sort_values(list(columns), key=lambda col: col.map(rank) if col.name == "variant" else col,
                             kind="stable").reset_index(drop=True)


def _times(value) -> str:
    return f"{format_significant(value, 3)}x"


COMPARISON_FORMATS = {_speedup_column(b): _times for b in BASELINES} | {"accuracy_diff_vs_cpu_numpy_pp": "{:+.2f}"}
COMPARISON_NOTE = ("Speedup: the baseline's training time over the variant's, same cell. "
                   "accuracy_diff_vs_cpu_numpy_pp: test accuracy minus cpu-numpy's in percentage points; "
                   f"accuracy_matches_cpu_numpy: within {ACCURACY_TOLERANCE_PP} pp. '-': that baseline did not run.")


def _curves(run_dirs, label_fields, out_png, title) -> None:
    labelled = {}
    for run_dir in run_dirs:
        row = run_row(run_dir)
        labelled[" ".join(str(row[f]) for f in label_fields)] = Path(run_dir) / "metrics.csv"
    figures.loss_curves(labelled, out_png, title)


def _samples_figure(eval_dir, out_png, title) -> None:
    path = Path(eval_dir) / "samples.npz"
    if not path.is_file():
        raise GpunnError(f"{path}: missing; run the evaluate step first")
    with np.load(path, allow_pickle=False) as saved:
        if "reconstructions" in saved:
            figures.reconstruction_grid(saved["images"], saved["reconstructions"], out_png, title)
        else:
            figures.sample_classifications(saved["images"], saved["labels"], saved["predictions"],
                                           [str(c) for c in saved["class_names"]], out_png, title)


def report_e1(runs, evals, out_dir, **_):
    frame = pd.DataFrame([run_row(r) for r in runs])
    frame = _sorted(add_baseline_comparisons(frame, keys=("dataset", "widths", "batch")), ["variant"])
    cols = ["variant", "dataset", "widths", "batch", "lr", "epochs", "train_time_s", "time_per_epoch_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy"]
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E1: MLP 784-hidden-10 on MNIST, per variant", columns=cols, formats=COMPARISON_FORMATS,
                         note=COMPARISON_NOTE)
    _curves(runs, ["variant"], out_dir / "loss_curves.png", "E1: MLP training per variant")
    figures.epoch_time_bars(out_dir / "summary.csv", out_dir / "epoch_time.png")
    _samples_figure(evals[0], out_dir / "samples.png", "E1: sample test classifications")


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
    repeated = frame[frame.duplicated(["variant", *E2_CELL])]
    if not repeated.empty:
        first = repeated.iloc[0]
        raise GpunnError(f"E2 has two runs of {first['variant']} at batch {first['batch']}, hidden {first['hidden']}; "
                         "keep one per variant and cell")
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


def report_e2(runs, out_dir, **_):
    frame = pd.DataFrame([run_row(r) for r in runs]).rename(columns={"widths": "hidden"})
    frame["hidden"] = frame["hidden"].astype(int)
    frame = _sorted(add_baseline_comparisons(frame, keys=E2_CELL), ["variant", "hidden", "batch"])
    cols = ["variant", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy",
            "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy"]
    title = "E2: MLP hidden x batch sweep (37 800 / 4 200 split)"
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md", title,
                         columns=cols, formats=COMPARISON_FORMATS, note=COMPARISON_NOTE)
    paper = e2_paper_table(frame)
    tables.summary_table(paper.to_dict("records"), out_dir / "paper_table.csv", out_dir / "paper_table.md",
                         f"{title}, laid out as in the paper",
                         formats={c: _times for c in paper.columns if c.endswith(E2_WIDE_SPEEDUP)},
                         note="Times in seconds, summed over all epochs; accuracy on the test split; "
                              f"{E2_WIDE_SPEEDUP}: cpu-serial's training time over the variant's in the same cell.")
    figures.e2_heatmaps(out_dir / "summary.csv", out_dir / "heatmaps.png")
    figures.e2_phase_times(out_dir / "summary.csv", out_dir / "forward_backward.png")


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
    return pd.concat([tables.read_table(p, columns, what) for p in paths], ignore_index=True)


def report_e3(timings, out_dir, blocks=(), **_):
    frame = _sorted(_read_csvs(timings, figures.E3_COLUMNS, "E3 timing CSV"), ["variant", "batch"])
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E3: MLP step time per batch size and variant")
    figures.batch_timing(out_dir / "summary.csv", out_dir / "batch_timing.png")
    if not blocks:  # the block-size sweep is optional by hand; the workflow always passes it
        return
    sweep = _read_csvs(blocks, figures.BLOCK_COLUMNS, "block-size sweep CSV")
    devices = sorted({str(d) for d in sweep["device"].dropna()})
    if len(devices) > 1:
        raise GpunnError(f"{', '.join(map(str, blocks))}: block sweep mixes devices {', '.join(devices)}; "
                         "the fastest block is only meaningful on one")
    table = block_table(sweep)
    on_device = f" on {devices[0]}" if devices else ""
    tables.summary_table(table.to_dict("records"), out_dir / "blocks.csv", out_dir / "blocks.md",
                         f"E3: kernel time (ms) against threads per block{on_device}",
                         note="One row per op and shape (rows x cols); '-': that block size did not run. "
                              "best_gb_per_s: bandwidth at the fastest block.")
    figures.block_sweep(blocks, out_dir / "block_sweep.png")


def report_e4(runs, evals, out_dir, **_):
    frame = pd.DataFrame([run_row(r) for r in runs]).sort_values(["dataset", "variant"])
    cols = ["dataset", "variant", "widths", "batch", "lr", "epochs", "parameters", "train_time_s",
            "time_per_epoch_s", "final_train_loss", "test_accuracy"]
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E4: CNN per dataset and variant", columns=cols)
    _curves(runs, ["dataset", "variant"], out_dir / "loss_curves.png", "E4: CNN training")
    for eval_dir in evals:
        dataset = _read_json(Path(eval_dir) / "eval.json")["run"].split("/")[0]
        _samples_figure(eval_dir, out_dir / f"samples_{dataset}.png", f"E4: sample test classifications, {dataset}")


def report_e5(runs, evals, out_dir, full_train_size: int = 50000, **_):
    frame = pd.DataFrame([run_row(r) for r in runs])
    # the paper extrapolated its CPU epoch over 1 000 images to the full 50 000; we do the same, labelled as such
    frame["extrapolated_full_epoch_s"] = frame["time_per_epoch_s"] * full_train_size / frame["n_train"]
    frame = frame.rename(columns={"test_loss": "test_mse", "final_train_loss": "final_train_mse"})
    cols = ["variant", "dataset", "widths", "n_train", "batch", "lr", "epochs", "parameters", "time_per_epoch_s",
            "extrapolated_full_epoch_s", "final_train_mse", "test_mse"]
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E5: convolutional autoencoder", columns=cols)
    _curves(runs, ["variant"], out_dir / "loss_curves.png", "E5: autoencoder MSE")
    _samples_figure(evals[0], out_dir / "reconstructions.png", "E5: test images (top) and reconstructions (bottom)")


def report_e6(svm, out_dir, **_):
    rows = []
    for svm_dir in svm:
        metrics = _read_json(Path(svm_dir) / "metrics.json")
        rows.append({key: metrics.get(key) for key in ("method", "C", "gamma", "n_train", "n_test", "n_features",
                                                       "train_accuracy", "test_accuracy", "fit_time_s")})
        per_class = metrics.get("per_class_accuracy", {})
        rows[-1].update({f"{name}_accuracy": acc for name, acc in per_class.items()})
    tables.summary_table(rows, out_dir / "summary.csv", out_dir / "summary.md",
                         "E6: SVM (RBF) on autoencoder features")


REPORTS = {"e1": report_e1, "e2": report_e2, "e3": report_e3, "e4": report_e4, "e5": report_e5, "e6": report_e6}


def make_report(experiment: str, out_dir, runs=(), evals=(), timings=(), svm=(), blocks=(), **options) -> None:
    if experiment not in REPORTS:
        raise GpunnError(f"unknown experiment '{experiment}': choose one of {', '.join(REPORTS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    REPORTS[experiment](runs=list(runs), evals=list(evals), timings=list(timings), svm=list(svm),
                        blocks=list(blocks), out_dir=out_dir, **options)
