"""E6 SVM stage on small synthetic features: accuracy, output consistency, stratified subsets, bad inputs."""

from __future__ import annotations

import json

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
    for name in ("metrics.json", "per_class.csv", "confusion.csv", "confusion.png"):
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
    _assert_fails(feature_files, tmp_path, str(feature_files["train_y"]))


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
    from sklearn.svm import SVC
    from sklearn.preprocessing import StandardScaler

    from gpunn.svm import rbf_kernel_into

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
    from gpunn.svm import rbf_kernel_into

    rng = np.random.default_rng(0)
    a = rng.normal(size=(23, 9)).astype(np.float32)
    b = rng.normal(size=(11, 9)).astype(np.float32)
    g = 0.07

    def direct(p, q):
        return np.exp(-g * ((p[:, None, :].astype(np.float64) - q[None, :, :]) ** 2).sum(-1))

    np.testing.assert_allclose(rbf_kernel_into(np.empty((23, 11)), a, b, g, block=5), direct(a, b), rtol=1e-12)
    k = rbf_kernel_into(np.empty((23, 23)), a, None, g, block=4)  # blocks that do not divide n
    np.testing.assert_allclose(k, direct(a, a), rtol=1e-12)
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
