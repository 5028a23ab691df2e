"""Elementwise kernels of the dense layers: bias add, ReLU forward/backward, fused bias + ReLU.

Ops (one kernel each, 1-D grid-stride loops over the flattened row-major array):

    bias_add      x[i, j] += bias[j]                       (in place, x (B, N), bias (N,))
    relu_forward  out = max(x, 0)                          (any shape, out may alias x)
    relu_backward dx = dy where x > 0 else 0               (derivative at exactly 0 is 0, like the reference)
    bias_relu     x[i, j] = max(x[i, j] + bias[j], 0)      (fused, in place: one read + one write of x)
    gather_rows   x[r, :] = source[order[s + r], :], y[r] = labels[order[s + r]] with s = step * stride read
                  from a device counter: the batch gather of device-resident training (x may be a strided view)
    pixels_to_float  out = float32(pixels) / 255 from uint8 pixels (any shape): gpunn.rundata.images_to_float on
                  the device, bit for bit (both divide in float32, correctly rounded), so a resident training set
                  crosses to the device as uint8, a quarter of the bytes, and no float copy is made on the host

Every launcher takes float32 device arrays and `block` (threads per block), checks the shapes (ValueError
naming the op and the shapes, zero-sized dimensions included), computes the grid and launches. The
float64 NumPy references (`*_ref`) sit at the bottom; `OPS` maps each op name to its launcher.

"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .jit import jit
from .launch import Launch, bind, check_array, check_block, check_device_array, flat, grid_for

__all__ = [
    "OPS",
    "bias_add",
    "bias_add_ref",
    "bias_relu",
    "bias_relu_ref",
    "gather_rows",
    "gather_rows_ref",
    "pixels_to_float",
    "pixels_to_float_ref",
    "relu_backward",
    "relu_backward_ref",
    "relu_forward",
    "relu_forward_ref",
]

# --------------------------------------------------------------------------------------------- kernels
@jit
def _bias_add_kernel(x, bias, n, cols):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        x[i] += bias[i % cols]


@jit
def _relu_forward_kernel(x, out, n):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        v = x[i]
        out[i] = float32(0.0) if v < 0 else v  # NaN propagates, as with np.maximum


@jit
def _relu_backward_kernel(x, dy, dx, n):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        dx[i] = dy[i] if x[i] > 0 else float32(0.0)


@jit
def _bias_relu_kernel(x, bias, n, cols):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        v = x[i] + bias[i % cols]
        x[i] = float32(0.0) if v < 0 else v


# --------------------------------------------------------------------------------------------- launchers
def _check_bias(op: str, x, bias):
    check_array(op, "x", x, 2)
    check_array(op, "bias", bias, 1)
    if bias.shape[0] != x.shape[1]:
        raise ValueError(
            f"{op}: bias {tuple(bias.shape)} must have shape ({x.shape[1]},) to match x {tuple(x.shape)}"
        )


def bias_add(x, bias, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """x (B, N) += bias (N,) broadcast over rows, in place."""
    op = "bias_add"
    block = check_block(op, block)
    _check_bias(op, x, bias)
    n = x.size
    return bind(_bias_add_kernel, grid_for(n, block), block, (flat(x), bias, n, x.shape[1]), stream, launch, op)


def relu_forward(x, out, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """out = max(x, 0) elementwise; x and out have the same shape (out may be x)."""
    op = "relu_forward"
    block = check_block(op, block)
    check_array(op, "x", x)
    check_array(op, "out", out)
    if tuple(x.shape) != tuple(out.shape):
        raise ValueError(
            f"{op}: x {tuple(x.shape)} and out {tuple(out.shape)} must have the same shape"
        )
    n = x.size
    return bind(_relu_forward_kernel, grid_for(n, block), block, (flat(x), flat(out), n), stream, launch, op)


def relu_backward(x, dy, dx, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """dx = dy where x > 0 else 0. `x` is the ReLU input (pre-activation) or its output: same mask."""
    op = "relu_backward"
    block = check_block(op, block)
    check_array(op, "x", x)
    check_array(op, "dy", dy)
    check_array(op, "dx", dx)
    if not tuple(x.shape) == tuple(dy.shape) == tuple(dx.shape):
        raise ValueError(
            f"{op}: x {tuple(x.shape)}, dy {tuple(dy.shape)} and dx {tuple(dx.shape)} must have the same shape"
        )
    n = x.size
    return bind(_relu_backward_kernel, grid_for(n, block), block, (flat(x), flat(dy), flat(dx), n), stream, launch, op)


def bias_relu(x, bias, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """x (B, N) = max(x + bias, 0), fused and in place."""
    op = "bias_relu"
    block = check_block(op, block)
    _check_bias(op, x, bias)
    n = x.size
    return bind(_bias_relu_kernel, grid_for(n, block), block, (flat(x), bias, n, x.shape[1]), stream, launch, op)


@jit
def _gather_rows_kernel(source, labels, order, counter, stride, x, y):
    rows = x.shape[0]
    cols = x.shape[1]
    first = (counter[0] * stride) % order.shape[0]
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, rows * cols, step):
        r = i // cols
        j = i - r * cols
        sample = order[first + r]
        x[r, j] = source[sample, j]
        if j == 0:
            y[r] = labels[sample]


def gather_rows(source, labels, order, counter, stride: int, x, y, block: int = 256, stream=0,
                launch: bool = True) -> Launch:
    """x (B, F) = source[order[s:s + B]], y (B,) = labels[order[s:s + B]], s = (counter[0] * stride) % N.

    source (N, F) float32 and labels (N,) int32 stay on the device for the whole run; order (N,) int32 is the
    epoch's sample order and counter a (1,) int32 device array holding the step number (advanced by the
    step's last kernel), so the same bound launch gathers every batch of the epoch. stride is the full batch
    size; a partial last batch has B < stride rows. x may be a strided view (e.g. a (B, F) slice of a
    (B, F + 1) buffer whose last column is ones)."""
    op = "gather_rows"
    block = check_block(op, block)
    check_array(op, "source", source, 2)
    check_array(op, "labels", labels, 1, dtype=np.int32)
    check_array(op, "order", order, 1, dtype=np.int32)
    check_array(op, "counter", counter, 1, dtype=np.int32)
    check_array(op, "x", x, 2)
    check_array(op, "y", y, 1, dtype=np.int32)
    n, features = source.shape
    rows = x.shape[0]
    if (tuple(labels.shape) != (n,) or tuple(order.shape) != (n,) or x.shape[1] != features
            or tuple(y.shape) != (rows,) or rows > n or not rows <= int(stride) <= n):
        raise ValueError(
            f"{op}: shapes do not fit source {tuple(source.shape)}, labels {tuple(labels.shape)}, order "
            f"{tuple(order.shape)}, x {tuple(x.shape)}, y {tuple(y.shape)}, stride {stride} (need x (B, F), "
            "y (B,), labels and order (N,), B <= stride <= N)"
        )
    args = (source, labels, order, counter, np.int32(stride), x, y)
    return bind(_gather_rows_kernel, grid_for(x.size, block), block, args, stream, launch, op)


@jit
def _pixels_to_float_kernel(pixels, out, n):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        out[i] = float32(pixels[i]) / float32(255.0)


def pixels_to_float(pixels, out, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """out = float32(pixels) / 255 elementwise: uint8 pixels to float32 of the same shape, as the host's
    images_to_float computes it."""
    op = "pixels_to_float"
    block = check_block(op, block)
    check_device_array(op, "pixels", pixels, dtype=np.uint8)
    check_device_array(op, "out", out)
    if tuple(pixels.shape) != tuple(out.shape):
        raise ValueError(f"{op}: pixels {tuple(pixels.shape)} and out {tuple(out.shape)} must have the same shape")
    n = pixels.size
    return bind(_pixels_to_float_kernel, grid_for(n, block), block, (flat(pixels), flat(out), n), stream, launch, op)


OPS = {
    "bias_add": bias_add,
    "relu_forward": relu_forward,
    "relu_backward": relu_backward,
    "bias_relu": bias_relu,
    "gather_rows": gather_rows,
    "pixels_to_float": pixels_to_float,
}


# --------------------------------------------------------------------------------------------- references
def bias_add_ref(x, bias) -> np.ndarray:
    return np.asarray(x, np.float64) + np.asarray(bias, np.float64)


def relu_forward_ref(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0)


def relu_backward_ref(x, dy) -> np.ndarray:
    return np.asarray(dy, np.float64) * (np.asarray(x) > 0)


def bias_relu_ref(x, bias) -> np.ndarray:
    return np.maximum(bias_add_ref(x, bias), 0.0)


def gather_rows_ref(source, labels, order, step: int, stride: int, rows: int):
    """(x, y) of the batch gather_rows copies at `step`."""
    first = (step * stride) % len(order)
    picked = np.asarray(order)[first:first + rows]
    return np.asarray(source, np.float64)[picked], np.asarray(labels)[picked]


def pixels_to_float_ref(pixels) -> np.ndarray:
    return np.asarray(pixels, np.float64) / 255.0
