"""Layers, losses and the flat-buffer `Sequential` of the CPU reference (NumPy, built on `functional`).

Every module caches what its backward needs during `forward(x)`; `backward(dy)` returns dx and ACCUMULATES
(+=) the parameter gradients into `Parameter.grad`, so the optimizer zeroes them after each update (the GPU
SGD kernel fuses update and zeroing the same way).

Standalone use, as in the project plan::

    layers = [Linear(784, 256), ReLU(), Linear(256, 10)]
    loss_fn = SoftmaxCrossEntropy()
    opt = SGD(parameters(layers), lr=0.01)
    loss = loss_fn.forward(forward(layers, x), y)
    backward(layers, loss_fn.backward())
    opt.step()

`Sequential` does the same but packs every parameter into one flat buffer, so one vectorised update (one
GPU kernel) covers the whole model and the parameters can be copied, compared and saved as one array.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from . import functional as F

__all__ = [
    "Parameter",
    "Module",
    "Linear",
    "ReLU",
    "Conv2d",
    "MaxPool2d",
    "Upsample",
    "Flatten",
    "SoftmaxCrossEntropy",
    "MSELoss",
    "ParameterBuffer",
    "Sequential",
    "forward",
    "backward",
    "parameters",
]


def _float_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def _positive_int(name: str, value) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class Parameter:
    """A named trainable array: `data` and `grad` are ndarrays of the same shape and dtype."""

    def __init__(self, name: str, data: np.ndarray, grad: np.ndarray | None = None):
        self.name = name
        self.data = data
        self.grad = np.zeros_like(data) if grad is None else grad
        if self.grad.shape != self.data.shape:
            raise ValueError(f"Parameter {name}: grad {self.grad.shape} and data {self.data.shape} differ in shape")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def size(self) -> int:
        return self.data.size

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.data.shape}, dtype={self.data.dtype})"


class Module:
    """Base class: `forward(x)` caches, `backward(dy)` returns dx, `parameters()` lists the Parameters."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def parameters(self) -> list[Parameter]:
        return []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    def _cached(self, what: str = "backward"):
        if self._cache is None:
            raise RuntimeError(f"{type(self).__name__}.{what} called before forward")
        return self._cache

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _Weighted(Module):
    """A module with a weight and a bias Parameter, computed in `dtype` (inputs are cast to it)."""

    weight: Parameter
    bias: Parameter

    def parameters(self) -> list[Parameter]:
        return [self.weight, self.bias]

    @property
    def dtype(self) -> np.dtype:
        return self.weight.data.dtype

    def _input(self, x) -> np.ndarray:
        return np.asarray(x, dtype=self.dtype)

    @staticmethod
    def _he_normal(rng, shape, fan_in: int, dtype) -> np.ndarray:
        # Drawn in float64 and then rounded, so a float32 and a float64 model from one seed agree.
        rng = np.random.default_rng() if rng is None else rng
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


class Linear(_Weighted):
    """y = x @ weight + bias; weight (in_features, out_features) ~ N(0, 2 / in_features), bias = 0."""

    def __init__(self, in_features: int, out_features: int, dtype=np.float32, rng: np.random.Generator | None = None):
        self.in_features = _positive_int("in_features", in_features)
        self.out_features = _positive_int("out_features", out_features)
        dtype = _float_dtype(dtype)
        w = self._he_normal(rng, (self.in_features, self.out_features), self.in_features, dtype)
        self.weight = Parameter("weight", w)
        self.bias = Parameter("bias", np.zeros(self.out_features, dtype=dtype))
        self._cache = None

    def forward(self, x):
        x = self._input(x)
        y = F.linear_forward(x, self.weight.data, self.bias.data)
        self._cache = x
        return y

    def backward(self, dy, input_grad: bool = True):
        """Accumulates weight/bias gradients; returns dx, or None when `input_grad` is False (first layer)."""
        x = self._cached()
        dx, dw, db = F.linear_backward(x, self.weight.data, np.asarray(dy, dtype=self.dtype))
        self.weight.grad += dw
        self.bias.grad += db
        return dx if input_grad else None

    def __repr__(self):
        return f"Linear({self.in_features}, {self.out_features}, dtype={self.dtype})"


