"""Plain SGD step over the flat parameter buffer, with the gradient zeroing fused in.

Variant:

    1 sgd_step  one grid-stride launch over the whole flat buffer: flat[i] = flat[i] - float32(lr) * grad[i],
                then grad[i] = 0 (the optimizer's step() and zero_grad() in one pass over memory)

The arithmetic mirrors gpunn.nn.optim.SGD on a ParameterBuffer in float32: the product float32(lr) * grad is
rounded to float32 first, then subtracted. The compiler would otherwise contract a*b+c into one fused
multiply-add (one rounding), so on the GPU the product goes through libdevice's fmul_rn, which is never
contracted; the simulator runs NumPy float32 scalars, which round each operation anyway. The result is
therefore bitwise equal to the CPU optimizer.

References: `sgd_step_ref` (float32, bitwise like the optimizer) and `sgd_step_ref64` (float64).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import config, cuda, float32

from .jit import jit
from .launch import Launch, bind, check_array, check_block, flat, grid_for

__all__ = ["OPS", "sgd_step", "sgd_step_ref", "sgd_step_ref64"]

if config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def _mul_rn(a, b):  # NumPy float32 scalars: rounded to float32, never fused
        return a * b

else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    _mul_rn = libdevice.fmul_rn

mul_rn = _mul_rn  # float32 a * b rounded on its own, never contracted (also the fused updates of mlp_step)


@jit
def _sgd_kernel(data, grad, lr, n, counter):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        data[i] = data[i] - _mul_rn(lr, grad[i])
        grad[i] = float32(0.0)
    if start == 0:  # the step is done: advance the device-side step counter (nothing else reads it here)
        counter[0] += 1


def sgd_step(flat_params, grad, lr: float, block: int = 256, stream=0, launch: bool = True, counter=None) -> Launch:
    """flat_params -= float32(lr) * grad; grad = 0. Both are float32 device arrays of the same shape.

    As the last kernel of a training step it also adds 1 to `counter` (a (1,) int32 device array), the step
    number that device-resident training steps read their batch position from (gather_rows,
    softmax_ce_grad); without one, a private scratch counter is advanced."""
    op = "sgd_step"
    block = check_block(op, block)
    check_array(op, "flat", flat_params)
    check_array(op, "grad", grad)
    if tuple(flat_params.shape) != tuple(grad.shape):
        raise ValueError(
            f"{op}: flat {tuple(flat_params.shape)} and grad {tuple(grad.shape)} must have the same shape"
        )
    lr = float(lr)
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"{op}: lr must be a positive finite number, got {lr!r}")
    if counter is None:
        counter = _scratch_counter()
    check_array(op, "counter", counter, 1, dtype=np.int32)
    n = flat_params.size
    args = (flat(flat_params), flat(grad), np.float32(lr), n, counter)
    return bind(_sgd_kernel, grid_for(n, block), block, args, stream, launch, op)


@functools.cache
def _scratch_counter():
    return cuda.to_device(np.zeros(1, dtype=np.int32))


OPS = {"sgd_step": sgd_step}


# --------------------------------------------------------------------------------------------- references
def sgd_step_ref(data, grad, lr: float) -> np.ndarray:
    """New parameters in float32, exactly as gpunn.nn.optim.SGD computes them."""
    data = np.asarray(data, np.float32)
    return data - np.float32(lr) * np.asarray(grad, np.float32)


def sgd_step_ref64(data, grad, lr: float) -> np.ndarray:
    return np.asarray(data, np.float64) - float(lr) * np.asarray(grad, np.float64)
