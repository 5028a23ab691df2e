"""A classifier's last Linear layer fused with its softmax cross-entropy head: two plain launches a step.

    head_forward   one block per batch row r: logits[r] = x[r] W + b (each thread the columns k = t, t + block, ...
                   for every class, K_BATCH of them loaded together, then a fixed-order shared-memory tree over the
                   block), then, as softmax_ce_grad, dlogits[r] = (softmax - onehot(label)) * scale and the row's loss
                   log(sum exp(s)) - s[label] (s = logits - rowmax) into the losses buffer, at the step's position
                   in an epoch-long buffer (counter, stride)
    head_backward  one thread per input feature k, dlogits staged in shared memory ROW_TILE rows at a time:
                   dX[r, k] = sum_c dlogits[r, c] W[k, c] (zeroed where an optional ReLU mask is <= 0),
                   dW[k, c] = sum_r x[r, k] dlogits[r, c] over the rows in order (ROW_BATCH x loads in flight),
                   db[c] = sum_r dlogits[r, c] by block 0's first `classes` threads

No atomics: every output is one thread's fixed-order sum (the logits: one tree), so two runs give the same bits.
Rows and in_features are generic (a last partial batch included; x may be a strided view); the class count is a
compile-time constant (registers and the shared tree), at most MAX_CLASSES. Reference: `head_ref` (float64).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from gpunn.nn.functional import DEFAULT_REDUCTION

from .common import cdiv
from .launch import Launch, bind, check_array, check_block
from .softmax import epoch_losses_args, grad_scale, softmax_ce_grad_ref

__all__ = ["BACKWARD_BLOCK", "FORWARD_BLOCK", "MAX_CLASSES", "head_backward", "head_forward", "head_ref"]

FORWARD_BLOCK = 256   # threads per row of the forward (a power of two: the tree)
BACKWARD_BLOCK = 64   # input features per block of the backward
MAX_CLASSES = 32      # classes per thread in registers, and the forward's (classes, block) shared tree
K_BATCH = 4           # forward: a thread's K columns whose x and W loads are issued together
ROW_TILE = 64         # backward: dlogits rows staged in shared memory per step
ROW_BATCH = 16        # backward: a thread's x (and mask) loads issued together


def _check_classes(op: str, classes: int, block: int) -> int:
    if not 2 <= classes <= MAX_CLASSES:
        raise ValueError(f"{op}: classes must be in [2, {MAX_CLASSES}] (registers and the shared tree), got "
                         f"{classes}; train wider heads with the separate Linear and softmax_ce_grad launches "
                         "(Policy.head 'layers')")
    if block < classes:
        raise ValueError(f"{op}: block must be at least the class count (a thread per class), got block {block} "
                         f"for {classes} classes")
    return classes


# --------------------------------------------------------------------------------------------- kernels
@functools.cache
def _forward_kernel(classes: int, block: int):
    @cuda.jit
    def head_forward_kernel(x, w, b, labels, logits, dlogits, losses, counter, stride, scale):
        buf = cuda.shared.array((classes, block), float32)
        acc = cuda.local.array(classes, float32)
        xv = cuda.local.array(K_BATCH, float32)
        wv = cuda.local.array((K_BATCH, classes), float32)
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        features = x.shape[1]
        for c in range(classes):
            acc[c] = float32(0.0)
        for k0 in range(t, features, block * K_BATCH):
            for u in range(K_BATCH):  # fixed trip count: the batch's loads in flight together
                k = k0 + u * block
                if k < features:
                    xv[u] = x[r, k]
                    for c in range(classes):
                        wv[u, c] = w[k, c]
                else:
                    xv[u] = float32(0.0)
                    for c in range(classes):
                        wv[u, c] = float32(0.0)
            for u in range(K_BATCH):  # added in k order
                for c in range(classes):
                    acc[c] += xv[u] * wv[u, c]
        for c in range(classes):
            buf[c, t] = acc[c]
        width = block // 2
        while width > 0:  # fixed-order tree: buf[c, 0] = the row's logit c without its bias
            cuda.syncthreads()
            if t < width:
                for c in range(classes):
                    buf[c, t] += buf[c, t + width]
            width //= 2
        cuda.syncthreads()
        if t < classes:  # the softmax-CE gradient (as softmax_ce_grad), each of these threads over all classes
            label = labels[r]
            rowmax = float32(-math.inf)
            for c in range(classes):
                rowmax = max(rowmax, buf[c, 0] + b[c])
            total = float32(0.0)
            for c in range(classes):
                total += math.exp(buf[c, 0] + b[c] - rowmax)
            if t == 0:  # losses may be an epoch-long buffer: this batch's rows start at step * stride
                at = (counter[0] * stride) % losses.shape[0] + r
                losses[at] = math.log(total) - (buf[label, 0] + b[label] - rowmax)
            mine = buf[t, 0] + b[t]
            logits[r, t] = mine
            p = math.exp(mine - rowmax) * (float32(1.0) / total)
            if t == label:
                p -= float32(1.0)
            dlogits[r, t] = p * scale

    return head_forward_kernel


@functools.cache
def _backward_kernel(classes: int, block: int, with_dx: bool, with_mask: bool):
    @cuda.jit
    def head_backward_kernel(x, dl, w, dx, mask, dw, db):
        dls = cuda.shared.array((ROW_TILE, classes), float32)
        wk = cuda.local.array(classes, float32)
        acc = cuda.local.array(classes, float32)
        xv = cuda.local.array(ROW_BATCH, float32)
        mv = cuda.local.array(ROW_BATCH, float32)
        t = cuda.threadIdx.x
        k = cuda.blockIdx.x * block + t
        rows, features = x.shape[0], x.shape[1]
        live = k < features
        sums_bias = cuda.blockIdx.x == 0 and t < classes
        for c in range(classes):
            wk[c] = w[k, c] if live and with_dx else float32(0.0)
            acc[c] = float32(0.0)
        bias_acc = float32(0.0)
        for r0 in range(0, rows, ROW_TILE):
            n = min(ROW_TILE, rows - r0)
            cuda.syncthreads()  # the previous tile is read by everyone
            for i in range(t, n * classes, block):
                dls[i // classes, i % classes] = dl[r0 + i // classes, i % classes]
            cuda.syncthreads()
            if sums_bias:
                for i in range(n):
                    bias_acc += dls[i, t]
            if live:
                for i0 in range(0, n, ROW_BATCH):
                    for j in range(ROW_BATCH):  # fixed trip count: the batch's loads in flight together
                        if i0 + j < n:
                            xv[j] = x[r0 + i0 + j, k]
                            if with_mask:
                                mv[j] = mask[r0 + i0 + j, k]
                    for j in range(ROW_BATCH):  # the rows in order
                        if i0 + j < n:
                            g = float32(0.0)
                            for c in range(classes):
                                d = dls[i0 + j, c]
                                acc[c] += xv[j] * d
                                if with_dx:
                                    g += d * wk[c]
                            if with_dx:
                                if with_mask and not mv[j] > 0:
                                    g = float32(0.0)
                                dx[r0 + i0 + j, k] = g
        if live:
            for c in range(classes):
                dw[k, c] = acc[c]
        if sums_bias:
            db[t] = bias_acc

    return head_backward_kernel


# --------------------------------------------------------------------------------------------- launchers
def head_forward(x, w, b, labels, logits, dlogits, losses, block: int = FORWARD_BLOCK, counter=None, stride: int = 0,
                 reduction: str = DEFAULT_REDUCTION, stream=0, launch: bool = True) -> Launch:
    """logits (B, C) = x (B, K) w (K, C) + b (C,), then dlogits (B, C) and the per-row CE losses as
    softmax.softmax_ce_grad (the same `reduction` scaling, and the same epoch-long `losses` with `counter` and
    `stride`); one block of `block` threads (a power of two, at least C) per row."""
    op = "head_forward"
    block = check_block(op, block, power_of_two=True)
    for name, a in (("x", x), ("w", w), ("logits", logits), ("dlogits", dlogits)):
        check_array(op, name, a, 2)
    check_array(op, "b", b, 1)
    check_array(op, "labels", labels, 1, dtype=np.int32)
    check_array(op, "losses", losses, 1)
    rows, features = (int(s) for s in x.shape)
    classes = _check_classes(op, int(w.shape[1]), block)
    counter, stride = epoch_losses_args(op, losses, counter, stride, rows)
    if (tuple(w.shape) != (features, classes) or tuple(b.shape) != (classes,) or tuple(labels.shape) != (rows,)
            or tuple(logits.shape) != (rows, classes) or tuple(dlogits.shape) != (rows, classes)
            or (stride == 0 and tuple(losses.shape) != (rows,))):
        raise ValueError(f"{op}: shapes do not fit x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}, "
                         f"labels {tuple(labels.shape)}, logits {tuple(logits.shape)}, dlogits "
                         f"{tuple(dlogits.shape)}, losses {tuple(losses.shape)} (need x (B, K), w (K, C), b (C,), "
                         "labels and losses (B,), logits and dlogits (B, C))")
    scale = grad_scale(op, reduction, rows)
    return bind(_forward_kernel(classes, block), rows, block,
                (x, w, b, labels, logits, dlogits, losses, counter, np.int32(stride), scale), stream, launch, op)


def head_backward(x, dlogits, w, dx, dw, db, relu_mask=None, block: int = BACKWARD_BLOCK, stream=0,
                  launch: bool = True) -> Launch:
    """dx (B, K) = dlogits (B, C) w^T (zeroed where relu_mask <= 0; dx None: not computed), dw (K, C) = x^T dlogits
    and db (C,) = the column sums of dlogits; one thread per input feature, `block` (at least C) of them per block."""
    op = "head_backward"
    block = check_block(op, block)
    for name, a in (("x", x), ("dlogits", dlogits), ("w", w), ("dw", dw)):
        check_array(op, name, a, 2)
    check_array(op, "db", db, 1)
    rows, features = (int(s) for s in x.shape)
    classes = _check_classes(op, int(w.shape[1]), block)
    if dx is not None:
        check_array(op, "dx", dx, 2)
    if relu_mask is not None:
        if dx is None:
            raise ValueError(f"{op}: relu_mask is the ReLU backward of dx; pass dx with it")
        check_array(op, "relu_mask", relu_mask, 2)
    if (tuple(dlogits.shape) != (rows, classes) or tuple(w.shape) != (features, classes)
            or tuple(dw.shape) != (features, classes) or tuple(db.shape) != (classes,)
            or any(a is not None and tuple(a.shape) != (rows, features) for a in (dx, relu_mask))):
        raise ValueError(f"{op}: shapes do not fit x {tuple(x.shape)}, dlogits {tuple(dlogits.shape)}, w "
                         f"{tuple(w.shape)}, dw {tuple(dw.shape)}, db {tuple(db.shape)} (need x, dx and relu_mask "
                         "(B, K), dlogits (B, C), w and dw (K, C), db (C,))")
    kernel = _backward_kernel(classes, block, dx is not None, relu_mask is not None)
    dx_arg = x if dx is None else dx  # unread placeholders of the absent outputs
    mask_arg = x if relu_mask is None else relu_mask
    return bind(kernel, cdiv(features, block), block, (x, dlogits, w, dx_arg, mask_arg, dw, db), stream, launch, op)


# --------------------------------------------------------------------------------------------- reference
def head_ref(x, w, b, labels, reduction: str = DEFAULT_REDUCTION, relu_mask=None):
    """float64 (logits, dlogits, losses, dx, dw, db) of the fused head; dx zeroed where relu_mask <= 0."""
    x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
    logits = x @ w + b
    dlogits, losses = softmax_ce_grad_ref(logits, labels, reduction)
    dx = dlogits @ w.T
    if relu_mask is not None:
        dx = np.where(np.asarray(relu_mask) > 0, dx, 0.0)
    return logits, dlogits, losses, dx, x.T @ dlogits, dlogits.sum(axis=0)
