"""The README's smoke run: the whole DAG on tiny offline data, in a temporary copy of the workflow.

One run of the pipeline (module-scoped) feeds several checks: every stage's outputs exist, the CPU MLP
and CNN learn (clearly above chance), the GPU MLP variants (under the CUDA simulator, on tiny shapes) end
where cpu-numpy ends, the SVM ran on real encoder features, reruns are no-ops.
"""

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from snakemake_helpers import copy_workflow
from snakemake_helpers import run_snakemake as _run_snakemake

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
E1_VARIANTS = ["cpu-numpy", "cpu-serial", "gpu-naive", "gpu-tiled", "gpu-fused"]  # config/smoke.yaml
E4_VARIANTS = ["cpu-numpy", "gpu-naive", "gpu-optimized", "gpu-im2col"]  # on digits8_mini, + gpu-naive _t32


# config/smoke.yaml: results_dir results/smoke; GPU jobs under the simulator, so measured outputs are under
# <stage>/cudasim/
MACHINE = "cudasim"


def run_snakemake(workdir: Path, *args, timeout=600):
    return _run_snakemake(workdir, "--cores", "2", "--configfile", "config/smoke.yaml", *args, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("smoke"))
    start = time.perf_counter()
    out = run_snakemake(workdir)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return workdir / "results/smoke", elapsed, workdir


def _runs(results: Path, pattern: str):
    found = sorted(results.glob(f"runs/{MACHINE}/{pattern}/metrics.json"))
    assert found, f"no run matches {pattern}"
    return [json.loads(p.read_text()) for p in found]


def test_smoke_finishes_in_time(smoke):
    _, elapsed, _ = smoke
    assert elapsed < 540, f"smoke pipeline took {elapsed:.0f} s"  # README: about 5-6 minutes on 2 cores


