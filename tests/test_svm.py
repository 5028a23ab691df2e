"""E6 SVM stage on small synthetic features: accuracy, output consistency, stratified subsets, bad inputs."""

from __future__ import annotations

import json
import os
import re

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from gpunn.errors import GpunnError
from gpunn.svm import resolve_gamma, run_svm, stratified_subset

NAMES = ["zero", "one", "two", "three"]


def _blobs(n, d=20, k=4, seed=0, spread=0.6):
    """k well-separated Gaussian classes in d dimensions (class means fixed, rows drawn from `seed`)."""
    means = np.random.default_rng(123).normal(size=(k, d)) * 2.0
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    rng.shuffle(y)
    x = means[y] + spread * rng.normal(size=(n, d))
    return x.astype(np.float32), y.astype(np.int64)


@pytest.fixture()
def feature_files(tmp_path):
    x, y = _blobs(300, seed=1)
    xt, yt = _blobs(120, seed=2)
    paths = {k: tmp_path / f"{k}.npy" for k in ("train_x", "train_y", "test_x", "test_y")}
    for key, arr in zip(paths, (x, y, xt, yt)):
        np.save(paths[key], arr)
    return paths


def _run(paths, out_dir, **kw):
    kw.setdefault("log", lambda msg: None)
    return run_svm(paths["train_x"], paths["train_y"], paths["test_x"], paths["test_y"], out_dir, **kw)


def _check_outputs(out_dir, metrics, n_test):
    for name in ("metrics.json", "per_class.csv", "confusion.csv", "predictions.csv", "confusion.png"):
        assert (out_dir / name).is_file() and (out_dir / name).stat().st_size > 0
    assert not list(out_dir.glob("*.tmp")) and not list(out_dir.glob(".*"))
    on_disk = json.loads((out_dir / "metrics.json").read_text())
    assert on_disk["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    for key in ("method", "C", "gamma", "gamma_value", "n_train", "n_test", "n_features", "train_accuracy",
                "test_accuracy", "fit_time_s", "predict_time_s", "per_class_accuracy", "timing_lock_wait_s"):
        assert key in on_disk
    assert on_disk["provenance"]["device"] == "cpu" and on_disk["provenance"]["simulator"] is False
    assert on_disk["provenance"]["commit"] and on_disk["timing_lock_wait_s"] == 0.0

    conf = pd.read_csv(out_dir / "confusion.csv")
    assert list(conf.columns) == ["true"] + NAMES
    assert list(conf["true"]) == NAMES
    m = conf[NAMES].to_numpy()
    assert m.shape == (4, 4)
    assert m.sum() == n_test == on_disk["n_test"]
    assert on_disk["test_accuracy"] == pytest.approx(np.trace(m) / m.sum())

    predictions = pd.read_csv(out_dir / "predictions.csv")  # each test row: its labels, the same counts
    assert list(predictions.columns) == ["row", "true", "predicted"] and len(predictions) == n_test
    assert predictions["row"].is_unique and np.mean(predictions["true"] == predictions["predicted"]) == pytest.approx(
        on_disk["test_accuracy"])
    pairs = pd.crosstab(predictions["true"], predictions["predicted"]).reindex(index=range(4), columns=range(4))
    np.testing.assert_array_equal(pairs.fillna(0).to_numpy(), m)

    per_class = pd.read_csv(out_dir / "per_class.csv")
    assert list(per_class.columns) == ["class", "name", "n_test", "accuracy"]
    assert list(per_class["name"]) == NAMES
    np.testing.assert_array_equal(per_class["n_test"], m.sum(axis=1))
    np.testing.assert_allclose(per_class["accuracy"], np.diag(m) / m.sum(axis=1))
    for name, acc in zip(NAMES, np.diag(m) / m.sum(axis=1)):
        assert on_disk["per_class_accuracy"][name] == pytest.approx(acc)

    png = out_dir / "confusion.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mpimg.imread(png).std() > 0


