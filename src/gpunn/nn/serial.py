"""`cpu-serial`: the MLP baseline written like the papers' serial C++ (E1, E2).

Plain nested loops compiled by `numba.njit` (one thread, no `parallel`, no BLAS / np.dot inside the
kernels), float32 throughout (the loss is accumulated in float64), working IN PLACE on the flat float32
parameter buffer of `gpunn.nn.models.mlp`:

    flat = [W1 (in, hidden) row-major | b1 (hidden) | W2 (hidden, classes) row-major | b2 (classes)]

Same math as the NumPy reference (cpu-numpy): h = relu(x W1 + b1), logits = h W2 + b2, mean softmax
cross-entropy, batch-mean gradients ((probs - onehot) / B; with `reduction="sum"` those of the batch sum,
probs - onehot), then `p -= float32(lr) * grad` for every parameter. Only the summation order differs (numpy's
BLAS blocks its sums), so one step agrees to float32 rounding. The functions compile on first use and are kept in
gpunn's kernel cache (gpunn.kernel_cache: about 1.3 s of every cpu-serial job otherwise; GPUNN_KERNEL_CACHE=off
compiles them in every process).
"""

from __future__ import annotations

import numba
import numpy as np

from gpunn import kernel_cache

from .functional import DEFAULT_REDUCTION, check_reduction

__all__ = ["SerialMLP", "mlp_num_parameters"]


def mlp_num_parameters(in_features: int, hidden: int, classes: int) -> int:
    return in_features * hidden + hidden + hidden * classes + classes


_JIT = dict(nopython=True, parallel=False, fastmath=False, cache=kernel_cache.configure("cpu") is not None,
            error_model="numpy")


@numba.jit(**_JIT)
def _forward(x, w1, b1, w2, b2, h, logits):
    """h = relu(x @ w1 + b1) (B, hidden); logits = h @ w2 + b2 (B, classes). Row by row, loops only."""
    batch, n_in = x.shape
    n_hidden = w1.shape[1]
    n_classes = w2.shape[1]
    zero = np.float32(0.0)
    for n in range(batch):
        for j in range(n_hidden):
            h[n, j] = zero
        for i in range(n_in):
            xi = x[n, i]
            for j in range(n_hidden):
                h[n, j] += xi * w1[i, j]
        for j in range(n_hidden):
            v = h[n, j] + b1[j]
            h[n, j] = v if v > zero else zero
        for k in range(n_classes):
            logits[n, k] = zero
        for j in range(n_hidden):
            hj = h[n, j]
            for k in range(n_classes):
                logits[n, k] += hj * w2[j, k]
        for k in range(n_classes):
            logits[n, k] += b2[k]


@numba.jit(**_JIT)
def _backward_and_step(x, y, h, logits, w2, flat, grad, gw1, gb1, gw2, gb2, dlogits, dh, lr, mean):
    """Mean cross-entropy of the batch, its gradients into `grad` (the flat gradient buffer, viewed as gw1,
    gb1, gw2, gb2): of the batch mean when `mean`, else of the batch sum; then flat -= lr * grad. Returns the
    mean loss (float64)."""
    batch, n_in = x.shape
    n_hidden = h.shape[1]
    n_classes = logits.shape[1]
    zero = np.float32(0.0)
    one = np.float32(1.0)
    fbatch = np.float32(batch)

    for t in range(grad.size):
        grad[t] = zero

    # softmax + cross-entropy; dlogits = (probs - onehot) / B, or probs - onehot for the batch sum
    loss = 0.0
    for n in range(batch):
        m = logits[n, 0]
        for k in range(1, n_classes):
            if logits[n, k] > m:
                m = logits[n, k]
        total = zero
        for k in range(n_classes):
            e = np.exp(logits[n, k] - m)
            dlogits[n, k] = e
            total += e
        for k in range(n_classes):
            dlogits[n, k] = dlogits[n, k] / total
        label = y[n]
        loss += np.float64(np.log(total)) - np.float64(logits[n, label] - m)
        dlogits[n, label] -= one
        if mean:
            for k in range(n_classes):
                dlogits[n, k] = dlogits[n, k] / fbatch

    # output layer: gw2 = h^T dlogits, gb2 = sum_n dlogits
    for n in range(batch):
        for j in range(n_hidden):
            hj = h[n, j]
            for k in range(n_classes):
                gw2[j, k] += hj * dlogits[n, k]
        for k in range(n_classes):
            gb2[k] += dlogits[n, k]

    # back through W2 (before it is updated) and the ReLU: dh = (dlogits W2^T) * (h > 0)
    for n in range(batch):
        for j in range(n_hidden):
            if h[n, j] > zero:
                acc = zero
                for k in range(n_classes):
                    acc += dlogits[n, k] * w2[j, k]
                dh[n, j] = acc
            else:
                dh[n, j] = zero

    # hidden layer: gw1 = x^T dh, gb1 = sum_n dh
    for n in range(batch):
        for i in range(n_in):
            xi = x[n, i]
            for j in range(n_hidden):
                gw1[i, j] += xi * dh[n, j]
        for j in range(n_hidden):
            gb1[j] += dh[n, j]

    # SGD over the whole flat buffer
    for t in range(flat.size):
        flat[t] -= lr * grad[t]

    return loss / batch


