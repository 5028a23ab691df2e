"""The three models of the reproduced papers, as flat-buffer `Sequential`s.

Each constructor draws its initialisation from `gpunn.seeding.init_rng(seed)`, one layer after the other
(He-normal weights drawn in float64, zero biases), so one seed gives one flat buffer: bit-identical across
runs, and the float64 model of a seed rounds to exactly the float32 model of that seed.
`MODELS` holds one `ModelSpec` per model (its builder, widths, input, loss, reductions); `model_spec(name)` looks
one up.

    mlp()          Flatten, Linear(784, 256), ReLU, Linear(256, 10)                        203 530 params
    cnn()          Conv(1->16) ReLU Conv(16->32) ReLU MaxPool Flatten Linear(4608, 10)      50 890 params
    autoencoder()  Conv(3->256,p1) ReLU Pool Conv(256->128,p1) ReLU Pool | Conv(128->128,p1) ReLU Up
                   Conv(128->256,p1) ReLU Up Conv(256->3,p1)                               751 875 params
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import GpunnError
from ..seeding import init_rng
from .functional import DEFAULT_REDUCTION, REDUCTIONS
from .layers import Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential, Upsample

__all__ = ["mlp", "cnn", "autoencoder", "Autoencoder", "build_model", "MODELS", "ModelSpec", "model_spec"]


def _named(model: Sequential, name: str, input_shape) -> Sequential:
    """Records what the model is (its backends' model name) and one sample's input shape: the Python API
    (gpunn.api.Trainer) needs both to pick a backend and to check the data."""
    model.name = name
    model.input_shape = tuple(int(s) for s in input_shape)
    return model


def _sizes(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    if not values or any(int(v) != v or v < 1 for v in values):
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {values!r}")
    return tuple(int(v) for v in values)


def mlp(in_features: int = 784, hidden: int = 256, classes: int = 10, seed: int = 0, dtype=np.float32) -> Sequential:
    """Flatten, Linear(in_features, hidden), ReLU, Linear(hidden, classes); softmax lives in the loss.

    Flat layout: [W1 (in, hidden) row-major, b1 (hidden), W2 (hidden, classes), b2 (classes)], the layout
    `gpunn.nn.serial.SerialMLP` works on."""
    rng = init_rng(seed)
    layers = [
        Flatten(),
        Linear(in_features, hidden, dtype=dtype, rng=rng),
        ReLU(),
        Linear(hidden, classes, dtype=dtype, rng=rng),
    ]
    return _named(Sequential(layers, dtype=dtype), "mlp", (in_features,))


def cnn(
    in_channels: int = 1,
    image_size: int = 28,
    channels=(16, 32),
    classes: int = 10,
    seed: int = 0,
    dtype=np.float32,
) -> Sequential:
    """Conv3x3(pad 0)+ReLU for each entry of `channels`, MaxPool 2, Flatten, Linear(-> classes).

    The FC input is computed from image_size: 28 -> 26 -> 24 -> 12 gives 32*12*12 = 4608 for the defaults
    (50 890 parameters); 8x8 digits give 8 -> 6 -> 4 -> 2, i.e. 32*2*2."""
    channels = _sizes("channels", channels)
    size = int(image_size)
    rng = init_rng(seed)
    layers: list[Module] = []
    cin = int(in_channels)
    for cout in channels:
        layers += [Conv2d(cin, cout, kernel_size=3, padding=0, dtype=dtype, rng=rng), ReLU()]
        size -= 2
        cin = cout
    size //= 2
    if size < 1:
        raise ValueError(
            f"cnn: image_size {image_size} is too small for {len(channels)} unpadded 3x3 convolutions and a 2x2 pool"
        )
    layers += [MaxPool2d(2), Flatten(), Linear(cin * size * size, classes, dtype=dtype, rng=rng)]
    return _named(Sequential(layers, dtype=dtype), "cnn", (in_channels, image_size, image_size))


class Autoencoder(Sequential):
    """A Sequential whose first `n_encoder` layers are the encoder; `encode(x)` runs only those and returns
    the latent (N, C, H/4, W/4), `decode(z)` runs the rest."""

    def __init__(self, layers, n_encoder: int, dtype=np.float32):
        super().__init__(layers, dtype=dtype)
        if not 0 < n_encoder < len(self.layers):
            raise ValueError(f"Autoencoder: n_encoder must be in [1, {len(self.layers) - 1}], got {n_encoder}")
        self.n_encoder = int(n_encoder)

    @property
    def encoder(self) -> list[Module]:
        return self.layers[: self.n_encoder]

    @property
    def decoder(self) -> list[Module]:
        return self.layers[self.n_encoder :]

    def encode(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        for layer in self.encoder:
            x = layer.forward(x)
        return x

    def decode(self, z) -> np.ndarray:
        z = np.asarray(z, dtype=self.dtype)
        for layer in self.decoder:
            z = layer.forward(z)
        return z


def autoencoder(
    in_channels: int = 3, image_size: int = 32, channels=(256, 128), seed: int = 0, dtype=np.float32
) -> Autoencoder:
    """Convolutional autoencoder of E5, all convolutions 3x3 with padding 1.

    encoder: Conv(in->c0) ReLU MaxPool Conv(c0->c1) ReLU MaxPool      -> latent (c1, S/4, S/4) = 128x8x8
    decoder: Conv(c1->c1) ReLU Up Conv(c1->c0) ReLU Up Conv(c0->in)    (no final activation)
    751 875 parameters for the defaults. image_size must be divisible by 4."""
    channels = _sizes("channels", channels)
    if len(channels) != 2:
        raise ValueError(f"autoencoder: channels must have two entries (c0, c1), got {channels!r}")
    c0, c1 = channels
    if int(image_size) != image_size or image_size < 4 or image_size % 4:
        raise ValueError(f"autoencoder: image_size must be a positive multiple of 4, got {image_size!r}")
    rng = init_rng(seed)
    cin = int(in_channels)

    def conv(a, b):
        return Conv2d(a, b, kernel_size=3, padding=1, dtype=dtype, rng=rng)

    encoder = [conv(cin, c0), ReLU(), MaxPool2d(2), conv(c0, c1), ReLU(), MaxPool2d(2)]
    decoder = [conv(c1, c1), ReLU(), Upsample(2), conv(c1, c0), ReLU(), Upsample(2), conv(c0, cin)]
    model = Autoencoder(encoder + decoder, n_encoder=len(encoder), dtype=dtype)
    model.image_size = int(image_size)
    model.latent_shape = (c1, image_size // 4, image_size // 4)
    return _named(model, "autoencoder", (cin, image_size, image_size))


@dataclass(frozen=True)
class ModelSpec:
    """One model: its builder and what runs, backends and the API need to know about it."""

    name: str
    title: str                # in report titles: "MLP", "CNN", "convolutional autoencoder"
    short: str                # in short titles: "MLP", "CNN", "autoencoder"
    builder: Callable[..., Sequential]  # keyword sizes (and seed, dtype) -> the model
    width_key: str            # the builder keyword a run's widths fill: "hidden" (one int) or "channels" (a tuple)
    width_count: int          # widths a run names (RunSpec.widths)
    square_images: bool       # takes (C, S, S) images; else samples of any shape, flattened to in_features
    loss: str                 # the loss head: "softmax_ce" (labels are the targets) or "mse" (the input is)
    reductions: tuple[str, ...]  # loss-gradient reductions it trains with (gpunn.nn.functional.REDUCTIONS)
    cuda_variants: tuple[str, str]  # the API's device "cuda": the fastest GPU variant on a GPU, under the simulator
    side_multiple: int = 1    # the image side must be a multiple of this (the autoencoder's two pools: 4)
    encoder: bool = False     # its first layers are an encoder (Autoencoder.encode: features, E6)

    @property
    def classifier(self) -> bool:
        """Trained on labels (softmax cross-entropy); else its target is its input."""
        return self.loss == "softmax_ce"

    def sizes(self, widths, image_shape: tuple[int, int, int], num_classes: int) -> dict:
        """Keyword sizes of `builder` at `widths` on images of `image_shape` (C, H, W) in `num_classes` classes."""
        channels, height, width = image_shape
        sizes = ({"in_channels": channels, "image_size": height} if self.square_images
                 else {"in_features": channels * height * width})
        sizes[self.width_key] = widths[0] if self.width_count == 1 else widths
        if self.classifier:
            sizes["classes"] = num_classes
        return sizes


MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (
        ModelSpec("mlp", title="MLP", short="MLP", builder=mlp, width_key="hidden", width_count=1,
                  square_images=False, loss="softmax_ce", reductions=REDUCTIONS,
                  cuda_variants=("gpu-graph", "gpu-fused")),
        ModelSpec("cnn", title="CNN", short="CNN", builder=cnn, width_key="channels", width_count=2,
                  square_images=True, loss="softmax_ce", reductions=REDUCTIONS,
                  cuda_variants=("gpu-graph", "gpu-im2col")),
        ModelSpec("autoencoder", title="convolutional autoencoder", short="autoencoder", builder=autoencoder,
                  width_key="channels", width_count=2, square_images=True, loss="mse",
                  reductions=(DEFAULT_REDUCTION,), cuda_variants=("gpu-graph", "gpu-im2col"), side_multiple=4,
                  encoder=True),
    )
}


def model_spec(name: str) -> ModelSpec:
    """The record of model `name`; a one-line GpunnError naming the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise GpunnError(f"unknown model '{name}': choose one of {', '.join(MODELS)}") from None


def build_model(name: str, **sizes) -> Sequential:
    """Builds "mlp", "cnn" or "autoencoder" with the given keyword sizes (and seed, dtype)."""
    try:
        spec = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}") from None
    return spec.builder(**sizes)