@pytest.mark.parametrize("method", ["exact", "nystroem"])
def test_separable_features_reach_high_accuracy(feature_files, tmp_path, method):
    out = tmp_path / f"out_{method}"
    lines = []
    metrics = _run(feature_files, out, method=method, class_names=NAMES, nystroem_components=100,
                   log=lines.append)
    assert metrics["method"] == method
    assert metrics["n_train"] == 300 and metrics["n_test"] == 120 and metrics["n_features"] == 20
    assert metrics["test_accuracy"] >= 0.95
    assert metrics["train_accuracy"] >= 0.95
    assert any("fitting on 300 x 20" in line for line in lines)
    assert any("fit took" in line for line in lines)
    _check_outputs(out, metrics, 120)


def test_gamma_scale_matches_sklearn(feature_files, tmp_path):
    from sklearn.preprocessing import StandardScaler

    metrics = _run(feature_files, tmp_path / "out", class_names=NAMES)
    x = np.load(feature_files["train_x"])
    xs = StandardScaler().fit_transform(x)
    expected = 1.0 / (x.shape[1] * xs.astype(np.float64).var())
    assert metrics["gamma"] == "scale"
    assert metrics["gamma_value"] == pytest.approx(expected, rel=1e-6)
    assert resolve_gamma("auto", xs) == pytest.approx(1 / 20)
    assert resolve_gamma(0.5, xs) == 0.5
    with pytest.raises(GpunnError):
        resolve_gamma("bogus", xs)


def test_subsets_are_stratified_and_deterministic(feature_files, tmp_path):
    y = np.repeat(np.arange(4), [100, 50, 30, 20])  # imbalanced, 200 rows
    a = stratified_subset(y, 50, seed=3)
    b = stratified_subset(y, 50, seed=3)
    np.testing.assert_array_equal(a, b)
    assert a.size == 50 and np.unique(a).size == 50 and np.all(np.diff(a) > 0)
    np.testing.assert_array_equal(np.bincount(y[a], minlength=4), [25, 13, 7, 5])  # 12.5 and 7.5: tie -> first
    assert not np.array_equal(a, stratified_subset(y, 50, seed=4))
    np.testing.assert_array_equal(stratified_subset(y, None), np.arange(200))
    np.testing.assert_array_equal(stratified_subset(y, 500), np.arange(200))
    # every class keeps a row even when its proportional share rounds to zero
    tiny = np.repeat(np.arange(3), [97, 2, 1])
    assert set(tiny[stratified_subset(tiny, 5)]) == {0, 1, 2}
    with pytest.raises(GpunnError):
        stratified_subset(y, 3)

    m1 = _run(feature_files, tmp_path / "s1", train_subset=80, test_subset=40, class_names=NAMES)
    m2 = _run(feature_files, tmp_path / "s2", train_subset=80, test_subset=40, class_names=NAMES)
    assert m1["n_train"] == m2["n_train"] == 80 and m1["n_test"] == m2["n_test"] == 40
    assert (tmp_path / "s1" / "confusion.csv").read_text() == (tmp_path / "s2" / "confusion.csv").read_text()
    per_class = pd.read_csv(tmp_path / "s1" / "per_class.csv")
    assert list(per_class["n_test"]) == [10, 10, 10, 10]  # 120 balanced rows -> 40 balanced rows


def test_default_class_names_are_indices(feature_files, tmp_path):
    _run(feature_files, tmp_path / "out")
    conf = pd.read_csv(tmp_path / "out" / "confusion.csv")
    assert list(conf.columns) == ["true", "0", "1", "2", "3"]


def _assert_fails(paths, tmp_path, needle, **kw):
    out = tmp_path / "out_fail"
    with pytest.raises(GpunnError) as err:
        _run(paths, out, **kw)
    message = str(err.value)
    assert needle in message and "\n" not in message
    assert not out.exists() or not any(out.iterdir())
    return message


def test_row_count_mismatch(feature_files, tmp_path):
    np.save(feature_files["test_y"], np.zeros(119, dtype=np.int64))
    msg = _assert_fails(feature_files, tmp_path, str(feature_files["test_y"]))
    assert "119" in msg and "120" in msg


