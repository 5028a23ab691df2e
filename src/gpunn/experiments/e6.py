"""E6: an RBF SVM on the encoder features of one E5 run (experiments.e6.variant), against paper 004's SVM
(Phase 2.5, cuML on a GPU).

Report: accuracy, per-class accuracy, kernel, fit and predict time (summary); the confusion matrix of the SVM run
(from the svm step's confusion.csv). It trains no runs of its own: its features come from E5's run of its variant.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.configcheck import choice_error, gpu_machine
from gpunn.errors import GpunnError
from gpunn.experiments import e5
from gpunn.experiments.base import Experiment, Headline
from gpunn.report import figures, paper_vs_ours, tables, titles
from gpunn.report.captions import Caption
from gpunn.report.paper_vs_ours import accuracy_in, missing, scaled_time
from gpunn.report.papers import PaperValue
from gpunn.report.runs import read_json
from gpunn.runspec import RunSpec, parse_run_path
from gpunn.svm import METHODS, PREDICTIONS

PAPER, PHASES = e5.PAPER, e5.PHASES  # paper 004 holds E5 and E6

_E6 = dict(experiment="e6", paper=PAPER, phases=PHASES, phase="cuML SVC",
           hardware="GPU through cuML on Kaggle (model not stated)", dataset="cifar10 encoder features (8192)",
           n_train=50000, n_test=10000)
_E6_RESULTS = dict(source="Phase 2.5: SVM Integration, Results", anchor=("Phase 2.5", "SVM training time"), **_E6)
PAPER_VALUES = (
    PaperValue(quantity="fit_time", unit="s", text="46", note="'SVM training time: ~46 seconds'", **_E6_RESULTS),
    PaperValue(quantity="train_accuracy", unit="%", text="86.03", **_E6_RESULTS),
    PaperValue(quantity="test_accuracy", unit="%", text="67.56", **_E6_RESULTS),
    PaperValue(quantity="expected_accuracy", unit="%", text="60", upper_text="65", source="Phase 2.5: SVM Integration, "
               "Analysis", anchor=("Phase 2.5", "expected range"), note="the test accuracy it expected", **_E6),
)
E6_SHOWN = ("method", "device", "kernel_device", "C", "gamma", "train_accuracy", "test_accuracy", "points_vs_exact",
            "same_as_exact", "kernel_time_s", "fit_time_s", "predict_time_s")  # the title gives the row counts
# against method exact (libsvm) when it ran too: test accuracy minus exact's, in points; the share of the test points
# predicted as exact predicts them
E6_FORMATS = {"points_vs_exact": "{:+.2f}", "same_as_exact": lambda v: f"{100 * float(v):.2f} %"}


def e6_head(frame: pd.DataFrame) -> str:
    """'E6: SVM (RBF, exact) on 128 autoencoder features, 1 000 train / 500 test' from the svm metrics;
    '1 000 train (a stratified subset of 50 000)' when the training set was a subset."""
    methods = titles.join_words(titles.distinct(frame["method"])) if "method" in frame else "?"
    train = f"{titles.one_or_set(frame['n_train'], titles.count)} train"
    if "subset" in frame and frame["subset"].fillna(False).astype(bool).any():
        train += f" (a stratified subset of {titles.one_or_set(frame['n_train_total'], titles.count)})"
    return (f"E6: SVM (RBF, {methods}) on {titles.one_or_set(frame['n_features'], titles.count)} autoencoder "
            f"features, {train} / {titles.one_or_set(frame['n_test'], titles.count)} test")


def _encoder_dataset(svm_dir) -> str | None:
    """The dataset of the encoder run an SVM folder (<svm>/<machine>/<run path>) classifies; None if not a run path."""
    try:
        return parse_run_path(str(svm_dir)).dataset
    except (GpunnError, ValueError):
        return None


def report_e6(svm, out_dir, **_) -> dict[str, str]:
    rows = []
    for svm_dir in svm:
        metrics = read_json(Path(svm_dir) / "metrics.json")
        fields = titles.device_fields(metrics.get("provenance"))
        rows.append({"method": metrics.get("method"), "device": fields["device"]})
        rows[-1].update({key: metrics.get(key) for key in ("C", "gamma", "n_train", "n_test", "n_features",
                                                           "subset", "n_train_total", "kernel_device",
                                                           "train_accuracy", "test_accuracy", "kernel_time_s",
                                                           "fit_time_s", "predict_time_s")})
        per_class = metrics.get("per_class_accuracy", {})
        rows[-1].update({f"{name}_accuracy": acc for name, acc in per_class.items()})
        rows[-1]["simulator"], rows[-1]["cpu"] = fields["simulator"], fields["cpu"]
    _against_exact(rows, svm)
    frame = pd.DataFrame(rows)
    frame["dataset"] = [_encoder_dataset(svm_dir) for svm_dir in svm]  # for paper_vs_ours: the paper's CIFAR-10?
    written = {"summary.md": titles.table_title(e6_head(frame), titles.timing_parts(frame))}
    tables.summary_table([{k: v for k, v in r.items() if k != "cpu"} for r in rows], out_dir / "summary.csv",
                         out_dir / "summary.md", written["summary.md"], shown=E6_SHOWN, formats=E6_FORMATS,
                         note=_e6_per_class(rows))
    written["paper_vs_ours.md"] = paper_vs_ours.report(paper_vs_ours.rows_for(OursE6(frame, PAPER_VALUES)),
                                                       out_dir, e6_head(frame), PAPER)
    shown = _preferred(frame, PAPER_VALUES[0].ours)
    written["confusion.png"] = _e6_confusion(svm[shown], frame.iloc[shown], e6_head(frame), out_dir / "confusion.png")
    return written


def _preferred(frame: pd.DataFrame, methods) -> int:
    """The row of the first of `methods` that ran (the paper's phase's preferred method), else the first row."""
    for method in methods:
        found = [i for i, name in enumerate(frame["method"]) if name == method]
        if found:
            return found[0]
    return 0


def _against_exact(rows: list[dict], svm) -> None:
    """Each row of another method beside method exact's: points_vs_exact (its test accuracy minus exact's, in points)
    and same_as_exact (the share of the test points it predicts as exact does, from both predictions.csv; None when
    either folder has none, or they predicted different test rows)."""
    exact = [i for i, r in enumerate(rows) if r["method"] == "exact"]
    for i, row in enumerate(rows):
        row["points_vs_exact"] = row["same_as_exact"] = None
        if not exact or i == exact[0]:
            continue
        ref = rows[exact[0]]
        if not (missing(row.get("test_accuracy")) or missing(ref.get("test_accuracy"))):
            row["points_vs_exact"] = 100.0 * (float(row["test_accuracy"]) - float(ref["test_accuracy"]))
        ours, theirs = _predictions(svm[i]), _predictions(svm[exact[0]])
        if ours is not None and theirs is not None and np.array_equal(ours["row"], theirs["row"]):
            row["same_as_exact"] = float(np.mean(ours["predicted"].to_numpy() == theirs["predicted"].to_numpy()))


def _predictions(svm_dir) -> pd.DataFrame | None:
    """An svm folder's predictions.csv (gpunn.svm.PREDICTIONS), or None where it has none (a run made before it
    was written)."""
    path = Path(svm_dir) / PREDICTIONS
    if not path.is_file():
        return None
    return tables.read_table(path, ("row", "true", "predicted"), "SVM predictions CSV")


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


PAPER_FEATURES = 8192  # paper 004's encoder output, 8 x 8 x 128


class OursE6(paper_vs_ours.Ours):
    """E6: accuracies and fit time of the SVM run of the phase's preferred method (gpu-smo, the GPU solver, before
    exact) against the paper's cuML SVC."""

    experiment = "e6"
    needs = ("method", "train_accuracy", "test_accuracy", "fit_time_s")

    def run(self, entry, phase):
        if self.frame.empty:
            return None, "no SVM run"
        row = self.frame.iloc[_preferred(self.frame, entry.ours)].copy()
        row["variant"] = f"svm {row.get('method') or '?'}"
        return row, ""

    def measure(self, entry, run):
        if entry.quantity == "fit_time":
            value = run.get("fit_time_s")
            return (None, "not recorded") if missing(value) else (scaled_time(float(value), entry.unit), "")
        if entry.quantity in ("train_accuracy", "test_accuracy", "expected_accuracy"):
            column = "train_accuracy" if entry.quantity == "train_accuracy" else "test_accuracy"
            return accuracy_in(run.get(column), entry.unit), ""
        return None, f"gpunn does not measure {entry.quantity}"

    def differences(self, entry, run):
        differs = [] if run.get("method") in entry.ours else [f"method {run.get('method')}"]
        dataset = run.get("dataset")
        if entry.dataset and not missing(dataset) and str(dataset) != entry.dataset.split(" ")[0]:
            differs.append(str(dataset))  # features of another dataset's images (synthetic_cifar10 offline)
        if entry.n_train and not missing(run.get("n_train")) and int(run["n_train"]) != entry.n_train:
            differs.append(f"{titles.count(run['n_train'])} training rows")
        if not missing(run.get("n_features")) and int(run["n_features"]) != PAPER_FEATURES:
            differs.append(f"{titles.count(run['n_features'])} features")
        return differs

    def setting_note(self, entry, run):
        kernel = run.get("kernel_device")
        where = None if missing(kernel) else f"our RBF kernel computed on the {kernel}"
        return "; ".join(n for n in (super().setting_note(entry, run), where) if n)


