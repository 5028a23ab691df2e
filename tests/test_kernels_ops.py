"""Elementwise, softmax / cross-entropy, column-sum and SGD kernels against their float64 NumPy references.

Runs under the CUDA simulator (tiny shapes) or on a GPU. Outputs are poisoned with NaN before each launch so
an element the kernel forgets to write fails the comparison. `gpu`-marked tests need a real GPU.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from numba import config, cuda

from gpunn.kernels import elementwise as ew
from gpunn.kernels import reduce as rd
from gpunn.kernels import sgd
from gpunn.kernels import softmax as sm
from gpunn.nn import functional as F

TOL = 1e-5


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "output has NaN/inf (an element was not written?)"
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def rand(rng, *shape, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    a[a == 0] = (
        0.5  # never zeros (keeps the relu mask and the relative error well defined)
    )
    return a


def poisoned(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


@pytest.fixture
def rng(request):
    return np.random.default_rng(
        zlib.crc32(request.node.name.encode())
    )  # fixed per test


SHAPES = [(1, 7), (3, 7), (5, 21)]


# --------------------------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [8, 32])
def test_bias_add_and_bias_relu(rng, shape, block):
    x = rand(rng, *shape)
    b = rand(rng, shape[1])
    d_x, d_b = cuda.to_device(x), cuda.to_device(b)
    ew.bias_add(d_x, d_b, block=block)
    assert rel_err(d_x.copy_to_host(), ew.bias_add_ref(x, b)) < TOL
    d_x = cuda.to_device(x)
    ew.bias_relu(d_x, d_b, block=block)
    got = d_x.copy_to_host()
    ref = ew.bias_relu_ref(x, b)
    assert rel_err(got, ref) < TOL
    np.testing.assert_array_equal(got > 0, ref > 0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [8, 32])
def test_relu_forward_backward(rng, shape, block):
    x = rand(rng, *shape)
    x.flat[0] = 0.0  # exactly zero: derivative 0 like the reference
    dy = rand(rng, *shape)
    out = poisoned(*shape)
    ew.relu_forward(cuda.to_device(x), out, block=block)
    got = out.copy_to_host()
    assert rel_err(got, F.relu_forward(x)) < TOL
    assert rel_err(got, ew.relu_forward_ref(x)) < TOL
    dx = poisoned(*shape)
    ew.relu_backward(cuda.to_device(x), cuda.to_device(dy), dx, block=block)
    got = dx.copy_to_host()
    assert got.flat[0] == 0.0
    assert rel_err(got, F.relu_backward(x, dy)) < TOL
    assert rel_err(got, ew.relu_backward_ref(x, dy)) < TOL


def test_relu_forward_in_place_any_rank(rng):
    x = rand(rng, 2, 3, 5)
    d = cuda.to_device(x)
    ew.relu_forward(d, d, block=16)
    assert rel_err(d.copy_to_host(), np.maximum(x, 0)) < TOL


def test_elementwise_shape_errors():
    x = cuda.to_device(np.ones((3, 7), np.float32))
    with pytest.raises(ValueError, match=r"bias_add.*\(7,\).*\(3, 7\)"):
        ew.bias_add(x, cuda.to_device(np.ones(6, np.float32)))
    with pytest.raises(ValueError, match="bias_relu.*zero-sized"):
        ew.bias_relu(
            cuda.to_device(np.ones((0, 7), np.float32)),
            cuda.to_device(np.ones(7, np.float32)),
        )
    with pytest.raises(ValueError, match=r"relu_forward.*\(3, 7\).*\(3, 6\)"):
        ew.relu_forward(x, cuda.to_device(np.ones((3, 6), np.float32)))
    with pytest.raises(ValueError, match="relu_backward"):
        ew.relu_backward(x, x, cuda.to_device(np.ones((7, 3), np.float32)))
    with pytest.raises(ValueError, match="relu_forward.*float32"):
        ew.relu_forward(cuda.to_device(np.ones((3, 7))), x)
    with pytest.raises(ValueError, match="block"):
        ew.relu_forward(x, x, block=0)
    assert set(ew.OPS) == {
        "bias_add",
        "relu_forward",
        "relu_backward",
        "bias_relu",
        "gather_rows",
        "pixels_to_float",
    }


# --------------------------------------------------------------------------------------------- softmax / CE
@pytest.mark.parametrize(
    "shape,block", [((1, 10), 8), ((3, 10), 16), ((5, 21), 8), ((2, 5), 8)]
)
def test_softmax_rows(rng, shape, block):
    x = (
        rand(rng, *shape, scale=3.0) + 20.0
    )  # an offset: only a max-subtracting softmax stays accurate
    out = poisoned(*shape)
    sm.softmax_rows(cuda.to_device(x), out, block=block)
    got = out.copy_to_host()
    assert rel_err(got, sm.softmax_ref(x)) < TOL
    assert rel_err(got, F.softmax(x.astype(np.float64))) < TOL


@pytest.mark.parametrize("reduction", ["mean", "sum"])  # dlogits of the batch's mean or summed loss
@pytest.mark.parametrize("shape,block", [((1, 10), 8), ((3, 10), 16), ((5, 21), 8)])
def test_softmax_ce_grad_and_loss_mean(rng, shape, block, reduction):
    b, c = shape
    logits = rand(rng, b, c, scale=3.0)
    labels = rng.integers(0, c, size=b).astype(np.int32)
    dlogits, losses = poisoned(b, c), poisoned(b)
    sm.softmax_ce_grad(
        cuda.to_device(logits), cuda.to_device(labels), dlogits, losses, block=block, reduction=reduction
    )
    ref_d, ref_l = sm.softmax_ce_grad_ref(logits, labels, reduction)
    assert rel_err(dlogits.copy_to_host(), ref_d) < TOL
    assert rel_err(losses.copy_to_host(), ref_l) < TOL  # the per-row losses do not depend on the reduction
    # and against the project's CPU op (float64 path)
    mean, probs = F.softmax_cross_entropy(logits.astype(np.float64), labels)
    assert (
        rel_err(dlogits.copy_to_host(), F.softmax_cross_entropy_backward(probs, labels, reduction))
        < TOL
    )
    out = poisoned(1)
    sm.loss_mean(losses, out, block=block)
    assert rel_err(out.copy_to_host(), [mean]) < TOL
    assert rel_err(out.copy_to_host(), sm.loss_mean_ref(ref_l)) < TOL


def test_loss_mean_longer_than_block(rng):
    losses = np.abs(rand(rng, 37))
    out = poisoned(1)
    sm.loss_mean(cuda.to_device(losses), out, block=8)
    assert rel_err(out.copy_to_host(), sm.loss_mean_ref(losses)) < TOL


def test_softmax_shape_errors():
    x = cuda.to_device(np.ones((3, 10), np.float32))
    lab = cuda.to_device(np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"softmax_rows.*\(3, 10\).*\(3, 9\)"):
        sm.softmax_rows(x, cuda.to_device(np.ones((3, 9), np.float32)))
    with pytest.raises(ValueError, match="softmax_rows.*power of two"):
        sm.softmax_rows(x, x, block=12)
    with pytest.raises(ValueError, match="softmax_ce_grad.*zero-sized"):
        sm.softmax_ce_grad(
            cuda.to_device(np.ones((3, 0), np.float32)),
            lab,
            x,
            cuda.to_device(np.ones(3, np.float32)),
        )
    with pytest.raises(ValueError, match=r"softmax_ce_grad.*labels \(4,\)"):
        sm.softmax_ce_grad(
            x,
            cuda.to_device(np.zeros(4, np.int32)),
            x,
            cuda.to_device(np.ones(3, np.float32)),
        )
    with pytest.raises(ValueError, match="softmax_ce_grad: reduction must be one of mean, sum, got 'avg'"):
        sm.softmax_ce_grad(x, lab, x, cuda.to_device(np.ones(3, np.float32)), reduction="avg")
    with pytest.raises(ValueError, match="softmax_ce_grad.*labels must be int32"):
        sm.softmax_ce_grad(
            x,
            cuda.to_device(np.zeros(3, np.int64)),
            x,
            cuda.to_device(np.ones(3, np.float32)),
        )
    with pytest.raises(ValueError, match=r"loss_mean.*\(1,\)"):
        sm.loss_mean(
            cuda.to_device(np.ones(3, np.float32)),
            cuda.to_device(np.ones(2, np.float32)),
        )


# --------------------------------------------------------------------------------------------- column sums
@pytest.mark.parametrize("variant", ["colsum_atomic", "colsum_tree"])
@pytest.mark.parametrize(
    "shape,block",
    [((1, 7), 8), ((3, 7), 8), ((5, 21), 8), ((21, 5), 8), ((13, 40), 64)],
)
def test_colsum(rng, variant, shape, block):
    dy = rand(rng, *shape)
    db = poisoned(shape[1])
    rd.VERSIONS[variant](cuda.to_device(dy), db, block=block)
    got = db.copy_to_host()
    assert rel_err(got, rd.colsum_ref(dy)) < TOL
    assert (
        rel_err(
            got,
            F.linear_backward(
                np.ones((shape[0], 1)), np.ones((1, shape[1])), dy.astype(np.float64)
            )[2],
        )
        < TOL
    )


def test_colsum_atomic_zeroed_adds_into_its_buffer_with_one_launch(rng):
    """With `zeroed` the caller keeps db zero (the engine's SGD does): one launch, the atomic sums added to db as it is
    (a non-zero db shows that no zeroing launch ran)."""
    dy = rand(rng, 5, 21)
    start = rand(rng, 21)
    db = cuda.to_device(start)
    launch = rd.colsum_atomic(cuda.to_device(dy), db, block=8, launch=False, zeroed=True)
    assert not hasattr(launch, "launches")  # a single launch, not a zero + add group
    launch()
    assert rel_err(db.copy_to_host(), start.astype(np.float64) + rd.colsum_ref(dy)) < TOL
    assert len(rd.colsum_atomic(cuda.to_device(dy), db, block=8, launch=False).launches) == 2


def test_colsum_tree_bitwise_reproducible(rng):
    dy = cuda.to_device(rand(rng, 19, 9, scale=100.0))
    a, b = poisoned(9), poisoned(9)
    rd.colsum_tree(dy, a, block=16)
    rd.colsum_tree(dy, b, block=16)
    np.testing.assert_array_equal(
        a.copy_to_host().view(np.uint32), b.copy_to_host().view(np.uint32)
    )


def test_colsum_shape_errors():
    dy = cuda.to_device(np.ones((3, 7), np.float32))
    for name, launch in rd.VERSIONS.items():
        with pytest.raises(ValueError, match=rf"{name}.*\(7,\).*\(3, 7\)"):
            launch(dy, cuda.to_device(np.ones(6, np.float32)), block=8)
        with pytest.raises(ValueError, match=f"{name}.*zero-sized"):
            launch(
                cuda.to_device(np.ones((0, 7), np.float32)),
                cuda.to_device(np.ones(7, np.float32)),
                block=8,
            )
    with pytest.raises(ValueError, match="colsum_tree.*power of two"):
        rd.colsum_tree(dy, cuda.to_device(np.ones(7, np.float32)), block=24)


# --------------------------------------------------------------------------------------------- sgd
@pytest.mark.parametrize("n,block", [(1, 8), (37, 8), (101, 32)])
def test_sgd_step_matches_optimizer(rng, n, block):
    data, grad = rand(rng, n), rand(rng, n)
    lr = 0.037
    d_data, d_grad = cuda.to_device(data), cuda.to_device(grad)
    sgd.sgd_step(d_data, d_grad, lr, block=block)
    got = d_data.copy_to_host()
    assert rel_err(got, sgd.sgd_step_ref64(data, grad, lr)) < TOL
    # bitwise like gpunn.nn.optim.SGD's float32 update
    ref32 = data.copy()
    ref32 -= np.float32(lr) * grad
    np.testing.assert_array_equal(got, ref32)
    np.testing.assert_array_equal(got, sgd.sgd_step_ref(data, grad, lr))
    np.testing.assert_array_equal(d_grad.copy_to_host(), np.zeros(n, np.float32))


def test_sgd_shape_errors():
    a = cuda.to_device(np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"sgd_step.*\(5,\).*\(4,\)"):
        sgd.sgd_step(a, cuda.to_device(np.ones(4, np.float32)), 0.1)
    with pytest.raises(ValueError, match="sgd_step.*zero-sized"):
        sgd.sgd_step(
            cuda.to_device(np.ones(0, np.float32)),
            cuda.to_device(np.ones(0, np.float32)),
            0.1,
        )
    with pytest.raises(ValueError, match="sgd_step.*lr"):
        sgd.sgd_step(a, a, -1.0)


# --------------------------------------------------------------------------------------------- device-resident steps
def test_gather_rows_follows_the_device_counter(rng):
    """One bound launch gathers each batch of an epoch as the counter advances (a partial last batch too),
    into a strided view whose extra column stays untouched."""
    n, features, stride = 11, 5, 4
    source = rand(rng, n, features)
    labels = rng.integers(0, 7, n).astype(np.int32)
    order = rng.permutation(n).astype(np.int32)
    d_src, d_lab, d_ord = cuda.to_device(source), cuda.to_device(labels), cuda.to_device(order)
    counter = cuda.to_device(np.zeros(1, np.int32))
    for rows, steps in ((stride, (0, 1)), (n - 2 * stride, (2,))):  # full batches, then the partial last one
        host = np.full((rows, features + 1), np.nan, np.float32)
        host[:, features] = 7.0
        buf = cuda.to_device(host)
        y = cuda.to_device(np.full(rows, -1, np.int32))
        launch = ew.gather_rows(d_src, d_lab, d_ord, counter, stride, buf[:, :features], y, block=32, launch=False)
        for step in steps:
            counter.copy_to_device(np.array([step], np.int32))
            launch()
            x_ref, y_ref = ew.gather_rows_ref(source, labels, order, step, stride, rows)
            out = buf.copy_to_host()
            assert rel_err(out[:, :features], x_ref) == 0.0
            np.testing.assert_array_equal(out[:, features], 7.0)
            np.testing.assert_array_equal(y.copy_to_host(), y_ref)


def test_pixels_to_float_is_the_hosts_conversion_bit_for_bit():
    """A resident training set crosses to the device as uint8 and is converted there: every value equals
    images_to_float's (all 256 pixel values, an odd shape), within rounding of the float64 reference."""
    from gpunn.rundata import images_to_float

    pixels = np.resize(np.arange(256, dtype=np.uint8), (3, 1, 9, 11))  # 297 values: each of the 256 at least once
    out = cuda.to_device(np.full(pixels.shape, np.nan, np.float32))
    ew.pixels_to_float(cuda.to_device(pixels), out, block=64)
    got = out.copy_to_host()
    assert np.array_equal(got, images_to_float(pixels))
    assert rel_err(got, ew.pixels_to_float_ref(pixels)) <= 2**-24
    with pytest.raises(ValueError, match="pixels_to_float: pixels must be uint8"):
        ew.pixels_to_float(out, out)
    with pytest.raises(ValueError, match="pixels_to_float: pixels is a host NumPy array"):
        ew.pixels_to_float(pixels, out)


def test_gather_rows_shape_errors():
    src = cuda.to_device(np.ones((6, 3), np.float32))
    lab = cuda.to_device(np.zeros(6, np.int32))
    order = cuda.to_device(np.arange(6, dtype=np.int32))
    counter = cuda.to_device(np.zeros(1, np.int32))
    x = cuda.to_device(np.ones((4, 3), np.float32))
    y = cuda.to_device(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="stride"):
        ew.gather_rows(src, lab, order, counter, 2, x, y)  # stride below the batch
    with pytest.raises(ValueError, match="order must be int32"):
        ew.gather_rows(src, lab, cuda.to_device(np.arange(6, dtype=np.int64)), counter, 4, x, y)


def test_softmax_ce_grad_writes_losses_at_the_counted_step(rng):
    rows, cols, stride, n = 3, 5, 4, 11
    logits = rand(rng, rows, cols)
    labels = rng.integers(0, cols, rows).astype(np.int32)
    losses = cuda.to_device(np.full(n, np.nan, np.float32))
    counter = cuda.to_device(np.array([2], np.int32))  # the partial last batch: rows 8..10
    d_grad = poisoned(rows, cols)
    sm.softmax_ce_grad(cuda.to_device(logits), cuda.to_device(labels), d_grad, losses, block=8,
                       counter=counter, stride=stride)
    grad_ref, loss_ref = sm.softmax_ce_grad_ref(logits, labels)
    out = losses.copy_to_host()
    assert rel_err(out[8:], loss_ref) < TOL
    assert np.isnan(out[:8]).all()  # nothing else written
    assert rel_err(d_grad.copy_to_host(), grad_ref) < TOL


def test_sgd_step_advances_the_counter(rng):
    data, grad = rand(rng, 9), rand(rng, 9)
    d_data, d_grad = cuda.to_device(data), cuda.to_device(grad)
    counter = cuda.to_device(np.array([5], np.int32))
    launch = sgd.sgd_step(d_data, d_grad, 0.1, block=4, counter=counter)
    assert counter.copy_to_host()[0] == 6
    np.testing.assert_array_equal(d_data.copy_to_host(), sgd.sgd_step_ref(data, grad, 0.1))
    launch()  # the bound launch runs again on the live buffers: grad is zero now, so data stays
    assert counter.copy_to_host()[0] == 7
    np.testing.assert_array_equal(d_data.copy_to_host(), sgd.sgd_step_ref(data, grad, 0.1))

# --------------------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
@pytest.mark.skipif(
    bool(config.ENABLE_CUDASIM), reason="needs a real GPU, not the CUDA simulator"
)
def test_gpu_all_ops_larger_shapes():
    """Larger shapes and block sizes on a real GPU (compiled kernels: fp32 exp/log, FMA contraction)."""
    rng = np.random.default_rng(0)
    b, c = 257, 1000
    x = rand(rng, b, c)
    bias = rand(rng, c)
    for block in (64, 256, 1024):
        d_x = cuda.to_device(x)
        ew.bias_relu(d_x, cuda.to_device(bias), block=block)
        assert rel_err(d_x.copy_to_host(), ew.bias_relu_ref(x, bias)) < TOL
        out = poisoned(b, c)
        sm.softmax_rows(cuda.to_device(x), out, block=block)
        assert rel_err(out.copy_to_host(), sm.softmax_ref(x)) < TOL
        labels = rng.integers(0, c, size=b).astype(np.int32)
        dl, ls = poisoned(b, c), poisoned(b)
        sm.softmax_ce_grad(
            cuda.to_device(x), cuda.to_device(labels), dl, ls, block=block
        )
        ref_d, ref_l = sm.softmax_ce_grad_ref(x, labels)
        assert rel_err(dl.copy_to_host(), ref_d) < TOL
        assert rel_err(ls.copy_to_host(), ref_l) < TOL
        m = poisoned(1)
        sm.loss_mean(ls, m, block=block)
        assert rel_err(m.copy_to_host(), [ref_l.mean()]) < TOL
        for name, launch in rd.VERSIONS.items():
            db = poisoned(c)
            launch(cuda.to_device(x), db, block=block)
            assert rel_err(db.copy_to_host(), rd.colsum_ref(x)) < TOL, name
        data, grad = rand(rng, 100_003), rand(rng, 100_003)
        d_data = cuda.to_device(data)
        sgd.sgd_step(d_data, cuda.to_device(grad), 0.01, block=block)
        np.testing.assert_array_equal(
            d_data.copy_to_host(), sgd.sgd_step_ref(data, grad, 0.01)
        )
