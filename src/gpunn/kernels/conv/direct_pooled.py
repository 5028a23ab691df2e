"""Convolution + ReLU + 2x2 max pool fused, version ``direct``: the forward and the pooled input gradient of
``pooled`` (same arguments, same results) as direct convolutions from shared memory, for few channels (the CNN's
conv2, 16 -> 32 on 26x26), where the implicit GEMMs' im2col index arithmetic costs more than their FMAs.

One kernel for both passes. A thread owns a 2x2 quad of outputs (forward: one pooling window of the conv output;
input gradient: dx pixels (2qy + i, 2qx + j)) and COT output channels, 4*COT accumulators in registers. A block
owns up to `threads` quads of one image (flat, row-major) and one group of COT output channels. Per chunk of CIC
source channels it stages the band of source rows its quads read, in padded coordinates (zero outside), and the
chunk's weights as s_w[(cl*k*k + tap)*COT + c]; each thread then reads its (k+1)x(k+1) source window once per
channel into registers and does 4*k*k*COT FMAs against broadcast weight reads.

* forward: source x (N, Cin, H, W), padding p; the epilogue adds the bias, applies the ReLU, takes the window's
  max (first position on ties, NaN wins) and stores the pooled value and its route (ROUTE_NONE where not > 0).
* input gradient: source the conv output's gradient expanded from dpool through the route while staging (zero
  outside the even part (2*PH, 2*PW)), padded by k-1-p, weights transposed and flipped; ``relu_mask`` zeroes dx
  where the previous layer's output is <= 0.

Limits (``direct_fits``; the launchers raise ValueError outside them, callers fall back to ``pooled``'s GEMMs):
odd k <= MAX_K, 0 <= padding <= k // 2, one channel's band (plus its weights) within SMEM_LIMIT. Deterministic:
each output is one thread's fixed-order sum. References: ``pooled.conv_relu_pool_forward_ref`` and
``pooled_grad_ref``. Measurements: NOTES.md.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int8, int32, uint32

from ..common import cdiv, epilogue_args, epilogue_flags, shape
from ..gemm.indexing import SMEM_ALIGN
from ..gemm.mappings import ROUTE_NONE, window_epilogue
from ..launch import Launch, bind, check_device_array, flat
from .checks import MAX_GRID_YZ, SMEM_LIMIT, U0, U1, WARP, jit_for
from .implicit_gemm import _activation, _expect, _geometry
from .pooled import _dgrad_checks, _pooled_pair, _pooled_shape

__all__ = ["COT", "CI_CHUNK", "MAX_K", "MAX_THREADS", "conv_backward_data_pool_direct", "conv_forward_pool_direct",
           "direct_fits"]

COT = 8  # output channels per thread (fewer where the output has fewer: a power of two covering them) ...
COT_WIDE = 16  # ... and this many for a wide output from a shallow source (a first layer: the autoencoder's
WIDE_MIN_OUT = 128  # 3 -> 256 forward on an H200, batch 64: 0.0523 -> 0.0495 ms; the CNN's 16 -> 32 keeps 8:
SHALLOW_MAX_K = 32  # 0.0226 against 16's 0.0283): at least WIDE_MIN_OUT outputs, src_ch * k * k <= SHALLOW_MAX_K
CI_CHUNK = 8  # source channels staged per barrier pair where not all fit in shared memory (fewer if 8 do not)
MAX_K = 7  # the (k+1)^2 source window and 4*COT accumulators stay in registers
STAGE_UNROLL = 8  # loads in flight per thread while staging (the staging is latency-bound: few warps per SM)
MAX_WIDTH = 1024  # band columns (2 * quads per row + k - 1): a thread per column while staging
MAX_THREADS = 256  # quads per block: the image's quads rounded up to a warp, at most this many
F0 = float32(0.0)
_U2 = np.uint32(2)
_U3 = np.uint32(3)
_NONE = np.uint32(ROUTE_NONE)


def _pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def _layout(qh, qw, k, threads=None):
    """(threads, band rows, band width) of a quad grid qh x qw: threads = the quads rounded up to a warp (at most
    MAX_THREADS), the band the padded source rows a block's quads read (at most 2 * quad rows + k - 1)."""
    quads, width = qh * qw, 2 * qw + k - 1
    if threads is None:  # (a thread per band column while staging: at least `width` threads)
        threads = cdiv(max(min(MAX_THREADS, quads), width), WARP) * WARP
    rows = 2 * min(qh, (threads - 1) // qw + 2) + k - 1
    return threads, rows, width


def _chunk(src_ch, cot, k, band, cic=None):
    """Source channels per stage (0 if not one fits in SMEM_LIMIT with its weights): `cic` if given, else all of
    them where they fit (one barrier pair), else up to CI_CHUNK."""
    def fits(c):
        return 4 * c * (band + k * k * cot) <= SMEM_LIMIT

    if cic is None and fits(src_ch):
        return src_ch
    for c in range(min(cic or CI_CHUNK, src_ch), 0, -1):
        if fits(c):
            return c
    return 0


def _unroll(rows, step):
    """Loads in flight per staging pass for `rows` rows (of cells) taken `step` at a time: at most STAGE_UNROLL, as
    few as keep the same number of passes (no mostly idle last pass)."""
    per_thread = cdiv(rows, step)
    return cdiv(per_thread, cdiv(per_thread, STAGE_UNROLL))


def _plan(src_ch, out_ch, qh, qw, k, padding, cot=None, cic=None, threads=None):
    """(threads, rows, width, cot, cic) of a pass, or a string saying which limit it breaks."""
    if k % 2 == 0 or k > MAX_K:
        return f"the kernel size k = {k} must be odd and at most {MAX_K}"
    if not 0 <= padding <= k // 2:
        return f"padding {padding} must be between 0 and k // 2 = {k // 2}"
    wide = out_ch >= WIDE_MIN_OUT and src_ch * k * k <= SHALLOW_MAX_K
    cot = cot or (COT_WIDE if wide else min(COT, _pow2(out_ch)))
    threads, rows, width = _layout(qh, qw, k, threads)
    if width > min(threads, MAX_WIDTH):
        return f"a band {width} wide needs at least that many threads, at most {MAX_WIDTH}"
    cic = _chunk(src_ch, cot, k, rows * width, cic)
    if cic == 0:
        return (f"a band of {rows} x {width} source values ({4 * rows * width} bytes a channel) does not fit in "
                f"{SMEM_LIMIT} bytes of shared memory")
    return threads, rows, width, cot, cic


def direct_fits(in_channels, out_channels, k, padding, h, w) -> bool:
    """Whether both direct passes run a Conv2d in_channels -> out_channels (k x k, padding) + ReLU + MaxPool2d(2)
    on an h x w input (else the ``pooled`` GEMM versions)."""
    oh, ow = h + 2 * padding - k + 1, w + 2 * padding - k + 1
    if oh < 2 or ow < 2:
        return False
    fwd = _plan(in_channels, out_channels, oh // 2, ow // 2, k, padding)
    bwd = _plan(out_channels, in_channels, cdiv(h, 2), cdiv(w, 2), k, padding)
    return not isinstance(fwd, str) and not isinstance(bwd, str)


@functools.cache
def _kernel(dgrad, k, off, cic, cot, threads, rows, width, epilogue, su=STAGE_UNROLL):
    has_bias, relu, mask = epilogue_flags(epilogue)
    pool = window_epilogue(has_bias, relu)
    kk = k * k
    k1 = k + 1
    sin_rows = cic * rows  # shared shapes: plain ints, closure constants
    sw_rows = cic * kk
    sw_n = sw_rows * cot
    acc_n = 4 * cot
    win_n = k1 * k1
    T = np.uint32(threads)
    QW = np.uint32((width - k + 1) // 2)
    SW = np.uint32(width)
    ROWS = np.uint32(rows)
    OFF = np.uint32(off)
    K = np.uint32(k)
    KM1 = np.uint32(k - 1)
    KK = np.uint32(kk)
    CIC = np.uint32(cic)
    UCOT = np.uint32(cot)
    SW_N = np.uint32(sw_n)
    SU_T = np.uint32(su * threads)
    ncc = width // 2 + 1  # the input gradient stages pooled cells: ncr x ncc per channel cover its band
    ncr = rows // 2 + 1
    crs = threads // ncc  # rows of cells (rows of the band) a block's threads stage at once
    rps = threads // width
    NCC = np.uint32(ncc)
    NCR = np.uint32(ncr)
    CELL_ROWS = np.uint32(cic * ncr)
    SIN_ROWS = np.uint32(sin_rows)
    SU_CRS = np.uint32(su * crs)
    SU_RPS = np.uint32(su * rps)
    PX_LO = np.uint32(((0 - off) >> 1) % 2**32)  # floor(-off / 2), wrapped
    CELL_C0 = np.uint32((((0 - off) >> 1) * 2 + off) % 2**32)  # its first band column: 0 or -1, wrapped
    IOFF = np.int32(off)
    I1 = np.int32(1)

    @jit_for(threads)
    def conv_pool_direct_kernel(src, route, w, aux, out, src1, route1, aux1):
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        s_in = cuda.shared.array((sin_rows, width), float32, alignment=SMEM_ALIGN)
        s_w = cuda.shared.array((sw_rows, cot), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(acc_n, float32)
        win = cuda.local.array(win_n, float32)
        t = uint32(cuda.threadIdx.x)
        n = uint32(cuda.blockIdx.z)
        co0 = uint32(uint32(cuda.blockIdx.y) * UCOT)
        src_ch = uint32(src.shape[1])
        out_ch = uint32(out.shape[1])
        if dgrad:  # the source: the conv output's even part (2*PH, 2*PW), read through the route
            sh = uint32(src.shape[2] * 2)
            sw = uint32(src.shape[3] * 2)
            qh = uint32((out.shape[2] + 1) // 2)
        else:
            sh = uint32(src.shape[2])
            sw = uint32(src.shape[3])
            qh = uint32(out.shape[2])
        q0 = uint32(uint32(cuda.blockIdx.x) * T)
        r0 = uint32(q0 // QW)
        q = uint32(q0 + t)
        live = q < qh * QW
        qy = uint32(q // QW)
        qx = uint32(q - qy * QW)
        my_row = U0  # the thread's source window: rows my_row + a (+ the channel's band), columns my_col + b
        my_col = U0
        if live:
            my_row = uint32(uint32(qy - r0) * _U2)
            my_col = uint32(qx * _U2)
        row0 = uint32(r0 * _U2)  # the band's first padded source row
        # staging: the thread's column s_c (of cells: scb, scb + 1) and first row s_r0 (a row of cells)
        if dgrad:  # the pooled cells covering the band: rows from py_lo, columns from PX_LO (floor((0 - off) / 2))
            ph = uint32(src.shape[2])
            pw = uint32(src.shape[3])
            py_lo = uint32(int32(int32(row0) - IOFF) >> I1)  # (wrapped when negative)
            cell_r0 = uint32(uint32(py_lo * _U2 + OFF) - row0)  # the first cell's first band row: 0 or -1 (wrapped)
            s_r0 = uint32(t // NCC)
            cc = uint32(t - s_r0 * NCC)
            px = uint32(PX_LO + cc)
            s_live = s_r0 < crs  # every cell of the cover writes its 2x2 positions (zeros outside the map)
            px_ok = s_live and px < pw
            spx = px if px_ok else U0
            scb = uint32(uint32(cc * _U2) + CELL_C0)
            c_ok0 = scb < SW
            c_ok1 = uint32(scb + U1) < SW
        else:
            s_r0 = uint32(t // SW)
            s_c = uint32(t - s_r0 * SW)
            s_live = s_r0 < rps
            sx = uint32(s_c - OFF)
            s_cok = s_live and sx < sw
        vals = cuda.local.array(su, float32)
        rts = cuda.local.array(su, uint32)
        keep = cuda.local.array(acc_n, float32)  # the input gradient's ReLU mask at its outputs
        for i in range(acc_n):
            acc[i] = F0

        ci0 = U0
        while ci0 < src_ch:
            # ---- the band of the chunk's source planes in padded coordinates, zero outside. A thread keeps one
            # column (of cells, for the input gradient) and steps over rows; SU loads in flight. 32-bit unsigned
            # arithmetic throughout (a coordinate below 0 wraps to a huge value and fails its `< size` test).
            nc0 = uint32(n * src_ch + ci0)
            if dgrad:  # per pooled cell (py, px): its value and route, stored as the 2x2 cell of the expanded dy
                srow = s_r0
                while srow < CELL_ROWS:
                    for u in range(su):
                        s = uint32(srow + uint32(u * crs))
                        cl = uint32(s // NCR)
                        py = uint32(py_lo + uint32(s - uint32(cl * NCR)))
                        v = F0
                        rt = _NONE
                        if px_ok and s < CELL_ROWS and uint32(ci0 + cl) < src_ch and py < ph:
                            at = uint32(uint32(uint32(uint32(nc0 + cl) * ph) + py) * pw + spx)
                            v = src1[at]
                            rt = uint32(route1[at])
                        vals[u] = v
                        rts[u] = rt
                    for u in range(su):
                        s = uint32(srow + uint32(u * crs))
                        if s_live and s < CELL_ROWS:
                            cl = uint32(s // NCR)
                            rb = uint32(uint32(uint32(s - uint32(cl * NCR)) * _U2) + cell_r0)  # the cell's first row
                            row = uint32(uint32(cl * ROWS) + rb)
                            v = vals[u]
                            rt = rts[u]
                            if rb < ROWS:
                                if c_ok0:
                                    s_in[row, scb] = v if rt == U0 else F0
                                if c_ok1:
                                    s_in[row, uint32(scb + U1)] = v if rt == U1 else F0
                            if uint32(rb + U1) < ROWS:
                                if c_ok0:
                                    s_in[uint32(row + U1), scb] = v if rt == _U2 else F0
                                if c_ok1:
                                    s_in[uint32(row + U1), uint32(scb + U1)] = v if rt == _U3 else F0
                    srow = uint32(srow + SU_CRS)
            else:
                srow = s_r0
                while srow < SIN_ROWS:
                    for u in range(su):
                        s = uint32(srow + uint32(u * rps))
                        cl = uint32(s // ROWS)
                        y = uint32(uint32(row0 + uint32(s - uint32(cl * ROWS))) - OFF)  # the source row
                        v = F0
                        if s_cok and s < SIN_ROWS and uint32(ci0 + cl) < src_ch and y < sh:
                            v = src1[uint32(uint32(uint32(uint32(nc0 + cl) * sh) + y) * sw + sx)]
                        vals[u] = v
                    for u in range(su):
                        s = uint32(srow + uint32(u * rps))
                        if s_live and s < SIN_ROWS:
                            s_in[s, s_c] = vals[u]
                    srow = uint32(srow + SU_RPS)
            # ---- the chunk's weights for the block's channels: s_w[cl*kk + tap, c], zero past the ends
            base = t
            while base < SW_N:
                for u in range(su):
                    idx = uint32(base + uint32(u * threads))
                    c = uint32(idx % UCOT)
                    wrow = uint32(idx // UCOT)  # = cl * kk + tap
                    cl = uint32(wrow // KK)
                    tap = uint32(wrow - cl * KK)
                    co = uint32(co0 + c)
                    ci = uint32(ci0 + cl)
                    kh = uint32(tap // K)
                    kw = uint32(tap - kh * K)
                    v = F0
                    if idx < SW_N and co < out_ch and ci < src_ch:
                        if dgrad:  # w (Cout = the source's channels, Cin = dx's), flipped
                            v = w[ci, co, uint32(KM1 - kh), uint32(KM1 - kw)]
                        else:
                            v = w[co, ci, kh, kw]
                    vals[u] = v
                for u in range(su):
                    idx = uint32(base + uint32(u * threads))
                    if idx < SW_N:
                        s_w[uint32(idx // UCOT), uint32(idx % UCOT)] = vals[u]
                base = uint32(base + SU_T)
            cuda.syncthreads()

            cl = U0
            while cl < CIC:
                r_in = uint32(cl * ROWS + my_row)
                r_w = uint32(cl * KK)
                for a in range(k1):
                    for b in range(k1):
                        win[a * k1 + b] = s_in[uint32(r_in + uint32(a)), uint32(my_col + uint32(b))]
                for tap in range(kk):
                    kh = tap // k
                    kw = tap - kh * k
                    x00 = win[kh * k1 + kw]
                    x01 = win[kh * k1 + kw + 1]
                    x10 = win[(kh + 1) * k1 + kw]
                    x11 = win[(kh + 1) * k1 + kw + 1]
                    for c in range(cot):
                        wv = s_w[uint32(r_w + uint32(tap)), uint32(c)]
                        acc[4 * c] += x00 * wv
                        acc[4 * c + 1] += x01 * wv
                        acc[4 * c + 2] += x10 * wv
                        acc[4 * c + 3] += x11 * wv
                cl = uint32(cl + U1)
            cuda.syncthreads()
            ci0 = uint32(ci0 + CIC)

        if live and dgrad:  # dx's 2x2 pixels (the last row / column of an odd map dropped), masked
            oh = uint32(out.shape[2])
            ow = uint32(out.shape[3])
            y = uint32(qy * _U2)
            x = uint32(qx * _U2)
            x_ok = uint32(x + U1) < ow
            y_ok = uint32(y + U1) < oh
            if mask:  # every mask value loaded first: one round trip, not one per channel
                at = uint32(uint32(uint32(n * out_ch + co0) * oh + y) * ow + x)
                for c in range(cot):
                    if uint32(co0 + uint32(c)) < out_ch:
                        keep[4 * c] = aux1[at]
                        keep[4 * c + 1] = aux1[uint32(at + U1)] if x_ok else F0
                        keep[4 * c + 2] = aux1[uint32(at + ow)] if y_ok else F0
                        keep[4 * c + 3] = aux1[uint32(at + ow + U1)] if x_ok and y_ok else F0
                    at = uint32(at + oh * ow)
            for c in range(cot):
                co = uint32(co0 + uint32(c))
                if co < out_ch:
                    v0 = acc[4 * c]
                    v1 = acc[4 * c + 1]
                    v2 = acc[4 * c + 2]
                    v3 = acc[4 * c + 3]
                    if mask:
                        v0 = v0 if keep[4 * c] > F0 else F0
                        v1 = v1 if keep[4 * c + 1] > F0 else F0
                        v2 = v2 if keep[4 * c + 2] > F0 else F0
                        v3 = v3 if keep[4 * c + 3] > F0 else F0
                    out[n, co, y, x] = v0
                    if x_ok:
                        out[n, co, y, uint32(x + U1)] = v1
                    if y_ok:
                        out[n, co, uint32(y + U1), x] = v2
                        if x_ok:
                            out[n, co, uint32(y + U1), uint32(x + U1)] = v3
        if live and not dgrad:
            for c in range(cot):
                co = uint32(co0 + uint32(c))
                if co < out_ch:
                    best, pos = pool(aux, co, acc[4 * c], acc[4 * c + 1], acc[4 * c + 2], acc[4 * c + 3])
                    out[n, co, qy, qx] = best
                    route[n, co, qy, qx] = int8(pos)

    return conv_pool_direct_kernel


def _bind(op, dgrad, src, route, w, aux, out, k, padding, epilogue, quads, src_ch, out_ch, tuning, stream,
          launch):
    tuning = dict(tuning)
    su = tuning.pop("su", None)
    plan = _plan(src_ch, out_ch, *quads, k, padding, **tuning)
    if isinstance(plan, str):
        raise ValueError(f"{op}: {plan}; use the GEMM versions of gpunn.kernels.conv.pooled")
    threads, rows, width, cot, cic = plan
    if su is None:  # staged rows: the input gradient's rows of pooled cells, or the band's rows
        su = (_unroll(cic * (rows // 2 + 1), threads // (width // 2 + 1)) if dgrad
              else _unroll(cic * rows, threads // width))
    off = k - 1 - padding if dgrad else padding
    kernel = _kernel(dgrad, k, off, cic, cot, threads, rows, width, epilogue, su)
    n = shape(out)[0]
    grid = (cdiv(quads[0] * quads[1], threads), cdiv(out_ch, cot), n)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(f"{op}: grid {grid} (quad tiles, channel groups, images) exceeds {MAX_GRID_YZ} in y or z")
    return bind(kernel, grid, threads, (src, route, w, aux, out, flat(src), flat(route), flat(aux)), stream, launch,
                f"{op}[t{threads},cot{cot},cic{cic},k{k},p{padding},{epilogue}]")


def conv_forward_pool_direct(x, w, bias, out, route, padding, relu=True, stream=0, launch=True,
                             **tuning) -> Launch:
    """out, route (N, Cout, OH//2, OW//2) = maxpool2x2(ReLU(conv(x, w) + bias)) and its route, as
    ``pooled.conv_forward_pool_implicit_gemm``; x (N, Cin, H, W), w (Cout, Cin, k, k), bias (Cout,) or None.
    ``tuning``: cot, cic, threads, su (defaults: the module's rules)."""
    op = "conv_forward_pool_direct"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), w, padding)
    n, cin = shape(x)[:2]
    cout = int(w.shape[0])
    pooled = _pooled_shape(op, n, cout, oh, ow)
    _pooled_pair(op, "out", out, route, pooled)
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    epilogue, aux = epilogue_args(op, bias, relu, None)
    return _bind(op, False, x, route, w, aux, out, k, padding, epilogue, pooled[2:], cin, cout, tuning, stream,
                 launch)


def conv_backward_data_pool_direct(dpool, route, w, dx, padding, relu_mask=None, stream=0, launch=True,
                                   **tuning) -> Launch:
    """dx (N, Cin, H, W) = dL/dx of the fused forward given dpool and its route, as
    ``pooled.conv_backward_data_pool_implicit_gemm``; dx = 0 where ``relu_mask`` (dx's shape) <= 0."""
    op = "conv_backward_data_pool_direct"
    k = _dgrad_checks(op, dpool, route, w, dx, padding, relu_mask)[0]
    n, cin, h, wd = shape(dx)
    cout = int(w.shape[0])
    epilogue, aux = epilogue_args(op, None, False, relu_mask)
    return _bind(op, True, dpool, route, w, aux, dx, k, padding, epilogue, (cdiv(h, 2), cdiv(wd, 2)), cout, cin,
                 tuning, stream, launch)
