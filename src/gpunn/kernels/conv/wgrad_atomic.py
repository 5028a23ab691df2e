"""Convolution version ``atomic``, weight and bias gradients: one thread per output-gradient element (n, co, oy, ox)
on a grid-stride 1-D grid, scattering its contributions with ``cuda.atomic.add`` into gradients zeroed by a first
launch (the other plausible design of paper 001's naive ConvLayerBackward, beside ``naive``'s one thread per weight).

* ``conv_backward_weight_atomic``: zero dw, then each thread adds dy[n, co, oy, ox] * x[n, ci, oy + kh - p,
  ox + kw - p] into dw[co, ci, kh, kw] for every (ci, kh, kw) whose input lies inside the image.
* ``conv_backward_weight_bias_atomic`` (the version's ``with_bias``): zero dw and db in one launch, then the same
  threads add dy into db[co] too: both gradients in one pass, as the paper's one ConvLayerBackward kernel.
* ``conv_bias_grad_atomic``: zero db, then each thread adds its dy element into db[co].

A warp's threads run consecutive ox of one (n, co, oy), so its adds for one (ci, kh, kw) hit one address: the
atomics serialize there. Not deterministic (float additions in the order the atomics land). References:
``conv_backward_weight_ref`` and ``conv_bias_grad_ref``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..jit import jit
from ..launch import LaunchGroup, bind, check_block, grid_for
from ..pool import _zero_kernel
from .checks import U0, U1, backward_weight_args, bias_grad_args
from .weight_grad import _zero4_kernel

__all__ = ["conv_backward_weight_atomic", "conv_backward_weight_bias_atomic", "conv_bias_grad_atomic"]


@cuda.jit(device=True)
def _nchw(i, cout, oh_n, ow_n):
    """(n, co, oy, ox) of flat index i of an (N, Cout, OH, OW) array, x fastest (a warp along a row)."""
    ox = uint32(i % ow_n)
    rest = uint32(i // ow_n)
    oy = uint32(rest % oh_n)
    rest = uint32(rest // oh_n)
    return uint32(rest // cout), uint32(rest % cout), oy, ox


@functools.cache
def _scatter_kernel(k, pad, bias, weights=True):
    """The scatter pass: dw (without `weights`: nothing) and, with `bias`, db += each dy element's contributions."""
    P = np.uint32(pad)

    @jit
    def conv_wgrad_atomic_kernel(x, dy, dw, db):
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        cout = uint32(dy.shape[1])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        total = uint32(dy.shape[0] * dy.shape[1] * dy.shape[2] * dy.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            n, co, oy, ox = _nchw(i, cout, oh_n, ow_n)
            g = dy[n, co, oy, ox]
            if bias:
                cuda.atomic.add(db, co, g)
            ci = U0
            while weights and ci < cin:
                for kh in range(k):
                    r = uint32(oy + uint32(kh))  # row in padded coordinates
                    if r >= P and r < h + P:
                        for kw in range(k):
                            c = uint32(ox + uint32(kw))
                            if c >= P and c < wd + P:
                                cuda.atomic.add(dw, (co, ci, uint32(kh), uint32(kw)),
                                                g * x[n, ci, uint32(r - P), uint32(c - P)])
                ci = uint32(ci + U1)
            i = uint32(i + stride)

    return conv_wgrad_atomic_kernel


@jit
def _zero_both_kernel(dw, db):
    """dw[...] = 0 (4-D, possibly strided) and db[...] = 0 in one grid-stride pass."""
    d1 = uint32(dw.shape[1])
    d2 = uint32(dw.shape[2])
    d3 = uint32(dw.shape[3])
    nw = uint32(dw.shape[0] * dw.shape[1] * dw.shape[2] * dw.shape[3])
    total = uint32(nw + uint32(db.shape[0]))
    i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while i < total:
        if i < nw:
            rest = uint32(i // d3)
            dw[uint32(rest // d2 // d1), uint32(rest // d2 % d1), uint32(rest % d2), uint32(i % d3)] = float32(0.0)
        else:
            db[uint32(i - nw)] = float32(0.0)
        i = uint32(i + stride)


def _wgrad_atomic(op, x, dy, dw, db, padding, block, stream, launch) -> LaunchGroup:
    padding, (_, _, k) = backward_weight_args(op, x, dy, dw, padding)
    bias = db is not None
    if bias:
        bias_grad_args(op, dy, db)
    block = check_block(op, block)
    if bias:
        zero = bind(_zero_both_kernel, grid_for(dw.size + db.size, block), block, (dw, db), stream, False,
                    f"{op}.zero")
    else:
        zero = bind(_zero4_kernel, grid_for(dw.size, block), block, (dw,), stream, False, f"{op}.zero")
        db = dw[0, 0, 0, :1]  # the scatter kernel's db, never read without a bias (a view: nothing allocated)
    group = LaunchGroup([zero, bind(_scatter_kernel(k, padding, bias), grid_for(dy.size, block), block,
                                    (x, dy, dw, db), stream, False, f"{op}[k{k},p{padding}]")])
    if launch:
        group()
    return group


def conv_backward_weight_atomic(x, dy, dw, padding, block=256, stream=0, launch=True) -> LaunchGroup:
    """Weight gradient, one thread per dy element adding into dw with atomics (zeroing launch first)."""
    return _wgrad_atomic("conv_backward_weight_atomic", x, dy, dw, None, padding, block, stream, launch)


def conv_backward_weight_bias_atomic(x, dy, dw, db, padding, block=256, stream=0, launch=True) -> LaunchGroup:
    """Weight and bias gradients in one scatter pass (one thread per dy element, atomics), after one zeroing
    launch over both."""
    return _wgrad_atomic("conv_backward_weight_bias_atomic", x, dy, dw, db, padding, block, stream, launch)


def conv_bias_grad_atomic(dy, db, block=256, stream=0, launch=True) -> LaunchGroup:
    """Bias gradient, one thread per dy element adding into db[co] with atomics (zeroing launch first)."""
    op = "conv_bias_grad_atomic"
    bias_grad_args(op, dy, db)
    block = check_block(op, block)
    # the scatter kernel without its weight loop: x and dw are dy and a view of db, never read or written
    scatter = _scatter_kernel(1, 0, True, weights=False)
    group = LaunchGroup([bind(_zero_kernel, grid_for(db.size, block), block, (db,), stream, False, f"{op}.zero"),
                         bind(scatter, grid_for(dy.size, block), block, (dy, dy, db.reshape(1, 1, 1, -1), db), stream,
                              False, op)])
    if launch:
        group()
    return group
