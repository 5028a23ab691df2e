"""gpunn.nn.functional against direct (loop) references, dtype preservation and input validation."""

import numpy as np
import pytest

from gpunn.nn import functional as F


def naive_conv2d(x, w, b, padding):
    n, cin, h, wd = x.shape
    cout, _, k, _ = w.shape
    xp = np.zeros((n, cin, h + 2 * padding, wd + 2 * padding), dtype=np.float64)
    xp[:, :, padding : padding + h, padding : padding + wd] = x
    ho, wo = h + 2 * padding - k + 1, wd + 2 * padding - k + 1
    y = np.zeros((n, cout, ho, wo))
    for s in range(n):
        for o in range(cout):
            for i in range(ho):
                for j in range(wo):
                    acc = b[o]
                    for c in range(cin):
                        for di in range(k):
                            for dj in range(k):
                                acc += w[o, c, di, dj] * xp[s, c, i + di, j + dj]
                    y[s, o, i, j] = acc
    return y


@pytest.mark.parametrize("k,padding", [(3, 0), (3, 1), (1, 0), (5, 2), (5, 1)])
def test_conv2d_forward_matches_naive_loops(k, padding):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((5, 3, k, k))
    b = rng.standard_normal(5)
    y, _ = F.conv2d_forward(x, w, b, padding)
    ref = naive_conv2d(x, w, b, padding)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    assert y.flags.c_contiguous


# dx's two routes: the scatter (cout >= cin) and the gather (cout < cin), with padding 0, k // 2 and >= k (a gather
# that crops dy instead of padding it)
@pytest.mark.parametrize("cin, cout, k", [(3, 4, 3), (5, 2, 3), (4, 3, 2)])
def test_conv2d_backward_matches_naive_scatter(cin, cout, k):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, cin, 5, 7))
    w = rng.standard_normal((cout, cin, k, k))
    b = rng.standard_normal(cout)
    for padding in (0, k // 2, k + 1):
        y, cache = F.conv2d_forward(x, w, b, padding)
        dy = rng.standard_normal(y.shape)
        dx, dw, db = F.conv2d_backward(dy, cache)
        # direct reference: every product w * xpad[...] in the forward sends dy back to both factors
        xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        dxp = np.zeros_like(xp)
        dw_ref = np.zeros_like(w)
        n, cout, ho, wo = y.shape
        for s in range(n):
            for o in range(cout):
                for i in range(ho):
                    for j in range(wo):
                        dxp[s, :, i : i + k, j : j + k] += w[o] * dy[s, o, i, j]
                        dw_ref[o] += xp[s, :, i : i + k, j : j + k] * dy[s, o, i, j]
        dx_ref = dxp[:, :, padding : padding + 5, padding : padding + 7]
        np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dw, dw_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-12)
        # a first layer's backward (input_grad False) skips dx, its dw and db the same bits
        none, dw_only, db_only = F.conv2d_backward(dy, cache, input_grad=False)
        assert none is None and np.array_equal(dw_only, dw) and np.array_equal(db_only, db)


def test_batch_chunks_cover_the_batch_within_the_budget():
    assert F.batch_chunks(10, 100, budget=300) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert F.batch_chunks(5, 1000, budget=300) == [(i, i + 1) for i in range(5)]  # one sample at least
    assert F.batch_chunks(64, 10, budget=10**6) == [(0, 64)]


def test_a_batch_convolved_in_chunks_gives_the_whole_batchs_gradients(monkeypatch):
    """Over IM2COL_BUDGET a batch is convolved in chunks of samples: the same outputs, dw and db summed over the
    chunks, dx per chunk (both routes), against the one-chunk result in float64."""
    rng = np.random.default_rng(5)
    for cin, cout in ((2, 3), (4, 2)):
        x = rng.standard_normal((5, cin, 6, 5))
        w = rng.standard_normal((cout, cin, 3, 3))
        b = rng.standard_normal(cout)
        y, cache = F.conv2d_forward(x, w, b, 1)
        dy = rng.standard_normal(y.shape)
        whole = F.conv2d_backward(dy, cache)
        per_sample = cin * 9 * 6 * 5 * 8
        monkeypatch.setattr(F, "IM2COL_BUDGET", 2 * per_sample)  # chunks of 2, 2, 1 samples
        y_chunked, cache = F.conv2d_forward(x, w, b, 1)
        np.testing.assert_allclose(y_chunked, y, rtol=1e-13, atol=1e-13)
        for got, want in zip(F.conv2d_backward(dy, cache), whole):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        monkeypatch.undo()


