"""E5: the convolutional autoencoder on CIFAR-10 per variant, against paper 004 (CPU, GPU naive, optimized v1
and v2).

Report: epoch time, its full-set (50 000-image) epoch, measured or extrapolated as paper 004 did its CPU's,
speedups over cpu-numpy and gpu-naive per full-set epoch, train / test MSE, peak GPU memory (summary; paper_table
in its sections 2.4 and 3.1 layout); train and test MSE per epoch; the first test image of each class and its
reconstruction; training time and speedup per variant (its section 3.2); the step profile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpunn import io
from gpunn.backends.registry import uses_gpu
from gpunn.configcheck import choice_error
from gpunn.errors import GpunnError
from gpunn.experiments.base import Experiment, Headline
from gpunn.report import divergence, figures, paper_vs_ours, step_profile, tables, titles
from gpunn.report.captions import STEP_PROFILE_SHOWS, Caption
from gpunn.report.paper_vs_ours import epoch_loss, missing, scaled_time
from gpunn.report.papers import PaperValue, select
from gpunn.report.runs import (
    clock_note,
    clocks_comparable,
    comparison_formats,
    join_notes,
    metrics_paths,
    one_run_each,
    read_json,
    run_row,
    samples_missing,
    sorted_rows,
    speedup_column,
    times,
)
from gpunn.report.runs import speedup as clock_speedup
from gpunn.report.tables import format_ratio, format_significant, ordered_variants, read_table
from gpunn.runspec import RunSpec, parse_run_path

PAPER = "004_4f268e64550dc30e.txt"  # E5 and E6
# paper 004's phases 2.1-2.4 -> our variants, and its SVM (E6; ours: the exact SVC of experiments.e6.method)
PHASES = {"CPU": ("cpu-numpy",), "GPU naive": ("gpu-naive",), "GPU optimized v1": ("gpu-tiled",),
          "GPU optimized v2": ("gpu-im2col",), "cuML SVC": ("gpu-smo", "exact")}
_E5_CPU = "single CPU core (model not stated)"
_E5_GPU = "NVIDIA T4 (Colab, CUDA arch 75; the paper names no GPU)"
_E5 = dict(experiment="e5", paper=PAPER, phases=PHASES, dataset="cifar10", n_test=10000, batch=1, epochs=20)
_E5_HW = {"CPU": _E5_CPU, "GPU naive": _E5_GPU, "GPU optimized v1": _E5_GPU, "GPU optimized v2": _E5_GPU}
E5_EPOCH_TABLE = "Phase 2.4: Performance Comparison Table"  # every phase's epoch time over 50 000 images
# the section 2.2 / 2.3 / 2.4 tables: (source, anchor, header of the last column, its versus phase, rows):
# rows are (label as printed, phase, epoch time, speedup vs CPU, last column; None: '-' or not a number)
_E5_PHASE_TABLES = (
    ("Phase 2.2: Performance Comparison", ("Phase 2.2", "Performance Comparison"), None, None, (
        ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
        ("GPU Naive", "GPU naive", "991.63", "29.93", None))),
    ("Phase 2.3: Performance Comparison Table", ("Phase 2.3", "Performance Comparison Table"), "Speedup (vs. Naive)",
     "GPU naive", (
         ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
         ("GPU Naive (Phase 2.2)", "GPU naive", "991.63", "29.93", "1.0"),
         ("GPU Optimized v1 (2.3)", "GPU optimized v1", "517.18", "57.39", "1.92"))),
    (E5_EPOCH_TABLE, ("Phase 2.4", "Performance Comparison Table"), "Speedup (vs. Prev Phase)", "previous", (
        ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
        ("GPU Naive (2.2)", "GPU naive", "991.63", "29.93", "29.93"),
        ("GPU Optimized v1 (2.3)", "GPU optimized v1", "517.18", "57.39", "1.92"),
        ("GPU Optimized v2 (2.4)", "GPU optimized v2", "117.97", "251.57", "4.38"))),
)
# section 3.1: (label, phase, training time for 20 epochs, speedup vs CPU, incremental speedup, RAM MiB, VRAM MiB)
E5_TOTAL_TABLE = "3.1 Performance Comparison Across All Phases"
_E5_TOTALS = (("CPU Baseline", "CPU", "593,560.0", "1.00", None, "710", None),
              ("GPU Naive", "GPU naive", "19,832.6", "29.93", "29.93", "1024", "116"),
              ("GPU Optimized v1", "GPU optimized v1", "10,343.6", "57.39", "1.92", "799", "90"),
              ("GPU Optimized v2", "GPU optimized v2", "2,359.4", "251.57", "4.38", "799", "88"))
_E5_ORDER = ("CPU", "GPU naive", "GPU optimized v1", "GPU optimized v2")


def _e5_tables() -> tuple[PaperValue, ...]:
    entries = []
    for source, anchor, last_column, last_versus, rows in _E5_PHASE_TABLES:
        time_column = "Avg. Epoch Time (s)" if source.startswith("Phase 2.2") else "Epoch Time (s)"
        speedup_column = "Speedup" if source.startswith("Phase 2.2") else "Speedup (vs. CPU)"
        for label, phase, epoch_s, speedup, last in rows:
            cell = dict(source=source, anchor=anchor, phase=phase, hardware=_E5_HW[phase], row=label, n_train=50000,
                        **_E5)
            extrapolated = "the CPU's 1 000-image epoch x 50" if phase == "CPU" else ""
            entries.append(PaperValue(quantity="epoch_time", unit="s", text=epoch_s, column=time_column,
                                      note=extrapolated, **cell))
            entries.append(PaperValue(quantity="speedup", unit="x", text=speedup, column=speedup_column, versus="CPU",
                                      **cell))
            if last is not None:
                versus = _E5_ORDER[_E5_ORDER.index(phase) - 1] if last_versus == "previous" else last_versus
                entries.append(PaperValue(quantity="speedup", unit="x", text=last, column=last_column, versus=versus,
                                          **cell))
    for label, phase, total_s, speedup, incremental, ram, vram in _E5_TOTALS:
        cell = dict(source=E5_TOTAL_TABLE, anchor=(E5_TOTAL_TABLE,), phase=phase, hardware=_E5_HW[phase], row=label,
                    n_train=50000, **_E5)
        entries.append(PaperValue(quantity="train_time", unit="s", text=total_s, column="Training Time (s)",
                                  note="extrapolated from 1 000 images" if phase == "CPU" else "", **cell))
        entries.append(PaperValue(quantity="speedup", unit="x", text=speedup, column="Speedup (vs CPU)", versus="CPU",
                                  **cell))
        if incremental is not None:
            entries.append(PaperValue(quantity="speedup", unit="x", text=incremental, column="Incremental Speedup",
                                      versus=_E5_ORDER[_E5_ORDER.index(phase) - 1], **cell))
        entries.append(PaperValue(quantity="host_memory", unit="MiB", text=ram, column="Memory (RAM/VRAM)", **cell))
        if vram is not None:
            entries.append(PaperValue(quantity="gpu_memory", unit="MiB", text=vram, column="Memory (RAM/VRAM)", **cell))
    return tuple(entries)


_E5_CPU_RESULTS = dict(source="Phase 2.1: CPU Baseline, Results", anchor=("Phase 2.1", "Results"), phase="CPU",
                       hardware=_E5_CPU, n_train=1000, **_E5)
_E5_GPU_MSE = dict(source="Phase 2.2: Reconstruction Quality", anchor=("Phase 2.2", "Reconstruction Quality"),
                   phase="GPU naive", hardware=_E5_GPU, n_train=50000, **_E5)
PAPER_VALUES = _e5_tables() + (
    PaperValue(quantity="train_mse", unit="MSE", text="0.01", note="'Training MSE loss ≈ 0.01'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="test_mse", unit="MSE", text="0.01", note="'Test MSE loss ≈ 0.01'", **_E5_CPU_RESULTS),
    PaperValue(quantity="block_time", unit="s", text="59.35", note="'Average 100-image block time'", **_E5_CPU_RESULTS),
    PaperValue(quantity="epoch_time", unit="s", text="593.5", note="'Total epoch time (1,000 images)'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_time", unit="s", text="11,870", note="'Total training time (20 epochs)'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_time", unit="h", text="3.3", note="'approx. 3.3 hours'", **_E5_CPU_RESULTS),
    PaperValue(quantity="parameters", unit="count", text="751,875", note="'Total parameters: ~751,875'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_mse", unit="MSE", text="0.011", source="Phase 2.1: CPU Baseline, MSE Graph",
               anchor=("Phase 2.1", "MSE Graph"), note="'plateaus at a higher loss of approximately 0.011'",
               **{k: v for k, v in _E5_CPU_RESULTS.items() if k not in ("source", "anchor")}),
    PaperValue(quantity="train_time", unit="days", text="68", source="Phase 2.1: CPU Baseline, Results",
               anchor=("Phase 2.1", "Extrapolation"), phase="CPU", hardware=_E5_CPU, n_train=50000,
               note="an extrapolation to 50 000 images and 200 epochs",
               **{k: v for k, v in _E5.items() if k != "epochs"}, epochs=200),
    PaperValue(quantity="epoch_time", unit="s", text="593.56", source="Phase 2.2: CPU Time Extrapolation",
               anchor=("Phase 2.2", "CPU Time Extrapolation"), phase="CPU", hardware=_E5_CPU, n_train=1000, **_E5),
    PaperValue(quantity="train_mse", unit="MSE", text="0.01", epoch=1, note="'Stabilized at ~0.01 on the first epoch'",
               **_E5_GPU_MSE),
    PaperValue(quantity="train_mse", unit="MSE", text="0.045", epoch=20,
               note="'converge to 0.045 after 20th epochs': the same section then says 'a final loss of roughly "
                    "0.0045' (a typo one way or the other)", **_E5_GPU_MSE),
    PaperValue(quantity="train_mse", unit="MSE", text="0.0045", epoch=20, note="'a final loss of roughly 0.0045', "
               "the same for every GPU variant", **_E5_GPU_MSE),
    PaperValue(quantity="time_reduction", unit="%", text="66", phase="GPU naive", versus="CPU", hardware=_E5_GPU,
               source="Phase 2.2: Key Takeaways", anchor=("Phase 2.2", "Parallelism Wins"), n_train=50000,
               note="'reduced training time by 66%': its own table's 29.93x is a 96.7 % reduction", **_E5),
    PaperValue(quantity="expected_speedup", unit="x", text="20", phase="GPU optimized v2", versus="CPU",
               hardware=f"{_E5_GPU} vs {_E5_CPU}", source="4. Project Objectives", anchor=("4. Project Objectives",),
               n_train=50000, note="a target: '> 20x'", **_E5),
    PaperValue(quantity="train_time", unit="h", text="165", phase="CPU", hardware=_E5_CPU,
               source="3.2 Visualizations & Impact Analysis", anchor=("3.2 Visualizations",), n_train=50000,
               note="estimated ('from an estimated 165 hours')", **_E5),
    PaperValue(quantity="train_time", unit="min", text="40", phase="GPU optimized v2", hardware=_E5_GPU,
               source="3.2 Visualizations & Impact Analysis", anchor=("3.2 Visualizations",), n_train=50000,
               note="'just under 40 minutes'", **_E5),
    PaperValue(quantity="speedup", unit="x", text="251.55", phase="GPU optimized v2", versus="CPU",
               hardware=f"{_E5_GPU} vs {_E5_CPU}", source="5.2 Key Achievements", anchor=("5.2 Key Achievements",),
               n_train=50000, note="from '593,500 s vs 2,359.4 s' (section 3.1 prints 593,560.0 s and 251.57x)", **_E5),
    PaperValue(quantity="train_time", unit="s", text="593,500", phase="CPU", hardware=_E5_CPU,
               source="5.2 Key Achievements", anchor=("5.2 Key Achievements",), n_train=50000,
               note="section 3.1 prints 593,560.0 s for the same time", **_E5),
    PaperValue(quantity="memory_reduction", unit="%", text="22", phase="GPU optimized v2", versus="GPU naive",
               hardware=_E5_GPU, source="5.2 Key Achievements", anchor=("5.2 Key Achievements",), n_train=50000,
               note="system RAM (1024 -> 799 MiB)", **_E5),
)
E5_SHOWN = ("variant", "device", "n_train", "time_per_epoch_s", "full_epoch_s", "full_set_extrapolated",
            "full_train_time_s", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive", "test_mse", "peak_gpu_memory_mib",
            "diverged")
# E5: paper 004 trained its CPU baseline on 1 000 images and extrapolated the epoch to CIFAR-10's 50 000
E5_FULL_TRAIN = 50000
E5_BASELINES = ("cpu-numpy", "gpu-naive")
E5_SUMMARY_COLUMNS = ("variant", "device", "dataset", "n_train", "n_test", "batch", "lr", "epochs", "parameters",
                      "time_per_epoch_s", "train_time_s", "full_epoch_s", "full_train_time_s", "full_set_extrapolated",
                      "all_epochs", "train_time_extrapolated", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive",
                      "final_train_mse", "test_mse",
                      "peak_gpu_memory_mib", "diverged", "simulator", "timing_mode")
# paper 004's section 2.4 table: every phase's epoch time over 50 000 images (the CPU's extrapolated from 1 000)
_E5_PAPER_EPOCHS = select(PAPER_VALUES, "e5", "epoch_time", source=E5_EPOCH_TABLE)
# paper 004's phases 2.1-2.4 by the variant that reproduces each, in its tables' order; gpu-graph is ours
E5_PHASES = {**{entry.ours[0]: entry.phase for entry in _E5_PAPER_EPOCHS},
             "gpu-graph": "GPU graph (ours, not in the paper)",
             "gpu-tf32": "GPU graph, tensor cores in TF32 (ours)", "gpu-bf16": "GPU graph, tensor cores in BF16 (ours)"}
# paper 004's own epoch times, by the variant that reproduces each phase
E5_PAPER_EPOCH_S = {entry.ours[0]: entry.value for entry in _E5_PAPER_EPOCHS}
E5_EPOCH_HEADERS = {"implementation": "Implementation", "variant": "Variant", "full_epoch_s": "Epoch time (s)",
                    "speedup_vs_cpu": "Speedup vs CPU", "speedup_vs_previous": "Speedup vs previous phase",
                    "paper_full_epoch_s": "Paper's epoch time (s)"}
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
    else its own scaled by full_train_size / n_train as paper 004 extrapolated its CPU epoch: full_set_extrapolated)
    and its training time for all `epochs` (all_epochs; None: the most any run trained, the experiment's `epochs`)
    on that many images: measured where the run trained all of them on the full set, else its mean epoch time
    there x all_epochs, as the paper did for its 20-epoch table (train_time_extrapolated: a run timed over fewer
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
        frame[speedup_column(baseline)] = clock_speedup(frame, baseline, "full_epoch_s", ("dataset",))
    return frame


def e5_paper_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Paper 004's section 2.4 and 3.1 tables as one tidy table: a row per variant of E5_PHASES that ran (report
    order), named as the paper's phase ('(extrapolated)' where its times are), with its epoch time over the full
    set, speedup per such epoch over cpu-numpy and over the row above, the paper's own epoch time, the training time
    for all epochs over the full set, its speedup over cpu-numpy's and the row above's (incremental), and its
    peak GPU memory. `frame`: e5_full_set's rows of one dataset, in report order."""
    rows = frame[frame["variant"].isin(list(E5_PHASES))].reset_index(drop=True)
    cpu = rows[rows["variant"] == "cpu-numpy"]
    # a speedup only between clocks that ran alone (runs.clocks_comparable): NaN beside any other
    alone = rows["timing_mode"].map(clocks_comparable) if "timing_mode" in rows else pd.Series(True, rows.index)
    cpu_alone = cpu.empty or bool(alone[cpu.index[0]])
    cpu_epoch = cpu["full_epoch_s"].iloc[0] if not cpu.empty and cpu_alone else np.nan
    cpu_total = cpu["full_train_time_s"].iloc[0] if not cpu.empty and cpu_alone else np.nan
    epoch, total = rows["full_epoch_s"].where(alone), rows["full_train_time_s"].where(alone)  # for the ratios
    def named(flags):
        return [E5_PHASES[v] + (" (extrapolated)" if extrapolated else "") for v, extrapolated in
                zip(rows["variant"], flags)]

    return pd.DataFrame({
        "implementation": named(rows["full_set_extrapolated"]), "phase": named(rows["train_time_extrapolated"]),
        "variant": rows["variant"], "device": rows["device"],
        "full_epoch_s": rows["full_epoch_s"], "speedup_vs_cpu": cpu_epoch / epoch,
        "speedup_vs_previous": epoch.shift(1) / epoch,
        "paper_full_epoch_s": rows["variant"].map(E5_PAPER_EPOCH_S),
        "full_train_time_s": rows["full_train_time_s"],
        "training_speedup_vs_cpu": cpu_total / total,
        "incremental_speedup": total.shift(1) / total,
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
    MSE, peak GPU memory), paper_table (paper 004's section 2.4 and 3.1 tables), mse_curves, reconstructions (the
    first test image of each class), training_time and speedup (its section 3.2 figures)."""
    frame = pd.DataFrame([run_row(r) for r in runs]).assign(metrics_csv=metrics_paths(runs))
    if frame["dataset"].nunique() > 1:
        raise GpunnError(f"E5 report: runs on {titles.join_words(titles.distinct(frame['dataset']))}; its tables "
                         "compare the variants on one dataset")
    one_run_each(frame, "E5", ("dataset",))
    frame = frame.rename(columns={"test_loss": "test_mse", "final_train_loss": "final_train_mse"})
    frame = sorted_rows(e5_full_set(frame, full_train_size), ["dataset", "variant"], appearance=("dataset",))
    timing = titles.timing_parts(frame)
    size = titles.count(full_train_size)
    written = {
        "summary.md": titles.table_title(titles.runs_head("E5", frame, "per variant"), timing),
        "paper_table.md": titles.table_title(titles.runs_head("E5", frame, "laid out as in the paper's sections 2.4 "
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
                         note=join_notes(f"full_epoch_s: one epoch over {size} training images, measured where the run "
                                    f"trained on {size} (full_set_extrapolated: 'measured'), else its own epoch x "
                                    f"{size} / n_train, as the paper extrapolated its CPU epoch ('extrapolated'). "
                                    f"full_train_time_s: all_epochs epochs over {size} images, measured where the "
                                    "run trained them all on the full set, else full_epoch_s x all_epochs "
                                    "(train_time_extrapolated; a run timed over fewer epochs, "
                                    "experiments.e5.variant_epochs, or on a subset).", sizes, E5_SUMMARY_NOTE,
                                    clock_note(frame), divergence.summary_note(frame), simulated))
    _e5_paper_tables(frame, out_dir, written["paper_table.md"],
                     join_notes(f"Times over {size} training images: measured where the run trained on {size}, "
                                f"else its own times x {size} / n_train, as the paper extrapolated its CPU epoch; the "
                                f"training time for all {int(frame['all_epochs'].iloc[0])} epochs of a run timed "
                                "over fewer is its epoch time x that many, as the paper's section 3.1 did; such rows "
                                "read '(extrapolated)'.", sizes, simulated), size)
    figures.loss_curves({row["variant"]: row["metrics_csv"] for _, row in frame.iterrows()},
                        out_dir / "mse_curves.png", written["mse_curves.png"], quantity="MSE",
                        legend={row["variant"]: divergence.marked(f"{row['variant']} ({titles.count(row['n_train'])} "
                                                                  "train images)", row)
                                for _, row in frame.iterrows()})
    training_time_bars(out_dir / "summary.csv", out_dir / "training_time.png", written["training_time.png"],
                               full_train_size)
    speedup_bars(out_dir / "summary.csv", out_dir / "speedup.png", written["speedup.png"], full_train_size)
    written["reconstructions.png"] = _e5_reconstructions(evals[0], frame, out_dir / "reconstructions.png")
    written["paper_vs_ours.md"] = paper_vs_ours.report(paper_vs_ours.rows_for(OursE5(frame, PAPER_VALUES)),
                                                       out_dir, titles.runs_head("E5", frame), PAPER)
    written.update(step_profile.report("e5", profiles, out_dir))
    return written


def _e5_paper_tables(frame: pd.DataFrame, out_dir: Path, title: str, note: str, size: str) -> None:
    """paper_table.csv (e5_paper_table, tidy) and paper_table.md: under `title` and `note`, its section 2.4 and 3.1
    tables."""
    paper = e5_paper_table(frame)
    # speedups as '125x', the paper's epoch times as it prints them
    formats = {c: times for c in ("speedup_vs_cpu", "speedup_vs_previous", "training_speedup_vs_cpu",
                                   "incremental_speedup")} | {"paper_full_epoch_s": "{:.2f}"}
    epoch = tables.markdown_section(
        f"Paper's section 2.4: time per epoch on {size} images", paper[list(E5_EPOCH_HEADERS)], formats,
        E5_EPOCH_HEADERS, level=3,
        note=join_notes("Speedup vs previous phase: the row above's epoch time over this row's ('-': first row). "
                   "Paper's epoch time: paper 004's own (its GPU; its CPU epoch extrapolated from 1 000 images); "
                   "'-': not in the paper."))
    total = tables.markdown_section(
        f"Paper's section 3.1: training time for all epochs on {size} images", paper[list(E5_TOTAL_HEADERS)],
        formats, E5_TOTAL_HEADERS, level=3,
        note=join_notes("Incremental speedup: the row above's training time over this row's. Memory: peak GPU memory "
                   "of the training process; '-': not recorded (CPU, the CUDA simulator, older runs)."))
    io.write_csv(out_dir / "paper_table.csv", paper)
    io.write_text(out_dir / "paper_table.md", "\n".join([f"## {title}\n", f"{note.strip()}\n", epoch, total]))


def _e5_reconstructions(eval_dir, frame: pd.DataFrame, out_png: Path) -> str:
    """reconstructions.png from the evaluation of one run: the first test image of each class above its
    reconstruction, columns titled by class (samples.npz from before it saved the classes: the first test images,
    untitled). Returns its title."""
    run = parse_run_path(read_json(Path(eval_dir) / "eval.json")["run"])
    path = Path(eval_dir) / "samples.npz"
    if samples_missing(path, out_png):
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


E5_COLUMNS = ("variant", "full_train_time_s", "full_set_extrapolated", "speedup_vs_cpu_numpy")
EXTRAPOLATED_HATCH = "xx"
SIMULATED_HATCH = "//"


def _flags(values) -> list[bool]:
    """A boolean column read back from a CSV (True / 'True' / 1)."""
    return [str(v).strip().lower() in ("true", "1") for v in values]


def _duration(seconds: float) -> str:
    """'593560 s (165 h)', '2359 s (39.3 min)', '12.0 s': seconds, and hours or minutes where they read better."""
    text = f"{format_significant(seconds, 3)} s"
    if seconds >= 2 * 3600:
        return f"{text} ({format_significant(seconds / 3600, 3)} h)"
    if seconds >= 120:
        return f"{text} ({format_significant(seconds / 60, 3)} min)"
    return text


def _variant_bars(ax, frame: pd.DataFrame, column: str, label, flag: str = "full_set_extrapolated") -> np.ndarray:
    """One bar per variant of `frame` (report order) of `column` on a log axis, annotated with label(row);
    extrapolated bars (column `flag`) cross-hatched and named so under the axis, simulated ones hatched. Returns
    the values."""
    rows = [frame[frame["variant"] == v].iloc[0] for v in ordered_variants(frame["variant"])]
    variants = [str(r["variant"]) for r in rows]
    values = np.array([r[column] for r in rows], dtype=np.float64)
    extrapolated = dict(zip(variants, _flags(r[flag] for r in rows)))
    simulated = figures.simulated_variants(frame)
    colors = figures.variant_colors(variants)
    positions = np.arange(len(variants))
    shown = np.where(values > 0, values, np.nan)
    ax.bar(positions, shown, color=[colors[v] for v in variants], edgecolor="white",
           hatch=[EXTRAPOLATED_HATCH if extrapolated[v] else SIMULATED_HATCH if v in simulated else None
                  for v in variants])
    for x, row, value in zip(positions, rows, values):
        if value > 0:
            ax.annotate(label(row), (x, value), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=8)
    ax.set_yscale("log")
    figures.plain_log_labels(ax.yaxis)
    ax.margins(y=0.3)  # room above the tallest bar for its label
    ax.set_xticks(positions)
    diverged = divergence.diverged_in(frame)
    ax.set_xticklabels([figures.variant_label(v, simulated, "\n", diverged=diverged)
                        + ("\n(extrapolated)" if extrapolated[v] else "") for v in variants], rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3, which="both")
    return values


def training_time_bars(table_csv, out_png, title: str, full_train_size: int = 50000) -> Path:
    """E5 (paper 004's section 3.2 'total training time'): each variant's training time for all its epochs over
    `full_train_size` images as a bar on a log axis, annotated in seconds (and hours or minutes); a bar
    extrapolated from a smaller training set or from fewer epochs is cross-hatched and labelled 'extrapolated'."""
    frame = read_table(table_csv, E5_COLUMNS, "E5 summary table")
    frame = figures.numeric(frame.assign(variant=frame["variant"].astype(str)), ["full_train_time_s"])
    if not (frame["full_train_time_s"] > 0).any():
        raise GpunnError(f"{table_csv}: E5 summary table has no positive full_train_time_s")
    n = frame["variant"].nunique()
    fig, ax = figures.pyplot().subplots(figsize=(1.4 * n + 3.4, 4.6))
    # the training time is extrapolated from fewer epochs too (summary tables from before that have no such column)
    flag = "train_time_extrapolated" if "train_time_extrapolated" in frame else "full_set_extrapolated"
    _variant_bars(ax, frame, "full_train_time_s",
                  lambda row: (_duration(row["full_train_time_s"])
                               + ("\nextrapolated" if _flags([row[flag]])[0] else "")),
                  flag)
    ax.set_ylabel(f"training time, all epochs on {titles.count(full_train_size)} images\n(s, log scale)")
    fig.suptitle(title)
    fig.tight_layout()
    return figures.save(fig, out_png)


def speedup_bars(table_csv, out_png, title: str, full_train_size: int = 50000) -> Path:
    """E5 (paper 004's section 3.2 'cumulative speedup'): each variant's speedup over cpu-numpy per epoch on
    `full_train_size` images as a bar on a log axis, annotated '251x', with cpu-numpy's 1x as a dashed line;
    without a cpu-numpy run the panel says so."""
    frame = read_table(table_csv, E5_COLUMNS, "E5 summary table")
    frame = figures.numeric(frame.assign(variant=frame["variant"].astype(str)), ["speedup_vs_cpu_numpy"])
    n = frame["variant"].nunique()
    fig, ax = figures.pyplot().subplots(figsize=(1.4 * n + 3.4, 4.6))
    if (frame["speedup_vs_cpu_numpy"] > 0).any():
        _variant_bars(ax, frame, "speedup_vs_cpu_numpy",
                      lambda row: format_ratio(row['speedup_vs_cpu_numpy']))
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
        ax.set_ylabel(f"speedup over cpu-numpy per epoch\nof {titles.count(full_train_size)} images (log scale)")
    else:
        ax.text(0.5, 0.5, "no cpu-numpy run: no speedup over it to show", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    return figures.save(fig, out_png)


class OursE5(paper_vs_ours.Ours):
    """E5: each variant's run; times over the entry's number of images (and epochs), extrapolated from the run's
    own as paper 004 extrapolated its CPU's; speedups per epoch over 50 000 images."""

    experiment = "e5"
    needs = ("variant", "n_train", "epochs", "time_per_epoch_s", "train_time_s", "full_epoch_s", "final_train_mse",
             "test_mse", "peak_gpu_memory_mib", "parameters")
    base_phase = "CPU"

    def time(self, entry, run):
        return float(run["full_epoch_s"])

    def epoch_seconds(self, run):
        """Over the full set's 50 000 images, scaled from a subset's epoch as the paper scaled its CPU's."""
        n_train = int(run["n_train"])
        return float(run["full_epoch_s"]), ("" if n_train == E5_FULL_TRAIN else
                                            f"scaled from an epoch of {n_train:,} images".replace(",", " "))

    def measure(self, entry, run):
        quantity, scale = entry.quantity, (entry.n_train or run["n_train"]) / run["n_train"]
        epoch_s = float(run["time_per_epoch_s"]) * scale
        if quantity == "epoch_time":
            return scaled_time(epoch_s, entry.unit), "extrapolated" if scale != 1 else ""
        if quantity == "block_time":
            return scaled_time(float(run["time_per_epoch_s"]) * 100 / run["n_train"], entry.unit), (
                "extrapolated" if run["n_train"] != 100 else "")
        if quantity == "train_time":
            if scale == 1 and int(run["epochs"]) == entry.epochs:
                return scaled_time(float(run["train_time_s"]), entry.unit), ""
            return scaled_time(epoch_s * entry.epochs, entry.unit), "extrapolated"
        if quantity == "train_mse":
            return epoch_loss(run, entry.epoch, "final_train_mse")
        if quantity == "test_mse":
            value = run.get("test_mse")
            return (None, "not recorded") if missing(value) else (float(value), "")
        if quantity == "gpu_memory":
            value = run.get("peak_gpu_memory_mib")
            return (None, "peak GPU memory not recorded (CPU, the simulator, older runs)") if missing(value) else (
                float(value), "")
        if quantity == "parameters":
            return float(run["parameters"]), ""
        return None, f"gpunn does not record {quantity.replace('_', ' ')}"

    def differences(self, entry, run):
        differs = super().differences(entry, run)
        if entry.n_train and run["n_train"] != entry.n_train:
            differs.append(f"{titles.count(run['n_train'])} train images")
        return differs


CAPTIONS = {
    "mse_curves.png": Caption(
        "Train and test MSE per epoch of each variant (the legend gives each one's training-set size).",
        "paper 004's MSE graph (Phase 2.1: the CPU on 1 000 images) and its GPU convergence text",
        "paper 004 Phase 2.1"),
    "reconstructions.png": Caption(
        "The first test image of each class (top) above the autoencoder's reconstruction of it (bottom).",
        "paper 004's Original / Reconstructed images (Phase 2.2)", "paper 004 Phase 2.2"),
    "training_time.png": Caption(
        "Training time for all epochs over 50 000 images per variant, log axis; bars extrapolated from a subset or "
        "from fewer epochs are cross-hatched.",
        "paper 004's 'Total Training Time (Log Scale)' (section 3.2)", "paper 004 section 3.2"),
    "speedup.png": Caption(
        "Speedup of each variant over cpu-numpy per 50 000-image epoch, log axis.",
        "paper 004's 'Cumulative Speedup Analysis' (section 3.2)", "paper 004 section 3.2"),
    "step_profile.png": Caption(
        STEP_PROFILE_SHOWS,
        "paper 004's 'Profiling Analysis' kernel breakdowns of Phases 2.2-2.4 (e.g. its naive conv weight gradient at "
        "84.4 % of the kernel time), as a bar per variant", "paper 004 Phases 2.2-2.4 profiles"),
}


def runs(config: dict) -> list[RunSpec]:
    """Every variant, with its epochs (variant_epochs) and its training subset (cpu_subset for the CPU ones)."""
    exp = config["experiments"]["e5"]
    return [RunSpec(exp["dataset"], "standard", "autoencoder", v, tuple(exp["channels"]), exp["batch"], exp["lr"],
                    exp.get("variant_epochs", {}).get(v, exp["epochs"]), exp["seed"],
                    exp["subset"] if uses_gpu(v) else exp.get("cpu_subset", exp["subset"]))
            for v in exp["variants"]]


def shown_runs(config: dict) -> list[RunSpec]:
    """The reconstructions of the run E6 encodes with (experiments.e6.variant: by default the fastest GPU variant,
    trained on the full set like the paper's), or, when E5 does not train that variant, of its first."""
    found = runs(config)
    encoder = [spec for spec in found if spec.variant == config["experiments"]["e6"]["variant"]]
    return (encoder + found)[:1]


def check(config: dict) -> None:
    exp = config["experiments"]["e5"]
    unknown = sorted(set(exp["variant_epochs"]) - set(exp["variants"]))
    if unknown:
        raise choice_error("experiments.e5.variant_epochs", unknown[0], exp["variants"],
                           " is not one of experiments.e5.variants")


def without_gpu(config: dict) -> list[str]:
    exp = config["experiments"]["e5"]
    exp["variant_epochs"] = {name: epochs for name, epochs in exp["variant_epochs"].items() if name in exp["variants"]}
    return []


EXPERIMENT = Experiment(
    name="e5", title="Convolutional autoencoder on CIFAR-10",
    description="convolutional autoencoder on CIFAR-10: epoch time, MSE, reconstructions",
    model="autoencoder", paper=PAPER, runs=runs,
    tables=lambda config: ["summary", "paper_table", "paper_vs_ours"],
    figures=lambda config: ["mse_curves.png", "reconstructions.png", "training_time.png", "speedup.png"],
    report=report_e5, captions=CAPTIONS, paper_values=PAPER_VALUES, profiled=True, shown_runs=shown_runs,
    check=check, without_gpu=without_gpu,
    headlines=(
        Headline("e5", "optimized v2 GPU epoch (s, 50 000 images)", "epoch_time",
                 {"source": E5_EPOCH_TABLE, "phase": "GPU optimized v2"}),
        Headline("e5", "optimized v2 GPU speedup over the CPU, per epoch", "speedup",
                 {"source": E5_EPOCH_TABLE, "phase": "GPU optimized v2", "versus": "CPU"}),
    ),
)
