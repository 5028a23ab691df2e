"""Row softmax and the fused softmax + cross-entropy gradient, with the batch-mean (or batch-sum) loss reduction.

Variants (one block per row, `block` threads, block a power of two; rows longer than the block are
covered by strided loops, thread t handling columns t, t + block, ...):

    1 softmax_rows     out = softmax(x) row by row: shared-memory tree reductions for the row max and the
                       row sum of exp(x - max) (stable: the max is subtracted before exp)
    2 softmax_ce_grad  fused softmax + cross-entropy backward for (B, C) logits and int32 labels:
                       dlogits = (softmax - onehot(label)) * scale and per-row loss = logsumexp - logit[label]
                       (computed as log(sum exp(s)) - s[label] with s = logit - rowmax), into a (B,) buffer;
                       scale = 1/B for the gradient of the batch mean, 1 for the batch sum (`reduction`)
      loss_mean        mean of the (B,) per-row losses into a (1,) device array: one block, fixed-order
                       tree reduction, so the result is bitwise deterministic

Shared arrays have a static size, so each kernel is built per block size by a cached factory. The float64
NumPy references (`*_ref`) sit at the bottom; `OPS` maps names to launchers.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from gpunn.nn.functional import DEFAULT_REDUCTION, check_reduction

from .jit import jit
from .launch import Launch, bind, check_array, check_block

__all__ = [
    "OPS",
    "loss_mean",
    "loss_mean_ref",
    "softmax_ce_grad",
    "softmax_ce_grad_ref",
    "softmax_ref",
    "softmax_rows",
]


# --------------------------------------------------------------------------------------------- kernels
@functools.cache
def _block_sum(block: int):
    """Device function: the sum of buf[0:block] (shared, one value per thread), by a fixed-order tree, so the
    result is bitwise deterministic. Every thread of the block must call it."""

    @cuda.jit(device=True)
    def block_sum(buf, t):
        cuda.syncthreads()
        s = block // 2
        while s > 0:
            if t < s:
                buf[t] += buf[t + s]
            cuda.syncthreads()
            s //= 2
        return buf[0]

    return block_sum


@functools.cache
def _row_kernels(block: int):
    """Kernels for one (power-of-two) block size: (softmax_rows, softmax_ce_grad)."""
    block_sum = _block_sum(block)

    @cuda.jit(device=True)
    def row_max_and_sum(x, row, cols, buf):
        """(max_j x[row, j], sum_j exp(x[row, j] - max)) over the row, reduced through `buf` (shared)."""
        t = cuda.threadIdx.x
        m = float32(-math.inf)
        for j in range(t, cols, block):
            v = x[row, j]
            m = max(m, v)
        buf[t] = m
        cuda.syncthreads()
        s = block // 2
        while s > 0:
            if t < s and buf[t + s] > buf[t]:
                buf[t] = buf[t + s]
            cuda.syncthreads()
            s //= 2
        rowmax = buf[0]
        cuda.syncthreads()  # everyone has read buf[0] before it is reused for the sum
        acc = float32(0.0)
        for j in range(t, cols, block):
            acc += math.exp(x[row, j] - rowmax)
        buf[t] = acc
        return rowmax, block_sum(buf, t)

    @jit
    def softmax_rows_kernel(x, out, cols):
        buf = cuda.shared.array(block, float32)
        row = cuda.blockIdx.x
        rowmax, total = row_max_and_sum(x, row, cols, buf)
        inv = float32(1.0) / total
        for j in range(cuda.threadIdx.x, cols, block):
            out[row, j] = math.exp(x[row, j] - rowmax) * inv

    @jit
    def softmax_ce_grad_kernel(logits, labels, dlogits, losses, counter, stride, scale):
        buf = cuda.shared.array(block, float32)
        cols = logits.shape[1]
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        rowmax, total = row_max_and_sum(logits, row, cols, buf)
        label = labels[row]
        if t == 0:
            # losses may be an epoch-long buffer: this batch's rows start at step * stride (see launcher)
            at = (counter[0] * stride) % losses.shape[0] + row
            losses[at] = math.log(total) - (logits[row, label] - rowmax)
        inv_total = float32(1.0) / total
        for j in range(t, cols, block):
            p = math.exp(logits[row, j] - rowmax) * inv_total
            if j == label:
                p -= float32(1.0)
            dlogits[row, j] = p * scale

    return softmax_rows_kernel, softmax_ce_grad_kernel


@functools.cache
def _loss_mean_kernel(block: int):
    block_sum = _block_sum(block)

    @jit
    def loss_mean_kernel(losses, out, n):
        buf = cuda.shared.array(block, float32)
        t = cuda.threadIdx.x
        acc = float32(0.0)
        for i in range(t, n, block):
            acc += losses[i]
        buf[t] = acc
        total = block_sum(buf, t)
        if t == 0:
            out[0] = total / float32(n)

    return loss_mean_kernel


# --------------------------------------------------------------------------------------------- launchers
def softmax_rows(x, out, block: int = 128, stream=0, launch: bool = True) -> Launch:
    """Variant 1: out (B, C) = row-wise softmax of x (B, C); one block of `block` threads per row."""
    op = "softmax_rows"
    block = check_block(op, block, power_of_two=True)
    check_array(op, "x", x, 2)
    check_array(op, "out", out, 2)
    if tuple(x.shape) != tuple(out.shape):
        raise ValueError(
            f"{op}: x {tuple(x.shape)} and out {tuple(out.shape)} must have the same shape"
        )
    kernel, _ = _row_kernels(block)
    return bind(kernel, x.shape[0], block, (x, out, x.shape[1]), stream, launch, op)


def softmax_ce_grad(
    logits, labels, dlogits, losses, block: int = 128, stream=0, launch: bool = True, counter=None, stride: int = 0,
    reduction: str = DEFAULT_REDUCTION,
) -> Launch:
    """Variant 2: dlogits (B, C) = (softmax(logits) - onehot(labels)) / B, and the per-row CE losses; with
    `reduction="sum"` dlogits = softmax(logits) - onehot(labels), the gradient of the summed losses.

    labels are int32 in [0, C) (not range-checked on the device: an out-of-range label reads out of bounds).
    By default losses is (B,). For training loops that keep the whole epoch on the device, losses may be an
    epoch-long (N,) buffer, `counter` a (1,) int32 device array holding the step number and `stride` the full
    batch size: row r's loss goes to losses[(counter[0] * stride) % N + r], read on the device at run time, so
    one bound launch (or a captured graph) serves every step of the epoch.
    """
    op = "softmax_ce_grad"
    block = check_block(op, block, power_of_two=True)
    check_array(op, "logits", logits, 2)
    check_array(op, "labels", labels, 1, dtype=np.int32)
    check_array(op, "dlogits", dlogits, 2)
    check_array(op, "losses", losses, 1)
    rows, cols = logits.shape
    counter, stride = epoch_losses_args(op, losses, counter, stride, rows)
    epoch_buffer = stride != 0
    if (
        tuple(dlogits.shape) != (rows, cols)
        or tuple(labels.shape) != (rows,)
        or (not epoch_buffer and tuple(losses.shape) != (rows,))
    ):
        raise ValueError(
            f"{op}: shapes do not fit logits {tuple(logits.shape)}, labels {tuple(labels.shape)}, "
            f"dlogits {tuple(dlogits.shape)}, losses {tuple(losses.shape)} "
            "(need logits and dlogits (B, C), labels and losses (B,))"
        )
    _, kernel = _row_kernels(block)
    scale = grad_scale(op, reduction, rows)
    return bind(kernel, rows, block, (logits, labels, dlogits, losses, counter, np.int32(stride), scale), stream,
                launch, op)


def grad_scale(op: str, reduction: str, rows: int) -> np.float32:
    """What a loss head multiplies its per-row gradient by: 1/rows for the batch mean (rounded as the kernel did
    when it divided on the device, float32 1 / float32 rows, so mean runs keep their bits), 1 for the sum."""
    if check_reduction(op, reduction) == "sum":
        return np.float32(1.0)
    return np.float32(1.0) / np.float32(rows)


def epoch_losses_args(op: str, losses, counter, stride: int, rows: int):
    """(counter, stride) of a loss head's launch: with a counter, `losses` is an epoch-long buffer and `stride`
    the full batch size (both checked); without, the batch's own (rows,) buffer, a zero counter and stride 0.
    Shared by the softmax-CE and MSE heads."""
    if counter is None:
        return _zero_counter(), 0
    check_array(op, "counter", counter, 1, dtype=np.int32)
    if int(stride) < rows or losses.shape[0] < rows:
        raise ValueError(
            f"{op}: stride {stride} must be the full batch size (>= {rows} rows) and losses "
            f"{tuple(losses.shape)} an epoch-long buffer of at least {rows} rows"
        )
    return counter, int(stride)


@functools.cache
def _zero_counter():
    """A (1,) int32 device array holding 0: the step counter of one-batch calls."""
    return cuda.to_device(np.zeros(1, dtype=np.int32))


def loss_mean(losses, out, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """out (1,) = mean of losses (B,), one block, deterministic tree reduction."""
    op = "loss_mean"
    block = check_block(op, block, power_of_two=True)
    check_array(op, "losses", losses, 1)
    check_array(op, "out", out, 1)
    if tuple(out.shape) != (1,):
        raise ValueError(
            f"{op}: out must have shape (1,), got {tuple(out.shape)} (losses {tuple(losses.shape)})"
        )
    return bind(_loss_mean_kernel(block), 1, block, (losses, out, losses.shape[0]), stream, launch, op)


OPS = {
    "softmax_rows": softmax_rows,
    "softmax_ce_grad": softmax_ce_grad,
    "loss_mean": loss_mean,
}


# --------------------------------------------------------------------------------------------- references
def softmax_ref(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_ce_grad_ref(logits, labels, reduction: str = DEFAULT_REDUCTION):
    """(dlogits (B, C), per-row losses (B,)) in float64, same formulas as gpunn.nn.functional (dlogits of the batch
    mean, or with `reduction="sum"` of the batch sum)."""
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels).astype(np.intp)
    rows = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1)
    losses = np.log(total) - shifted[np.arange(rows), labels]
    d = e / total[:, None]
    d[np.arange(rows), labels] -= 1.0
    return (d / rows if check_reduction("softmax_ce_grad_ref", reduction) == "mean" else d), losses


def loss_mean_ref(losses) -> np.ndarray:
    return np.asarray([np.asarray(losses, np.float64).mean()])