def test_missing_file(feature_files, tmp_path):
    feature_files["train_x"].unlink()
    _assert_fails(feature_files, tmp_path, str(feature_files["train_x"]))


def test_nan_features(feature_files, tmp_path):
    xt = np.load(feature_files["test_x"])
    xt[5, 3] = np.nan
    np.save(feature_files["test_x"], xt)
    msg = _assert_fails(feature_files, tmp_path, str(feature_files["test_x"]))
    assert "NaN" in msg


def test_wrong_shapes(feature_files, tmp_path):
    np.save(feature_files["test_x"], np.zeros((120, 21), dtype=np.float32))
    _assert_fails(feature_files, tmp_path, str(feature_files["test_x"]))
    np.save(feature_files["test_x"], np.zeros(120, dtype=np.float32))
    _assert_fails(feature_files, tmp_path, str(feature_files["test_x"]))


def test_float_labels_and_corrupt_file(feature_files, tmp_path):
    np.save(feature_files["train_y"], np.zeros(300, dtype=np.float32))
    _assert_fails(feature_files, tmp_path, str(feature_files["train_y"]))
    feature_files["train_y"].write_bytes(b"not an npy file")
    message = _assert_fails(feature_files, tmp_path, str(feature_files["train_y"]))
    assert f"run `snakemake --cores 2 {feature_files['train_y']}`" in message  # says how to make it again


def test_bad_parameters(feature_files, tmp_path):
    _assert_fails(feature_files, tmp_path, "method", method="cuml")
    _assert_fails(feature_files, tmp_path, "class_names", class_names=["a", "b"])


def test_latent_tensors_are_flattened(feature_files, tmp_path):
    x, y = _blobs(300, d=2 * 3 * 4, seed=1)
    xt, yt = _blobs(120, d=2 * 3 * 4, seed=2)
    np.save(feature_files["train_x"], x.reshape(300, 2, 3, 4))
    np.save(feature_files["test_x"], xt.reshape(120, 2, 3, 4))
    metrics = _run(feature_files, tmp_path / "out")
    assert metrics["n_features"] == 24 and metrics["test_accuracy"] >= 0.95


def test_precomputed_kernel_gives_the_libsvm_model(tmp_path):
    """The BLAS-precomputed kernel route trains the same SVC as libsvm on the raw features."""
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    from gpunn.rbf_kernel import rbf_kernel_into

    # overlapping classes, so that many points are support vectors and the decision is non-trivial
    x, y = _blobs(240, d=30, k=3, seed=5, spread=2.5)
    xt, yt = _blobs(90, d=30, k=3, seed=6, spread=2.5)
    xs = StandardScaler().fit_transform(x)
    gamma = 1.0 / (xs.shape[1] * xs.astype(np.float64).var())
    k = rbf_kernel_into(np.empty((len(xs), 7)), xs, xs[:7], gamma)
    direct = np.exp(-gamma * ((xs[:, None, :].astype(np.float64) - xs[None, :7]) ** 2).sum(-1))
    np.testing.assert_allclose(k, direct, rtol=1e-10, atol=1e-12)
    ref = SVC(kernel="rbf", C=10.0, gamma=gamma).fit(xs, y)

    paths = {}
    for key, arr in (("train_x", x), ("train_y", y), ("test_x", xt), ("test_y", yt)):
        paths[key] = tmp_path / f"{key}.npy"
        np.save(paths[key], arr)
    results = {}
    for pre in (True, False):
        out = tmp_path / f"pre_{pre}"
        lines = []
        metrics = _run(paths, out, precompute_kernel=pre, log=lines.append)
        assert metrics["kernel_precomputed"] is pre
        assert any("kernel matrix" in line for line in lines) is pre
        results[pre] = (metrics, (out / "confusion.csv").read_text())
    m_pre, m_lib = results[True][0], results[False][0]
    assert results[True][1] == results[False][1]
    assert m_pre["test_accuracy"] == m_lib["test_accuracy"]
    assert m_pre["train_accuracy"] == m_lib["train_accuracy"]
    assert m_pre["n_support_vectors"] == m_lib["n_support_vectors"] == ref.support_.size
    assert 0.5 < m_pre["test_accuracy"] < 1.0  # a non-trivial problem


