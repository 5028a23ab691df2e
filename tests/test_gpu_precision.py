"""Policy.precision (tf32, bf16) and the variants gpu-tf32, gpu-bf16: every GEMM and Conv2d pass at least
TENSOR_MIN_SIDE on each GEMM side (a conv's tile-wide channel side at least TENSOR_MIN_CHANNELS) on the
tensor-core GEMM versions, inputs rounded to the format, float32 accumulation; smaller products, weights and loss in
float32. The simulator tests lower both to 1 (the
`everywhere` fixture) so that tiny nets reach the tensor-core paths; the GPU tests run the real rule.

The bound on one step's gradients (and the predictions) against cpu-numpy from the same init: a few units of the
format's rounding, u = 2^-11 (TF32: 10 mantissa bits, to nearest) and 2^-8 (BF16: 7 bits), against 1e-5 for FP32.
Under the simulator (tiny shapes) TF32 came out at 4e-4 to 1e-3 and BF16 at 4e-3 to 1.2e-2; the tests allow 8u
(3.9e-3 and 3.1e-2) and require more than 1e-5, so a pass that silently ran in FP32 fails too.
"""

import dataclasses
import re

import numpy as np
import pytest

from gpunn.backends.gpu import policy as P
from gpunn.backends.gpu.policy import (
    BIAS_WITH_WEIGHT,
    POLICIES,
    Policy,
    conv_version,
    gemm_version,
    pool_fused,
    precision_gemm,
)
from gpunn.nn import build_model

UNIT = {"tf32": 2.0**-11, "bf16": 2.0**-8}
BOUND = {fmt: 8 * u for fmt, u in UNIT.items()}
FP32_BOUND = 1e-5
# on a GPU, one step at the real shapes: 12 units (an H200 gave TF32 up to 4.6e-3 = 9.4u, the CNN's, whose conv2
# weight gradient summed 9 216 products in the tensor cores' float32 accumulation, which truncates, before stop 57
# kept that conv on float32 kernels; BF16 within 8u)
GPU_BOUND = {fmt: 12 * u for fmt, u in UNIT.items()}
SIZES = {
    "cnn": {"in_channels": 1, "image_size": 8, "channels": (2, 3), "classes": 4},
    "mlp": {"in_features": 20, "hidden": 16, "classes": 4},
    "autoencoder": {"channels": (4, 3), "image_size": 8},
}
SHAPES = {"cnn": (3, 1, 8, 8), "mlp": (3, 20), "autoencoder": (3, 3, 8, 8)}


@pytest.fixture
def everywhere(monkeypatch):
    """Every product on the tensor cores, however small (the tiny nets' sides are 2 to 20)."""
    monkeypatch.setattr(P, "TENSOR_MIN_SIDE", 1)
    monkeypatch.setattr(P, "TENSOR_MIN_CHANNELS", 1)


def _policy(model, precision):
    """The registered variant gpu-<precision> without the capture (the simulator has no CUDA graphs)."""
    return dataclasses.replace(POLICIES[f"gpu-{precision}"], graphs=False)


