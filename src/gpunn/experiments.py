"""Report of each experiment E1..E6: a summary table (CSV + Markdown) and its figures, built from the
outputs of finished runs. Paper numbers for comparison are in ../shared/ANCHORS.md and the README.

    e1  MLP on MNIST per variant: time, time per epoch, accuracy, speedups; loss curves; sample predictions
    e2  MLP hidden x batch sweep on the 37 800 / 4 200 split: train / forward / backward time, accuracy
    e3  MLP forward / backward / step time and samples/s per batch size and variant
    e4  CNN on MNIST and Fashion-MNIST: accuracy and time per variant; loss curves; sample predictions
    e5  autoencoder: epoch time, test MSE; loss curves; reconstruction grid
    e6  SVM on encoder features: accuracy, per-class accuracy, fit time; confusion matrix (by the svm step)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.report import figures, tables


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
    summary = _read_json(Path(run_dir) / "metrics.json")
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


def _speedups(frame: pd.DataFrame, baselines=("cpu-serial", "cpu-numpy")) -> pd.DataFrame:
    for base in baselines:
        ref = frame.loc[frame["variant"] == base, "train_time_s"]
        frame[f"speedup_vs_{base.replace('-', '_')}"] = (float(ref.iloc[0]) / frame["train_time_s"]) if len(ref) else np.nan
    return frame


def _curves(run_dirs, label_fields, out_png, title) -> None:
    labelled = {}
    for run_dir in run_dirs:
        row = run_row(run_dir)
        labelled[" ".join(str(row[f]) for f in label_fields)] = Path(run_dir) / "metrics.csv"
    figures.loss_curves(labelled, out_png, title)


def _samples_figure(eval_dir, out_png, title) -> None:
    with np.load(Path(eval_dir) / "samples.npz", allow_pickle=False) as saved:
        if "reconstructions" in saved:
            figures.reconstruction_grid(saved["images"], saved["reconstructions"], out_png, title)
        else:
            figures.sample_classifications(saved["images"], saved["labels"], saved["predictions"],
                                           [str(c) for c in saved["class_names"]], out_png, title)


def report_e1(runs, evals, out_dir, **_):
    frame = _speedups(pd.DataFrame([run_row(r) for r in runs]))
    cols = ["variant", "dataset", "widths", "batch", "lr", "epochs", "train_time_s", "time_per_epoch_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy"]
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E1: MLP 784-hidden-10 on MNIST, per variant", columns=cols)
    _curves(runs, ["variant"], out_dir / "loss_curves.png", "E1: MLP training per variant")
    _samples_figure(evals[0], out_dir / "samples.png", "E1: sample test classifications")


def report_e2(runs, out_dir, **_):
    frame = pd.DataFrame([run_row(r) for r in runs]).rename(columns={"widths": "hidden"})
    frame["hidden"] = frame["hidden"].astype(int)
    frame = frame.sort_values(["variant", "hidden", "batch"])
    cols = ["variant", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy"]
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E2: MLP hidden x batch sweep (37 800 / 4 200 split)", columns=cols)
    figures.e2_heatmaps(out_dir / "summary.csv", out_dir / "heatmaps.png")


def report_e3(timings, out_dir, **_):
    frame = pd.concat([pd.read_csv(t) for t in timings], ignore_index=True)
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         "E3: MLP step time per batch size and variant")
    figures.batch_timing(out_dir / "summary.csv", out_dir / "batch_timing.png")


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


def make_report(experiment: str, out_dir, runs=(), evals=(), timings=(), svm=(), **options) -> None:
    if experiment not in REPORTS:
        raise GpunnError(f"unknown experiment '{experiment}': choose one of {', '.join(REPORTS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    REPORTS[experiment](runs=list(runs), evals=list(evals), timings=list(timings), svm=list(svm),
                        out_dir=out_dir, **options)
