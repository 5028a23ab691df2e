"""Training loop, evaluation, features and the command line, on real offline data (sklearn digits and
synthetic CIFAR-like images) that went through the same download / parse / prepare code as MNIST."""

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from gpunn.data.download import fetch_dataset
from gpunn.data.offline import write_offline_dataset
from gpunn.data.prepare import prepare_dataset
from gpunn.errors import GpunnError
from gpunn.evaluate import evaluate_run
from gpunn.features import extract_features
from gpunn.runspec import parse_run_path
from gpunn.train import METRIC_COLUMNS, startup_line, train_run
from gpunn.weights import load_trained


def _prepared(root, name):
    write_offline_dataset(name, root / "offline" / name, log=lambda _: None)
    fetch_dataset(name, root / "raw" / name, mirrors=[str(root / "offline" / name)], log=lambda _: None)
    out = root / "prepared" / f"{name}.npz"
    prepare_dataset(name, root / "raw" / name, out, log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return _prepared(tmp_path_factory.mktemp("data"), "digits8")


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    return _prepared(tmp_path_factory.mktemp("data"), "synthetic_cifar10_small")


def test_mlp_run_outputs_and_reload(digits, tmp_path):
    spec = parse_run_path("digits8/standard/mlp/cpu-numpy/w32_b16_lr0.1_e3_s0")
    lines = []
    summary = train_run(spec, digits, tmp_path, log=lines.append)
    frame = pd.read_csv(tmp_path / "metrics.csv")
    assert list(frame.columns) == METRIC_COLUMNS
    assert list(frame["epoch"]) == [1, 2, 3]
    assert frame["train_loss"].iloc[-1] < frame["train_loss"].iloc[0]
    assert summary["final_test_accuracy"] >= 0.85  # real digits, 8x8, 3 epochs
    # one line per epoch, with the expected end while epochs remain; none over 200 characters
    epoch_lines = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epoch_lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert "; 2 more epochs, ends in about" in epoch_lines[0] and "; 1 more epoch, ends in" in epoch_lines[1]
    assert "more epoch" not in epoch_lines[2] and max(map(len, lines)) <= 200
    assert sum(line.startswith("epoch ") for line in lines) == 3  # one progress line per epoch
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert "host" not in on_disk and on_disk["timing_lock_wait_s"] == 0.0
    assert on_disk["provenance"]["device"] == "cpu" and on_disk["provenance"]["simulator"] is False
    assert {"cpu", "numpy", "numba", "commit", "blas_threads"} <= set(on_disk["provenance"])
    # what the run spent outside its epochs, and the line that says it (a CPU run has no kernels to count)
    startup = on_disk["startup"]
    assert startup["data_s"] > 0 and startup["build_s"] > 0
    assert startup["test_passes_s"] == pytest.approx(frame["eval_time_s"].sum())
    assert startup["kernels_loaded"] is None and startup["kernel_cache"] is None
    assert [line for line in lines if line.startswith("outside the epochs: data ")] == [startup_line(startup)]
    # the saved weights reproduce the final test accuracy through the evaluation path
    result = evaluate_run(tmp_path, digits, tmp_path / "eval", log=lambda _: None)
    assert result["test_accuracy"] == pytest.approx(summary["final_test_accuracy"])
    confusion = np.array(result["confusion_matrix"])
    assert confusion.sum() == result["n_test"] == 360
    assert np.trace(confusion) / confusion.sum() == pytest.approx(result["test_accuracy"])
    assert len(np.load(tmp_path / "eval" / "predictions.npy")) == 360


# the loss gradient of the batch mean, or (E1's second run of each variant) of the batch sum at lr / batch: the same
# steps
@pytest.mark.parametrize("hparams, reduction",
                         [("w16_b10_lr0.05_e1_s3", "mean"), ("w16_b10_lr0.005_e1_s3_rsum", "sum")])
def test_same_seed_same_run_and_serial_matches_numpy(digits, tmp_path, hparams, reduction):
    """Both CPU variants start from the same init and see the same batches: after an epoch their
    parameters agree to float32 rounding (different summation order only)."""
    flats = {}
    for variant in ("cpu-numpy", "cpu-serial"):
        spec = parse_run_path(f"digits8/standard/mlp/{variant}/{hparams}")
        train_run(spec, digits, tmp_path / variant, log=lambda _: None)
        flats[variant] = load_trained(tmp_path / variant)[1].flat.copy()
        assert json.loads((tmp_path / variant / "metrics.json").read_text())["spec"]["reduction"] == reduction
    ref = flats["cpu-numpy"]
    assert np.max(np.abs(flats["cpu-serial"] - ref)) / np.max(np.abs(ref)) < 1e-4
    again = tmp_path / "again"
    train_run(parse_run_path(f"digits8/standard/mlp/cpu-numpy/{hparams}"), digits, again, log=lambda _: None)
    assert np.array_equal(load_trained(again)[1].flat, ref)


def test_cnn_learns_digits(digits, tmp_path):
    summary = train_run(parse_run_path("digits8/standard/cnn/cpu-numpy/w4-8_b16_lr0.05_e3_s0"), digits, tmp_path,
                        log=lambda _: None)
    assert summary["num_parameters"] == (4 * 9 + 4) + (8 * 4 * 9 + 8) + (8 * 2 * 2 * 10 + 10)
    assert summary["final_test_accuracy"] >= 0.6
    # testing time: the last epoch's pass of the test set through the forward pass, part of its evaluation
    frame = pd.read_csv(tmp_path / "metrics.csv")
    assert summary["test_time_s"] == pytest.approx(frame["test_time_s"].iloc[-1])
    assert (frame["test_time_s"] > 0).all() and (frame["test_time_s"] <= frame["eval_time_s"]).all()
    assert summary["block"] == 0


def test_gpu_cnn_run_with_a_block_size(tmp_path):
    """A run path's _t<threads> reaches the run and its record (simulator: 8x8 digits, one step of 16 samples)."""
    digits8_mini = _prepared(tmp_path, "digits8_mini")
    spec = parse_run_path("digits8_mini/standard/cnn/gpu-naive/w2-3_b16_lr0.1_e1_s0_n16_t32")
    summary = train_run(spec, digits8_mini, tmp_path / "run", log=lambda _: None)
    assert summary["block"] == 32 and summary["spec"]["block"] == 32 and summary["spec"]["path"].endswith("_t32")
    assert np.isfinite(summary["final_train_loss"]) and summary["test_time_s"] > 0


def test_partial_last_batch_and_batch_one(digits, tmp_path):
    # 1437 training images: batch 100 leaves a last batch of 37; batch 1 on a subset of 7
    for hparams in ("w8_b100_lr0.1_e1_s0", "w8_b1_lr0.01_e1_s0_n7"):
        summary = train_run(parse_run_path(f"digits8/standard/mlp/cpu-numpy/{hparams}"), digits, tmp_path / hparams,
                            log=lambda _: None)
        assert np.isfinite(summary["final_train_loss"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow on the way to the NaN is the point
def test_divergence_stops_with_a_clear_error_and_no_outputs(digits, tmp_path):
    spec = parse_run_path("digits8/standard/mlp/cpu-numpy/w32_b16_lr1e30_e2_s0")
    with pytest.raises(GpunnError, match=r"training diverged: run digits8/standard/mlp/cpu-numpy/w32_b16_lr1e30_e2_s0 "
                                         r"at learning rate 1e30: train loss is (nan|inf) at epoch 1 batch \d+;"):
        train_run(spec, digits, tmp_path / "run", log=lambda _: None)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_wrong_dataset_or_subset_is_refused(digits, tmp_path):
    with pytest.raises(GpunnError, match="prepared data is digits8/standard"):
        train_run(parse_run_path("mnist/standard/mlp/cpu-numpy/w8_b4_lr0.1_e1_s0"), digits, tmp_path)
    with pytest.raises(GpunnError, match="subset of 5000"):
        train_run(parse_run_path("digits8/standard/mlp/cpu-numpy/w8_b4_lr0.1_e1_s0_n5000"), digits, tmp_path)
    with pytest.raises(GpunnError, match="variant cpu-serial supports mlp, not cnn"):
        train_run(parse_run_path("digits8/standard/cnn/cpu-serial/w2-2_b4_lr0.1_e1_s0"), digits, tmp_path)


def test_autoencoder_run_and_features(cifar, tmp_path):
    spec = parse_run_path("synthetic_cifar10_small/standard/autoencoder/cpu-numpy/w4-3_b20_lr0.05_e1_s0_n100")
    summary = train_run(spec, cifar, tmp_path / "run", log=lambda _: None)
    assert np.isnan(summary["final_test_accuracy"]) and summary["final_test_loss"] > 0
    result = evaluate_run(tmp_path / "run", cifar, tmp_path / "eval", log=lambda _: None)
    assert result["test_loss"] == pytest.approx(summary["final_test_loss"], rel=1e-5)
    with np.load(cifar) as data, np.load(tmp_path / "eval" / "samples.npz") as samples:
        # the first test image of every class, in class order, for the reconstruction figure's one column per class
        assert samples["reconstructions"].shape == samples["images"].shape == (10, 3, 32, 32)
        assert samples["labels"].tolist() == list(range(10)) and len(samples["class_names"]) == 10
        firsts = [int(np.flatnonzero(data["y_test"] == c)[0]) for c in range(10)]
        np.testing.assert_array_equal(samples["images"], data["x_test"][firsts])
        assert samples["reconstructions"].min() >= 0.0 and samples["reconstructions"].max() <= 1.0
    sizes = extract_features(tmp_path / "run", cifar, tmp_path / "features", train_limit=60, log=lambda _: None)
    assert sizes == {"train": [60, 3 * 8 * 8], "test": [500, 3 * 8 * 8]}
    features = np.load(tmp_path / "features" / "test_features.npy")
    _, model = load_trained(tmp_path / "run")
    with np.load(cifar) as data:
        expected = model.encode(data["x_test"][:5].astype(np.float32) / 255).reshape(5, -1)
    np.testing.assert_allclose(features[:5], expected, rtol=1e-6)
    assert len(np.load(tmp_path / "features" / "test_labels.npy")) == 500


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gpunn", *args], capture_output=True, text=True, timeout=120)


def test_cli_errors_are_one_line_with_status_2(tmp_path):
    cases = [
        (["prepare", "mnist", "--raw", str(tmp_path / "missing"), "--out", str(tmp_path / "x.npz")],
         "missing/manifest.json: not found"),  # prepare checks the download's manifest before parsing
        (["train", "nope", "--data", "x.npz", "--out", str(tmp_path)], "run path"),
        (["train", "digits8/standard/mlp/cpu-numpy/w8_b4_lr0.1_e1_s0", "--data", str(tmp_path / "none.npz"),
          "--out", str(tmp_path / "run")], "none.npz"),
        (["download", "nosuchset", "--dest", str(tmp_path)], "nosuchset"),
    ]
    for args, named in cases:
        out = _cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpunn: error:") and named in lines[0], out.stderr
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "run").exists()


def test_train_waits_for_the_timing_lock_and_records_the_wait(digits, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUNN_TIMING_LOCK", str(tmp_path / "timing.lock"))
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom gpunn.timing_lock import timing_lock\n"
                               "with timing_lock('another timed job'):\n    time.sleep(1.5)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while "another timed job" not in _read(tmp_path / "timing.lock") and time.monotonic() < deadline:
            time.sleep(0.02)
        lines = []
        summary = train_run(parse_run_path("digits8/standard/mlp/cpu-numpy/w8_b64_lr0.1_e1_s0"), digits,
                            tmp_path / "run", log=lines.append)
    finally:
        holder.wait(timeout=30)
    assert summary["timing_lock_wait_s"] >= 1.0
    assert lines[0].startswith(f"waiting for the timing lock {tmp_path / 'timing.lock'}: held by pid {holder.pid} "
                               "(another timed job, since ")
    assert lines[1].startswith("got the timing lock after") and lines[2].startswith("train digits8/")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["timing_lock_wait_s"] >= 1.0


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_cli_train_end_to_end(digits, tmp_path):
    out = _cli("train", "digits8/standard/mlp/cpu-serial/w16_b32_lr0.1_e1_s0", "--data", str(digits),
               "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "epoch 1/1: train loss" in out.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["spec"]["variant"] == "cpu-serial"


def test_first_of_each_class():
    from gpunn.evaluate import first_of_each_class

    labels = np.array([3, 1, 3, 0, 1, 0])
    assert first_of_each_class(labels, 4).tolist() == [3, 1, 0]  # class 2 has no image: left out
    assert first_of_each_class(np.zeros(0, dtype=np.int64), 3).tolist() == []
