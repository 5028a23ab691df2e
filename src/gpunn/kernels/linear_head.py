"""A classifier's last Linear layer fused with its softmax cross-entropy head: two plain launches a step.

    head_forward   one block per batch row r: logits[r] = x[r] W + b, each thread summing every class over the
                   features k = t, t + block, ... (K_BATCH of them loaded together), then a fixed-order shared-memory
                   tree per class over the block; then, as softmax_ce_grad, dlogits[r] = (softmax - onehot(label)) *
                   scale and the row's loss log(sum exp(s)) - s[label] (s = logits - rowmax) into the losses buffer,
                   at the step's position in an epoch-long buffer (counter, stride)
                   with `splits`: blocks of SPLIT_ROWS rows x one K range write partial logits, and the last block
                   of each row tile to arrive (an int32 arrival count: no float atomics) adds them in split order
    head_backward  blocks of K_COLUMNS features x row groups, dlogits staged in shared memory a row tile at a time:
                   dX[r, k] = sum_c dlogits[r, c] W[k, c] (zeroed where an optional ReLU mask is <= 0) by the one
                   thread holding row r of feature k, dW[k, c] = sum_r x[r, k] dlogits[r, c] as each row group's
                   sum over its rows in order, the groups' partials then added in group order; db the same sums
                   for an extra feature of ones (the column k = in_features)

No atomics: every output is a fixed-order sum (per-thread partials combined by a fixed tree or in group order), so
two runs give the same bits.
Rows and in_features are generic (a last partial batch included; x may be a strided view); the class count is a
compile-time constant (registers and the shared tree), at most MAX_CLASSES. Reference: `head_ref` (float64).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32

from gpunn.nn.functional import DEFAULT_REDUCTION

from .common import cdiv
from .jit import jit
from .launch import Launch, bind, check_array, check_block
from .softmax import epoch_losses_args, grad_scale, softmax_ce_grad_ref

__all__ = ["BACKWARD_BLOCK", "FORWARD_BLOCK", "MAX_CLASSES", "head_backward", "head_forward", "head_ref"]

FORWARD_BLOCK = 256   # forward: threads per row (a power of two: the tree)
BACKWARD_BLOCK = 256  # backward: threads per block, K_COLUMNS features x block // K_COLUMNS row groups
MAX_CLASSES = 32      # a compile-time constant: the register arrays and shared buffers are sized by it
K_BATCH = 4           # forward: a thread's features whose x and W loads are issued together
K_COLUMNS = 32        # backward: features per block (a warp's lanes: its x loads and dX stores coalesced)
ROWS_PER_THREAD = 8   # backward: a thread's rows per tile (its x and mask loads issued together)
SPLIT_ROWS = 8        # forward with splits: rows per block (a warp per row; 256 threads)
MAX_PARTIALS = 8192   # block x classes at most: the forward's tree, the backward's dW partials (32 KiB shared)


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
    """Thread t sums every class over the features k = t, t + block, ... (its x loads coalesced, its W rows
    whole), then one fixed-order tree per class over the block."""

    @jit
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
def _split_forward_kernel(classes: int, splits: int):
    """The forward over a (splits, row tiles) grid: block (s, tile) sums K range s of SPLIT_ROWS rows (a warp per
    row, each lane every class over k = lo + lane, lo + lane + 32, ..., then a tree over the lanes) into
    part[s, r, :]; the last block of a row tile to arrive (an int32 arrival count per tile, after a threadfence)
    adds the partials in split order and does the softmax-CE part, then zeroes its count for the next launch."""
    block = SPLIT_ROWS * 32

    @jit
    def split_forward_kernel(x, w, b, labels, logits, dlogits, losses, counter, stride, scale, part, arrivals):
        buf = cuda.shared.array((classes, block), float32)
        lg = cuda.shared.array((SPLIT_ROWS, classes), float32)
        last = cuda.shared.array(1, int32)
        acc = cuda.local.array(classes, float32)
        xv = cuda.local.array(K_BATCH, float32)
        wv = cuda.local.array((K_BATCH, classes), float32)
        s = cuda.blockIdx.x
        tile = cuda.blockIdx.y
        t = cuda.threadIdx.x
        i = t // 32
        lane = t - i * 32
        r = tile * SPLIT_ROWS + i
        rows, features = x.shape[0], x.shape[1]
        chunk = (features + splits - 1) // splits
        lo = s * chunk
        hi = min(lo + chunk, features)
        for c in range(classes):
            acc[c] = float32(0.0)
        if r < rows:
            for k0 in range(lo + lane, hi, 32 * K_BATCH):
                for u in range(K_BATCH):  # fixed trip count: the batch's loads in flight together
                    k = k0 + u * 32
                    xv[u] = x[r, k] if k < hi else float32(0.0)
                    for c in range(classes):
                        wv[u, c] = w[k, c] if k < hi else float32(0.0)
                for u in range(K_BATCH):  # added in k order
                    for c in range(classes):
                        acc[c] += xv[u] * wv[u, c]
        for c in range(classes):
            buf[c, t] = acc[c]
        width = 16
        while width > 0:  # fixed-order tree over each row's lanes
            cuda.syncthreads()
            if lane < width:
                for c in range(classes):
                    buf[c, t] += buf[c, t + width]
            width //= 2
        cuda.syncthreads()
        if lane < classes and r < rows:
            part[s, r, lane] = buf[lane, i * 32]
        cuda.threadfence()  # this block's partials visible to the tile's last block before it counts this one
        cuda.syncthreads()
        if t == 0:
            last[0] = 1 if cuda.atomic.add(arrivals, tile, 1) == splits - 1 else 0
        cuda.syncthreads()
        if last[0] == 1:  # every split of this row tile has written its partials
            if lane < classes and r < rows:
                v = part[0, r, lane]
                for q in range(1, splits):  # in split order
                    v += part[q, r, lane]
                lg[i, lane] = v + b[lane]
            cuda.syncthreads()
            if lane < classes and r < rows:  # the softmax-CE gradient, as the row version's
                label = labels[r]
                rowmax = float32(-math.inf)
                for c in range(classes):
                    rowmax = max(rowmax, lg[i, c])
                total = float32(0.0)
                for c in range(classes):
                    total += math.exp(lg[i, c] - rowmax)
                if lane == 0:
                    at = (counter[0] * stride) % losses.shape[0] + r
                    losses[at] = math.log(total) - (lg[i, label] - rowmax)
                mine = lg[i, lane]
                logits[r, lane] = mine
                p = math.exp(mine - rowmax) * (float32(1.0) / total)
                if lane == label:
                    p -= float32(1.0)
                dlogits[r, lane] = p * scale
            if t == 0:
                arrivals[tile] = 0  # ready for the next launch (a replayed graph's included)

    return split_forward_kernel


@functools.cache
def _backward_kernel(classes: int, block: int, with_dx: bool, with_mask: bool):
    """Thread t = g * K_COLUMNS + j: feature k = block start + j, rows g * ROWS_PER_THREAD + i of each row tile;
    the column k = in_features is the bias (x = 1: its "dW" is db). The row groups' dW partials are added in group
    order through shared memory, each output by one thread (consecutive threads, consecutive dW elements)."""
    row_groups = block // K_COLUMNS
    tile = row_groups * ROWS_PER_THREAD
    span = K_COLUMNS * classes

    @jit
    def head_backward_kernel(x, dl, w, dx, mask, dw, db):
        dls = cuda.shared.array((tile, classes), float32)
        wsh = cuda.shared.array(span, float32)
        part = cuda.shared.array((row_groups, span), float32)
        wk = cuda.local.array(classes, float32)
        acc = cuda.local.array(classes, float32)
        xv = cuda.local.array(ROWS_PER_THREAD, float32)
        mv = cuda.local.array(ROWS_PER_THREAD, float32)
        t = cuda.threadIdx.x
        g = t // K_COLUMNS
        j = t - g * K_COLUMNS
        base = cuda.blockIdx.x * K_COLUMNS
        k = base + j
        rows, features = x.shape[0], x.shape[1]
        live = k < features
        bias_column = k == features
        if with_dx:
            for f in range(t, span, block):  # the block's W rows, coalesced
                kf = base + f // classes
                wsh[f] = w[kf, f % classes] if kf < features else float32(0.0)
            cuda.syncthreads()
            for c in range(classes):
                wk[c] = wsh[j * classes + c]
        for c in range(classes):
            acc[c] = float32(0.0)
        for r0 in range(0, rows, tile):
            first = r0 + g * ROWS_PER_THREAD
            for i in range(ROWS_PER_THREAD):  # the thread's x (and mask) loads first, in flight over the staging
                r = first + i
                xv[i] = x[r, k] if live and r < rows else float32(1.0)
                if with_mask:
                    mv[i] = mask[r, k] if live and r < rows else float32(0.0)
            n = min(tile, rows - r0)
            cuda.syncthreads()  # the previous tile is read by everyone
            for f in range(t, n * classes, block):
                dls[f // classes, f % classes] = dl[r0 + f // classes, f % classes]
            cuda.syncthreads()
            if live or bias_column:
                for i in range(ROWS_PER_THREAD):  # the rows in order
                    r = first + i
                    if r < rows:
                        gsum = float32(0.0)
                        for c in range(classes):
                            d = dls[g * ROWS_PER_THREAD + i, c]
                            acc[c] += xv[i] * d
                            if with_dx:
                                gsum += d * wk[c]
                        if with_dx and live:
                            if with_mask and not mv[i] > 0:
                                gsum = float32(0.0)
                            dx[r, k] = gsum
        for c in range(classes):
            part[g, j * classes + c] = acc[c]
        cuda.syncthreads()
        for f in range(t, span, block):  # the row groups' partials in group order
            total = part[0, f]
            for h in range(1, row_groups):
                total += part[h, f]
            kf = base + f // classes
            if kf < features:
                dw[kf, f % classes] = total
            elif kf == features:
                db[f % classes] = total

    return head_backward_kernel


# --------------------------------------------------------------------------------------------- launchers
def head_forward(x, w, b, labels, logits, dlogits, losses, block: int = FORWARD_BLOCK, counter=None, stride: int = 0,
                 reduction: str = DEFAULT_REDUCTION, splits: int = 1, stream=0, launch: bool = True) -> Launch:
    """logits (B, C) = x (B, K) w (K, C) + b (C,), then dlogits (B, C) and the per-row CE losses as
    softmax.softmax_ce_grad (the same `reduction` scaling, and the same epoch-long `losses` with `counter` and
    `stride`); one block of `block` threads (a power of two, at least C) per row. With `splits` > 1 (at most K):
    the split version, K cut into that many ranges, blocks of SPLIT_ROWS rows x one range (`block` unused), its
    partials and arrival counts allocated here."""
    op = "head_forward"
    block = check_block(op, block, power_of_two=True)
    for name, a in (("x", x), ("w", w), ("logits", logits), ("dlogits", dlogits)):
        check_array(op, name, a, 2)
    check_array(op, "b", b, 1)
    check_array(op, "labels", labels, 1, dtype=np.int32)
    check_array(op, "losses", losses, 1)
    rows, features = (int(s) for s in x.shape)
    classes = _check_classes(op, int(w.shape[1]), block)
    if block * classes > MAX_PARTIALS:
        raise ValueError(f"{op}: block x classes must be at most {MAX_PARTIALS} (the tree's shared buffer), got block "
                         f"{block} for {classes} classes")
    counter, stride = epoch_losses_args(op, losses, counter, stride, rows)
    if (tuple(w.shape) != (features, classes) or tuple(b.shape) != (classes,) or tuple(labels.shape) != (rows,)
            or tuple(logits.shape) != (rows, classes) or tuple(dlogits.shape) != (rows, classes)
            or (stride == 0 and tuple(losses.shape) != (rows,))):
        raise ValueError(f"{op}: shapes do not fit x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}, "
                         f"labels {tuple(labels.shape)}, logits {tuple(logits.shape)}, dlogits "
                         f"{tuple(dlogits.shape)}, losses {tuple(losses.shape)} (need x (B, K), w (K, C), b (C,), "
                         "labels and losses (B,), logits and dlogits (B, C))")
    scale = grad_scale(op, reduction, rows)
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or not 1 <= splits <= features:
        raise ValueError(f"{op}: splits must be an int in [1, in_features = {features}], got {splits!r}")
    if splits > 1:
        tiles = cdiv(rows, SPLIT_ROWS)
        part = cuda.device_array((int(splits), rows, classes), np.float32)
        arrivals = cuda.to_device(np.zeros(tiles, np.int32))  # zeroed again by each launch's last blocks
        return bind(_split_forward_kernel(classes, int(splits)), (int(splits), tiles), SPLIT_ROWS * 32,
                    (x, w, b, labels, logits, dlogits, losses, counter, np.int32(stride), scale, part, arrivals),
                    stream, launch, op)
    return bind(_forward_kernel(classes, block), rows, block,
                (x, w, b, labels, logits, dlogits, losses, counter, np.int32(stride), scale), stream, launch, op)


def head_backward(x, dlogits, w, dx, dw, db, relu_mask=None, block: int = BACKWARD_BLOCK, stream=0,
                  launch: bool = True) -> Launch:
    """dx (B, K) = dlogits (B, C) w^T (zeroed where relu_mask <= 0; dx None: not computed), dw (K, C) = x^T dlogits
    and db (C,) = the column sums of dlogits; blocks of `block` threads (a multiple of K_COLUMNS), each K_COLUMNS
    features (the bias one more) over block // K_COLUMNS row groups."""
    op = "head_backward"
    block = check_block(op, block)
    for name, a in (("x", x), ("dlogits", dlogits), ("w", w), ("dw", dw)):
        check_array(op, name, a, 2)
    check_array(op, "db", db, 1)
    rows, features = (int(s) for s in x.shape)
    classes = _check_classes(op, int(w.shape[1]), block)
    if block % K_COLUMNS or block * classes > MAX_PARTIALS:
        raise ValueError(f"{op}: block must be a multiple of {K_COLUMNS} (a warp per row group) with block x classes "
                         f"<= {MAX_PARTIALS} (the groups' dW partials in shared memory), got {block} for {classes} "
                         "classes")
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
    return bind(kernel, cdiv(features + 1, K_COLUMNS), block, (x, dlogits, w, dx_arg, mask_arg, dw, db), stream,
                launch, op)


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
