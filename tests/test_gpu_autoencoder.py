"""E5's autoencoder on the GPU engine: every autoencoder variant against cpu-numpy from the same init and order.

Under the simulator (tiny shapes: 2x4x4 images, channels (3, 2), latent 2x1x1): one-batch gradients within 1e-5 of
cpu-numpy's at an odd batch, and a short epoch (5 samples in batches of 3, a partial last batch) and a batch-1 epoch
(the paper's one image per step) ending within 1e-4 in parameters (each test on the variants it adds something
for: the simulator runs these convolutions slowly). gpu-graph needs a real GPU: its eager twin (the
same policy without graphs) runs here. The GPU encoder of gpunn.features is checked against the CPU encoder. On a
real GPU (-m gpu): the real network (3x32x32, channels 256 and 128) on 1 000 CIFAR-shaped images, each variant's
per-epoch MSE within 1e-4 of cpu-numpy's.
"""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.policy import POLICIES
from gpunn.backends.registry import VARIANTS, fastest_gpu_variant, make_backend, variants_for
from gpunn.nn import build_model
from gpunn.seeding import batch_order

TINY = {"in_channels": 2, "image_size": 4, "channels": (3, 2)}  # few (co, ci) slices: the simulator's cost
REAL = {"in_channels": 3, "image_size": 32, "channels": (256, 128)}
AE_VARIANTS = ("gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph")
SIMULATED = ("gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph-eager")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def pair(variant, sizes=TINY, lr=0.1, seed=3):
    """cpu-numpy and a GPU backend of `variant` (gpu-graph-eager: gpu-graph's policy without the capture) from the
    same init."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine

    ref = CpuNumpyBackend(build_model("autoencoder", seed=seed, **sizes), "autoencoder", lr)
    model = build_model("autoencoder", seed=seed, **sizes)
    if variant == "gpu-graph-eager":
        policy = dataclasses.replace(POLICIES["gpu-graph"], name=variant, graphs=False)
        return ref, GpuEngine(model, "autoencoder", lr, policy)
    return ref, make_backend(variant, model, "autoencoder", lr)


def images(n, sizes=TINY, seed=1):
    side = sizes["image_size"]
    return np.random.default_rng(seed).random((n, sizes["in_channels"], side, side), dtype=np.float32)


# ---- the registry and the policies


def test_autoencoder_variants_are_registered_with_the_seeds_designs():
    assert variants_for("autoencoder", gpu=True) == [*AE_VARIANTS, "gpu-tf32", "gpu-bf16"]
    assert variants_for("autoencoder", simulator=True) == ["cpu-numpy", *AE_VARIANTS[:3]]
    assert fastest_gpu_variant("autoencoder", simulator=False) == "gpu-graph"
    assert fastest_gpu_variant("autoencoder", simulator=True) == "gpu-im2col"
    tiled, im2col = POLICIES["gpu-tiled"], POLICIES["gpu-im2col"]
    # the paper's optimized v1: shared-memory tiles, block-reduction weight and bias gradients
    assert tiled.conv == {"forward": "tiled", "backward_data": "tiled", "backward_weight": "block",
                          "bias_grad": "block"}
    # its v2: the implicit-im2col GEMM for all three passes
    assert {im2col.conv[s] for s in ("forward", "backward_data", "backward_weight")} == {"implicit_gemm"}
    assert not any(VARIANTS[v].blocks for v in ("gpu-tiled", "gpu-im2col", "gpu-graph"))


# ---- numerics against cpu-numpy (simulator, tiny shapes)


@pytest.mark.parametrize("variant", SIMULATED)
def test_one_batch_gradients_match_cpu(variant):
    ref, gpu = pair(variant)
    x = images(3)
    expected = ref.gradients(x, x)
    assert np.abs(expected).max() > 0
    assert rel_err(gpu.gradients(x, x), expected) < 1e-5
    assert rel_err(gpu.predict(x), ref.predict(x)) < 1e-5


# gpu-naive's per-step epoch: the batch-1 test below
@pytest.mark.parametrize("variant", ["gpu-tiled", "gpu-im2col", "gpu-graph-eager"])
def test_short_epoch_matches_cpu(variant):
    ref, gpu = pair(variant, lr=0.2)
    x = images(5)
    for backend in (ref, gpu):
        backend.load_train_data(x, None)
    gpu.warm_up({3, 2})
    order = batch_order(5, 0, len(x))
    ref_result, gpu_result = ref.train_epoch(order, 3), gpu.train_epoch(order, 3)
    assert gpu_result.steps == ref_result.steps == 2
    assert gpu_result.loss == pytest.approx(ref_result.loss, rel=1e-5)
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-4


@pytest.mark.parametrize("variant", ["gpu-naive"])
def test_batch_one_the_seeds_setting_matches_cpu(variant):
    ref, gpu = pair(variant, lr=0.2)
    x = images(3, seed=4)
    for backend in (ref, gpu):
        backend.load_train_data(x, None)
    order = batch_order(2, 0, len(x))
    ref_result, gpu_result = ref.train_epoch(order, 1), gpu.train_epoch(order, 1)
    assert gpu_result.steps == 3
    assert gpu_result.loss == pytest.approx(ref_result.loss, rel=1e-5)
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-4


def test_engine_predicts_the_encoder_alone():
    ref, gpu = pair("gpu-im2col")
    x = images(5)
    model = ref.model
    latent = gpu.predict(x, layers=model.n_encoder)
    assert latent.shape == (5, 2, 1, 1)
    assert rel_err(latent, model.encode(x)) < 1e-5
    assert rel_err(gpu.predict(x), ref.predict(x)) < 1e-5  # the whole model still predicts after it


def _trained_run(tmp_path, variant, n_train=6, n_test=4):
    """A run folder of `variant` (weights of a tiny autoencoder after one cpu-numpy step) and a prepared split of
    CIFAR-shaped uint8 images, as `gpunn features` reads them."""
    from gpunn.io import write_npz
    from gpunn.rundata import RunData
    from gpunn.runspec import RunSpec
    from gpunn.weights import save_weights

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (n_train + n_test, 2, 4, 4), dtype=np.uint8)
    labels = rng.integers(0, 10, n_train + n_test).astype(np.uint8)
    prepared = tmp_path / "prepared.npz"
    write_npz(prepared, x_train=pixels[:n_train], y_train=labels[:n_train], x_test=pixels[n_train:],
              y_test=labels[n_train:], class_names=np.array([str(i) for i in range(10)]),
              dataset=np.array("synthetic_cifar10_small"), split=np.array("standard"))
    spec = RunSpec("synthetic_cifar10_small", "standard", "autoencoder", variant, TINY["channels"], 2, 0.1, 1, 3)
    model = build_model("autoencoder", seed=3, **TINY)
    model.load_flat(model.flat + np.float32(0.01) * np.random.default_rng(1).standard_normal(model.flat.size,
                                                                                               dtype=np.float32))
    data = RunData(x_train=pixels[:n_train], y_train=labels[:n_train], x_test=pixels[n_train:],
                   y_test=labels[n_train:], image_shape=(2, 4, 4), num_classes=10, class_names=None)
    run_dir = tmp_path / "run"
    save_weights(run_dir / "weights.npz", spec, model, model.flat, data)
    return run_dir, prepared, model


def test_features_of_a_gpu_run_are_encoded_on_the_gpu(tmp_path):
    from gpunn.features import extract_features
    from gpunn.rundata import images_to_float

    run_dir, prepared, model = _trained_run(tmp_path, "gpu-im2col")
    lines = []
    sizes = extract_features(run_dir, prepared, tmp_path / "features", batch=4, log=lines.append)
    assert sizes == {"train": [6, 2], "test": [4, 2]}
    checked = "GPU encoder (gpu-im2col) checked against the CPU encoder on 6 training images"
    assert any(checked in line for line in lines)
    features = np.load(tmp_path / "features" / "train_features.npy")
    assert features.dtype == np.float32
    with np.load(prepared) as split:
        expected = model.encode(images_to_float(split["x_train"])).reshape(6, -1)
    assert rel_err(features, expected) < 1e-5


@pytest.mark.parametrize("step", ["features", "evaluate"])
def test_a_wrong_gpu_forward_stops_with_one_line(tmp_path, monkeypatch, step):
    """The features and evaluate steps check the run's GPU engine against the CPU layers first: 0.1 % off stops the
    step with one line naming it, before any output."""
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.errors import GpunnError
    from gpunn.evaluate import evaluate_run
    from gpunn.features import extract_features

    run_dir, prepared, _ = _trained_run(tmp_path, "gpu-naive")
    real_predict = GpuEngine.predict
    monkeypatch.setattr(GpuEngine, "predict", lambda self, xb, layers=None: real_predict(self, xb, layers) * 1.001)
    what, images, run_step, output = {
        "features": ("encoder", "6 training", extract_features, "train_features.npy"),
        "evaluate": ("forward", "4 test", evaluate_run, "eval.json")}[step]
    with pytest.raises(GpunnError, match=rf"the gpu-naive {what} differs from the CPU {what} by 1\.00e-03 "
                                         rf"\(relative\) on {images} images, more than 1e-05"):
        run_step(run_dir, prepared, tmp_path / step, log=lambda line: None)
    assert not (tmp_path / step / output).exists()


def test_evaluate_runs_a_gpu_run_on_its_engine_checked_against_the_cpu(tmp_path):
    """The evaluate step of a GPU variant's run forwards the test set through the run's engine (seconds on a GPU
    where cpu-numpy took minutes), after a check against the CPU layers; eval.json names what ran."""
    from gpunn.evaluate import evaluate_run
    from gpunn.rundata import images_to_float

    run_dir, prepared, model = _trained_run(tmp_path, "gpu-naive")
    lines = []
    result = evaluate_run(run_dir, prepared, tmp_path / "eval", log=lines.append)
    assert result["evaluated_with"] == "gpu-naive"
    assert any("GPU forward (gpu-naive) checked against the CPU forward on 4 test images" in line for line in lines)
    with np.load(prepared) as split:
        x = images_to_float(split["x_test"])
    expected = float(np.mean((model.forward(x).astype(np.float64) - x) ** 2))
    assert result["test_loss"] == pytest.approx(expected, rel=1e-5)


# ---- real GPU: the real network on 1 000 CIFAR-shaped images


@pytest.fixture(scope="module")
def cpu_reference():
    """cpu-numpy's per-epoch MSE over 2 epochs of 1 000 CIFAR-shaped images at batch 64 (shared by the variants)."""
    x = images(1000, REAL, seed=11)
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    ref = CpuNumpyBackend(build_model("autoencoder", seed=0, **REAL), "autoencoder", 0.002)
    ref.load_train_data(x, None)
    losses = [ref.train_epoch(batch_order(0, epoch, len(x)), 64).loss for epoch in range(2)]
    return x, losses, ref.parameters().copy()