CAPTIONS = {
    "confusion.png": Caption(
        "Confusion matrix of the RBF SVM on the encoder's features of the test set: rows are true classes, columns "
        "predicted ones, cells are counts.",
        "paper 004's SVM results (Phase 2.5), which give accuracies only; the matrix shows where they come from",
        "paper 004 Phase 2.5"),
}
AUTO = "auto"
# the `auto` encoder: the fastest GPU variant E5 trains, on the full training set
AUTO_ORDER = ("gpu-graph", "gpu-im2col", "gpu-tiled", "gpu-naive")


def auto_variant(e5_variants) -> str | None:
    """The E5 variant whose encoder E6 uses when experiments.e6.variant is auto."""
    for name in AUTO_ORDER:
        if name in e5_variants:
            return name
    return e5_variants[0] if e5_variants else None


def runs(config: dict) -> list[RunSpec]:
    """E5's run of experiments.e6.variant, whose encoder gives the features."""
    return [r for r in e5.runs(config) if r.variant == config["experiments"]["e6"]["variant"]]


def encoder_run(config: dict) -> RunSpec:
    found = runs(config)
    if not found:
        raise GpunnError(
            f"config key experiments.e6.variant = '{config['experiments']['e6']['variant']}' is not one of "
            f"experiments.e5.variants {config['experiments']['e5']['variants']}"
        )
    return found[0]