def test_rbf_kernel_blocks_and_symmetry():
    from gpunn.rbf_kernel import rbf_kernel_into

    rng = np.random.default_rng(0)
    a = rng.normal(size=(23, 9)).astype(np.float32)
    b = rng.normal(size=(11, 9)).astype(np.float32)
    g = 0.07

    def direct(p, q):
        return np.exp(-g * ((p[:, None, :].astype(np.float64) - q[None, :, :]) ** 2).sum(-1))

    np.testing.assert_allclose(rbf_kernel_into(np.empty((23, 11)), a, b, g, block=5), direct(a, b), rtol=1e-12)
    lines = []
    k = rbf_kernel_into(np.empty((23, 23)), a, None, g, block=4, log=lines.append, progress_every_s=0.0)  # 6 blocks
    np.testing.assert_allclose(k, direct(a, a), rtol=1e-12)
    assert len(lines) == 5 and lines[0].startswith("svm: kernel on the cpu: row block 1/6 (4 of 23 rows)")
    np.testing.assert_array_equal(k, k.T)
    np.testing.assert_array_equal(np.diag(k), 1.0)


def test_class_absent_from_the_test_set(feature_files, tmp_path):
    xt, yt = np.load(feature_files["test_x"]), np.load(feature_files["test_y"])
    keep = yt != 3
    np.save(feature_files["test_x"], xt[keep])
    np.save(feature_files["test_y"], yt[keep])
    metrics = _run(feature_files, tmp_path / "out", class_names=NAMES)
    assert metrics["per_class_accuracy"]["three"] is None
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["per_class_accuracy"]["three"] is None
    per_class = pd.read_csv(tmp_path / "out" / "per_class.csv")
    assert per_class["n_test"].iloc[3] == 0 and np.isnan(per_class["accuracy"].iloc[3])
    assert pd.read_csv(tmp_path / "out" / "confusion.csv")[NAMES].to_numpy().sum() == keep.sum()


# ------------------------------------------------------------------------------ the GPU kernel route (E6)
def _tiny_problem(tmp_path, n_train=48, n_test=21, d=9, k=3, spread=2.5):
    """Overlapping classes (many support vectors, a non-trivial decision), saved as the four .npy inputs."""
    x, y = _blobs(n_train, d=d, k=k, seed=5, spread=spread)
    xt, yt = _blobs(n_test, d=d, k=k, seed=6, spread=spread)
    paths = {}
    for key, arr in (("train_x", x), ("train_y", y), ("test_x", xt), ("test_y", yt)):
        paths[key] = tmp_path / f"{key}.npy"
        np.save(paths[key], arr)
    return paths, (x, y, xt, yt)


def _scaled(x, xt):
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    xs = scaler.transform(x)
    return xs, scaler.transform(xt), 1.0 / (xs.shape[1] * xs.astype(np.float64).var())


@pytest.mark.parametrize("symmetric", [True, False], ids=["train", "test_vs_train"])
def test_gpu_kernel_equals_sklearn_in_row_blocks(symmetric):
    """rbf_kernel_gpu_into: row blocks that do not divide the rows, only the blocks from the diagonal on when
    symmetric, poisoned output, progress lines; equal to sklearn's float64 rbf_kernel."""
    from sklearn.metrics.pairwise import rbf_kernel

    from gpunn.rbf_kernel import rbf_kernel_gpu_into

    rng = np.random.default_rng(11 + symmetric)
    a = rng.normal(size=(37, 19)).astype(np.float32)
    b = None if symmetric else rng.normal(size=(23, 19)).astype(np.float32)
    gamma = 1.0 / 19
    out = np.full((37, 37 if symmetric else 23), np.nan)
    lines = []
    rbf_kernel_gpu_into(out, a, b, gamma, block_rows=16, log=lines.append, progress_every_s=0.0)
    ref = rbf_kernel(a.astype(np.float64), None if symmetric else b.astype(np.float64), gamma=gamma)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-6
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=0)
    assert [line.split(":")[2].split("(")[0].strip() for line in lines] == ["row block 1/3", "row block 2/3"]
    if symmetric:
        np.testing.assert_array_equal(out, out.T)
        np.testing.assert_array_equal(np.diag(out), 1.0)


