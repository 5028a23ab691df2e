"""Argument checks and limits shared by the direct convolution kernels (naive, tiled, block reductions, staged,
split bias gradient): NCHW float32 device arrays, odd square kernels, stride 1, zero padding p >= 0."""

from __future__ import annotations

import numpy as np

from gpunn.nn import functional as F

from ..common import shape
from ..jit import jit
from ..launch import check_device_array

__all__ = ["MAX_GRID_YZ", "SMEM_LIMIT", "WARP", "backward_data_args", "backward_weight_args", "bias_grad_args",
           "check_grid_y", "check_splits", "conv_output_size", "forward_args", "jit_for"]

SMEM_LIMIT = 48 * 1024  # static shared memory per block
MAX_GRID_YZ = 65535
WARP = 32
U0 = np.uint32(0)
U1 = np.uint32(1)


def conv_output_size(size: int, k: int, padding: int) -> int:
    return F.conv2d_output_size(size, k, padding)


def _device_array(op, name, a, ndim):
    check_device_array(op, name, a, ndim)
    if a.size >= 2**31:
        raise ValueError(f"{op}: {name} {shape(a)} has 2**31 or more elements (indices are 32-bit)")
    return a


def _padding(op, padding) -> int:
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"{op}: padding must be a non-negative int, got {padding!r}")
    return int(padding)


def _weight(op, name, w):
    """(Cout, Cin, k) of a (Cout, Cin, k, k) weight array with an odd k."""
    _device_array(op, name, w, 4)
    cout, cin, kh, kw = shape(w)
    if kh != kw or kh % 2 == 0:
        raise ValueError(f"{op}: {name} {shape(w)} must be (Cout, Cin, k, k) with one odd k")
    return cout, cin, kh


def _geometry(op, x_name, x_shape, y_name, y_shape, w_shape, padding, w_name="w"):
    """Check that x (N, Cin, H, W) convolved with a (Cout, Cin, k, k) weight and padding gives y's shape
    (N, Cout, OH, OW); return (OH, OW)."""
    cout, cin, k = w_shape
    n, x_cin, h, wd = x_shape
    what = (f"{op}: {x_name}{x_shape} (N, Cin, H, W), {w_name}{(cout, cin, k, k)} (Cout, Cin, k, k), "
            f"padding {padding} -> {y_name}{y_shape}")
    if x_cin != cin:
        raise ValueError(f"{what}: {x_name} has {x_cin} channels, {w_name} expects Cin = {cin}")
    oh, ow = conv_output_size(h, k, padding), conv_output_size(wd, k, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"{what}: the {h}x{wd} input with padding {padding} is smaller than the {k}x{k} kernel")
    if y_shape != (n, cout, oh, ow):
        raise ValueError(f"{what}: {y_name} must be {(n, cout, oh, ow)}")
    return oh, ow


def forward_args(op, x, w, bias, out, padding):
    padding = _padding(op, padding)
    w_shape = _weight(op, "w", w)
    _device_array(op, "x", x, 4)
    _device_array(op, "out", out, 4)
    _geometry(op, "x", shape(x), "out", shape(out), w_shape, padding)
    if bias is not None:
        _device_array(op, "bias", bias, 1)
        if shape(bias) != (w_shape[0],):
            raise ValueError(f"{op}: bias must be ({w_shape[0]},) for w {shape(w)}, got {shape(bias)}")
    return padding, w_shape


def backward_data_args(op, dy, w, dx, padding, relu_mask):
    padding = _padding(op, padding)
    w_shape = _weight(op, "w", w)
    _device_array(op, "dy", dy, 4)
    _device_array(op, "dx", dx, 4)
    _geometry(op, "dx", shape(dx), "dy", shape(dy), w_shape, padding)
    if relu_mask is not None:
        _device_array(op, "relu_mask", relu_mask, 4)
        if shape(relu_mask) != shape(dx):
            raise ValueError(f"{op}: relu_mask must have dx's shape {shape(dx)}, got {shape(relu_mask)}")
    return padding, w_shape


def backward_weight_args(op, x, dy, dw, padding):
    padding = _padding(op, padding)
    w_shape = _weight(op, "dw", dw)
    _device_array(op, "x", x, 4)
    _device_array(op, "dy", dy, 4)
    _geometry(op, "x", shape(x), "dy", shape(dy), w_shape, padding, w_name="dw")
    return padding, w_shape


def bias_grad_args(op, dy, db):
    _device_array(op, "dy", dy, 4)
    _device_array(op, "db", db, 1)
    if shape(db) != (shape(dy)[1],):
        raise ValueError(f"{op}: db must be ({shape(dy)[1]},) for dy {shape(dy)} (N, Cout, OH, OW), "
                         f"got {shape(db)}")



def jit_for(threads):
    """gpunn.kernels.jit for a kernel always launched with `threads` threads: launch_bounds makes the compiler keep
    registers within what that block size allows (otherwise 1024-thread launches could fail for lack of
    registers)."""
    return jit(launch_bounds=threads)



def check_splits(op, splits):
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or splits < 1):
        raise ValueError(f"{op}: splits must be a positive int or None, got {splits!r}")


def check_grid_y(op, splits):
    if splits > MAX_GRID_YZ:
        raise ValueError(f"{op}: {splits} batch splits exceed the grid's y limit {MAX_GRID_YZ}")

