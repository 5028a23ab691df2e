"""paper_vs_ours.csv / .md of each report (gpunn.report.paper_vs_ours): the paper's numbers beside ours from small
fake runs (the builders of tests/test_report.py): speedups over each side's own CPU baseline, accuracy differences
in points, '-' and a note where our run is missing, the simulator named, E1's runs picked by their reduction."""

from __future__ import annotations

import pandas as pd
import pytest

from gpunn import io
from gpunn.errors import GpunnError
from gpunn.experiments.e1 import PAPER_VALUES, OursE1
from gpunn.experiments.e2 import OursE2
from gpunn.report import paper_vs_ours
from gpunn.report.build import make_report
from gpunn.report.paper_vs_ours import rows_for

from test_report import (
    E3_VARIANTS,
    E4_RUNS,
    E5_RUNS,
    ON_CPU,
    ON_H100,
    _cpu_and_simulated,
    _e1_results,
    _e2_runs,
    _e4_results,
    _e5_results,
    _e5_spec,
    _write_confusion,
    _write_timings,
)


def _rows(out, table=None) -> pd.DataFrame:
    frame = pd.read_csv(out / "paper_vs_ours.csv")
    assert list(frame.columns) == list(paper_vs_ours.COLUMNS)
    return frame if table is None else frame[frame["table"] == table]


def _one(frame: pd.DataFrame, **cells) -> pd.Series:
    for column, value in cells.items():
        frame = frame[frame[column] == value]
    assert len(frame) == 1, cells
    return frame.iloc[0]


def _md_row(md: str, *cells: str) -> list[str]:
    """The cells of the first Markdown table line holding all of `cells`."""
    line = next(line for line in md.splitlines() if line.startswith("|") and all(f"| {c} " in line for c in cells))
    return [cell.strip() for cell in line.strip("|").split("|")]


MEASURED = "2.5 Experimental Results: Measured Performance"


def test_e1_speedups_accuracy_points_and_a_missing_baseline(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"], where=lambda v: ON_CPU if v == "cpu-numpy"
                              else ON_H100)
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    assert written["paper_vs_ours.md"].endswith("the paper's numbers (paper 000) beside ours")
    table = _rows(out, MEASURED)
    # no cpu-serial run: the CPU row is our cpu-numpy (12 s), PHASES' second choice
    cpu = _one(table, row="Total training time", column="CPU", unit="s")
    assert (cpu["variant"], cpu["our_device"], cpu["ours"]) == ("cpu-numpy", "cpu (AMD EPYC 9454)", 12.0)
    gpu = _one(table, row="Total training time", column="GPU", unit="ms")
    assert gpu["ours"] == pytest.approx(2400.0) and gpu["ratio"] == pytest.approx(2400.0 / 2247.11)
    assert gpu["paper_speedup"] == pytest.approx(298617.53 / 2247.11)  # the paper's CPU over its GPU
    assert gpu["our_speedup"] == pytest.approx(12.0 / 2.4)  # ours over ours
    assert gpu["speedup_ratio"] == pytest.approx(5.0 / (298617.53 / 2247.11))
    assert gpu["our_device"] == "NVIDIA H100 80GB HBM3" and gpu["paper_device"] == "NVIDIA Tesla T4"
    accuracy = _one(table, row="Test accuracy", column="GPU")
    assert accuracy["diff_pp"] == pytest.approx(97.95 - 93.86) and pd.isna(accuracy["ratio"])
    text = _rows(out)
    assert _one(text, column="speedup vs CPU")["ours"] == pytest.approx(5.0)
    late = _one(text, row="GPU", column="train_loss, epoch 10")  # our runs trained 4 epochs
    assert pd.isna(late["ours"]) and "our run trained 4 epochs" in late["note"]
    md = (out / "paper_vs_ours.md").read_text()
    for label in ("Total training time", "Avg. time per epoch", "Test accuracy", "### " + MEASURED):
        assert label in md
    cells = _md_row(md, "Test accuracy", "GPU")
    assert cells[2:5] == ["93.86 %", "97.95 %", "-"] and "+4.09" in cells  # paper, ours (with units), ratio
    assert "| cpu-numpy on cpu (AMD EPYC 9454) " in md and len(cells) <= 12


