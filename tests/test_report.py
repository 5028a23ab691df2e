"""Report figures (non-empty, non-blank PNGs), summary tables (CSV round trip, Markdown formatting) and the
experiment reports E1-E6 built from synthetic run folders, timing CSVs and SVM outputs (tables checked cell by cell;
E1's verdict on paper 000's CPU-GPU gap for each case the data can show)."""

from __future__ import annotations

import dataclasses
import json

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from gpunn import io
from gpunn.backends.registry import uses_gpu
from gpunn.batch_timing import BATCH_TIMING_COLUMNS
from gpunn.cli import main as cli_main
from gpunn.errors import GpunnError
from gpunn.experiments.e1 import epoch_time_bars
from gpunn.experiments.e2 import e2_heatmaps, e2_phase_times
from gpunn.experiments.e3 import batch_timing, block_sweep
from gpunn.experiments.e4 import NAIVE_DESIGN
from gpunn.report.build import make_report
from gpunn.report.figures import confusion_matrix_figure, loss_curves, reconstruction_grid, sample_classifications
from gpunn.report.tables import format_significant, markdown_table, summary_table
from gpunn.runspec import RunSpec
from gpunn.targets import JOB_TIMES, STEP_PROFILE, report_outputs
from gpunn.train import METRIC_COLUMNS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert image.std() > 0.01
    assert not list(path.parent.glob(f".{path.name}.*"))  # no temporary left behind
    pdf = path.with_suffix(".pdf")  # every figure also as PDF, for papers
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


def _epoch_csv(path, with_accuracy=True, epochs=5, offset=0.0):
    e = np.arange(1, epochs + 1)
    frame = pd.DataFrame({
        "epoch": e,
        "train_loss": 1.0 / e + offset,
        "test_loss": 1.1 / e + offset,
        "test_accuracy": 0.8 + 0.03 * e if with_accuracy else np.nan,
        "epoch_time_s": 0.5 + 0.01 * e,
    })
    frame.to_csv(path, index=False)
    return path


def test_loss_curves(tmp_path):
    runs = {"cpu": _epoch_csv(tmp_path / "a.csv"), "gpu": _epoch_csv(tmp_path / "b.csv", offset=0.05)}
    out = loss_curves(runs, tmp_path / "fig" / "loss.png", "MLP on MNIST")
    assert out == tmp_path / "fig" / "loss.png"
    _assert_png(out)
    # autoencoder: empty accuracy column -> loss panel only
    ae = tmp_path / "ae.csv"
    _epoch_csv(ae, with_accuracy=False)
    text = ae.read_text()
    assert ",," in text  # the accuracy column really is empty
    _assert_png(loss_curves({"ae": ae}, tmp_path / "ae.png", "AE"))
    wide = mpimg.imread(tmp_path / "fig" / "loss.png").shape[1]
    assert mpimg.imread(tmp_path / "ae.png").shape[1] < wide


def test_loss_axis_scale():
    from gpunn.report.figures import loss_axis_scale
    # E5's shape: cpu-numpy's one epoch over 1 000 images at 0.33 beside 20 GPU epochs from 0.04 to 0.009
    assert loss_axis_scale([0.33, 0.039, 0.0196, 0.0091]) == "log"
    assert loss_axis_scale([0.84, 0.40, 0.22, np.nan]) == "linear"  # within one decade: linear, NaN ignored
    assert loss_axis_scale([0.5, 0.0, 0.01]) == "linear"  # a zero has no logarithm
    assert loss_axis_scale([]) == "linear"


def test_loss_curves_bad_input(tmp_path):
    with pytest.raises(GpunnError, match="missing.csv"):
        loss_curves({"x": tmp_path / "missing.csv"}, tmp_path / "o.png", "t")
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"epoch": [1], "train_loss": [1.0]}).to_csv(bad, index=False)
    with pytest.raises(GpunnError, match="test_loss"):
        loss_curves({"x": bad}, tmp_path / "o.png", "t")
    assert not (tmp_path / "o.png").exists()


def test_confusion_matrix_figure(tmp_path):
    m = np.array([[50, 2, 0], [3, 40, 7], [0, 0, 0]])  # an empty true class must not break the colouring
    _assert_png(confusion_matrix_figure(m, ["cat", "dog", "bird"], tmp_path / "c.png", "confusion"))
    with pytest.raises(GpunnError):
        confusion_matrix_figure(m, ["cat", "dog"], tmp_path / "c2.png", "x")
    with pytest.raises(GpunnError):
        confusion_matrix_figure(np.zeros((2, 3)), ["a", "b"], tmp_path / "c3.png", "x")


@pytest.mark.parametrize("channels,dtype", [(1, np.uint8), (3, np.float32)])
def test_reconstruction_grid(tmp_path, channels, dtype):
    rng = np.random.default_rng(0)
    orig = rng.random((12, channels, 16, 16))
    recon = np.clip(orig + 0.1 * rng.normal(size=orig.shape), -0.05, 1.05)  # overshoot is clipped
    if dtype == np.uint8:
        orig = (orig * 255).astype(np.uint8)
        recon = (np.clip(recon, 0, 1) * 255).astype(np.uint8)
    else:
        orig, recon = orig.astype(dtype), recon.astype(dtype)
    _assert_png(reconstruction_grid(orig, recon, tmp_path / "r.png", "reconstructions"))
    with pytest.raises(GpunnError):
        reconstruction_grid(orig, recon[:5], tmp_path / "r2.png", "x")
    with pytest.raises(GpunnError):
        reconstruction_grid(orig[:, :, :, :, None], recon, tmp_path / "r3.png", "x")


def test_sample_classifications(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.normal(size=(30, 1, 28, 28)).astype(np.float32)  # standardised: stretched for display
    labels = rng.integers(0, 10, size=30)
    preds = labels.copy()
    preds[::4] = (preds[::4] + 1) % 10
    names = [f"c{i}" for i in range(10)]
    _assert_png(sample_classifications(images, labels, preds, names, tmp_path / "s.png", "MNIST samples"))
    _assert_png(sample_classifications(images[:7, 0], labels[:7], preds[:7], None, tmp_path / "s7.png", "few"))
    with pytest.raises(GpunnError):
        sample_classifications(images, labels[:3], preds, names, tmp_path / "s2.png", "x")


def test_e2_heatmaps(tmp_path):
    rows = []
    for variant, factor in (("serial", 100.0), ("naive", 2.0), ("tiled", 1.0)):
        for hidden in (32, 64, 128, 256):
            for batch in (32, 64, 128):
                t = factor * hidden / batch
                rows.append(dict(variant=variant, hidden=hidden, batch=batch, train_time_s=t,
                                 forward_time_s=0.4 * t, backward_time_s=0.6 * t,
                                 test_accuracy=0.9 + hidden / 10000 - batch / 100000))
    table = tmp_path / "e2.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    _assert_png(e2_heatmaps(table, tmp_path / "e2.png"))
    # a missing cell and no accuracies still draw
    frame = pd.DataFrame(rows[1:]).assign(test_accuracy=np.nan)
    frame.to_csv(table, index=False)
    _assert_png(e2_heatmaps(table, tmp_path / "e2b.png"))


def _e3_row(variant, batch, step, clock="host"):
    """One E3 timing row: throughput `step` ms per step, its split 0.4 / 0.5 of it, latency 3x it."""
    return dict(variant=variant, batch=batch, throughput_step_ms=step, throughput_samples_per_s=1000 * batch / step,
                forward_ms=0.4 * step, backward_ms=0.5 * step, clock=clock, latency_ms=3 * step)


def test_batch_timing(tmp_path, monkeypatch):
    saved = _capture_figures(monkeypatch)
    rows = [_e3_row(variant, batch, base + 0.01 * batch, clock)
            for variant, base, clock in (("cpu-numpy", 5.0, "host"), ("gpu-tiled", 0.2, "cuda events"))
            for batch in (1, 8, 32, 128, 512)]
    table = tmp_path / "e3.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    _assert_png(batch_timing(table, tmp_path / "e3.png"))
    panels = saved[-1]["panels"]
    assert panels[:3] == ["throughput: steps back to back", "throughput: time per step",
                          "latency: one synchronous step"]
    assert panels[3:] == ["split: forward pass and loss\n(CUDA events; host clock: cpu-numpy)",
                          "split: backward pass and update\n(CUDA events; host clock: cpu-numpy)"]
    tiled = [r for r in rows if r["variant"] == "gpu-tiled"]
    for panel, column in enumerate(("throughput_samples_per_s", "throughput_step_ms", "latency_ms", "forward_ms",
                                    "backward_ms")):
        assert saved[-1]["ydata"][panel][1] == pytest.approx([r[column] for r in tiled])  # each panel its column
    pd.DataFrame(rows).drop(columns="latency_ms").to_csv(table, index=False)
    with pytest.raises(GpunnError, match="latency_ms"):
        batch_timing(table, tmp_path / "e3b.png")


ROWS = [
    {"variant": "cpu-numpy", "batch": 64, "epoch_time_s": 298.6, "test_accuracy": 0.9793, "speedup": 1.0},
    {"variant": "gpu-naive", "batch": 64, "epoch_time_s": 2.2537, "test_accuracy": 0.93861, "speedup": 132.5},
    {"variant": "gpu-tiled", "batch": 64, "epoch_time_s": 0.012345, "test_accuracy": None, "speedup": 24188.0},
]


def test_summary_table_round_trip_and_markdown(tmp_path):
    frame = summary_table(ROWS, tmp_path / "t" / "e1.csv", tmp_path / "t" / "e1.md", "E1: MLP on MNIST")
    back = pd.read_csv(tmp_path / "t" / "e1.csv")
    pd.testing.assert_frame_equal(back, pd.DataFrame(ROWS), check_dtype=False)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)

    md = (tmp_path / "t" / "e1.md").read_text().splitlines()
    assert md[0] == "## E1: MLP on MNIST"
    table = [line for line in md if line.startswith("|")]
    assert len(table) == 2 + len(ROWS)
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["variant", "batch", "epoch_time_s", "test_accuracy", "speedup"]
    assert len({len(line) for line in table}) == 1  # aligned: every line has the same width
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert cells[0] == ["cpu-numpy", "64", "299", "97.93 %", "1"]
    assert cells[1] == ["gpu-naive", "64", "2.25", "93.86 %", "132.5"]
    assert cells[2] == ["gpu-tiled", "64", "0.0123", "-", "24188"]
    assert table[1].split("|")[2].strip().endswith(":")  # numbers right-aligned
    assert not table[1].split("|")[1].strip().endswith(":")  # text left-aligned


def test_summary_table_columns_and_errors(tmp_path):
    frame = summary_table(ROWS, tmp_path / "a.csv", tmp_path / "a.md", "subset",
                          columns=["test_accuracy", "variant"], formats={"variant": str.upper})
    assert list(frame.columns) == ["test_accuracy", "variant"]
    assert list(pd.read_csv(tmp_path / "a.csv").columns) == ["test_accuracy", "variant"]
    assert "CPU-NUMPY" in (tmp_path / "a.md").read_text()
    with pytest.raises(GpunnError, match="nope"):
        summary_table(ROWS, tmp_path / "b.csv", tmp_path / "b.md", "bad", columns=["nope"])
    with pytest.raises(GpunnError):
        summary_table([], tmp_path / "c.csv", tmp_path / "c.md", "empty")
    assert not (tmp_path / "b.csv").exists() and not (tmp_path / "c.md").exists()


def test_markdown_table_formatting():
    frame = pd.DataFrame({"name": ["a|b", "c"], "hidden": [32.0, np.nan], "fit_time_s": [0.001234, 12345.6],
                          "mse": [0.004512, 2.0]})
    text = markdown_table(frame)
    lines = text.strip().splitlines()
    assert len(lines) == 4
    assert "a\\|b" in lines[2] and " 32 |" in lines[2] and "0.00123" in lines[2] and "0.004512" in lines[2]
    assert "12346" in lines[3] and " - " in lines[3]
    assert format_significant(9.996) == "10.0"
    assert format_significant(0.0) == "0"


def test_ratios_have_three_significant_digits_and_a_floor():
    from gpunn.report.tables import format_ratio

    assert [format_ratio(v) for v in (132.7, 4.123, 0.031, 0.001, 0.0000117)] == \
        ["133x", "4.12x", "0.0310x", "0.00100x", "<0.001x"]


def test_rate_columns_are_not_times():
    from gpunn.report.tables import is_time_column

    assert is_time_column("fit_time_s") and is_time_column("step_ms") and is_time_column("epoch_time")
    assert not is_time_column("samples_per_s") and not is_time_column("test_accuracy")
    text = markdown_table(pd.DataFrame({"samples_per_s": [95238.13, 1.23456]}))
    assert "95238" in text and "1.235" in text


# ----------------------------------------------------------------- experiment reports (gpunn.experiments)
# Synthetic inputs in the formats the pipeline writes: run folders as gpunn.train leaves them, timing CSVs as
# gpunn.timing writes them, and the block-size sweep CSV of rule sweep_blocks.

GPU_VARIANTS = ("gpu-naive", "gpu-tiled", "gpu-fused")


def _provenance(device, simulator=False):
    """A run's provenance as gpunn.train records it in metrics.json."""
    return {"device": device, "simulator": simulator, "cpu": "AMD EPYC 9454", "blas_threads": 4, "numba_threads": 4,
            "numpy": "2.4.6", "numba": "0.61.2", "numba_cuda": "0.15.1", "snakemake": "9.6.0", "commit": "aaca32a"}


ON_CPU = _provenance("cpu")
ON_H100 = _provenance("NVIDIA H100 80GB HBM3")
SIMULATED = _provenance("numba CUDA simulator", simulator=True)


def _cpu_and_simulated(variant):
    return SIMULATED if uses_gpu(variant) else ON_CPU


def _cpu_and_h100(variant):
    return ON_H100 if uses_gpu(variant) else ON_CPU


