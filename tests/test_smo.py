"""The GPU SMO solver (gpunn.smo) against libsvm (SVC(kernel="precomputed") on the same float32 kernel values), under
the simulator on small problems: each binary problem's dual objective, the support vectors, the bias, the
predictions on every test point; and the edge cases: a class absent from training, duplicate points (some with
both labels), C at its bounds, a class of one sample, ties in the vote."""

import zlib

import numpy as np
import pytest
from numba import cuda
from sklearn.svm import SVC

from gpunn.errors import GpunnError
from gpunn.kernels.gemm.rbf import rbf_reference
from gpunn.smo import GpuSmo, one_vs_one, vote

OBJECTIVE_RTOL = 1e-3  # the bound on each binary problem's dual objective


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _blobs(rng, labels, d=5, spread=1.0):
    centers = _rng("centers", d).normal(size=(int(np.max(labels)) + 1, d)) * 1.3
    return centers[labels] + spread * rng.normal(size=(labels.size, d))


def _libsvm_objectives(svc, k, labels, problems):
    """Each binary problem's dual objective from SVC's dual coefficients (libsvm's one-vs-one layout)."""
    sv, coef = svc.support_, svc.dual_coef_
    cls = np.searchsorted(problems.classes, labels[sv])
    out = []
    for a, b in problems.pairs:
        ia, ib = np.flatnonzero(cls == a), np.flatnonzero(cls == b)
        rows = np.concatenate([sv[ia], sv[ib]])
        c = np.concatenate([coef[b - 1, ia], coef[a, ib]])
        out.append(0.5 * c @ k[np.ix_(rows, rows)] @ c - np.abs(c).sum())
    return np.array(out)


def _fit_both(x, labels, xt, C, gamma, q=16, selection="host"):
    k32 = rbf_reference(x, x, gamma).astype(np.float32)
    kt32 = rbf_reference(x, xt, gamma).astype(np.float32)  # (training rows, test points)
    k = k32.astype(np.float64)
    svc = SVC(kernel="precomputed", C=C).fit(k, labels)
    model = GpuSmo(C, q=q, log=lambda line: None, selection=selection).fit(cuda.to_device(k32), labels)
    return svc, model, k, kt32


def _check_against_libsvm(svc, model, k, kt32, labels, same=None):
    """`same`: each training row's first identical copy (duplicates share a multiplier between them in any split:
    the support vectors are compared as those copies)."""
    problems = model.problems_
    np.testing.assert_array_equal(model.classes_, svc.classes_)
    want = _libsvm_objectives(svc, k, labels, problems)
    np.testing.assert_allclose(model.objective_, want, rtol=OBJECTIVE_RTOL)
    pred = model.predict(cuda.to_device(kt32))
    np.testing.assert_array_equal(pred, svc.predict(kt32.T.astype(np.float64)))
    np.testing.assert_array_equal(model.predict(cuda.to_device(k.astype(np.float32))), svc.predict(k))
    # the support vectors agree up to the tolerance: a clear one in either solution is one in the other
    same = np.arange(k.shape[0]) if same is None else same
    clear = 0.05 * np.abs(svc.dual_coef_).max()  # clear of the stopping tolerance's slack
    ours = set(same[model.sv_rows_[np.abs(model.sv_coef_) > clear]].tolist())
    theirs = set(same[svc.support_[np.abs(svc.dual_coef_).max(axis=0) > clear]].tolist())
    assert ours <= set(same[svc.support_].tolist()) and theirs <= set(same[model.support_].tolist())
    assert len(ours) >= 3


@pytest.mark.parametrize("selection", ["host", "gpu"])
def test_three_classes_match_libsvm_over_several_rounds(selection):
    """Either selection of the working sets (the host's, or the selection kernel's: the same sets)."""
    rng = _rng("three")
    labels = rng.integers(0, 3, 61)
    x, xt = _blobs(rng, labels), _blobs(rng, rng.integers(0, 3, 29))
    svc, model, k, kt32 = _fit_both(x, labels, xt, C=3.0, gamma=0.2, q=8, selection=selection)
    assert model.rounds_.max() >= 3  # working sets of 8 out of ~40 points: the rounds' bookkeeping ran
    _check_against_libsvm(svc, model, k, kt32, labels)
    np.testing.assert_allclose(model.rho_, -svc.intercept_, atol=5e-3)