def test_e1_speedup_row_shows_both_sides_times_per_epoch_and_the_baselines(tmp_path):
    """The paper's 132.7x (T4 over its serial CPU) beside ours: each side's seconds per epoch and device, and how far
    the two CPU baselines lie apart (the paper's 29.86 s an epoch, our cpu-serial 300 s / 4 epochs = 75 s here)."""
    runs, evals = _e1_results(tmp_path, ["cpu-serial", "gpu-naive"], where=lambda v: ON_CPU if v == "cpu-serial"
                              else ON_H100)
    out = tmp_path / "report"
    make_report("e1", out, runs=runs, evals=evals)
    row = _one(_rows(out), column="speedup vs CPU")
    assert row["ours"] == pytest.approx(300.0 / 2.4)
    assert row["epoch_times"] == ("per epoch, paper: GPU 0.225 s on NVIDIA Tesla T4, CPU 29.86 s on CPU (model not "
                                  "stated); ours: gpu-naive 0.6 s on NVIDIA H100 80GB HBM3, cpu-serial 75 s on cpu "
                                  "(AMD EPYC 9454)")
    assert ("the baselines differ: the paper's CPU took 29.86 s an epoch, ours (cpu-serial) 75 s, 2.51x slower; the "
            "speedups divide by them") in row["note"]
    assert "| Times per epoch " in (out / "paper_vs_ours.md").read_text()


def test_an_overlapped_tree_computes_no_speedup(tmp_path):
    """Runs timed under timing: overlap (a CPU baseline beside GPU jobs) give no speedup anywhere: the summary's
    speedup columns read '-' with one line naming the runs, paper_vs_ours leaves ours out and says why; their
    times and accuracies stay."""
    def overlapped(variant):
        return {**(ON_CPU if variant.startswith("cpu") else ON_H100), "timing_mode": "overlap"}

    runs, evals = _e1_results(tmp_path, ["cpu-serial", "cpu-numpy", "gpu-naive"], where=overlapped)
    out = tmp_path / "report"
    make_report("e1", out, runs=runs, evals=evals)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["timing_mode"]) == ["overlap"] * 3
    assert summary["speedup_vs_cpu_serial"].isna().all() and summary["speedup_vs_cpu_numpy"].isna().all()
    assert summary["train_time_s"].tolist() == pytest.approx([300.0, 12.0, 2.4])
    assert ("No speedup is computed from the clocks of cpu-serial (overlap), cpu-numpy (overlap) and gpu-naive "
            "(overlap): timed beside other jobs") in (out / "summary.md").read_text()
    rows = _rows(out)
    gpu = _one(rows, table=MEASURED, row="Total training time", column="GPU", unit="s")
    assert gpu["ours"] == pytest.approx(2.4) and pd.isna(gpu["our_speedup"])
    assert "no speedup: gpu-naive (overlap) and cpu-serial (overlap) were not both timed alone" in gpu["note"]
    speedup = _one(rows, column="speedup vs CPU")
    assert pd.isna(speedup["ours"]) and "no speedup: gpu-naive (overlap)" in speedup["note"]
    # a baseline timed alone beside an overlapped GPU run: still no speedup between them (runs without a mode: alone)
    from gpunn.report.runs import add_baseline_comparisons

    mixed = pd.DataFrame({"variant": ["cpu-serial", "gpu-naive", "gpu-fused"], "train_time_s": [300.0, 2.4, 0.5],
                          "test_accuracy": 0.9, "dataset": "mnist", "timing_mode": ["isolated", "overlap", None]})
    assert add_baseline_comparisons(mixed, ("dataset",))["speedup_vs_cpu_serial"].tolist()[:2] == [1.0, pytest.approx(
        float("nan"), nan_ok=True)]
    assert add_baseline_comparisons(mixed, ("dataset",))["speedup_vs_cpu_serial"][2] == pytest.approx(600.0)