def test_every_stage_left_its_outputs(smoke):
    results, _, _ = smoke
    for dataset, split in (("digits8", "standard"), ("digits8_mini", "standard"), ("synthetic_mnist_small", "e2"),
                           ("synthetic_cifar10_small", "standard")):
        assert (results / f"offline/{dataset}/manifest.json").is_file()
        assert (results / f"data/raw/{dataset}/manifest.json").is_file()
        assert (results / f"data/prepared/{dataset}/{split}.npz").is_file()
    for pattern in (*(f"digits8/standard/mlp/{variant}/*" for variant in E1_VARIANTS),
                    "*/standard/cnn/cpu-numpy/*", "synthetic_cifar10_small/standard/autoencoder/cpu-numpy/*"):
        for summary in _runs(results, pattern):
            run = results / "runs" / MACHINE / summary["spec"]["path"]
            frame = pd.read_csv(run / "metrics.csv")
            assert list(frame["epoch"]) == list(range(1, summary["spec"]["epochs"] + 1))
            assert np.isfinite(frame[["train_loss", "test_loss", "epoch_time_s"]].to_numpy()).all()
            assert (run / "weights.npz").is_file()
    e3_variants = set(pd.read_csv(results / f"report/{MACHINE}/e3/summary.csv")["variant"])
    assert e3_variants == {"cpu-numpy", "cpu-serial", "gpu-fused"}  # time_batches ran a GPU variant (simulated)
    for experiment, figures in {"e1": ["loss_curves", "samples", "epoch_time", "reduction_gap"],
                                "e2": ["heatmaps", "forward_backward"], "e3": ["batch_timing", "block_sweep"],
                                "e4": ["cumulative_time", "loss_curves", "block_time", "block_loss"],
                                "e5": ["mse_curves", "reconstructions", "training_time", "speedup"],
                                "e6": ["confusion"]}.items():
        report = results / "report" / MACHINE / experiment
        table = pd.read_csv(report / "summary.csv")
        assert len(table) >= 1
        assert (report / "summary.md").read_text().count("\n|") >= len(table)
        for name in figures:
            assert (report / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
            assert (report / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
        assert json.loads((report / "provenance.json").read_text())["sources"]
    # E5's cpu-numpy trains on 500 images: the seed's tables show its epoch extrapolated to 50 000
    e5_paper = pd.read_csv(results / "report" / MACHINE / "e5" / "paper_table.csv")
    assert list(e5_paper["implementation"]) == ["CPU (extrapolated)"]


def test_the_entry_page_covers_every_experiment(smoke):
    """report/<machine>/index.md: every experiment's headline rows (the simulated ones labelled), links to its
    tables and figures, and the provenance of the runs."""
    results, _, _ = smoke
    page = (results / "report" / MACHINE / "index.md").read_text()
    for experiment in ("E1", "E2", "E3", "E4", "E5", "E6"):
        assert f"\n| {experiment} | " in page and f"### {experiment}: " in page
    assert "not run:" not in page  # the smoke config runs every experiment
    assert "| cuda-simulator |" in page and "not meaningful" in page
    assert "(e5/reconstructions.png) ([PDF](e5/reconstructions.pdf)): " in page
    assert "## Provenance" in page and "| 0.30.4 |" in page  # numba-cuda's version, as pinned
    summary = pd.read_csv(results / "report" / MACHINE / "index.csv")
    assert set(summary["experiment"]) == {"E1", "E2", "E3", "E4", "E5", "E6"}


def test_cpu_models_learn_on_smoke_data(smoke):
    results, _, _ = smoke
    for summary in _runs(results, "synthetic_mnist_small/e2/mlp/*/*"):  # E2 cells: 3 short epochs
        assert summary["final_test_accuracy"] >= 0.60, summary["spec"]["path"]
    (ae,) = _runs(results, "synthetic_cifar10_small/standard/autoencoder/cpu-numpy/*")
    # the autoencoder must beat the best constant answer: the mean training image
    with np.load(results / "data/prepared/synthetic_cifar10_small/standard.npz") as data:
        train = data["x_train"][: ae["n_train"]].astype(np.float64) / 255
        test = data["x_test"].astype(np.float64) / 255
    mean_image_mse = float(((test - train.mean(axis=0)) ** 2).mean())
    assert ae["final_test_loss"] < 0.95 * mean_image_mse


@pytest.mark.parametrize("variant", [v for v in E1_VARIANTS if v != "cpu-numpy"])
def test_e1_variants_end_where_cpu_numpy_ends(smoke, variant):
    """Same init, same batches: every variant's E1 run (GPU ones under the simulator) matches cpu-numpy."""
    results, _, _ = smoke
    numpy_run, = _runs(results, "digits8/standard/mlp/cpu-numpy/*")
    other, = _runs(results, f"digits8/standard/mlp/{variant}/*")
    assert abs(numpy_run["final_test_accuracy"] - other["final_test_accuracy"]) <= 0.001  # within 0.1 point
    assert other["final_train_loss"] == pytest.approx(numpy_run["final_train_loss"], rel=1e-4)
    assert other["final_test_loss"] == pytest.approx(numpy_run["final_test_loss"], rel=1e-4)
    assert numpy_run["final_test_accuracy"] > 0.2  # 10 classes: it learned from its 64 samples


@pytest.mark.parametrize("run", [*(f"{v}/*" for v in E4_VARIANTS[1:]), "gpu-naive/*_t32"])
def test_e4_gpu_variants_end_where_cpu_numpy_ends(smoke, run):
    """E4 under the simulator: every CNN variant (and the block-size study's run) from cpu-numpy's init and
    batches ends at cpu-numpy's losses and accuracy; the block study and the seed's table are reported."""
    results, _, _ = smoke
    (numpy_run,) = _runs(results, "digits8_mini/standard/cnn/cpu-numpy/*")
    (other,) = [r for r in _runs(results, f"digits8_mini/standard/cnn/{run}")
                if ("_t" in r["spec"]["path"]) == run.endswith("_t32")]
    assert other["final_train_loss"] == pytest.approx(numpy_run["final_train_loss"], rel=1e-4)
    assert other["final_test_loss"] == pytest.approx(numpy_run["final_test_loss"], rel=1e-4)
    assert abs(numpy_run["final_test_accuracy"] - other["final_test_accuracy"]) <= 0.001
    assert other["test_time_s"] > 0
    report = results / "report" / MACHINE / "e4"
    assert list(pd.read_csv(report / "blocks.csv")["block"]) == [32]
    assert set(pd.read_csv(report / "paper_table.csv")["variant"]) == set(E4_VARIANTS)


def test_svm_on_encoder_features(smoke):
    results, _, _ = smoke
    (features_dir,) = [p.parent for p in results.glob(f"features/{MACHINE}/**/train_features.npy")]
    train = np.load(features_dir / "train_features.npy")
    assert train.dtype == np.float32 and train.ndim == 2 and train.shape[1] == 8 * 8 * 8  # latent C x H/4 x W/4
    assert len(np.load(features_dir / "train_labels.npy")) == len(train)
    (metrics_path,) = results.glob(f"svm/{MACHINE}/**/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["n_train"] == 1000 and metrics["test_accuracy"] > 0.2  # 10 classes: chance is 0.1
    confusion = pd.read_csv(metrics_path.parent / "confusion.csv", index_col=0)
    assert confusion.to_numpy().sum() == metrics["n_test"]


def test_second_run_has_nothing_to_do(smoke):
    _, _, workdir = smoke
    out = run_snakemake(workdir, "-n")
    assert out.returncode == 0
    assert "Nothing to be done" in out.stdout + out.stderr


def test_snakemake_report_bundles_the_figures(smoke):
    _, _, workdir = smoke
    out = run_snakemake(workdir, "--report", "report.zip")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    import zipfile

    with zipfile.ZipFile(workdir / "report.zip") as bundle:
        names = bundle.namelist()
    for figure in ("loss_curves.png", "heatmaps.png", "batch_timing.png", "reconstructions.png", "confusion.png"):
        assert any(name.endswith(figure) for name in names), figure
    with zipfile.ZipFile(workdir / "report.zip") as bundle:
        page = bundle.read("report/report.html").decode()
    # its front page is the entry page's summary table, each figure has its own caption naming the seed figure
    assert "CPU test accuracy" in page and "Provenance" in page
    assert "seed 001&#39;s Figure 1" in page or "seed 001's Figure 1" in page