@pytest.mark.gpu
@pytest.mark.parametrize("variant", AE_VARIANTS)
def test_gpu_variants_match_cpu_mse_per_epoch_on_1000_images(variant, cpu_reference):
    x, expected, expected_params = cpu_reference
    gpu = make_backend(variant, build_model("autoencoder", seed=0, **REAL), "autoencoder", 0.002)
    gpu.load_train_data(x, None)
    gpu.warm_up({64, len(x) % 64})
    losses = [gpu.train_epoch(batch_order(0, epoch, len(x)), 64).loss for epoch in range(2)]
    assert losses[1] < losses[0]
    for got, want in zip(losses, expected):
        assert got == pytest.approx(want, rel=1e-4)
    assert rel_err(gpu.parameters(), expected_params) < 1e-3


@pytest.mark.parametrize("bias_with_weight", [False, True])
def test_one_batch_gradients_match_cpu_with_winograd(monkeypatch, bias_with_weight):
    """gpu-graph's Winograd rule on every plain 3x3 padding-1 conv (its channel threshold lowered to the tiny net's):
    the engine's weight and gradient views, the ReLU masks and the bias gradient around conv.winograd: by the split
    reduction's launches, or (policy.AUTO_WINOGRAD_BIAS) made by the weight gradient's dy transform, plain and
    upsampled (the tiny net's every conv then runs no bias launch of its own)."""
    from gpunn.backends.gpu import policy as P
    from gpunn.backends.gpu.engine import _launches

    monkeypatch.setattr(P, "AUTO_WINOGRAD_MIN_PRODUCT", 1)
    monkeypatch.setattr(P, "AUTO_WINOGRAD_BIAS", bias_with_weight)
    assert P.conv_version(POLICIES["gpu-graph"], "backward_weight", 3, 2, 3, 1, (2, 2)) == "winograd"
    ref, gpu = pair("gpu-graph-eager")
    x = images(3)
    expected = ref.gradients(x, x)
    assert rel_err(gpu.gradients(x, x), expected) < 1e-5
    assert rel_err(gpu.predict(x), ref.predict(x)) < 1e-5
    program = gpu._step_program(3, x.shape[1:])
    names = [launch.name for launch in _launches(program.backward)]
    made = [name for name in names if "winograd" in name and name.endswith("+ bias]")]
    split = [name for name in names if name.startswith("conv_bias_grad_split[")]
    wgrads = [name for name in names if "winograd" in name and "+ weight transform" in name]  # finishing launches
    assert wgrads and any("winograd_up" in name for name in wgrads)
    assert len(made) == (len(wgrads) if bias_with_weight else 0), names
    assert bool(split) != bias_with_weight or len(split) < len(wgrads), names