def test_gpu_block_rows_follow_free_memory():
    from gpunn.rbf_kernel import gpu_block_rows

    assert gpu_block_rows(50_000, float("inf")) == 5312  # 2 GiB of float64 rows, a multiple of the 64-row tile
    assert gpu_block_rows(50_000, 1e9) == 1984  # 80 % of 1 GB
    assert gpu_block_rows(100, 8 * 100 * 10 / 0.8) == 10  # below one tile: as many rows as fit
    with pytest.raises(GpunnError, match="not enough"):
        gpu_block_rows(50_000, 1e5)


def test_gpu_route_trains_the_cpu_routes_model(tmp_path):
    """kernel_device gpu (simulator here) and cpu: the same support vectors, predictions, accuracies, outputs."""
    from gpunn.svm import _PrecomputedRbfSVC

    paths, (x, y, xt, yt) = _tiny_problem(tmp_path)
    xs, xts, gamma = _scaled(x, xt)
    models = {dev: _PrecomputedRbfSVC(10.0, gamma, dev, lambda msg: None) for dev in ("cpu", "gpu")}
    for model in models.values():
        model.kernels(xs, xts)
    preds = {dev: (m.fit(y), m.predict()) for dev, m in models.items()}
    np.testing.assert_array_equal(models["gpu"].support_, models["cpu"].support_)
    np.testing.assert_allclose(models["gpu"].svc.dual_coef_, models["cpu"].svc.dual_coef_, rtol=1e-9, atol=1e-12)
    for got, ref in zip(preds["gpu"], preds["cpu"]):
        np.testing.assert_array_equal(got, ref)

    results = {}
    for dev in ("cpu", "gpu"):
        lines = []
        metrics = _run(paths, tmp_path / dev, kernel_device=dev, log=lines.append)
        assert metrics["kernel_device"] == dev and metrics["kernel_precomputed"] is True
        assert metrics["provenance"]["device"] == ("cuda-simulator" if dev == "gpu" else "cpu")
        assert any(f"kernel matrix computed on the {dev}" in line for line in lines)
        assert metrics["kernel_time_s"] >= 0 and metrics["predict_kernel_time_s"] >= 0
        assert metrics["fit_time_s"] >= metrics["kernel_time_s"]
        results[dev] = metrics
    for key in ("train_accuracy", "test_accuracy", "n_support_vectors", "per_class_accuracy", "gamma_value"):
        assert results["gpu"][key] == results["cpu"][key], key
    assert results["cpu"]["n_support_vectors"] == models["cpu"].support_.size
    assert (tmp_path / "gpu" / "confusion.csv").read_text() == (tmp_path / "cpu" / "confusion.csv").read_text()
    assert 0.5 < results["gpu"]["test_accuracy"] < 1.0  # a non-trivial problem


@pytest.mark.parametrize("dev", ["cpu", "gpu"])
def test_precomputed_kernels_predict_as_svc_on_the_features(dev):
    """kernels() computes the training and the whole test-vs-train kernel before the fit (the borrowed GPU's work);
    fit and predict on them give SVC(kernel="rbf")'s support vectors and predictions."""
    from sklearn.metrics.pairwise import rbf_kernel
    from sklearn.svm import SVC

    from gpunn.svm import _PrecomputedRbfSVC

    x, y = _blobs(40, d=7, k=3, seed=3, spread=1.2)
    xt, _ = _blobs(19, d=7, k=3, seed=4, spread=1.2)
    xs, xts, gamma = _scaled(x, xt)
    model = _PrecomputedRbfSVC(10.0, gamma, dev, lambda msg: None)
    model.kernels(xs, xts)
    full = rbf_kernel(xts.astype(np.float64), xs.astype(np.float64), gamma=gamma)
    np.testing.assert_allclose(model.test_kernel, full, rtol=1e-12, atol=1e-14)
    model.fit(y)
    ref = SVC(kernel="rbf", C=10.0, gamma=gamma).fit(xs, y)
    assert 0 < model.support_.size < len(x)
    np.testing.assert_array_equal(model.support_, ref.support_)
    np.testing.assert_array_equal(model.predict(), ref.predict(xts))