def _every_op(rng):
    """Outputs of every sample-parallel op at odd shapes (float32): both routes of dx, padding, a chunked batch,
    a non-contiguous dy, odd pooling sizes."""
    outs = []
    for cin, cout, padding in ((3, 4, 0), (5, 2, 1), (2, 3, 2)):
        x = rng.standard_normal((5, cin, 7, 6), dtype=np.float32)
        w = rng.standard_normal((cout, cin, 3, 3), dtype=np.float32)
        b = rng.standard_normal(cout, dtype=np.float32)
        y, cache = F.conv2d_forward(x, w, b, padding)
        dy = np.ascontiguousarray(rng.standard_normal(y.shape, dtype=np.float32).transpose(1, 0, 2, 3))
        outs += [y, *F.conv2d_backward(dy.transpose(1, 0, 2, 3), cache)]
        outs += [F.relu_forward(x), F.relu_backward(x, rng.standard_normal(x.shape, dtype=np.float32))]
        pooled, argmax = F.maxpool2x2_forward(x)
        outs += [pooled, argmax, F.maxpool2x2_backward(pooled * 3, argmax, x.shape)]
        outs += [F.upsample2x_forward(x), F.upsample2x_backward(np.concatenate([x, x], axis=3)[:, :, :6])]
    return outs


def test_sample_threads_give_the_same_bits(monkeypatch):
    """The sample-parallel passes (gpunn.nn.sample_threads) compute every element as one call would: the same bits
    on 1 and 3 threads, ranges of one or two samples (MIN_ELEMENTS 1), also with the batch convolved in chunks."""
    from gpunn.nn import sample_threads

    monkeypatch.setattr(sample_threads, "MIN_ELEMENTS", 1)
    results, budget = {}, F.IM2COL_BUDGET
    for threads in ("1", "3"):
        monkeypatch.setenv(sample_threads.THREADS_VARIABLE, threads)
        results[threads] = _every_op(np.random.default_rng(7))
        monkeypatch.setattr(F, "IM2COL_BUDGET", 3 * 9 * 7 * 6 * 4)  # chunks of 2, 2, 1 samples at cin 3
        results[threads] += _every_op(np.random.default_rng(7))
        monkeypatch.setattr(F, "IM2COL_BUDGET", budget)
    assert sample_threads.sample_ranges(5, 5, threads=3) == [(0, 1), (1, 3), (3, 5)]
    for one, three in zip(results["1"], results["3"], strict=True):
        assert one.dtype == three.dtype and np.array_equal(one, three)


def _special_values(rng, shape, dtype):
    """Random values with signed zeros, infinities and NaNs sprinkled in."""
    a = rng.standard_normal(shape).astype(dtype)
    for value, share in ((0.0, 0.2), (-0.0, 0.3), (np.inf, 0.02), (-np.inf, 0.02), (np.nan, 0.02)):
        a[rng.random(shape) < share] = value
    return a


@pytest.mark.parametrize("blocked", [False, True])
def test_upsample_passes_match_their_plain_numpy_form_bit_for_bit(monkeypatch, blocked):
    """upsample2x_forward's float32 pair copy and upsample2x_backward's pair sums give the bits of the broadcast copy
    and of np.sum(axis=(3, 5)) (signed zeros, infinities, NaNs), in one piece and in blocks of one sample."""
    from gpunn.nn import sample_threads

    if blocked:
        monkeypatch.setattr(F, "BLOCK_ELEMENTS", 1)
        monkeypatch.setattr(sample_threads, "BLOCKED_FROM", 1)
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        bits = np.int32 if dtype == np.float32 else np.int64
        for n, c, h, w in ((1, 1, 1, 1), (3, 2, 1, 2), (2, 3, 5, 1), (4, 5, 3, 7), (3, 4, 8, 8)):
            x = _special_values(rng, (n, c, h, w), dtype)
            up = np.broadcast_to(x[:, :, :, None, :, None], (n, c, h, 2, w, 2)).reshape(n, c, 2 * h, 2 * w)
            assert np.array_equal(F.upsample2x_forward(x).view(bits), up.view(bits))
            dy = _special_values(rng, (n, c, 2 * h, 2 * w), dtype)
            summed = dy.reshape(n, c, h, 2, w, 2).sum(axis=(3, 5))
            assert np.array_equal(F.upsample2x_backward(dy).view(bits), summed.view(bits))
            strided = np.concatenate([dy, dy], axis=3)[:, :, :, ::2]  # not C-contiguous: NumPy's own sum
            summed = strided.reshape(n, c, h, 2, w, 2).sum(axis=(3, 5))
            assert np.array_equal(F.upsample2x_backward(strided).view(bits), summed.view(bits))


