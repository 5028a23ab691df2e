"""Policy.precision (tf32, bf16): every GEMM and every Conv2d pass but the bias gradient on the tensor-core GEMM
versions, inputs rounded to the format, float32 accumulation, weights and loss in float32.

The bound on one step's gradients (and the predictions) against cpu-numpy from the same init: a few units of the
format's rounding, u = 2^-11 (TF32: 10 mantissa bits, to nearest) and 2^-8 (BF16: 7 bits), against 1e-5 for FP32.
Under the simulator (tiny shapes) TF32 came out at 4e-4 to 1e-3 and BF16 at 4e-3 to 1.2e-2; the tests allow 8u
(3.9e-3 and 3.1e-2) and require more than 1e-5, so a pass that silently ran in FP32 fails too.
"""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.policy import POLICIES, Policy, conv_version, gemm_version, pool_fused, precision_gemm
from gpunn.nn import build_model

UNIT = {"tf32": 2.0**-11, "bf16": 2.0**-8}
BOUND = {fmt: 8 * u for fmt, u in UNIT.items()}
FP32_BOUND = 1e-5
SIZES = {
    "cnn": {"in_channels": 1, "image_size": 8, "channels": (2, 3), "classes": 4},
    "mlp": {"in_features": 20, "hidden": 16, "classes": 4},
    "autoencoder": {"channels": (4, 3), "image_size": 8},
}
SHAPES = {"cnn": (3, 1, 8, 8), "mlp": (3, 20), "autoencoder": (3, 3, 8, 8)}


def _policy(model, precision):
    base = POLICIES["gpu-fused" if model == "mlp" else "gpu-im2col"]
    return dataclasses.replace(base, name=f"{base.name}-{precision}", precision=precision, pool="separate")


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def test_precision_routes_every_multiplying_pass_to_the_tensor_cores():
    policy = _policy("cnn", "bf16")
    assert precision_gemm(policy) == "tensor_bf16" and precision_gemm(POLICIES["gpu-graph"]) is None
    assert gemm_version(policy, 64, 10) == "tensor_bf16" == gemm_version(policy, 4096, 4096)
    for step in ("forward", "backward_data", "backward_weight"):  # Winograd, tiled, staged: float32 kernels
        assert conv_version(policy, step, 256, 128, 3, 1, (16, 16)) == "implicit_gemm"
        assert conv_version(policy, step, 1, 16, 3, 1, (28, 28)) == "implicit_gemm"
    assert conv_version(policy, "bias_grad", 256, 128, 3, 1) == "split"  # a sum, not a product: float32
    assert not pool_fused(policy, 3, 256, 3)


def test_precision_needs_the_per_layer_stages():
    with pytest.raises(ValueError, match="precision must be one of .*'fp32', 'tf32', 'bf16'.*got 'fp16'"):
        Policy("p", gemm="auto", fuse=True, resident=True, precision="fp16")
    for fused in ({"step": "persistent"}, {"head": "fused"}, {"upsample": "fused"}, {"pool": "auto"}):
        with pytest.raises(ValueError, match="precision 'tf32' runs per-layer stages only"):
            Policy("p", gemm="auto", fuse=True, resident=True, precision="tf32", **fused)


@pytest.mark.parametrize("model,precision", [("cnn", "tf32"), ("cnn", "bf16"), ("mlp", "tf32"),
                                             ("autoencoder", "bf16")])
def test_one_step_within_the_formats_bound_of_cpu(model, precision):
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
    products = [name for name in names if "gemm" in name]  # dense GEMMs and implicit-GEMM conv passes
    assert products and all(f"tensor_{precision}" in name for name in products), names
    assert all("implicit_gemm" in name or "bias_grad" in name for name in names if name.startswith("conv_")), names


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "autoencoder"])
def test_gpu_one_step_at_the_real_shapes(model, precision):
    """On a GPU, the real widths at batch 64: one step's gradients within the format's bound of cpu-numpy's."""
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
    assert FP32_BOUND < _rel_err(gpu.gradients(x, y), ref.gradients(x, y)) < BOUND[precision]