def test_a_borrowed_gpu_is_held_while_the_kernels_are_computed_and_free_while_libsvm_runs(tmp_path, monkeypatch):
    """The pipeline's svm job borrows its GPU (gpunn.placement --borrow): run_svm waits for the GPU's lock while
    another job holds it, holds it for the kernels, and gives it back (its CUDA context closed) before the fit."""
    from gpunn import placement, svm

    monkeypatch.setenv("GPUNN_TIMING_LOCK", str(tmp_path / "gpunn-timing.lock"))
    monkeypatch.setenv("GPUNN_GPU_SLOT", "5")
    monkeypatch.setenv("GPUNN_GPU_BORROWED", "1")
    lock = str(tmp_path / "gpunn-gpu-5.lock")
    held_during = {}

    def probe(name, method):
        def wrapped(self, *args):
            fd = placement._try_lock(lock)
            held_during[name] = fd is None
            if fd is not None:
                os.close(fd)
            return method(self, *args)
        return wrapped

    monkeypatch.setattr(svm._PrecomputedRbfSVC, "kernels", probe("kernels", svm._PrecomputedRbfSVC.kernels))
    monkeypatch.setattr(svm._PrecomputedRbfSVC, "fit", probe("fit", svm._PrecomputedRbfSVC.fit))
    closed = []
    monkeypatch.setattr("numba.cuda.close", lambda: closed.append(True))
    other = placement._try_lock(lock)  # another GPU job holds the GPU when the svm job starts
    paths, _ = _tiny_problem(tmp_path)
    lines = []

    def log(line):  # the other job gives the GPU back once the svm job says it waits (no race with a timer)
        lines.append(line)
        if line.startswith("placement: waiting"):
            os.close(other)

    metrics = _run(paths, tmp_path / "out", kernel_device="gpu", log=log)
    assert held_during == {"kernels": True, "fit": False} and closed == [True]
    # the holder (taken by hand here, with no holder record) is named as far as it is known
    assert ("placement: waiting for 1 free GPU of 5 (0 of 1 free now; held by another process (not yet recorded))"
            in lines)
    assert "svm[exact]: GPU 5 given back; libsvm fits and predicts on the CPU" in lines
    assert metrics["kernel_device"] == "gpu" and metrics["fit_time_s"] >= metrics["kernel_time_s"]
    assert metrics["predict_time_s"] >= metrics["predict_kernel_time_s"] > 0


def test_kernel_device_choices(feature_files, tmp_path):
    from gpunn.device import simulator_enabled
    from gpunn.svm import resolve_kernel_device

    msg = _assert_fails(feature_files, tmp_path, "kernel_device", kernel_device="tpu")
    assert "auto, cpu, gpu" in msg and "'tpu'" in msg
    _assert_fails(feature_files, tmp_path, "kernel_device 'gpu'", kernel_device="gpu", method="nystroem")
    _assert_fails(feature_files, tmp_path, "kernel_device 'gpu'", kernel_device="gpu", precompute_kernel=False)
    assert resolve_kernel_device("cpu") == "cpu"
    assert resolve_kernel_device("auto") == ("cpu" if simulator_enabled() else "gpu")  # never the simulator
    metrics = _run(feature_files, tmp_path / "nys", method="nystroem", nystroem_components=50)
    assert metrics["kernel_device"] == "cpu" and metrics["kernel_time_s"] is None