def test_blocked_passes_give_the_same_bits(monkeypatch):
    """Every sample-parallel op run in blocks of one sample (BLOCK_ELEMENTS 1) gives the bits of the unblocked run."""
    from gpunn.nn import sample_threads

    plain = _every_op(np.random.default_rng(5))
    monkeypatch.setattr(F, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(sample_threads, "BLOCKED_FROM", 1)
    for one, blocked in zip(plain, _every_op(np.random.default_rng(5)), strict=True):
        assert one.dtype == blocked.dtype and np.array_equal(one, blocked)


def test_sample_ranges_cover_the_batch_and_errors_reach_the_caller(monkeypatch):
    from gpunn.nn import sample_threads as st

    assert st.sample_ranges(10, 10 * st.MIN_ELEMENTS, threads=4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert st.sample_ranges(10, st.MIN_ELEMENTS - 1, threads=4) == [(0, 10)]  # too little work to split
    assert st.sample_ranges(2, 10**9, threads=8) == [(0, 1), (1, 2)]  # never an empty range
    monkeypatch.setenv(st.THREADS_VARIABLE, "3")
    assert st.thread_count() == 3
    monkeypatch.setenv(st.THREADS_VARIABLE, "none")
    assert st.thread_count() >= 1
    monkeypatch.setattr(st, "MIN_ELEMENTS", 1)
    monkeypatch.setenv(st.THREADS_VARIABLE, "3")
    seen = []

    def fail_late(s, e):
        seen.append((s, e))
        if s > 0:
            raise ValueError(f"range {s}:{e}")

    with pytest.raises(ValueError, match="range"):
        st.over_samples(6, 6, fail_late)
    assert sorted(seen) == [(0, 2), (2, 4), (4, 6)]


def test_maxpool_argmax_and_backward():
    x = np.array(
        [[[[1, 5, 2, 0, 9], [3, 4, 8, 1, 9], [7, 0, 0, 6, 9]]]], dtype=np.float32
    )  # (1, 1, 3, 5): odd H and W, the last row and column are dropped
    y, argmax = F.maxpool2x2_forward(x)
    assert y.shape == (1, 1, 1, 2) and y.dtype == np.float32
    np.testing.assert_array_equal(y[0, 0], [[5, 8]])
    np.testing.assert_array_equal(argmax[0, 0], [[1, 2]])  # 5 at (0,1) -> 1; 8 at (1,0) -> 2
    dy = np.array([[[[10, 20]]]], dtype=np.float32)
    dx = F.maxpool2x2_backward(dy, argmax, x.shape)
    expected = np.zeros_like(x)
    expected[0, 0, 0, 1] = 10
    expected[0, 0, 1, 2] = 20
    np.testing.assert_array_equal(dx, expected)
    assert dx.dtype == np.float32


def test_maxpool_all_positions_and_ties():
    # one window per argmax position, plus a window of ties (the first position wins)
    x = np.zeros((1, 1, 2, 10))
    for pos in range(4):
        x[0, 0, pos // 2, 2 * pos + pos % 2] = 1.0
    y, argmax = F.maxpool2x2_forward(x)
    np.testing.assert_array_equal(argmax[0, 0, 0], [0, 1, 2, 3, 0])
    np.testing.assert_array_equal(y[0, 0, 0], [1, 1, 1, 1, 0])


def test_upsample_forward_backward():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    y = F.upsample2x_forward(x)
    assert y.shape == (1, 1, 4, 6) and y.dtype == np.float32
    for i in range(4):
        for j in range(6):
            assert y[0, 0, i, j] == x[0, 0, i // 2, j // 2]
    dy = np.arange(24, dtype=np.float32).reshape(1, 1, 4, 6)
    dx = F.upsample2x_backward(dy)
    np.testing.assert_array_equal(dx[0, 0], [[0 + 1 + 6 + 7, 2 + 3 + 8 + 9, 4 + 5 + 10 + 11],
                                             [12 + 13 + 18 + 19, 14 + 15 + 20 + 21, 16 + 17 + 22 + 23]])


def test_softmax_cross_entropy_values_and_stability():
    logits = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    labels = np.array([1, 2])
    loss, probs = F.softmax_cross_entropy(logits, labels)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    row2 = np.log(np.exp(1.0) + np.exp(2.0) + np.exp(3.0)) - 3.0
    np.testing.assert_allclose(loss, (1000.0 + row2) / 2)
    np.testing.assert_allclose(F.softmax(logits), probs)
    d = F.softmax_cross_entropy_backward(probs, labels)
    onehot = np.eye(3)[labels]
    np.testing.assert_allclose(d, (probs - onehot) / 2)
    # the gradient of the summed per-sample losses: no 1/N
    np.testing.assert_allclose(F.softmax_cross_entropy_backward(probs, labels, "sum"), probs - onehot)
    with pytest.raises(ValueError, match="softmax_cross_entropy_backward: reduction must be one of mean, sum"):
        F.softmax_cross_entropy_backward(probs, labels, "avg")
    l32, p32 = F.softmax_cross_entropy(logits.astype(np.float32), labels)
    assert p32.dtype == np.float32 and np.isfinite(l32)


def test_mse_values():
    pred = np.array([[1.0, 2.0], [3.0, 5.0]], dtype=np.float32)
    target = np.array([[1.0, 0.0], [3.0, 4.0]], dtype=np.float32)
    assert F.mse_forward(pred, target) == pytest.approx((4 + 1) / 4)
    d = F.mse_backward(pred, target)
    assert d.dtype == np.float32
    np.testing.assert_allclose(d, 2 * (pred - target) / 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_op_preserves_dtype(dtype):
    rng = np.random.default_rng(3)
    r = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    x, w, b = r(4, 5), r(5, 3), r(3)
    y = F.linear_forward(x, w, b)
    assert y.dtype == dtype and all(g.dtype == dtype for g in F.linear_backward(x, w, r(4, 3)))
    assert F.relu_forward(x).dtype == dtype and F.relu_backward(x, x).dtype == dtype
    assert F.softmax(x).dtype == dtype
    loss, probs = F.softmax_cross_entropy(x, np.array([0, 1, 2, 3]))
    assert probs.dtype == dtype and isinstance(loss, float)
    assert F.softmax_cross_entropy_backward(probs, np.array([0, 1, 2, 3])).dtype == dtype
    xi = r(2, 3, 6, 5)
    yc, cache = F.conv2d_forward(xi, r(4, 3, 3, 3), r(4), 1)
    assert yc.dtype == dtype and all(g.dtype == dtype for g in F.conv2d_backward(yc.copy(), cache))
    yp, am = F.maxpool2x2_forward(xi)
    assert yp.dtype == dtype and F.maxpool2x2_backward(yp, am, xi.shape).dtype == dtype
    yu = F.upsample2x_forward(xi)
    assert yu.dtype == dtype and F.upsample2x_backward(yu).dtype == dtype
    assert F.mse_backward(xi, xi * 2).dtype == dtype


def test_batch_of_one():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    y, cache = F.conv2d_forward(x, rng.standard_normal((3, 2, 3, 3)).astype(np.float32), np.zeros(3, np.float32), 1)
    assert y.shape == (1, 3, 4, 4)
    dx, dw, db = F.conv2d_backward(np.ones_like(y), cache)
    assert dx.shape == x.shape
    loss, probs = F.softmax_cross_entropy(np.zeros((1, 10), np.float32), np.array([3]))
    assert loss == pytest.approx(np.log(10), rel=1e-6)


def test_shape_mismatches_raise_clear_valueerror():
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    with pytest.raises(ValueError, match=r"linear_forward.*\(4, 5\).*\(6, 3\)"):
        F.linear_forward(f32(4, 5), f32(6, 3), f32(3))
    with pytest.raises(ValueError, match="linear_forward"):
        F.linear_forward(f32(4, 5), f32(5, 3), f32(4))
    with pytest.raises(ValueError, match="linear_backward"):
        F.linear_backward(f32(4, 5), f32(5, 3), f32(4, 2))
    with pytest.raises(ValueError, match="relu_backward"):
        F.relu_backward(f32(2, 3), f32(3, 2))
    with pytest.raises(ValueError, match=r"conv2d_forward: channels.*\(2, 3, 5, 5\)"):
        F.conv2d_forward(f32(2, 3, 5, 5), f32(4, 2, 3, 3), f32(4), 0)
    with pytest.raises(ValueError, match="conv2d_forward.*smaller than"):
        F.conv2d_forward(f32(2, 3, 2, 5), f32(4, 3, 3, 3), f32(4), 0)
    with pytest.raises(ValueError, match="conv2d_forward.*4-D"):
        F.conv2d_forward(f32(3, 5, 5), f32(4, 3, 3, 3), f32(4), 0)
    y, cache = F.conv2d_forward(f32(2, 3, 5, 5), f32(4, 3, 3, 3), f32(4), 0)
    with pytest.raises(ValueError, match="conv2d_backward"):
        F.conv2d_backward(f32(2, 4, 4, 4), cache)
    with pytest.raises(ValueError, match="maxpool2x2_forward"):
        F.maxpool2x2_forward(f32(1, 1, 1, 4))
    with pytest.raises(ValueError, match="upsample2x_backward"):
        F.upsample2x_backward(f32(1, 1, 3, 4))
    with pytest.raises(ValueError, match="mse_forward"):
        F.mse_forward(f32(2, 3), f32(3, 2))
    with pytest.raises(ValueError, match="softmax_cross_entropy.*labels"):
        F.softmax_cross_entropy(f32(2, 3), np.array([0, 3]))
    with pytest.raises(ValueError, match="softmax_cross_entropy.*labels"):
        F.softmax_cross_entropy(f32(2, 3), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="dtype"):
        F.linear_forward(f32(4, 5), np.zeros((5, 3)), f32(3))


@pytest.mark.parametrize(
    "call",
    [
        lambda z: F.linear_forward(z(0, 5), z(5, 3), z(3)),
        lambda z: F.linear_forward(z(4, 0), z(0, 3), z(3)),
        lambda z: F.linear_forward(z(4, 5), z(5, 0), z(0)),
        lambda z: F.relu_forward(z(0, 3)),
        lambda z: F.softmax_cross_entropy(z(0, 10), np.zeros(0, np.int64)),
        lambda z: F.softmax(z(3, 0)),
        lambda z: F.conv2d_forward(z(0, 1, 5, 5), z(2, 1, 3, 3), z(2), 0),
        lambda z: F.conv2d_forward(z(1, 0, 5, 5), z(2, 0, 3, 3), z(2), 0),
        lambda z: F.maxpool2x2_forward(z(2, 0, 4, 4)),
        lambda z: F.upsample2x_forward(z(0, 1, 2, 2)),
        lambda z: F.mse_forward(z(0, 3), z(0, 3)),
    ],
)
def test_zero_sized_dimensions_raise(call):
    with pytest.raises(ValueError, match="zero-sized"):
        call(lambda *s: np.zeros(s, np.float32))


FAULTS_SCRIPT = """
import resource, sys
import numpy as np
from gpunn.heap import keep_freed_memory
if sys.argv[1] == "kept":
    keep_freed_memory()  # as gpunn's CLI does for every job
from gpunn.backends.cpu_numpy import CpuNumpyBackend
from gpunn.nn.models import build_model
backend = CpuNumpyBackend(build_model("cnn"), "cnn", 0.01)
rng = np.random.default_rng(0)
x, y = rng.random((64, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 64)
for _ in range(3):
    backend.train_step(x, y)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    backend.train_step(x, y)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4)
"""


def test_a_cpu_numpy_step_reuses_its_memory_instead_of_faulting_it_in():
    """keep_freed_memory (gpunn.heap; the CLI applies it): after a warm-up, a CNN step at the papers' batch takes its
    buffers from memory the last step freed, where by default glibc maps and unmaps each large array (about 780 page
    faults a step on one core). Each way in a fresh process."""
    import subprocess
    import sys

    from gpunn.heap import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("not glibc")
    faults = {}
    for how in ("default", "kept"):
        done = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT, how], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        faults[how] = float(done.stdout.split()[-1])
    assert faults["default"] > 200 and faults["kept"] < faults["default"] / 4, faults
