"""Launch helpers the GEMM and convolution families share: the fused epilogues, grid arithmetic, fixed-block
checks and shapes as ints."""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpunn import device

__all__ = ["EPILOGUES", "cdiv", "check_fixed_block", "epilogue_args", "epilogue_flags", "shape"]

EPILOGUES = ("none", "bias", "bias_relu", "relu", "mask")

_DUMMY_AUX = None


def epilogue_args(op, bias=None, relu=False, relu_mask=None):
    """The epilogue name and the kernel's ``aux`` argument (bias, mask or a cached 1-element dummy)."""
    global _DUMMY_AUX
    if relu_mask is not None:
        if bias is not None or relu:
            raise ValueError(f"{op}: relu_mask (the ReLU backward) excludes bias and relu")
        return "mask", relu_mask
    if bias is not None:
        return ("bias_relu" if relu else "bias"), bias
    if _DUMMY_AUX is None:
        _DUMMY_AUX = cuda.to_device(np.zeros(1, dtype=np.float32))
    return ("relu" if relu else "none"), _DUMMY_AUX


def epilogue_flags(epilogue):
    """(add bias, ReLU, mask) closure constants of a kernel specialisation."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}; choose from {EPILOGUES}")
    return epilogue in ("bias", "bias_relu"), epilogue in ("bias_relu", "relu"), epilogue == "mask"


def cdiv(x, y):
    return (x + y - 1) // y


def check_fixed_block(op, block, threads, kernel):
    """A version that runs a fixed number of threads: ``block`` must be that total (1-D or 2-D)."""
    dims = (block,) if isinstance(block, (int, np.integer)) else tuple(block)
    if int(np.prod(dims)) != threads:
        raise ValueError(f"{op}: block must be {threads} threads, got {block}")
    device.check_block(op, threads, kernel)


def shape(x) -> tuple:
    """An array's shape as Python ints (for messages and comparisons)."""
    return tuple(int(s) for s in x.shape)