def _e1_frame(reduction=True) -> pd.DataFrame:
    """E1's summary rows as report_e1 builds them: cpu-serial summed and averaged, gpu-naive averaged."""
    rows = [("cpu-serial", "sum", 300.0, 0.9793), ("cpu-serial", "mean", 310.0, 0.9400),
            ("gpu-naive", "mean", 2.5, 0.98)]
    frame = pd.DataFrame([{"variant": v, "reduction": r, "train_time_s": t, "time_per_epoch_s": t / 10,
                           "test_accuracy": a, "final_train_loss": 0.1, "epochs": 10, "dataset": "mnist", "batch": 64,
                           "device": "cpu" if v.startswith("cpu") else "NVIDIA H100 80GB HBM3", "simulator": False}
                          for v, r, t, a in rows])
    return frame if reduction else frame.drop(columns="reduction")


def test_e1_compares_the_cpu_row_with_the_sum_run_and_the_gpu_row_with_the_mean_run():
    table = pd.DataFrame(rows_for(OursE1(_e1_frame(), PAPER_VALUES)))
    cpu = _one(table, row="Total training time", column="CPU", unit="s")
    assert (cpu["ours"], cpu["variant"]) == (300.0, "cpu-serial (reduction sum)")
    gpu = _one(table, row="Total training time", column="GPU", unit="s")
    assert gpu["ours"] == 2.5 and gpu["our_speedup"] == pytest.approx(300.0 / 2.5)  # over the sum run, as the paper
    assert _one(table, row="Test accuracy", column="CPU")["diff_pp"] == pytest.approx(0.0)
    # before the reduction setting existed every run averaged: the CPU row takes it and says so
    table = pd.DataFrame(rows_for(OursE1(_e1_frame(reduction=False).iloc[1:], PAPER_VALUES)))
    cpu = _one(table, row="Total training time", column="CPU", unit="s")
    assert cpu["ours"] == 310.0 and "loss gradient is the batch mean; the paper's CPU one is the sum" in cpu["note"]


