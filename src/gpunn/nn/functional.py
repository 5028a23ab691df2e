"""Pure NumPy forward/backward references of every op the models use.

These are the ground truth the GPU kernels are validated against, op by op. Conventions:

* Layout is NCHW for images and (N, features) for dense data; `N` is the batch.
* Dtype-preserving: float32 in -> float32 out, float64 in -> float64 out. The float inputs of one call must
  share a dtype (a mismatch raises instead of silently promoting to float64).
* No hidden state: whatever backward needs is returned by forward (a `cache`, an `argmax`) or passed again.
* Losses are means (over the batch for cross-entropy, over all elements for MSE), so their gradients and
  every parameter gradient derived from them are batch means. The cross-entropy gradient can instead be the
  batch SUM (`reduction="sum"`, REDUCTIONS): the reported loss stays the per-sample mean, only the gradient
  drops its 1/N (a step N times larger at the same lr; what paper 000's CPU numbers look like).
* Bad shapes (wrong rank, mismatched sizes, zero-sized dimensions) raise `ValueError` naming the op and
  the shapes.
"""

from __future__ import annotations

import numpy as np

from .sample_threads import BLOCK_ELEMENTS, over_samples

__all__ = [
    "linear_forward",
    "linear_backward",
    "relu_forward",
    "relu_backward",
    "softmax",
    "softmax_cross_entropy",
    "softmax_cross_entropy_backward",
    "REDUCTIONS",
    "DEFAULT_REDUCTION",
    "check_reduction",
    "conv2d_output_size",
    "conv2d_forward",
    "conv2d_backward",
    "maxpool2x2_forward",
    "maxpool2x2_backward",
    "upsample2x_forward",
    "upsample2x_backward",
    "mse_forward",
    "mse_backward",
]


# How a loss's gradient combines the samples of a batch: "mean" divides by the batch size (the default, what
# every variant did first), "sum" does not. The run setting RunSpec.reduction (`_rsum`) and the config's
# experiments.e1.reductions take these values.
REDUCTIONS = ("mean", "sum")
DEFAULT_REDUCTION = "mean"