class Conv2d(_Weighted):
    """Stride-1 convolution, weight (Cout, Cin, k, k) ~ N(0, 2 / (Cin*k*k)), bias = 0, zero padding."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        padding: int = 0,
        dtype=np.float32,
        rng: np.random.Generator | None = None,
    ):
        self.in_channels = _positive_int("in_channels", in_channels)
        self.out_channels = _positive_int("out_channels", out_channels)
        self.kernel_size = _positive_int("kernel_size", kernel_size)
        if int(padding) != padding or padding < 0:
            raise ValueError(f"padding must be a non-negative integer, got {padding!r}")
        self.padding = int(padding)
        dtype = _float_dtype(dtype)
        k = self.kernel_size
        fan_in = self.in_channels * k * k
        w = self._he_normal(rng, (self.out_channels, self.in_channels, k, k), fan_in, dtype)
        self.weight = Parameter("weight", w)
        self.bias = Parameter("bias", np.zeros(self.out_channels, dtype=dtype))
        self._cache = None

    def output_size(self, size: int) -> int:
        return F.conv2d_output_size(size, self.kernel_size, self.padding)

    def forward(self, x):
        y, self._cache = F.conv2d_forward(self._input(x), self.weight.data, self.bias.data, self.padding)
        return y

    def backward(self, dy, input_grad: bool = True):
        """Accumulates weight/bias gradients; returns dx, or None when `input_grad` is False (first layer)."""
        dx, dw, db = F.conv2d_backward(np.asarray(dy, dtype=self.dtype), self._cached(), input_grad)
        self.weight.grad += dw
        self.bias.grad += db
        return dx

    def __repr__(self):
        return (
            f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"padding={self.padding}, dtype={self.dtype})"
        )


class ReLU(Module):
    def __init__(self):
        self._cache = None

    def forward(self, x):
        x = np.asarray(x)
        self._cache = x
        return F.relu_forward(x)

    def backward(self, dy):
        return F.relu_backward(self._cached(), np.asarray(dy))


class MaxPool2d(Module):
    """2x2 max pooling with stride 2 (the only size supported); odd H/W are floored like PyTorch."""

    def __init__(self, kernel_size: int = 2):
        if kernel_size != 2:
            raise ValueError(f"MaxPool2d supports kernel_size 2 only, got {kernel_size!r}")
        self.kernel_size = 2
        self._cache = None

    def forward(self, x):
        x = np.asarray(x)
        y, argmax = F.maxpool2x2_forward(x)
        self._cache = (argmax, x.shape)
        return y

    def backward(self, dy):
        argmax, x_shape = self._cached()
        return F.maxpool2x2_backward(np.asarray(dy), argmax, x_shape)

    def __repr__(self):
        return "MaxPool2d(2)"


class Upsample(Module):
    """Nearest-neighbour upsampling by 2 (the only factor supported)."""

    def __init__(self, scale_factor: int = 2):
        if scale_factor != 2:
            raise ValueError(f"Upsample supports scale_factor 2 only, got {scale_factor!r}")
        self.scale_factor = 2
        self._cache = None

    def forward(self, x):
        self._cache = True
        return F.upsample2x_forward(x)

    def backward(self, dy):
        self._cached()
        return F.upsample2x_backward(dy)

    def __repr__(self):
        return "Upsample(2)"


class Flatten(Module):
    """(N, ...) -> (N, prod(...)); a view when the input is contiguous."""

    def __init__(self):
        self._cache = None

    def forward(self, x):
        x = np.asarray(x)
        if x.ndim < 1 or x.size == 0:
            raise ValueError(f"Flatten: input must have a batch dimension and no zero-sized dimension, got {x.shape}")
        self._cache = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        x_shape = self._cached()
        dy = np.asarray(dy)
        if dy.size != int(np.prod(x_shape)) or dy.shape[0] != x_shape[0]:
            raise ValueError(f"Flatten.backward: dy {dy.shape} does not match the forward input {x_shape}")
        return dy.reshape(x_shape)


# --------------------------------------------------------------------------------------------- losses
class SoftmaxCrossEntropy:
    """Mean softmax cross-entropy over the batch. `forward(logits, labels) -> float`, `backward() -> dlogits`.
    `reduction` (F.REDUCTIONS) is what the gradient is of: the batch mean (default) or the batch sum of the
    per-sample losses; forward reports the mean either way."""

    def __init__(self, reduction: str = F.DEFAULT_REDUCTION):
        self.reduction = F.check_reduction("SoftmaxCrossEntropy", reduction)
        self._cache = None
        self.probs: np.ndarray | None = None

    def forward(self, logits, labels) -> float:
        loss, probs = F.softmax_cross_entropy(logits, labels)
        self.probs = probs
        self._cache = (probs, np.asarray(labels))
        return loss

    __call__ = forward

    def backward(self) -> np.ndarray:
        if self._cache is None:
            raise RuntimeError("SoftmaxCrossEntropy.backward called before forward")
        probs, labels = self._cache
        return F.softmax_cross_entropy_backward(probs, labels, self.reduction)

    @staticmethod
    def forward_and_grad(logits, labels, reduction: str = F.DEFAULT_REDUCTION):
        """(mean loss, dlogits) in one call, as in the project plan's loop."""
        loss, probs = F.softmax_cross_entropy(logits, labels)
        return loss, F.softmax_cross_entropy_backward(probs, labels, reduction)


