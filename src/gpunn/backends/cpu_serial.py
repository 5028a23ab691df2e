"""cpu-serial: the MLP as single-threaded loops (gpunn.nn.serial), updating the model's flat buffer in place."""

from __future__ import annotations

import time

import numpy as np

from gpunn.nn import Linear
from gpunn.nn.functional import DEFAULT_REDUCTION

from .base import Backend, StepTimes


class CpuSerialBackend(Backend):
    name = "cpu-serial"

    def __init__(self, model, model_name: str, lr: float, reduction: str = DEFAULT_REDUCTION):
        from gpunn.nn.serial import SerialMLP  # imports numba: only when this variant is asked for

        super().__init__(model, model_name, lr)
        first, second = (layer for layer in model.layers if isinstance(layer, Linear))
        in_features, hidden = first.in_features, first.out_features
        classes = second.out_features
        self.serial = SerialMLP(model.flat, in_features, hidden, classes, reduction)
        self.reduction = reduction
        self._shape = (in_features, hidden, classes)

    def warm_up(self, batch_sizes) -> None:
        """numba compiles on first call: do it on a throwaway copy, so no timed step pays for it."""
        from gpunn.nn.serial import SerialMLP

        in_features, hidden, classes = self._shape
        warm = SerialMLP(self.model.flat.copy(), in_features, hidden, classes, self.reduction)
        sample = np.full((1, in_features), 0.5, dtype=np.float32)
        warm.forward(sample)
        warm.backward_and_step(np.zeros(1, dtype=np.int64), self.lr)
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

    def parameters(self) -> np.ndarray:
        return self.model.flat