def test_the_variants_are_gpu_graphs_design_on_the_tensor_cores():
    """gpu-tf32 and gpu-bf16: gpu-graph's policy but for the precision and the MLP's per-layer step, for all
    three models, deterministic; real GPU only (graphs)."""
    from gpunn.backends.registry import VARIANTS

    for fmt in ("tf32", "bf16"):
        policy, entry = POLICIES[f"gpu-{fmt}"], VARIANTS[f"gpu-{fmt}"]
        assert policy == dataclasses.replace(POLICIES["gpu-graph"], name=f"gpu-{fmt}", precision=fmt, step="layers")
        assert entry.models == ("mlp", "cnn", "autoencoder") and entry.deterministic and not entry.simulator


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def test_the_products_that_fill_the_tiles_go_to_the_tensor_cores():
    """The real rule at the real models' shapes: each GEMM side at least TENSOR_MIN_SIDE (32), a conv's tile-wide
    channel side at least TENSOR_MIN_CHANNELS (64)."""
    policy, graph = POLICIES["gpu-bf16"], POLICIES["gpu-graph"]
    assert precision_gemm(policy) == "tensor_bf16" and precision_gemm(graph) is None
    # the MLP: fc1's forward (64 x 256 over 785) and weight gradient on the tensor cores, fc2 (10 wide) not
    assert gemm_version(policy, 64, 256, 785) == "tensor_bf16" == gemm_version(policy, 785, 256, 64)
    assert gemm_version(policy, 64, 10, 257) == gemm_version(graph, 64, 10) == "tiled16"
    assert gemm_version(policy, 64, 256) == gemm_version(graph, 64, 256)  # no K given: the float32 rule
    # the autoencoder's 256 -> 128 conv: every pass; Winograd's where gpu-graph runs it, its batched GEMM tensor
    for step in ("forward", "backward_data", "backward_weight"):
        assert P.tensor_pass(policy, step, 256, 128, 3) and not P.tensor_pass(graph, step, 256, 128, 3)
        assert conv_version(policy, step, 256, 128, 3, 1, (16, 16)) == "winograd"
    # its first conv (K = 27) and last (3 outputs): float32 kernels, the fused pool stage where gpu-graph has one
    assert not any(P.tensor_pass(policy, step, 3, 256, 3) for step in ("forward", "backward_weight"))
    assert not any(P.tensor_pass(policy, step, 256, 3, 3) for step in ("forward", "backward_data", "backward_weight"))
    # ... but on its upsampled input the last conv's input gradient is one GEMM over the summed 4x4 taps (K = 48)
    assert P.tensor_pass(policy, "backward_data", 256, 3, 3, up=True)
    assert not any(P.tensor_pass(policy, step, 256, 3, 3, up=True) for step in ("forward", "backward_weight"))
    assert conv_version(policy, "backward_data", 256, 3, 3, 1, (32, 32), up=True) == "implicit_gemm"
    assert conv_version(policy, "backward_weight", 256, 3, 3, 1, (32, 32)) == "staged"
    assert pool_fused(policy, 3, 256, 3) and pool_fused(graph, 3, 256, 3)
    # the CNN's 16 -> 32 conv: 32 outputs fill a quarter of a tensor tile (TENSOR_MIN_CHANNELS, measured slower):
    # every pass float32, in gpu-graph's fused pool stage; with 64 outputs its forward and weight gradient tensor
    assert not any(P.tensor_pass(policy, s, 16, 32, 3) for s in ("forward", "backward_data", "backward_weight"))
    assert conv_version(policy, "forward", 16, 32, 3, 0, (14, 14)) == conv_version(graph, "forward", 16, 32, 3, 0,
                                                                                   (14, 14))
    assert pool_fused(policy, 16, 32, 3) and pool_fused(graph, 16, 32, 3)
    assert [P.tensor_pass(policy, s, 16, 64, 3) for s in ("forward", "backward_data", "backward_weight")] == [
        True, False, True]
    assert not pool_fused(policy, 16, 64, 3)
    # the bias gradient, a sum (float32): made by the Winograd weight gradient's dy transform (AUTO_WINOGRAD_BIAS)
    assert conv_version(policy, "bias_grad", 256, 128, 3, 1) == (BIAS_WITH_WEIGHT if P.AUTO_WINOGRAD_BIAS else "split")


def test_a_gpu_without_tf32_and_bf16_tensor_cores_is_refused_in_one_line(monkeypatch):
    """On a T4 (compute capability 7.5, the papers' GPU) the variants stop before building anything, naming the
    GPU and an FP32 variant; under the simulator the graphs' refusal names the model's eager twin."""
    from numba import cuda as numba_cuda

    from gpunn import device
    from gpunn.backends.registry import make_backend
    from gpunn.errors import GpunnError

    model = build_model("cnn", seed=3, **SIZES["cnn"])
    with pytest.raises(GpunnError, match=r"^variant gpu-bf16 captures CUDA graphs, which numba's CUDA simulator "
                                         r"lacks; under the simulator use gpu-im2col \(no graphs\) for the cnn$"):
        make_backend("gpu-bf16", model, "cnn", 0.1)

    class T4:
        compute_capability = (7, 5)
        name = b"Tesla T4"

    from gpunn.backends.gpu import engine

    for module in (device, engine):
        monkeypatch.setattr(module, "simulator_enabled", lambda: False)
    monkeypatch.setattr(numba_cuda, "get_current_device", lambda: T4)
    with pytest.raises(GpunnError, match=r"^variant gpu-tf32 multiplies in TF32 or BF16 on the tensor cores, which "
                                         r"need a GPU of compute capability 8.0 or newer \(Tesla T4 is 7.5\); "
                                         r"choose a float32 variant such as gpu-graph$"):
        make_backend("gpu-tf32", model, "cnn", 0.1)