def svm_dir(layout, method: str, spec: RunSpec) -> str:
    """The svm step's folder of one method on the features of one encoder run: <svm>/<machine>/<method>/<run>."""
    return f"{layout.measured('svm')}/{method}/{spec.path}"


def inputs(config: dict, layout) -> dict[str, list[str]]:
    """The SVM's metrics (rule svm) of each method on the features of the encoder run."""
    spec, methods = encoder_run(config), config["experiments"]["e6"]["method"]
    return {"svm": [f"{svm_dir(layout, method, spec)}/metrics.json" for method in methods]}


def resolve_methods(config: dict) -> list[str]:
    """experiments.e6.method (one name or a list) as the list of methods run, each once, in the order given; auto is
    gpu-smo on a GPU machine (configcheck.gpu_machine), exact elsewhere (the CPU, the simulator)."""
    asked = config["experiments"]["e6"]["method"]
    methods = []
    for i, name in enumerate(asked if isinstance(asked, list) else [asked]):
        if name == AUTO:
            name = "gpu-smo" if gpu_machine(config) else "exact"
        if name not in METHODS:
            key = "experiments.e6.method" + (f"[{i}]" if isinstance(asked, list) else "")
            raise choice_error(key, name, (AUTO, *METHODS))
        if name not in methods:
            methods.append(name)
    return methods


def check(config: dict) -> None:
    """The encoder variant among E5's (auto: AUTO_ORDER), the methods (resolve_methods: the key becomes their list),
    the training subset and gamma."""
    exps = config["experiments"]
    e6 = exps["e6"]
    e6["method"] = resolve_methods(config)
    if e6["variant"] == AUTO:
        e6["variant"] = auto_variant(exps["e5"]["variants"])
    if e6["variant"] not in exps["e5"]["variants"]:
        raise choice_error("experiments.e6.variant", e6["variant"], exps["e5"]["variants"],
                           " is not one of experiments.e5.variants")
    subset = e6["train_subset"]
    if isinstance(subset, str) and subset != "auto":
        raise choice_error("experiments.e6.train_subset", subset, ["auto", "0 (all rows)", "a row count"])
    gamma = e6["gamma"]
    if isinstance(gamma, str) and gamma not in ("scale", "auto"):
        raise choice_error("experiments.e6.gamma", gamma, ["scale", "auto", "a positive number"])
    if not isinstance(gamma, str) and not gamma > 0:
        raise GpunnError(f"config key experiments.e6.gamma = {gamma!r}: a number must be positive")


def without_gpu(config: dict) -> list[str]:
    """The SVM kernel is computed on the CPU (kernel_device auto or gpu becomes cpu); method gpu-smo becomes exact
    (auto becomes exact in check: no GPU machine)."""
    e6 = config["experiments"]["e6"]
    asked, e6["kernel_device"] = e6["kernel_device"], "cpu"
    notes = (["E6's SVM kernel is computed on the CPU (experiments.e6.kernel_device: gpu ignored)"]
             if asked == "gpu" else [])
    methods = e6["method"] if isinstance(e6["method"], list) else [e6["method"]]
    if "gpu-smo" in methods:
        e6["method"] = ["exact" if name == "gpu-smo" else name for name in methods]
        notes.append("E6's SVM is libsvm's (experiments.e6.method: gpu-smo solves on the GPU; exact instead)")
    return notes


EXPERIMENT = Experiment(
    name="e6", title="RBF SVM on the autoencoder's encoder features",
    description="RBF SVM on the autoencoder's encoder features: accuracy, confusion matrix",
    model=None, paper=PAPER, runs=runs, tables=lambda config: ["summary", "paper_vs_ours"],
    figures=lambda config: ["confusion.png"], report=report_e6, captions=CAPTIONS, paper_values=PAPER_VALUES,
    inputs=inputs, check=check, without_gpu=without_gpu,
    headlines=(
        Headline("e6", "SVM train accuracy", "train_accuracy", {}),
        Headline("e6", "SVM test accuracy", "test_accuracy", {}),
        Headline("e6", "SVM fit time (s)", "fit_time", {}),
    ),
)
