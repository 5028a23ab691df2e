"""Models, the flat parameter buffer, SGD and the plan's Python API."""

import numpy as np
import pytest

from gpunn.nn import (
    SGD,
    Autoencoder,
    Conv2d,
    Flatten,
    Linear,
    MSELoss,
    ParameterBuffer,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    autoencoder,
    backward,
    build_model,
    cnn,
    forward,
    mlp,
    parameters,
)
from gpunn.seeding import batch_slices


def max_rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------- sizes
def test_parameter_counts_of_the_papers_models():
    assert mlp().num_parameters == 203_530
    assert cnn().num_parameters == 50_890
    assert autoencoder().num_parameters == 751_875


def test_layouts():
    assert [(n, o, s) for n, o, s in mlp().layout()] == [
        ("1.weight", 0, (784, 256)),
        ("1.bias", 200_704, (256,)),
        ("3.weight", 200_960, (256, 10)),
        ("3.bias", 203_520, (10,)),
    ]
    names = [n for n, _, _ in cnn().layout()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "6.weight", "6.bias"]
    assert cnn().layout()[4][2] == (4608, 10)
    assert cnn(image_size=8).layout()[4][2] == (32 * 2 * 2, 10)
    ae = autoencoder()
    assert [s for _, _, s in ae.layout()][::2] == [(256, 3, 3, 3), (128, 256, 3, 3), (128, 128, 3, 3),
                                                   (256, 128, 3, 3), (3, 256, 3, 3)]
    # offsets are contiguous and cover the buffer
    for model in (mlp(), cnn(), ae):
        end = 0
        for _, offset, shape in model.layout():
            assert offset == end
            end += int(np.prod(shape))
        assert end == model.num_parameters == model.flat.size == model.flat_grad.size


def test_build_model_dispatch():
    assert build_model("mlp", hidden=32).num_parameters == 784 * 32 + 32 + 32 * 10 + 10
    assert build_model("cnn", image_size=8, channels=(3, 5)).num_parameters == cnn(1, 8, (3, 5)).num_parameters
    assert isinstance(build_model("autoencoder", image_size=8, channels=(4, 3)), Autoencoder)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet")


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="multiple of 4"):
        autoencoder(image_size=30)
    with pytest.raises(ValueError, match="too small"):
        cnn(image_size=5)
    with pytest.raises(ValueError, match="in_features"):
        Linear(0, 3)
    with pytest.raises(ValueError, match="out_channels"):
        Conv2d(3, 0)
    with pytest.raises(ValueError, match="dtype"):
        mlp(dtype=np.float16)


# --------------------------------------------------------------------------------------------- init
def test_same_seed_same_buffer_different_seed_different():
    for make in (lambda s: mlp(seed=s), lambda s: cnn(seed=s), lambda s: autoencoder(3, 8, (4, 3), seed=s)):
        a, b, c = make(7), make(7), make(8)
        np.testing.assert_array_equal(a.flat, b.flat)
        assert not np.array_equal(a.flat, c.flat)


def test_float64_init_rounds_to_float32_init():
    m64 = cnn(seed=3, dtype=np.float64)
    m32 = cnn(seed=3, dtype=np.float32)
    assert m64.flat.dtype == np.float64 and m32.flat.dtype == np.float32
    np.testing.assert_array_equal(m64.flat.astype(np.float32), m32.flat)


def test_he_init_statistics_and_zero_biases():
    model = mlp(seed=0)
    w1 = model[1].weight.data
    assert abs(w1.std() - np.sqrt(2 / 784)) < 0.02 * np.sqrt(2 / 784)
    assert abs(w1.mean()) < 1e-3
    conv = cnn(seed=0)[2].weight.data
    assert abs(conv.std() - np.sqrt(2 / (16 * 9))) < 0.05 * np.sqrt(2 / (16 * 9))
    for name, offset, shape in model.layout():
        if name.endswith("bias"):
            assert not model.flat[offset : offset + shape[0]].any()


# --------------------------------------------------------------------------------------------- flat buffer
def test_parameters_are_views_into_the_flat_buffer():
    model = cnn(image_size=8, channels=(3, 5))
    params = model.parameters()
    assert isinstance(params, ParameterBuffer)
    assert params.data is model.flat and params.grad is model.flat_grad
    assert [p.name for p in params] == [n for n, _, _ in model.layout()]
    for p, (_, _, shape) in zip(params, model.layout()):
        assert p.data.shape == shape == p.grad.shape
        assert np.shares_memory(p.data, model.flat) and np.shares_memory(p.grad, model.flat_grad)
    model.load_flat(np.arange(model.num_parameters, dtype=np.float64))
    for p, (_, offset, _) in zip(params, model.layout()):
        np.testing.assert_array_equal(p.data.reshape(-1), np.arange(offset, offset + p.size))
    assert model[0].weight.data[0, 0, 0, 1] == 1.0
    with pytest.raises(ValueError, match="load_flat"):
        model.load_flat(np.zeros(3))