def _csv_provenance(provenance):
    """The provenance columns every timing CSV row gets (no cpu column: that is only in metrics.json)."""
    return {k: v for k, v in provenance.items() if k != "cpu"}


def _write_run(results, spec: RunSpec, train_s, forward_s, backward_s, accuracy, provenance=None, n_train=1000,
               n_test=500, image_shape=(1, 28, 28), test_time_s=None, final_loss=None):
    """A finished run's folder: metrics.csv (one row per epoch) and metrics.json, as gpunn.train writes them;
    without `provenance`, metrics.json is in the format written before runs recorded their device, without
    `test_time_s` in the one before the testing time was measured. The train loss falls as 1 / epoch to
    `final_loss` (default 1 / epochs)."""
    run = results / "runs" / spec.path
    inputs = int(np.prod(image_shape))
    epochs = np.arange(1, spec.epochs + 1)
    per_epoch = train_s / spec.epochs
    final_loss = 1.0 / spec.epochs if final_loss is None else final_loss
    io.write_csv(run / "metrics.csv", pd.DataFrame({
        "epoch": epochs, "train_loss": final_loss * spec.epochs / epochs, "test_loss": 1.1 / epochs,
        "test_accuracy": accuracy - 0.01 * (spec.epochs - epochs), "epoch_time_s": per_epoch,
        "forward_time_s": forward_s / spec.epochs, "backward_time_s": backward_s / spec.epochs,
        "eval_time_s": 0.01, "samples_per_s": 1000 / per_epoch}, columns=METRIC_COLUMNS))
    summary = {
        "spec": spec.to_dict(), "n_train": n_train, "n_test": n_test, "image_shape": list(image_shape),
        "num_classes": 10, "num_parameters": (inputs + 1) * spec.widths[0] + (spec.widths[0] + 1) * 10,
        "final_train_loss": final_loss, "final_test_loss": 1.1 / spec.epochs, "final_test_accuracy": accuracy,
        "total_train_time_s": train_s, "mean_epoch_time_s": per_epoch, "forward_time_s": forward_s,
        "backward_time_s": backward_s, "host": {"machine": "x86_64"}}
    if provenance is not None:
        summary["provenance"] = provenance
    if test_time_s is not None:
        summary.update(test_time_s=test_time_s, block=spec.block)
    io.write_json(run / "metrics.json", summary)
    return run


def _write_eval(results, spec: RunSpec):
    """The evaluate step's samples.npz (the only eval file the E1 report reads)."""
    out = results / "eval" / spec.path
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 12)
    io.write_npz(out / "samples.npz", images=rng.integers(0, 256, (12, 1, 28, 28), dtype=np.uint8), labels=labels,
                 predictions=(labels + (np.arange(12) % 4 == 0)) % 10,
                 class_names=np.array([str(c) for c in range(10)]))
    return out


def _declared(experiment, config=None, profiled=False):
    """Base names of the files the workflow expects from one report step; without the step profile's (the workflow
    passes E1, E4 and E5 their GPU variants' profiles) unless `profiled`, and without the jobs table (the workflow
    passes every report its jobs' benchmark files; test_smoke_pipeline checks those tables)."""
    config = config or {"experiments": {experiment: {}}}
    return sorted(name for name in (path.rsplit("/", 1)[1] for path in report_outputs(config, experiment))
                  if (profiled or not name.startswith(f"{STEP_PROFILE}.")) and not name.startswith(f"{JOB_TIMES}."))


def _assert_written(out_dir, experiment, config=None, profiled=False):
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == _declared(experiment, config, profiled)  # exactly what targets.report_outputs declares
    for name in written:
        if name.endswith(".png"):
            _assert_png(out_dir / name)
        else:
            assert (out_dir / name).stat().st_size > 0


E1_RUNS = {  # variant: (train time s, test accuracy)
    "cpu-serial": (300.0, 0.9793), "cpu-numpy": (12.0, 0.9790), "gpu-naive": (2.4, 0.9795),
    "gpu-fused": (0.5, 0.9740),
}


def _e1_results(tmp_path, variants, where=None, spec_fields=None, repeats=None, **sizes):
    """E1's run folders and the first variant's eval folder; `where(variant)`: that run's provenance (None:
    a metrics.json from before provenance); `spec_fields` and `sizes` override the MNIST-sized defaults;
    `repeats`: {variant: accuracies of its repeats 1, 2, ...}."""
    results = tmp_path / "results"
    fields = {"dataset": "mnist", "widths": (256,), "batch": 64, "lr": 0.01, "epochs": 4, "seed": 0,
              **(spec_fields or {})}
    runs = []
    for variant in variants:
        train_s, accuracy = E1_RUNS[variant]
        for repeat, run_accuracy in enumerate([accuracy, *(repeats or {}).get(variant, ())]):
            spec = RunSpec(split="standard", model="mlp", variant=variant, repeat=repeat, **fields)
            runs.append(_write_run(results, spec, train_s, 0.4 * train_s, 0.5 * train_s, run_accuracy,
                                   provenance=where(variant) if where else None, **sizes))
    return runs, [_write_eval(results, RunSpec(split="standard", model="mlp", variant=variants[0], **fields))]


def test_e1_report_speedups_accuracy_difference_and_figures(tmp_path):
    # gpu-naive's two repeats (97.90 and 97.99 % beside its 97.95): a band of +-0.27 points
    runs, evals = _e1_results(tmp_path, ["gpu-fused", "cpu-numpy", "gpu-naive", "cpu-serial"],
                              repeats={"gpu-naive": [0.9790, 0.9799]})
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    _assert_written(out, "e1")
    table = pd.read_csv(out / "summary.csv")
    assert list(table["variant"]) == ["cpu-serial", "cpu-numpy", "gpu-naive", "gpu-fused"]  # baselines first
    for _, row in table.iterrows():
        train_s, accuracy = E1_RUNS[row["variant"]]
        assert row["train_time_s"] == pytest.approx(train_s)
        assert row["time_per_epoch_s"] == pytest.approx(train_s / 4)
        assert row["speedup_vs_cpu_serial"] == pytest.approx(300.0 / train_s)
        assert row["speedup_vs_cpu_numpy"] == pytest.approx(12.0 / train_s)
        assert row["accuracy_diff_vs_cpu_numpy_pp"] == pytest.approx(100 * (accuracy - 0.9790))
    # within the band of cpu-numpy: cpu-serial (+0.03 pp) and gpu-naive (+0.05 pp) yes, gpu-fused (-0.5 pp) no
    assert list(table["accuracy_matches_cpu_numpy"]) == [True, True, True, False]
    assert table["accuracy_band_pp"].tolist() == pytest.approx([0.2744] * 4, abs=1e-4)  # t(0.975, 2) s sqrt 2
    assert table["spread_runs"].tolist() == [3] * 4 and set(table["spread_variants"]) == {"gpu-naive"}
    assert table["spread_range_pp"].tolist() == pytest.approx([0.09] * 4)
    md = (out / "summary.md").read_text()
    assert "| gpu-naive " in md and "125x" in md and "+0.05" in md and "-0.50" in md and "95 % band" in md
    assert md.count("| gpu-naive ") == 1  # the repeats give the band only
    # mean runs only (E1_RUNS): the gap cannot be tested, and the gap figure says what it lacks
    cannot = ("Paper 000's 4.1-point CPU-GPU accuracy gap cannot be tested here: E1 ran only with reduction mean; "
              "set experiments.e1.reductions to [mean, sum].")
    assert cannot in md and cannot in (out / "gap.md").read_text()
    assert written["reduction_gap.png"].replace("\n", " ").endswith("and paper 000's (missing: the sum runs)")