def test_precision_needs_the_per_layer_step():
    with pytest.raises(ValueError, match="precision must be one of .*'fp32', 'tf32', 'bf16'.*got 'fp16'"):
        Policy("p", gemm="auto", fuse=True, resident=True, precision="fp16")
    with pytest.raises(ValueError, match="precision 'tf32' needs step 'layers'"):
        Policy("p", gemm="auto", fuse=True, resident=True, precision="tf32", step="persistent")


@pytest.mark.parametrize("model,precision", [("cnn", "tf32"), ("cnn", "bf16"), ("mlp", "tf32"),
                                             ("autoencoder", "bf16")])
def test_one_step_within_the_formats_bound_of_cpu(model, precision, everywhere):
    """One batch's gradients and the predictions against cpu-numpy from the same init: within BOUND, beyond FP32's
    agreement; the launches are the tensor-core GEMMs'."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    ref = CpuNumpyBackend(build_model(model, seed=3, **SIZES[model]), model, 0.1)
    gpu = GpuEngine(build_model(model, seed=3, **SIZES[model]), model, 0.1, _policy(model, precision))
    rng = np.random.default_rng(1)
    x = rng.random(SHAPES[model], dtype=np.float32)
    y = x if model == "autoencoder" else rng.integers(0, 4, len(x))
    expected = ref.gradients(x, y)
    assert FP32_BOUND < _rel_err(gpu.gradients(x, y), expected) < BOUND[precision]
    assert FP32_BOUND < _rel_err(gpu.predict(x), ref.predict(x)) < BOUND[precision]
    program = gpu._step_program(len(x), x.shape[1:])
    names = [launch.name for launch in _launches(program.forward + program.backward)]
    products = [name for name in names if "gemm" in name and "summed_kernel" not in name]  # (not: a weight sum)
    assert products and all(f"tensor_{precision}" in name for name in products), names
    assert all("implicit_gemm" in name or "bias_grad" in name for name in names if name.startswith("conv_")), names


def test_winograd_passes_run_their_batched_gemms_on_the_tensor_cores(everywhere, monkeypatch):
    """The autoencoder's Winograd passes (the channel threshold lowered to the tiny net's), the upsampled twins
    included, bind their batched GEMMs to tensor_bf16 (their numbers: tests/test_kernels_conv_winograd.py; the
    whole step at the real shapes: the GPU tests below)."""
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    monkeypatch.setattr(P, "AUTO_WINOGRAD_MIN_PRODUCT", 1)
    sizes = {"in_channels": 2, "channels": (3, 2), "image_size": 4}
    gpu = GpuEngine(build_model("autoencoder", seed=3, **sizes), "autoencoder", 0.1, _policy("autoencoder", "bf16"))
    program = gpu._step_program(2, (2, 4, 4))
    names = [launch.name for launch in _launches(program.forward + program.backward)]
    products = [name for name in names if "winograd" in name and "transform" not in name and "sum" not in name]
    assert len(products) == 14 and all("tensor_bf16" in name for name in products), names  # 5 + 4 + 5 passes
    assert sum("_up[" in name for name in products) == 6


def test_winograd_bf16_storage_is_wired_through_the_engine(everywhere, monkeypatch):
    """With layers.WINOGRAD_BF16_STORAGE on (the default since stop 55's measurement), gpu-bf16's Winograd
    transforms write BF16 buffers: their launches say so and their buffers, the forward's kept V included, are
    uint16; off, float32. (Each pass gives the float32 storage's bits: tests/test_kernels_conv_winograd.py; the
    whole step on a GPU: test_gpu_winograd_bf16_storage_gives_the_same_step below.)"""
    from gpunn.backends.gpu import layers
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    monkeypatch.setattr(P, "AUTO_WINOGRAD_MIN_PRODUCT", 1)
    sizes = {"in_channels": 2, "channels": (3, 2), "image_size": 4}
    for storage, dtype in ((False, np.float32), (True, np.uint16)):
        monkeypatch.setattr(layers, "WINOGRAD_BF16_STORAGE", storage)
        gpu = GpuEngine(build_model("autoencoder", seed=3, **sizes), "autoencoder", 0.1,
                        _policy("autoencoder", "bf16"))
        program = gpu._step_program(2, (2, 4, 4))
        transforms = [launch for launch in _launches(program.forward + program.backward)
                      if "input transform" in launch.name or "dy transform" in launch.name]
        assert len(transforms) >= 9, [t.name for t in transforms]  # 5 forward, 4 input-gradient, wgrad dy ones
        assert all(t.name.endswith(",bf16]") == storage for t in transforms)
        assert all(t.args[1].dtype == dtype for t in transforms)  # (src, the buffer it writes, dims)


def test_winograd_bias_with_weight_on_the_tensor_cores(everywhere, monkeypatch):
    """policy.AUTO_WINOGRAD_BIAS on under gpu-bf16 (Winograd on the tiny net's convs): each Winograd weight gradient
    makes its bias gradient too, on tensor_bf16 with BF16 buffers (its launches say so; no split bias launch for
    them). (Its numbers: tests/test_kernels_conv_winograd.py's with-bias tests, BF16 storage included, and the
    engine's gradients with it on: tests/test_gpu_autoencoder.py.)"""
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    monkeypatch.setattr(P, "AUTO_WINOGRAD_MIN_PRODUCT", 1)
    sizes = {"channels": (4, 3), "image_size": 8}
    names = []
    for on in (False, True):
        monkeypatch.setattr(P, "AUTO_WINOGRAD_BIAS", on)
        gpu = GpuEngine(build_model("autoencoder", seed=3, **sizes), "autoencoder", 0.1,
                        _policy("autoencoder", "bf16"))
        names.append([launch.name for launch in _launches(gpu._step_program(3, (3, 8, 8)).backward)])
    # (the two pooled convs' on Winograd's pooled passes, policy.pool_winograd: conv_backward_weight_bias_pool_...)
    made = [name for name in names[1] if re.match(r"conv_backward_weight_bias_(pool_)?winograd", name)]
    assert any("tensor_bf16" in name for name in made), names[1]
    assert any(name.endswith("[dy transform + bias sums,bf16]") for name in made), names[1]
    assert sum(name.endswith("+ bias]") for name in made) == sum("+ weight transform" in n for n in names[1]) > 0
    assert any(name.startswith("conv_backward_weight_bias_pool_winograd") for name in made) == P.AUTO_POOL_WINOGRAD
    assert not any(re.match(r"conv_backward_weight_bias_(pool_)?winograd", name) for name in names[0])
    assert len([n for n in names[1] if n.startswith("conv_bias_grad")]) < len(
        [n for n in names[0] if n.startswith("conv_bias_grad")])


def test_a_short_epoch_stays_within_the_bound_of_cpu(everywhere):
    """Two steps of the CNN (batches of 4 and a partial 3) in the shared order: the loss and the parameters after
    them within BF16's bound of cpu-numpy's, and the parameters moved by more than that (the check is not
    vacuous)."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.seeding import batch_order

    init = build_model("cnn", seed=3, **SIZES["cnn"]).flat.copy()
    ref = CpuNumpyBackend(build_model("cnn", seed=3, **SIZES["cnn"]), "cnn", 0.5)
    gpu = GpuEngine(build_model("cnn", seed=3, **SIZES["cnn"]), "cnn", 0.5, _policy("cnn", "bf16"))
    rng = np.random.default_rng(4)
    x, y = rng.random((7, 1, 8, 8), dtype=np.float32), rng.integers(0, 4, 7)
    for backend in (ref, gpu):
        backend.load_train_data(x, y)
    order = batch_order(3, 0, len(x))
    ref_loss, gpu_loss = (backend.train_epoch(order, 4).loss for backend in (ref, gpu))
    assert gpu_loss == pytest.approx(ref_loss, rel=BOUND["bf16"])
    assert _rel_err(ref.parameters(), init) > 4 * BOUND["bf16"]
    assert FP32_BOUND < _rel_err(gpu.parameters(), ref.parameters()) < BOUND["bf16"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "autoencoder"])
def test_gpu_one_step_at_the_real_shapes(model, precision):
    """On a GPU, the real widths at batch 64: one step's gradients within the format's bound of cpu-numpy's; the
    CNN's within float32's (none of its products fills a tensor tile: TENSOR_MIN_CHANNELS)."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.device import simulator_enabled

    if simulator_enabled():
        pytest.skip("needs a real GPU")
    sizes = {"mlp": {}, "cnn": {"in_channels": 1, "image_size": 28}, "autoencoder": {}}[model]
    ref = CpuNumpyBackend(build_model(model, seed=3, **sizes), model, 0.01)
    gpu = GpuEngine(build_model(model, seed=3, **sizes), model, 0.01, _policy(model, precision))
    rng = np.random.default_rng(2)
    x = rng.random((64, *ref.model.input_shape), dtype=np.float32)
    y = x if model == "autoencoder" else rng.integers(0, 10, len(x))
    err = _rel_err(gpu.gradients(x, y), ref.gradients(x, y))
    assert err < FP32_BOUND if model == "cnn" else FP32_BOUND < err < GPU_BOUND[precision]


_CPU_RUNS = {}


def _real_run(model):
    """Random data at `model`'s real shapes and cpu-numpy's two epochs on it (per-epoch losses, final parameters),
    computed once per model: the MLP on 3 000 samples, the CNN on 209, the autoencoder on 1 000 (partial last
    batches), batch 64, the experiments' learning rates."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.seeding import batch_order

    if model not in _CPU_RUNS:
        rng = np.random.default_rng(7)
        n, lr, sizes = {"mlp": (3000, 0.01, {}), "cnn": (209, 0.01, {"in_channels": 1, "image_size": 28}),
                        "autoencoder": (1000, 0.002, {})}[model]
        ref = CpuNumpyBackend(build_model(model, seed=0, **sizes), model, lr)
        x = rng.random((n, *ref.model.input_shape), dtype=np.float32)
        y = None if model == "autoencoder" else rng.integers(0, 10, n)
        ref.load_train_data(x, y)
        losses = [ref.train_epoch(batch_order(0, epoch, n), 64).loss for epoch in range(2)]
        _CPU_RUNS[model] = (x, y, lr, sizes, losses, ref.parameters().copy())
    return _CPU_RUNS[model]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "autoencoder"])
def test_gpu_variant_trains_like_cpu_and_repeats_bit_for_bit(model, precision):
    """The registered gpu-<precision> (CUDA graphs) at the real shapes, two epochs from cpu-numpy's init in its
    order: each epoch's loss and the final parameters within the format's bound; a second run gives the same
    bits (no float atomics)."""
    from gpunn.backends.registry import make_backend
    from gpunn.device import simulator_enabled
    from gpunn.seeding import batch_order

    if simulator_enabled():
        pytest.skip("needs a real GPU")
    x, y, lr, sizes, expected, expected_params = _real_run(model)
    runs = []
    for _ in range(2):
        gpu = make_backend(f"gpu-{precision}", build_model(model, seed=0, **sizes), model, lr)
        gpu.load_train_data(x, y)
        gpu.warm_up({64, len(x) % 64})
        losses = [gpu.train_epoch(batch_order(0, epoch, len(x)), 64).loss for epoch in range(2)]
        for got, want in zip(losses, expected):
            assert got == pytest.approx(want, rel=BOUND[precision])
        assert _rel_err(gpu.parameters(), expected_params) < BOUND[precision]
        runs.append(gpu.parameters().copy())
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.gpu
def test_gpu_winograd_bf16_storage_gives_the_same_step(monkeypatch):
    """On a GPU, the autoencoder at its real widths (batch 8): one gpu-bf16 step's gradients with BF16 transform
    buffers bit for bit those with float32 buffers."""
    from gpunn.backends.gpu import layers
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.device import simulator_enabled

    if simulator_enabled():
        pytest.skip("needs a real GPU")
    x = np.random.default_rng(6).random((8, 3, 32, 32), dtype=np.float32)
    grads = []
    for storage in (False, True):
        monkeypatch.setattr(layers, "WINOGRAD_BF16_STORAGE", storage)
        gpu = GpuEngine(build_model("autoencoder", seed=3), "autoencoder", 0.002, _policy("autoencoder", "bf16"))
        grads.append(gpu.gradients(x, x))
    assert np.array_equal(grads[0], grads[1])
