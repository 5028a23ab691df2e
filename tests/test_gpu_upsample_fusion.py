"""The engine's Upsample + Conv2d fusion (Policy.upsample "fused": gpunn.kernels.conv.UP_VERSIONS) on the
autoencoder, under the simulator at tiny sizes (2x4x4 images, channels (3, 2)): the plan, and a short training
epoch equal to cpu-numpy's and to the same policy with separate upsample kernels, deterministic run to run.
gpu-graph itself needs a real GPU: its eager twin (graphs off) runs here.
"""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.layers import Conv2dStage, UpsampleStage, plan
from gpunn.backends.gpu.policy import POLICIES, Policy
from gpunn.nn import build_model
from gpunn.seeding import batch_order

TINY = {"in_channels": 2, "image_size": 4, "channels": (3, 2)}
FUSED = dataclasses.replace(POLICIES["gpu-graph"], name="gpu-graph-eager", graphs=False)
SEPARATE = dataclasses.replace(FUSED, name="gpu-graph-eager-separate", upsample="separate")
# every conv pass an implicit GEMM (gpu-im2col's versions) with the fusion: the up twins of the implicit GEMMs
IM2COL_FUSED = dataclasses.replace(POLICIES["gpu-im2col"], name="gpu-im2col-fused", upsample="fused")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def test_policy_field():
    assert POLICIES["gpu-graph"].upsample == "fused"
    assert POLICIES["gpu-im2col"].upsample == "separate"  # the paper's optimized v2 keeps its upsample kernels
    with pytest.raises(ValueError, match="upsample must be one of"):
        Policy("x", gemm="auto", fuse=True, resident=True, upsample="merged")


def test_plan_fuses_each_upsample_into_the_conv_after_it():
    layers = build_model("autoencoder", seed=0, **TINY).layers
    fused, separate = plan(layers, FUSED, fold=True), plan(layers, SEPARATE, fold=True)
    assert sum(isinstance(s, UpsampleStage) for s in separate) == 2
    assert not any(isinstance(s, UpsampleStage) for s in fused)
    ups = [s for s in fused if isinstance(s, Conv2dStage) and s.up]
    assert [(s.cin, s.cout, s.relu) for s in ups] == [(2, 3, True), (3, 2, False)]
    assert repr(ups[0]).startswith("Upsample(2)+Conv2d(2, 3")
    assert len(fused) == len(separate) - 2
    # the same parameter offsets: the fused stages read the same flat buffer
    assert [(s.offset, s.params) for s in fused if s.params] == [(s.offset, s.params) for s in separate if s.params]
    # the input sizes: an up stage doubles its input before the conv
    assert ups[0].out_shape((2, 1, 1)) == (3, 2, 2)


def _engine(policy, lr=0.2, seed=3):
    from gpunn.backends.gpu.engine import GpuEngine

    return GpuEngine(build_model("autoencoder", seed=seed, **TINY), "autoencoder", lr, policy)


def _images(n, seed=1):
    return np.random.default_rng(seed).random((n, 2, 4, 4), dtype=np.float32)


def _epoch(backend, x):
    backend.load_train_data(x, None)
    result = backend.train_epoch(batch_order(5, 0, len(x)), 3)
    return result, backend.parameters().copy()


@pytest.mark.parametrize("policy", [FUSED, IM2COL_FUSED], ids=lambda p: p.name)
def test_one_batch_gradients_match_cpu_and_the_separate_kernels(policy):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    x = _images(3)
    ref = CpuNumpyBackend(build_model("autoencoder", seed=3, **TINY), "autoencoder", 0.2)
    expected = ref.gradients(x, x)
    assert np.abs(expected).max() > 0
    fused = _engine(policy).gradients(x, x)
    assert rel_err(fused, expected) < 1e-5
    separate = dataclasses.replace(policy, upsample="separate")
    assert rel_err(fused, _engine(separate).gradients(x, x)) < 1e-5


def test_short_epoch_matches_cpu_and_is_deterministic():
    """Two steps (5 samples in batches of 3, a partial last batch): the loss and parameters of cpu-numpy and of the
    separate kernels within float32 tolerance; a second fused run gives the same bits."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    x = _images(5)
    ref_result, ref_params = _epoch(CpuNumpyBackend(build_model("autoencoder", seed=3, **TINY), "autoencoder", 0.2),
                                    x)
    fused_result, fused_params = _epoch(_engine(FUSED), x)
    assert fused_result.steps == ref_result.steps == 2
    assert fused_result.loss == pytest.approx(ref_result.loss, rel=1e-5)
    assert rel_err(fused_params, ref_params) < 1e-4
    separate_result, separate_params = _epoch(_engine(SEPARATE), x)
    assert fused_result.loss == pytest.approx(separate_result.loss, rel=1e-5)
    assert rel_err(fused_params, separate_params) < 1e-5
    again_result, again_params = _epoch(_engine(FUSED), x)
    assert again_params.tobytes() == fused_params.tobytes()
    assert again_result.loss == fused_result.loss


def test_the_step_runs_the_phase_kernels_on_narrow_upsampled_convs():
    """Both decoder convs (2 -> 3 and 3 -> 2 outputs on upsampled maps) run their forward and weight gradient as
    ``phase`` (conv.phase_up) under gpu-graph's policy; gpu-im2col's twin keeps its implicit GEMMs."""
    from gpunn.backends.gpu.engine import _launches

    def names(policy):
        program = _engine(policy)._step_program(2, (2, 4, 4))
        return [launch.name for part in (program.forward, program.backward) for launch in _launches(part)]

    fused = names(FUSED)
    assert sum(n.startswith("conv_forward_phase_up[") for n in fused) == 2, fused
    assert sum(n.startswith("conv_backward_weight_phase_up[") for n in fused) == 2, fused
    assert not any("_up[" in n and "implicit_gemm" in n and "forward" in n for n in fused), fused
    assert not any("phase" in n for n in names(IM2COL_FUSED))


def test_predict_with_the_fusion():
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    x = _images(4, seed=2)
    ref = CpuNumpyBackend(build_model("autoencoder", seed=3, **TINY), "autoencoder", 0.2)
    assert rel_err(_engine(FUSED).predict(x), ref.predict(x)) < 1e-5
