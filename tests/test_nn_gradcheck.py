"""Central finite-difference gradient checks in float64 of every layer, loss and model.

rel_err(num, ana) = max|num - ana| / max(|num| + |ana|) over all entries of the gradient; it must be < 1e-6.
For layers the scalar is L = sum(out * R) with a fixed random R, so dL/dout = R.
Inputs are chosen away from the ReLU kink (|x| >= 0.1) and without ties inside max-pool windows.
"""

import numpy as np
import pytest

from gpunn.nn import (
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    MSELoss,
    ReLU,
    SoftmaxCrossEntropy,
    Upsample,
    autoencoder,
    cnn,
    mlp,
)

EPS = 1e-6
TOL = 1e-6


def rel_err(num, ana):
    num, ana = np.asarray(num, np.float64), np.asarray(ana, np.float64)
    assert num.shape == ana.shape
    scale = np.max(np.abs(num) + np.abs(ana))
    assert scale > 0, "gradient is identically zero: the check would prove nothing"
    return float(np.max(np.abs(num - ana)) / scale)


def numerical_grad(f, a):
    """d f() / d a by central differences, perturbing a (contiguous float64) in place."""
    assert a.dtype == np.float64 and a.flags.c_contiguous
    flat = a.reshape(-1)
    g = np.zeros(flat.size)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + EPS
        fp = f()
        flat[i] = old - EPS
        fm = f()
        flat[i] = old
        g[i] = (fp - fm) / (2 * EPS)
    return g.reshape(a.shape)


def away_from_zero(rng, shape):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.1, 1.0, size=shape)


def distinct_values(rng, shape):
    """Values whose pairwise gaps are >= 0.01 (no ties in any max-pool window), in random order."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.01 - 0.005 * n + rng.uniform(0, 0.001, n)).reshape(shape)


def check_layer(layer, x, rng):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = layer.forward(x)
    assert out.dtype == np.float64
    r = rng.standard_normal(out.shape)
    for p in layer.parameters():
        p.grad[...] = 0
    dx = layer.backward(r)
    assert dx.shape == x.shape and dx.dtype == np.float64

    def loss():
        return float(np.sum(layer.forward(x) * r))

    assert rel_err(numerical_grad(loss, x), dx) < TOL
    for p in layer.parameters():
        assert rel_err(numerical_grad(loss, p.data), p.grad) < TOL, p.name


@pytest.mark.parametrize("shape", [(1, 7), (5, 7)])
def test_linear(shape):
    rng = np.random.default_rng(10)
    layer = Linear(7, 4, dtype=np.float64, rng=rng)
    layer.bias.data[...] = rng.standard_normal(4)
    check_layer(layer, rng.standard_normal(shape), rng)


def test_relu():
    rng = np.random.default_rng(11)
    check_layer(ReLU(), away_from_zero(rng, (3, 2, 5, 3)), rng)


@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("cin,cout,h,w", [(3, 5, 7, 5), (1, 3, 5, 9), (5, 1, 3, 3)])
def test_conv2d(padding, cin, cout, h, w):
    rng = np.random.default_rng(12 + padding)
    layer = Conv2d(cin, cout, kernel_size=3, padding=padding, dtype=np.float64, rng=rng)
    layer.bias.data[...] = rng.standard_normal(cout)
    check_layer(layer, rng.standard_normal((2, cin, h, w)), rng)


def test_conv2d_kernel_5():
    rng = np.random.default_rng(13)
    layer = Conv2d(2, 3, kernel_size=5, padding=2, dtype=np.float64, rng=rng)
    check_layer(layer, rng.standard_normal((1, 2, 5, 6)), rng)


@pytest.mark.parametrize("shape", [(2, 3, 6, 4), (1, 2, 7, 5)])  # even, and odd H/W (floored)
def test_maxpool(shape):
    rng = np.random.default_rng(14)
    check_layer(MaxPool2d(2), distinct_values(rng, shape), rng)


def test_upsample():
    rng = np.random.default_rng(15)
    check_layer(Upsample(2), rng.standard_normal((2, 3, 3, 5)), rng)


def test_flatten():
    rng = np.random.default_rng(16)
    check_layer(Flatten(), rng.standard_normal((3, 2, 3, 5)), rng)


@pytest.mark.parametrize("batch", [1, 6])
def test_softmax_cross_entropy(batch):
    rng = np.random.default_rng(17)
    logits = rng.standard_normal((batch, 5)) * 3
    labels = rng.integers(0, 5, batch)
    ce = SoftmaxCrossEntropy()
    ce.forward(logits, labels)
    ana = ce.backward()
    num = numerical_grad(lambda: ce.forward(logits, labels), logits)
    assert rel_err(num, ana) < TOL
    loss, grad = SoftmaxCrossEntropy.forward_and_grad(logits, labels)
    np.testing.assert_array_equal(grad, ana)


def test_mse_loss():
    rng = np.random.default_rng(18)
    pred = rng.standard_normal((2, 3, 4, 5))
    target = rng.standard_normal((2, 3, 4, 5))
    mse = MSELoss()
    mse.forward(pred, target)
    ana = mse.backward()
    assert rel_err(numerical_grad(lambda: mse.forward(pred, target), pred), ana) < TOL


# --------------------------------------------------------------------------------------------- models
def check_model(model, x, loss_fn, target):
    """Input and all parameter gradients of loss_fn(model(x), target), the latter over the flat buffer."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    model.zero_grad()
    loss_fn.forward(model.forward(x), target)
    dx = model.backward(loss_fn.backward())
    assert dx.shape == x.shape

    def loss():
        return loss_fn.forward(model.forward(x), target)

    assert rel_err(numerical_grad(loss, x), dx) < TOL
    # perturbing the flat buffer perturbs the layers' parameters (they are views)
    num = numerical_grad(loss, model.flat)
    assert rel_err(num, model.flat_grad) < TOL
    # and per parameter, so an error in a small one cannot hide behind a large neighbour
    for name, offset, shape in model.layout():
        size = int(np.prod(shape))
        assert rel_err(num[offset : offset + size], model.flat_grad[offset : offset + size]) < TOL, name


