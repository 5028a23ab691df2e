"""cpu-numpy: the reference. Every layer in NumPy (gpunn.nn), all parameters in one flat buffer, one SGD call."""

from __future__ import annotations

import time

import numpy as np

from gpunn.nn import SGD, Conv2d, MSELoss, SoftmaxCrossEntropy
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.nn.models import model_spec

from .base import Backend, StepTimes, check_reduction_setting

PREDICT_CHUNK = 64  # samples per forward in predict, for models with convolutions (the papers' training batch)


def make_loss(model_name: str, reduction: str = DEFAULT_REDUCTION):
    """The loss head of a model: MSE for the autoencoder (its target is its input; batch mean only:
    check_reduction_setting refuses another reduction), softmax-CE with the gradient's `reduction` otherwise."""
    return SoftmaxCrossEntropy(reduction) if model_spec(model_name).classifier else MSELoss()


class CpuNumpyBackend(Backend):
    name = "cpu-numpy"

    def __init__(self, model, model_name: str, lr: float, reduction: str = DEFAULT_REDUCTION):
        super().__init__(model, model_name, lr)
        check_reduction_setting(model_name, reduction)
        self.loss = make_loss(model_name, reduction)
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
        """The outputs of xb; a model with convolutions forwards PREDICT_CHUNK samples at a time: the evaluation's
        batches of 1000 in one piece made the CNN's forward 3.5x slower on a 2-core machine (its activations, im2col
        matrices and transposes outgrow the caches), while the MLP's GEMMs are as fast either way. Each output is the
        same dot products."""
        chunk = PREDICT_CHUNK if any(isinstance(layer, Conv2d) for layer in self.model.layers) else len(xb)
        if len(xb) <= chunk:
            return self.model.forward(xb)
        return np.concatenate([self.model.forward(xb[s:s + chunk]) for s in range(0, len(xb), chunk)])

    def parameters(self) -> np.ndarray:
        return self.model.flat
