"""The arithmetic of training a model, counted from its layers at its input shape, and the GPU's FP32 peak.

Counted: the multiply-adds of every Linear and Conv2d layer, 2 FLOPs each, in the forward pass, the weight gradient
and the input gradient of every such layer but the first (no gradient flows into the data). Not counted: bias,
activations, pooling, upsampling, the loss and the SGD update, all elementwise and under 1 % of these models'
arithmetic (0.3 % for the autoencoder). The device's FP32 peak, to compare with, is gpunn.device.fp32_peak_tflops.
"""

from __future__ import annotations

from gpunn.nn.layers import Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential, Upsample


def _out_shape(layer: Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(layer, Linear):
        return (layer.out_features,)
    if isinstance(layer, Conv2d):
        _, height, width = shape
        side = 2 * layer.padding - layer.kernel_size + 1
        return (layer.out_channels, height + side, width + side)
    if isinstance(layer, MaxPool2d):
        return (shape[0], shape[1] // 2, shape[2] // 2)
    if isinstance(layer, Upsample):
        return (shape[0], shape[1] * 2, shape[2] * 2)
    if isinstance(layer, Flatten):
        size = 1
        for s in shape:
            size *= s
        return (size,)
    if isinstance(layer, ReLU):
        return shape
    raise ValueError(f"flops: no shape rule for layer {layer!r}")


def layer_macs(model: Sequential) -> list[tuple[Module, int]]:
    """(layer, multiply-adds of its forward pass for one sample) of every Linear and Conv2d layer, in order."""
    if model.input_shape is None:
        raise ValueError("flops: the model has no input_shape (build it with gpunn.nn.build_model)")
    shape, found = tuple(model.input_shape), []
    for layer in model.layers:
        out = _out_shape(layer, shape)
        if isinstance(layer, Linear):
            found.append((layer, layer.in_features * layer.out_features))
        elif isinstance(layer, Conv2d):
            found.append((layer, layer.in_channels * layer.kernel_size ** 2 * out[0] * out[1] * out[2]))
        shape = out
    return found


def forward_flops(model: Sequential) -> int:
    """FLOPs of one sample's forward pass through the Linear and Conv2d layers."""
    return 2 * sum(macs for _, macs in layer_macs(model))


def training_flops(model: Sequential) -> int:
    """FLOPs of one sample's training step: forward, weight gradient, and input gradient but the first layer's."""
    macs = [m for _, m in layer_macs(model)]
    return 2 * (2 * sum(macs) + sum(macs[1:]))