def test_a_class_absent_from_training_and_one_of_one_sample():
    """Labels 0, 2 and 5 in training (1, 3, 4 absent; 5 has one sample), test points of every class: the classes
    are the trained ones, the predictions libsvm's."""
    rng = _rng("absent")
    labels = np.concatenate([np.zeros(14, int), np.full(11, 2), [5]])
    rng.shuffle(labels)
    x = _blobs(rng, labels)
    xt = _blobs(rng, np.arange(25) % 6)
    svc, model, k, kt32 = _fit_both(x, labels, xt, C=2.0, gamma=0.3)
    np.testing.assert_array_equal(model.classes_, [0, 2, 5])
    _check_against_libsvm(svc, model, k, kt32, labels)


def test_duplicate_points_with_one_and_both_labels():
    rng = _rng("duplicates")
    labels = rng.integers(0, 2, 24)
    x = _blobs(rng, labels, spread=1.5)
    x = np.vstack([x, x[:5], x[5:8]])  # five repeated with their label, three with the other
    labels = np.concatenate([labels, labels[:5], 1 - labels[5:8]])
    same = np.concatenate([np.arange(24), np.arange(8)])
    xt = _blobs(rng, rng.integers(0, 2, 17))
    svc, model, k, kt32 = _fit_both(x, labels, xt, C=1.0, gamma=0.25)
    _check_against_libsvm(svc, model, k, kt32, labels, same)


@pytest.mark.parametrize("C", [1e-3, 1e3], ids=["every_alpha_at_C", "hard_margin"])
def test_C_at_its_bounds(C):
    rng = _rng("bounds", C)
    labels = rng.integers(0, 3, 40)
    x, xt = _blobs(rng, labels, spread=0.8), _blobs(rng, rng.integers(0, 3, 15), spread=0.8)
    svc, model, k, kt32 = _fit_both(x, labels, xt, C=C, gamma=0.2)
    _check_against_libsvm(svc, model, k, kt32, labels)
    if C < 1:  # every multiplier at C: the bias is the middle of its bounds (no free vector)
        assert np.all(np.isclose(model.alpha_, C) | (model.alpha_ == 0))
        assert np.mean(np.isclose(model.alpha_, C)) > 0.9


def test_votes_tie_to_the_lowest_class():
    problems = one_vs_one(np.array([4, 7, 9, 4]))
    assert problems.pairs == ((0, 1), (0, 2), (1, 2))
    dec = np.array([[1.0, -1.0, 1.0],    # 4, 9, 7: one vote each -> 4
                    [-1.0, -1.0, 1.0],   # 7, 9, 7 -> 7
                    [-1.0, 0.0, -1.0]])  # 7, 9 (a zero votes for the second class), 9 -> 9
    np.testing.assert_array_equal(vote(dec, problems), [4, 7, 9])


def test_bad_settings_are_one_line_errors():
    with pytest.raises(GpunnError, match="C must be positive"):
        GpuSmo(0.0)
    with pytest.raises(GpunnError, match="power of two from 2 to 1024"):
        GpuSmo(1.0, q=48)
    with pytest.raises(GpunnError, match="selection must be one of gpu, host"):
        GpuSmo(1.0, selection="cpu")
    with pytest.raises(GpunnError, match="at least two"):
        one_vs_one(np.zeros(5, int))


@pytest.mark.gpu
@pytest.mark.parametrize("selection", ["host", "gpu"])
def test_gpu_ten_classes_with_full_working_sets_match_libsvm(selection):
    """On a GPU, SVC's setting at a small E6-like size: ten classes of 300 points in 256 dimensions, C = 10, the
    default working set of 512: every pair's dual objective within 1e-3 of libsvm's, the same test predictions."""
    from gpunn.device import simulator_enabled

    if simulator_enabled():
        pytest.skip("needs a real GPU, not the CUDA simulator")
    rng = _rng("gpu ten")
    labels = np.arange(3000) % 10
    x = _blobs(rng, labels, d=256, spread=8.0)  # libsvm's test accuracy here: 77.2 %
    xt = _blobs(rng, np.arange(1000) % 10, d=256, spread=8.0)
    gamma = 1.0 / (256 * x.var())
    k32 = rbf_reference(x, x, gamma).astype(np.float32)
    kt32 = rbf_reference(x, xt, gamma).astype(np.float32)
    k = k32.astype(np.float64)
    svc = SVC(kernel="precomputed", C=10.0).fit(k, labels)
    model = GpuSmo(10.0, log=lambda line: None, selection=selection).fit(cuda.to_device(k32), labels)
    assert model.q_ == 512
    np.testing.assert_allclose(model.objective_, _libsvm_objectives(svc, k, labels, model.problems_), rtol=1e-3)
    pred, want = model.predict(cuda.to_device(kt32)), svc.predict(kt32.T.astype(np.float64))
    assert np.mean(pred == want) >= 0.999
    assert 0.3 < np.mean(want == np.arange(1000) % 10) < 0.99  # neither trivial nor hopeless: the test can fail


