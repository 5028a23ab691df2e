"""E1: the MLP 784-256-10 on MNIST, every variant once per loss reduction (mean, sum), against paper 000 (a CPU
and a T4).

Report: time, time per epoch, accuracy, speedups and accuracy difference to cpu-numpy of the same reduction
(summary); loss curves; time per epoch (bars); sample predictions; paper 000's CPU-GPU accuracy gap tested against
the loss reduction (gap.md: e1_gap_sentence and its runs; reduction_gap: their train loss per epoch beside the
paper's); where each GPU variant's training step spends its time (step_profile).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpunn import io
from gpunn.backends.registry import uses_gpu
from gpunn.errors import GpunnError
from gpunn.experiments.base import Experiment, Headline, first_run_per_dataset, with_repeats
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.report import divergence, figures, paper_vs_ours, spread, step_profile, tables, titles
from gpunn.report.captions import STEP_PROFILE_SHOWS, Caption
from gpunn.report.paper_vs_ours import accuracy_in, epoch_loss, scaled_time
from gpunn.report.papers import PaperValue, select, select_one
from gpunn.report.runs import (
    COMPARISON_FORMATS,
    COMPARISON_NOTE,
    add_baseline_comparisons,
    clock_note,
    join_notes,
    measured_runs,
    samples_figure,
    sorted_rows,
)
from gpunn.report.tables import format_ratio, format_significant, ordered_variants, read_table, run_labels
from gpunn.runspec import RunSpec

PAPER = "000_db1707331904318f.txt"
# paper 000's phases -> our variants: its CPU is a serial loop implementation (298 s for 10 MNIST epochs); its GPU
# one kernel per op, atomic bias gradients, the batch copied every step: our gpu-naive
PHASES = {"CPU": ("cpu-serial", "cpu-numpy"), "GPU": ("gpu-naive",)}
_E1_CPU, _E1_GPU = "CPU (model not stated)", "NVIDIA Tesla T4"
_E1 = dict(experiment="e1", paper=PAPER, phases=PHASES, dataset="mnist", n_train=60000, n_test=10000, batch=64,
           epochs=10,            hidden=256)
_E1_HW = {"CPU": _E1_CPU, "GPU": _E1_GPU}
_E1_TABLE = dict(source="2.5 Experimental Results: Measured Performance", anchor=("Measured Performance:",), **_E1)
_E1_TEXT = dict(source="2.5 Experimental Results: Training Convergence", anchor=("Training Convergence:",), **_E1)


def _e1_cell(phase, row, quantity, unit, text, **extra):
    return PaperValue(quantity=quantity, unit=unit, text=text, phase=phase, hardware=_E1_HW[phase], row=row,
                      column=phase, **_E1_TABLE, **extra)


PAPER_VALUES = (
    _e1_cell("CPU", "Total training time", "train_time", "ms", "298617.53"),
    _e1_cell("CPU", "Total training time", "train_time", "s", "298.62"),
    _e1_cell("GPU", "Total training time", "train_time", "ms", "2247.11"),
    _e1_cell("GPU", "Total training time", "train_time", "s", "2.25"),
    _e1_cell("CPU", "Avg. time per epoch", "epoch_time", "s", "29.86"),
    _e1_cell("GPU", "Avg. time per epoch", "epoch_time", "s", "0.225"),
    _e1_cell("CPU", "Test accuracy", "test_accuracy", "%", "97.93"),
    _e1_cell("GPU", "Test accuracy", "test_accuracy", "%", "93.86"),
    PaperValue(quantity="train_loss", unit="CE", text="0.2257", phase="CPU", hardware=_E1_CPU, epoch=1, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.0045", phase="CPU", hardware=_E1_CPU, epoch=10, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.8420", phase="GPU", hardware=_E1_GPU, epoch=1, **_E1_TEXT,
               note="'rapid initial drop from 0.8420': epoch 1 read from section 3.5 ('0.8420 -> 0.4102 in 2 "
                    "epochs')"),
    PaperValue(quantity="train_loss", unit="CE", text="0.4102", phase="GPU", hardware=_E1_GPU, epoch=2, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.2218", phase="GPU", hardware=_E1_GPU, epoch=10, **_E1_TEXT),
    PaperValue(quantity="speedup", unit="x", text="132.7", phase="GPU", versus="CPU",
               hardware=f"{_E1_GPU} vs {_E1_CPU}", **_E1_TEXT),
    PaperValue(quantity="accuracy_gap", unit="pp", text="4.1", phase="GPU", versus="CPU",
               hardware=f"{_E1_GPU} vs {_E1_CPU}", source="2.5 Experimental Results: Accuracy Analysis",
               anchor=("Accuracy Analysis:",), note="printed as 'a 4.1% difference'", **_E1),
    PaperValue(quantity="expected_speedup", unit="x", text="20", upper_text="100", phase="GPU", versus="CPU",
               hardware="a modern GPU vs a CPU (expectation)", source="2.3 Theoretical Performance Analysis",
               anchor=("2.3 Theoretical Performance Analysis", "Expected speedup over CPU"), **_E1),
)
# The columns of each summary's Markdown (MARKDOWN_COLUMNS at most; the CSV keeps every one): the settings that
# the title states (dataset, widths, batch, epochs) and the simulator flag (the device says it) are left out.
E1_SHOWN = ("variant", "reduction", "device", "train_time_s", "time_per_epoch_s", "test_accuracy",
            "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy", "accuracy_diff_vs_cpu_numpy_pp",
            "accuracy_matches_cpu_numpy", "diverged", "at_chance")
REDUCTION_NOTE = ("reduction: the loss gradient of the batch mean (mean) or of the summed per-sample losses (sum, "
                  "a step batch times larger at the same lr); each run is compared with the baselines trained with "
                  "its reduction. Losses are per-sample means either way.")
# Paper 000's CPU-GPU accuracy gap (97.93 % against 93.86 %): its CPU curve looks like a gradient summed over the
# batch, its GPU's like the batch mean. Its CPU and GPU designs, each run under both reductions, test that.
GAP_PHASES = ("CPU", "GPU")
GAP_REDUCTIONS = ("mean", "sum")


def _gap_candidates(variants, phase: str) -> list[str]:
    """The variants among `variants` that stand for paper 000's `phase`, preferred first: its own designs
    (PHASES: cpu-serial, then cpu-numpy; gpu-naive), then, for the GPU, every other GPU variant in report
    order."""
    ours = PHASES[phase]
    others = [v for v in ordered_variants(variants) if phase == "GPU" and v not in ours and uses_gpu(v)]
    return [v for v in (*ours, *others) if v in set(variants)]


def e1_gap_runs(frame: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """The runs that test paper 000's CPU-GPU gap by (phase, reduction), CPU then GPU, mean then sum; a pair that did
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


