"""cpu-serial (numba loops) against cpu-numpy (Sequential + SGD) on the same flat buffer."""

import numpy as np
import pytest

from gpunn.nn import SGD, SoftmaxCrossEntropy, mlp
from gpunn.nn.serial import SerialMLP
from gpunn.seeding import batch_order, batch_slices


def max_rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def numpy_step(model, opt, x, y, reduction="mean"):
    ce = SoftmaxCrossEntropy(reduction)
    logits = model.forward(x)
    loss = ce.forward(logits, y)
    model.backward(ce.backward(), input_grad=False)
    opt.step()
    return logits, loss


@pytest.mark.parametrize("reduction", ["mean", "sum"])  # the gradient of the batch's mean or summed loss
@pytest.mark.parametrize("sizes,batch", [((784, 256, 10), 64), ((50, 32, 7), 13), ((20, 8, 3), 1)])
def test_one_step_matches_numpy(sizes, batch, reduction):
    n_in, hidden, classes = sizes
    rng = np.random.default_rng(0)
    model = mlp(n_in, hidden, classes, seed=1)
    flat0 = model.flat.copy()
    serial = SerialMLP(flat0.copy(), n_in, hidden, classes, reduction)
    x = rng.random((batch, n_in), dtype=np.float32)
    y = rng.integers(0, classes, batch)
    lr = 0.1

    logits_np, loss_np = numpy_step(model, SGD(model.parameters(), lr), x, y, reduction)
    logits_s = serial.forward(x).copy()
    loss_s = serial.backward_and_step(y, lr)

    assert max_rel(logits_s, logits_np) < 1e-5
    assert loss_s == pytest.approx(loss_np, rel=1e-5)
    assert max_rel(serial.flat, model.flat) < 1e-5  # the parameters after the step
    assert max_rel(serial.flat - flat0, model.flat - flat0) < 1e-4  # the updates themselves
    assert max_rel(serial.grad, (flat0 - model.flat) / np.float32(lr)) < 1e-3


def test_works_in_place_on_the_given_buffer():
    model = mlp(10, 6, 3, seed=0)
    serial = SerialMLP(model.flat, 10, 6, 3)
    before = model.flat.copy()
    x = np.random.default_rng(0).random((4, 10), dtype=np.float32)
    serial.forward(x)
    serial.backward_and_step(np.array([0, 1, 2, 0]), 0.1)
    assert not np.array_equal(model.flat, before)
    assert serial.flat is model.flat


def test_predict_logits_matches_numpy_in_chunks():
    model = mlp(30, 12, 5, seed=2)
    serial = SerialMLP(model.flat.copy(), 30, 12, 5)
    x = np.random.default_rng(1).random((37, 30), dtype=np.float32)
    out = serial.predict_logits(x, batch_size=10)
    assert out.shape == (37, 5) and out.dtype == np.float32
    assert max_rel(out, model.forward(x)) < 1e-5


def test_a_few_epochs_reach_the_same_accuracy():
    rng = np.random.default_rng(5)
    n, dim, classes = 2000, 40, 5
    centers = rng.standard_normal((classes, dim)) * 0.6
    y = rng.integers(0, classes, n)
    x = (centers[y] + rng.standard_normal((n, dim))).astype(np.float32)
    model = mlp(dim, 32, classes, seed=3)
    serial = SerialMLP(model.flat.copy(), dim, 32, classes)
    opt = SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        order = batch_order(0, epoch, n)
        for start, stop in batch_slices(n, 32):
            idx = order[start:stop]
            numpy_step(model, opt, x[idx], y[idx])
            serial.forward(x[idx])
            serial.backward_and_step(y[idx], 0.05)
    acc_np = np.mean(model.forward(x).argmax(1) == y)
    acc_s = np.mean(serial.predict_logits(x).argmax(1) == y)
    assert 0.6 < acc_np < 0.999  # a problem that is learnt but not trivially
    assert abs(acc_np - acc_s) <= 0.005
    assert max_rel(serial.flat, model.flat) < 1e-3


def test_bad_inputs_raise():
    good = mlp(10, 6, 3).flat
    with pytest.raises(ValueError, match="values"):
        SerialMLP(good[:-1].copy(), 10, 6, 3)
    with pytest.raises(ValueError, match="float32"):
        SerialMLP(good.astype(np.float64), 10, 6, 3)
    with pytest.raises(ValueError, match="SerialMLP: reduction must be one of mean, sum, got 'avg'"):
        SerialMLP(good.copy(), 10, 6, 3, reduction="avg")
    serial = SerialMLP(good.copy(), 10, 6, 3)
    with pytest.raises(ValueError, match="shape"):
        serial.forward(np.zeros((4, 9), np.float32))
    with pytest.raises(ValueError, match="shape"):
        serial.forward(np.zeros((0, 10), np.float32))
    with pytest.raises(RuntimeError, match="before forward"):
        serial.backward_and_step(np.zeros(4, np.int64), 0.1)
    serial.forward(np.zeros((4, 10), np.float32))
    with pytest.raises(ValueError, match="labels"):
        serial.backward_and_step(np.array([0, 1, 2, 3]), 0.1)
