"""Training variants: the registry from variant name to backend.

A backend owns a model's parameters on its device and runs training steps on batches that the training
loop gathers in the shared batch order (gpunn.seeding), so every variant sees the same init and batches:

    cpu-numpy   NumPy float32 reference: gpunn.nn layers, one flat parameter buffer, SGD (all models)
    cpu-serial  plain loops under numba @njit on one thread, like the papers' serial C++ (MLP only)
    gpu-naive   numba.cuda, E1's design: batch copied every step, one kernel per op (gpunn.gpu_mlp)
    gpu-tiled   the same with shared-memory tiled GEMMs forward and backward
    gpu-fused   training set resident on the GPU, batches gathered there, fused epilogues, 8 launches a step
    gpu-graph   gpu-fused with each step captured in CUDA graphs and replayed (real GPU only)

Each registry entry says which models a variant trains and whether it runs on the CUDA device
(`uses_gpu`: what the provenance record and the GPU checks go by; `check_variant` validates a name up front).

A backend with `load_train_data` and `train_epoch` (gpu-fused) trains whole epochs on the device; the
training loop then hands it the epoch's order instead of batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from gpunn.errors import GpunnError
from gpunn.nn import SGD, MSELoss, SoftmaxCrossEntropy


@dataclass
class StepTimes:
    loss: float
    forward_s: float   # forward pass and loss
    backward_s: float  # backward pass and parameter update


def make_loss(model_name: str):
    return MSELoss() if model_name == "autoencoder" else SoftmaxCrossEntropy()


class CpuNumpyBackend:
    """The reference: every layer in NumPy, all parameters in one flat buffer updated by one SGD call."""

    def __init__(self, model, model_name: str, lr: float):
        self.model = model
        self.loss = make_loss(model_name)
        self.optimizer = SGD(model.parameters(), lr)

    def train_step(self, xb: np.ndarray, target: np.ndarray) -> StepTimes:
        start = time.perf_counter()
        out = self.model.forward(xb)
        loss = self.loss.forward(out, target)
        mid = time.perf_counter()
        self.model.backward(self.loss.backward(), input_grad=False)  # no gradient w.r.t. the images
        self.optimizer.step()
        end = time.perf_counter()
        return StepTimes(float(loss), mid - start, end - mid)

    def predict(self, xb: np.ndarray) -> np.ndarray:
        return self.model.forward(xb)

    def flat_params(self) -> np.ndarray:
        return self.model.flat


class CpuSerialBackend:
    """The MLP as single-threaded loops (gpunn.nn.serial), updating the model's flat buffer in place."""

    def __init__(self, model, model_name: str, lr: float):
        from gpunn.nn.serial import SerialMLP

        first, second = (layer for layer in model.layers if hasattr(layer, "weight"))
        in_features, hidden = first.weight.data.shape
        classes = second.weight.data.shape[1]
        self.model = model
        self.lr = lr
        self.serial = SerialMLP(model.flat, in_features, hidden, classes)
        # numba compiles on first call: do it now, on a throwaway copy, so no timed step pays for it
        warm = SerialMLP(model.flat.copy(), in_features, hidden, classes)
        sample = np.full((1, in_features), 0.5, dtype=np.float32)
        warm.forward(sample)
        warm.backward_and_step(np.zeros(1, dtype=np.int64), lr)
        warm.predict_logits(sample)

    def train_step(self, xb: np.ndarray, target: np.ndarray) -> StepTimes:
        flat_x = np.ascontiguousarray(xb.reshape(len(xb), -1))
        start = time.perf_counter()
        self.serial.forward(flat_x)
        mid = time.perf_counter()
        loss = self.serial.backward_and_step(target, self.lr)
        end = time.perf_counter()
        return StepTimes(float(loss), mid - start, end - mid)

    def predict(self, xb: np.ndarray) -> np.ndarray:
        return self.serial.predict_logits(np.ascontiguousarray(xb.reshape(len(xb), -1)))

    def flat_params(self) -> np.ndarray:
        return self.model.flat


def _gpu_mlp(name: str) -> Callable:
    def factory(model, model_name: str, lr: float):
        from gpunn import gpu_mlp  # imports numba.cuda: only when a GPU variant is asked for

        return {"gpu-naive": gpu_mlp.GpuNaiveMlp, "gpu-tiled": gpu_mlp.GpuTiledMlp,
                "gpu-fused": gpu_mlp.GpuFusedMlp, "gpu-graph": gpu_mlp.GpuGraphMlp}[name](model, model_name, lr)

    return factory


class Variant(NamedTuple):
    factory: Callable   # (model, model_name, lr) -> backend
    models: tuple[str, ...]  # models it can train
    gpu: bool           # runs on the CUDA device (needs a GPU or numba's simulator)
    simulator: bool = True  # can run under numba's CUDA simulator (gpu-graph captures CUDA graphs, which it lacks)


GPU_MLP_VARIANTS = ("gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph")
VARIANTS: dict[str, Variant] = {
    "cpu-numpy": Variant(CpuNumpyBackend, ("mlp", "cnn", "autoencoder"), gpu=False),
    "cpu-serial": Variant(CpuSerialBackend, ("mlp",), gpu=False),
    **{name: Variant(_gpu_mlp(name), ("mlp",), gpu=True, simulator=name != "gpu-graph") for name in GPU_MLP_VARIANTS},
}


def check_variant(variant: str, model_name: str | None = None) -> Variant:
    """The registry entry of `variant`; a one-line GpunnError when the name is unknown or the variant cannot
    train `model_name` (when given)."""
    if variant not in VARIANTS:
        raise GpunnError(f"unknown variant '{variant}': choose one of {', '.join(VARIANTS)}")
    entry = VARIANTS[variant]
    if model_name is not None and model_name not in entry.models:
        raise GpunnError(f"variant {variant} supports {', '.join(entry.models)}, not {model_name}")
    return entry


def uses_gpu(variant: str) -> bool:
    """Whether `variant` trains on the CUDA device (GpunnError for an unknown name)."""
    return check_variant(variant).gpu


def make_backend(variant: str, model, model_name: str, lr: float):
    return check_variant(variant, model_name).factory(model, model_name, lr)


def supported_models(variant: str) -> tuple[str, ...]:
    return check_variant(variant).models


def runs_on_simulator(variant: str) -> bool:
    """Whether a variant can run where numba's CUDA simulator stands in for the GPU."""
    return check_variant(variant).simulator