def test_subset_runs_say_so(feature_files, tmp_path, monkeypatch):
    from gpunn.report.build import make_report

    lines = []
    metrics = _run(feature_files, tmp_path / "sub", train_subset=80, class_names=NAMES, log=lines.append)
    on_disk = json.loads((tmp_path / "sub" / "metrics.json").read_text())
    for m in (metrics, on_disk):
        assert m["subset"] is True and m["train_subset"] == 80 and m["n_train"] == 80 and m["n_train_total"] == 300
        assert m["test_subset"] is None and m["n_test_total"] == 120
    assert "svm[exact]: training on a stratified subset of 80 of 300 rows" in lines
    assert "trained on a stratified subset of 80 of 300 rows" in lines[-1]
    make_report("e6", tmp_path / "report", svm=[tmp_path / "sub"])
    title = (tmp_path / "report" / "summary.md").read_text().splitlines()[0]
    assert "80 train (a stratified subset of 300)" in title
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")  # a column per class, and a row per class below
    for name, accuracy in metrics["per_class_accuracy"].items():
        assert summary.loc[0, f"{name}_accuracy"] == pytest.approx(accuracy)
    assert re.search(rf"\| {NAMES[0]} +\| +{100 * metrics['per_class_accuracy'][NAMES[0]]:.2f} % \|",
                     (tmp_path / "report" / "summary.md").read_text())

    full = _run(feature_files, tmp_path / "all", train_subset=0)
    assert full["subset"] is False and full["train_subset"] is None and full["n_train"] == 300

    # auto: all rows at most AUTO_TRAIN_SUBSET; above it, without a GPU kernel, that many, with the reason
    lines = []
    auto = _run(feature_files, tmp_path / "auto", train_subset="auto", kernel_device="cpu", log=lines.append)
    assert auto["subset"] is False and any("train_subset auto: all 300 rows" in line for line in lines)
    monkeypatch.setattr("gpunn.svm.AUTO_TRAIN_SUBSET", 100)
    lines = []
    auto = _run(feature_files, tmp_path / "auto100", train_subset="auto", kernel_device="cpu", log=lines.append)
    assert auto["subset"] is True and auto["n_train"] == 100
    assert any("train_subset auto: 100 of 300 rows: no GPU computes the kernel here" in line for line in lines)
    _assert_fails(feature_files, tmp_path, "train_subset", train_subset="most")


def test_train_subset_auto_rule(monkeypatch):
    from gpunn import svm

    monkeypatch.setattr(svm, "_physical_memory_bytes", lambda: 128 << 30)
    assert svm.resolve_train_subset("auto", 50_000, "exact", "gpu", "auto")[0] is None  # 20 GB of 128 GB
    n, why = svm.resolve_train_subset("auto", 50_000, "exact", "cpu", "auto")
    assert n == 5000 and "kernel_device cpu" in why
    assert svm.resolve_train_subset("auto", 50_000, "nystroem", "cpu", "auto")[0] is None
    monkeypatch.setattr(svm, "_physical_memory_bytes", lambda: 24 << 30)
    n, why = svm.resolve_train_subset("auto", 50_000, "exact", "gpu", "auto")
    assert n == 5000 and "exceeds 40%" in why and "20.0 GB" in why
    assert svm.resolve_train_subset(1234, 50_000, "exact", "gpu", "auto") == (1234, None)
    assert svm.resolve_train_subset(0, 50_000, "exact", "cpu", "auto") == (None, None)


