"""2x2 max pooling (stride 2) and nearest-neighbour 2x upsampling, forward and backward, on NCHW float32.

Layouts follow gpunn.nn.functional: x (N, C, H, W); the pooled output and its argmax are (N, C, H//2, W//2);
argmax is int8, the winner's position inside its window, 2*di + dj, the first position in that order winning
ties. Odd H or W floor like PyTorch: the last row/column is dropped by the forward and gets zero gradient.

Versions (every kernel a 1-D grid-stride loop, one thread per element of the array it writes):

    maxpool2x2_forward  v1      one thread per output: reads its 2x2 window, writes the max and the argmax;
                                NaN propagates (a NaN in the window wins, like PyTorch)
    maxpool2x2_backward atomic  a zeroing launch over dx, then one thread per dy element adds it into the
                                winning input position with cuda.atomic.add (the CNN seed's scheme). Windows do
                                not overlap, so no two threads ever hit the same dx element: the atomics are
                                never contended, but the extra pass over dx costs a full write of it
                        gather  race-free, one pass: one thread per dx element reads its window's argmax and
                                writes dy or 0 (the dropped odd row/column included), so no zeroing launch
    upsample2x_forward  v1      one thread per output: out[n, c, i, j] = x[n, c, i // 2, j // 2]
    upsample2x_backward v1      one thread per dx element: the sum of its 2x2 block of dy

Both backward ops take an optional ``relu_mask`` of dx's shape: dx = 0 where mask <= 0, fusing the ReLU
backward of the layer before the pool (or before the upsample) into this launch (mask = that ReLU's output).

Launchers take device arrays (host NumPy arrays are refused: numba would copy them at every launch), check
dtypes and shapes (ValueError naming the op and the shapes), and return a bound launch (gpunn.kernels.launch),
run once unless ``launch=False``. The atomic backward returns a LaunchGroup (zero, then scatter).
``OPS`` maps each op to its versions, ``{op: {version: launcher}}``; the float64 NumPy references
(``*_ref``, built on gpunn.nn.functional) sit at the bottom.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int8, uint32

from gpunn.nn import functional as F

from .jit import jit
from .launch import Launch, LaunchGroup, bind, check_block, check_device_array, flat, grid_for

__all__ = [
    "OPS",
    "maxpool2x2_backward_atomic",
    "maxpool2x2_backward_gather",
    "maxpool2x2_backward_ref",
    "maxpool2x2_forward_ref",
    "maxpool2x2_forward_v1",
    "upsample2x_backward",
    "upsample2x_backward_ref",
    "upsample2x_forward",
    "upsample2x_forward_ref",
]

# Index arithmetic is uint32 (see gemm/mappings.py): numba widens integer operations to 64 bits; wrapping each result
# in uint32(...) lets LLVM keep 32-bit instructions, and the divisions that split a flat index into
# (n*C + c, row, column) are far cheaper in 32 bits. The launchers refuse arrays of 2**31 elements or more.
_U1 = np.uint32(1)
_U2 = np.uint32(2)
_MAX_ELEMENTS = 2**31 - 1  # i + grid stride stays below 2**32


# --------------------------------------------------------------------------------------------- kernels
@jit
def _zero_kernel(a):
    n = uint32(a.shape[0])
    i = uint32(cuda.grid(1))
    step = uint32(cuda.gridsize(1))
    while i < n:
        a[i] = float32(0.0)
        i = uint32(i + step)


@jit
def _maxpool_forward_kernel(x, out, argmax, h, w):
    """x flat (N*C*H*W); out, argmax flat (N*C*Ho*Wo); h, w uint32 (the input's H and W)."""
    ho = uint32(h >> _U1)
    wo = uint32(w >> _U1)
    n = uint32(out.shape[0])
    i = uint32(cuda.grid(1))
    step = uint32(cuda.gridsize(1))
    while i < n:
        q = uint32(i // wo)
        oj = uint32(i - q * wo)
        nc = uint32(q // ho)
        oi = uint32(q - nc * ho)
        top = uint32((nc * h + oi * _U2) * w + oj * _U2)
        bottom = uint32(top + w)
        # strict > keeps the first position on ties (the reference's rule); `v != v` lets a NaN win, and
        # once the best is NaN nothing compares greater, so NaN propagates like np.maximum / PyTorch
        best = x[top]
        pos = 0
        v = x[top + _U1]
        if v > best or v != v:
            best = v
            pos = 1
        v = x[bottom]
        if v > best or v != v:
            best = v
            pos = 2
        v = x[bottom + _U1]
        if v > best or v != v:
            best = v
            pos = 3
        out[i] = best
        argmax[i] = int8(pos)
        i = uint32(i + step)


@functools.cache
def _maxpool_backward_atomic_kernel(masked: bool):
    @jit
    def maxpool_backward_atomic_kernel(dy, argmax, dx, mask, h, w):
        """dy, argmax flat (N*C*Ho*Wo); dx, mask flat (N*C*H*W), dx zeroed beforehand."""
        ho = uint32(h >> _U1)
        wo = uint32(w >> _U1)
        n = uint32(dy.shape[0])
        i = uint32(cuda.grid(1))
        step = uint32(cuda.gridsize(1))
        while i < n:
            pos = uint32(argmax[i])
            if pos < uint32(4):  # a corrupt argmax (e.g. an unwritten -1) must not write out of bounds
                q = uint32(i // wo)
                oj = uint32(i - q * wo)
                nc = uint32(q // ho)
                oi = uint32(q - nc * ho)
                at = uint32((nc * h + oi * _U2 + (pos >> _U1)) * w + oj * _U2 + (pos & _U1))
                if not masked or mask[at] > float32(0.0):
                    cuda.atomic.add(dx, at, dy[i])
            i = uint32(i + step)

    return maxpool_backward_atomic_kernel


@functools.cache
def _maxpool_backward_gather_kernel(masked: bool):
    @jit
    def maxpool_backward_gather_kernel(dy, argmax, dx, mask, h, w):
        """dy, argmax flat (N*C*Ho*Wo); dx, mask flat (N*C*H*W); every dx element written."""
        ho = uint32(h >> _U1)
        wo = uint32(w >> _U1)
        n = uint32(dx.shape[0])
        i = uint32(cuda.grid(1))
        step = uint32(cuda.gridsize(1))
        while i < n:
            q = uint32(i // w)
            col = uint32(i - q * w)
            nc = uint32(q // h)
            row = uint32(q - nc * h)
            oi = uint32(row >> _U1)
            oj = uint32(col >> _U1)
            v = float32(0.0)
            if oi < ho and oj < wo:  # else the dropped odd row/column: no window, zero gradient
                o = uint32((nc * ho + oi) * wo + oj)
                if uint32(argmax[o]) == uint32((row & _U1) * _U2 + (col & _U1)):
                    v = dy[o]
            if masked and not mask[i] > float32(0.0):
                v = float32(0.0)
            dx[i] = v
            i = uint32(i + step)

    return maxpool_backward_gather_kernel


@jit
def _upsample_forward_kernel(x, out, h, w):
    """x flat (N*C*H*W), out flat (N*C*2H*2W); h, w uint32 (the input's H and W)."""
    oh = uint32(h * _U2)
    ow = uint32(w * _U2)
    n = uint32(out.shape[0])
    i = uint32(cuda.grid(1))
    step = uint32(cuda.gridsize(1))
    while i < n:
        q = uint32(i // ow)
        col = uint32(i - q * ow)
        nc = uint32(q // oh)
        row = uint32(q - nc * oh)
        out[i] = x[uint32((nc * h + (row >> _U1)) * w + (col >> _U1))]
        i = uint32(i + step)


@functools.cache
def _upsample_backward_kernel(masked: bool):
    @jit
    def upsample_backward_kernel(dy, dx, mask, h, w):
        """dy flat (N*C*2H*2W); dx, mask flat (N*C*H*W); h, w uint32 (dx's H and W)."""
        ow = uint32(w * _U2)
        n = uint32(dx.shape[0])
        i = uint32(cuda.grid(1))
        step = uint32(cuda.gridsize(1))
        while i < n:
            q = uint32(i // w)
            col = uint32(i - q * w)  # q = n*C*H + c*H + row: dy's rows 2*q and 2*q + 1
            top = uint32(q * _U2 * ow + col * _U2)
            bottom = uint32(top + ow)
            v = (dy[top] + dy[top + _U1]) + (dy[bottom] + dy[bottom + _U1])
            if masked and not mask[i] > float32(0.0):
                v = float32(0.0)
            dx[i] = v
            i = uint32(i + step)

    return upsample_backward_kernel


# --------------------------------------------------------------------------------------------- checks
def _device_array(op: str, name: str, a, ndim: int | None = 4, dtype=np.float32):
    check_device_array(op, name, a, ndim, dtype)
    if not a.is_c_contiguous():
        raise ValueError(
            f"{op}: {name} must be C-contiguous (read as a flat array), got a strided view of shape {tuple(a.shape)}")
    if a.size > _MAX_ELEMENTS:
        raise ValueError(
            f"{op}: {name} {tuple(a.shape)} has {a.size} elements; the uint32 indices allow at most {_MAX_ELEMENTS}")
    return a


def _shape(a) -> tuple:
    return tuple(int(s) for s in a.shape)


_DUMMY_MASK = None


def _mask_arg(op: str, relu_mask, dx):
    """(masked, the flat mask or a cached 1-element dummy: an unmasked kernel never reads it)."""
    global _DUMMY_MASK
    if relu_mask is None:
        if _DUMMY_MASK is None:
            _DUMMY_MASK = cuda.to_device(np.zeros(1, np.float32))
        return False, _DUMMY_MASK
    _device_array(op, "relu_mask", relu_mask)
    if _shape(relu_mask) != _shape(dx):
        raise ValueError(f"{op}: relu_mask {_shape(relu_mask)} must have dx's shape {_shape(dx)}")
    return True, flat(relu_mask)


def _pool_backward_check(op: str, dy, argmax, dx, relu_mask):
    _device_array(op, "dy", dy)
    _device_array(op, "argmax", argmax, dtype=np.int8)
    _device_array(op, "dx", dx)
    n, c, h, w = _shape(dx)
    pooled = (n, c, h // 2, w // 2)
    if h < 2 or w < 2 or _shape(dy) != pooled or _shape(argmax) != pooled:
        raise ValueError(
            f"{op}: dy {_shape(dy)} and argmax {_shape(argmax)} must both be {pooled} for dx {(n, c, h, w)} "
            "(dx is the pool's input shape, H and W at least 2)"
        )
    return _mask_arg(op, relu_mask, dx), h, w


# --------------------------------------------------------------------------------------------- launchers
def maxpool2x2_forward_v1(x, out, argmax, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """out, argmax (N, C, H//2, W//2) = 2x2 max pool of x (N, C, H, W) and the winners' positions (int8)."""
    op = "maxpool2x2_forward_v1"
    block = check_block(op, block)
    _device_array(op, "x", x)
    _device_array(op, "out", out)
    _device_array(op, "argmax", argmax, dtype=np.int8)
    n, c, h, w = _shape(x)
    pooled = (n, c, h // 2, w // 2)
    if h < 2 or w < 2 or _shape(out) != pooled or _shape(argmax) != pooled:
        raise ValueError(
            f"{op}: out {_shape(out)} and argmax {_shape(argmax)} must both be {pooled} for x {_shape(x)} "
            "(H and W at least 2)"
        )
    args = (flat(x), flat(out), flat(argmax), np.uint32(h), np.uint32(w))
    return bind(_maxpool_forward_kernel, grid_for(out.size, block), block, args, stream, launch, op)


def maxpool2x2_backward_atomic(dy, argmax, dx, relu_mask=None, block: int = 256, stream=0,
                               launch: bool = True) -> LaunchGroup:
    """dx (N, C, H, W) = dy (N, C, H//2, W//2) routed to each window's winner: zero dx, then atomic adds."""
    op = "maxpool2x2_backward_atomic"
    block = check_block(op, block)
    (masked, mask), h, w = _pool_backward_check(op, dy, argmax, dx, relu_mask)
    kernel = _maxpool_backward_atomic_kernel(masked)
    args = (flat(dy), flat(argmax), flat(dx), mask, np.uint32(h), np.uint32(w))
    group = LaunchGroup([
        bind(_zero_kernel, grid_for(dx.size, block), block, (flat(dx),), stream, False, "zero"),
        bind(kernel, grid_for(dy.size, block), block, args, stream, False, op),
    ])
    if launch:
        group()
    return group


def maxpool2x2_backward_gather(dy, argmax, dx, relu_mask=None, block: int = 256, stream=0,
                               launch: bool = True) -> Launch:
    """dx (N, C, H, W) = dy (N, C, H//2, W//2) routed to each window's winner, one race-free pass."""
    op = "maxpool2x2_backward_gather"
    block = check_block(op, block)
    (masked, mask), h, w = _pool_backward_check(op, dy, argmax, dx, relu_mask)
    kernel = _maxpool_backward_gather_kernel(masked)
    args = (flat(dy), flat(argmax), flat(dx), mask, np.uint32(h), np.uint32(w))
    return bind(kernel, grid_for(dx.size, block), block, args, stream, launch, op)


def upsample2x_forward(x, out, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """out (N, C, 2H, 2W) = nearest-neighbour 2x upsampling of x (N, C, H, W)."""
    op = "upsample2x_forward"
    block = check_block(op, block)
    _device_array(op, "x", x)
    _device_array(op, "out", out)
    n, c, h, w = _shape(x)
    if _shape(out) != (n, c, 2 * h, 2 * w):
        raise ValueError(f"{op}: out {_shape(out)} must be {(n, c, 2 * h, 2 * w)} for x {_shape(x)}")
    args = (flat(x), flat(out), np.uint32(h), np.uint32(w))
    return bind(_upsample_forward_kernel, grid_for(out.size, block), block, args, stream, launch, op)


def upsample2x_backward(dy, dx, relu_mask=None, block: int = 256, stream=0, launch: bool = True) -> Launch:
    """dx (N, C, H, W) = sum of each 2x2 block of dy (N, C, 2H, 2W); dx = 0 where relu_mask <= 0."""
    op = "upsample2x_backward"
    block = check_block(op, block)
    _device_array(op, "dy", dy)
    _device_array(op, "dx", dx)
    n, c, h, w = _shape(dx)
    if _shape(dy) != (n, c, 2 * h, 2 * w):
        raise ValueError(f"{op}: dy {_shape(dy)} must be {(n, c, 2 * h, 2 * w)} for dx {_shape(dx)}")
    masked, mask = _mask_arg(op, relu_mask, dx)
    args = (flat(dy), flat(dx), mask, np.uint32(h), np.uint32(w))
    return bind(_upsample_backward_kernel(masked), grid_for(dx.size, block), block, args, stream, launch, op)


OPS = {
    "maxpool2x2_forward": {"v1": maxpool2x2_forward_v1},
    "maxpool2x2_backward": {"atomic": maxpool2x2_backward_atomic, "gather": maxpool2x2_backward_gather},
    "upsample2x_forward": {"v1": upsample2x_forward},
    "upsample2x_backward": {"v1": upsample2x_backward},
}


# --------------------------------------------------------------------------------------------- references
def _masked(dx: np.ndarray, relu_mask) -> np.ndarray:
    return dx if relu_mask is None else dx * (np.asarray(relu_mask) > 0)


def maxpool2x2_forward_ref(x):
    """(out float64, argmax int8) of gpunn.nn.functional.maxpool2x2_forward in float64."""
    return F.maxpool2x2_forward(np.asarray(x, np.float64))


def maxpool2x2_backward_ref(dy, argmax, x_shape, relu_mask=None) -> np.ndarray:
    return _masked(F.maxpool2x2_backward(np.asarray(dy, np.float64), argmax, x_shape), relu_mask)


def upsample2x_forward_ref(x) -> np.ndarray:
    return F.upsample2x_forward(np.asarray(x, np.float64))


def upsample2x_backward_ref(dy, relu_mask=None) -> np.ndarray:
    return _masked(F.upsample2x_backward(np.asarray(dy, np.float64)), relu_mask)