def test_e1_report_without_a_baseline_gives_nan_not_a_crash(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-serial", "gpu-naive"])  # no cpu-numpy
    out = tmp_path / "report"
    make_report("e1", out, runs=runs, evals=evals)
    table = pd.read_csv(out / "summary.csv")
    assert table["speedup_vs_cpu_serial"].tolist() == pytest.approx([1.0, 125.0])
    assert table["speedup_vs_cpu_numpy"].isna().all()
    assert table["accuracy_diff_vs_cpu_numpy_pp"].isna().all()
    assert table["accuracy_matches_cpu_numpy"].isna().all()
    assert table["accuracy_band_pp"].isna().all() and table["spread_runs"].tolist() == [0, 0]  # no repeats
    gpu_line = next(line for line in (out / "summary.md").read_text().splitlines() if "| gpu-naive" in line)
    assert gpu_line.count(" - ") == 3  # the three comparisons with the missing baseline
    _assert_png(out / "epoch_time.png")


def test_e1_report_with_both_loss_reductions(tmp_path, monkeypatch):
    """E1 trains every variant with the batch-mean and the batch-sum gradient: a row each with its reduction,
    compared with the baselines of its own reduction, and named 'variant (reduction)' in the figures."""
    from gpunn.experiments import e1
    from gpunn.report import figures
    from gpunn.report.tables import run_labels

    results = tmp_path / "results"
    fields = {"dataset": "mnist", "split": "standard", "model": "mlp", "widths": (256,), "batch": 64, "lr": 0.01,
              "epochs": 4, "seed": 0}
    truth = {("gpu-naive", "mean"): (2.4, 0.9795), ("gpu-naive", "sum"): (2.5, 0.9702),  # (train s, accuracy)
             ("cpu-numpy", "mean"): (12.0, 0.9790), ("cpu-numpy", "sum"): (10.0, 0.9700)}
    runs = [_write_run(results, RunSpec(variant=v, reduction=r, **fields), t, 0.4 * t, 0.5 * t, accuracy,
                       provenance=_cpu_and_simulated(v)) for (v, r), (t, accuracy) in truth.items()]
    evals = [_write_eval(results, RunSpec(variant="gpu-naive", **fields))]
    curves = {}
    draw_curves = figures.loss_curves

    def recorded_loss_curves(runs_by_label, *args, **kwargs):  # what the loss figure is asked to draw
        curves.update(labels=list(runs_by_label), variants=kwargs["variants"])
        return draw_curves(runs_by_label, *args, **kwargs)

    monkeypatch.setattr(e1.figures, "loss_curves", recorded_loss_curves)
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    _assert_written(out, "e1")
    table = pd.read_csv(out / "summary.csv")
    assert list(zip(table["variant"], table["reduction"])) == [("cpu-numpy", "mean"), ("cpu-numpy", "sum"),
                                                               ("gpu-naive", "mean"), ("gpu-naive", "sum")]
    for _, row in table.iterrows():
        train_s, accuracy = truth[(row["variant"], row["reduction"])]
        numpy_s, numpy_accuracy = truth[("cpu-numpy", row["reduction"])]
        assert row["speedup_vs_cpu_numpy"] == pytest.approx(numpy_s / train_s)
        assert row["accuracy_diff_vs_cpu_numpy_pp"] == pytest.approx(100 * (accuracy - numpy_accuracy))
    # no repeats, so no band: only cpu-numpy's own rows (a difference of zero) match; +0.05 and +0.02 are unjudged
    assert list(table["accuracy_matches_cpu_numpy"].fillna("-")) == [True, True, "-", "-"]
    header, md_rows = _md_rows(out / "summary.md")
    assert header[:2] == ["variant", "reduction"]
    assert [row[:2] for row in md_rows] == [["cpu-numpy", "mean"], ["cpu-numpy", "sum"], ["gpu-naive", "mean"],
                                            ["gpu-naive", "sum"]]
    assert list(run_labels(table)) == ["cpu-numpy (mean)", "cpu-numpy (sum)", "gpu-naive (mean)", "gpu-naive (sum)"]
    assert curves["labels"] == ["gpu-naive (mean)", "gpu-naive (sum)", "cpu-numpy (mean)", "cpu-numpy (sum)"]
    assert curves["variants"]["cpu-numpy (sum)"] == "cpu-numpy"  # in cpu-numpy's colour
    assert "per variant and loss reduction" in written["summary.md"]
    # no repeats of gpu-naive: the numbers, and no verdict without their spread
    verdict = ("Under either reduction our CPU (cpu-numpy) and GPU (gpu-naive) runs differ by at most 0.05 points "
               "(mean: 97.90 % vs 97.95 %; sum: 97.00 % vs 97.02 %) and sum minus mean is -0.91 points, but no "
               "run-to-run spread was measured (set experiments.e1.spread_runs to 3 or more, with a non-deterministic "
               "variant such as gpu-naive among its variants): no verdict on the paper's 4.1-point CPU-GPU gap.")
    assert verdict in (out / "summary.md").read_text()
    gap = (out / "gap.md").read_text()
    assert gap.startswith(f"## {written['gap.md']}\n\n{verdict}\n")
    assert [row[:3] for row in _md_rows(out / "gap.md")[1]] == [
        ["CPU", "cpu-numpy", "mean"], ["CPU", "cpu-numpy", "sum"], ["GPU", "gpu-naive", "mean"],
        ["GPU", "gpu-naive", "sum"]]
    assert "(missing" not in written["reduction_gap.png"]
    # one reduction: the labels, titles and the figures stay those of the variants alone
    assert list(run_labels(table[table["reduction"] == "mean"])) == ["cpu-numpy", "gpu-naive"]
    assert list(run_labels(table.drop(columns="reduction"))) == list(table["variant"])  # a summary from before


# a setting's run-to-run band as spread.with_bands gives it to every row (gpu-naive's and gpu-tiled's repeats)
BAND = {"accuracy_band_pp": 0.30, "spread_runs": 6, "spread_range_pp": 0.15, "spread_variants": "gpu-naive, gpu-tiled"}
BAND_TEXT = ("±0.30 points (95 % band of a difference between two runs; 6 runs of gpu-naive and gpu-tiled, widest "
             "range 0.15)")


def _gap_frame(accuracies, reductions=True, band=BAND):
    """E1's summary as summary.csv holds it (what e1_gap_sentence reads): {(variant, reduction): accuracy}, each
    row with the `band` of its setting (None: no repeats, so no band); without `reductions`, a summary from
    before the reduction column."""
    frame = pd.DataFrame([{"variant": v, "reduction": r, "test_accuracy": a, **(band or {"spread_runs": 0})}
                          for (v, r), a in accuracies.items()])
    return frame if reductions else frame.drop(columns="reduction")


# paper 000's gap as our H100 runs showed it: CPU and GPU agree under either reduction, the sum gains 4.2 points
GAP_SUPPORTED = {("cpu-numpy", "mean"): 0.9404, ("cpu-numpy", "sum"): 0.9824, ("gpu-graph", "mean"): 0.9405,
                 ("gpu-graph", "sum"): 0.9826}
SUPPORTED_SENTENCE = (
    "Under either reduction our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by at most 0.02 points (mean: 94.04 % "
    f"vs 94.05 %; sum: 98.24 % vs 98.26 %), within their run-to-run spread of {BAND_TEXT}, while sum minus mean is "
    "+4.21 points: the paper's 4.1-point CPU-GPU gap follows the loss reduction, not the device.")
CANNOT = "Paper 000's 4.1-point CPU-GPU accuracy gap cannot be tested here: "


def test_e1_gap_sentence_supporting_not_supporting_and_untestable():
    from gpunn.experiments.e1 import e1_gap_sentence

    assert e1_gap_sentence(_gap_frame(GAP_SUPPORTED)) == SUPPORTED_SENTENCE
    # exactly the band apart (counts / n) is within it, as in the summary's accuracy_matches_cpu_numpy
    edge = e1_gap_sentence(_gap_frame({**GAP_SUPPORTED, ("gpu-graph", "mean"): 0.9434}))
    assert edge.startswith("Under either reduction our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by at most "
                           "0.30 points (mean: 94.04 % vs 94.34 %;") and edge.endswith("not the device.")
    # the GPU does not follow the reduction (94.05 % with either): the device explains the gap, beyond the band
    assert e1_gap_sentence(_gap_frame({**GAP_SUPPORTED, ("gpu-graph", "sum"): 0.9406})) == (
        "Under reduction sum our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by more than their run-to-run "
        f"spread of {BAND_TEXT} (mean: 94.04 % vs 94.05 %; sum: 98.24 % vs 94.06 %): the device changes the accuracy "
        "here, by up to 4.18 points against sum minus mean's +2.11, so these runs do not show the paper's 4.1-point "
        "CPU-GPU gap following the loss reduction alone.")
    # the GPU loses 1 point under the mean, beyond the band but under half the reduction's +4.71: qualified, not turned
    assert e1_gap_sentence(_gap_frame({**GAP_SUPPORTED, ("gpu-graph", "mean"): 0.9304})) == (
        "Under reduction mean our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by more than their run-to-run "
        f"spread of {BAND_TEXT}, by at most 1.00 points (mean: 94.04 % vs 93.04 %; sum: 98.24 % vs 98.26 %): a device "
        "effect, but under half the reduction's, while sum minus mean is +4.71 points: the paper's 4.1-point CPU-GPU "
        "gap follows the loss reduction, the device adding little.")
    # the same 1-point loss where the band is wider (a noisier setting) is within the spread
    wide = {**BAND, "accuracy_band_pp": 1.2}
    assert e1_gap_sentence(_gap_frame({**GAP_SUPPORTED, ("gpu-graph", "mean"): 0.9304}, band=wide)).endswith(
        "follows the loss reduction, not the device.")
    # the H200 runs of issue 39 (E1's default config, 3 runs each of gpu-naive and gpu-tiled, from the device's log):
    # within a tight band under the mean, a wider one under the sum
    h200 = {("cpu-serial", "mean"): 0.9404, ("cpu-serial", "sum"): 0.9821, ("gpu-naive", "mean"): 0.9405,
            ("gpu-naive", "sum"): 0.9828}
    bands = {"mean": {**BAND, "accuracy_band_pp": 0.02267, "spread_range_pp": 0.01},
             "sum": {**BAND, "accuracy_band_pp": 0.19698, "spread_range_pp": 0.12}}
    frame = pd.concat([_gap_frame({k: a}, band=bands[k[1]]) for k, a in h200.items()], ignore_index=True)
    assert e1_gap_sentence(frame).endswith(
        "within their run-to-run spread of ±0.02 points (95 % band of a difference between two runs; 6 runs of "
        "gpu-naive and gpu-tiled, widest range 0.01) under mean and ±0.20 points (95 % band of a difference between "
        "two runs; 6 runs of gpu-naive and gpu-tiled, widest range 0.12) under sum, while sum minus mean is +4.20 "
        "points: the paper's 4.1-point CPU-GPU gap follows the loss reduction, not the device.")
    # without repeats there is no band: the numbers, and no verdict
    assert e1_gap_sentence(_gap_frame(GAP_SUPPORTED, band=None)) == (
        "Under either reduction our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by at most 0.02 points (mean: "
        "94.04 % vs 94.05 %; sum: 98.24 % vs 98.26 %) and sum minus mean is +4.21 points, but no run-to-run spread "
        "was measured (set experiments.e1.spread_runs to 3 or more, with a non-deterministic variant such as "
        "gpu-naive among its variants): no verdict on the paper's 4.1-point CPU-GPU gap.")
    # the devices agree, and so do the reductions: nothing explains a gap
    same = {("cpu-numpy", r): 0.9404 for r in ("mean", "sum")} | {("gpu-graph", r): 0.9405 for r in ("mean", "sum")}
    assert e1_gap_sentence(_gap_frame(same)) == (
        "Under either reduction our CPU (cpu-numpy) and GPU (gpu-graph) runs differ by at most 0.01 points (mean: "
        f"94.04 % vs 94.05 %; sum: 94.04 % vs 94.05 %), within their run-to-run spread of {BAND_TEXT}, but sum minus "
        "mean is +0.00 points on the CPU and +0.00 on the GPU, not above zero by more than that spread, and not the "
        "paper's +4.1: these runs do not show the loss reduction behind the paper's CPU-GPU gap.")
    # a reduction gain well short of the paper's gap is not claimed to explain it
    small = {**GAP_SUPPORTED, ("cpu-numpy", "sum"): 0.9504, ("gpu-graph", "sum"): 0.9505}
    assert e1_gap_sentence(_gap_frame(small)).endswith(
        "while sum minus mean is only +1.00 points: the device does not explain the paper's 4.1-point CPU-GPU "
        "gap, and the loss reduction explains less than half of it here.")

    mean_only = {key: a for key, a in GAP_SUPPORTED.items() if key[1] == "mean"}
    for frame in (_gap_frame(mean_only), _gap_frame(mean_only, reductions=False)):  # the smoke config; an old table
        assert e1_gap_sentence(frame) == (
            f"{CANNOT}E1 ran only with reduction mean; set experiments.e1.reductions to [mean, sum].")
    no_gpu = {key: a for key, a in GAP_SUPPORTED.items() if key[0] == "cpu-numpy"}
    assert e1_gap_sentence(_gap_frame(no_gpu)) == (
        f"{CANNOT}no GPU variant ran (E1 ran cpu-numpy); add gpu-naive (or another GPU variant) to "
        "experiments.e1.variants.")
    no_cpu = {key: a for key, a in GAP_SUPPORTED.items() if key[0] == "gpu-graph"}
    assert e1_gap_sentence(_gap_frame(no_cpu)).startswith(f"{CANNOT}no CPU baseline ran (E1 ran gpu-graph)")
    one_missing = {key: a for key, a in GAP_SUPPORTED.items() if key != ("gpu-graph", "sum")}
    assert e1_gap_sentence(_gap_frame(one_missing)).startswith(
        f"{CANNOT}no run of gpu-graph with reduction sum among the report's inputs")


def test_e1_gap_runs_prefer_the_seeds_designs():
    """Paper 000's CPU is cpu-serial (else cpu-numpy), its GPU gpu-naive (else the first GPU variant in report
    order); a variant that ran with both reductions wins over a preferred one that ran with one."""
    from gpunn.experiments.e1 import e1_gap_runs

    def chosen(variants, partial=()):
        frame = _gap_frame({(v, r): 0.9 for v in variants for r in ("mean", "sum") if (v, r) not in partial})
        return {key: row["variant"] for key, row in e1_gap_runs(frame).items()}

    assert set(chosen(["gpu-graph", "cpu-numpy", "gpu-naive", "cpu-serial"]).items()) == {
        (("CPU", "mean"), "cpu-serial"), (("CPU", "sum"), "cpu-serial"), (("GPU", "mean"), "gpu-naive"),
        (("GPU", "sum"), "gpu-naive")}
    assert set(chosen(["gpu-graph", "cpu-numpy", "gpu-fused"]).values()) == {"cpu-numpy", "gpu-fused"}
    partial = chosen(["cpu-serial", "cpu-numpy", "gpu-naive"], partial={("cpu-serial", "sum")})
    assert partial[("CPU", "mean")] == partial[("CPU", "sum")] == "cpu-numpy"


# Two E1 trees of the full config that differ only in gpu-naive's atomic order, as two H200/H100 runs showed them:
# its sum run landed 0.13 points above cpu-serial in one and 0.02 below in the other (accuracy per run 0, 1, 2)
GAP_TREES = {
    "A": {("cpu-serial", "mean"): [0.9404], ("cpu-serial", "sum"): [0.9821],
          ("gpu-naive", "mean"): [0.9404, 0.9410, 0.9398], ("gpu-naive", "sum"): [0.9834, 0.9822, 0.9827]},
    "B": {("cpu-serial", "mean"): [0.9404], ("cpu-serial", "sum"): [0.9821],
          ("gpu-naive", "mean"): [0.9401, 0.9407, 0.9404], ("gpu-naive", "sum"): [0.9819, 0.9830, 0.9824]},
}
GAP_VERDICT = ": the paper's 4.1-point CPU-GPU gap follows the loss reduction, not the device."


def _gap_tree(results, tree):
    """E1's run folders of GAP_TREES[tree] on an H100, repeats as _x1, _x2; returns them and the first eval."""
    fields = {"dataset": "mnist", "split": "standard", "model": "mlp", "widths": (256,), "batch": 64, "lr": 0.01,
              "epochs": 10, "seed": 0}
    final_loss = {"mean": 0.2149, "sum": 0.0063}
    runs = [_write_run(results, RunSpec(variant=v, reduction=r, repeat=k, **fields), 5.0, 2.0, 2.5, accuracy,
                       provenance=_cpu_and_h100(v), n_train=60000, n_test=10000, final_loss=final_loss[r])
            for (v, r), accuracies in GAP_TREES[tree].items() for k, accuracy in enumerate(accuracies)]
    return runs, [_write_eval(results, RunSpec(variant="cpu-serial", **fields))]


def test_e1_gap_verdict_survives_a_rerun_of_gpu_naive(tmp_path, monkeypatch):
    """The issue's two trees through the whole E1 report: the same verdict from both (the bare 0.1-point bar gave
    'the device changes the accuracy' for A and 'follows the loss reduction' for B), the device differences judged
    against gpu-naive's repeats; gap.md and summary.md state it, reduction_gap.png draws the four runs themselves
    (no repeat) with paper 000's points on a log axis."""
    from gpunn import experiments

    saved = _capture_figures(monkeypatch)
    sentences = {}
    for tree in GAP_TREES:
        runs, evals = _gap_tree(tmp_path / tree / "results", tree)
        out = tmp_path / tree / "report"
        written = make_report("e1", out, runs=runs, evals=evals)
        _assert_written(out, "e1")
        gap = (out / "gap.md").read_text()
        sentences[tree] = gap.split("\n\n")[1]
        assert sentences[tree] in (out / "summary.md").read_text()
    assert sentences["A"] == (
        "Under either reduction our CPU (cpu-serial) and GPU (gpu-naive) runs differ by at most 0.13 points (mean: "
        "94.04 % vs 94.04 %; sum: 98.21 % vs 98.34 %), within their run-to-run spread of ±0.37 points (95 % band of a "
        "difference between two runs; 3 runs of gpu-naive, widest range 0.12), while sum minus mean is +4.23 points"
        f"{GAP_VERDICT}")
    assert sentences["B"].startswith("Under either reduction our CPU (cpu-serial) and GPU (gpu-naive) runs differ by "
                                     "at most 0.03 points (mean: 94.04 % vs 94.01 %; sum: 98.21 % vs 98.19 %), within "
                                     "their run-to-run spread of ±")
    assert sentences["B"].endswith(GAP_VERDICT)
    header, rows = _md_rows(tmp_path / "B" / "report" / "gap.md")
    assert header == ["phase", "variant", "reduction", "device", "final_train_loss", "test_accuracy"]
    assert rows == [["CPU", "cpu-serial", "mean", "cpu", "0.2149", "94.04 %"],
                    ["CPU", "cpu-serial", "sum", "cpu", "0.0063", "98.21 %"],
                    ["GPU", "gpu-naive", "mean", "NVIDIA H100 80GB HBM3", "0.2149", "94.01 %"],
                    ["GPU", "gpu-naive", "sum", "NVIDIA H100 80GB HBM3", "0.0063", "98.19 %"]]
    figure = next(f for f in saved if f["suptitle"] == written["reduction_gap.png"])
    lines = dict(zip([label for label, _, _ in figure["lines"][0]], figure["ydata"][0]))
    assert list(lines) == ["cpu-serial (mean)", "cpu-serial (sum)", "gpu-naive (mean)", "gpu-naive (sum)",
                           "paper 000 CPU", "paper 000 GPU"]
    assert lines["cpu-serial (sum)"][-1] == pytest.approx(0.0063)
    for phase in ("CPU", "GPU"):
        assert list(lines[f"paper 000 {phase}"]) == [
            v.value for v in experiments.paper_values("e1", "train_loss", phase=phase)]
    assert figure["yscale"] == ["log"]  # 2.1 after epoch 1 down to 0.0045: more than a decade
    assert figure["panels"][0].replace("\n", " ") == (  # same losses: named, as in every figure
        "(cpu-serial (mean) and gpu-naive (mean) coincide; cpu-serial (sum) and gpu-naive (sum) coincide)")
    assert "missing" not in written["reduction_gap.png"]


E2_HIDDEN = (32, 64)
E2_BATCH = (32, 128)
E2_FACTOR = {"cpu-serial": 100.0, "cpu-numpy": 8.0, "gpu-naive": 2.0, "gpu-tiled": 1.0}  # time scale per variant


def _e2_cell(variant, hidden, batch):
    """Independent truth of one E2 run: (train, forward, backward time, test accuracy)."""
    train = E2_FACTOR[variant] * hidden / 32 * (1.0 if variant == "cpu-serial" else 64 / batch)
    accuracy = 0.92 - hidden / 10000 - batch / 100000 + (0.0005 if uses_gpu(variant) else 0.0)
    return train, 0.45 * train, 0.5 * train, accuracy


def _e2_runs(tmp_path, variants, skip=(), where=None, **sizes):
    results = tmp_path / "results"
    runs = []
    for variant in variants:
        for hidden in E2_HIDDEN:
            for batch in E2_BATCH:
                if (variant, hidden, batch) in skip:
                    continue
                spec = RunSpec("mnist", "e2", "mlp", variant, (hidden,), batch, 0.01, 5, 0)
                runs.append(_write_run(results, spec, *_e2_cell(variant, hidden, batch),
                                       provenance=where(variant) if where else None, **sizes))
    return runs


def test_e2_paper_table_cells_and_speedups(tmp_path):
    missing = ("gpu-tiled", 64, 128)
    runs = _e2_runs(tmp_path, ["gpu-tiled", "gpu-naive", "cpu-numpy", "cpu-serial"], skip={missing})
    out = tmp_path / "report"
    make_report("e2", out, runs=runs)
    _assert_written(out, "e2")

    summary = pd.read_csv(out / "summary.csv")  # tidy: one row per run
    assert len(summary) == 4 * len(E2_HIDDEN) * len(E2_BATCH) - 1
    assert summary["variant"].unique().tolist() == ["cpu-serial", "cpu-numpy", "gpu-naive", "gpu-tiled"]

    paper = pd.read_csv(out / "paper_table.csv")
    metrics = ["train_s", "forward_s", "backward_s", "accuracy"]
    expected_columns = ["batch", "hidden"]
    for variant in ("cpu-serial", "cpu-numpy", "gpu-naive", "gpu-tiled"):
        expected_columns += [f"{variant} {m}" for m in metrics]
        if variant != "cpu-serial":
            expected_columns.append(f"{variant} speedup_vs_serial")
    assert list(paper.columns) == expected_columns
    assert list(zip(paper["batch"], paper["hidden"])) == [(b, h) for b in E2_BATCH for h in E2_HIDDEN]
    for _, row in paper.iterrows():
        hidden, batch = int(row["hidden"]), int(row["batch"])
        serial_train = _e2_cell("cpu-serial", hidden, batch)[0]
        for variant in E2_FACTOR:
            if (variant, hidden, batch) == missing:
                assert all(np.isnan(row[f"{variant} {m}"]) for m in metrics + ["speedup_vs_serial"])
                continue
            assert [row[f"{variant} {m}"] for m in metrics] == pytest.approx(_e2_cell(variant, hidden, batch))
            if variant != "cpu-serial":
                train = _e2_cell(variant, hidden, batch)[0]
                assert row[f"{variant} speedup_vs_serial"] == pytest.approx(serial_train / train)
                long_row = summary[(summary["variant"] == variant) & (summary["hidden"] == hidden)
                                   & (summary["batch"] == batch)].iloc[0]
                assert long_row["speedup_vs_cpu_serial"] == pytest.approx(serial_train / train)
    md = (out / "paper_table.md").read_text().splitlines()
    assert md[0].startswith("## E2") and "laid out as in the paper" in md[0]
    header = [c.strip() for c in md[2].strip("|").split("|")]
    assert header == expected_columns
    first = [c.strip() for c in md[4].strip("|").split("|")]  # batch 32, hidden 32
    assert first[:2] == ["32", "32"]
    assert first[header.index("gpu-naive accuracy")] == "91.70 %"
    assert first[header.index("gpu-naive forward_s")] == "1.80"
    assert first[header.index("gpu-tiled speedup_vs_serial")] == "50.0x"


def test_e2_without_serial_baseline_has_nan_speedups(tmp_path):
    out = tmp_path / "report"
    make_report("e2", out, runs=_e2_runs(tmp_path, ["cpu-numpy", "gpu-naive"]))
    paper = pd.read_csv(out / "paper_table.csv")
    assert paper["cpu-numpy speedup_vs_serial"].isna().all()
    assert paper["gpu-naive speedup_vs_serial"].isna().all()
    summary = pd.read_csv(out / "summary.csv")
    assert summary["speedup_vs_cpu_serial"].isna().all()
    assert summary["speedup_vs_cpu_numpy"].notna().all()
    _assert_png(out / "heatmaps.png")
    _assert_png(out / "forward_backward.png")


def test_e2_two_runs_of_one_cell_are_refused(tmp_path):
    runs = _e2_runs(tmp_path, ["cpu-numpy"])
    other_seed = RunSpec("mnist", "e2", "mlp", "cpu-numpy", (32,), 32, 0.01, 5, 1)
    runs.append(_write_run(tmp_path / "results", other_seed, 1.0, 0.4, 0.5, 0.9))
    with pytest.raises(GpunnError, match="two runs of cpu-numpy at batch 32, hidden 32"):
        make_report("e2", tmp_path / "report", runs=runs)


E3_VARIANTS = ("cpu-numpy", "cpu-serial", *GPU_VARIANTS, "gpu-graph")


def _write_timings(folder, where=None):
    """One CSV per variant, as `gpunn time-batches` writes them; `where(variant)`: the provenance columns of
    its rows (None: a CSV from before timings recorded them)."""
    paths = []
    for k, variant in enumerate(E3_VARIANTS):
        rows = []
        for batch in (1, 8, 32, 128, 512):
            # latency: 3x the throughput step, and shrinking slower across variants, so a speedup read from it
            # differs from the throughput's
            step = 10.0 / (k + 1) ** 2 + 0.01 * batch
            events = uses_gpu(variant) and not (where and where(variant).get("simulator"))
            row = _e3_row(variant, batch, step, "cuda events" if events else "host")
            row["latency_ms"] = 30.0 / (k + 1) + 0.01 * batch
            rows.append({**row, "hidden": 256, "features": 784, "steps": 100, "timed_epochs": 3, "repeats": 20,
                         **(_csv_provenance(where(variant)) if where else {})})
        paths.append(folder / f"{variant}.csv")
        io.write_csv(paths[-1], pd.DataFrame(rows, columns=list(rows[0]) if where else BATCH_TIMING_COLUMNS))
    return paths


BLOCK_OPS = ("bias_add", "relu_forward", "colsum_tree", "sgd_step")
BLOCK_SHAPES = ((64, 256), (512, 784))
BLOCKS = (32, 64, 128, 256, 512, 1024)


def _block_ms(op, rows, cols, block):
    """Independent truth of the sweep: each op has its own best block; colsum_tree fails at 1024 (NaN);
    sgd_step ties between 128 and 256 on the small shape."""
    best = {"bias_add": 256, "relu_forward": 128, "colsum_tree": 64, "sgd_step": 512}[op]
    if op == "colsum_tree" and block == 1024:
        return np.nan
    if op == "sgd_step" and rows == 64 and block in (128, 256):
        return 0.001
    return 1e-6 * rows * cols * (1 + abs(np.log2(block / best)))


def _write_blocks(path, device="NVIDIA H200"):
    rows = [{"op": op, "block": block, "rows": r, "cols": c, "n_elements": r * c, "ms": _block_ms(op, r, c, block),
             "gb_per_s": 8e-6 * r * c / _block_ms(op, r, c, block), "repeats": 50, "device": device}
            for r, c in BLOCK_SHAPES for op in BLOCK_OPS for block in BLOCKS]
    io.write_csv(path, pd.DataFrame(rows))
    return path


def test_e3_report_batch_timing_and_block_table(tmp_path):
    timings = _write_timings(tmp_path / "timing")
    blocks = _write_blocks(tmp_path / "timing" / "blocks.csv")
    out = tmp_path / "report"
    make_report("e3", out, timings=timings, blocks=[blocks])
    _assert_written(out, "e3")
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 5 * len(E3_VARIANTS)
    assert summary["variant"].unique().tolist() == ["cpu-serial", "cpu-numpy", *GPU_VARIANTS, "gpu-graph"]

    table = pd.read_csv(out / "blocks.csv")
    assert list(table.columns) == ["op", "rows", "cols", *[f"block_{b}_ms" for b in BLOCKS], "best_block",
                                   "best_ms", "best_gb_per_s"]
    assert list(zip(table["op"], table["rows"], table["cols"])) == [
        (op, r, c) for op in BLOCK_OPS for r, c in BLOCK_SHAPES]  # the sweep's op order, then by shape
    for _, row in table.iterrows():
        times = {b: _block_ms(row["op"], row["rows"], row["cols"], b) for b in BLOCKS}
        assert [row[f"block_{b}_ms"] for b in BLOCKS] == pytest.approx(list(times.values()), nan_ok=True)
        finite = {b: t for b, t in times.items() if np.isfinite(t)}
        best = min(finite, key=lambda b: (finite[b], b))  # ties: the smaller block
        assert row["best_block"] == best
        assert row["best_ms"] == pytest.approx(finite[best])
        assert row["best_gb_per_s"] == pytest.approx(8e-6 * row["rows"] * row["cols"] / finite[best])
    assert table.loc[(table["op"] == "sgd_step") & (table["rows"] == 64), "best_block"].item() == 128
    md = (out / "blocks.md").read_text()
    assert "on NVIDIA H200" in md.splitlines()[0]
    colsum = next(line for line in md.splitlines() if line.startswith("| colsum_tree ") and " 64 " in line)
    assert colsum.split("|")[-5].strip() == "-"  # block 1024 did not run


def test_e3_cli_passes_blocks(tmp_path, capsys):
    timings = _write_timings(tmp_path / "timing")
    blocks = _write_blocks(tmp_path / "timing" / "blocks.csv")
    out = tmp_path / "report"
    assert cli_main(["report", "e3", "--out", str(out), "--timings", *map(str, timings),
                     "--blocks", str(blocks)]) == 0
    _assert_written(out, "e3")
    assert cli_main(["report", "e3", "--out", str(out), "--timings", *map(str, timings),
                     "--blocks", str(tmp_path / "nowhere" / "blocks.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nowhere/blocks.csv" in err and "not found" in err


def test_e3_block_sweep_bad_inputs(tmp_path):
    timings = _write_timings(tmp_path / "timing")
    blocks = tmp_path / "blocks.csv"
    _write_blocks(blocks)
    pd.read_csv(blocks).drop(columns="ms").to_csv(blocks, index=False)
    with pytest.raises(GpunnError, match=r"blocks.csv: block-size sweep CSV lacks column\(s\) ms") as info:
        make_report("e3", tmp_path / "r1", timings=timings, blocks=[blocks])
    assert "\n" not in str(info.value)
    mixed = pd.concat([pd.read_csv(_write_blocks(tmp_path / "a.csv")),
                       pd.read_csv(_write_blocks(tmp_path / "b.csv", device="NVIDIA H100")).assign(rows=1)])
    mixed.to_csv(blocks, index=False)
    with pytest.raises(GpunnError, match="mixes devices NVIDIA H100, NVIDIA H200"):
        make_report("e3", tmp_path / "r2", timings=timings, blocks=[blocks])
    _write_blocks(blocks)
    with pytest.raises(GpunnError, match="nope.csv: E3 timing CSV not found"):
        make_report("e3", tmp_path / "r3", timings=[*timings, tmp_path / "nope.csv"], blocks=[blocks])


def test_missing_run_and_eval_files_name_the_file(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"])
    (runs[1] / "metrics.json").unlink()
    with pytest.raises(GpunnError, match="gpu-naive/w256_b64_lr0.01_e4_s0/metrics.json: missing") as info:
        make_report("e1", tmp_path / "r1", runs=runs, evals=evals)
    assert "\n" not in str(info.value)
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"])
    (runs[0] / "metrics.csv").unlink()
    with pytest.raises(GpunnError, match="cpu-numpy/w256_b64_lr0.01_e4_s0/metrics.csv: per-epoch metrics CSV not"):
        make_report("e1", tmp_path / "r2", runs=runs, evals=evals)
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"])
    (evals[0] / "samples.npz").unlink()
    with pytest.raises(GpunnError, match="samples.npz: missing"):
        make_report("e1", tmp_path / "r3", runs=runs, evals=evals)
    summary = json.loads((runs[0] / "metrics.json").read_text())
    del summary["forward_time_s"]
    io.write_json(runs[0] / "metrics.json", summary)
    with pytest.raises(GpunnError, match="metrics.json: lacks key 'forward_time_s'"):
        make_report("e2", tmp_path / "r4", runs=runs)


def test_new_figures_draw_every_variant(tmp_path, monkeypatch):
    rows = [dict(variant=v, time_per_epoch_s=t, speedup_vs_cpu_serial=30.0 / t)
            for v, t in (("gpu-graph", 0.01), ("cpu-serial", 30.0), ("gpu-naive", 0.3), ("my-variant", 1.0))]
    pd.DataFrame(rows).to_csv(tmp_path / "e1.csv", index=False)
    _assert_png(epoch_time_bars(tmp_path / "e1.csv", tmp_path / "e1.png"))
    pd.DataFrame(rows).assign(time_per_epoch_s=0.0).to_csv(tmp_path / "zero.csv", index=False)
    with pytest.raises(GpunnError, match="no positive time_per_epoch_s"):
        epoch_time_bars(tmp_path / "zero.csv", tmp_path / "zero.png")

    e2 = [dict(variant=v, hidden=h, batch=b, train_time_s=f * h, forward_time_s=0.4 * f * h,
               backward_time_s=0.5 * f * h, test_accuracy=0.9) for v, f in E2_FACTOR.items()
          for h in (32, 64, 128, 256) for b in (32, 64, 128)]
    pd.DataFrame(e2).to_csv(tmp_path / "e2.csv", index=False)
    saved = _capture_figures(monkeypatch)
    _assert_png(e2_phase_times(tmp_path / "e2.csv", tmp_path / "e2.png"))
    # rows training, forward, backward; one column per batch size; one line per variant, on one log scale
    assert [title.split(",")[0] for title in saved[-1]["panels"]] == [
        phase for phase in ("training", "forward", "backward") for _ in (32, 64, 128)]
    assert saved[-1]["panels"][0].startswith("training, batch 32") and set(saved[-1]["yscale"]) == {"log"}
    serial_train = [r["train_time_s"] for r in e2 if r["variant"] == "cpu-serial" and r["batch"] == 32]
    assert list(saved[-1]["ydata"][0][0]) == pytest.approx(serial_train)

    single_shape = tmp_path / "one_shape.csv"
    pd.read_csv(_write_blocks(tmp_path / "b.csv")).query("rows == 64").to_csv(single_shape, index=False)
    _assert_png(block_sweep([single_shape], tmp_path / "blocks.png"))
    with pytest.raises(GpunnError, match="missing.csv: block-size sweep CSV not found"):
        block_sweep([tmp_path / "missing.csv"], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


# ------------------------------------------------------------------------ provenance, titles from the data, overlaps
def _title_line(md_path):
    first = md_path.read_text().splitlines()[0]
    assert first.startswith("## ")
    return first[3:]


def _md_row(md_path, first_cell):
    return next(line for line in md_path.read_text().splitlines() if line.startswith(f"| {first_cell} "))


def test_e1_report_labels_simulated_timings(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-serial", "cpu-numpy", "gpu-naive", "gpu-fused"],
                              where=_cpu_and_simulated)
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    _assert_written(out, "e1")
    table = pd.read_csv(out / "summary.csv")
    assert list(table["device"]) == ["cpu", "cpu", "cuda-simulator", "cuda-simulator"]
    assert list(table["simulator"]) == [False, False, True, True]
    title = _title_line(out / "summary.md")
    assert title == written["summary.md"]
    assert "timed on cpu (AMD EPYC 9454)" in title
    assert title.endswith(" — timings of gpu-naive and gpu-fused under the CUDA simulator: not meaningful")
    assert "cuda-simulator" in _md_row(out / "summary.md", "gpu-fused")
    assert "cuda-simulator" not in _md_row(out / "summary.md", "cpu-numpy")
    assert "gpu-naive and gpu-fused ran under numba's CUDA simulator" in (out / "summary.md").read_text()
    assert "timings of gpu-naive and gpu-fused under the CUDA simulator: not meaningful" in written["epoch_time.png"]
    assert "simulator" not in written["loss_curves.png"]  # losses do not depend on the device


def test_e1_report_names_real_devices_without_warning(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-fused"], where=_cpu_and_h100)
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    assert list(pd.read_csv(out / "summary.csv")["device"]) == ["cpu", "NVIDIA H100 80GB HBM3"]
    assert written["summary.md"].endswith("timed on cpu (AMD EPYC 9454) and NVIDIA H100 80GB HBM3")
    assert written["epoch_time.png"].endswith("\ntimed on cpu (AMD EPYC 9454) and NVIDIA H100 80GB HBM3")
    md = (out / "summary.md").read_text().splitlines()
    assert md[-1].startswith("Also in summary.csv: ") and "simulator" in md[-1]  # the flag: False on every row
    assert "simulator" not in "\n".join(md[:-1])  # no simulator column, no warning


def test_e1_report_from_metrics_without_provenance(tmp_path):
    """Runs recorded before metrics.json had provenance: device unknown, not simulated, no device in titles."""
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"])
    assert "provenance" not in json.loads((runs[0] / "metrics.json").read_text())
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    table = pd.read_csv(out / "summary.csv")
    assert list(table["device"]) == ["unknown", "unknown"] and not table["simulator"].any()
    assert "timed on" not in written["summary.md"] and "simulator" not in written["epoch_time.png"]
    assert "CUDA simulator" not in (out / "summary.md").read_text()


def test_e1_titles_come_from_the_runs(tmp_path):
    """The smoke run's E1 (digits8, 8x8 images, 64 training samples) is not captioned as MNIST 784-hidden-10."""
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "cpu-serial"], where=lambda v: ON_CPU,
                              spec_fields={"dataset": "digits8", "widths": (16,), "batch": 16, "lr": 0.3,
                                           "epochs": 1, "subset": 64},
                              n_train=64, n_test=360, image_shape=(1, 8, 8))
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals)
    head = "E1: MLP 64-16-10 on digits8 (64 train / 360 test), batch 16, 1 epoch"
    assert _title_line(out / "summary.md") == f"{head}, per variant, timed on cpu (AMD EPYC 9454)"
    assert written["loss_curves.png"] == f"{head}, training per variant"
    assert written["epoch_time.png"] == f"{head}, time per epoch\ntimed on cpu (AMD EPYC 9454)"
    assert written["samples.png"] == "E1: sample test classifications, MLP 64-16-10 on digits8"


def test_mlp_inputs_from_the_parameter_count_when_metrics_lack_the_image_shape():
    from gpunn.report.titles import mlp_in_features

    assert mlp_in_features({"image_shape": [3, 32, 32]}, 256) == 3072
    params = (784 + 1) * 256 + (256 + 1) * 10
    assert mlp_in_features({"num_classes": 10, "num_parameters": params}, 256) == 784
    assert mlp_in_features({"num_classes": 10, "num_parameters": params + 1}, 256) is None  # not an MLP's count
    assert mlp_in_features({"num_parameters": params}, 256) is None  # classes unknown: cannot solve


def test_e2_titles_and_simulated_labels_come_from_the_runs(tmp_path):
    runs = _e2_runs(tmp_path, ["cpu-numpy", "gpu-naive"], where=_cpu_and_simulated, n_train=1500, n_test=500,
                    image_shape=(1, 4, 4))
    out = tmp_path / "report"
    written = make_report("e2", out, runs=runs)
    head = ("E2: MLP 16-hidden-10, hidden {32, 64} x batch {32, 128} on mnist (e2 split, 1 500 train / 500 test), "
            "5 epochs")
    warning = "timings of gpu-naive under the CUDA simulator: not meaningful"
    assert _title_line(out / "summary.md") == f"{head}, timed on cpu (AMD EPYC 9454) — {warning}"
    assert _title_line(out / "paper_table.md").startswith(f"{head}, laid out as in the paper, timed on cpu")
    assert _title_line(out / "paper_table.md").endswith(warning)
    assert "gpu-naive ran under numba's CUDA simulator" in (out / "paper_table.md").read_text()
    for figure in ("heatmaps.png", "forward_backward.png"):  # figure titles are wrapped into lines
        assert written[figure].replace("\n", " ").startswith(head) and written[figure].endswith(f"\n{warning}")
        assert max(len(line) for line in written[figure].splitlines()) < 100
    summary = pd.read_csv(out / "summary.csv")
    assert set(zip(summary["variant"], summary["device"], summary["simulator"])) == {
        ("cpu-numpy", "cpu", False), ("gpu-naive", "cuda-simulator", True)}
    assert "37 800" not in (out / "summary.md").read_text()


def test_e3_labels_simulated_timings_and_blocks(tmp_path):
    timings = _write_timings(tmp_path / "timing", where=lambda v: SIMULATED if v == "gpu-fused" else ON_CPU)
    blocks = _write_blocks(tmp_path / "timing" / "blocks.csv", device="numba CUDA simulator (CPU; timings meaningless)")
    out = tmp_path / "report"
    written = make_report("e3", out, timings=timings, blocks=[blocks])
    _assert_written(out, "e3")
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == ["variant", "device", "batch", "hidden", "features", "steps", "timed_epochs",
                                     "throughput_step_ms", "throughput_samples_per_s", "forward_ms", "backward_ms",
                                     "clock", "latency_ms", "repeats", "simulator"]
    assert set(summary.loc[summary["simulator"], "variant"]) == {"gpu-fused"}
    assert set(summary.loc[~summary["simulator"], "device"]) == {"cpu"}
    assert set(summary.loc[summary["clock"] == "cuda events", "variant"]) == {"gpu-naive", "gpu-tiled", "gpu-graph"}
    note = (out / "summary.md").read_text()  # the table says what each measure is
    for column in ("throughput_step_ms", "throughput_samples_per_s", "forward_ms", "backward_ms", "clock",
                   "latency_ms"):
        assert f"{column}: " in note
    assert "wall time of one synchronous train_step" in note and "CUDA events around each phase" in note
    assert _title_line(out / "summary.md") == (
        "E3: MLP training step per batch size and variant (hidden 256, inputs 784, throughput over 100 steps, "
        "latency median of 20 calls), timed on cpu"
        " — timings of gpu-fused under the CUDA simulator: not meaningful")
    assert written["batch_timing.png"].endswith("\ntimed on cpu\ntimings of gpu-fused under the CUDA simulator: "
                                                "not meaningful")
    # the block sweep CSV predates its simulator column: its device name says it all the same
    assert _title_line(out / "blocks.md") == ("E3: kernel time (ms) against threads per block — timings under the "
                                              "CUDA simulator: not meaningful")
    assert "Timed under numba's CUDA simulator" in (out / "blocks.md").read_text()
    assert written["block_sweep.png"].endswith("\ntimings under the CUDA simulator: not meaningful")


def test_e3_block_sweep_with_a_simulator_column(tmp_path):
    timings = _write_timings(tmp_path / "timing")  # older CSVs: device unknown
    blocks = tmp_path / "blocks.csv"
    pd.read_csv(_write_blocks(blocks, device="NVIDIA H200")).assign(simulator=False).to_csv(blocks, index=False)
    out = tmp_path / "report"
    written = make_report("e3", out, timings=timings, blocks=[blocks])
    assert set(pd.read_csv(out / "summary.csv")["device"]) == {"unknown"}
    assert "timed on" not in written["summary.md"]
    assert written["blocks.md"] == "E3: kernel time (ms) against threads per block, timed on NVIDIA H200"


def _write_eval_json(eval_dir, spec: RunSpec):
    io.write_json(eval_dir / "eval.json", {"run": spec.path, "n_test": 500})


def _write_confusion(svm_dir, matrix, names, columns=None):
    """The svm step's confusion.csv: a 'true' column of class names, then the counts per predicted class."""
    frame = pd.DataFrame(matrix, columns=columns or names)
    frame.insert(0, "true", names)
    io.write_csv(svm_dir / "confusion.csv", frame)


def test_e4_e5_e6_titles_come_from_the_outputs(tmp_path, monkeypatch):
    results = tmp_path / "results"
    runs, evals = [], []
    for dataset, n_train, n_test in (("digits28", 1400, 360), ("synthetic_mnist_small", 1400, 500)):
        spec = RunSpec(dataset, "standard", "cnn", "cpu-numpy", (8, 16), 32, 0.05, 2, 0, 1400)
        runs.append(_write_run(results, spec, 3.0, 1.0, 1.5, 0.9, provenance=ON_CPU, n_train=n_train, n_test=n_test))
        evals.append(_write_eval(results, spec))
        _write_eval_json(evals[-1], spec)
    written = make_report("e4", tmp_path / "e4", runs=runs, evals=evals)
    assert sorted(p.name for p in (tmp_path / "e4").iterdir()) == _declared(
        "e4", {"experiments": {"e4": {"datasets": ["digits28", "synthetic_mnist_small"]}}})
    assert _title_line(tmp_path / "e4" / "summary.md") == (
        "E4: CNN (conv channels 8, 16) on digits28 (1 400 train / 360 test) and synthetic_mnist_small "
        "(1 400 train / 500 test), batch 32, 2 epochs, per dataset and variant, timed on cpu (AMD EPYC 9454)")
    assert written["samples_digits28.png"] == "E4: sample test classifications, CNN (conv channels 8, 16) on digits28"
    assert list(pd.read_csv(tmp_path / "e4" / "summary.csv")["device"]) == ["cpu", "cpu"]
    assert NAIVE_DESIGN not in (tmp_path / "e4" / "summary.md").read_text()  # no gpu-naive run: no note on it

    spec = RunSpec("synthetic_cifar10_small", "standard", "autoencoder", "cpu-numpy", (16, 8), 16, 0.2, 2, 0, 500)
    run = _write_run(results, spec, 4.0, 1.0, 2.0, float("nan"), provenance=SIMULATED, n_train=500, n_test=1000,
                     image_shape=(3, 32, 32))
    images = np.random.default_rng(0).integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    # samples.npz as evaluated before it held each class's first test image: the figure is left untitled by class
    io.write_npz(results / "eval" / spec.path / "samples.npz", images=images, reconstructions=images / 255.0)
    _write_eval_json(results / "eval" / spec.path, spec)
    written = make_report("e5", tmp_path / "e5", runs=[run], evals=[results / "eval" / spec.path])
    _assert_written(tmp_path / "e5", "e5")
    head = ("E5: convolutional autoencoder (conv channels 16, 8) on synthetic_cifar10_small (500 train / 1 000 test), "
            "batch 16, 2 epochs")
    warning = "timings of cpu-numpy under the CUDA simulator: not meaningful"
    assert _title_line(tmp_path / "e5" / "summary.md") == f"{head}, per variant — {warning}"
    assert _title_line(tmp_path / "e5" / "paper_table.md") == (
        f"{head}, laid out as in the paper's sections 2.4 and 3.1 — {warning}")
    assert "cuda-simulator" in _md_row(tmp_path / "e5" / "summary.md", "cpu-numpy")
    assert written["training_time.png"].endswith(f"\n{warning}") and written["speedup.png"].endswith(f"\n{warning}")
    assert "simulator" not in written["mse_curves.png"]
    assert written["reconstructions.png"].replace("\n", " ") == (
        "E5: the first test images (top) and their reconstructions by cpu-numpy (bottom), convolutional autoencoder "
        "(conv channels 16, 8) on synthetic_cifar10_small")

    svm = results / "svm" / spec.path
    io.write_json(svm / "metrics.json", {
        "method": "exact", "C": 10.0, "gamma": "scale", "n_train": 1000, "n_test": 500, "n_features": 2048,
        "train_accuracy": 0.99, "test_accuracy": 0.5, "fit_time_s": 1.5, "per_class_accuracy": {"cat": 0.5}})
    _write_confusion(svm, [[125, 75, 50], [50, 100, 0], [25, 50, 25]], ["cat", "dog", "bird"])
    saved = _capture_figures(monkeypatch)
    written = make_report("e6", tmp_path / "e6", svm=[svm])
    _assert_written(tmp_path / "e6", "e6")
    head = "E6: SVM (RBF, exact) on 2 048 autoencoder features, 1 000 train / 500 test"
    assert _title_line(tmp_path / "e6" / "summary.md") == head
    assert written["confusion.png"].replace("\n", " ") == (
        f"{head}: confusion matrix on the test set, test accuracy 50.00 %")
    assert saved[-1]["xticks"][0] == ["cat", "dog", "bird"]  # the counts of confusion.csv, by class
    assert saved[-1]["texts"][0] == ["125", "75", "50", "50", "100", "0", "25", "50", "25"]
    _write_confusion(svm, [[1, 0], [0, 1]], ["cat", "dog"], columns=["dog", "cat"])
    with pytest.raises(GpunnError, match="confusion.csv: its columns after 'true' must be the classes cat, dog"):
        make_report("e6", tmp_path / "e6b", svm=[svm])
    e6 = pd.read_csv(tmp_path / "e6" / "summary.csv")
    assert list(e6.columns[:2]) == ["method", "device"] and e6["device"].item() == "unknown"


def test_coinciding_groups():
    from gpunn.report.figures import coincide_note, coinciding_groups

    base = np.array([1.0, 0.5, np.nan, 0.25])
    series = {
        "cpu-numpy": base, "cpu-serial": base * (1 + 1e-6),  # different: 1e-6 relative is visible in print
        "gpu-tiled": base.copy(), "gpu-fused": base * (1 + 1e-12),  # within 1e-9: the same line
        "nan-elsewhere": np.array([1.0, 0.5, 0.125, np.nan]), "other": base * (1 + 1e-6),
        "all-nan": [np.nan] * 4, "all-nan-too": [np.nan] * 4,  # draw nothing: never grouped
        "shorter": base[:3],
    }
    groups = coinciding_groups(series)
    assert groups == [["cpu-numpy", "gpu-tiled", "gpu-fused"], ["cpu-serial", "other"]]
    assert coincide_note(groups) == "cpu-numpy, gpu-tiled and gpu-fused coincide; cpu-serial and other coincide"
    assert coinciding_groups({"a": [0.0, 1.0], "b": [0.0, 1.0], "c": [0.0, 1.0 + 1e-6]}) == [["a", "b"]]
    assert coinciding_groups({"a": [np.inf, 1.0], "b": [np.inf, 1.0]}) == [["a", "b"]]
    assert coinciding_groups({"a": [1.0, 2.0], "b": [2.0, 1.0]}) == []
    assert coincide_note([]) == ""


def _capture_figures(monkeypatch):
    """Panel titles and lines of every figure saved while the returned list is watched."""
    from gpunn.report import figures

    saved = []
    original = figures.save

    def capture(fig, out_png):
        saved.append({"panels": [ax.get_title() for ax in fig.axes],
                      "lines": [[(line.get_label(), line.get_marker(), line.get_linestyle()) for line in ax.lines]
                                for ax in fig.axes],
                      "ydata": [[np.asarray(line.get_ydata(), dtype=float) for line in ax.lines] for ax in fig.axes],
                      "yscale": [ax.get_yscale() for ax in fig.axes],
                      "legend": [text.get_text() for legend in fig.legends for text in legend.get_texts()],
                      "bars": [[patch.get_height() for patch in ax.patches] for ax in fig.axes],
                      "hatches": [[patch.get_hatch() for patch in ax.patches] for ax in fig.axes],
                      "xticks": [[tick.get_text() for tick in ax.get_xticklabels()] for ax in fig.axes],
                      "texts": [[text.get_text() for text in ax.texts] for ax in fig.axes],
                      "suptitle": fig.get_suptitle()})
        return original(fig, out_png)

    monkeypatch.setattr(figures, "save", capture)
    return saved


def test_coinciding_curves_are_named_and_styled_apart(tmp_path, monkeypatch):
    saved = _capture_figures(monkeypatch)
    same = {v: _epoch_csv(tmp_path / f"{v}.csv") for v in ("cpu-numpy", "gpu-tiled", "gpu-fused")}
    runs = {"cpu-serial": _epoch_csv(tmp_path / "serial.csv", offset=0.01), **same}
    _assert_png(loss_curves(runs, tmp_path / "loss.png", "E1"))
    panels = saved[-1]["panels"]
    assert panels[0] == "train loss per epoch\n(cpu-numpy, gpu-tiled and gpu-fused coincide)"
    assert panels[1].endswith("(cpu-numpy, gpu-tiled and gpu-fused coincide)")
    assert panels[2] == "test accuracy per epoch\n(all 4 coincide)"  # the offset moved the losses only
    styles = [(marker, style) for _, marker, style in saved[-1]["lines"][0]]
    assert len(set(styles)) == len(runs)  # every run its own marker and line style

    rows = [{**_e3_row(v, b, float(b), "cuda events" if v == "gpu-naive" else "host"),
             "throughput_samples_per_s": 1000.0 * (2 if v == "gpu-naive" else 1), "simulator": v == "gpu-fused"}
            for v in ("cpu-numpy", "gpu-naive", "gpu-fused") for b in (1, 8, 64)]
    pd.DataFrame(rows).to_csv(tmp_path / "e3.csv", index=False)
    _assert_png(batch_timing(tmp_path / "e3.csv", tmp_path / "e3.png"))
    panels = saved[-1]["panels"]
    assert panels[0] == "throughput: steps back to back\n(cpu-numpy and gpu-fused coincide)"
    assert panels[1] == "throughput: time per step\n(all 3 coincide)"
    assert panels[3] == ("split: forward pass and loss\n(CUDA events; host clock: cpu-numpy, gpu-fused)\n"
                         "(all 3 coincide)")
    assert saved[-1]["legend"] == ["cpu-numpy", "gpu-naive", "gpu-fused (simulated)"]
    assert len({(marker, style) for _, marker, style in saved[-1]["lines"][0]}) == 3


# ------------------------------------------------------------------------ E4: paper 001's tables, figures, block study
E4_RUNS = {  # (dataset, variant): (train time s, test accuracy, testing time s; None: not recorded)
    ("mnist", "cpu-numpy"): (180.0, 0.9800, 2.9), ("mnist", "gpu-naive"): (24.0, 0.9805, 0.09),
    ("mnist", "gpu-optimized"): (6.0, 0.9808, 0.11), ("mnist", "gpu-im2col"): (3.0, 0.9770, None),
    ("fashion_mnist", "cpu-numpy"): (200.0, 0.8750, 3.0), ("fashion_mnist", "gpu-naive"): (25.0, 0.8718, 0.10),
    ("fashion_mnist", "gpu-optimized"): (5.0, 0.8753, 0.12), ("fashion_mnist", "gpu-im2col"): (2.5, 0.8751, 0.05),
}
E4_BLOCK_RUNS = {  # (variant, threads per block): (train time s, final train loss, test accuracy)
    ("gpu-naive", 1024): (60.0, 2.303, 0.0980),  # the paper's failure: loss stuck at ln 10
    ("gpu-naive", 128): (22.0, 0.05, 0.8755), ("gpu-optimized", 1024): (6.1, 0.04, 0.8762),
    ("gpu-optimized", 128): (6.2, 0.04, 0.8758),
}
# gpu-naive's repeats on each dataset (runs 1 and 2): a band of +-0.09 points
E4_REPEATS = {("mnist", "gpu-naive"): [0.9803, 0.9806], ("fashion_mnist", "gpu-naive"): [0.8716, 0.8719]}
E4_BLOCK_DATASET = "fashion_mnist"  # not the first dataset: the accuracy reference is its own cpu-numpy run
E4_EPOCHS = 5


def _e4_spec(dataset, variant, block=0):
    return RunSpec(dataset, "standard", "cnn", variant, (16, 32), 64, 0.01, E4_EPOCHS, 0, block=block)


def _e4_config(datasets=("mnist", "fashion_mnist"), block_variants=("gpu-naive", "gpu-optimized"),
               block_sizes=(128, 1024), block_dataset=E4_BLOCK_DATASET):
    """The e4 section report_outputs reads, as the validated config has it."""
    return {"experiments": {"e4": {"datasets": list(datasets), "channels": [16, 32], "batch": 64, "lr": 0.01,
                                   "epochs": E4_EPOCHS, "seed": 0, "subset": 0, "block_variants": list(block_variants),
                                   "block_sizes": list(block_sizes), "block_dataset": block_dataset}}}


def _e4_results(tmp_path, main=E4_RUNS, blocks=E4_BLOCK_RUNS, where=_cpu_and_h100, block_dataset=E4_BLOCK_DATASET,
                repeats=E4_REPEATS):
    """E4's run folders (main runs in the given order with their `repeats`, then the block study) and each
    dataset's eval folder."""
    results = tmp_path / "results"
    runs, evals = [], {}
    for (dataset, variant), (train_s, accuracy, test_s) in main.items():
        spec = _e4_spec(dataset, variant)
        for k, run_accuracy in enumerate([accuracy, *repeats.get((dataset, variant), ())]):
            runs.append(_write_run(results, dataclasses.replace(spec, repeat=k), train_s, 0.4 * train_s, 0.5 * train_s,
                                   run_accuracy, provenance=where(variant), n_train=60000, n_test=10000,
                                   test_time_s=test_s))
        if dataset not in evals:
            evals[dataset] = _write_eval(results, spec)
            _write_eval_json(evals[dataset], spec)
    for (variant, block), (train_s, loss, accuracy) in blocks.items():
        runs.append(_write_run(results, _e4_spec(block_dataset, variant, block), train_s, 0.4 * train_s, 0.5 * train_s,
                               accuracy, provenance=where(variant), n_train=60000, n_test=10000, test_time_s=0.1,
                               final_loss=loss))
    return runs, list(evals.values())


def _md_cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _md_rows(md_path):
    """Header and body rows of the Markdown table under the title, as lists of cells."""
    lines = [line for line in md_path.read_text().splitlines() if line.startswith("|")]
    return _md_cells(lines[0]), [_md_cells(line) for line in lines[2:]]


def test_e4_report_paper_tables_speedups_and_block_study(tmp_path):
    shuffled = dict(sorted(E4_RUNS.items(), key=lambda item: (item[0][0] != "mnist", item[0][1][::-1])))
    runs, evals = _e4_results(tmp_path, main=shuffled)
    out = tmp_path / "report"
    written = make_report("e4", out, runs=runs, evals=evals)
    _assert_written(out, "e4", _e4_config())
    assert {"paper_table.md", "cumulative_time.png", "blocks.md", "block_time.png", "block_loss.png"} <= set(written)

    summary = pd.read_csv(out / "summary.csv")
    order = [(d, v) for d in ("mnist", "fashion_mnist") for v in ("cpu-numpy", "gpu-naive", "gpu-optimized",
                                                                  "gpu-im2col")]
    assert list(zip(summary["dataset"], summary["variant"])) == order  # datasets as run, variants in report order
    assert (summary["device"] == ["cpu" if v == "cpu-numpy" else "NVIDIA H100 80GB HBM3" for _, v in order]).all()
    for _, row in summary.iterrows():
        train_s, accuracy, test_s = E4_RUNS[(row["dataset"], row["variant"])]
        numpy_s, numpy_acc, _ = E4_RUNS[(row["dataset"], "cpu-numpy")]
        naive_s = E4_RUNS[(row["dataset"], "gpu-naive")][0]
        assert row["train_time_s"] == pytest.approx(train_s)
        assert row["time_per_epoch_s"] == pytest.approx(train_s / E4_EPOCHS)
        assert row["test_time_s"] == pytest.approx(np.nan if test_s is None else test_s, nan_ok=True)
        assert row["speedup_vs_cpu_numpy"] == pytest.approx(numpy_s / train_s)
        assert row["speedup_vs_gpu_naive"] == pytest.approx(naive_s / train_s)
        assert row["accuracy_diff_vs_cpu_numpy_pp"] == pytest.approx(100 * (accuracy - numpy_acc))
    # within the dataset's band (gpu-naive's repeats: +-0.09 points) of cpu-numpy: mnist's gpu-im2col (-0.30) and
    # fashion's gpu-naive (-0.32) not
    assert list(summary["accuracy_matches_cpu_numpy"]) == [True, True, True, False, True, False, True, True]
    assert summary["accuracy_band_pp"].tolist() == pytest.approx([0.093] * 8, abs=1e-3)
    header, rows = _md_rows(out / "summary.md")
    im2col = dict(zip(header, rows[3]))
    assert (im2col["variant"], im2col["test_time_s"], im2col["speedup_vs_cpu_numpy"]) == ("gpu-im2col", "-", "60.0x")
    assert im2col["speedup_vs_gpu_naive"] == "8.00x" and im2col["accuracy_diff_vs_cpu_numpy_pp"] == "-0.30"
    assert dict(zip(header, rows[0]))["speedup_vs_gpu_naive"] == "0.133x"
    assert "test_time_s: the whole test set" in (out / "summary.md").read_text()
    # why the speedup over gpu-naive is not the paper's: the design, then our epochs against the A40's (no profiles)
    assert (f"{NAIVE_DESIGN} On mnist our naive/optimized ratio is 4.00x (4.8 s against 1.2 s an epoch on NVIDIA "
            "H100 80GB HBM3), the paper's 4.53x (NVIDIA A40: 4.69 s against 1.04 s): our optimized epoch is 1.2x "
            "longer than the paper's, our naive one 1x longer.") in (out / "summary.md").read_text()

    paper = pd.read_csv(out / "paper_table.csv")  # tidy: one row per dataset and variant
    assert list(paper.columns) == ["dataset", "variant", "device", "train_time_s", "test_time_s", "test_accuracy",
                                   "simulator"]
    assert list(zip(paper["dataset"], paper["variant"])) == order
    assert paper["train_time_s"].tolist() == pytest.approx([E4_RUNS[k][0] for k in order])
    header, rows = _md_rows(out / "paper_table.md")  # headed as the paper's tables
    assert header == ["Dataset", "Variant", "Device", "Training Time [s]", "Testing Time [s]", "Test Accuracy"]
    assert "Also in paper_table.csv: simulator." in (out / "paper_table.md").read_text()  # False on every row
    assert rows[1] == ["mnist", "gpu-naive", "NVIDIA H100 80GB HBM3", "24.0", "0.0900", "98.05 %"]
    assert rows[3][3:6] == ["3.00", "-", "97.70 %"]
    assert rows[7][:2] == ["fashion_mnist", "gpu-im2col"]

    blocks = pd.read_csv(out / "blocks.csv")
    assert list(blocks.columns) == ["dataset", "variant", "block", "device", "time_per_epoch_s", "train_time_s",
                                    "final_train_loss", "test_accuracy", "accuracy_diff_vs_cpu_numpy_pp",
                                    "accuracy_matches_cpu_numpy", "accuracy_band_pp", "diverged", "at_chance",
                                    "simulator"]
    keys = [("gpu-naive", 128), ("gpu-naive", 1024), ("gpu-optimized", 128), ("gpu-optimized", 1024)]
    assert list(zip(blocks["variant"], blocks["block"])) == keys  # block sizes by number, not as text
    # the paper's failed block 1024 (9.8 % on 10 classes) is at chance, below 1.5 / 10; no run diverged
    assert list(blocks["at_chance"]) == [False, True, False, False] and not blocks["diverged"].any()
    assert "at_chance: test accuracy below 1.5 / classes." in (out / "blocks.md").read_text()
    for _, row in blocks.iterrows():
        train_s, loss, accuracy = E4_BLOCK_RUNS[(row["variant"], row["block"])]
        assert row["dataset"] == "fashion_mnist"
        assert (row["train_time_s"], row["time_per_epoch_s"]) == pytest.approx((train_s, train_s / E4_EPOCHS))
        assert row["final_train_loss"] == pytest.approx(loss)
        assert row["accuracy_diff_vs_cpu_numpy_pp"] == pytest.approx(100 * (accuracy - 0.8750))
    assert list(blocks["accuracy_matches_cpu_numpy"]) == [True, False, True, False]
    assert _md_cells(_md_row(out / "blocks.md", "fashion_mnist"))[8] == "+0.05"

    head = "E4: CNN (conv channels 16, 32) on mnist (60 000 train / 10 000 test)"
    assert _title_line(out / "summary.md") == (
        f"{head} and fashion_mnist (60 000 train / 10 000 test), batch 64, 5 epochs, per dataset and variant, "
        "timed on cpu (AMD EPYC 9454) and NVIDIA H100 80GB HBM3")
    assert _title_line(out / "paper_table.md").endswith("laid out as in the paper's Tables 3-6, timed on cpu "
                                                        "(AMD EPYC 9454) and NVIDIA H100 80GB HBM3")
    assert _title_line(out / "blocks.md") == (
        "E4: CNN (conv channels 16, 32) on fashion_mnist (60 000 train / 10 000 test), batch 64, 5 epochs, "
        "block-size study, threads per block {128, 1024}, timed on NVIDIA H100 80GB HBM3")
    assert written["block_time.png"].endswith("\ntimed on NVIDIA H100 80GB HBM3")
    assert "timed on" not in written["block_loss.png"] and "timed on" not in written["loss_curves.png"]


def test_e4_figures_one_panel_per_dataset_and_per_block_variant(tmp_path, monkeypatch):
    saved = _capture_figures(monkeypatch)
    runs, evals = _e4_results(tmp_path)
    make_report("e4", tmp_path / "report", runs=runs, evals=evals)
    cumulative, loss, _, _, block_time, block_loss = saved  # in the order report_e4 draws them
    variants = ["cpu-numpy", "gpu-naive", "gpu-optimized", "gpu-im2col"]

    assert cumulative["panels"] == ["mnist: cumulative training time", "fashion_mnist: cumulative training time"]
    assert [[label for label, _, _ in lines] for lines in cumulative["lines"]] == [variants, variants]
    for k, dataset in enumerate(("mnist", "fashion_mnist")):
        for variant, ydata in zip(variants, cumulative["ydata"][k]):  # the running sum of the epoch times
            total = E4_RUNS[(dataset, variant)][0]
            assert ydata == pytest.approx(total * np.arange(1, E4_EPOCHS + 1) / E4_EPOCHS)
    assert cumulative["yscale"] == ["log", "log"]  # 0.5 s to 200 s
    assert cumulative["legend"] == variants

    # main runs only, a row of train loss and one of test accuracy; every variant's loss is the same here
    assert loss["panels"] == ["mnist: average train loss per epoch\n(all 4 coincide)",
                              "fashion_mnist: average train loss per epoch\n(all 4 coincide)",
                              "mnist: test accuracy per epoch", "fashion_mnist: test accuracy per epoch"]
    assert loss["legend"] == variants and loss["yscale"] == ["linear"] * 4
    assert loss["ydata"][2][0][-1] == pytest.approx(98.00)  # cpu-numpy's final accuracy on mnist, in %

    assert block_time["panels"] == ["gpu-naive: cumulative training time", "gpu-optimized: cumulative training time"]
    assert block_time["legend"] == ["128", "1024"]
    assert block_time["ydata"][0][1][-1] == pytest.approx(60.0)  # gpu-naive at 1024 threads
    assert block_time["yscale"] == ["log", "log"]  # 1.2 s to 60 s
    assert [len(lines) for lines in block_loss["lines"]] == [2, 2]
    assert block_loss["ydata"][0][1][-1] == pytest.approx(2.303)
    assert block_loss["panels"][1] == "gpu-optimized: average train loss per epoch\n(all 2 coincide)"


def test_e4_report_without_baselines_or_testing_times(tmp_path, monkeypatch):
    """GPU variants alone, under the simulator, from runs recorded before the testing time, and a block study on
    a dataset without a cpu-numpy run: '-' where a comparison or time is missing, the simulator named; a
    cumulative time within 10x is on a linear axis."""
    saved = _capture_figures(monkeypatch)
    main = {("digits8", "gpu-optimized"): (6.0, 0.93, None), ("digits8", "gpu-im2col"): (4.0, 0.94, None)}
    runs, evals = _e4_results(tmp_path, main=main, blocks={("gpu-naive", 64): (9.0, 0.1, 0.97)},
                              where=_cpu_and_simulated, block_dataset="mnist")
    out = tmp_path / "report"
    written = make_report("e4", out, runs=runs, evals=evals)
    _assert_written(out, "e4", _e4_config(datasets=["digits8"], block_variants=["gpu-naive"], block_sizes=[64],
                                          block_dataset="mnist"))
    blocks = pd.read_csv(out / "blocks.csv")
    assert blocks["accuracy_diff_vs_cpu_numpy_pp"].isna().all() and blocks["accuracy_matches_cpu_numpy"].isna().all()
    assert _md_cells(_md_row(out / "blocks.md", "mnist"))[8:10] == ["-", "-"]
    assert _title_line(out / "blocks.md").endswith(" — timings of gpu-naive under the CUDA simulator: not meaningful")
    summary = pd.read_csv(out / "summary.csv")
    for column in ("test_time_s", "speedup_vs_cpu_numpy", "speedup_vs_gpu_naive", "accuracy_diff_vs_cpu_numpy_pp",
                   "accuracy_matches_cpu_numpy"):
        assert summary[column].isna().all(), column
    header, rows = _md_rows(out / "summary.md")
    for row in rows:
        cells = dict(zip(header, row))
        assert cells["device"] == "cuda-simulator" and cells["test_time_s"] == "-"
        assert cells["speedup_vs_cpu_numpy"] == cells["speedup_vs_gpu_naive"] == "-"
    warning = "timings of gpu-optimized and gpu-im2col under the CUDA simulator: not meaningful"
    assert _title_line(out / "paper_table.md").endswith(f" — {warning}")
    assert "gpu-optimized and gpu-im2col ran under numba's CUDA simulator" in (out / "paper_table.md").read_text()
    assert written["cumulative_time.png"].endswith(f"\n{warning}")
    cumulative = saved[0]
    assert cumulative["legend"] == ["gpu-optimized (simulated)", "gpu-im2col (simulated)"]
    assert cumulative["yscale"] == ["linear"]  # 0.8 s to 6 s


def test_e4_report_refuses_two_runs_of_one_variant_and_dataset(tmp_path):
    runs, evals = _e4_results(tmp_path, main={("mnist", "gpu-naive"): (24.0, 0.98, 0.1)}, blocks={})
    other_seed = RunSpec("mnist", "standard", "cnn", "gpu-naive", (16, 32), 64, 0.01, E4_EPOCHS, 1)
    runs.append(_write_run(tmp_path / "results", other_seed, 20.0, 8.0, 10.0, 0.98, provenance=ON_H100))
    with pytest.raises(GpunnError, match="E4 has two runs of gpu-naive at dataset mnist, block 0"):
        make_report("e4", tmp_path / "report", runs=runs, evals=evals)


# ------------------------------------------------------------------------ E5: paper 004's tables and figures
E5_EPOCHS = 3
MIB = 2 ** 20
E5_RUNS = {  # variant: (n_train, seconds per epoch, peak GPU memory in bytes; None: not recorded, absent: CPU)
    "cpu-numpy": (1000, 600.0, "absent"),  # 30 000 s per 50 000-image epoch, extrapolated as the paper did
    "gpu-naive": (50000, 1000.0, 120 * MIB), "gpu-tiled": (50000, 500.0, 90 * MIB + MIB // 2),
    "gpu-im2col": (50000, 120.0, None), "gpu-graph": (50000, 100.0, 88 * MIB),
}
E5_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _e5_spec(variant, subset):
    return RunSpec("cifar10", "standard", "autoencoder", variant, (256, 128), 32, 0.001, E5_EPOCHS, 0, subset)


def _e5_results(tmp_path, runs=E5_RUNS, where=_cpu_and_h100, classes=True):
    """E5's run folders (cpu-numpy on its 1 000-image subset, GPU variants on all 50 000 by default) with the
    peak GPU memory in metrics.json as gpunn.train records it, and the first variant's eval folder: samples.npz
    with the first test image of each class (`classes`) or, as evaluated before, the first test images only."""
    results = tmp_path / "results"
    folders = []
    for variant, (n_train, epoch_s, peak) in runs.items():
        spec = _e5_spec(variant, n_train if n_train < 50000 else 0)
        run = _write_run(results, spec, epoch_s * E5_EPOCHS, 0.4 * epoch_s, 0.5 * epoch_s, float("nan"),
                         provenance=where(variant), n_train=n_train, n_test=10000, image_shape=(3, 32, 32),
                         test_time_s=1.0, final_loss=0.004 + 0.001 * list(E5_RUNS).index(variant))
        if peak != "absent":
            summary = json.loads((run / "metrics.json").read_text())
            io.write_json(run / "metrics.json", {**summary, "peak_gpu_memory_bytes": peak})
        folders.append(run)
    first, (n_train, _, _) = next(iter(runs.items())), next(iter(runs.values()))
    spec = _e5_spec(first[0], n_train if n_train < 50000 else 0)
    out = results / "eval" / spec.path
    images = np.random.default_rng(0).integers(0, 256, (10, 3, 32, 32), dtype=np.uint8)
    extra = {"labels": np.arange(10), "class_names": np.array(E5_CLASSES)} if classes else {}
    io.write_npz(out / "samples.npz", images=images, reconstructions=images / 255.0, **extra)
    _write_eval_json(out, spec)
    return folders, [out]


def test_e5_report_speedups_per_full_set_epoch_memory_and_paper_tables(tmp_path):
    shuffled = dict(reversed(E5_RUNS.items()))  # runs in any order: rows in report order
    runs, evals = _e5_results(tmp_path, shuffled)
    out = tmp_path / "report"
    written = make_report("e5", out, runs=runs, evals=evals)
    _assert_written(out, "e5")
    assert set(written) == {"summary.md", "paper_table.md", "mse_curves.png", "training_time.png", "speedup.png",
                            "reconstructions.png", "paper_vs_ours.md"}

    summary = pd.read_csv(out / "summary.csv")
    variants = list(E5_RUNS)
    assert list(summary["variant"]) == variants
    assert list(summary.columns) == ["variant", "device", "dataset", "n_train", "n_test", "batch", "lr", "epochs",
                                     "parameters", "time_per_epoch_s", "train_time_s", "full_epoch_s",
                                     "full_train_time_s", "full_set_extrapolated", "all_epochs",
                                     "train_time_extrapolated", "speedup_vs_cpu_numpy",
                                     "speedup_vs_gpu_naive", "final_train_mse", "test_mse", "peak_gpu_memory_mib",
                                     "diverged", "simulator", "timing_mode"]
    assert list(summary["n_train"]) == [1000] + [50000] * 4
    assert list(summary["full_set_extrapolated"]) == [True, False, False, False, False]
    # cpu-numpy's 600 s over 1 000 images is 30 000 s over 50 000; the GPU epochs are measured over 50 000
    full_epoch = [30000.0, 1000.0, 500.0, 120.0, 100.0]
    assert summary["time_per_epoch_s"].tolist() == pytest.approx([E5_RUNS[v][1] for v in variants])
    assert summary["full_epoch_s"].tolist() == pytest.approx(full_epoch)
    assert summary["full_train_time_s"].tolist() == pytest.approx([E5_EPOCHS * t for t in full_epoch])
    # per 50 000-image epoch: 30x, not the 0.6x of the runs' own epochs (600 s over 1 000 images / 1 000 s)
    assert summary["speedup_vs_cpu_numpy"].tolist() == pytest.approx([1.0, 30.0, 60.0, 250.0, 300.0])
    assert summary["speedup_vs_gpu_naive"].tolist() == pytest.approx([1 / 30, 1.0, 2.0, 1000 / 120, 10.0])
    assert summary["final_train_mse"].tolist() == pytest.approx([0.004, 0.005, 0.006, 0.007, 0.008])
    assert summary["test_mse"].tolist() == pytest.approx([1.1 / E5_EPOCHS] * 5)
    assert summary["peak_gpu_memory_mib"].tolist() == pytest.approx([np.nan, 120.0, 90.5, np.nan, 88.0], nan_ok=True)

    header, rows = _md_rows(out / "summary.md")
    cells = {row[0]: dict(zip(header, row)) for row in rows}
    assert cells["cpu-numpy"]["full_set_extrapolated"] == "extrapolated"
    assert cells["cpu-numpy"]["full_epoch_s"] == "30000" and cells["cpu-numpy"]["time_per_epoch_s"] == "600"
    assert {cells[v]["full_set_extrapolated"] for v in variants[1:]} == {"measured"}
    assert (cells["gpu-im2col"]["speedup_vs_cpu_numpy"], cells["gpu-im2col"]["speedup_vs_gpu_naive"]) == ("250x",
                                                                                                        "8.33x")
    assert [cells[v]["peak_gpu_memory_mib"] for v in variants] == ["-", "120", "90.5", "-", "88"]
    md = (out / "summary.md").read_text()
    assert "The runs trained on 1 000 and 50 000 images, so every speedup compares epochs over 50 000 images" in md
    assert "as the paper extrapolated its CPU epoch" in md

    paper = pd.read_csv(out / "paper_table.csv")
    assert list(paper["implementation"]) == ["CPU (extrapolated)", "GPU naive", "GPU optimized v1", "GPU optimized v2",
                                             "GPU graph (ours, not in the paper)"]
    assert list(paper["variant"]) == variants
    assert paper["full_epoch_s"].tolist() == pytest.approx(full_epoch)
    assert paper["speedup_vs_cpu"].tolist() == pytest.approx([1.0, 30.0, 60.0, 250.0, 300.0])
    assert paper["speedup_vs_previous"].tolist() == pytest.approx([np.nan, 30.0, 2.0, 500 / 120, 1.2], nan_ok=True)
    assert paper["paper_full_epoch_s"].tolist() == pytest.approx([29678.0, 991.63, 517.18, 117.97, np.nan],
                                                                nan_ok=True)
    assert paper["full_train_time_s"].tolist() == pytest.approx([E5_EPOCHS * t for t in full_epoch])
    assert paper["incremental_speedup"].tolist() == pytest.approx([np.nan, 30.0, 2.0, 500 / 120, 1.2], nan_ok=True)
    text = (out / "paper_table.md").read_text()
    epoch_part, total_part = text.split("### ")[1:]
    assert epoch_part.startswith("Paper's section 2.4: time per epoch on 50 000 images")
    assert total_part.startswith("Paper's section 3.1: training time for all epochs on 50 000 images")
    epoch_lines = [_md_cells(line) for line in epoch_part.splitlines() if line.startswith("|")]
    assert epoch_lines[0] == ["Implementation", "Variant", "Epoch time (s)", "Speedup vs CPU",
                              "Speedup vs previous phase", "Paper's epoch time (s)"]
    assert epoch_lines[2] == ["CPU (extrapolated)", "cpu-numpy", "30000", "1.00x", "-", "29678.00"]
    assert epoch_lines[4] == ["GPU optimized v1", "gpu-tiled", "500", "60.0x", "2.00x", "517.18"]
    assert epoch_lines[6] == ["GPU graph (ours, not in the paper)", "gpu-graph", "100", "300x", "1.20x", "-"]
    total_lines = [_md_cells(line) for line in total_part.splitlines() if line.startswith("|")]
    assert total_lines[0] == ["Phase", "Variant", "Training time for all epochs (s)", "Speedup vs CPU",
                              "Incremental speedup", "Memory (VRAM, MiB)"]
    assert total_lines[2] == ["CPU (extrapolated)", "cpu-numpy", "90000", "1.00x", "-", "-"]
    assert total_lines[3] == ["GPU naive", "gpu-naive", "3000", "30.0x", "30.0x", "120"]
    assert total_lines[5][-1] == "-"  # gpu-im2col recorded null

    head = ("E5: convolutional autoencoder (conv channels 256, 128) on cifar10 ({1 000, 50 000} train / 10 000 test), "
            "batch 32, 3 epochs")
    timed = "timed on cpu (AMD EPYC 9454) and NVIDIA H100 80GB HBM3"
    assert _title_line(out / "summary.md") == f"{head}, per variant, {timed}"
    assert _title_line(out / "paper_table.md") == f"{head}, laid out as in the paper's sections 2.4 and 3.1, {timed}"
    assert written["training_time.png"].endswith(f"\n{timed}") and "timed on" not in written["mse_curves.png"]


def test_e5_training_time_of_a_run_timed_over_fewer_epochs_is_scaled_to_all_epochs(tmp_path):
    """experiments.e5.variant_epochs: gpu-naive timed over 1 epoch while the others train E5_EPOCHS; the 3.1
    table's training time for all epochs is its epoch time x E5_EPOCHS, marked extrapolated (its epoch is not)."""
    runs, evals = _e5_results(tmp_path, {v: E5_RUNS[v] for v in ("cpu-numpy", "gpu-naive", "gpu-graph")})
    naive = runs[1]
    summary = json.loads((naive / "metrics.json").read_text())
    short = dataclasses.replace(RunSpec.from_dict(summary["spec"]), epochs=1)
    io.write_json(naive / "metrics.json", {**summary, "spec": short.to_dict(), "total_train_time_s": 1000.0})
    out = tmp_path / "report"
    make_report("e5", out, runs=runs, evals=evals)
    table = pd.read_csv(out / "summary.csv").set_index("variant")
    assert table.loc["gpu-naive", "full_epoch_s"] == pytest.approx(1000.0)
    assert table.loc["gpu-naive", "full_train_time_s"] == pytest.approx(E5_EPOCHS * 1000.0)
    assert list(table["all_epochs"]) == [E5_EPOCHS] * 3
    assert list(table["train_time_extrapolated"]) == [True, True, False]  # cpu-numpy: a subset; gpu-naive: 1 epoch
    assert list(table["full_set_extrapolated"]) == [True, False, False]
    paper = pd.read_csv(out / "paper_table.csv").set_index("variant")
    assert paper.loc["gpu-naive", "implementation"] == "GPU naive"  # its epoch is measured ...
    assert paper.loc["gpu-naive", "phase"] == "GPU naive (extrapolated)"  # ... its 3-epoch time is not
    assert paper.loc["gpu-graph", "phase"] == "GPU graph (ours, not in the paper)"
    assert "the training time for all 3 epochs of a run timed over fewer is its epoch time x that many" in (
        out / "paper_table.md").read_text()


def test_e5_figures_mse_time_speedup_and_one_reconstruction_per_class(tmp_path, monkeypatch):
    saved = _capture_figures(monkeypatch)
    runs, evals = _e5_results(tmp_path)
    written = make_report("e5", tmp_path / "report", runs=runs, evals=evals)
    mse, time_bars, speedup, reconstructions = saved  # in the order report_e5 draws them
    variants = list(E5_RUNS)

    assert [p.split("\n")[0] for p in mse["panels"]] == ["train MSE per epoch", "test MSE per epoch"]
    assert mse["legend"] == ["cpu-numpy (1 000 train images)"] + [f"{v} (50 000 train images)" for v in variants[1:]]
    assert mse["ydata"][0][0][-1] == pytest.approx(0.004)  # cpu-numpy's last train MSE
    assert mse["suptitle"] == written["mse_curves.png"]

    assert time_bars["bars"][0] == pytest.approx([E5_EPOCHS * t for t in (30000.0, 1000.0, 500.0, 120.0, 100.0)])
    assert time_bars["yscale"] == ["log"]
    assert time_bars["hatches"][0] == ["xx", None, None, None, None]  # the extrapolated CPU bar, cross-hatched
    assert time_bars["xticks"][0][0] == "cpu-numpy\n(extrapolated)" and time_bars["xticks"][0][1] == "gpu-naive"
    assert time_bars["texts"][0][0] == "90000 s (25.0 h)\nextrapolated"
    assert time_bars["texts"][0][4] == "300 s (5.00 min)"

    assert speedup["bars"][0] == pytest.approx([1.0, 30.0, 60.0, 250.0, 300.0])
    assert speedup["texts"][0] == ["1.00x", "30.0x", "60.0x", "250x", "300x"]
    assert speedup["suptitle"] == written["speedup.png"]

    assert reconstructions["panels"][:10] == E5_CLASSES  # one column per class, titled by its name
    assert len(reconstructions["panels"]) == 20
    assert written["reconstructions.png"].startswith(
        "E5: the first test image of each class (top) and its reconstruction by cpu-numpy (bottom)")


def test_e5_report_without_cpu_numpy_or_memory_under_the_simulator(tmp_path, monkeypatch):
    """GPU variants alone, under the simulator on a 2 000-image subset, no peak memory recorded: every time
    extrapolated, speedups over cpu-numpy '-', memory '-', the speedup figure says why it is empty."""
    saved = _capture_figures(monkeypatch)
    runs = {"gpu-im2col": (2000, 40.0, None), "gpu-naive": (2000, 80.0, "absent")}
    folders, evals = _e5_results(tmp_path, runs, where=_cpu_and_simulated)
    out = tmp_path / "report"
    written = make_report("e5", out, runs=folders, evals=evals)
    _assert_written(out, "e5")
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["variant"]) == ["gpu-naive", "gpu-im2col"]
    assert summary["full_set_extrapolated"].all()
    assert summary["full_epoch_s"].tolist() == pytest.approx([2000.0, 1000.0])  # x 50 000 / 2 000
    assert summary["speedup_vs_cpu_numpy"].isna().all() and summary["peak_gpu_memory_mib"].isna().all()
    assert summary["speedup_vs_gpu_naive"].tolist() == pytest.approx([1.0, 2.0])
    header, rows = _md_rows(out / "summary.md")
    for row in rows:
        cells = dict(zip(header, row))
        assert (cells["speedup_vs_cpu_numpy"], cells["peak_gpu_memory_mib"]) == ("-", "-")
        assert cells["full_set_extrapolated"] == "extrapolated" and cells["device"] == "cuda-simulator"
    assert "compares epochs over" not in (out / "summary.md").read_text()  # one training-set size: no such note
    paper = pd.read_csv(out / "paper_table.csv")
    assert list(paper["implementation"]) == ["GPU naive (extrapolated)", "GPU optimized v2 (extrapolated)"]
    assert paper["speedup_vs_cpu"].isna().all()
    assert paper["speedup_vs_previous"].tolist() == pytest.approx([np.nan, 2.0], nan_ok=True)
    warning = "timings of gpu-naive and gpu-im2col under the CUDA simulator: not meaningful"
    assert "gpu-naive and gpu-im2col ran under numba's CUDA simulator" in (out / "paper_table.md").read_text()
    assert written["speedup.png"].endswith(f"\n{warning}")
    speedup = saved[2]
    assert speedup["bars"] == [[]] and speedup["texts"] == [["no cpu-numpy run: no speedup over it to show"]]
    time_bars = saved[1]
    assert time_bars["xticks"][0] == [f"{v}\n(simulated)\n(extrapolated)" for v in ("gpu-naive", "gpu-im2col")]


def test_e5_report_refuses_two_datasets_and_checks_figure_inputs(tmp_path):
    runs, evals = _e5_results(tmp_path, {"cpu-numpy": (1000, 600.0, "absent")})
    other = RunSpec("synthetic_cifar10", "standard", "autoencoder", "gpu-naive", (256, 128), 32, 0.001, E5_EPOCHS, 0)
    runs.append(_write_run(tmp_path / "results", other, 30.0, 1.0, 1.0, float("nan"), provenance=ON_H100,
                           n_train=50000, n_test=10000))
    with pytest.raises(GpunnError, match="E5 report: runs on cifar10 and synthetic_cifar10"):
        make_report("e5", tmp_path / "report", runs=runs, evals=evals)
    with pytest.raises(GpunnError, match="3 column titles for 2 images"):
        reconstruction_grid(np.zeros((2, 3, 8, 8)), np.zeros((2, 3, 8, 8)), tmp_path / "r.png", "t",
                            column_titles=["a", "b", "c"])
    from gpunn.experiments.e5 import training_time_bars

    pd.DataFrame({"variant": ["gpu-naive"], "full_train_time_s": [0.0], "full_set_extrapolated": [False],
                  "speedup_vs_cpu_numpy": [np.nan]}).to_csv(tmp_path / "zero.csv", index=False)
    with pytest.raises(GpunnError, match="no positive full_train_time_s"):
        training_time_bars(tmp_path / "zero.csv", tmp_path / "zero.png", "t")
