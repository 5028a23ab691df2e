"""E2: the MLP's hidden size x batch size sweep on the 37 800 / 4 200 split, against paper 002 (serial, naive
GPU, device memory, tiled forward).

Report: train / forward / backward time, accuracy, speedups (tidy summary, and the paper's wide layout in
paper_table); heatmaps; training, forward and backward time against hidden size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.experiments.base import Experiment, Headline, as_list, with_repeats
from gpunn.report import divergence, figures, paper_vs_ours, spread, tables, titles
from gpunn.report.captions import Caption
from gpunn.report.paper_vs_ours import TIME_QUANTITIES, accuracy_in, one_baseline, scaled_time
from gpunn.report.papers import PaperValue, select
from gpunn.report.runs import (
    COMPARISON_FORMATS,
    COMPARISON_NOTE,
    add_baseline_comparisons,
    clock_note,
    clocks_comparable,
    join_notes,
    measured_runs,
    one_run_each,
    sorted_rows,
    times,
)
from gpunn.report.tables import ordered_variants, read_table
from gpunn.runspec import RunSpec

PAPER = "002_2b64d4e77899e131.txt"
# paper 002's phases -> our variants: its naive GPU used unified memory; its optimization #1 moved to cudaMalloc +
# cudaMemcpy, as every gpunn GPU variant does, and lost accuracy (uninitialised buffers): no variant of ours stands
# for it alone; #2 tiled the forward GEMM only (gpu-tiled tiles the backward ones too)
PHASES = {"Serial": ("cpu-serial",), "Naive": ("gpu-naive",), "Optimization #1": (), "Optimization #2": ("gpu-tiled",)}
_E2_CPU, _E2_GPU = "CPU (not named in the paper)", "GPU (not named in the paper)"
_E2 = dict(experiment="e2", paper=PAPER, phases=PHASES, dataset="mnist", n_train=37800, n_test=4200, epochs=5)
_E2_ROWS = {"Training time (s)": ("train_time", "s"), "Forward propagation time (s)": ("forward_time", "s"),
            "Backpropagation time (s)": ("backward_time", "s"), "Test accuracy": ("test_accuracy", "fraction")}
_E2_HIDDEN = (32, 64, 128, 256)
# phase: (its section heading in the paper, as printed), then per batch size each row's cells for hidden 32 ... 256
_E2_TABLES = {
    "Serial": ("Serial Implementation:**", {
        32: (("53.7502", "101.854", "298.495", "641.182"), ("25.547", "48.2244", "142.924", "305.355"),
             ("28.1886", "53.6147", "155.556", "335.795"), ("0.924141", "0.913168", "0.903149", "0.883826")),
        64: (("52.4897", "102.788", "292.312", "640.129"), ("24.8217", "48.7706", "140.632", "305.177"),
             ("27.6457", "53.9888", "151.656", "334.922"), ("0.921994", "0.918177", "0.908397", "0.890983")),
        128: (("52.5417", "117.589", "294.443", "640.037"), ("24.8378", "57.6774", "141.233", "305.181"),
              ("27.689", "59.8883", "153.194", "334.829"), ("0.926527", "0.919132", "0.905773", "0.884303")),
    }),
    "Naive": ("Naive Parallel Implementation:**", {
        32: (("4.08057", "4.20267", "4.70656", "6.62628"), ("1.85931", "1.85233", "1.96686", "2.29949"),
             ("1.97359", "2.11107", "2.50106", "4.06278"), ("0.926765", "0.911498", "0.902433", "0.889313")),
        64: (("2.16029", "2.26497", "2.82669", "4.60949"), ("0.978487", "0.987802", "1.0069", "1.45947"),
             ("1.04824", "1.14375", "1.68536", "3.00794"), ("0.92605", "0.920086", "0.877604", "0.859375")),
        128: (("1.13883", "1.4589", "2.08266", "3.7738"), ("0.506824", "0.530228", "0.663619", "1.11407"),
              ("0.555735", "0.850573", "1.34303", "2.58632"), ("0.89607", "0.866951", "0.848485", "0.763494")),
    }),
    "Optimization #1": ("Parallel Optimization #1: Unified Memory Optimization:", {
        32: (("3.86961", "3.99109", "4.63106", "5.50236"), ("1.87352", "1.87325", "2.06445", "2.26276"),
             ("1.97332", "2.0951", "2.54402", "3.21667"), ("0.924141", "0.857347", "0.794609", "0.72376")),
        64: (("2.0507", "2.01787", "2.3057", "2.84771"), ("0.994761", "0.971128", "1.01114", "1.14148"),
             ("1.04451", "1.01875", "1.28303", "1.69464"), ("0.923187", "0.881629", "0.72822", "0.544508")),
        128: (("1.09844", "1.01638", "2.01367", "2.31638"), ("0.538116", "0.478708", "0.675377", "0.756874"),
              ("0.554768", "0.531796", "1.33255", "1.55173"), ("0.841856", "0.779119", "0.699337", "0.316051")),
    }),
    "Optimization #2": ("Parallel Optimization #2: Shared Memory and Tiling:", {
        32: (("3.18578", "3.14709", "3.48614", "4.1886"), ("0.842789", "0.841156", "0.909431", "0.879057"),
             ("2.04593", "2.00311", "2.26113", "3.05697"), ("0.924141", "0.912929", "0.903149", "0.88645")),
        64: (("1.43178", "1.50934", "2.01402", "3.3077"), ("0.378923", "0.39256", "0.410312", "0.583677"),
             ("0.929922", "0.986995", "1.47011", "2.58314"), ("0.927242", "0.913884", "0.886364", "0.858191")),
        128: (("0.947403", "1.01155", "1.64613", "2.89612"), ("0.240763", "0.20776", "0.288108", "0.408085"),
              ("0.612559", "0.720308", "1.27084", "2.40406"), ("0.895833", "0.877604", "0.84517", "0.776042")),
    }),
}
_E2_NOTES = {"Optimization #1": "cudaMalloc + cudaMemcpy instead of unified memory; its accuracy loss is the paper's "
                                "uninitialised buffers",
             "Optimization #2": "the paper tiled the forward GEMM only"}


def _e2_heading(heading: str) -> str:
    """'Naive Parallel Implementation:**' -> 'Naive Parallel Implementation' (the section's name)."""
    return heading.rstrip("*:")


def _e2_tables() -> tuple[PaperValue, ...]:
    entries = []
    for phase, (heading, by_batch) in _E2_TABLES.items():
        hardware = _E2_CPU if phase == "Serial" else _E2_GPU
        for batch, rows in by_batch.items():
            for (row, (quantity, unit)), cells in zip(_E2_ROWS.items(), rows):
                for hidden, text in zip(_E2_HIDDEN, cells):
                    entries.append(PaperValue(
                        source=f"{_e2_heading(heading)}, Batch size {batch}", anchor=(heading, f"Batch size {batch}"),
                        quantity=quantity, unit=unit, text=text, phase=phase, hardware=hardware, row=row,
                        column=f"{hidden} nodes", batch=batch, hidden=hidden,
                        block=None if phase == "Serial" else 1024,  # "we used a 32x32 block"
                        note=_E2_NOTES.get(phase, ""), **_E2))
    return tuple(entries)


_E2_NAIVE_TEXT = dict(source="Naive Parallel Implementation (text)",
                      anchor=("We observed a decrease in training time",), **_E2)
PAPER_VALUES = _e2_tables() + (
    PaperValue(quantity="speedup", unit="x", text="13", phase="Naive", versus="Serial", hardware=f"{_E2_GPU} vs "
               f"{_E2_CPU}", hidden=32, batch=32, note="'a factor of 13 for the smallest model and batch size'",
               **_E2_NAIVE_TEXT),
    PaperValue(quantity="speedup", unit="x", text="150", phase="Naive", versus="Serial", hardware=f"{_E2_GPU} vs "
               f"{_E2_CPU}", hidden=256, batch=128, note="'a factor of over 150 for the largest model with the "
                                                         "largest batch size'", **_E2_NAIVE_TEXT),
    PaperValue(quantity="time_reduction", unit="%", text="10", phase="Optimization #1", versus="Naive",
               hardware=_E2_GPU, source="Parallel Optimization #1 (text)",
               anchor=("Parallel Optimization #1", "Overall, we see a slight improvement"),
               note="'~10% performance boost'", **_E2),
    PaperValue(quantity="speedup", unit="x", text="220", phase="Optimization #2", versus="Serial",
               hardware=f"{_E2_GPU} vs {_E2_CPU}", hidden=256, batch=128, source="Parallel Optimization #2 (text)",
               anchor=("From the tiling method",), note="'a nearly 220 times speed up' for the largest model and "
                                                         "batch size", **_E2),
)
E2_SHOWN = ("variant", "device", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "diverged", "at_chance")
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
    one_run_each(frame, "E2", E2_CELL)
    wide = frame.pivot(index=list(E2_CELL), columns="variant", values=list(E2_WIDE_METRICS))
    # a speedup only between clocks that ran alone (runs.clocks_comparable)
    alone = frame.assign(t=frame["train_time_s"].where(
        frame["timing_mode"].map(clocks_comparable) if "timing_mode" in frame else True)).pivot(
        index=list(E2_CELL), columns="variant", values="t")
    variants = ordered_variants(frame["variant"])
    serial_time = alone["cpu-serial"] if "cpu-serial" in variants else np.nan
    columns = {}
    for variant in variants:
        for metric, short in E2_WIDE_METRICS.items():
            columns[f"{variant} {short}"] = wide[(metric, variant)]
        if variant != "cpu-serial":
            columns[f"{variant} {E2_WIDE_SPEEDUP}"] = serial_time / alone[variant]
    return pd.DataFrame(columns, index=wide.index).reset_index()


def e2_head(frame: pd.DataFrame) -> str:
    """'E2: MLP 784-hidden-10, hidden {32, 64} x batch {32, 128} on mnist (e2 split, 37 800 train / 4 200
    test), 5 epochs': the sweep as run, not as the paper ran it. `frame` has the runs' rows (widths as hidden)."""
    rows = frame.rename(columns={"hidden": "widths"}).assign(widths=lambda f: f["widths"].astype(str))
    sweep = f"hidden {titles.one_or_set(frame['hidden'])} x batch {titles.one_or_set(frame['batch'])}"
    return (f"E2: {titles.model_description(rows)}, {sweep} on {titles.data_description(rows)}, "
            f"{titles.training_description(rows, sweep=('batch',))}")


def report_e2(runs, out_dir, **_) -> dict[str, str]:
    frame = measured_runs(runs, ("widths", "batch")).rename(columns={"widths": "hidden"})  # repeats: the bands
    frame["hidden"] = frame["hidden"].astype(int)
    frame = sorted_rows(add_baseline_comparisons(frame, keys=E2_CELL), ["variant", "hidden", "batch"])
    cols = ["variant", "device", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s",
            "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy", *spread.BAND_COLUMNS, "diverged", "at_chance", "simulator",
            "timing_mode"]
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
                         note=join_notes(COMPARISON_NOTE, clock_note(frame), divergence.summary_note(frame),
                                         titles.simulated_note(frame)))
    paper = e2_paper_table(frame)
    tables.summary_table(paper.to_dict("records"), out_dir / "paper_table.csv", out_dir / "paper_table.md",
                         written["paper_table.md"],
                         formats={c: times for c in paper.columns if c.endswith(E2_WIDE_SPEEDUP)},
                         note=join_notes("Times in seconds, summed over all epochs; accuracy on the test split; "
                                    f"{E2_WIDE_SPEEDUP}: cpu-serial's training time over the variant's in the "
                                    "same cell.", titles.simulated_note(frame)))
    e2_heatmaps(out_dir / "summary.csv", out_dir / "heatmaps.png", written["heatmaps.png"])
    e2_phase_times(out_dir / "summary.csv", out_dir / "forward_backward.png",
                           written["forward_backward.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report(paper_vs_ours.rows_for(OursE2(frame, PAPER_VALUES)),
                                                       out_dir, head, PAPER)
    return written


E2_COLUMNS = ("variant", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy")


def e2_heatmaps(table_csv, out_png, title: str = "E2: MLP hidden size x batch size") -> Path:
    """One column of panels per variant: training time (top row, one shared log colour scale, annotated in
    seconds) and test accuracy (bottom row, annotated in %) over hidden size (rows) x batch size (columns)."""
    frame = read_table(table_csv, E2_COLUMNS, "E2 sweep table")
    variants = ordered_variants(frame["variant"])
    frame = frame.assign(variant=frame["variant"].astype(str))
    simulated, diverged = figures.simulated_variants(frame), divergence.diverged_in(frame)
    hiddens = sorted(pd.unique(frame["hidden"]))
    batches = sorted(pd.unique(frame["batch"]))
    times = pd.to_numeric(frame["train_time_s"], errors="coerce")
    accs = pd.to_numeric(frame["test_accuracy"], errors="coerce")
    has_acc = accs.notna().any()
    positive = times[times > 0]
    if positive.empty:
        raise GpunnError(f"{table_csv}: E2 sweep table has no positive train_time_s")
    norm = figures.log_norm(vmin=float(positive.min()), vmax=max(float(positive.max()), float(positive.min()) * 1.01))
    acc_lo = float(accs.min()) * 100 if has_acc else 0.0
    acc_hi = float(accs.max()) * 100 if has_acc else 100.0
    if acc_hi - acc_lo < 0.5:
        acc_lo, acc_hi = acc_lo - 0.25, acc_hi + 0.25

    nv = len(variants)
    nrows = 2 if has_acc else 1
    fig, axes = figures.pyplot().subplots(nrows, nv, figsize=(3.2 * nv + 1.5, 3.1 * nrows + 0.6), squeeze=False,
                             layout="constrained")

    def grid(sub, column):
        g = np.full((len(hiddens), len(batches)), np.nan)
        for _, r in sub.iterrows():
            g[hiddens.index(r["hidden"]), batches.index(r["batch"])] = r[column]
        return g

    im_t = im_a = None
    for k, variant in enumerate(variants):
        sub = frame[frame["variant"] == variant].copy()
        sub["train_time_s"] = pd.to_numeric(sub["train_time_s"], errors="coerce")
        sub["test_accuracy"] = pd.to_numeric(sub["test_accuracy"], errors="coerce") * 100
        t = grid(sub, "train_time_s")
        ax = axes[0, k]
        t = np.where(t > 0, t, np.nan)
        im_t = ax.imshow(np.ma.masked_invalid(t), cmap="viridis", norm=norm, aspect="auto")
        # viridis is dark at the low end
        figures.annotate(ax, t, lambda v: f"{v:.3g} s", np.ma.filled(norm(np.nan_to_num(t, nan=norm.vmax)), 1.0) < 0.5)
        ax.set_title(f"{figures.variant_label(variant, simulated, diverged=diverged)}: training time")
        if has_acc:
            a = grid(sub, "test_accuracy")
            ax2 = axes[1, k]
            im_a = ax2.imshow(np.ma.masked_invalid(a), cmap="magma", vmin=acc_lo, vmax=acc_hi, aspect="auto")
            # magma is dark at the low end
            dark = np.nan_to_num((a - acc_lo) / (acc_hi - acc_lo), nan=1.0) < 0.5
            figures.annotate(ax2, a, lambda v: f"{v:.2f}%", dark)
            ax2.set_title(f"{figures.variant_label(variant, simulated, diverged=diverged)}: test accuracy")
        for ax_ in axes[:, k]:
            ax_.set_xticks(range(len(batches)))
            ax_.set_xticklabels([str(b) for b in batches])
            ax_.set_yticks(range(len(hiddens)))
            ax_.set_yticklabels([str(h) for h in hiddens])
            ax_.set_xlabel("batch size")
            if k == 0:
                ax_.set_ylabel("hidden units")
    fig.colorbar(im_t, ax=list(axes[0, :]), fraction=0.05, pad=0.02).set_label("training time (s, log scale)")
    if has_acc:
        fig.colorbar(im_a, ax=list(axes[1, :]), fraction=0.05, pad=0.02).set_label("test accuracy (%)")
    fig.suptitle(title)
    return figures.save(fig, out_png)


def e2_phase_times(table_csv, out_png,
                   title: str = "E2: training, forward and backward time against hidden size") -> Path:
    """Training time (top row: paper 002's figure, training time against hidden size per batch size and variant),
    then its forward and backward parts (the rows below), each summed over training, against hidden size; one
    column of panels per batch size and one line per variant. Log axes shared by all panels, so batch sizes and
    phases compare directly."""
    frame = read_table(table_csv, E2_COLUMNS, "E2 sweep table")
    frame = figures.numeric(frame.assign(variant=frame["variant"].astype(str)),
                     ["hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s"])
    variants = ordered_variants(frame["variant"])
    colors = figures.variant_colors(variants)
    styles = dict(zip(variants, figures.series_styles(len(variants))))
    simulated = figures.simulated_variants(frame)
    hiddens = sorted(frame["hidden"].dropna().unique())
    batches = sorted(frame["batch"].dropna().unique())
    phases = (("train_time_s", "training", "training time (s)"),
              ("forward_time_s", "forward", "forward time over training (s)"),
              ("backward_time_s", "backward", "backward time over training (s)"))
    size = (4.0 * len(batches) + 0.8, 3.8 * len(phases))
    fig, axes = figures.pyplot().subplots(len(phases), len(batches), figsize=size,
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    handles = {}
    for row, (column, phase, ylabel) in enumerate(phases):
        for k, batch in enumerate(batches):
            ax = axes[row, k]
            lines = {}
            for variant in variants:
                sub = frame[(frame["variant"] == variant) & (frame["batch"] == batch)].sort_values("hidden")
                seconds = sub[column].where(sub[column] > 0)
                (handles[variant],) = ax.plot(sub["hidden"], seconds, color=colors[variant], **styles[variant])
                lines[variant] = (sub["hidden"], seconds)
            ax.set_yscale("log")
            figures.log2_ticks(ax, hiddens)
            figures.titled_with_coincidences(ax, f"{phase}, batch {int(batch)}", lines)
            ax.grid(alpha=0.3, which="both")
            if row == len(phases) - 1:
                ax.set_xlabel("hidden units")
            if k == 0:
                ax.set_ylabel(ylabel)
    diverged = divergence.diverged_in(frame)
    fig.legend(handles.values(), [figures.variant_label(v, simulated, diverged=diverged) for v in handles],
               loc="outside lower center", ncols=min(len(handles), 4), fontsize="small")
    fig.suptitle(title)
    return figures.save(fig, out_png)


class OursE2(paper_vs_ours.Ours):
    """E2: the run of each variant in the entry's (batch, hidden) cell; speedups over cpu-serial's cell."""

    experiment = "e2"
    needs = ("variant", "batch", "hidden", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy",
             "n_train", "n_test")
    base_phase = "Serial"

    def candidates(self, entry):
        return self.frame[(self.frame["batch"] == entry.batch) & (self.frame["hidden"] == entry.hidden)]

    def where(self, entry):
        return f" at batch {entry.batch}, hidden {entry.hidden}"

    def paper_baseline(self, entry):
        if entry.quantity not in TIME_QUANTITIES:
            return None  # the serial cell of the same batch and hidden size, in the serial section's table
        return one_baseline(select(self.values, "e2", entry.quantity, phase=self.base_phase, batch=entry.batch,
                                          hidden=entry.hidden), entry)

    def measure(self, entry, run):
        column = {"train_time": "train_time_s", "forward_time": "forward_time_s",
                  "backward_time": "backward_time_s"}.get(entry.quantity)
        if column is not None:
            return scaled_time(float(run[column]), entry.unit), ""
        if entry.quantity == "test_accuracy":
            return accuracy_in(run["test_accuracy"], entry.unit), ""
        return None, f"gpunn does not measure {entry.quantity}"

    def differences(self, entry, run):
        differs = super().differences(entry, run)
        if (run["n_train"], run["n_test"]) != (entry.n_train, entry.n_test):
            differs.append(f"{titles.count(run['n_train'])} train / {titles.count(run['n_test'])} test")
        return differs


CAPTIONS = {
    "heatmaps.png": Caption(
        "Training time (log colour scale) and test accuracy over hidden size x batch size, one panel per variant.",
        "paper 002's tables, one per implementation and batch size, of training time and test accuracy per hidden "
        "size", "paper 002 tables"),
    "forward_backward.png": Caption(
        "Training, forward and backward time summed over training against hidden size, one column of panels per "
        "batch size, one line per variant, log axes shared by all panels.",
        "paper 002's 'Training time', 'Forward propagation time' and 'Backpropagation time' rows across its hidden "
        "sizes, drawn as lines", "paper 002 tables"),
}


def runs(config: dict) -> list[RunSpec]:
    """Every variant at every hidden size and batch size, on the e2 split, then the spread's repeats (spread_runs:
    with_repeats)."""
    exp = config["experiments"]["e2"]
    return with_repeats([RunSpec(exp["dataset"], "e2", "mlp", v, (h,), b, exp["lr"], exp["epochs"], exp["seed"])
                         for v in exp["variants"] for h in as_list(exp["hidden"]) for b in as_list(exp["batch"])],
                        exp.get("spread_runs", 1))


EXPERIMENT = Experiment(
    name="e2", title="MLP hidden size x batch size sweep",
    description="MLP hidden x batch sweep on the 37 800 / 4 200 split: train, forward, backward time, accuracy",
    model="mlp", paper=PAPER, runs=runs,
    tables=lambda config: ["summary", "paper_table", "paper_vs_ours"],
    figures=lambda config: ["heatmaps.png", "forward_backward.png"],
    report=report_e2, captions=CAPTIONS, paper_values=PAPER_VALUES,
    headlines=(
        Headline("e2", "tiled GPU test accuracy, hidden 256, batch 128", "test_accuracy",
                 {"phase": "Optimization #2", "hidden": 256, "batch": 128}),
        Headline("e2", "tiled GPU speedup over serial, hidden 256, batch 128", "speedup",
                 {"phase": "Optimization #2"}),
    ),
)