def _band_text(rows: dict[str, pd.Series]) -> str:
    """The run-to-run band of each reduction's runs (spread.describe), named per reduction where they differ."""
    texts = {r: spread.describe(row) for r, row in rows.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return " and ".join(f"{text} under {r}" for r, text in texts.items())


def e1_gap_sentence(frame: pd.DataFrame) -> str:
    """One sentence on what E1's runs say about paper 000's CPU-GPU accuracy gap, from the runs of e1_gap_runs: how
    far our CPU and GPU runs differ under each reduction, judged against that reduction's run-to-run band (the
    rows' accuracy_band_pp: spread.with_bands), and how far the sum's accuracy lies from the mean's. Where the data
    does not support the gap following the reduction (the devices differ beyond the band by half the reduction's
    effect or more, or the reductions do not differ beyond it), it says so; a smaller device effect beyond the
    band qualifies the verdict instead of turning it. Without a measured band: no verdict, and how to measure one;
    where the runs cannot test the gap: why, and what to configure. `frame`: as e1_gap_runs takes it (E1's summary
    frame or summary.csv, with spread.BAND_COLUMNS)."""
    paper_gap = _value("accuracy_gap").text
    gap_runs = e1_gap_runs(frame)
    missing = _gap_missing(frame, gap_runs)
    if missing:
        return f"Paper 000's {paper_gap}-point CPU-GPU accuracy gap cannot be tested here: {missing}."
    accuracy = {key: 100.0 * float(row["test_accuracy"]) for key, row in gap_runs.items()}
    cpu, gpu = gap_runs[("CPU", "mean")]["variant"], gap_runs[("GPU", "mean")]["variant"]
    device_diff = {r: accuracy[("GPU", r)] - accuracy[("CPU", r)] for r in GAP_REDUCTIONS}
    reduction_diff = {p: accuracy[(p, "sum")] - accuracy[(p, "mean")] for p in GAP_PHASES}
    pair = f"our CPU ({cpu}) and GPU ({gpu}) runs"
    each = "; ".join(f"{r}: {accuracy[('CPU', r)]:.2f} % vs {accuracy[('GPU', r)]:.2f} %" for r in GAP_REDUCTIONS)
    effect = sum(reduction_diff.values()) / len(reduction_diff)
    worst = max(abs(d) for d in device_diff.values())
    rows = {r: gap_runs[("GPU", r)] for r in GAP_REDUCTIONS}  # a reduction's CPU and GPU runs share its band
    if not all(spread.known(row) for row in rows.values()):
        return (f"Under either reduction {pair} differ by at most {worst:.2f} points ({each}) and sum minus mean is "
                f"{effect:+.2f} points, but {spread.unknown('e1')}: no verdict on the paper's {paper_gap}-point "
                "CPU-GPU gap.")
    bands = {r: float(row["accuracy_band_pp"]) for r, row in rows.items()}
    band_text = _band_text(rows)
    apart = [r for r in GAP_REDUCTIONS if not spread.within(device_diff[r], bands[r])]
    if apart and worst >= abs(effect) / 2:  # the device's effect is of the reduction's size: it explains a share
        return (f"Under reduction {titles.join_words(apart)} {pair} differ by more than their run-to-run spread "
                f"of {band_text} ({each}): the device changes the accuracy here, by up to {worst:.2f} points "
                f"against sum minus mean's {effect:+.2f}, so these runs do not show the paper's {paper_gap}-point "
                "CPU-GPU gap following the loss reduction alone.")
    if apart:  # a device effect beyond the spread, but small beside the reduction's: the verdict stands, qualified
        agree = (f"Under reduction {titles.join_words(apart)} {pair} differ by more than their run-to-run spread of "
                 f"{band_text}, by at most {worst:.2f} points ({each}): a device effect, but under half the "
                 "reduction's")
    else:
        agree = (f"Under either reduction {pair} differ by at most {worst:.2f} points ({each}), within their "
                 f"run-to-run spread of {band_text}")
    if not min(reduction_diff.values()) > max(bands.values()):
        return (f"{agree}, but sum minus mean is {reduction_diff['CPU']:+.2f} points on the CPU and "
                f"{reduction_diff['GPU']:+.2f} on the GPU, not above zero by more than that spread, and not the "
                f"paper's +{paper_gap}: these runs do not show the loss reduction behind the paper's CPU-GPU gap.")
    if effect < float(paper_gap) / 2:
        return (f"{agree}, while sum minus mean is only {effect:+.2f} points: the device does not explain the "
                f"paper's {paper_gap}-point CPU-GPU gap, and the loss reduction explains less than half of it here.")
    return (f"{agree}, while sum minus mean is {effect:+.2f} points: the paper's {paper_gap}-point CPU-GPU gap "
            "follows the loss reduction" + (", not the device." if not apart else ", the device adding little."))


GAP_COLUMNS = ("phase", "variant", "reduction", "device", "final_train_loss", "test_accuracy")


def _paper_gap_note() -> str:
    """Paper 000's own numbers (PAPER_VALUES) and which of our runs stand for its CPU and GPU."""
    def phase(name):
        accuracy = _value("test_accuracy", phase=name).text
        losses = ", ".join(f"{v.text} (epoch {v.epoch})" for v in _values("train_loss", phase=name))
        return f"{name} {accuracy} %, train loss {losses}"

    return (f"Paper 000: {phase('CPU')}; {phase('GPU')}. Ours: its CPU as cpu-serial (its serial loops), else "
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
        "gap.md": titles.runs_head("E1", shown, "paper 000's CPU-GPU accuracy gap and the loss reduction"),
        "reduction_gap.png": titles.figure_title(titles.runs_head(
            "E1", shown, "train loss per epoch of the CPU and GPU runs under each loss reduction, and paper 000's"
            + (f" (missing: {titles.join_words(absent)})" if absent else ""))),
    }
    io.write_text(out_dir / "gap.md", f"## {written['gap.md']}\n\n{e1_gap_sentence(frame)}\n\n"
                  + tables.markdown_table(shown[list(GAP_COLUMNS)]) + f"\n{_paper_gap_note()}\n")
    series, variant_of = {}, {}
    for (_, reduction), row in gap_runs.items():
        epochs = tables.read_table(row["metrics_csv"], ("epoch", "train_loss"), "per-epoch metrics CSV")
        label = divergence.marked(f"{row['variant']} ({reduction})", row)
        series[label] = (epochs["epoch"], epochs["train_loss"])
        variant_of[label] = row["variant"]
    references = {}
    for phase in GAP_PHASES:
        points = _values("train_loss", phase=phase)
        references[f"paper 000 {phase}"] = ([p.epoch for p in points], [p.value for p in points])
    figures.epoch_series(series, out_dir / "reduction_gap.png", written["reduction_gap.png"],
                         "average train loss per sample", references=references, variants=variant_of)
    return written


E1_SETTING = ("dataset", "widths", "batch", "reduction")  # runs compared with each other, and their band


def report_e1(runs, evals, out_dir, profiles=(), **_) -> dict[str, str]:
    """Every variant once per loss reduction (experiments.e1.reductions): each run compared with the baselines of
    its own reduction, and named 'variant (reduction)' in the figures where runs differ in it."""
    frame = measured_runs(runs, E1_SETTING)  # the runs themselves; their repeats give each setting's band
    frame = frame.assign(label=tables.run_labels(frame))
    curves = dict(zip(frame["label"], frame["metrics_csv"]))  # in the runs' order, as the config lists them
    variant_of = dict(zip(frame["label"], frame["variant"]))
    frame = sorted_rows(add_baseline_comparisons(frame, keys=E1_SETTING),
                    ["variant", "reduction"], appearance=["reduction"])
    cols = ["variant", "reduction", "device", "dataset", "widths", "batch", "lr", "epochs", "train_time_s",
            "time_per_epoch_s", "test_accuracy", "speedup_vs_cpu_serial", "speedup_vs_cpu_numpy",
            "accuracy_diff_vs_cpu_numpy_pp", "accuracy_matches_cpu_numpy", *spread.BAND_COLUMNS, "diverged",
            "at_chance", "simulator", "timing_mode"]
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
                         note=join_notes(COMPARISON_NOTE, clock_note(frame), REDUCTION_NOTE, e1_gap_sentence(frame),
                                    divergence.summary_note(frame), titles.simulated_note(frame)))
    written.update(_e1_gap_report(frame, out_dir))
    figures.loss_curves(curves, out_dir / "loss_curves.png", written["loss_curves.png"], variants=variant_of,
                        legend=divergence.legend(frame, "label"))
    epoch_time_bars(out_dir / "summary.csv", out_dir / "epoch_time.png", written["epoch_time.png"])
    samples_figure(evals[0], out_dir / "samples.png", written["samples.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report(paper_vs_ours.rows_for(OursE1(frame, PAPER_VALUES)), out_dir,
                                                       titles.runs_head("E1", frame), PAPER)
    written.update(step_profile.report("e1", profiles, out_dir))
    return written


E1_COLUMNS = ("variant", "time_per_epoch_s")


def epoch_time_bars(table_csv, out_png, title: str = "E1: time per epoch per variant") -> Path:
    """Mean time per training epoch of each variant (and, where the table has runs of more than the batch-mean
    loss reduction, of each variant and reduction: tables.run_labels) as a bar on a log axis, annotated in seconds
    and, where the table has it, with the speedup over cpu-serial; simulated variants' bars are hatched and
    labelled so."""
    frame = read_table(table_csv, E1_COLUMNS, "E1 summary table")
    frame = figures.numeric(frame.assign(variant=frame["variant"].astype(str)), ["time_per_epoch_s"])
    frame = frame.assign(label=run_labels(frame))
    rank = {v: i for i, v in enumerate(ordered_variants(frame["variant"]))}
    frame = frame.sort_values("variant", key=lambda col: col.map(rank), kind="stable")  # reductions as listed
    rows = [frame[frame["label"] == label].iloc[0] for label in dict.fromkeys(frame["label"])]
    variants = [r["variant"] for r in rows]
    times = np.array([r["time_per_epoch_s"] for r in rows], dtype=np.float64)
    if not (times > 0).any():
        raise GpunnError(f"{table_csv}: E1 summary table has no positive time_per_epoch_s")
    colors = figures.variant_colors(list(dict.fromkeys(variants)))
    simulated = figures.simulated_variants(frame)
    fig, ax = figures.pyplot().subplots(figsize=(1.3 * len(rows) + 3.0, 4.2))
    positions = np.arange(len(rows))
    ax.bar(positions, np.where(times > 0, times, np.nan), color=[colors[v] for v in variants],
           hatch=["//" if v in simulated else None for v in variants], edgecolor="white")
    for x, row, t in zip(positions, rows, times):
        if not t > 0:
            continue
        label = f"{format_significant(t, 3)} s"
        speedup = row.get("speedup_vs_cpu_serial", np.nan)
        if row["variant"] != "cpu-serial" and pd.notna(speedup):
            label += f"\n{format_ratio(speedup)}"
        ax.annotate(label, (x, t), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.margins(y=0.25)  # room above the tallest bar for its label
    ax.set_xticks(positions)
    diverged = divergence.diverged_in(frame, "label")
    ax.set_xticklabels([figures.variant_label(r["label"], simulated, "\n", r["variant"], diverged) for r in rows],
                       rotation=20, ha="right")
    ax.set_ylabel("time per epoch (s, log scale)")
    ax.set_title("speedup over cpu-serial under each bar's time" if "speedup_vs_cpu_serial" in frame else "",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    return figures.save(fig, out_png)


# Paper 000's CPU losses (0.2257 after one epoch, 0.0045 after ten, at lr 0.01) are those of a gradient summed over
# the batch, its GPU's (0.8420 -> 0.2218) of the mean it states (section 1.1): its CPU row compares with our
# E1 run of reduction 'sum' (run path suffix _rsum), its GPU row with our 'mean' run, where both ran.
E1_REDUCTION = {"CPU": "sum", "GPU": "mean"}


# --------------------------------------------------------------------------------------------- paper vs ours
class OursE1(paper_vs_ours.Ours):
    """E1: our runs per variant, paper 000's CPU row from the 'sum' run and its GPU row from the 'mean' run."""

    experiment = "e1"
    needs = ("variant", "train_time_s", "time_per_epoch_s", "test_accuracy", "final_train_loss", "epochs")
    base_phase = "CPU"

    def choose(self, entry, phase, rows):
        want = E1_REDUCTION.get(phase, DEFAULT_REDUCTION)
        reduction = rows["reduction"] if "reduction" in rows else pd.Series(DEFAULT_REDUCTION, index=rows.index)
        reduction = reduction.fillna(DEFAULT_REDUCTION)
        matching = rows[reduction == want]
        run = (matching if not matching.empty else rows).iloc[0].copy()
        got = reduction[run.name]
        note = "" if got == want else (f"our {run['variant']} run's loss gradient is the batch {got}; the paper's "
                                       f"{phase} one is the {want}")
        if got != DEFAULT_REDUCTION:  # name the run apart from the same variant's mean run
            run["variant"] = f"{run['variant']} (reduction {got})"
        return run, note

    def measure(self, entry, run):
        quantity = entry.quantity
        if quantity == "train_time":
            return scaled_time(float(run["train_time_s"]), entry.unit), ""
        if quantity == "epoch_time":
            return scaled_time(float(run["time_per_epoch_s"]), entry.unit), ""
        if quantity == "test_accuracy":
            return accuracy_in(run["test_accuracy"], entry.unit), ""
        if quantity == "train_loss":
            return epoch_loss(run, entry.epoch, "final_train_loss")
        return None, f"gpunn does not measure {quantity}"


CAPTIONS = {
    "loss_curves.png": Caption(
        "Train and test loss (and test accuracy) per epoch of every E1 run, one line per variant and loss reduction.",
        "paper 000's training convergence (section 2.5), which it states as text: CPU loss 0.2257 -> 0.0045, GPU "
        "0.8420 -> 0.2218 over 10 epochs", "paper 000 section 2.5"),
    "epoch_time.png": Caption(
        "Time per epoch of each variant, on a log axis.",
        "paper 000's 'Avg. time per epoch' row (section 2.5, Measured Performance: CPU 29.86 s, T4 0.225 s)",
        "paper 000 section 2.5 table"),
    "samples.png": Caption(
        "Test images with the predicted and the true class, wrong predictions in red, from the reference variant.",
        "paper 003's planned 'sample classifications' (paper 000 has no such figure)", "paper 003 plan"),
    "reduction_gap.png": Caption(
        "Train loss per epoch of the CPU baseline and of a GPU variant, each trained with the batch-mean and with "
        "the batch-sum gradient, beside paper 000's CPU and GPU losses (markers): which reduction each of the "
        "seed's trajectories follows, and so where its 4-point CPU-GPU accuracy gap comes from.",
        "paper 000's loss trajectories and accuracy gap (sections 2.5 and 3.5), stated as text there",
        "paper 000 sections 2.5, 3.5"),
    "step_profile.png": Caption(
        STEP_PROFILE_SHOWS,
        "paper 003's planned profiling snapshots (paper 000 has no profile)", "paper 003 plan"),
}


def _values(quantity: str | None = None, **fields) -> tuple[PaperValue, ...]:
    return select(PAPER_VALUES, "e1", quantity, **fields)


def _value(quantity: str, **fields) -> PaperValue:
    return select_one(PAPER_VALUES, "e1", quantity, **fields)


def runs(config: dict) -> list[RunSpec]:
    """Every variant once per loss reduction (the first reduction's run of each first), then the spread's repeats
    (spread_runs: with_repeats)."""
    exp = config["experiments"]["e1"]
    return with_repeats([RunSpec(exp["dataset"], "standard", "mlp", v, (exp["hidden"],), exp["batch"], exp["lr"],
                                 exp["epochs"], exp["seed"], exp["subset"], reduction=r)
                         for v in exp["variants"] for r in exp.get("reductions", [DEFAULT_REDUCTION])],
                        exp.get("spread_runs", 1))


EXPERIMENT = Experiment(
    name="e1", title="MLP 784-256-10 on MNIST, CPU against GPU",
    description="MLP 784-256-10 on MNIST per variant: time, accuracy, speedups, loss curves",
    model="mlp", paper=PAPER, runs=runs,
    tables=lambda config: ["summary", "paper_vs_ours"],
    figures=lambda config: ["loss_curves.png", "epoch_time.png", "samples.png", "reduction_gap.png"],
    files=lambda config: ["gap.md"], quoted=(("gap.md", "accuracy gap"),),
    report=report_e1, captions=CAPTIONS, paper_values=PAPER_VALUES, profiled=True,
    shown_runs=lambda config: first_run_per_dataset(runs(config)),
    headlines=(
        Headline("e1", "CPU test accuracy", "test_accuracy", {"phase": "CPU"}),
        Headline("e1", "GPU test accuracy", "test_accuracy", {"phase": "GPU"}),
        Headline("e1", "GPU speedup over the CPU", "speedup", {"phase": "GPU"}),
    ),
)
