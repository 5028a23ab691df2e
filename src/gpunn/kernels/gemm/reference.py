"""The float64 NumPy reference every GEMM version is validated against."""

from __future__ import annotations

import numpy as np

__all__ = ["gemm_reference"]


def gemm_reference(a, b, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None):
    """``op(A) @ op(B)`` (+ bias) (ReLU) or masked by ``relu_mask > 0``, in float64 NumPy (host arrays)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    c = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    if bias is not None:
        c = c + np.asarray(bias, dtype=np.float64)[None, :]
    if relu:
        c = np.maximum(c, 0.0)
    if relu_mask is not None:
        c = np.where(np.asarray(relu_mask) > 0, c, 0.0)
    return c
