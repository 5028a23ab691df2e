"""gpu-graph's fused Conv2d + ReLU + MaxPool2d stage on the direct versions (Policy.pool_conv "direct",
kernels/conv/direct_pooled.py) under the simulator (graphs off): which launches the stage binds, one-batch
gradients against cpu-numpy and against the same policy on the pooled GEMMs, a short epoch matching cpu-numpy and
repeating bit for bit. The CNN at 9x9 images (conv2's 5x5 output: the pool drops its last row and column)."""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.layers import ConvPoolStage
from gpunn.backends.gpu.policy import POLICIES, POOL_DIRECT, POOL_GEMM, Policy
from gpunn.kernels.conv import direct_pooled
from gpunn.nn import build_model
from gpunn.seeding import batch_order

CNN = {"in_channels": 1, "image_size": 9, "channels": (2, 3), "classes": 4}
SAMPLE = (1, 9, 9)


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def engine(pool_conv="direct", base="gpu-graph", seed=3, lr=0.1):
    """`base` (graphs off) with the fused stage's passes: "direct", "gemm", or a Policy.pool_conv dict."""
    from gpunn.backends.gpu.engine import GpuEngine

    if isinstance(pool_conv, str):
        pool_conv = {"forward": pool_conv, "backward_data": pool_conv}
    policy = dataclasses.replace(POLICIES[base], name=f"{base}-pool-conv", graphs=False, pool_conv=pool_conv)
    return GpuEngine(build_model("cnn", seed=seed, **CNN), "cnn", lr, policy)


def cpu(seed=3, lr=0.1):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    return CpuNumpyBackend(build_model("cnn", seed=seed, **CNN), "cnn", lr)


def batch(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((n, *SAMPLE), dtype=np.float32), rng.integers(0, CNN["classes"], n)


def launch_names(eng, rows=3):
    program = eng._step_program(rows, SAMPLE)
    return [getattr(launch, "name", "") for launch in program.forward + program.backward]


def test_policies_choose_the_direct_passes_by_data():
    graph_design = ("gpu-graph", "gpu-tf32", "gpu-bf16")  # (the last two: gpu-graph on the tensor cores)
    assert all(POLICIES[name].pool_conv == POOL_DIRECT for name in graph_design)
    assert all(POLICIES[name].pool_conv == POOL_GEMM for name in POLICIES if name not in graph_design)
    for bad in ({"forward": "sometimes", "backward_data": "gemm"}, {"forward": "direct"}):
        with pytest.raises(ValueError, match="pool_conv must map"):
            Policy("bad", gemm="auto", fuse=True, resident=True, pool_conv=bad)
    names = launch_names(engine())
    assert any(n.startswith("conv_forward_pool_direct[") for n in names), names
    assert any(n.startswith("conv_backward_data_pool_direct[") for n in names), names
    assert not any(n.startswith(("conv_forward_pool_implicit_gemm", "conv_backward_data_pool_implicit_gemm"))
                   for n in names), names
    names = launch_names(engine("gemm"))
    assert not any("pool_direct" in n for n in names), names
    assert any(n.startswith("conv_forward_pool_implicit_gemm[") for n in names), names
    names = launch_names(engine({"forward": "gemm", "backward_data": "direct"}))
    assert any(n.startswith("conv_forward_pool_implicit_gemm[") for n in names), names
    assert any(n.startswith("conv_backward_data_pool_direct[") for n in names), names


def test_shapes_outside_the_limits_fall_back_to_the_gemms(monkeypatch):
    monkeypatch.setattr(direct_pooled, "direct_fits", lambda *args: False)
    eng = engine()
    assert any(isinstance(s, ConvPoolStage) for s in eng.train_stages)
    names = launch_names(eng)
    assert not any("pool_direct" in n for n in names), names
    assert any(n.startswith("conv_backward_data_pool_implicit_gemm[") for n in names), names


def test_direct_gradients_match_cpu_and_the_gemm_versions():
    x, y = batch(3)
    ref = cpu().gradients(x, y)
    got = engine().gradients(x, y)
    assert np.abs(ref).max() > 0
    assert rel_err(got, ref) < 1e-5
    assert rel_err(got, engine("gemm").gradients(x, y)) < 1e-5
    assert rel_err(engine().predict(x), cpu().predict(x)) < 1e-5


def test_direct_short_epoch_matches_cpu_and_repeats_bit_for_bit():
    x, y = batch(7)
    order = batch_order(5, 0, len(x))
    ref = cpu(lr=0.2)
    ref.load_train_data(x, y)
    ref_result = ref.train_epoch(order, 2)
    runs = []
    for _ in range(2):
        gpu = engine(lr=0.2)
        gpu.load_train_data(x, y)
        gpu.warm_up({2, 1})
        result = gpu.train_epoch(order, 2)
        assert result.steps == ref_result.steps == 4
        assert result.loss == pytest.approx(ref_result.loss, rel=1e-5)
        runs.append(gpu.parameters().copy())
    assert rel_err(runs[0], ref.parameters()) < 1e-4
    assert np.array_equal(runs[0], runs[1])