class MSELoss:
    """Mean over all elements of (pred - target)^2. `forward(pred, target) -> float`, `backward() -> dpred`."""

    def __init__(self):
        self._cache = None

    def forward(self, pred, target) -> float:
        pred = np.asarray(pred)
        target = np.asarray(target, dtype=pred.dtype)  # e.g. uint8 or float64 targets for a float32 model
        loss = F.mse_forward(pred, target)
        self._cache = (pred, target)
        return loss

    __call__ = forward

    def backward(self) -> np.ndarray:
        if self._cache is None:
            raise RuntimeError("MSELoss.backward called before forward")
        return F.mse_backward(*self._cache)

    @staticmethod
    def forward_and_grad(pred, target):
        return F.mse_forward(pred, target), F.mse_backward(pred, target)


# --------------------------------------------------------------------------------------------- list helpers
def forward(layers: Iterable[Module], x) -> np.ndarray:
    """Runs x through the layers in order."""
    for layer in layers:
        x = layer.forward(x)
    return x


def backward(layers: Sequence[Module], dy) -> np.ndarray:
    """Runs dy back through the layers in reverse order; returns the input gradient."""
    for layer in reversed(list(layers)):
        dy = layer.backward(dy)
    return dy


def parameters(layers: Iterable[Module]) -> list[Parameter]:
    """All Parameters of the layers, in layer order."""
    return [p for layer in layers for p in layer.parameters()]


# --------------------------------------------------------------------------------------------- Sequential
class ParameterBuffer:
    """The Parameters of a `Sequential`, iterable like a list, plus `data` / `grad`: the two flat 1-D
    arrays every Parameter's data / grad is a view into."""

    def __init__(self, params: list[Parameter], data: np.ndarray, grad: np.ndarray):
        self._params = params
        self.data = data
        self.grad = grad

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __getitem__(self, i) -> Parameter:
        return self._params[i]

    def __repr__(self) -> str:
        return f"ParameterBuffer({len(self._params)} parameters, {self.data.size} values, dtype={self.data.dtype})"


