"""The engine's Conv2d + ReLU + MaxPool2d fusion (Policy.pool, layers.ConvPoolStage) against cpu-numpy and against
the same policy with separate stages, under the simulator: one-batch gradients, a short epoch, and two runs giving
the same bits. Sizes: the CNN at 9x9 images (conv outputs 7x7 then 5x5: an odd map whose last row and column
the pool drops), the autoencoder at 8x8 (pooled 4x4, then 2x2)."""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.layers import ConvPoolStage, MaxPool2dStage
from gpunn.backends.gpu.policy import POLICIES, Policy, pool_fused
from gpunn.nn import build_model
from gpunn.seeding import batch_order

CNN = {"in_channels": 1, "image_size": 9, "channels": (2, 3), "classes": 4}
AE = {"in_channels": 2, "image_size": 8, "channels": (3, 2)}
MODELS = {"cnn": CNN, "autoencoder": AE}


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def policy(pool, base="gpu-graph"):
    return dataclasses.replace(POLICIES[base], name=f"{base}-pool-{pool}", graphs=False, pool=pool)


def engine(model, pool, seed=3, lr=0.1, base="gpu-graph"):
    from gpunn.backends.gpu.engine import GpuEngine

    return GpuEngine(build_model(model, seed=seed, **MODELS[model]), model, lr, policy(pool, base))


def cpu(model, seed=3, lr=0.1):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    return CpuNumpyBackend(build_model(model, seed=seed, **MODELS[model]), model, lr)


def batch(model, n, seed=1):
    rng = np.random.default_rng(seed)
    sizes = MODELS[model]
    x = rng.random((n, sizes["in_channels"], sizes["image_size"], sizes["image_size"]), dtype=np.float32)
    return x, (x if model == "autoencoder" else rng.integers(0, sizes["classes"], n))


def test_plan_fuses_where_the_policy_says():
    from gpunn.backends.gpu.layers import plan

    layers = build_model("cnn", seed=0, in_channels=1, image_size=28, channels=(16, 32), classes=10).layers
    for name in ("gpu-graph", "gpu-im2col"):
        stages = plan(layers, POLICIES[name], fold=True)
        assert [type(s) for s in stages].count(ConvPoolStage) == 1 and not any(
            isinstance(s, MaxPool2dStage) for s in stages), name
        assert repr(stages[1]) == "Conv2d(16, 32, k3, p0, relu, maxpool2)"
    for name in ("gpu-naive", "gpu-optimized"):
        assert not any(isinstance(s, ConvPoolStage) for s in plan(layers, POLICIES[name], fold=True)), name
    ae = build_model("autoencoder", seed=0).layers
    fused = [s for s in plan(ae, POLICIES["gpu-graph"], fold=True) if isinstance(s, ConvPoolStage)]
    # conv1 on the window tiles (K = 27); conv2 (Winograd) on Winograd's pooled passes (tests/test_gpu_pool_winograd.py)
    assert [repr(s) for s in fused] == ["Conv2d(3, 256, k3, p1, relu, maxpool2)",
                                        "Conv2d(256, 128, k3, p1, relu, maxpool2, winograd)"]
    assert sum(isinstance(s, ConvPoolStage) for s in plan(ae, policy("fused"), fold=True)) == 2
    graph = POLICIES["gpu-graph"]
    # the CNN's conv2 (32 outputs) and the autoencoder's conv1 (K = 3*3*3) fuse; its 256 -> 128 conv (padding 1)
    # because it runs Winograd (policy.pool_winograd), not for the window tiles (padding 0 has no Winograd)
    assert pool_fused(graph, 16, 32, 3) and pool_fused(graph, 3, 256, 3) and pool_fused(graph, 256, 128, 3, 1)
    assert not pool_fused(graph, 256, 128, 3) and not pool_fused(graph, 4, 64, 3)
    with pytest.raises(ValueError, match="pool must be one of"):
        Policy("bad", gemm="auto", fuse=True, resident=True, pool="sometimes")


@pytest.mark.parametrize("model", ["cnn", "autoencoder"])
@pytest.mark.parametrize("base", ["gpu-graph", "gpu-im2col"])
def test_fused_gradients_match_cpu_and_the_separate_stages(model, base):
    x, y = batch(model, 3)
    ref = cpu(model).gradients(x, y)
    fused, separate = engine(model, "fused", base=base), engine(model, "separate", base=base)
    assert any(isinstance(s, ConvPoolStage) for s in fused.train_stages)
    assert not any(isinstance(s, ConvPoolStage) for s in separate.train_stages)
    got = fused.gradients(x, y)
    assert np.abs(ref).max() > 0
    assert rel_err(got, ref) < 1e-5
    assert rel_err(got, separate.gradients(x, y)) < 1e-5
    assert rel_err(fused.predict(x), cpu(model).predict(x)) < 1e-5


def test_fused_short_epoch_matches_cpu_and_repeats_bit_for_bit():
    x, y = batch("cnn", 7)
    order = batch_order(5, 0, len(x))
    ref = cpu("cnn", lr=0.2)
    ref.load_train_data(x, y)
    ref_result = ref.train_epoch(order, 2)
    runs = []
    for _ in range(2):
        gpu = engine("cnn", "fused", lr=0.2)
        gpu.load_train_data(x, y)
        gpu.warm_up({2, 1})
        result = gpu.train_epoch(order, 2)
        assert result.steps == ref_result.steps == 4
        assert result.loss == pytest.approx(ref_result.loss, rel=1e-5)
        runs.append(gpu.parameters().copy())
    assert rel_err(runs[0], ref.parameters()) < 1e-4
    assert np.array_equal(runs[0], runs[1])
