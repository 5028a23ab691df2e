"""The float64 NumPy reference every GEMM version is validated against."""

from __future__ import annotations

import numpy as np

__all__ = ["INPUT_FORMATS", "gemm_reference", "round_inputs"]

INPUT_FORMATS = ("fp32", "tf32", "bf16")  # what a version's inputs are rounded to before they are multiplied


def round_inputs(x, inputs="fp32"):
    """A host array as a version with that input format multiplies it: as it is (fp32), or rounded to TF32 or BF16
    (gpunn.kernels.mma's roundings, those of the device's conversions)."""
    if inputs == "fp32":
        return x
    if inputs not in INPUT_FORMATS:
        raise ValueError(f"unknown input format {inputs!r}; choose from {INPUT_FORMATS}")
    from ..mma import round_bf16, round_tf32

    return (round_tf32 if inputs == "tf32" else round_bf16)(np.asarray(x, dtype=np.float32))


def gemm_reference(a, b, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None, inputs="fp32"):
    """``op(A) @ op(B)`` (+ bias) (ReLU) or masked by ``relu_mask > 0``, in float64 NumPy (host arrays); with
    ``inputs`` "tf32" or "bf16", A and B rounded to that format first, as a tensor-core version rounds them."""
    a64 = np.asarray(round_inputs(a, inputs), dtype=np.float64)
    b64 = np.asarray(round_inputs(b, inputs), dtype=np.float64)
    c = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    if bias is not None:
        c = c + np.asarray(bias, dtype=np.float64)[None, :]
    if relu:
        c = np.maximum(c, 0.0)
    if relu_mask is not None:
        c = np.where(np.asarray(relu_mask) > 0, c, 0.0)
    return c