def test_e1_labels_simulated_numbers(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-serial", "gpu-naive"], where=_cpu_and_simulated)
    out = tmp_path / "report"
    make_report("e1", out, runs=runs, evals=evals)
    gpu = _one(_rows(out, MEASURED), row="Avg. time per epoch", column="GPU")
    assert gpu["our_device"] == "cuda-simulator" and bool(gpu["simulator"])
    assert "simulator: its timing is not meaningful" in gpu["note"]
    assert "ran under numba's CUDA simulator" in (out / "paper_vs_ours.md").read_text()


def test_e2_cells_speedups_and_missing_cells(tmp_path):
    runs = _e2_runs(tmp_path, ["cpu-serial", "gpu-naive"], skip={("gpu-naive", 64, 128)})
    out = tmp_path / "report"
    make_report("e2", out, runs=runs)
    table = _rows(out)
    assert len(table) == 4 * 3 * 4 * 4 + 4  # every number of the paper's 12 tables, and its text's
    naive = _one(table, table="Naive Parallel Implementation, Batch size 32", row="Training time (s)",
                 column="32 nodes")
    assert naive["ours"] == pytest.approx(2.0 * 2)  # E2_FACTOR 2 x hidden 32 / 32 x 64 / batch 32
    assert naive["paper_speedup"] == pytest.approx(53.7502 / 4.08057)
    assert naive["our_speedup"] == pytest.approx(100.0 / 4.0)
    missing = _one(table, table="Naive Parallel Implementation, Batch size 128", row="Training time (s)",
                   column="64 nodes")
    assert pd.isna(missing["ours"]) and "not run here: gpu-naive at batch 128, hidden 64" in missing["note"]
    device_memory = _one(table, table="Parallel Optimization #1: Unified Memory Optimization, Batch size 32",
                         row="Test accuracy", column="32 nodes")
    assert pd.isna(device_memory["ours"]) and "gpunn has no counterpart" in device_memory["note"]
    md = (out / "paper_vs_ours.md").read_text()
    assert _md_row(md, "Training time (s)", "64 nodes", "2.01787 s")[3] == "-"  # opt. #1, batch 64: no counterpart


def test_e3_places_our_speedups_in_the_plans_range(tmp_path):
    out = tmp_path / "report"
    make_report("e3", out, timings=_write_timings(tmp_path / "timing", where=lambda v: ON_H100))
    table = _rows(out, "Benchmarking Plan")
    assert set(table["paper_text"]) == {"5-50"} and table["ratio"].isna().all()
    for _, row in table.iterrows():
        assert row["note"].endswith(("within the paper's range", "below the paper's range", "above the paper's range"))
        assert "ours: throughput" in row["note"]
    # ours is the throughput speedup (cpu-numpy's time per step over the variant's), not the latency's:
    # _write_timings gives variant k a throughput step of 10 / (k + 1)^2 + 0.01 batch ms and cpu-numpy k = 0
    graph = _one(table, variant="gpu-graph vs cpu-numpy", column="expected_speedup vs NumPy CPU, batch 512")
    k = E3_VARIANTS.index("gpu-graph")
    assert graph["ours"] == pytest.approx((10.0 + 5.12) / (10.0 / (k + 1) ** 2 + 5.12))
    tolerance = _one(_rows(out), quantity="relative_error")
    assert pd.isna(tolerance["ours"]) and "not measured by the pipeline" in tolerance["note"]
    # timings taken beside other jobs (timing: overlap, recorded in each CSV row): no speedup, the note says why
    overlapped = _write_timings(tmp_path / "overlap", where=lambda v: {**ON_H100, "timing_mode": "overlap"})
    make_report("e3", tmp_path / "overlap-report", timings=overlapped)
    graph = _one(_rows(tmp_path / "overlap-report", "Benchmarking Plan"),
                 column="expected_speedup vs NumPy CPU, batch 512", variant="gpu-graph")
    assert pd.isna(graph["ours"]) and ("no speedup: gpu-graph (overlap) and cpu-numpy (overlap) were not both timed "
                                       "alone") in graph["note"]


def test_e4_tables_speedups_over_each_sides_cpu_and_the_block_result(tmp_path):
    runs, evals = _e4_results(tmp_path)
    out = tmp_path / "report"
    make_report("e4", out, runs=runs, evals=evals)
    table = _rows(out)
    a40 = _one(table, table="Table 3", row="A40", column="Training Time [s]")
    assert a40["ours"] == 24.0 and a40["paper_speedup"] == pytest.approx(159.26 / 23.47)  # Table 1, 4 workers
    assert a40["our_speedup"] == pytest.approx(180.0 / 24.0)  # our cpu-numpy on mnist
    fashion = _one(table, table="Table 6", row="V100", column="Training Time[s]")
    assert fashion["paper_speedup"] == pytest.approx(188.44 / 8.47) and fashion["our_speedup"] == pytest.approx(40.0)
    accuracy = _one(table, table="Table 4", row="RTX6000", column="Test Accuracy")
    assert accuracy["diff_pp"] == pytest.approx(100 * E4_RUNS[("mnist", "gpu-optimized")][1] - 98.08)
    assert set(table.loc[table["table"] == "Table 1", "row"]) == {"CPU"}  # PyTorch's CUDA rows are not ours
    pytorch = _one(table, column="speedup vs PyTorch CPU", row="PyTorch CUDA")
    assert pd.isna(pytorch["ours"]) and pd.isna(pytorch["variant"]) and "no counterpart" in pytorch["note"]
    headline = _one(table, table="4.2 Cuda results", column="speedup vs naive")
    assert headline["ours"] == pytest.approx(24.0 / 6.0) and headline["ratio"] == pytest.approx(4.0 / 4.5)
    block = _one(table, column="train_loss, block 1024")  # the block study ran on fashion_mnist: noted
    assert block["ours"] == pytest.approx(2.303) and "ours: fashion_mnist" in block["note"]
    md = (out / "paper_vs_ours.md").read_text()
    assert "### Table 3" in md and "### Table 6" in md and "| RTX 6000 " in md and "| RTX6000 " in md


def test_e5_phase_tables_memory_and_a_variant_not_run(tmp_path):
    runs, evals = _e5_results(tmp_path, {v: E5_RUNS[v] for v in ("cpu-numpy", "gpu-naive", "gpu-im2col")})
    out = tmp_path / "report"
    make_report("e5", out, runs=runs, evals=evals)
    table = _rows(out, "Phase 2.4: Performance Comparison Table")
    cpu = _one(table, row="CPU (Extrapolated)", column="Epoch Time (s)")
    assert cpu["ours"] == pytest.approx(30000.0) and "extrapolated" in cpu["note"]  # 600 s x 50 000 / 1 000
    v2 = _one(table, row="GPU Optimized v2 (2.4)", column="Speedup (vs. CPU)")
    assert (v2["paper"], v2["ours"]) == (251.57, pytest.approx(250.0))
    previous = _one(table, row="GPU Optimized v2 (2.4)", column="Speedup (vs. Prev Phase)")
    assert pd.isna(previous["ours"]) and "not run here: gpu-tiled" in previous["note"]  # its previous phase
    epoch = _one(table, row="GPU Optimized v2 (2.4)", column="Epoch Time (s)")
    assert epoch["paper_speedup"] == pytest.approx(29678.0 / 117.97) and epoch["our_speedup"] == pytest.approx(250.0)
    totals = _rows(out, "3.1 Performance Comparison Across All Phases")
    vram = _one(totals, row="GPU Naive", column="Memory (RAM/VRAM): VRAM")
    assert vram["ours"] == pytest.approx(120.0) and vram["ratio"] == pytest.approx(120.0 / 116)
    assert "does not record host memory" in _one(totals, row="GPU Naive", column="Memory (RAM/VRAM): RAM")["note"]
    assert "batch 32" in vram["note"]  # the paper trained one image per step
    md = (out / "paper_vs_ours.md").read_text()
    assert _md_row(md, "GPU Optimized v1 (2.3)", "Epoch Time (s)")[3] == "-"


def test_e5_times_per_epoch_count_the_full_set_as_its_speedups_do(tmp_path):
    """cpu-numpy trained on a 1 000-image subset (600 s an epoch here): the speedup row's times per epoch and the
    baselines' comparison use its epoch over the full set's 50 000 images (30 000 s, as the speedups do), said so."""
    runs, evals = _e5_results(tmp_path, {v: E5_RUNS[v] for v in ("cpu-numpy", "gpu-naive", "gpu-im2col")})
    out = tmp_path / "report"
    make_report("e5", out, runs=runs, evals=evals)
    row = _one(_rows(out, "Phase 2.4: Performance Comparison Table"), row="GPU Optimized v2 (2.4)",
               column="Speedup (vs. CPU)")
    assert row["ours"] == pytest.approx(250.0)
    assert row["epoch_times"].endswith("ours: gpu-im2col 120 s on NVIDIA H100 80GB HBM3, cpu-numpy 30000 s on cpu "
                                       "(AMD EPYC 9454) (scaled from an epoch of 1 000 images)")
    assert ("the baselines differ: the paper's CPU took 29678 s an epoch, ours (cpu-numpy) 30000 s, 1.01x slower"
            in row["note"])


def e6_paper_setting_svm(tmp_path):
    """An SVM step's outputs in paper 004's setting (50 000 x 8192 features, exact): 90 % / 70 %, fit in 77.4 s."""
    svm = tmp_path / "svm" / _e5_spec("gpu-graph", 0).path
    io.write_json(svm / "metrics.json", {
        "method": "exact", "C": 10.0, "gamma": "scale", "n_train": 50000, "n_test": 10000, "n_features": 8192,
        "kernel_device": "gpu", "train_accuracy": 0.9, "test_accuracy": 0.7, "fit_time_s": 77.4, "provenance": ON_H100,
        "per_class_accuracy": {"cat": 0.5}})
    _write_confusion(svm, [[7, 3], [3, 7]], ["cat", "dog"])
    return svm


def test_e6_accuracies_time_and_range(tmp_path):
    out = tmp_path / "report"
    make_report("e6", out, svm=[e6_paper_setting_svm(tmp_path)])
    table = _rows(out)
    test = _one(table, column="test_accuracy")
    assert test["diff_pp"] == pytest.approx(70.0 - 67.56) and test["our_device"] == "NVIDIA H100 80GB HBM3"
    fit = _one(table, column="fit_time")
    assert fit["ratio"] == pytest.approx(77.4 / 46) and "kernel computed on the gpu" in fit["note"]
    assert "above the paper's range" in _one(table, column="expected_accuracy")["note"]


def test_e6_two_methods_compared_with_exact_and_gpu_smo_beside_the_paper(tmp_path):
    """E6 with gpu-smo and exact: the summary gives gpu-smo's test accuracy minus exact's and the share of the test
    points both predict alike (from their predictions.csv); paper_vs_ours takes gpu-smo's fit time (the paper's cuML
    is a GPU solver)."""
    spec = _e5_spec("gpu-graph", 0)
    folders = {}
    for method, acc, fit, predicted in (("exact", 0.7, 77.4, [0, 1, 1, 0]), ("gpu-smo", 0.65, 9.5, [0, 1, 0, 0])):
        folders[method] = svm = tmp_path / "svm" / "nvidia-h200" / method / spec.path
        io.write_json(svm / "metrics.json", {
            "method": method, "C": 10.0, "gamma": "scale", "n_train": 50000, "n_test": 4, "n_features": 8192,
            "kernel_device": "gpu", "train_accuracy": 0.9, "test_accuracy": acc, "fit_time_s": fit,
            "provenance": ON_H100, "per_class_accuracy": {"cat": 0.5}})
        _write_confusion(svm, [[2, 0], [1, 1]] if method == "gpu-smo" else [[2, 0], [0, 2]], ["cat", "dog"])
        io.write_csv(svm / "predictions.csv", pd.DataFrame({"row": [0, 1, 2, 3], "true": [0, 1, 1, 0],
                                                            "predicted": predicted}))
    out = tmp_path / "report"
    make_report("e6", out, svm=[folders["exact"], folders["gpu-smo"]])
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    assert summary.loc["gpu-smo", "points_vs_exact"] == pytest.approx(-5.0)
    assert summary.loc["gpu-smo", "same_as_exact"] == pytest.approx(0.75)
    assert pd.isna(summary.loc["exact", "points_vs_exact"]) and pd.isna(summary.loc["exact", "same_as_exact"])
    md = (out / "summary.md").read_text()
    assert "-5.00" in md and "75.00 %" in md
    fit = _one(_rows(out), column="fit_time")
    assert fit["ratio"] == pytest.approx(9.5 / 46) and fit["variant"] == "svm gpu-smo"
    (folders["exact"] / "predictions.csv").unlink()  # an exact run made before predictions.csv: no share, the points
    make_report("e6", tmp_path / "report2", svm=[folders["exact"], folders["gpu-smo"]])
    again = pd.read_csv(tmp_path / "report2" / "summary.csv").set_index("method")
    assert pd.isna(again.loc["gpu-smo", "same_as_exact"])
    assert again.loc["gpu-smo", "points_vs_exact"] == pytest.approx(-5)


def test_e6_accuracies_on_another_datasets_features_are_not_the_papers_setting(tmp_path):
    """An SVM on the features of synthetic_cifar10's encoder (an offline machine's E6): its accuracies are shown
    beside the paper's CIFAR-10 ones but not as a difference in points on the entry page; the note says why."""
    import dataclasses

    from gpunn.report.index import NOT_PAPER_SETTING, _comparison

    spec = dataclasses.replace(_e5_spec("gpu-graph", 0), dataset="synthetic_cifar10")
    svm = tmp_path / "svm" / "nvidia-h200" / spec.path
    io.write_json(svm / "metrics.json", {
        "method": "exact", "C": 10.0, "gamma": "scale", "n_train": 50000, "n_test": 10000, "n_features": 8192,
        "kernel_device": "gpu", "train_accuracy": 0.99, "test_accuracy": 0.8, "fit_time_s": 60.0,
        "provenance": ON_H100, "per_class_accuracy": {"cat": 0.5}})
    _write_confusion(svm, [[7, 3], [3, 7]], ["cat", "dog"])
    out = tmp_path / "report"
    make_report("e6", out, svm=[svm])
    test = _one(_rows(out), column="test_accuracy")
    assert test["our_setting"] == "synthetic_cifar10" and "ours: synthetic_cifar10" in test["note"]
    from gpunn.experiments.e6 import PAPER_VALUES as E6_VALUES

    entry = next(v for v in E6_VALUES if v.quantity == "test_accuracy")
    assert _comparison(entry, test) == NOT_PAPER_SETTING


def test_a_summary_without_a_needed_column_is_one_clear_error():
    frame = _e1_frame().drop(columns="train_time_s")
    with pytest.raises(GpunnError, match="^E1 paper_vs_ours: our summary lacks column.s. train_time_s; it has"):
        OursE1(frame, PAPER_VALUES)
    with pytest.raises(GpunnError, match="^E2 paper_vs_ours: our summary lacks column.s. hidden, forward_time_s"):
        OursE2(_e1_frame(), PAPER_VALUES)


def test_a_range_verdict_weighs_the_speedups_spread_over_repeats():
    """Ours against the paper's 4-5x (E4, optimized over naive): placed within, below or above it where every repeat
    agrees; a bound inside ours' spread over the repeats is not settled by these runs."""
    from gpunn.experiments.e4 import PAPER_VALUES as E4_VALUES
    from gpunn.report.paper_vs_ours import range_note, speedup_spread

    entry = next(v for v in E4_VALUES if v.quantity == "speedup" and v.upper_text == "5")
    naive = pd.Series({"train_time_s": 20.0, "train_time_low_s": 19.0, "train_time_high_s": 21.0})
    optimized = pd.Series({"train_time_s": 4.4, "train_time_low_s": 4.0, "train_time_high_s": 4.8})
    spread = speedup_spread(20.0 / 4.4, optimized, naive)
    assert spread == pytest.approx((19.0 / 4.8, 21.0 / 4.0))
    assert range_note(20.0 / 4.4, entry, spread) == (
        "ours spans 3.958-5.25 over the runs' repeats, across the paper's 4: not settled by these runs")
    assert range_note(20.0 / 4.4, entry) == "within the paper's range"  # one run each: no spread to weigh
    steady = speedup_spread(20.0 / 4.4, pd.Series({**optimized, "train_time_low_s": 4.3, "train_time_high_s": 4.5}),
                            naive)
    assert range_note(20.0 / 4.4, entry, steady) == "within the paper's range (ours 4.222-4.884 over the runs' repeats)"
    unrepeated = pd.Series({"train_time_s": 4.4})
    assert speedup_spread(20.0 / 4.4, unrepeated, unrepeated) is None