def _feature_files(tmp_path, rng):
    labels, test_labels = np.arange(80) % 4, np.arange(36) % 4
    arrays = {"train_x": _blobs(rng, labels, d=12, spread=1.6).astype(np.float32), "train_y": labels,
              "test_x": _blobs(rng, test_labels, d=12, spread=1.6).astype(np.float32), "test_y": test_labels}
    paths = {}
    for name, arr in arrays.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], arr)
    return paths


def _run_svm(paths, out, **kw):
    from gpunn.svm import run_svm

    return run_svm(paths["train_x"], paths["train_y"], paths["test_x"], paths["test_y"], out,
                   log=kw.pop("log", lambda line: None), **kw)


def test_svm_method_gpu_smo_gives_libsvm_s_results(tmp_path, monkeypatch):
    """run_svm's gpu-smo route (the simulator's GPU here) against its exact route on the same features: the same
    accuracies and confusion matrix, its kernel, fit and predict times, its support vectors counted. Its training
    kernel in three row blocks (from the diagonal on, then mirrored)."""
    monkeypatch.setattr("gpunn.smo.KERNEL_BLOCK_ROWS", 32)
    paths = _feature_files(tmp_path, _rng("route"))
    lines = []
    smo_metrics = _run_svm(paths, tmp_path / "smo", method="gpu-smo", log=lines.append)
    exact = _run_svm(paths, tmp_path / "exact", method="exact", kernel_device="cpu")
    assert smo_metrics["method"] == "gpu-smo" and smo_metrics["approximate"] is False
    assert smo_metrics["kernel_device"] == "gpu" and smo_metrics["provenance"]["device"] == "cuda-simulator"
    for key in ("train_accuracy", "test_accuracy", "per_class_accuracy", "gamma_value"):
        assert smo_metrics[key] == exact[key], key
    assert (tmp_path / "smo" / "confusion.csv").read_text() == (tmp_path / "exact" / "confusion.csv").read_text()
    assert 0.5 < smo_metrics["test_accuracy"] < 1.0
    assert smo_metrics["fit_time_s"] >= smo_metrics["kernel_time_s"] > 0
    assert smo_metrics["predict_time_s"] >= smo_metrics["predict_kernel_time_s"] > 0
    assert abs(smo_metrics["n_support_vectors"] - exact["n_support_vectors"]) <= 0.05 * exact["n_support_vectors"]
    assert any("6 binary problems solved in" in line for line in lines)


