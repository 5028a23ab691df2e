"""The engine's Winograd pool stage (policy.pool_winograd, AUTO_POOL_WINOGRAD; layers.WinogradPoolStage): a
Conv2d + ReLU + MaxPool2d(2) whose conv runs ``winograd`` (the autoencoder's 256 -> 128 conv2) as one stage on
gpunn.kernels.conv.winograd_pool's passes, against the same policy with the option off (a Winograd Conv2dStage and a
MaxPool2dStage) and against cpu-numpy.

The plan and the launch lists at the real shapes (nothing runs: binding the programs is cheap under the simulator).
The numbers under the simulator on a tiny net shaped like the autoencoder's encoder, whose convs choose as the real
ones do once the thresholds are scaled to it (`scaled`): conv1 1 -> 2 (the fused direct pooled stage: K = 9), conv2
2 -> 4 (Winograd: in * out = 8; not fused by the window-tile rule: 4 outputs, K = 18), then a cheap decoder (an
Upsample, and an Upsample read through by a 4 -> 1 conv, not Winograd). Its one Winograd conv keeps the simulator's
cost low (each batched GEMM launch, 16 blocks of 256 threads, takes about 1 s in FP32 and 3 s on tensor_bf16).
"""

import dataclasses
import re

import numpy as np
import pytest

from gpunn.backends.gpu import layers as L
from gpunn.backends.gpu import policy as P
from gpunn.backends.gpu.layers import Conv2dStage, ConvPoolStage, MaxPool2dStage, WinogradPoolStage, plan
from gpunn.backends.gpu.policy import POLICIES, pool_fused, pool_winograd
from gpunn.nn import Conv2d, MaxPool2d, ReLU, Sequential, Upsample, build_model

FP32_BOUND = 1e-5
BF16_BOUND = 8 * 2.0**-8  # tests/test_gpu_precision.py's BOUND["bf16"]
SHAPE = (3, 1, 8, 8)  # batch 3 of the tiny net's 1x8x8 images


def eager(name):
    """The registered policy without the capture (the simulator has no CUDA graphs)."""
    return dataclasses.replace(POLICIES[name], name=f"{name}-eager", graphs=False)


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def tiny_net(seed=3):
    rng = np.random.default_rng(seed)
    layers = [Conv2d(1, 2, 3, 1, rng=rng), ReLU(), MaxPool2d(2), Conv2d(2, 4, 3, 1, rng=rng), ReLU(), MaxPool2d(2),
              Upsample(2), Upsample(2), Conv2d(4, 1, 3, 1, rng=rng)]
    for layer in layers:  # nonzero biases (Conv2d starts them at 0): the ReLU and the pool see them
        if isinstance(layer, Conv2d):
            layer.bias.data[:] = rng.uniform(-0.2, 0.2, layer.bias.data.shape)
    model = Sequential(layers)
    model.name, model.input_shape = "autoencoder", SHAPE[1:]
    return model


@pytest.fixture
def scaled(monkeypatch):
    """The thresholds scaled to the tiny net: Winograd from in * out = 8 (conv2 only), the window-tile fusion up to
    2 outputs or K = 9 (conv1 only); under bf16 the products of at least 2 a side on the tensor cores (conv2's three
    passes, so its Winograd buffers in BF16; the 4 -> 1 conv's forward and weight gradient not: the simulator's
    cost)."""
    monkeypatch.setattr(P, "AUTO_WINOGRAD_MIN_PRODUCT", 8)
    monkeypatch.setattr(P, "AUTO_POOL_MAX_COUT", 2)
    monkeypatch.setattr(P, "AUTO_POOL_MAX_K", 9)
    monkeypatch.setattr(P, "TENSOR_MIN_SIDE", 2)
    monkeypatch.setattr(P, "TENSOR_MIN_CHANNELS", 2)
    return monkeypatch


# ---- the rule and the plan (real shapes)


