"""The MSE loss head of the autoencoder: per-sample losses and the gradient of the batch-mean loss, fused.

For pred and target (B, ...) with F elements per sample (C*H*W for images):

    1 mse_loss_grad  one block per sample, `block` threads (a power of two) striding over its F elements:
                     dpred = 2 * (pred - target) / (B * F), and the sample's loss, the mean of its F squared
                     errors, reduced by a fixed-order shared-memory tree (bitwise deterministic) into
                     losses[r]. The mean of the B losses is gpunn.nn.functional.mse_forward's loss (the mean
                     over all B*F elements), and dpred is exactly its gradient (mse_backward); the batch
                     mean of the losses is softmax.loss_mean's job, as for cross-entropy.

Like softmax.softmax_ce_grad, losses may be an epoch-long buffer written at a step read from a device counter
(see the launcher), so one bound launch (or a captured CUDA graph) serves a whole device-resident epoch.
pred, target and dpred may have any trailing shape (read as (B, F) views); target may be the network's input
(an autoencoder reconstructs its input), and dpred may be pred itself (each element is read before the same
thread overwrites it). The float64 NumPy reference is ``mse_loss_grad_ref``; ``OPS`` maps names to launchers.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from gpunn.nn import functional as F

from .jit import jit
from .launch import Launch, bind, check_block, check_device_array
from .softmax import _block_sum, epoch_losses_args

__all__ = ["OPS", "mse_loss_grad", "mse_loss_grad_ref"]


# --------------------------------------------------------------------------------------------- kernels
@functools.cache
def _mse_kernel(block: int):
    block_sum = _block_sum(block)

    @jit
    def mse_loss_grad_kernel(pred, target, dpred, losses, counter, stride):
        buf = cuda.shared.array(block, float32)
        rows = pred.shape[0]
        cols = pred.shape[1]
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        # the reference's scale: 2 / numel of the whole batch (a partial last batch has fewer rows)
        scale = float32(2.0) / float32(rows * cols)
        acc = float32(0.0)
        for j in range(t, cols, block):
            d = pred[row, j] - target[row, j]
            acc += d * d
            dpred[row, j] = d * scale
        buf[t] = acc
        total = block_sum(buf, t)
        if t == 0:
            # losses may be an epoch-long buffer: this batch's rows start at step * stride (see launcher)
            at = (counter[0] * stride) % losses.shape[0] + row
            losses[at] = total / float32(cols)

    return mse_loss_grad_kernel


# --------------------------------------------------------------------------------------------- launchers
def _rows(op: str, name: str, a):
    """a (B, ...) as a (B, F) view; host arrays refused (numba would copy them at every launch)."""
    check_device_array(op, name, a)
    if len(a.shape) < 2:
        raise ValueError(f"{op}: {name} must be (B, ...) with at least 2 dimensions, got shape {tuple(a.shape)}")
    if len(a.shape) == 2:
        return a  # 2-D strided views are read as they are
    if not a.is_c_contiguous():
        raise ValueError(f"{op}: {name} {tuple(a.shape)} must be C-contiguous to be read as (B, F) rows")
    return a.reshape(a.shape[0], math.prod(a.shape[1:]))


def mse_loss_grad(pred, target, dpred, losses, block: int = 256, stream=0, launch: bool = True, counter=None,
                  stride: int = 0) -> Launch:
    """dpred = 2 (pred - target) / pred.size and per-sample losses = mean over each sample's elements of
    (pred - target)^2, in one launch (one block per sample).

    By default losses is (B,). For training loops that keep the whole epoch on the device, losses may be an
    epoch-long (N,) buffer, `counter` a (1,) int32 device array holding the step number and `stride` the full
    batch size: row r's loss goes to losses[(counter[0] * stride) % N + r], read on the device at run time, so
    one bound launch (or a captured graph) serves every step of the epoch (softmax.softmax_ce_grad's
    convention).
    """
    op = "mse_loss_grad"
    block = check_block(op, block, power_of_two=True)
    pred2, target2, dpred2 = (_rows(op, name, a) for name, a in (("pred", pred), ("target", target),
                                                                  ("dpred", dpred)))
    check_device_array(op, "losses", losses, 1)
    rows = pred2.shape[0]
    counter, stride = epoch_losses_args(op, losses, counter, stride, rows)
    epoch_buffer = stride != 0
    if (tuple(target.shape) != tuple(pred.shape) or tuple(dpred.shape) != tuple(pred.shape)
            or (not epoch_buffer and tuple(losses.shape) != (rows,))):
        raise ValueError(
            f"{op}: shapes do not fit pred {tuple(pred.shape)}, target {tuple(target.shape)}, dpred "
            f"{tuple(dpred.shape)}, losses {tuple(losses.shape)} (need pred, target and dpred of one shape (B, ...), "
            "losses (B,))"
        )
    args = (pred2, target2, dpred2, losses, counter, np.int32(stride))
    return bind(_mse_kernel(block), rows, block, args, stream, launch, op)


OPS = {"mse_loss_grad": mse_loss_grad}


# --------------------------------------------------------------------------------------------- reference
def mse_loss_grad_ref(pred, target):
    """(dpred, per-sample losses (B,)) in float64: dpred = gpunn.nn.functional.mse_backward's formula, and the
    losses' mean = mse_forward's loss."""
    pred = np.asarray(pred, np.float64)
    target = np.asarray(target, np.float64)
    d = pred - target
    losses = (d * d).reshape(d.shape[0], -1).mean(axis=1)
    return F.mse_backward(pred, target), losses