@pytest.mark.parametrize("classes, size, rows", [(3, 12, 30), pytest.param(10, 300, 1500, marks=pytest.mark.gpu)])
def test_a_kernel_row_cache_takes_the_same_steps_as_the_whole_matrix(classes, size, rows):
    """GpuSmoRoute with a cache of `rows` kernel rows (here 30: three problems of 24 points whose working sets need
    all 36 rows a round; on a GPU 1 500 of 3 000 with working sets of 512: the problems go in groups, rows are
    evicted and computed again) against the route that keeps the whole matrix: the same multipliers and
    predictions; its predictions made a block of points at a time."""
    from gpunn.smo import GpuSmoRoute

    rng = _rng("cache", classes)
    labels = np.repeat(np.arange(classes), size)
    n, m = labels.size, 23 if classes == 3 else 4099
    x = rng.normal(size=(n, 5)) + labels[:, None] * 0.8
    xt = rng.normal(size=(m, 5)) + np.arange(m)[:, None] % classes * 0.8
    routes = {}
    for name, cache_rows in (("whole", None), ("cache", rows)):
        routes[name] = route = GpuSmoRoute(3.0, 0.2, lambda line: None, labels=labels, cache_rows=cache_rows)
        route.kernels(x, xt)
        route.train_pred, route.test_pred = route.fit(labels), route.predict()
    whole, cache = routes["whole"], routes["cache"]
    assert cache.cached and not whole.cached and cache.model.rows_computed_ > n and whole.model.rows_computed_ == 0
    np.testing.assert_allclose(cache.model.alpha_, whole.model.alpha_, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(cache.model.rounds_, whole.model.rounds_)
    np.testing.assert_array_equal(cache.train_pred, whole.train_pred)
    np.testing.assert_array_equal(cache.test_pred, whole.test_pred)
    assert whole.model.rounds_.max() > 2 and 0.5 < np.mean(whole.test_pred == np.arange(m) % classes) < 1.0
    with pytest.raises(GpunnError, match="a cache of 20 kernel rows .* do not fit"):
        GpuSmoRoute(3.0, 0.2, lambda line: None, labels=labels, cache_rows=20).kernels(x, xt)


def test_svm_method_gpu_smo_refuses_bad_settings_in_one_line(tmp_path):
    paths = _feature_files(tmp_path, _rng("route bad"))
    out = tmp_path / "never"
    with pytest.raises(GpunnError) as err:
        _run_svm(paths, out, method="gpu-smo", kernel_device="cpu")
    assert "kernel_device cpu does not apply" in str(err.value) and "\n" not in str(err.value)
    x = np.load(paths["train_x"])
    x[3, 5] = np.nan
    np.save(paths["train_x"], x)
    with pytest.raises(GpunnError) as err:
        _run_svm(paths, out, method="gpu-smo")
    assert "NaN or inf" in str(err.value) and str(paths["train_x"]) in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_a_rounds_selection_equals_the_problem_by_problem_one():
    """select_round (every active problem at once) against gap() and select_working_set() one problem at a time, on
    states with many tied values (as the first rounds have), multipliers at both bounds, problems of other sizes,
    a converged problem and one whose low side is empty; and _smallest against a stable sort."""
    from gpunn.smo import gap, select_round, select_working_set

    rng = _rng("rounds")
    problems = one_vs_one(np.repeat([0, 1, 2, 3], [40, 23, 9, 31]))
    n, c, q, eps = problems.points.size, 2.0, 16, 1e-3
    alpha = rng.choice([0.0, c, 0.7], n)
    grad = rng.choice([-1.0, -0.5, 0.25], n) + (rng.random(n) < 0.3) * rng.normal(size=n)
    y = problems.y
    s1, e1 = problems.offsets[1], problems.offsets[2]
    grad[s1:e1], alpha[s1:e1] = -y[s1:e1] * 0.5, 0.7  # problem 1: every -y g equal, converged
    s4, e4 = problems.offsets[4], problems.offsets[5]
    alpha[s4:e4] = np.where(y[s4:e4] > 0, 0.0, c)  # problem 4: the low side empty
    active = [0, 1, 2, 4, 5]
    still, sets = select_round(y, alpha, grad, c, problems.offsets, active, q, eps)
    want = [p for p in active
            if gap(y[problems.offsets[p]:problems.offsets[p + 1]], alpha[problems.offsets[p]:problems.offsets[p + 1]],
                   grad[problems.offsets[p]:problems.offsets[p + 1]], c) >= eps]
    assert still == want and 1 not in still and 4 not in still and len(still) == 3
    for p, got in zip(still, sets):
        s, e = problems.offsets[p], problems.offsets[p + 1]
        np.testing.assert_array_equal(got, s + select_working_set(y[s:e], alpha[s:e], grad[s:e], c, q))
        assert len(set(got.tolist())) == got.size == min(q, e - s)
    # the next round keeps each set's first half, at its end, and takes the fresh part from the other points
    grad = grad + 0.1 * rng.normal(size=n)
    again, sets2 = select_round(y, alpha, grad, c, problems.offsets, still, q, eps, dict(zip(still, sets)))
    for p, got, last in zip(again, sets2, sets):
        s, e = problems.offsets[p], problems.offsets[p + 1]
        kept = last[:q // 2]
        np.testing.assert_array_equal(got, s + select_working_set(y[s:e], alpha[s:e], grad[s:e], c, q, kept - s))
        np.testing.assert_array_equal(got[got.size - kept.size:], kept)
        assert len(set(got.tolist())) == got.size == min(q, e - s)

    from gpunn.smo import _smallest

    values = rng.choice([3.0, 1.0, 2.0, np.inf], 57)
    for k in (1, 5, 20, 57):
        stable = np.argsort(values, kind="stable")
        np.testing.assert_array_equal(_smallest(values, k), stable[:k][np.isfinite(values[stable[:k]])])


def test_warm_up_launches_on_a_two_point_problem_and_leaves_no_state():
    """warm_up runs each kernel once (their compilation outside a timed fit); a fit after it is the same."""
    rng = _rng("warm")
    labels = rng.integers(0, 2, 20)
    x = _blobs(rng, labels)
    k32 = rbf_reference(x, x, 0.2).astype(np.float32)
    solver = GpuSmo(1.0, q=8, log=lambda line: None)
    solver.warm_up()
    first = solver.fit(cuda.to_device(k32), labels).alpha_.copy()
    np.testing.assert_array_equal(GpuSmo(1.0, q=8, log=lambda line: None).fit(cuda.to_device(k32), labels).alpha_,
                                  first)
    assert solver.width(one_vs_one(labels)) == 8