# --------------------------------------------------------------------------------------------- checks
def check_reduction(op: str, reduction) -> str:
    """`reduction`, or a ValueError naming `op` when it is not one of REDUCTIONS."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    return reduction


def _float_array(op: str, name: str, a, ndim: int | None = None) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise ValueError(f"{op}: {name} must be a float array, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{op}: {name} has a zero-sized dimension, shape {a.shape}")
    return a


def _same_dtype(op: str, **arrays: np.ndarray) -> None:
    dtypes = {name: a.dtype for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} {dt}" for name, dt in dtypes.items())
        raise ValueError(f"{op}: float inputs must share one dtype, got {listed}")


def _labels(op: str, labels, n: int, classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise ValueError(f"{op}: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"{op}: labels must have shape ({n},) to match the batch, got {labels.shape}")
    if labels.min() < 0 or labels.max() >= classes:
        raise ValueError(
            f"{op}: labels must lie in [0, {classes}), got min {labels.min()} max {labels.max()}"
        )
    return labels.astype(np.intp, copy=False)


# --------------------------------------------------------------------------------------------- linear
def linear_forward(x, w, b) -> np.ndarray:
    """y = x @ w + b with x (N, in), w (in, out), b (out,) -> y (N, out)."""
    op = "linear_forward"
    x = _float_array(op, "x", x, 2)
    w = _float_array(op, "w", w, 2)
    b = _float_array(op, "b", b, 1)
    _same_dtype(op, x=x, w=w, b=b)
    if x.shape[1] != w.shape[0] or b.shape[0] != w.shape[1]:
        raise ValueError(
            f"{op}: shapes do not fit x {x.shape} @ w {w.shape} + b {b.shape} (need x (N, in), w (in, out), b (out,))"
        )
    return x @ w + b


def linear_backward(x, w, dy):
    """Gradients of y = x @ w + b: dx = dy @ w.T (N, in), dw = x.T @ dy (in, out), db = sum_n dy (out,)."""
    op = "linear_backward"
    x = _float_array(op, "x", x, 2)
    w = _float_array(op, "w", w, 2)
    dy = _float_array(op, "dy", dy, 2)
    _same_dtype(op, x=x, w=w, dy=dy)
    if x.shape[1] != w.shape[0] or dy.shape != (x.shape[0], w.shape[1]):
        raise ValueError(f"{op}: shapes do not fit x {x.shape}, w {w.shape}, dy {dy.shape}")
    return dy @ w.T, x.T @ dy, dy.sum(axis=0)


# --------------------------------------------------------------------------------------------- relu
def relu_forward(x) -> np.ndarray:
    x = _float_array("relu_forward", "x", x)
    if x.ndim < 2:
        return np.maximum(x, x.dtype.type(0))
    y = np.empty(x.shape, dtype=x.dtype)
    over_samples(len(x), x.size, lambda s, e: np.maximum(x[s:e], x.dtype.type(0), out=y[s:e]))
    return y


def relu_backward(x, dy) -> np.ndarray:
    """dx = dy where x > 0, else 0 (the derivative at exactly 0 is taken as 0)."""
    op = "relu_backward"
    x = _float_array(op, "x", x)
    dy = _float_array(op, "dy", dy)
    _same_dtype(op, x=x, dy=dy)
    if x.shape != dy.shape:
        raise ValueError(f"{op}: x {x.shape} and dy {dy.shape} must have the same shape")
    # (a multiply by the mask is much faster than np.where; gives -0.0 for dy < 0)
    if x.ndim < 2:
        return dy * (x > 0)
    dx = np.empty(x.shape, dtype=dy.dtype)
    over_samples(len(x), x.size, lambda s, e: np.multiply(dy[s:e], x[s:e] > 0, out=dx[s:e]), BLOCK_ELEMENTS)
    return dx


# --------------------------------------------------------------------------------------------- softmax / CE
def softmax(logits) -> np.ndarray:
    """Row-wise softmax of (N, C) logits, stabilised by subtracting each row's max."""
    logits = _float_array("softmax", "logits", logits, 2)
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy of softmax(logits) against integer labels, and the probabilities.

    With s = logits - rowmax, loss_n = log(sum_c exp(s_nc)) - s_n,label (log-sum-exp, never log(0)).
    Returns (mean_loss: float, probs: (N, C) array of the logits' dtype).
    """
    op = "softmax_cross_entropy"
    logits = _float_array(op, "logits", logits, 2)
    n, c = logits.shape
    labels = _labels(op, labels, n, c)
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    probs = e / total
    per_sample = np.log(total[:, 0]) - shifted[np.arange(n), labels]
    return float(per_sample.mean()), probs


def softmax_cross_entropy_backward(probs, labels, reduction: str = DEFAULT_REDUCTION) -> np.ndarray:
    """d(loss)/d(logits) = (probs - onehot(labels)) / N for the mean over the batch (`reduction="mean"`), or
    probs - onehot(labels) for the sum of the per-sample losses (`"sum"`)."""
    op = "softmax_cross_entropy_backward"
    check_reduction(op, reduction)
    probs = _float_array(op, "probs", probs, 2)
    n, c = probs.shape
    labels = _labels(op, labels, n, c)
    d = probs.copy()
    d[np.arange(n), labels] -= probs.dtype.type(1)
    if reduction == "mean":
        d /= probs.dtype.type(n)
    return d


# --------------------------------------------------------------------------------------------- conv2d
def conv2d_output_size(size: int, kernel_size: int, padding: int) -> int:
    """Spatial output size of a stride-1 convolution: size + 2 * padding - kernel_size + 1."""
    return size + 2 * padding - kernel_size + 1


def _conv_check(op: str, x, w, b, padding):
    x = _float_array(op, "x", x, 4)
    w = _float_array(op, "w", w, 4)
    b = _float_array(op, "b", b, 1)
    _same_dtype(op, x=x, w=w, b=b)
    n, cin, h, wd = x.shape
    cout, wcin, kh, kw = w.shape
    if kh != kw:
        raise ValueError(f"{op}: kernel must be square, w has shape {w.shape} (Cout, Cin, k, k)")
    if wcin != cin or b.shape[0] != cout:
        raise ValueError(
            f"{op}: channels do not fit: x {x.shape} (N, Cin, H, W), w {w.shape} (Cout, Cin, k, k), b {b.shape} (Cout,)"
        )
    if int(padding) != padding or padding < 0:
        raise ValueError(f"{op}: padding must be a non-negative integer, got {padding!r}")
    padding = int(padding)
    ho, wo = conv2d_output_size(h, kh, padding), conv2d_output_size(wd, kh, padding)
    if ho < 1 or wo < 1:
        raise ValueError(
            f"{op}: input {h}x{wd} with padding {padding} is smaller than the {kh}x{kh} kernel (x {x.shape})"
        )
    return x, w, b, padding, ho, wo


def _im2col(xp: np.ndarray, k: int, ho: int, wo: int) -> np.ndarray:
    """(N, C, Hp, Wp) padded input -> the (C*k*k, N*Ho*Wo) im2col matrix:
    cols[(c, di, dj), (n, i, j)] = xp[n, c, i + di, j + dj].
    Rows are in the (c, di, dj) order of w.reshape(Cout, -1); columns in (n, i, j) order. Each output pixel
    is a column, so the whole convolution is one GEMM w_mat (Cout, C*k*k) @ cols. Built with one shifted
    block copy per kernel offset (di, dj): contiguous runs of Wo, much faster than copying a
    sliding_window_view, and the exact mirror of the col2im scatter in conv2d_backward."""
    n, c = xp.shape[:2]
    cols = np.empty((c, k, k, n, ho, wo), dtype=xp.dtype)
    x_cn = xp.transpose(1, 0, 2, 3)  # (C, N, Hp, Wp) view

    def fill(s, e):  # the columns of samples [s, e)
        for di in range(k):
            for dj in range(k):
                cols[:, di, dj, s:e] = x_cn[:, s:e, di : di + ho, dj : dj + wo]

    over_samples(n, cols.size, fill)
    return cols.reshape(c * k * k, n * ho * wo)


def _padded(x: np.ndarray, padding: int) -> np.ndarray:
    """x (N, C, H, W) with `padding` zeros on each side of H and W (x itself without padding)."""
    if not padding:
        return x
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=x.dtype)

    def fill(s, e):
        xp[s:e, :, padding : padding + h, padding : padding + w] = x[s:e]

    over_samples(n, x.size, fill)
    return xp


IM2COL_BUDGET = 24 * 2**20  # bytes of one im2col matrix: a larger batch is convolved in chunks of samples


def batch_chunks(n: int, per_sample_bytes: int, budget: int | None = None) -> list[tuple[int, int]]:
    """[start, end) sample ranges whose im2col matrices stay within `budget` bytes (at least one sample each): a
    matrix that fits the CPU's caches. The autoencoder's last convolution (256 -> 3 channels at 32x32) builds 9.4 MB
    per sample, 600 MB for a batch of 64 in one piece, and its forward ran 3-4x slower so (docs/notes/issue-40-
    progress.md); the CNN's convolutions stay within one chunk at its batch of 64."""
    step = max(1, (IM2COL_BUDGET if budget is None else budget) // max(per_sample_bytes, 1))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def conv2d_forward(x, w, b, padding: int = 0):
    """Stride-1 2-D convolution (cross-correlation, as in PyTorch) by im2col + one GEMM per chunk of samples.

    x (N, Cin, H, W), w (Cout, Cin, k, k), b (Cout,), zero padding `padding` on each side.
    y[n, o, i, j] = b[o] + sum_{c, di, dj} w[o, c, di, dj] * xpad[n, c, i + di, j + dj]
    Returns (y (N, Cout, Ho, Wo), cache); Ho = H + 2*padding - k + 1; cache = (padded x, w, padding, x's shape, the
    im2col matrix or None).
    The cache keeps the padded input and w, and the im2col matrix when the batch is one chunk (at most IM2COL_BUDGET
    bytes held until backward, which otherwise rebuilds it chunk by chunk). Samples are convolved in batch_chunks
    (each output the same dot product whatever the chunk).
    """
    x, w, b, padding, ho, wo = _conv_check("conv2d_forward", x, w, b, padding)
    n, cin = x.shape[:2]
    cout, _, k, _ = w.shape
    xp = _padded(x, padding)
    w_mat = w.reshape(cout, -1)
    y = np.empty((n, cout, ho, wo), dtype=x.dtype)
    bias = b[:, None, None, None]
    chunks = batch_chunks(n, cin * k * k * ho * wo * x.itemsize)
    for s, e in chunks:
        cols = _im2col(xp[s:e], k, ho, wo)  # (Cin*k*k, n*Ho*Wo), columns (n, i, j)
        part = (w_mat @ cols).reshape(cout, e - s, ho, wo)
        y_cn = y[s:e].transpose(1, 0, 2, 3)  # (Cout, n, Ho, Wo) view of this chunk's outputs
        over_samples(e - s, part.size, lambda a, z, part=part, y_cn=y_cn: np.add(part[:, a:z], bias, out=y_cn[:, a:z]))
    cache = (xp, w, padding, x.shape, cols if len(chunks) == 1 else None)
    return y, cache


def conv2d_backward(dy, cache, input_grad: bool = True):
    """Gradients of conv2d_forward: (dx (N, Cin, H, W), dw (Cout, Cin, k, k), db (Cout,)); dx is None without
    `input_grad` (a first layer's: nothing reads it, so neither its GEMM nor its scatter runs).

    Per chunk of samples (batch_chunks; dw and db summed over the chunks): dw = dy_mat @ cols.T, db = sum of dy
    over (n, i, j), with dy_mat (Cout, n*Ho*Wo); dx scatters dcols = w_mat.T @ dy_mat back onto the k x k window of
    every output pixel (col2im), or, with fewer output than input channels, gathers: the full correlation of dy
    with the flipped kernel, one GEMM over the im2col of the padded dy."""
    op = "conv2d_backward"
    xp, w, padding, x_shape, kept_cols = cache
    n, cin, h, wd = x_shape
    cout, _, k, _ = w.shape
    ho, wo = conv2d_output_size(h, k, padding), conv2d_output_size(wd, k, padding)
    dy = _float_array(op, "dy", dy, 4)
    _same_dtype(op, dy=dy, w=w)
    if dy.shape != (n, cout, ho, wo):
        raise ValueError(f"{op}: dy must have shape {(n, cout, ho, wo)} (the forward output), got {dy.shape}")
    dx = np.empty(x_shape, dtype=dy.dtype) if input_grad else None
    dw = db = None
    # the im2col of the input; dcols (the scatter) is as large, the gather's im2col of dy smaller (cout < cin)
    for s, e in batch_chunks(n, cin * k * k * ho * wo * dy.itemsize):
        dy_cn = np.empty((cout, e - s, ho, wo), dtype=dy.dtype)  # dy in (C, N) order: the GEMMs' layout
        dy_chunk = dy[s:e].transpose(1, 0, 2, 3)
        over_samples(e - s, dy_cn.size,
                     lambda a, z, dy_cn=dy_cn, dy_chunk=dy_chunk: np.copyto(dy_cn[:, a:z], dy_chunk[:, a:z]))
        dy_mat = dy_cn.reshape(cout, (e - s) * ho * wo)
        cols = kept_cols if kept_cols is not None else _im2col(xp[s:e], k, ho, wo)  # one chunk: forward's
        part_dw = dy_mat @ cols.T
        part_db = dy_mat.sum(axis=1)
        dw = part_dw if dw is None else dw + part_dw
        db = part_db if db is None else db + part_db
        if input_grad:
            _conv_input_grad(dy[s:e], dy_mat, w, padding, dx[s:e])
    return dx, dw.reshape(w.shape), db


def _conv_input_grad(dy, dy_mat, w, padding: int, dx) -> None:
    """Writes dx (n, Cin, H, W) of one chunk: the scatter of w_mat.T @ dy_mat (cout >= cin) or the gather (fewer
    output than input channels, where the scatter's dcols is the larger matrix)."""
    n, cout, ho, wo = dy.shape
    cin, k = w.shape[1], w.shape[2]
    h, wd = dx.shape[2:]
    dx_cn = dx.transpose(1, 0, 2, 3)  # (Cin, n, H, W) view
    if cout >= cin:  # dcols = w_mat.T @ dy_mat scattered back onto every output pixel's k x k window (col2im)
        dcols = (w.reshape(cout, -1).T @ dy_mat).reshape(cin, k, k, n, ho, wo)

        def scatter(s, e):  # samples [s, e): their padded gradient in dcols' (C, N) order, the adds in sequence
            dxp = np.zeros((cin, e - s, h + 2 * padding, wd + 2 * padding), dtype=dy.dtype)
            for di in range(k):
                for dj in range(k):
                    dxp[:, :, di : di + ho, dj : dj + wo] += dcols[:, di, dj, s:e]
            dx_cn[:, s:e] = dxp[:, :, padding : padding + h, padding : padding + wd]

        over_samples(n, dcols.size, scatter)
        return
    # dx[n, c, y, x] = sum_{o, a, b} w[o, c, k-1-a, k-1-b] * dy[n, o, y+a-e, x+b-e] with e = k-1-padding: the im2col
    # of dy padded by e (cropped by -e) times the flipped weights, one GEMM that writes each dx element once
    e = k - 1 - padding
    dyp = _padded(dy, e) if e > 0 else dy[:, :, -e : ho + e, -e : wo + e] if e else dy
    w_flip = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3).reshape(cin, cout * k * k)
    grad = (w_flip @ _im2col(dyp, k, h, wd)).reshape(cin, n, h, wd)
    over_samples(n, grad.size, lambda s, e: np.copyto(dx_cn[:, s:e], grad[:, s:e]))


# --------------------------------------------------------------------------------------------- maxpool
# Window positions in argmax order: 2*di + dj.
_POOL_OFFSETS = ((0, 0), (0, 1), (1, 0), (1, 1))


def maxpool2x2_forward(x):
    """2x2 max pooling, stride 2, over (N, C, H, W). Odd H or W: the last row/column is dropped (floor,
    like PyTorch). Returns (y (N, C, H//2, W//2), argmax) where argmax (int8, same shape as y) is the
    position of the max inside its window, 2*di + dj (0 top-left, 1 top-right, 2 bottom-left,
    3 bottom-right); on ties the first position in that order wins."""
    op = "maxpool2x2_forward"
    x = _float_array(op, "x", x, 4)
    n, c, h, w = x.shape
    ho, wo = h // 2, w // 2
    if ho < 1 or wo < 1:
        raise ValueError(f"{op}: H and W must be at least 2, got x {x.shape}")

    y = np.empty((n, c, ho, wo), dtype=x.dtype)
    argmax = np.empty((n, c, ho, wo), dtype=np.int8)

    def pool(s, e):  # samples [s, e)
        a, b, c_, d = (x[s:e, :, di : 2 * ho : 2, dj : 2 * wo : 2] for di, dj in _POOL_OFFSETS)  # strided views
        ys = np.maximum(np.maximum(a, b), np.maximum(c_, d), out=y[s:e])
        # argmax = the first position (in 0..3 order) that holds the max: count the leading positions that
        # do not: [a != y] + [a != y and b != y] + [a != y and b != y and c != y]
        not_a = a != ys
        not_ab = not_a & (b != ys)
        np.add(not_a.view(np.int8) + not_ab.view(np.int8), (not_ab & (c_ != ys)).view(np.int8), out=argmax[s:e])

    over_samples(n, x.size, pool, BLOCK_ELEMENTS)
    return y, argmax


def maxpool2x2_backward(dy, argmax, x_shape):
    """Routes each dy to the input position that won its window; everything else (and the dropped odd
    row/column) gets zero."""
    op = "maxpool2x2_backward"
    dy = _float_array(op, "dy", dy, 4)
    argmax = np.asarray(argmax)
    n, c, h, w = (int(s) for s in x_shape)
    ho, wo = h // 2, w // 2
    if dy.shape != (n, c, ho, wo) or argmax.shape != dy.shape:
        raise ValueError(
            f"{op}: dy {dy.shape} and argmax {argmax.shape} must both be {(n, c, ho, wo)} for input {tuple(x_shape)}"
        )
    dx = np.zeros((n, c, h, w), dtype=dy.dtype)

    def route(s, e):  # samples [s, e)
        for pos, (di, dj) in enumerate(_POOL_OFFSETS):
            # dy * mask (not np.where, 10x slower here); a losing position gets 0 (-0.0 for negative dy)
            np.multiply(dy[s:e], argmax[s:e] == pos, out=dx[s:e, :, di : 2 * ho : 2, dj : 2 * wo : 2])

    over_samples(n, dx.size, route, BLOCK_ELEMENTS)
    return dx


# --------------------------------------------------------------------------------------------- upsample
def upsample2x_forward(x) -> np.ndarray:
    """Nearest-neighbour 2x upsampling: y[n, c, i, j] = x[n, c, i // 2, j // 2]."""
    x = _float_array("upsample2x_forward", "x", x, 4)
    n, c, h, w = x.shape
    y = np.empty((n, c, h, 2, w, 2), dtype=x.dtype)
    if x.dtype == np.float32:  # each value's bits twice in one uint64, written as whole pairs (a copy, bit for bit)
        y64 = y.view(np.uint64).reshape(n, c, h, 2, w)
        x32 = x.view(np.uint32)
        pair = np.uint64(0x100000001)

        def fill(s, e):
            np.multiply(x32[s:e], pair, out=y64[s:e, :, :, 0], casting="unsafe")
            np.copyto(y64[s:e, :, :, 1], y64[s:e, :, :, 0])

        over_samples(n, y.size, fill, BLOCK_ELEMENTS)
    else:
        over_samples(n, y.size, lambda s, e: np.copyto(y[s:e], x[s:e, :, :, None, :, None]))
    return y.reshape(n, c, 2 * h, 2 * w)


def upsample2x_backward(dy) -> np.ndarray:
    """dx[n, c, i, j] = sum of dy over the 2x2 block it was copied to."""
    op = "upsample2x_backward"
    dy = _float_array(op, "dy", dy, 4)
    n, c, h2, w2 = dy.shape
    if h2 % 2 or w2 % 2:
        raise ValueError(f"{op}: dy H and W must be even (twice the input), got dy {dy.shape}")
    blocks = dy.reshape(n, c, h2 // 2, 2, w2 // 2, 2)
    dx = np.empty((n, c, h2 // 2, w2 // 2), dtype=dy.dtype)
    if w2 < 4 or not dy.flags.c_contiguous:  # (where NumPy's sum below adds in another order)
        over_samples(n, dy.size, lambda s, e: np.sum(blocks[s:e], axis=(3, 5), out=dx[s:e]))
        return dx
    # np.sum(blocks, axis=(3, 5)) of a C-contiguous dy with w2 >= 4 gives, for the block [[a, b], [c, d]], the bits
    # of ((c + d) + (a + b)) + 0 (signed zeros and NaN signs included; NumPy's own order is (a + b) + (+0 + c + d)):
    # here as pair sums along W, then along H
    pairs = np.empty((n, c, h2 // 2, 2, w2 // 2), dtype=dy.dtype)

    def add(s, e):
        np.add(blocks[s:e, ..., 0], blocks[s:e, ..., 1], out=pairs[s:e])
        np.add(pairs[s:e, :, :, 1], pairs[s:e, :, :, 0], out=dx[s:e])
        np.add(dx[s:e], dy.dtype.type(0), out=dx[s:e])

    over_samples(n, dy.size, add, BLOCK_ELEMENTS)
    return dx


# --------------------------------------------------------------------------------------------- mse
def _mse_check(op, pred, target):
    pred = _float_array(op, "pred", pred)
    target = _float_array(op, "target", target)
    _same_dtype(op, pred=pred, target=target)
    if pred.shape != target.shape:
        raise ValueError(f"{op}: pred {pred.shape} and target {target.shape} must have the same shape")
    return pred, target


def mse_forward(pred, target) -> float:
    """Mean over all elements of (pred - target)^2."""
    pred, target = _mse_check("mse_forward", pred, target)
    d = pred - target
    np.multiply(d, d, out=d)  # in place: the same squares as d * d without a second array of the test set's size
    return float(np.mean(d))


def mse_backward(pred, target) -> np.ndarray:
    """d(mse)/d(pred) = 2 (pred - target) / pred.size."""
    pred, target = _mse_check("mse_backward", pred, target)
    return (pred - target) * pred.dtype.type(2.0 / pred.size)