class SerialMLP:
    """The serial baseline of `mlp(in_features, hidden, classes)`, operating in place on `flat_params`
    (1-D float32, C-contiguous, the layout of `mlp()`'s `flat`; NOT copied: pass `model.flat.copy()` to
    keep the NumPy model unchanged). `reduction` (gpunn.nn.functional.REDUCTIONS): the gradient of the batch
    mean (default) or of the batch sum of the per-sample losses."""

    def __init__(self, flat_params: np.ndarray, in_features: int, hidden: int, classes: int,
                 reduction: str = DEFAULT_REDUCTION):
        self.mean_over_batch = check_reduction("SerialMLP", reduction) == "mean"
        self.in_features, self.hidden, self.classes = int(in_features), int(hidden), int(classes)
        if min(self.in_features, self.hidden, self.classes) < 1:
            raise ValueError(f"SerialMLP: sizes must be positive, got {in_features}, {hidden}, {classes}")
        expected = mlp_num_parameters(self.in_features, self.hidden, self.classes)
        if not isinstance(flat_params, np.ndarray) or flat_params.dtype != np.float32 or flat_params.ndim != 1:
            raise ValueError("SerialMLP: flat_params must be a 1-D float32 ndarray")
        if not flat_params.flags.c_contiguous or not flat_params.flags.writeable:
            raise ValueError("SerialMLP: flat_params must be C-contiguous and writeable (it is updated in place)")
        if flat_params.size != expected:
            raise ValueError(
                f"SerialMLP: flat_params has {flat_params.size} values, an MLP "
                f"{in_features}-{hidden}-{classes} has {expected}"
            )
        self.flat = flat_params
        self.grad = np.zeros_like(flat_params)
        ni, nh, nc = self.in_features, self.hidden, self.classes
        self.w1, self.b1, self.w2, self.b2 = self._views(self.flat, ni, nh, nc)
        self.gw1, self.gb1, self.gw2, self.gb2 = self._views(self.grad, ni, nh, nc)
        self._capacity = 0
        self._ensure_capacity(64)
        self._x: np.ndarray | None = None
        self._batch = 0

    @staticmethod
    def _views(buf, ni, nh, nc):
        o1 = ni * nh
        o2 = o1 + nh
        o3 = o2 + nh * nc
        return buf[:o1].reshape(ni, nh), buf[o1:o2], buf[o2:o3].reshape(nh, nc), buf[o3 : o3 + nc]

    def _ensure_capacity(self, batch: int) -> None:
        if batch > self._capacity:
            self._capacity = batch
            self._h = np.zeros((batch, self.hidden), np.float32)
            self._logits = np.zeros((batch, self.classes), np.float32)
            self._dlogits = np.zeros((batch, self.classes), np.float32)
            self._dh = np.zeros((batch, self.hidden), np.float32)

    def forward(self, xb: np.ndarray) -> np.ndarray:
        """Logits (B, classes) of a float32 batch (B, in_features); keeps the activations for
        `backward_and_step`. The returned array is an internal buffer, overwritten by the next call."""
        xb = np.ascontiguousarray(xb, dtype=np.float32)
        if xb.ndim != 2 or xb.shape[1] != self.in_features or xb.shape[0] == 0:
            raise ValueError(f"SerialMLP.forward: xb must have shape (B >= 1, {self.in_features}), got {xb.shape}")
        batch = xb.shape[0]
        self._ensure_capacity(batch)
        logits = self._logits[:batch]
        _forward(xb, self.w1, self.b1, self.w2, self.b2, self._h[:batch], logits)
        self._x, self._batch = xb, batch
        return logits

    def backward_and_step(self, yb: np.ndarray, lr: float) -> float:
        """Mean cross-entropy of the last forward's batch against labels yb; its gradients (batch mean or sum,
        the constructor's `reduction`); one SGD step of every parameter (in place on flat). Returns the loss."""
        if self._x is None:
            raise RuntimeError("SerialMLP.backward_and_step called before forward")
        batch = self._batch
        yb = np.ascontiguousarray(yb, dtype=np.int64)
        if yb.shape != (batch,):
            raise ValueError(f"SerialMLP.backward_and_step: labels must have shape ({batch},), got {yb.shape}")
        if yb.min() < 0 or yb.max() >= self.classes:
            raise ValueError(f"SerialMLP.backward_and_step: labels must lie in [0, {self.classes})")
        loss = _backward_and_step(
            self._x, yb, self._h[:batch], self._logits[:batch], self.w2, self.flat, self.grad,
            self.gw1, self.gb1, self.gw2, self.gb2, self._dlogits[:batch], self._dh[:batch], np.float32(lr),
            self.mean_over_batch,
        )  # fmt: skip
        self._x = None  # the activations no longer match the updated parameters
        return float(loss)

    def predict_logits(self, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """Logits of every row of x, computed batch_size rows at a time (a new array)."""
        x = np.asarray(x)
        x = x.reshape(x.shape[0], -1) if x.ndim > 2 else x
        if x.ndim != 2 or x.shape[1] != self.in_features or x.shape[0] == 0:
            raise ValueError(f"SerialMLP.predict_logits: x must have shape (N >= 1, {self.in_features}), got {x.shape}")
        if batch_size < 1:
            raise ValueError(f"SerialMLP.predict_logits: batch_size must be positive, got {batch_size}")
        out = np.empty((x.shape[0], self.classes), np.float32)
        for start in range(0, x.shape[0], batch_size):
            stop = min(start + batch_size, x.shape[0])
            out[start:stop] = self.forward(x[start:stop])
        self._x = None
        return out
