"""The SMO kernels (gpunn.kernels.smo) against their float64 NumPy references, under the simulator at tiny odd shapes:
two problems of odd sizes side by side, working sets shorter than the block and full, mid-solve states with
multipliers at both bounds and free, outputs poisoned with NaN before each launch."""

import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import smo
from gpunn.kernels.gemm.rbf import rbf_reference

C = 1.5
EPS = 1e-3


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _state(rng, sizes=(13, 9), n_rows=25):
    """Two problems over a shuffled kernel of n_rows points: rows, y, a mid-solve alpha (zeros, C's and free values)
    and its exact gradient Q alpha - 1, and the float32 kernel."""
    x = rng.normal(size=(n_rows, 4))
    k = rbf_reference(x, x, 0.3).astype(np.float32)
    total = sum(sizes)
    rows = rng.choice(n_rows, total, replace=False).astype(np.int32)
    y = np.where(rng.random(total) < 0.5, 1.0, -1.0)
    alpha = rng.choice([0.0, C, 0.4, 1.1], total)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    grad = np.empty(total)
    for s, e in zip(offsets[:-1], offsets[1:]):
        q = y[s:e, None] * y[None, s:e] * k[np.ix_(rows[s:e], rows[s:e])].astype(np.float64)
        grad[s:e] = q @ alpha[s:e] - 1.0
    return k, rows, y, alpha, grad, offsets


def _working_sets(rng, offsets, q, counts):
    ws = np.zeros((len(counts), q), dtype=np.int32)
    for p, count in enumerate(counts):
        ws[p, :count] = offsets[p] + rng.choice(offsets[p + 1] - offsets[p], count, replace=False)
    return ws, np.asarray(counts, dtype=np.int32)


def _dev(*arrays):
    return [cuda.to_device(a) for a in arrays]


def _shuffled(rng, k):
    """k's rows in a shuffled cache and the slot map that finds them (cache[slot[r]] == k[r])."""
    perm = rng.permutation(k.shape[0])
    return np.ascontiguousarray(k[perm]), np.argsort(perm).astype(np.int32)


def _identity(k):
    return np.arange(k.shape[1], dtype=np.int32)


@pytest.mark.parametrize("counts", [(8, 5), (3, 8)], ids=["full_and_short", "short_and_full"])
def test_local_smo_equals_its_reference(counts):
    rng = _rng("local", counts)
    k, rows, y, alpha, grad, offsets = _state(rng)
    ws, ws_count = _working_sets(rng, offsets, 8, counts)
    cache, slot = _shuffled(rng, k)  # the rows read through a slot map, as from gpunn.smo_rows.RowCache
    want_alpha, want_delta = smo.local_smo_ref(cache, rows, slot, y, alpha, grad, ws, ws_count, C, EPS)
    whole = smo.local_smo_ref(k, rows, _identity(k), y, alpha, grad, ws, ws_count, C, EPS)
    np.testing.assert_array_equal(whole[0], want_alpha)
    d_k, d_rows, d_slot, d_y, d_alpha, d_grad, d_ws, d_count = _dev(cache, rows, slot, y, alpha, grad, ws, ws_count)
    d_delta = cuda.to_device(np.full(ws.shape, np.nan))
    smo.local_smo(d_k, d_rows, d_slot, d_y, d_alpha, d_grad, d_ws, d_count, C, EPS, d_delta)
    got_alpha, got_delta = d_alpha.copy_to_host(), d_delta.copy_to_host()
    assert np.array_equal(d_grad.copy_to_host(), grad)  # read, not written
    for p, count in enumerate(counts):
        assert np.isfinite(got_delta[p, :count]).all()
        np.testing.assert_allclose(got_delta[p, :count], want_delta[p, :count], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_alpha, want_alpha, rtol=0, atol=1e-12)
    assert np.abs(want_delta).max() > 0.1  # the steps moved: the comparison is not of two untouched states
    assert (got_alpha >= 0).all() and (got_alpha <= C).all()
    for p in range(len(counts)):  # each step keeps y'alpha: the working set's changes sum to zero along y
        pts = ws[p, :counts[p]]
        assert abs(y[pts] @ got_delta[p, :counts[p]]) < 1e-12


def test_local_smo_duplicate_points_take_libsvm_floor():
    """Two identical points of opposite labels: their second derivative is 0, the step divides by TAU, and the
    clipping keeps the multipliers in the box (no inf, no NaN)."""
    k = np.ones((2, 2), dtype=np.float32)
    rows, y = np.array([0, 1], np.int32), np.array([1.0, -1.0])
    alpha, grad = np.zeros(2), -np.ones(2)
    ws, ws_count = np.array([[0, 1]], np.int32), np.array([2], np.int32)
    want_alpha, _ = smo.local_smo_ref(k, rows, rows, y, alpha, grad, ws, ws_count, C, EPS)
    d = _dev(k, rows, rows, y, alpha, grad, ws, ws_count)
    d_delta = cuda.to_device(np.full((1, 2), np.nan))
    smo.local_smo(*d, C, EPS, d_delta)
    np.testing.assert_array_equal(d[4].copy_to_host(), want_alpha)
    np.testing.assert_array_equal(want_alpha, [C, C])