def test_the_rule_chooses_the_winograd_pool_stage_for_the_autoencoders_conv2(monkeypatch):
    ae = build_model("autoencoder", seed=0).layers
    cnn = build_model("cnn", seed=0, in_channels=1, image_size=28, channels=(16, 32), classes=10).layers
    kinds = {}
    for on in (True, False):
        monkeypatch.setattr(P, "AUTO_POOL_WINOGRAD", on)
        for name in ("gpu-graph", "gpu-tf32", "gpu-bf16", "gpu-im2col"):
            policy = POLICIES[name]
            assert pool_winograd(policy, 256, 128, 3, 1) == (on and name != "gpu-im2col"), name
            assert pool_fused(policy, 256, 128, 3, 1) == (on and name != "gpu-im2col"), name
            assert not pool_winograd(policy, 3, 256, 3, 1) and not pool_winograd(policy, 16, 32, 3, 0)
            assert not pool_winograd(policy, 256, 128, 3)  # padding 0: no Winograd
            kinds[on, name] = ([type(s) for s in plan(ae, policy, fold=True)],
                               [type(s) for s in plan(cnn, policy, fold=True)])
        assert not pool_winograd(dataclasses.replace(POLICIES["gpu-graph"], pool="separate"), 256, 128, 3, 1)
    for name in ("gpu-graph", "gpu-tf32", "gpu-bf16"):
        (ae_on, cnn_on), (ae_off, cnn_off) = kinds[True, name], kinds[False, name]
        # conv1 keeps its stage (the direct pooled one); conv2 + ReLU + pool: one stage for two
        assert ae_on == [ConvPoolStage, WinogradPoolStage, Conv2dStage, Conv2dStage, Conv2dStage], name
        assert ae_off == [ConvPoolStage, Conv2dStage, MaxPool2dStage, Conv2dStage, Conv2dStage, Conv2dStage], name
        assert cnn_on == cnn_off, name  # the CNN: padding 0, no Winograd
    assert kinds[True, "gpu-im2col"] == kinds[False, "gpu-im2col"]
    monkeypatch.setattr(P, "AUTO_POOL_WINOGRAD", True)
    stage = plan(ae, POLICIES["gpu-bf16"], fold=True)[1]
    assert repr(stage) == "Conv2d(256, 128, k3, p1, relu, maxpool2, winograd)" and stage.params == 256 * 128 * 9 + 128


def test_the_rule_at_the_tiny_shape(scaled):
    """The tiny net's plan mirrors the real autoencoder's encoder (the test's premise): under FP32 conv1 on the
    window tiles, conv2 on Winograd's pooled passes; under BF16 conv2 too (conv1 has tensor passes at this size, so
    it keeps a separate pool)."""
    graph, bf16 = eager("gpu-graph"), eager("gpu-bf16")
    assert [type(s) for s in plan(tiny_net().layers, graph, fold=True)][:2] == [ConvPoolStage, WinogradPoolStage]
    assert isinstance(plan(tiny_net().layers, bf16, fold=True)[2], WinogradPoolStage)  # (conv1: tensor, unfused)
    scaled.setattr(P, "AUTO_POOL_WINOGRAD", False)
    stages = plan(tiny_net().layers, graph, fold=True)
    assert [type(s) for s in stages][:3] == [ConvPoolStage, Conv2dStage, MaxPool2dStage]
    assert stages[1]._name(L.Binder(graph, None, None, 0.1), "forward") == "winograd"


# ---- the launches (real shapes, nothing runs)


def _names(policy, model="autoencoder", rows=2, **sizes):
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    gpu = GpuEngine(build_model(model, seed=3, **sizes), model, 0.1, policy)
    program = gpu._step_program(rows, gpu.model.input_shape)
    return program, list(_launches(program.forward + program.backward))


def _as_pooled(names):
    """Today's launch names with conv2's Winograd passes and its max pool as the Winograd pool stage's: the forward's
    four launches (before the pool's) renamed, the pool's dropped; the backward's pool gather dropped and the
    Winograd passes after it (and conv2's split bias gradient) renamed."""
    names = list(names)
    i = names.index("maxpool2x2_forward_v1")
    names[i - 4:i + 1] = [n.replace("conv_forward_winograd[", "conv_forward_pool_winograd[").replace(
        "[output transform,", "[output transform + pool,") for n in names[i - 4:i]]
    j = names.index("maxpool2x2_backward_gather")
    end = j + 1
    while "_winograd[" in names[end] or names[end].startswith("conv_bias_grad_split"):
        end += 1
    names[j:end] = [re.sub(r"^conv_(backward_\w+?)_winograd\[", r"conv_\1_pool_winograd[", n).replace(
        "conv_bias_grad_split", "conv_bias_grad_pool") for n in names[j + 1:end]]
    return names


@pytest.mark.parametrize("bias_with_weight", [False, True])
@pytest.mark.parametrize("name", ["gpu-graph", "gpu-bf16"])
def test_the_pool_launches_replace_the_winograd_and_pool_launches(name, bias_with_weight, monkeypatch):
    """The real autoencoder's step (batch 2): with the option on, its launches are today's with conv2's Winograd
    passes and max pool replaced by the Winograd pool kernels, everything else (conv1's direct pooled stage
    included) the same; the weight gradient reads the forward's V (no input transform of its own), in BF16 under
    gpu-bf16; with policy.AUTO_WINOGRAD_BIAS its bias comes from the weight-gradient pass. The CNN's launches do
    not change."""
    monkeypatch.setattr(P, "AUTO_WINOGRAD_BIAS", bias_with_weight)
    lists = {}
    for on in (False, True):
        monkeypatch.setattr(P, "AUTO_POOL_WINOGRAD", on)
        program, launches = _names(eager(name))
        lists[on] = [launch.name for launch in launches]
        cnn = _names(eager(name), "cnn", in_channels=1, image_size=28)[1]
        lists["cnn", on] = [launch.name for launch in cnn]
    on = lists[True]
    assert on == _as_pooled(lists[False]) != lists[False]
    assert lists["cnn", True] == lists["cnn", False]
    assert not any(n.startswith("maxpool") for n in on) and any(n.startswith("conv_forward_pool_direct") for n in on)
    pool = [n for n in on if "_pool_winograd[" in n]
    wgrad = "conv_backward_weight_bias_pool_winograd" if bias_with_weight else "conv_backward_weight_pool_winograd"
    assert {n[:n.index("[")] for n in pool} == {"conv_forward_pool_winograd", "conv_backward_data_pool_winograd", wgrad}
    assert not any(n.startswith(f"{wgrad}[input transform") for n in on)  # V shared with the forward
    assert any(n.startswith("conv_bias_grad_pool") for n in on) != bias_with_weight
    assert any(n.endswith("+ weight transform + bias]") for n in pool) == bias_with_weight
    tensor = name == "gpu-bf16"
    transforms = [launch for launch in launches if "_pool_winograd[" in launch.name
                  and ("input transform" in launch.name or "dy transform" in launch.name)]
    assert len(transforms) == 3  # forward input, input-gradient input (dy), weight-gradient dy
    assert all(t.name.endswith(",bf16]") == tensor for t in transforms), [t.name for t in transforms]
    assert all(t.args[1].dtype == (np.uint16 if tensor else np.float32) for t in transforms)
    gemms = [n for n in pool if "batch" in n]
    assert len(gemms) == 3 and all(("tensor_bf16" in n) == tensor for n in gemms), gemms