def test_cli_passes_the_kernel_device_and_auto_subset(feature_files, tmp_path, capsys):
    from gpunn import cli

    features = tmp_path / "features"
    features.mkdir()
    for key, name in (("train_x", "train_features"), ("train_y", "train_labels"), ("test_x", "test_features"),
                      ("test_y", "test_labels")):
        (features / f"{name}.npy").write_bytes(feature_files[key].read_bytes())
    assert cli.main(["svm", "--features", str(features), "--out", str(tmp_path / "out"), "--kernel-device", "cpu",
                     "--train-subset", "auto"]) in (None, 0)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["kernel_device"] == "cpu" and metrics["n_train"] == 300 and metrics["subset"] is False
    assert "train_subset auto: all 300 rows" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_route_at_e6_width(tmp_path):
    """4 000 x 8 192 standardised float32 features: the GPU kernel equals sklearn's to 1e-6, and the GPU route's
    SVM predicts exactly as the CPU BLAS route's."""
    from sklearn.metrics.pairwise import rbf_kernel

    from gpunn.rbf_kernel import rbf_kernel_gpu_into

    d, k = 8192, 10
    means = np.random.default_rng(7).normal(size=(k, d)).astype(np.float32) * 0.05
    rng = np.random.default_rng(8)
    y, yt = rng.integers(0, k, 4000), rng.integers(0, k, 1000)
    x = (means[y] + rng.normal(size=(4000, d)).astype(np.float32))
    xt = (means[yt] + rng.normal(size=(1000, d)).astype(np.float32))
    xs, xts, gamma = _scaled(x, xt)
    out = np.full((4000, 4000), np.nan)
    rbf_kernel_gpu_into(out, xs, None, gamma, block_rows=1024)
    ref = rbf_kernel(xs.astype(np.float64), gamma=gamma)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-6
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=0)

    paths = {}
    for key, arr in (("train_x", x), ("train_y", y), ("test_x", xt), ("test_y", yt)):
        paths[key] = tmp_path / f"{key}.npy"
        np.save(paths[key], arr)
    gpu = _run(paths, tmp_path / "gpu", kernel_device="gpu", train_subset=0)
    cpu = _run(paths, tmp_path / "cpu", kernel_device="cpu", train_subset=0)
    assert gpu["kernel_device"] == "gpu" and gpu["provenance"]["simulator"] is False
    for key in ("train_accuracy", "test_accuracy", "n_support_vectors", "per_class_accuracy"):
        assert gpu[key] == cpu[key], key
    assert (tmp_path / "gpu" / "confusion.csv").read_text() == (tmp_path / "cpu" / "confusion.csv").read_text()


@pytest.mark.gpu
def test_the_svm_job_borrows_a_real_gpu_and_gives_it_back(feature_files, tmp_path):
    """`gpunn.placement --gpu --borrow` then `gpunn svm --kernel-device gpu` on the real GPU, in a process of its own
    (it closes its CUDA context): the same predictions as the CPU route, and the GPU given back before the fit."""
    import subprocess
    import sys

    features = tmp_path / "features"
    features.mkdir()
    for key, name in (("train_x", "train_features"), ("train_y", "train_labels"), ("test_x", "test_features"),
                      ("test_y", "test_labels")):
        (features / f"{name}.npy").write_bytes(feature_files[key].read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNN_", "SLURM_", "CUDA_VISIBLE"))}
    env["GPUNN_TIMING_LOCK"] = str(tmp_path / "gpunn-timing.lock")
    outs = {}
    for device in ("gpu", "cpu"):
        outs[device] = tmp_path / device
        command = [sys.executable, "-m", "gpunn", "svm", "--features", str(features), "--out", str(outs[device]),
                   "--kernel-device", device, "--train-subset", "0"]
        if device == "gpu":
            command = [sys.executable, "-m", "gpunn.placement", "--gpu", "--borrow", "--slots", "0", "--timed",
                       "both", "--timing", "overlap", "--", *command]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if device == "gpu":
            assert "svm[exact]: GPU 0 given back; libsvm fits and predicts on the CPU" in done.stdout
    gpu, cpu = (json.loads((outs[d] / "metrics.json").read_text()) for d in ("gpu", "cpu"))
    assert gpu["kernel_device"] == "gpu" and gpu["provenance"]["gpu_slot"] == "0"
    assert gpu["provenance"]["device"] not in ("cpu", "unavailable")
    for key in ("train_accuracy", "test_accuracy", "n_support_vectors", "per_class_accuracy"):
        assert gpu[key] == cpu[key], key