def test_update_grad_equals_its_reference():
    rng = _rng("grad")
    k, rows, y, alpha, grad, offsets = _state(rng)
    ws, ws_count = _working_sets(rng, offsets, 8, (7, 8))
    delta = rng.normal(size=ws.shape) * (rng.random(ws.shape) < 0.6)  # zeros are skipped
    starts, stops = offsets[:-1].astype(np.int32), offsets[1:].astype(np.int32)
    cache, slot = _shuffled(rng, k)
    want = smo.update_grad_ref(cache, rows, slot, y, grad, starts, stops, ws, ws_count, delta)
    np.testing.assert_array_equal(smo.update_grad_ref(k, rows, _identity(k), y, grad, starts, stops, ws, ws_count,
                                                      delta), want)
    d_k, d_rows, d_slot, d_y, d_grad, d_starts, d_stops, d_ws, d_count, d_delta = _dev(
        cache, rows, slot, y, grad, starts, stops, ws, ws_count, delta)
    smo.update_grad(d_k, d_rows, d_slot, d_y, d_grad, d_starts, d_stops, int((stops - starts).max()), d_ws, d_count,
                    d_delta)
    got = d_grad.copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    assert np.abs(got - grad).max() > 0.1


def test_decision_equals_its_reference():
    rng = _rng("decision")
    k = rng.random((11, 37)).astype(np.float32)  # (kernel rows, points): 37 points over a block of 128 threads
    sv_rows = rng.integers(0, 11, 9).astype(np.int32)
    sv_coef = rng.normal(size=9)
    sv_offsets = np.array([0, 4, 4, 9], np.int32)  # the middle classifier has no support vectors
    rho = rng.normal(size=3)
    want = smo.decision_ref(k, sv_rows, sv_coef, sv_offsets, rho)
    d_dec = cuda.to_device(np.full((37, 3), np.nan))
    smo.decision(*_dev(k, sv_rows, sv_coef, sv_offsets, rho), d_dec)
    got = d_dec.copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(got[:, 1], -rho[1])


def test_bad_working_set_shapes_are_refused():
    k, rows, y, alpha, grad, _ = _state(_rng("bad"))
    d = _dev(k, rows, _identity(k), y, alpha, grad)
    ws = cuda.to_device(np.zeros((2, 6), np.int32))  # width not a power of two
    with pytest.raises(ValueError, match="power-of-two width"):
        smo.local_smo(*d, ws, cuda.to_device(np.array([6, 6], np.int32)), C, EPS,
                      cuda.device_array((2, 6), np.float64))
    with pytest.raises(ValueError, match="alpha must be float64"):
        smo.local_smo(d[0], d[1], d[2], d[3], cuda.to_device(alpha.astype(np.float32)), d[5], ws,
                      cuda.to_device(np.array([6, 6], np.int32)), C, EPS, cuda.device_array((2, 6), np.float64))
    with pytest.raises(ValueError, match="slot needs one entry a training point"):
        smo.local_smo(d[0], d[1], d[2][:5], *d[3:], ws, cuda.to_device(np.array([6, 6], np.int32)), C, EPS,
                      cuda.device_array((2, 6), np.float64))


@pytest.mark.parametrize("labels", [(1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0)])
def test_pair_step_minimises_the_pair_objective_on_its_segment(labels):
    """The analytic step against a brute-force search: along the line that keeps y_i a_i + y_j a_j, inside the box,
    no point has a lower two-variable dual objective (libsvm's Q_ij = y_i y_j K_ij, gradient g = Q a - 1)."""
    yi, yj = labels
    rng = _rng("pair", labels)
    for _ in range(40):
        x = rng.normal(size=(2, 3))
        kk = rbf_reference(x, x, rng.uniform(0.05, 2.0))
        q = np.outer([yi, yj], [yi, yj]) * kk
        a = rng.choice([0.0, C, rng.uniform(0, C)], 2)
        g = q @ a - 1.0 + rng.normal(size=2)  # the other points' share of the gradient: any offset
        lin = g - q @ a  # the objective 1/2 b'Qb + lin'b has gradient g at b = a

        def objective(b, q=q, lin=lin):
            return 0.5 * b @ q @ b + lin @ b

        ai, aj = smo.pair_step(yi, yj, a[0], a[1], g[0], g[1], kk[0, 0], kk[1, 1], kk[0, 1], C)
        assert 0 <= ai <= C and 0 <= aj <= C
        assert yi * ai + yj * aj == pytest.approx(yi * a[0] + yj * a[1], abs=1e-12)
        # the segment: a + t (yi, -yj) keeps the constraint
        t = np.linspace(-2 * C, 2 * C, 4001)
        cand = a[None, :] + t[:, None] * np.array([yi, -yj])[None, :]
        inside = cand[((cand >= 0) & (cand <= C)).all(axis=1)]
        best = min(objective(b) for b in inside)
        assert objective(np.array([ai, aj])) <= best + 1e-9


