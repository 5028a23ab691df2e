"""Plain SGD. Gradients are batch means (the losses divide by the batch size), so `lr` is the step on the
mean gradient, as in the papers (lr 0.01, batch 64)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .layers import Parameter, ParameterBuffer

__all__ = ["SGD"]


class SGD:
    """`step()`: data -= lr * grad, then grad = 0, for every parameter.

    With a `ParameterBuffer` (from `Sequential.parameters()`) this is ONE vectorised update over the flat
    buffer; with a plain iterable of Parameters it loops. In float32 the update is computed as
    `data - float32(lr) * grad` (product rounded to float32, then the difference; no fused multiply-add).
    """

    def __init__(self, params: ParameterBuffer | Iterable[Parameter], lr: float):
        lr = float(lr)
        if not np.isfinite(lr) or lr <= 0:
            raise ValueError(f"SGD: lr must be a positive finite number, got {lr!r}")
        self.lr = lr
        if isinstance(params, ParameterBuffer):
            self.flat: ParameterBuffer | None = params
            self.params = list(params)
        else:
            self.flat = None
            self.params = list(params)
            for p in self.params:
                if not isinstance(p, Parameter):
                    raise ValueError(f"SGD: expected Parameters, got {type(p).__name__}")

    def step(self) -> None:
        if self.flat is not None:
            self._update(self.flat.data, self.flat.grad)
        else:
            for p in self.params:
                self._update(p.data, p.grad)

    def _update(self, data: np.ndarray, grad: np.ndarray) -> None:
        data -= data.dtype.type(self.lr) * grad
        grad[...] = 0

    def zero_grad(self) -> None:
        if self.flat is not None:
            self.flat.grad[...] = 0
        else:
            for p in self.params:
                p.grad[...] = 0
