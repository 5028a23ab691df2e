"""Convolution version ``naive``, every pass: one thread per output element on a grid-stride 1-D grid (the papers'
naive CUDA kernels). The input gradient is gathered (no atomics); the weight gradient is one thread per weight
looping over n, oh, ow (deterministic; a row's terms four at a time, their loads before their adds, as nvcc would
unroll the loop: numba does not, and one load in flight made each term a memory round trip); the bias gradient one
thread per channel, on its own or (``with_bias``) in the weight gradient's launch, Cout threads after the
weights'."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import epilogue_args, epilogue_flags
from ..jit import jit
from ..launch import Launch, bind, check_block, grid_for
from .checks import (
    U0,
    U1,
    WARP,
    backward_data_args,
    backward_weight_args,
    bias_grad_args,
    forward_args,
)

U2, U3, U4 = np.uint32(2), np.uint32(3), np.uint32(4)

__all__ = ["conv_backward_data_naive", "conv_backward_weight_bias_naive", "conv_backward_weight_naive",
           "conv_bias_grad_naive", "conv_forward_naive"]


@functools.cache
def _forward_kernel(k, pad, epilogue):
    has_bias, relu, _ = epilogue_flags(epilogue)
    P = np.uint32(pad)

    @jit
    def conv_forward_naive_kernel(x, w, aux, out):
        cout = uint32(out.shape[1])
        oh_n = uint32(out.shape[2])
        ow_n = uint32(out.shape[3])
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        total = uint32(out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            # x fastest, so a warp reads x and writes out along rows
            ox = uint32(i % ow_n)
            rest = uint32(i // ow_n)
            oy = uint32(rest % oh_n)
            rest = uint32(rest // oh_n)
            co = uint32(rest % cout)
            n = uint32(rest // cout)
            acc = float32(0.0)
            ci = U0
            while ci < cin:
                for kh in range(k):
                    r = uint32(oy + uint32(kh))  # row in padded coordinates
                    if r >= P and r < h + P:
                        for kw in range(k):
                            c = uint32(ox + uint32(kw))
                            if c >= P and c < wd + P:
                                acc += x[n, ci, uint32(r - P), uint32(c - P)] * w[co, ci, kh, kw]
                ci = uint32(ci + U1)
            if has_bias:
                acc += aux[co]
            if relu and acc < float32(0.0):
                acc = float32(0.0)
            out[n, co, oy, ox] = acc
            i = uint32(i + stride)

    return conv_forward_naive_kernel


@functools.cache
def _backward_data_kernel(k, pad, epilogue):
    _, _, mask = epilogue_flags(epilogue)
    P = np.uint32(pad)

    @jit
    def conv_backward_data_naive_kernel(dy, w, aux, dx):
        cin = uint32(dx.shape[1])
        h = uint32(dx.shape[2])
        wd = uint32(dx.shape[3])
        cout = uint32(dy.shape[1])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        total = uint32(dx.shape[0] * dx.shape[1] * dx.shape[2] * dx.shape[3])
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            ix = uint32(i % wd)
            rest = uint32(i // wd)
            iy = uint32(rest % h)
            rest = uint32(rest // h)
            ci = uint32(rest % cin)
            n = uint32(rest // cin)
            acc = float32(0.0)
            masked = False
            if mask:
                masked = not aux[n, ci, iy, ix] > float32(0.0)
            if not masked:  # a masked element needs no sum
                # dx[iy, ix] gathers dy[oy, ox] * w[kh, kw] over oy = iy + p - kh in [0, OH)
                ry = uint32(iy + P)
                rx = uint32(ix + P)
                co = U0
                while co < cout:
                    for kh in range(k):
                        if ry >= uint32(kh) and uint32(ry - uint32(kh)) < oh_n:
                            oy = uint32(ry - uint32(kh))
                            for kw in range(k):
                                if rx >= uint32(kw) and uint32(rx - uint32(kw)) < ow_n:
                                    acc += dy[n, co, oy, uint32(rx - uint32(kw))] * w[co, ci, kh, kw]
                    co = uint32(co + U1)
            dx[n, ci, iy, ix] = acc
            i = uint32(i + stride)

    return conv_backward_data_naive_kernel


@cuda.jit(device=True)
def _bias_sum(dy, co):
    """The sum of dy[:, co] over images and positions, in order (a row's loads four at a time, as in the weights')."""
    acc = float32(0.0)
    ow_n = uint32(dy.shape[3])
    n = U0
    while n < uint32(dy.shape[0]):
        oy = U0
        while oy < uint32(dy.shape[2]):
            ox = U0
            while uint32(ox + U4) <= ow_n:
                a0 = dy[n, co, oy, ox]
                a1 = dy[n, co, oy, uint32(ox + U1)]
                a2 = dy[n, co, oy, uint32(ox + U2)]
                a3 = dy[n, co, oy, uint32(ox + U3)]
                acc += a0
                acc += a1
                acc += a2
                acc += a3
                ox = uint32(ox + U4)
            while ox < ow_n:
                acc += dy[n, co, oy, ox]
                ox = uint32(ox + U1)
            oy = uint32(oy + U1)
        n = uint32(n + U1)
    return acc


@cuda.jit(device=True)
def _warp_end(n):
    """n rounded up to a whole number of warps."""
    return uint32(uint32(n + uint32(WARP - 1)) // uint32(WARP) * uint32(WARP))


@functools.cache
def _backward_weight_kernel(k, pad, bias=False):
    """One thread per weight; with `bias`, Cout more threads each writing one db[co]: both gradients from one
    launch. The bias threads start at the next warp after the weights' (_warp_end), so that no warp runs both loops
    one after the other."""
    P = np.uint32(pad)
    K = np.uint32(k)

    @jit
    def conv_backward_weight_naive_kernel(x, dy, dw, db):
        n_img = uint32(x.shape[0])
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        wd = uint32(x.shape[3])
        oh_n = uint32(dy.shape[2])
        ow_n = uint32(dy.shape[3])
        nw = uint32(dw.shape[0] * dw.shape[1] * dw.shape[2] * dw.shape[3])
        first_bias = _warp_end(nw)
        total = uint32(first_bias + uint32(dw.shape[0])) if bias else nw
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while i < total:
            if bias and i >= nw:
                if i >= first_bias:
                    db[uint32(i - first_bias)] = _bias_sum(dy, uint32(i - first_bias))
                i = uint32(i + stride)
                continue
            kw = uint32(i % K)
            rest = uint32(i // K)
            kh = uint32(rest % K)
            rest = uint32(rest // K)
            ci = uint32(rest % cin)
            co = uint32(rest // cin)
            acc = float32(0.0)
            n = U0
            while n < n_img:
                oy = U0
                while oy < oh_n:
                    r = uint32(oy + kh)
                    if r >= P and r < h + P:
                        rx = uint32(r - P)
                        # the columns whose input c = ox + kw - P lies inside the image, in order
                        ox = uint32(P - kw) if kw < P else U0
                        end = uint32(wd + P - kw)
                        if end > ow_n:
                            end = ow_n
                        # four terms a round, their loads issued before their adds: the same terms in the same
                        # order as one at a time, with four loads in flight instead of one (as nvcc unrolls)
                        while uint32(ox + U4) <= end:
                            c = uint32(ox + kw - P)
                            a0 = dy[n, co, oy, ox]
                            a1 = dy[n, co, oy, uint32(ox + U1)]
                            a2 = dy[n, co, oy, uint32(ox + U2)]
                            a3 = dy[n, co, oy, uint32(ox + U3)]
                            b0 = x[n, ci, rx, c]
                            b1 = x[n, ci, rx, uint32(c + U1)]
                            b2 = x[n, ci, rx, uint32(c + U2)]
                            b3 = x[n, ci, rx, uint32(c + U3)]
                            acc += a0 * b0
                            acc += a1 * b1
                            acc += a2 * b2
                            acc += a3 * b3
                            ox = uint32(ox + U4)
                        while ox < end:
                            acc += dy[n, co, oy, ox] * x[n, ci, rx, uint32(ox + kw - P)]
                            ox = uint32(ox + U1)
                    oy = uint32(oy + U1)
                n = uint32(n + U1)
            dw[co, ci, kh, kw] = acc
            i = uint32(i + stride)

    return conv_backward_weight_naive_kernel


@jit
def _bias_grad_kernel(dy, db):
    cout = uint32(dy.shape[1])
    co = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
    while co < cout:
        db[co] = _bias_sum(dy, co)
        co = uint32(co + stride)


def conv_forward_naive(x, w, bias, out, padding, relu=False, block=256, stream=0, launch=True) -> Launch:
    """Naive forward: one thread per output element."""
    op = "conv_forward_naive"
    padding, (_, _, k) = forward_args(op, x, w, bias, out, padding)
    block = check_block(op, block)
    epilogue, aux = epilogue_args(op, bias, relu)
    kernel = _forward_kernel(k, padding, epilogue)
    return bind(kernel, grid_for(out.size, block), block, (x, w, aux, out), stream, launch,
                f"{op}[k{k},p{padding},{epilogue}]")


def conv_backward_data_naive(dy, w, dx, padding, relu_mask=None, block=256, stream=0, launch=True) -> Launch:
    """Naive backward-data (gather): one thread per dx element, no atomics."""
    op = "conv_backward_data_naive"
    padding, (_, _, k) = backward_data_args(op, dy, w, dx, padding, relu_mask)
    block = check_block(op, block)
    epilogue, aux = epilogue_args(op, relu_mask=relu_mask)
    kernel = _backward_data_kernel(k, padding, epilogue)
    return bind(kernel, grid_for(dx.size, block), block, (dy, w, aux, dx), stream, launch,
                f"{op}[k{k},p{padding},{epilogue}]")


def conv_backward_weight_naive(x, dy, dw, padding, block=256, stream=0, launch=True) -> Launch:
    """Naive weight gradient: one thread per weight element looping over n, oh, ow (deterministic)."""
    op = "conv_backward_weight_naive"
    padding, (_, _, k) = backward_weight_args(op, x, dy, dw, padding)
    block = check_block(op, block)
    kernel = _backward_weight_kernel(k, padding)
    db = dw[0, 0, 0, :1]  # the kernel's db, never read without the bias (a view: nothing allocated)
    return bind(kernel, grid_for(dw.size, block), block, (x, dy, dw, db), stream, launch, f"{op}[k{k},p{padding}]")


def conv_backward_weight_bias_naive(x, dy, dw, db, padding, block=256, stream=0, launch=True) -> Launch:
    """Naive weight and bias gradients in one launch: one thread per weight element and, from the next warp on, one
    per output channel (each summing dy over n, oh, ow), all deterministic."""
    op = "conv_backward_weight_bias_naive"
    padding, (_, _, k) = backward_weight_args(op, x, dy, dw, padding)
    bias_grad_args(op, dy, db)
    block = check_block(op, block)
    kernel = _backward_weight_kernel(k, padding, bias=True)
    threads = -(-dw.size // WARP) * WARP + db.size  # the bias threads from the next warp on
    return bind(kernel, grid_for(threads, block), block, (x, dy, dw, db), stream, launch, f"{op}[k{k},p{padding}]")


def conv_bias_grad_naive(dy, db, block=256, stream=0, launch=True) -> Launch:
    """Naive bias gradient: one thread per output channel."""
    op = "conv_bias_grad_naive"
    bias_grad_args(op, dy, db)
    block = check_block(op, block)
    return bind(_bias_grad_kernel, grid_for(db.shape[0], block), block, (dy, db), stream, launch, op)

