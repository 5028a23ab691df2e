"""Convolutions on a 2x nearest-upsampled input by the phase decomposition of the upsample, version ``phase``: a 3x3,
padding-1 conv with few output channels (Cout <= PHASE_MAX_COUT; the autoencoder's last layer, Upsample(2) then
256 -> 3), its forward and weight gradient computed on the small grid of x, where the implicit GEMMs' gathers from
the upsampled map cost more than their FMAs.

Output pixel (2i + a, 2j + b), a, b in {0, 1}: its 3x3 window on u = up(x) (padding 1) covers small rows
i + a + di - 1, di in {0, 1}, tap row kh on di = (kh + 1 - a) >> 1 (a = 0: kh 0 -> di 0, kh 1, 2 -> di 1; a = 1:
kh 0, 1 -> di 0, kh 2 -> di 1), columns likewise with b, dj, kw. So each of the four output phases (a, b) is a 2x2
convolution of x with its own summed taps (the forward: 16 x Cin FMAs per output channel and small pixel against
36 x Cin at the upsampled size), and with

    G[a, b][co, ci, di, dj] = sum over n, i, j of dy[n, co, 2i + a, 2j + b] * x[n, ci, i + a + di - 1, j + b + dj - 1]

(x zero outside), dw[co, ci, kh, kw] is the sum of the four G[a, b][co, ci, (kh + 1 - a) >> 1, (kw + 1 - b) >> 1].

Forward (``conv_forward_phase_up``): a block owns FWD_ROWS small rows of one image (grid (row bands, N)); a thread
owns one phase and a vertical pair of small pixels (i0, i0 + 1) in column j: its 3x2 window per channel, 2 x Cout
accumulators in registers. Per chunk of FWD_CIC channels the block stages the band (FWD_ROWS + 2 rows x W + 2
columns, zero outside x; a thread per column, FWD_UNROLL loads in flight) and the chunk's slice of the summed taps
ws[channel, phase, tap, co], made by a small launch before it (up to four taps of w each). Each output is one
thread's fixed-order sum.

Weight gradient (``conv_backward_weight_phase_up``): a block owns `group` input channels (ci0 = blockIdx.x * group)
and a split of the images (blockIdx.y). Per image it stages in shared memory its channels' small planes with a zero
halo (plane stride odd: the two channels a warp reads hit distinct banks) and the image's dy (Cout x 2H x 2W, rows
at the odd stride 2W + 1), loaded through registers one image ahead of the compute (the loads of image n + 1 in
flight while image n is summed). Thread t owns channel t // lanes and small rows lane, lane + lanes, ... (lanes =
block // group): it walks each row with a 3x3 register window of x (three new values per pixel) and adds the 4 *
Cout dy values of the pixel's 2x2 output block times the window into 16 * Cout accumulators (constant indices:
registers). At the end each block folds its sums into the 9 taps: per chunk of output channels the accumulators go
to shared memory and one thread per (channel, co, tap) adds its four G entries, each over the channel's lanes in
lane order, into
partials[split, (co * Cin + ci) * 9 + tap]; ``weight_grad.sum_partials`` adds the splits in order: deterministic.
Limits: ``phase_forward_fits``, ``phase_fits``. References: ``upsampled.conv_forward_up_ref``,
``conv_backward_weight_up_ref``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, epilogue_args, epilogue_flags, shape
from ..gemm import multiprocessors
from ..gemm.indexing import SMEM_ALIGN
from ..launch import LaunchGroup, bind, check_block, flat, grid_for
from .checks import SMEM_LIMIT, U0, U1, WARP, _padding, _weight, check_grid_y, check_splits, jit_for
from .checks import _geometry as _direct_geometry
from .implicit_gemm import _activation, forward_checks
from .upsampled import upsampled_shape
from .weight_grad import SIMULATOR_WGRAD_SPLITS, sum_partials, weight_grad_splits

__all__ = ["PHASE_BLOCK", "PHASE_GROUP", "PHASE_MAX_COUT", "conv_backward_weight_phase_up", "conv_forward_phase_up",
           "phase_fits", "phase_forward_fits", "phase_layout"]

PHASE_MAX_COUT = 4  # output channels: 16 * Cout accumulators per thread
PHASE_BLOCK = 256
PHASE_GROUP = 16  # input channels per block (lanes = PHASE_BLOCK // PHASE_GROUP threads per channel)
PHASE_MAX_PREFETCH = 64  # floats of the next image a thread holds in registers while staging
PHASE_BLOCKS_PER_SM = 2  # batch splits: about this many blocks per SM (whole images, at least one per split)
_U2 = np.uint32(2)


# ---------------------------------------------------------------------------------------------------- forward
FWD_ROWS = 4  # the forward's small rows per block: 2 x W threads per phase, 4 phases (the AE's W = 16: 128 threads)
FWD_CIC = 32  # the forward's channels staged per barrier pair (fewer where the band would not fit)
FWD_MAX_WIDTH = 64  # the forward's small columns: a block's 4 x (FWD_ROWS / 2) x W threads stay within 512
FWD_UNROLL = 8  # loads in flight per thread while staging (few warps per SM: the staging is latency-bound)
SUMMED_THREADS = 256
F0 = float32(0.0)


def _fwd_chunk(cin, cout, width):
    """Channels per stage: up to FWD_CIC, as many as fit in shared memory with their summed weights (0: none)."""
    per_channel = 4 * ((FWD_ROWS + 2) * (width + 2) + 16 * cout)
    return min(cin, FWD_CIC, SMEM_LIMIT // per_channel)


def phase_forward_fits(cin: int, cout: int, k: int, padding: int, height: int, width: int) -> bool:
    """Whether ``phase`` runs the forward of a Conv2d cin -> cout (k x k, padding) on a height x width upsampled
    map (the conv's input, as the other versions' limits take it: even sides): k = 3, padding 1, at most
    PHASE_MAX_COUT outputs, a small map at most FWD_MAX_WIDTH wide."""
    return (k == 3 and padding == 1 and 1 <= cout <= PHASE_MAX_COUT and height >= 2 and height % 2 == 0
            and width % 2 == 0 and 2 <= width <= 2 * FWD_MAX_WIDTH and _fwd_chunk(cin, cout, width // 2) >= 1)


@functools.cache
def _summed_kernel(cout):
    """ws[ci, phase, (di, dj), co] = the sum of w[co, ci, kh, kw] over the taps of phase (a, b) = (phase >> 1,
    phase & 1) falling on (di, dj): (kh + 1 - a) >> 1 = di, (kw + 1 - b) >> 1 = dj (module docstring)."""
    per_ci = np.uint32(16 * cout)
    per_phase = np.uint32(4 * cout)
    COUT = np.uint32(cout)

    @jit_for(SUMMED_THREADS)
    def summed_phase_kernel(w, ws, total):
        i = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        if i < total:
            ci = uint32(i // per_ci)
            rest = uint32(i - ci * per_ci)
            ph = uint32(rest // per_phase)
            rest = uint32(rest - ph * per_phase)
            tap = uint32(rest // COUT)
            co = uint32(rest - tap * COUT)
            pa = ph >> U1
            pb = ph & U1
            di = tap >> U1
            dj = tap & U1
            s = F0
            for kh in range(3):
                if uint32(uint32(kh) + U1 - pa) >> U1 == di:
                    for kw in range(3):
                        if uint32(uint32(kw) + U1 - pb) >> U1 == dj:
                            s += w[co, ci, kh, kw]
            ws[i] = s

    return summed_phase_kernel


@functools.cache
def _forward_kernel(cout, width, cic, epilogue):
    has_bias, relu, _ = epilogue_flags(epilogue)
    pairs = (FWD_ROWS // 2) * width  # thread slots per phase
    threads = cdiv(4 * pairs, WARP) * WARP
    band_rows, band_w = FWD_ROWS + 2, width + 2
    band_n = cic * band_rows * band_w
    sw_n = cic * 16 * cout
    acc_n = 2 * cout  # (array sizes: constants of the closure, not expressions in the kernel)
    lps = threads // band_w  # band lines (channel, row) staged per step: a thread per column
    T = np.uint32(threads)
    W = np.uint32(width)
    BW = np.uint32(band_w)
    BR = np.uint32(band_rows)
    BAND = np.uint32(band_rows * band_w)
    PAIRS = np.uint32(pairs)
    UROWS = np.uint32(FWD_ROWS)
    COUT = np.uint32(cout)
    SWC = np.uint32(16 * cout)  # summed weights per channel
    LPS = np.uint32(lps)
    SU_LPS = np.uint32(FWD_UNROLL * lps)
    SU_T = np.uint32(FWD_UNROLL * threads)

    @jit_for(threads)
    def conv_forward_phase_up_kernel(x, ws, bias, out):
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        s_in = cuda.shared.array(band_n, float32, alignment=SMEM_ALIGN)
        s_w = cuda.shared.array(sw_n, float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(acc_n, float32)
        win = cuda.local.array(6, float32)
        vals = cuda.local.array(FWD_UNROLL, float32)
        t = uint32(cuda.threadIdx.x)
        n = uint32(cuda.blockIdx.y)
        r0 = uint32(uint32(cuda.blockIdx.x) * UROWS)  # the band's first output (small) row; band row 0 = r0 - 1
        cin = uint32(x.shape[1])
        h = uint32(x.shape[2])
        phase = uint32(t // PAIRS)
        q = uint32(t - phase * PAIRS)
        live = phase < uint32(4)
        a = phase >> U1
        b = phase & U1
        pr = uint32(q // W)
        j = uint32(q - pr * W)
        i0 = uint32(r0 + pr * _U2)
        base = uint32(uint32(uint32(pr * _U2) + a) * BW + j + b)  # the window's first band cell (row, column)
        wbase = uint32(phase * uint32(4) * COUT)
        s_line = uint32(t // BW)  # staging: the thread's column of the band and first line
        s_col = uint32(t - s_line * BW)
        xc = uint32(s_col - U1)  # its x column (wraps at the left edge)
        col_ok = s_line < LPS and xc < W
        for e in range(acc_n):
            acc[e] = F0
        c0 = U0
        while c0 < cin:
            chunk = uint32(min(uint32(cic), uint32(cin - c0)))
            lines = uint32(chunk * BR)
            line0 = s_line
            while line0 < lines:  # the band, zero outside x: FWD_UNROLL loads in flight per thread
                for u in range(FWD_UNROLL):
                    line = uint32(line0 + uint32(u) * LPS)
                    cl = uint32(line // BR)
                    y = uint32(uint32(r0 + uint32(line - cl * BR)) - U1)  # wraps above h at the top edge
                    v = F0
                    if col_ok and line < lines and y < h:
                        v = x[n, uint32(c0 + cl), y, xc]
                    vals[u] = v
                for u in range(FWD_UNROLL):
                    line = uint32(line0 + uint32(u) * LPS)
                    if s_line < LPS and line < lines:
                        s_in[uint32(line * BW + s_col)] = vals[u]
                line0 = uint32(line0 + SU_LPS)
            n_w = uint32(chunk * SWC)
            w0 = uint32(c0 * SWC)
            i0w = t
            while i0w < n_w:  # the chunk's summed weights: one contiguous slice of ws
                for u in range(FWD_UNROLL):
                    i = uint32(i0w + uint32(u) * T)
                    vals[u] = ws[uint32(w0 + i)] if i < n_w else F0
                for u in range(FWD_UNROLL):
                    i = uint32(i0w + uint32(u) * T)
                    if i < n_w:
                        s_w[i] = vals[u]
                i0w = uint32(i0w + SU_T)
            cuda.syncthreads()
            if live:
                for cl in range(chunk):
                    at = uint32(uint32(cl) * BAND + base)
                    for r in range(3):
                        for c in range(2):
                            win[r * 2 + c] = s_in[at + uint32(r) * BW + uint32(c)]
                    wat = uint32(uint32(cl) * SWC + wbase)
                    for tap in range(4):
                        for co in range(cout):
                            wv = s_w[wat + uint32(tap * cout + co)]
                            acc[co] += win[tap] * wv  # rows 0-1 of the window: pixel i0
                            acc[cout + co] += win[2 + tap] * wv  # rows 1-2: pixel i0 + 1
            cuda.syncthreads()  # the next chunk overwrites the band
            c0 = uint32(c0 + uint32(cic))
        if live:
            for p in range(2):
                i = uint32(i0 + uint32(p))
                if i < h and i < uint32(r0 + UROWS):
                    oy = uint32(uint32(i * _U2) + a)
                    ox = uint32(uint32(j * _U2) + b)
                    for co in range(cout):
                        v = acc[p * cout + co]
                        if has_bias:
                            v += bias[co]
                        if relu and not v > F0:
                            v = F0
                        out[n, co, oy, ox] = v

    return conv_forward_phase_up_kernel, threads


def conv_forward_phase_up(x, w, bias, out, padding, relu=False, stream=0, launch=True) -> LaunchGroup:
    """out = conv(up(x), w) (+ bias) (ReLU): x (N, Cin, H, W), w (Cout, Cin, 3, 3), out (N, Cout, 2H, 2W), padding 1;
    two launches: the summed taps into a scratch buffer the group owns, then the convolution (module docstring)."""
    op = "conv_forward_phase_up"
    k = forward_checks(op, x, w, bias, out, padding, upsampled_shape(shape(x)))[0]
    n, cin, h, width = shape(x)
    cout = int(w.shape[0])
    if not phase_forward_fits(cin, cout, k, padding, 2 * h, 2 * width):
        raise ValueError(f"{op}: a {cin} -> {cout} conv (k {k}, padding {padding}) on the upsample of {h}x{width} "
                         f"maps needs k = 3, padding 1, Cout <= {PHASE_MAX_COUT} and W <= {FWD_MAX_WIDTH}; use the "
                         f"implicit GEMM")
    epilogue, aux = epilogue_args(op, bias, relu, None)
    kernel, threads = _forward_kernel(cout, width, _fwd_chunk(cin, cout, width), epilogue)
    summed = cuda.device_array(cin * 16 * cout, np.float32)  # the summed taps, made once per launch of the group
    group = LaunchGroup([
        bind(_summed_kernel(cout), cdiv(summed.size, SUMMED_THREADS), SUMMED_THREADS,
             (w, summed, np.uint32(summed.size)), stream, False, f"{op}.summed_taps"),
        bind(kernel, (cdiv(h, FWD_ROWS), n), threads, (x, summed, aux, out), stream, False,
             f"{op}[cout{cout},w{width},{epilogue}]"),
    ])
    if launch:
        group()
    return group


# -------------------------------------------------------------------------------------------- weight gradient
class PhaseLayout(NamedTuple):
    """The shared-memory plan of one block: `lanes` threads per channel; x planes of `x_plane` floats (rows of
    `x_row`), dy rows of `dy_row` floats at offset `dy_at`; `stage` floats staged per image, `shared` in all (the
    reduction reuses them); per thread `x_loads` and `dy_loads` prefetched values; `co_chunk` output channels per
    reduction round."""

    lanes: int
    x_row: int
    x_plane: int
    dy_row: int
    dy_at: int
    stage: int
    shared: int
    x_loads: int
    dy_loads: int
    co_chunk: int


def phase_layout(cout: int, height: int, width: int, block: int, group: int) -> PhaseLayout:
    """The plan for x planes of height x width (before the upsample), `block` threads and `group` channels."""
    lanes = max(1, block // group)
    x_row = width + 2
    x_plane = (height + 2) * x_row | 1
    dy_row = 2 * width + 1
    dy_at = group * x_plane
    stage = dy_at + cout * 2 * height * dy_row
    shared = max(stage, 16 * block)
    return PhaseLayout(lanes, x_row, x_plane, dy_row, dy_at, stage, shared, math.ceil(group * height * width / block),
                       math.ceil(cout * 4 * height * width / block), max(1, min(cout, shared // (16 * block))))


def _layout_fits(layout: PhaseLayout) -> bool:
    return 4 * layout.shared <= SMEM_LIMIT and layout.x_loads + layout.dy_loads <= PHASE_MAX_PREFETCH


def phase_fits(cin: int, cout: int, k: int, padding: int, height: int, width: int) -> bool:
    """Whether the phase weight gradient handles this layer with its default block and group: k = 3, padding 1,
    Cout <= PHASE_MAX_COUT, and its plan within shared memory and the prefetch registers. height, width: the conv's
    input size, i.e. the upsampled one (even), as every ``UP_VERSIONS`` applies= callback gets it."""
    if k != 3 or padding != 1 or cout > PHASE_MAX_COUT or height % 2 or width % 2:
        return False
    return _layout_fits(phase_layout(cout, height // 2, width // 2, PHASE_BLOCK, PHASE_GROUP))


@functools.cache
def _wgrad_phase(cout, height, width, threads, group):
    """The kernel for x planes of height x width (before the upsample), `cout` output channels."""
    lay = phase_layout(cout, height, width, threads, group)
    acc_n = 16 * cout
    x_loads, dy_loads, lanes, co_chunk = lay.x_loads, lay.dy_loads, lay.lanes, lay.co_chunk
    shared_n = lay.shared
    x_row, dy_row, dy_plane = lay.x_row, lay.dy_row, 2 * height * lay.dy_row
    T = np.uint32(threads)
    L = np.uint32(lanes)
    H, W = np.uint32(height), np.uint32(width)
    HW = np.uint32(height * width)
    XROW = np.uint32(lay.x_row)
    XPLANE = np.uint32(lay.x_plane)
    X_ZERO = np.uint32(group * lay.x_plane)
    X_INNER = np.uint32(lay.x_row + 1)  # the interior's first element in a plane
    DROW = np.uint32(lay.dy_row)
    DY_AT = np.uint32(lay.dy_at)
    OW = np.uint32(2 * width)
    DY_N = np.uint32(cout * 4 * height * width)
    GROUP = np.uint32(group)
    CHUNK9 = np.uint32(co_chunk * 9)
    ITEMS = np.uint32(group * co_chunk * 9)
    NINE = np.uint32(9)
    THREE = np.uint32(3)

    @jit_for(threads)
    def conv_wgrad_phase_up_kernel(x, dy, partials, n_img, cin, per):
        sm = cuda.shared.array(shared_n, float32)
        acc = cuda.local.array(acc_n, float32)
        win = cuda.local.array(9, float32)  # x rows i-1..i+1 (r) x columns j-1..j+1 (c) at r * 3 + c
        px = cuda.local.array(x_loads, float32)
        pd = cuda.local.array(dy_loads, float32)
        t = uint32(cuda.threadIdx.x)
        c = uint32(t // L)  # the thread's channel in the group, its lane
        lane = uint32(t - c * L)
        ci0 = uint32(cuda.blockIdx.x * GROUP)
        split = uint32(cuda.blockIdx.y)
        x_lim = uint32(min(GROUP, uint32(cin - ci0)) * HW)  # the group's staged x values (channels below Cin)
        active = ci0 + c < cin
        for j in range(acc_n):
            acc[j] = float32(0.0)
        i = t
        while i < X_ZERO:  # the halo (and the channels beyond Cin) stay zero
            sm[i] = float32(0.0)
            i = uint32(i + T)
        start = uint32(split * per)
        n_end = uint32(min(n_img, uint32(start + per)))
        m = start  # the image fetched into registers; m - 1 the one staged and summed
        while m <= n_end:
            if m > start:
                cuda.syncthreads()  # the previous image's sums are done with sm
                for u in range(x_loads):
                    i = uint32(t + uint32(u) * T)
                    if i < x_lim:
                        cc = uint32(i // HW)
                        rest = uint32(i - cc * HW)
                        sm[uint32(cc * XPLANE + rest + (rest // W) * _U2 + X_INNER)] = px[u]
                for u in range(dy_loads):
                    i = uint32(t + uint32(u) * T)
                    if i < DY_N:
                        sm[uint32(DY_AT + i + i // OW)] = pd[u]  # rows of OW values at the stride OW + 1
                cuda.syncthreads()
            if m < n_end:  # the next image's loads, in flight during the sums below
                x_base = uint32(m * cin * HW + ci0 * HW)
                for u in range(x_loads):
                    i = uint32(t + uint32(u) * T)
                    px[u] = x[x_base + i] if i < x_lim else float32(0.0)
                dy_base = uint32(m * DY_N)
                for u in range(dy_loads):
                    i = uint32(t + uint32(u) * T)
                    pd[u] = dy[dy_base + i] if i < DY_N else float32(0.0)
            if m > start and active:
                row = lane
                while row < H:
                    xb = uint32(c * XPLANE + row * XROW)  # padded row `row` = small row row - 1
                    db = uint32(DY_AT + uint32(row * _U2) * DROW)
                    for r in range(3):
                        win[r * 3] = sm[uint32(xb + uint32(r) * XROW)]
                        win[r * 3 + 1] = sm[uint32(xb + uint32(r) * XROW + U1)]
                    col = U0
                    while col < W:  # xb, db: the window's first column, the 2x2 output block's first element
                        # (constant offsets added as int64, folded into the loads' immediates, no 32-bit wraps)
                        for r in range(3):
                            win[r * 3 + 2] = sm[xb + (r * x_row + 2)]
                        for co in range(cout):
                            for a in range(2):
                                for b in range(2):
                                    d = sm[db + (co * dy_plane + a * dy_row + b)]
                                    for di in range(2):
                                        for dj in range(2):
                                            acc[co * 16 + (a * 2 + b) * 4 + di * 2 + dj] += (
                                                d * win[(a + di) * 3 + b + dj])
                        for r in range(3):
                            win[r * 3] = win[r * 3 + 1]
                            win[r * 3 + 1] = win[r * 3 + 2]
                        xb = uint32(xb + U1)
                        db = uint32(db + _U2)
                        col = uint32(col + U1)
                    row = uint32(row + L)
            m = uint32(m + U1)
        cuda.syncthreads()
        for co0 in range(0, cout, co_chunk):  # fold the G sums into the 9 taps, co_chunk output channels a round
            for j in range(16 * co_chunk):
                if co0 * 16 + j < acc_n:
                    sm[uint32(uint32(j) * T + t)] = acc[co0 * 16 + j]
            cuda.syncthreads()
            q = t
            while q < ITEMS:  # (channel, co, tap)
                cq = uint32(q // CHUNK9)
                rest = uint32(q - cq * CHUNK9)
                co_l = uint32(rest // NINE)
                tap = uint32(rest - co_l * NINE)
                co = uint32(co0 + co_l)
                if co < cout and ci0 + cq < cin:
                    kh = uint32(tap // THREE)
                    kw = uint32(tap - kh * THREE)
                    total = float32(0.0)
                    for a in range(2):
                        di = uint32(uint32(kh + U1 - uint32(a)) >> U1)
                        for b in range(2):
                            dj = uint32(uint32(kw + U1 - uint32(b)) >> U1)
                            g = uint32(co_l * uint32(16) + uint32(a * 8 + b * 4) + di * _U2 + dj)
                            at = uint32(g * T + cq * L)
                            for lane_ in range(lanes):
                                total += sm[uint32(at + uint32(lane_))]
                    partials[split, uint32(uint32(co * cin + ci0 + cq) * NINE + tap)] = total
                q = uint32(q + T)
            cuda.syncthreads()  # the next round overwrites sm

    return conv_wgrad_phase_up_kernel


def conv_backward_weight_phase_up(x, dy, dw, padding, block=PHASE_BLOCK, group=PHASE_GROUP, splits=None, stream=0,
                                  launch=True) -> LaunchGroup:
    """dw of out = conv(up(x), w) for k = 3, padding 1 and Cout <= PHASE_MAX_COUT by the phase decomposition
    (module docstring): x (N, Cin, H, W) and dy (N, Cout, 2H, 2W) C-contiguous, dw (Cout, Cin, 3, 3); `group` input
    channels per block of `block` threads (a multiple of it), `splits` batch splits (None: about
    PHASE_BLOCKS_PER_SM blocks per SM). A group of the block launch and the sum launch."""
    op = "conv_backward_weight_phase_up"
    padding = _padding(op, padding)
    cout, cin, k = _weight(op, "dw", dw)
    _activation(op, "x", x)
    _activation(op, "dy", dy)
    up = upsampled_shape(shape(x))
    _direct_geometry(op, "up(x)", up, "dy", shape(dy), (cout, cin, k), padding, w_name="dw")
    block = check_block(op, block)
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1 or block % group:
        raise ValueError(f"{op}: group must be a positive int dividing block {block}, got {group!r}")
    check_splits(op, splits)
    if k != 3 or padding != 1 or cout > PHASE_MAX_COUT:
        raise ValueError(f"{op}: needs k = 3, padding 1 and at most {PHASE_MAX_COUT} output channels, got k = {k}, "
                         f"padding {padding}, {cout} output channels; use another version")
    n, _, height, width = shape(x)
    layout = phase_layout(cout, height, width, block, int(group))
    if not _layout_fits(layout):
        raise ValueError(f"{op}: {group} channels of {height}x{width} planes and dy of {cout} channels per block of "
                         f"{block} threads exceed shared memory or the prefetch registers; use a smaller group")
    groups = math.ceil(cin / group)
    if splits is None:
        splits = (SIMULATOR_WGRAD_SPLITS if device.simulator_enabled()
                  else math.ceil(PHASE_BLOCKS_PER_SM * multiprocessors() / groups))
    splits, per = weight_grad_splits(n, groups, splits)
    check_grid_y(op, splits)
    kernel = _wgrad_phase(cout, height, width, block, int(group))
    partials = cuda.device_array((splits, cout * cin * 9), np.float32)  # the splits' partial sums
    launches = LaunchGroup([
        bind(kernel, (groups, splits), block, (flat(x), flat(dy), partials, *(np.uint32(v) for v in (n, cin, per))),
             stream, False, f"{op}[k3,p1,cout{cout},g{group},splits{splits}]"),
        bind(sum_partials(3), grid_for(cout * cin * 9, 256), 256, (partials, dw), stream, False, f"{op}.sum_partials"),
    ])
    if launch:
        launches()
    return launches
