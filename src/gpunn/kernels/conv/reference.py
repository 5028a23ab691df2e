"""The float64 NumPy references every convolution version is validated against (host arrays), built on
``gpunn.nn.functional.conv2d_forward`` / ``conv2d_backward`` in float64."""

from __future__ import annotations

import numpy as np

from gpunn.nn import functional as F

__all__ = ["conv_backward_data_ref", "conv_backward_weight_ref", "conv_bias_grad_ref", "conv_forward_ref"]


def conv_forward_ref(x, w, bias=None, padding=0, relu=False) -> np.ndarray:
    """out = conv(x, w) + bias (None: no bias), ReLU if `relu`; float64."""
    x64 = np.asarray(x, np.float64)
    w64 = np.asarray(w, np.float64)
    b64 = np.zeros(w64.shape[0]) if bias is None else np.asarray(bias, np.float64)
    y, _ = F.conv2d_forward(x64, w64, b64, padding)
    return np.maximum(y, 0.0) if relu else y


def conv_backward_data_ref(dy, w, x_shape, padding=0, relu_mask=None) -> np.ndarray:
    """dx (x_shape) of conv(x, w) given dy; zero where relu_mask <= 0 (or NaN) when given; float64."""
    dy64 = np.asarray(dy, np.float64)
    w64 = np.asarray(w, np.float64)
    n, cin, h, wd = x_shape
    # conv2d_backward needs the padded input only for dw, which is discarded here: zeros do
    xp = np.zeros((n, cin, h + 2 * padding, wd + 2 * padding))
    dx, _, _ = F.conv2d_backward(dy64, (xp, w64, padding, tuple(x_shape), None))  # no im2col kept from a forward
    if relu_mask is not None:
        dx = np.where(np.asarray(relu_mask) > 0, dx, 0.0)
    return dx


def conv_backward_weight_ref(x, dy, k, padding=0) -> np.ndarray:
    """dw (Cout, Cin, k, k) of conv(x, w) given dy; float64."""
    x64 = np.asarray(x, np.float64)
    dy64 = np.asarray(dy, np.float64)
    xp = np.pad(x64, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    w_shape = (dy64.shape[1], x64.shape[1], k, k)
    _, dw, _ = F.conv2d_backward(dy64, (xp, np.zeros(w_shape), padding, x64.shape, None))
    return dw


def conv_bias_grad_ref(dy) -> np.ndarray:
    return np.asarray(dy, np.float64).sum(axis=(0, 2, 3))