class Sequential(Module):
    """Layers run in order, with ALL their parameters packed into one flat buffer.

    `flat` (1-D) holds the parameters in layer order, each one row-major (C order), weight before bias;
    `flat_grad` has the same layout. Each Parameter's `data` / `grad` is rebound to a view into them, so
    writing `flat` changes the layers and one update over `flat` updates every parameter.
    Parameter names are `<layer index>.<name>`, e.g. `1.weight`, `1.bias`, `3.weight`.
    Inputs and output gradients are cast to `dtype` (the model's compute dtype).

    The model constructors (gpunn.nn.models: mlp, cnn, autoencoder, build_model) set `name` (the model's name
    for the training backends) and `input_shape` (one sample's shape); `to(device)` needs both.
    """

    name: str | None = None
    input_shape: tuple[int, ...] | None = None

    def __init__(self, layers: Iterable[Module], dtype=np.float32):
        self.layers: list[Module] = list(layers)
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, Module):
                raise ValueError(f"Sequential: layer {i} is {type(layer).__name__}, not a Module")
            if isinstance(layer, Sequential):
                raise ValueError(f"Sequential: layer {i} is itself a Sequential; pass a flat list of layers")
        self._pack(_float_dtype(dtype))

    def _pack(self, dtype: np.dtype) -> None:
        params: list[Parameter] = []
        for i, layer in enumerate(self.layers):
            for p in layer.parameters():
                p.name = f"{i}.{p.name.rsplit('.', 1)[-1]}"
                params.append(p)
        total = sum(p.size for p in params)
        self.dtype = dtype
        self.flat = np.zeros(total, dtype=dtype)
        self.flat_grad = np.zeros(total, dtype=dtype)
        offset = 0
        layout = []
        for p in params:
            shape = p.data.shape
            view = self.flat[offset : offset + p.size].reshape(shape)
            view[...] = p.data  # cast to the model dtype
            p.data = view
            p.grad = self.flat_grad[offset : offset + p.size].reshape(shape)
            layout.append((p.name, offset, shape))
            offset += p.size
        self._params = params
        self._layout = layout

    # -- parameters
    def layout(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """(name, offset into flat, shape) of each parameter, in flat order."""
        return list(self._layout)

    def parameters(self) -> ParameterBuffer:
        return ParameterBuffer(self._params, self.flat, self.flat_grad)

    @property
    def num_parameters(self) -> int:
        return int(self.flat.size)

    def zero_grad(self) -> None:
        self.flat_grad[...] = 0

    def load_flat(self, array) -> None:
        """Copies `array` (any float dtype, num_parameters values) into `flat`, in place."""
        array = np.asarray(array)
        if array.size != self.flat.size:
            raise ValueError(f"load_flat: expected {self.flat.size} values, got array of shape {array.shape}")
        self.flat[...] = array.reshape(-1)

    def astype(self, dtype) -> Sequential:
        """A new, independent model of the same class with the same parameter values in `dtype`
        (float32 -> float64 is exact; gradients start at zero)."""
        dtype = _float_dtype(dtype)
        caches = [getattr(layer, "_cache", None) for layer in self.layers]
        for layer in self.layers:
            layer._cache = None  # don't deep-copy activations
        try:
            new = copy.deepcopy(self)
        finally:
            for layer, c in zip(self.layers, caches):
                layer._cache = c
        new._pack(dtype)
        new.zero_grad()
        return new

    # -- compute
    def forward(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy, input_grad: bool = True):
        """Back-propagates dy (gradient of the loss w.r.t. the output), accumulating into flat_grad.
        Returns the input gradient; with `input_grad=False` it stops at the first layer that has
        parameters (skipping the unused input gradient, as a trainer wants) and returns None."""
        dy = np.asarray(dy, dtype=self.dtype)
        first_weighted = next((i for i, layer in enumerate(self.layers) if layer.parameters()), 0)
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            if not input_grad and i == first_weighted and isinstance(layer, _Weighted):
                layer.backward(dy, input_grad=False)
                return None
            dy = layer.backward(dy)
        return None if not input_grad else dy

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i) -> Module:
        return self.layers[i]

    def __iter__(self) -> Iterator[Module]:
        return iter(self.layers)

    def __repr__(self) -> str:
        inner = ",\n  ".join(f"({i}) {layer!r}" for i, layer in enumerate(self.layers))
        return f"{type(self).__name__}(\n  {inner}\n) [{self.num_parameters} parameters, {self.dtype}]"
