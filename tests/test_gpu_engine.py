"""The GPU engine's plans: what each policy makes of a model's layer list (fusions, folded biases, masks), and
the engine's refusals. The numerical comparisons with cpu-numpy are in test_gpu_mlp.py (MLP) and below for
the conv layers."""

from dataclasses import replace

import numpy as np
import pytest

from gpunn.backends.gpu.layers import Conv2dStage, FlattenStage, LinearStage, MaxPool2dStage, ReluStage, plan
from gpunn.backends.gpu.policy import POLICIES, POLICY_MODELS, gemm_version
from gpunn.backends.registry import VARIANTS, runs_on_simulator
from gpunn.nn import build_model


def kinds(stages):
    return [type(s).__name__.removesuffix("Stage") for s in stages]


def test_unfused_policies_keep_one_stage_per_layer():
    model = build_model("mlp", in_features=13, hidden=7, classes=5)
    for name in ("gpu-naive", "gpu-tiled"):
        stages = plan(model.layers, POLICIES[name], fold=True)
        assert kinds(stages) == ["Flatten", "Linear", "Relu", "Linear"]
        assert not any(s.relu or s.fold for s in stages)
        assert isinstance(stages[2], ReluStage) and stages[2].in_place


def test_fused_mlp_folds_both_biases_and_fuses_the_relu():
    model = build_model("mlp", in_features=13, hidden=7, classes=5)
    stages = plan(model.layers, POLICIES["gpu-fused"], fold=True)
    assert kinds(stages) == ["Flatten", "Linear", "Linear"]
    first, second = stages[1], stages[2]
    assert first.relu and not second.relu
    assert first.fold and second.fold  # fed by the gather and by a Linear
    assert (first.offset, second.offset) == (0, 13 * 7 + 7)
    assert sum(s.params for s in stages) == model.flat.size
    # predictions: the same fusions, no ones columns
    assert not any(s.fold for s in plan(model.layers, POLICIES["gpu-fused"], fold=False))


def test_cnn_plan_folds_no_bias_behind_a_pool():
    model = build_model("cnn", in_channels=1, image_size=9, channels=(2, 3), classes=4)
    stages = plan(model.layers, replace(POLICIES["gpu-fused"], pool="separate"), fold=True)
    assert kinds(stages) == ["Conv2d", "Conv2d", "MaxPool2d", "Flatten", "Linear"]
    assert all(isinstance(s, Conv2dStage) and s.relu for s in stages[:2])
    assert isinstance(stages[2], MaxPool2dStage) and isinstance(stages[3], FlattenStage)
    assert isinstance(stages[4], LinearStage) and not stages[4].fold  # its producer writes NCHW, not rows
    assert sum(s.params for s in stages) == model.flat.size
    fused = plan(model.layers, POLICIES["gpu-fused"], fold=True)  # pool "auto": conv2 + ReLU + pool one stage
    assert kinds(fused) == ["Conv2d", "ConvPool", "Flatten", "Linear"] and not fused[3].fold
    assert sum(s.params for s in fused) == model.flat.size


def test_gemm_version_auto_by_output_size():
    fused = POLICIES["gpu-fused"]
    assert gemm_version(fused, 64, 10) == "tiled16"
    assert gemm_version(fused, 785, 256) == "regblock"
    assert gemm_version(POLICIES["gpu-naive"], 785, 256) == "naive"


def test_registry_facts_come_from_the_policies():
    for name, policy in POLICIES.items():
        assert VARIANTS[name].gpu
        assert runs_on_simulator(name) == (not policy.graphs)
    assert not runs_on_simulator("gpu-graph")


def test_determinism_follows_the_float_atomics():
    """A variant is deterministic unless a kernel it may launch adds floats with atomics: gpu-naive and gpu-tiled
    (the unfused Linear's atomic bias sums; gpu-tiled's block weight gradients), gpu-optimized (its shuffle weight
    gradients add batch splits with atomics). A policy changing only in that kernel changes the fact."""
    from gpunn.backends.registry import is_deterministic

    assert [v for v in VARIANTS if not is_deterministic(v)] == ["gpu-naive", "gpu-tiled", "gpu-optimized"]
    optimized = POLICIES["gpu-optimized"]
    assert replace(optimized, conv={**optimized.conv, "backward_weight": "deterministic"}).deterministic
    assert not replace(POLICIES["gpu-fused"], fuse=False).deterministic


def test_unknown_layer_is_one_clear_error():
    from gpunn.errors import GpunnError
    from gpunn.nn import Module

    class Odd(Module):
        pass

    with pytest.raises(GpunnError, match="no GPU launcher for layer"):
        plan([Odd()], POLICIES["gpu-fused"], fold=True)


