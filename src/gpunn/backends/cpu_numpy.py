"""cpu-numpy: the reference. Every layer in NumPy (gpunn.nn), all parameters in one flat buffer, one SGD call."""

from __future__ import annotations

import time

import numpy as np

from gpunn.nn import SGD, MSELoss, SoftmaxCrossEntropy

from .base import Backend, StepTimes


def make_loss(model_name: str):
    """The loss head of a model: MSE for the autoencoder (its target is its input), softmax-CE otherwise."""
    return MSELoss() if model_name == "autoencoder" else SoftmaxCrossEntropy()


class CpuNumpyBackend(Backend):
    name = "cpu-numpy"

    def __init__(self, model, model_name: str, lr: float):
        super().__init__(model, model_name, lr)
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

    def gradients(self, xb: np.ndarray, target: np.ndarray) -> np.ndarray:
        """The flat gradient of one batch, parameters left alone (what the GPU engine's tests compare with)."""
        self.loss.forward(self.model.forward(xb), target)
        self.model.backward(self.loss.backward(), input_grad=False)
        grads = self.model.flat_grad.copy()
        self.model.flat_grad[:] = 0
        return grads

    def predict(self, xb: np.ndarray) -> np.ndarray:
        return self.model.forward(xb)

    def parameters(self) -> np.ndarray:
        return self.model.flat