def test_select_working_sets_equals_the_host_rounds_selection():
    """The selection kernel (a block of 16 threads here) against gpunn.smo.select_round on the same state: the same
    problems stay, the same gaps, and each working set the same points (the kernel writes each part in position
    order, the host by value); states with many ties (the first rounds'), both bounds, a converged problem, one
    whose low side is empty, problems shorter and longer than the block."""
    _check_selection([40, 23, 9, 31], q=16, threads=16)


@pytest.mark.gpu
def test_select_working_sets_at_e6_sizes_on_the_gpu():
    """The same checks with the GPU's block (smo.SELECT_THREADS) and working sets of 512, problems of up to 10 000
    points (E6's) and one shorter than the block."""
    _check_selection([5003, 4999, 7, 3001], q=512, threads=None)


def _check_selection(class_sizes, q, threads):
    from gpunn.smo import one_vs_one, select_round

    rng = _rng("select", q)
    problems = one_vs_one(np.repeat([0, 1, 2, 3], class_sizes))
    n = problems.points.size
    y = problems.y
    alpha = rng.choice([0.0, C, 0.7], n)
    grad = rng.choice([-1.0, -0.5, 0.25], n) + (rng.random(n) < 0.3) * rng.normal(size=n)
    s1, e1 = problems.offsets[1], problems.offsets[2]
    grad[s1:e1], alpha[s1:e1] = -y[s1:e1] * 0.5, 0.7  # converged: every -y g equal
    s4, e4 = problems.offsets[4], problems.offsets[5]
    alpha[s4:e4] = np.where(y[s4:e4] > 0, 0.0, C)  # the low side empty
    grad[:12] = -1.0  # a run of exact ties
    active = [0, 1, 2, 3, 4, 5]  # a row each, in problem order
    starts, stops = problems.offsets[:-1].astype(np.int32), problems.offsets[1:].astype(np.int32)
    d_marks = cuda.to_device(np.zeros(n, np.int32))
    prev_ws, prev_count = np.zeros((len(active), q), np.int32), np.zeros(len(active), np.int32)
    previous = None
    for turn in range(2):  # a first round (nothing kept), then one that keeps half of its sets on a moved state
        still, sets = select_round(y, alpha, grad, C, problems.offsets, active, q, EPS, previous)
        d_ws = cuda.to_device(np.full((len(active), q), -1, np.int32))
        d_count = cuda.to_device(np.full(len(active), -1, np.int32))
        d_gaps = cuda.to_device(np.full(len(active), np.nan))
        smo.select_working_sets(*_dev(y, alpha, grad), d_marks, *_dev(starts, stops), C, EPS, q, d_ws, d_count,
                                d_gaps, *_dev(prev_ws, prev_count), threads=threads)
        ws, count, gaps = d_ws.copy_to_host(), d_count.copy_to_host(), d_gaps.copy_to_host()
        assert not d_marks.copy_to_host().any()  # zero again
        assert [p for p in active if count[p] > 0] == still and len(still) >= 3
        for p in active:
            s, e = problems.offsets[p], problems.offsets[p + 1]
            f = -y[s:e] * grad[s:e]
            up = ((y[s:e] > 0) & (alpha[s:e] < C)) | ((y[s:e] < 0) & (alpha[s:e] > 0))
            low = ((y[s:e] > 0) & (alpha[s:e] > 0)) | ((y[s:e] < 0) & (alpha[s:e] < C))
            want_gap = (f[up].max() if up.any() else -np.inf) - (f[low].min() if low.any() else np.inf)
            assert gaps[p] == want_gap or (np.isneginf(want_gap) and gaps[p] < EPS)
        for p, got in zip(still, sets):  # the same points in the same order
            np.testing.assert_array_equal(ws[p, :count[p]], got)
            assert len(set(got.tolist())) == got.size
            if turn:
                kept = previous[p][:q // 2]
                np.testing.assert_array_equal(got[got.size - kept.size:], kept)
        previous, prev_ws, prev_count = dict(zip(still, sets)), ws, np.maximum(count, 0)
        grad = grad + 0.1 * rng.normal(size=n) * (rng.random(n) < 0.5)  # the next round's state
        grad[s1:e1] = -y[s1:e1] * 0.5
