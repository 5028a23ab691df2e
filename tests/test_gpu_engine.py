"""The GPU engine's plans: what each policy makes of a model's layer list (fusions, folded biases, masks), and
the engine's refusals. The numerical comparisons with cpu-numpy are in test_gpu_mlp.py (MLP) and below for
the conv layers."""

import pytest

from gpunn.backends.gpu.layers import Conv2dStage, FlattenStage, LinearStage, MaxPool2dStage, ReluStage, plan
from gpunn.backends.gpu.policy import POLICIES, gemm_version
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
    stages = plan(model.layers, POLICIES["gpu-fused"], fold=True)
    assert kinds(stages) == ["Conv2d", "Conv2d", "MaxPool2d", "Flatten", "Linear"]
    assert all(isinstance(s, Conv2dStage) and s.relu for s in stages[:2])
    assert isinstance(stages[2], MaxPool2dStage) and isinstance(stages[3], FlattenStage)
    assert isinstance(stages[4], LinearStage) and not stages[4].fold  # its producer writes NCHW, not rows
    assert sum(s.params for s in stages) == model.flat.size


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