def test_one_sgd_step_updates_every_parameter_and_zeroes_grads():
    model = mlp(in_features=6, hidden=5, classes=3, seed=0)
    before = model.flat.copy()
    rng = np.random.default_rng(0)
    ce = SoftmaxCrossEntropy()
    ce.forward(model.forward(rng.standard_normal((4, 6))), np.array([0, 1, 2, 0]))
    model.backward(ce.backward())
    grad = model.flat_grad.copy()
    assert np.count_nonzero(grad) > 0.8 * grad.size
    opt = SGD(model.parameters(), lr=0.5)
    assert opt.flat is not None
    opt.step()
    np.testing.assert_array_equal(model.flat, before - np.float32(0.5) * grad)
    assert not model.flat_grad.any()
    # the layers see the update (views), and a list-based SGD gives the same result
    np.testing.assert_array_equal(model[1].weight.data.reshape(-1), model.flat[:30])
    m2 = mlp(in_features=6, hidden=5, classes=3, seed=0)
    m2.flat_grad[...] = grad
    SGD(list(m2.parameters()), lr=0.5).step()
    np.testing.assert_array_equal(m2.flat, model.flat)
    assert not m2.flat_grad.any()


def test_backward_accumulates_until_zero_grad():
    model = mlp(in_features=6, hidden=5, classes=3, seed=0, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((4, 6))
    ce = SoftmaxCrossEntropy()
    ce.forward(model.forward(x), np.array([0, 1, 2, 0]))
    model.backward(ce.backward())
    g1 = model.flat_grad.copy()
    model.forward(x)
    model.backward(ce.backward())
    np.testing.assert_allclose(model.flat_grad, 2 * g1)
    model.zero_grad()
    assert not model.flat_grad.any()


def test_astype_copies_values_independently():
    ae = autoencoder(image_size=8, channels=(4, 3), seed=2)
    ae64 = ae.astype(np.float64)
    assert isinstance(ae64, Autoencoder) and ae64.n_encoder == ae.n_encoder
    assert ae64.flat.dtype == np.float64 and ae64[0].weight.data.dtype == np.float64
    np.testing.assert_array_equal(ae64.flat, ae.flat.astype(np.float64))
    assert not np.shares_memory(ae64.flat, ae.flat)
    ae64.flat[...] = 0
    assert ae.flat.any()
    assert np.shares_memory(ae64[0].weight.data, ae64.flat)


# --------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize(
    "make,shape",
    [
        (lambda: mlp(seed=1), (8, 1, 28, 28)),
        (lambda: cnn(seed=1), (4, 1, 28, 28)),
        (lambda: autoencoder(seed=1), (2, 3, 32, 32)),
    ],
)
def test_float32_forward_agrees_with_float64(make, shape):
    m32 = make()
    m64 = m32.astype(np.float64)
    x = np.random.default_rng(2).random(shape, dtype=np.float32)
    y32 = m32.forward(x)
    y64 = m64.forward(x.astype(np.float64))
    assert y32.dtype == np.float32 and y64.dtype == np.float64
    assert max_rel(y32, y64) < 1e-5
    if isinstance(m32, Autoencoder):
        z32, z64 = m32.encode(x), m64.encode(x.astype(np.float64))
        assert z32.shape == (2, 128, 8, 8)
        assert max_rel(z32, z64) < 1e-5


@pytest.mark.parametrize(
    "model,shape,kind",
    [
        (mlp(in_features=64, hidden=16, seed=0, dtype=np.float64), (1, 8, 8), "ce"),
        (cnn(image_size=8, channels=(3, 5), seed=0, dtype=np.float64), (1, 8, 8), "ce"),
        (autoencoder(image_size=8, channels=(4, 3), seed=0, dtype=np.float64), (3, 8, 8), "mse"),
    ],
)
def test_batch_one_and_partial_batch_match_the_full_batch(model, shape, kind):
    """Samples do not interact: forward of a batch of 7 equals the forwards of its partial batches
    (batch_slices(7, 3): 3, 3, 1), and the batch-mean gradient equals the size-weighted mean of theirs."""
    rng = np.random.default_rng(3)
    n = 7
    x = rng.standard_normal((n,) + shape)
    loss_fn = SoftmaxCrossEntropy() if kind == "ce" else MSELoss()
    target = rng.integers(0, 10, n) if kind == "ce" else rng.standard_normal((n,) + shape)
    model.zero_grad()
    full = model.forward(x)
    loss_fn.forward(full, target)
    model.backward(loss_fn.backward())
    g_full = model.flat_grad.copy()
    g_parts = np.zeros_like(g_full)
    for start, stop in batch_slices(n, 3):
        model.zero_grad()
        part = model.forward(x[start:stop])
        np.testing.assert_allclose(part, full[start:stop], rtol=1e-12, atol=1e-12)
        loss_fn.forward(part, target[start:stop])
        model.backward(loss_fn.backward())
        g_parts += model.flat_grad * (stop - start) / n
    np.testing.assert_allclose(g_parts, g_full, rtol=1e-10, atol=1e-12)