# ---- the numbers (simulator, the tiny net)


def _step(policy, x, predict=False):
    """One step's forward output (the one its loss head read; `predict`: also the prediction program's), per-sample
    losses and flat gradients, and the engine's stages."""
    from gpunn.backends.gpu.engine import GpuEngine, _launches

    gpu = GpuEngine(tiny_net(), "autoencoder", 0.1, policy)
    grads = gpu.gradients(x, x)
    program = gpu._step_program(len(x), x.shape[1:])
    head = next(launch for launch in _launches(program.forward) if launch.name == "mse_loss_grad")
    out = head.args[0].copy_to_host().reshape(x.shape)  # (its args: out, target, dout, losses, ...)
    return out, program.losses.copy_to_host(), grads, gpu.train_stages, gpu.predict(x) if predict else None


@pytest.mark.parametrize("precision,bias_with_weight", [("fp32", False), ("fp32", True), ("bf16", True)])
def test_a_step_gives_the_same_bits_with_the_option_on_and_off_and_matches_cpu(precision, bias_with_weight, scaled):
    """One step of the tiny net with the option on and off: the forward output (the loss head's input), the
    per-sample losses and the gradients bit for bit the same (the pooled passes compute the same sums in the same
    order). With policy.AUTO_WINOGRAD_BIAS on the Winograd weight gradient makes the bias gradient in both; off, the
    stage's bias gradient is the pooled family's launch, which sums the pooled gradient where the split one sums the
    full map, zeros and all, in another grouping (8x8 pooled maps differ in the last bits; equal at this size): that
    slice is held to 1e-6. The gradients and output within the format's bound of cpu-numpy's (FP32: 1e-5; BF16 with
    BF16 transform buffers: tests/test_gpu_precision.py's bound); under FP32 the prediction program (the stage's
    forward without a backward) gives the step's output."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    scaled.setattr(P, "AUTO_WINOGRAD_BIAS", bias_with_weight)
    policy = eager("gpu-graph" if precision == "fp32" else "gpu-bf16")
    x = np.random.default_rng(1).random(SHAPE, dtype=np.float32)
    runs = {}
    for on in (False, True):
        scaled.setattr(P, "AUTO_POOL_WINOGRAD", on)
        runs[on] = _step(policy, x, predict=on and precision == "fp32")
    (out0, loss0, g0, stages0, _), (out1, loss1, g1, stages1, predicted) = runs[False], runs[True]
    stage = next(s for s in stages1 if isinstance(s, WinogradPoolStage))
    assert not any(isinstance(s, WinogradPoolStage) for s in stages0)
    assert np.array_equal(out0, out1) and np.array_equal(loss0, loss1)
    bias = slice(stage.offset + stage.params - stage.cout, stage.offset + stage.params)
    rest = np.ones(g0.size, bool)
    rest[bias] = bias_with_weight
    assert np.array_equal(g0[rest], g1[rest])
    assert rel_err(g1[bias], g0[bias]) < 1e-6
    ref = CpuNumpyBackend(tiny_net(), "autoencoder", 0.1)
    expected = ref.gradients(x, x)
    assert np.abs(expected[bias]).max() > 0  # the stage's bias gradient is not trivially 0
    bound = FP32_BOUND if precision == "fp32" else BF16_BOUND
    low = 0 if precision == "fp32" else FP32_BOUND  # (BF16: the products did run in BF16)
    span = slice(stage.offset, stage.offset + stage.params)
    assert low <= rel_err(g1, expected) < bound and rel_err(g1[span], expected[span]) < bound
    assert rel_err(out1, ref.predict(x)) < bound
    if predicted is not None:
        assert np.array_equal(predicted, out1)