def randomise_biases(model, rng):
    for name, offset, shape in model.layout():
        if name.endswith("bias"):
            model.flat[offset : offset + shape[0]] = rng.standard_normal(shape[0]) * 0.1


@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_model(batch):
    rng = np.random.default_rng(20)
    model = mlp(in_features=12, hidden=7, classes=4, seed=3, dtype=np.float64)
    randomise_biases(model, rng)
    x = rng.standard_normal((batch, 3, 4))  # Flatten turns (3, 4) into 12 features
    check_model(model, x, SoftmaxCrossEntropy(), rng.integers(0, 4, batch))


def test_cnn_model():
    rng = np.random.default_rng(21)
    model = cnn(in_channels=2, image_size=8, channels=(3, 5), classes=4, seed=4, dtype=np.float64)
    randomise_biases(model, rng)
    x = rng.standard_normal((3, 2, 8, 8))
    check_model(model, x, SoftmaxCrossEntropy(), rng.integers(0, 4, 3))


def test_autoencoder_model():
    rng = np.random.default_rng(22)
    model = autoencoder(in_channels=3, image_size=8, channels=(4, 3), seed=5, dtype=np.float64)
    randomise_biases(model, rng)
    x = rng.standard_normal((2, 3, 8, 8))
    check_model(model, x, MSELoss(), rng.standard_normal((2, 3, 8, 8)))


def test_input_grad_false_gives_the_same_parameter_gradients():
    rng = np.random.default_rng(23)
    for model in (mlp(12, 7, 4, seed=1, dtype=np.float64), cnn(1, 8, (3, 5), 4, seed=1, dtype=np.float64)):
        x = rng.standard_normal((4, 1, 8, 8) if len(model) > 4 else (4, 12))
        y = rng.integers(0, 4, 4)
        ce = SoftmaxCrossEntropy()
        grads = []
        for input_grad in (True, False):
            model.zero_grad()
            ce.forward(model.forward(x), y)
            out = model.backward(ce.backward(), input_grad=input_grad)
            assert (out is None) == (not input_grad)
            grads.append(model.flat_grad.copy())
        np.testing.assert_array_equal(grads[0], grads[1])