def test_importing_the_kernels_silences_low_occupancy_warnings(tmp_path):
    """Without the environment variable (the tests set it), importing a kernel module turns numba's warning off."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"}
    code = ("from numba import config\nbefore = config.CUDA_LOW_OCCUPANCY_WARNINGS\n"
            "import gpunn.kernels.gemm\nprint(bool(before), bool(config.CUDA_LOW_OCCUPANCY_WARNINGS))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


# ---- the engine on the conv models, no model-specific code: same gradients and epoch as cpu-numpy

TINY_MODELS = {
    # 8x8 -> 6 -> 4 -> pool 2: FC 3*2*2 -> 4 classes
    "cnn": ({"in_channels": 1, "image_size": 8, "channels": (2, 3), "classes": 4}, (1, 8, 8)),
    # 4x4, 2 channels: encoder 3 -> pool -> 2 -> pool (latent 2x1x1), decoder back to 2x4x4
    "autoencoder": ({"in_channels": 2, "image_size": 4, "channels": (3, 2)}, (2, 4, 4)),
}


def tiny_pair(model_name, policy, lr=0.1, seed=3):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine

    sizes, _ = TINY_MODELS[model_name]
    ref = CpuNumpyBackend(build_model(model_name, seed=seed, **sizes), model_name, lr)
    gpu = GpuEngine(build_model(model_name, seed=seed, **sizes), model_name, lr, POLICIES[policy])
    return ref, gpu


def tiny_images(model_name, n, seed=1):
    _, shape = TINY_MODELS[model_name]
    rng = np.random.default_rng(seed)
    x = rng.random((n, *shape), dtype=np.float32)
    y = rng.integers(0, TINY_MODELS[model_name][0].get("classes", 1), n)
    return x, (x if model_name == "autoencoder" else y)


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


# the simulator runs the conv kernels ~1e5x slower: each model once, under the policy its resident test lacks
# (the autoencoder's variants: tests/test_gpu_autoencoder.py)
@pytest.mark.parametrize(("model_name", "policy"), [("cnn", "gpu-tiled")])
def test_conv_models_gradients_match_cpu(model_name, policy):
    ref, gpu = tiny_pair(model_name, policy)
    x, target = tiny_images(model_name, 3)
    expected = ref.gradients(x, target)
    assert np.abs(expected).max() > 0
    assert rel_err(gpu.gradients(x, target), expected) < 1e-5
    assert rel_err(gpu.predict(x), ref.predict(x)) < 1e-5


# the conv models' resident epochs: gpu-im2col's in tests/test_gpu_autoencoder.py and tests/test_gpu_cnn.py


@pytest.mark.parametrize("model_name,variant", [("mlp", "gpu-naive"), ("mlp", "gpu-fused"), ("cnn", "gpu-optimized")])
def test_prepare_epoch_makes_what_the_epoch_runs(model_name, variant):
    """After prepare_epoch an epoch makes nothing more (per-step copies, resident programs, pipelined programs,
    clock events): the first timed epoch pays no setup. 11 samples at batch 4: steps of 4, 4 and 3 rows."""
    from gpunn.backends.registry import make_backend
    from gpunn.seeding import batch_order
    from gpunn.timing import random_training_data

    sizes = {"mlp": {"in_features": 6, "hidden": 5, "classes": 3},
             "cnn": {"image_size": 8, "channels": (2, 3), "classes": 3}}[model_name]
    model = build_model(model_name, **sizes, seed=0)
    x, y = random_training_data(11, 0, model.input_shape, 3)
    engine = make_backend(variant, model, model_name, 0.01)
    engine.load_train_data(x, y)
    engine.warm_up({4, 3})
    engine.prepare_epoch(4)

    def made():
        pipe = engine._pipe
        return (engine._sync_plan, dict(engine._epoch_programs or {}), pipe and dict(pipe.programs),
                len(engine.epoch_clock), dict(engine._step_programs))

    before = made()
    assert before[3] >= 7  # the epoch's clock marks exist: 3 steps, 2 or 3 marks each
    if variant == "gpu-naive":
        assert before[0] is not None and len(before[0].steps) == 3
    engine.train_epoch(batch_order(0, 0, len(x)), 4)
    after = made()
    assert after[0] is before[0] and after[3] == before[3] and after[4] == before[4]
    assert after[1] == before[1] and after[2] == before[2]  # the same program objects, none added


def test_gpu_fused_and_gpu_im2col_are_one_design_for_disjoint_models():
    """policy.py: one set of fields under the name each model's design has (the MLP's fused step, paper 004's
    im2col); were they to train one model, the two names would be one variant twice."""
    assert replace(POLICIES["gpu-fused"], name="gpu-im2col") == POLICIES["gpu-im2col"]
    assert not set(POLICY_MODELS["gpu-fused"]) & set(POLICY_MODELS["gpu-im2col"])
