"""The float64 NumPy reference every GEMM version is validated against."""

from __future__ import annotations

import numpy as np

__all__ = ["INPUT_FORMATS", "gemm_reference", "round_inputs"]

# What a version's inputs are rounded to before they are multiplied; tf32_trunc: float32 bits given to the tensor
# core as they are, which reads their 19 high bits (the low 13 mantissa bits dropped: truncation, toward zero)
INPUT_FORMATS = ("fp32", "tf32", "bf16", "tf32_trunc")


def round_inputs(x, inputs="fp32"):
    """A host array as a version with that input format multiplies it: as it is (fp32), rounded to TF32 or BF16
    (gpunn.kernels.mma's roundings, those of the device's conversions) or truncated to TF32 (tf32_trunc). A uint16
    array holds BF16 bits (``inputs`` "bf16" only): widened to float32 exactly."""
    if inputs not in INPUT_FORMATS:
        raise ValueError(f"unknown input format {inputs!r}; choose from {INPUT_FORMATS}")
    if getattr(x, "dtype", None) == np.uint16:
        if inputs != "bf16":
            raise ValueError(f"a uint16 array holds BF16 bits: inputs must be 'bf16', got {inputs!r}")
        return (np.asarray(x).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if inputs == "fp32":
        return x
    if inputs == "tf32_trunc":
        bits = np.asarray(x, dtype=np.float32).view(np.uint32)
        return np.where(np.isfinite(x), (bits & np.uint32(0xFFFFE000)).view(np.float32), x).astype(np.float32)
    from ..mma import round_bf16, round_tf32

    return (round_tf32 if inputs == "tf32" else round_bf16)(np.asarray(x, dtype=np.float32))


def gemm_reference(a, b, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None, inputs="fp32"):
    """``op(A) @ op(B)`` (+ bias) (ReLU) or masked by ``relu_mask > 0``, in float64 NumPy (host arrays); with
    ``inputs`` "tf32" or "bf16", A and B rounded to that format first, as a tensor-core version rounds them
    (``round_inputs``: "tf32_trunc" truncated; uint16 operands are BF16 bits, widened exactly)."""
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
