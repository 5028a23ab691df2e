"""gpunn.flops (a model's training arithmetic from its layers) and gpunn.device's FP32 peak, against hand counts."""

import math

import pytest

from gpunn import flops
from gpunn.device import fp32_lanes, fp32_peak_tflops, tensor_peak_tflops
from gpunn.nn import build_model


def test_mlp_counts_its_two_gemms_and_no_input_gradient_of_the_first():
    model = build_model("mlp", in_features=784, hidden=256, classes=10)
    macs = 784 * 256 + 256 * 10
    assert flops.forward_flops(model) == 2 * macs
    # forward and weight gradient of both layers, the input gradient of the second only
    assert flops.training_flops(model) == 2 * (2 * macs + 256 * 10)


def test_cnn_and_autoencoder_count_each_conv_at_its_output_size():
    cnn = build_model("cnn", in_channels=1, image_size=28, channels=(16, 32), classes=10)
    convs = [1 * 9 * 16 * 26 * 26, 16 * 9 * 32 * 24 * 24]  # padding 0: 28 -> 26 -> 24, then pool to 12
    fc = 32 * 12 * 12 * 10
    assert [m for _, m in flops.layer_macs(cnn)] == [*convs, fc]
    assert flops.training_flops(cnn) == 2 * (2 * (sum(convs) + fc) + convs[1] + fc)
    auto = build_model("autoencoder", in_channels=3, image_size=32, channels=(256, 128))
    # padding 1: each conv keeps its input's side; pools halve it, upsamples double it: 32, 16, 8, 16, 32
    convs = [3 * 9 * 256 * 32 * 32, 256 * 9 * 128 * 16 * 16, 128 * 9 * 128 * 8 * 8, 128 * 9 * 256 * 16 * 16,
             256 * 9 * 3 * 32 * 32]
    assert [m for _, m in flops.layer_macs(auto)] == convs
    assert flops.forward_flops(auto) == 2 * sum(convs) == 349_175_808  # the "about 330 MFLOP per image"
    assert flops.training_flops(auto) * 50_000 / 1e12 == pytest.approx(51.67, abs=0.01)  # TFLOP per epoch


def test_tensor_peaks_of_known_gpus():
    """The data sheets' dense figures at their clocks: H100 SXM5 989.4 BF16 and 494.7 TF32 (1.83 GHz), A100 312 and
    156 (1.41 GHz); an architecture not listed has none; a format not known is refused."""
    assert tensor_peak_tflops(132, (9, 0), 1_830_000, "bf16") == pytest.approx(989.4, abs=0.5)
    assert tensor_peak_tflops(132, (9, 0), 1_830_000, "tf32") == pytest.approx(494.7, abs=0.5)
    assert tensor_peak_tflops(108, (8, 0), 1_410_000, "bf16") == pytest.approx(312, abs=0.5)
    assert tensor_peak_tflops(108, (8, 0), 1_410_000, "tf32") == pytest.approx(156, abs=0.5)
    assert tensor_peak_tflops(84, (8, 6), 1_700_000, "bf16") is None
    with pytest.raises(ValueError, match="unknown format 'fp16'"):
        tensor_peak_tflops(132, (9, 0), 1_830_000, "fp16")


def test_fp32_peak_of_known_gpus():
    assert fp32_peak_tflops(132, (9, 0), 1_980_000) == pytest.approx(66.9, abs=0.05)  # H100 SXM
    assert fp32_peak_tflops(108, (8, 0), 1_410_000) == pytest.approx(19.5, abs=0.05)  # A100: 64 lanes per SM
    assert fp32_lanes((9, 7)) == 128 and fp32_lanes((7, 2)) == 64  # unlisted: its major version's entry
    assert math.isclose(fp32_lanes((13, 0)), 128)  # a newer major: the last entry's


def test_a_layer_without_a_shape_rule_is_named():
    model = build_model("mlp", in_features=4, hidden=3, classes=2)
    model.layers.insert(1, object())
    with pytest.raises(ValueError, match="no shape rule for layer"):
        flops.layer_macs(model)


def test_bench_gemm_autoencoder_cases_are_its_convolutions():
    """bench gemm's AE_CASES: each is a convolution of the autoencoder at batch 64 as one GEMM, so M x N x K is the
    batch times that layer's multiply-adds (gpunn.flops)."""
    from gpunn.bench.gemm import AE_CASES

    macs = [m for _, m in flops.layer_macs(build_model("autoencoder", channels=(256, 128)))]
    conv2, conv4 = macs[1], macs[3]  # encoder 256 -> 128 and decoder 128 -> 256, both at 16 x 16
    assert [c.m * c.n * c.k for c in AE_CASES] == [64 * conv2, 64 * conv4, 64 * conv2, 64 * conv4]