def test_zero_sized_and_mismatched_inputs_raise():
    model = mlp()
    with pytest.raises(ValueError, match="zero-sized"):
        model.forward(np.zeros((0, 784), np.float32))
    with pytest.raises(ValueError, match=r"linear_forward.*\(4, 783\)"):
        model.forward(np.zeros((4, 783), np.float32))
    with pytest.raises(ValueError, match="conv2d_forward"):
        cnn().forward(np.zeros((2, 3, 28, 28), np.float32))
    with pytest.raises(ValueError, match="zero-sized"):
        cnn().forward(np.zeros((2, 1, 0, 28), np.float32))
    with pytest.raises(ValueError, match="softmax_cross_entropy"):
        SoftmaxCrossEntropy().forward(np.zeros((4, 10), np.float32), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="mse_forward"):
        MSELoss().forward(np.zeros((2, 3, 8, 8)), np.zeros((2, 3, 8, 4)))
    with pytest.raises(ValueError, match="Sequential"):
        Sequential([Flatten(), "relu"])


# --------------------------------------------------------------------------------------------- the plan's API
def blobs(rng, n, dim, classes):
    centers = rng.standard_normal((classes, dim)) * 3
    labels = rng.integers(0, classes, n)
    return (centers[labels] + rng.standard_normal((n, dim))).astype(np.float32), labels


def test_plan_api_standalone_layers_train():
    rng = np.random.default_rng(0)
    x, y = blobs(rng, 256, 784, 10)
    layers = [Linear(784, 256), ReLU(), Linear(256, 10)]
    assert layers[0].weight.data.dtype == np.float32 and layers[0].weight.data.shape == (784, 256)
    opt = SGD(parameters(layers), lr=0.01)
    losses = []
    for step in range(20):
        xb, yb = x[(step % 4) * 64 : (step % 4 + 1) * 64], y[(step % 4) * 64 : (step % 4 + 1) * 64]
        logits = forward(layers, xb)
        loss, grad = SoftmaxCrossEntropy.forward_and_grad(logits, yb)
        backward(layers, grad)
        opt.step()
        losses.append(loss)
        assert not layers[0].weight.grad.any()  # step() zeroed the accumulated gradients
    assert losses[-1] < 0.5 * losses[0]
    accuracy = np.mean(forward(layers, x).argmax(axis=1) == y)
    assert accuracy > 0.9


def test_sequential_training_loop_loss_goes_down():
    rng = np.random.default_rng(1)
    x, y = blobs(rng, 512, 20, 4)
    model = mlp(in_features=20, hidden=32, classes=4, seed=0)
    opt = SGD(model.parameters(), lr=0.1)
    ce = SoftmaxCrossEntropy()
    epoch_losses = []
    for _ in range(3):
        total = 0.0
        for start, stop in batch_slices(len(x), 64):
            total += ce.forward(model.forward(x[start:stop]), y[start:stop]) * (stop - start)
            model.backward(ce.backward(), input_grad=False)
            opt.step()
        epoch_losses.append(total / len(x))
    assert epoch_losses[2] < epoch_losses[0]
    assert np.mean(model.forward(x).argmax(1) == y) > 0.95


def test_autoencoder_encode_decode():
    ae = autoencoder(in_channels=3, image_size=8, channels=(4, 3), seed=0)
    x = np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32)
    z = ae.encode(x)
    assert z.shape == (2, 3, 2, 2) and ae.latent_shape == (3, 2, 2)
    np.testing.assert_array_equal(ae.decode(z), ae.forward(x))
    mse = MSELoss()
    opt = SGD(ae.parameters(), lr=0.05)
    first = None
    for _ in range(30):
        loss = mse.forward(ae.forward(x), x)
        first = loss if first is None else first
        ae.backward(mse.backward(), input_grad=False)
        opt.step()
    assert loss < first


def test_cpu_numpy_predicts_in_chunks_of_the_training_batch(monkeypatch):
    """cpu-numpy's predict forwards PREDICT_CHUNK samples at a time (the evaluation's batches of 1000 outgrow the
    caches): the outputs are the chunks' forwards, equal to the whole batch's up to BLAS rounding."""
    from gpunn.backends import cpu_numpy

    model = cnn(in_channels=1, image_size=8, channels=(3, 4), classes=5, seed=1)
    backend = cpu_numpy.CpuNumpyBackend(model, "cnn", 0.1)
    x = np.random.default_rng(2).random((11, 1, 8, 8), dtype=np.float32)
    monkeypatch.setattr(cpu_numpy, "PREDICT_CHUNK", 4)
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda xb: calls.append(len(xb)) or forward(xb))
    out = backend.predict(x)
    assert calls == [4, 4, 3]
    np.testing.assert_allclose(out, forward(x), rtol=1e-6, atol=1e-6)
    mlp_model = mlp(in_features=6, hidden=5, classes=3, seed=1)  # no convolutions: one forward, as before
    calls.clear()
    forward_mlp = mlp_model.forward
    monkeypatch.setattr(mlp_model, "forward", lambda xb: calls.append(len(xb)) or forward_mlp(xb))
    cpu_numpy.CpuNumpyBackend(mlp_model, "mlp", 0.1).predict(np.zeros((11, 6), np.float32))
    assert calls == [11]
