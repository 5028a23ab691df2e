"""Weight and bias gradients of the fused conv + ReLU + 2x2 max pool stage by a direct convolution (version
``direct``): the input band in shared memory, the pooled gradient read through the route, no im2col arithmetic.

Block (band, split, group) takes pooled rows [band * rows, (band + 1) * rows) of images [split * per, (split + 1) *
per) and one group of output channels (``cout_block``: all of them where their gradient band fits, else as many
whole CO_T groups as do; the autoencoder's 3 -> 256 conv: 64 channels a block).
Per image it stages in shared memory the input rows that band's windows read (Cin x (2*rows + k - 1) x
(2*PW + k - 1), zero in the padding; channel planes at an odd stride: the 16 channels of a warp hit distinct
banks; STAGE_UNROLL loads in flight per thread) and the band's pooled gradient: per (output channel, window) d,
0 where the route is none, and the offset of the routed conv pixel (the route says which of the window's four
pixels got the gradient). A thread owns CO_T output channels x one input channel, i.e. CO_T * k*k weights and
the CO_T biases: per window and output channel it adds d * x over that pixel's k x k patch (k*k shared loads and
FMAs, not 4 k*k) and d to the bias, every operand in shared memory. Items beyond the block's DIRECT_THREADS
loop in passes (each restaging). Each block writes its slice of (splits, Cout, Cin*k*k + 1) partial sums (bias
last), added in a fixed order by ``wgrad_bias``'s sum launch: deterministic. Float64 references: as ``wgrad_bias``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import shape
from ..gemm import multiprocessors
from ..launch import LaunchGroup, bind, flat
from .checks import U0, U1, check_grid_y, check_splits, jit_for
from .implicit_gemm import _activation, _geometry
from .pooled import _pooled_pair, _pooled_shape
from .wgrad_bias import check_db, sum_launch

__all__ = ["CO_T", "DIRECT_SMEM", "DIRECT_THREADS", "conv_backward_weight_bias_pool_direct", "direct_layout"]

CO_T = 4  # output channels per thread (the default: a launch may ask for up to MAX_CO_T) ...
CO_T_GROUPS = 2  # ... and this many where the output channels take more than one block (the autoencoder's 3 -> 256)
MAX_CO_T = 8
DIRECT_THREADS = 128
DIRECT_SMEM = 6144  # floats of the staged input band (24 KiB)
GRAD_SMEM = 2048  # (channel, window) entries of the staged pooled gradient (8 + 8 KiB)
STAGE_UNROLL = 4  # loads in flight per thread while staging
DIRECT_ROWS = 2  # pooled rows per band (fewer where the band does not fit)
DIRECT_BLOCKS_PER_SM = 4  # image splits: about this many blocks per SM (whole images, at least one per split;
# bands x splits x channel groups. H200, batch 64, the autoencoder's 3 -> 256 (8 bands, 4 groups): per 4 images and
# CO_T_GROUPS 0.0961 ms, per 2 and CO_T 4 (bands x splits only, 3 a SM: stop 55's rule) 0.1031; the CNN's 16 -> 32
# keeps per 1 and CO_T 4, its fastest: docs/notes/issue-42/h200-s56/s56_probe.log)
_T = np.uint32(DIRECT_THREADS)
_UNROLL = np.uint32(STAGE_UNROLL)
_WARPS = np.uint32(DIRECT_THREADS // 32)
_U32 = np.uint32(32)
_U2 = np.uint32(2)
_U3 = np.uint32(3)
_U4 = np.uint32(4)


def _plane(rows, pw, k):
    """(rows, cols, stride) of one staged channel: the stride the next odd number >= rows * cols."""
    th, tw = 2 * rows + k - 1, 2 * pw + k - 1
    return th, tw, th * tw | 1


def direct_layout(cin, cout, ph, pw, k, rows=None, co_t=CO_T):
    """The pooled rows per band: ``rows`` (None: DIRECT_ROWS, fewer where the band does not fit), checked against
    DIRECT_SMEM (the input band) and GRAD_SMEM (one group of CO_T output channels' pooled gradient band: more
    channels go to blocks of their own, ``cout_block``); None where not even one row fits."""
    for r in ([rows] if rows is not None else range(min(DIRECT_ROWS, ph), 0, -1)):
        if cin * _plane(r, pw, k)[2] <= DIRECT_SMEM and co_t * min(r, ph) * pw <= GRAD_SMEM:
            return r
    return None


def cout_block(cout, ph, pw, rows, co_t=CO_T):
    """Output channels per block: all of them (rounded up to CO_T) where their gradient band fits GRAD_SMEM, else
    the most whole groups of CO_T that do (the rest on more blocks along the grid's z)."""
    cout4 = -(-cout // co_t) * co_t
    return min(cout4, GRAD_SMEM // (min(rows, ph) * pw) // co_t * co_t)


@functools.cache
def _kernel(k, pad, co_t=CO_T):
    KK = k * k
    ACC = co_t * KK
    UCT = np.uint32(co_t)
    UCT1 = np.uint32(co_t - 1)
    _K1 = np.uint32(k - 1)
    _KK = np.uint32(KK)
    P = np.uint32(pad)

    @jit_for(DIRECT_THREADS)
    def wgrad_pool_direct(x, dpool, route, partials, dims, rows, per, cob):
        # flat C-contiguous x (N, Cin, H, W), dpool and route (N, Cout, PH, PW); dims (N, Cin, H, W, Cout, PH, PW);
        # the block's output channels [co_lo, co_lo + cob) (z: their group)
        xs = cuda.shared.array(DIRECT_SMEM, float32)
        gs = cuda.shared.array(GRAD_SMEM, float32)
        os_ = cuda.shared.array(GRAD_SMEM, uint32)
        vals = cuda.local.array(STAGE_UNROLL, float32)
        dsts = cuda.local.array(STAGE_UNROLL, uint32)
        acc = cuda.local.array(ACC, float32)
        bacc = cuda.local.array(co_t, float32)
        n_img, cin, h, wd, cout, ph_n, pw_n = dims
        hw = uint32(h * wd)
        pp = uint32(ph_n * pw_n)
        t = uint32(cuda.threadIdx.x)
        lane = uint32(t % _U32)
        warp = uint32(t // _U32)
        ph0 = uint32(cuda.blockIdx.x * rows)
        bh = uint32(min(ph_n, uint32(ph0 + rows)) - ph0)  # pooled rows of this band
        th = uint32(bh * _U2 + _K1)  # staged rows and columns
        tw = uint32(pw_n * _U2 + _K1)
        stride = uint32(uint32(th * tw) | U1)
        nw = uint32(cin * _KK)
        row_len = uint32(nw + U1)
        z = uint32(cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x)
        out0 = uint32(z * cout * row_len)
        n0 = uint32(cuda.blockIdx.y * per)
        n1 = uint32(min(n_img, uint32(n0 + per)))
        co_lo = uint32(cuda.blockIdx.z * cob)
        co_n = uint32(min(cob, uint32(cout - co_lo)))  # this block's output channels
        cout4 = uint32(uint32(uint32(co_n + UCT1) // UCT) * UCT)
        bw = uint32(bh * pw_n)  # the band's windows
        items = uint32(uint32(cout4 // UCT) * cin)
        passes = uint32(uint32(items + _T - U1) // _T)
        p = U0
        while p < passes:
            item = uint32(p * _T + t)
            live = item < items
            cg = uint32(item // cin)
            ci = uint32(item - cg * cin)
            co0 = uint32(cg * UCT)
            for i in range(ACC):
                acc[i] = float32(0.0)
            for j in range(co_t):
                bacc[j] = float32(0.0)
            n = n0
            while n < n1:
                # stage the band of x: element e = (c, r, col) of Cin x th x tw, STAGE_UNROLL loads in flight
                tile = uint32(cin * th * tw)
                e0 = t
                while e0 < tile:
                    for u in range(STAGE_UNROLL):
                        e = uint32(e0 + uint32(u) * _T)
                        v = float32(0.0)
                        dst = U0
                        if e < tile:
                            c = uint32(e // uint32(th * tw))
                            rem = uint32(e - c * th * tw)
                            r = uint32(rem // tw)
                            col = uint32(rem - r * tw)
                            ih = uint32(uint32(ph0 * _U2 + r) - P)
                            iw = uint32(col - P)
                            if ih < h and iw < wd:
                                v = x[uint32(uint32(uint32(n * cin + c) * hw) + ih * wd + iw)]
                            dst = uint32(c * stride + rem)
                        vals[u] = v
                        dsts[u] = dst
                    for u in range(STAGE_UNROLL):
                        if uint32(e0 + uint32(u) * _T) < tile:
                            xs[dsts[u]] = vals[u]
                    e0 = uint32(e0 + _T * _UNROLL)
                # ... and of the pooled gradient: per (channel, window) d (0 where the route is none) and the offset
                # of the routed pixel in the band, channels padded to whole groups with zeros
                co = warp  # (the block's channel co_lo + co)
                while co < cout4:
                    gsrc = uint32(uint32(n * cout + co_lo + co) * pp + ph0 * pw_n)  # the band's windows: contiguous
                    w = lane
                    while w < bw:
                        d = float32(0.0)
                        off = U0
                        if co < co_n:
                            d = dpool[uint32(gsrc + w)]
                            sel = uint32(route[uint32(gsrc + w)])
                            if sel >= _U4:  # no gradient reached the conv (the ReLU or the pool)
                                d = float32(0.0)
                            else:
                                off = uint32((sel >> U1) * tw + (sel & U1))
                        gs[uint32(co * bw + w)] = d
                        os_[uint32(co * bw + w)] = off
                        w = uint32(w + _U32)
                    co = uint32(co + _WARPS)
                cuda.syncthreads()
                if live:
                    xbase = uint32(ci * stride)
                    q = U0
                    while q < bh:
                        pw = U0
                        while pw < pw_n:
                            wbase = uint32(xbase + q * _U2 * tw + pw * _U2)
                            gi = uint32(co0 * bw + q * pw_n + pw)
                            for j in range(co_t):
                                d = gs[uint32(gi + uint32(j) * bw)]
                                base = uint32(wbase + os_[uint32(gi + uint32(j) * bw)])
                                for kh in range(k):
                                    rb = uint32(base + uint32(kh) * tw)
                                    for kw in range(k):
                                        acc[j * KK + kh * k + kw] += d * xs[uint32(rb + uint32(kw))]
                                bacc[j] += d
                            pw = uint32(pw + U1)
                        q = uint32(q + U1)
                cuda.syncthreads()  # the next image overwrites the band
                n = uint32(n + U1)
            if live:
                for j in range(co_t):
                    co = uint32(co0 + uint32(j))
                    if co < co_n:
                        o = uint32(out0 + uint32(co_lo + co) * row_len)
                        for kk in range(KK):
                            partials[uint32(o + ci * _KK + uint32(kk))] = acc[j * KK + kk]
                        if ci == U0:
                            partials[uint32(o + nw)] = bacc[j]
            p = uint32(p + U1)

    return wgrad_pool_direct


def conv_backward_weight_bias_pool_direct(x, dpool, route, dw, db, padding, rows=None, per=None, co_t=None, stream=0,
                                          launch=True) -> LaunchGroup:
    """dw (Cout, Cin, k, k) and db (Cout,) (overwritten) of the fused conv + ReLU + pool given dpool and its route;
    x (N, Cin, H, W). ``rows``: pooled rows per band (None: ``direct_layout``); ``per``: images per block (None:
    about DIRECT_BLOCKS_PER_SM blocks per SM; 1 under the simulator); ``co_t``: output channels per thread (None:
    CO_T, or CO_T_GROUPS where the output channels take more than one block; at most MAX_CO_T). Two launches: the
    direct pass, the sum."""
    op = "conv_backward_weight_bias_pool_direct"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    n, cin, h, wd = shape(x)
    cout = int(dw.shape[0])
    check_db(op, db, cout)
    ph, pw = _pooled_shape(op, n, cout, oh, ow)[2:]
    d, r = _pooled_pair(op, "dpool", dpool, route, (n, cout, ph, pw))
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1):
        raise ValueError(f"{op}: rows must be a positive int or None, got {rows!r}")
    check_splits(op, per)
    if co_t is None:
        layout = direct_layout(cin, cout, ph, pw, k, rows)
        one_block = layout is None or cout_block(cout, ph, pw, layout) >= cout
        co_t = CO_T if one_block else CO_T_GROUPS
    if isinstance(co_t, bool) or not isinstance(co_t, (int, np.integer)) or not 1 <= co_t <= MAX_CO_T:
        raise ValueError(f"{op}: co_t must be an int in [1, {MAX_CO_T}] or None, got {co_t!r}")
    fitted = direct_layout(cin, cout, ph, pw, k, rows, int(co_t))
    if fitted is None:
        raise ValueError(f"{op}: {cin} input channels (or {cout} output channels) x {pw} pooled columns do not fit "
                         f"the {DIRECT_SMEM}-float staged band (or {GRAD_SMEM} gradient entries)"
                         f"{'' if rows is None else f' at {rows} rows'}; use fewer rows or "
                         f"conv_backward_weight_bias_pool (the GEMM)")
    bands = math.ceil(ph / fitted)
    cob = cout_block(cout, ph, pw, fitted, int(co_t))
    groups = math.ceil(cout / cob)
    check_grid_y(op, groups)
    if per is None:
        per = 1 if device.simulator_enabled() else max(1, math.ceil(n * bands * groups / (DIRECT_BLOCKS_PER_SM
                                                                                           * multiprocessors())))
    per = min(int(per), n)
    splits = math.ceil(n / per)
    check_grid_y(op, splits)
    total = bands * splits
    partials = cuda.to_device(np.full(total * cout * (cin * k * k + 1), np.nan, np.float32))  # NaN: unwritten
    group = LaunchGroup([
        bind(_kernel(k, int(padding), int(co_t)), (bands, splits, groups), DIRECT_THREADS,
             (flat(x), d, r, partials, tuple(np.uint32(v) for v in (n, cin, h, wd, cout, ph, pw)), np.uint32(fitted),
              np.uint32(per), np.uint32(cob)),
             stream, False, f"{op}[k{k},p{padding},rows{fitted},per{per},cob{cob},cot{co_t}]"),
        sum_launch(k, partials, dw, db, total, stream, f"{op}.sum[{total}]"),
    ])
    if launch:
        group()
    return group
