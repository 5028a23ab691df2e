"""Forward of a 3x3, padding-1 convolution on the 2x nearest upsample of x with few output channels, version
``phase``: a direct convolution on the small map (the autoencoder's last layer, 256 -> 3 on 16x16 -> 32x32), where
the implicit GEMM's gather from the upsampled map costs more than its FMAs.

Output pixel (2i + a, 2j + b) of conv(up(x), w) reads small rows i + a + di - 1 and columns j + b + dj - 1,
di, dj in {0, 1}, with the taps summed that fall on each: rows (a, di) -> kh in [di (1 + a), a + di (2 - a)], i.e.
a = 0: {0}, {1, 2}; a = 1: {0, 1}, {2} (columns alike with b, dj, kw). So each of the four output phases (a, b) is
a 2x2 convolution of x with its own summed weights: 16 x Cin FMAs per output channel and pixel pair against 36 x
Cin at the upsampled size, and no upsampled gather.

A block owns ROWS small rows of one image (grid (row bands, N)); a thread owns one phase and a vertical pair of
small pixels (i0, i0 + 1) in column j: its 3x2 window per channel, 2 x COUT accumulators in registers. Per chunk of
CIC channels the block stages the band (ROWS + 2 rows x W + 2 columns, zero outside x) and the chunk's summed
weights s_w[channel, phase, tap, co] (made while staging: up to four taps of w each). Deterministic: each output
is one thread's fixed-order sum. Limits: ``phase_fits``. Reference: ``upsampled.conv_forward_up_ref``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ..common import cdiv, epilogue_args, epilogue_flags, shape
from ..gemm.indexing import SMEM_ALIGN
from ..launch import Launch, bind
from .checks import SMEM_LIMIT, U0, U1, WARP, jit_for
from .implicit_gemm import forward_checks
from .upsampled import upsampled_shape

__all__ = ["PHASE_MAX_COUT", "conv_forward_phase_up", "phase_forward_fits"]

PHASE_MAX_COUT = 4  # output channels a thread accumulates (2 pixels x COUT registers)
ROWS = 4  # small rows per block: 2 x W threads per phase, 4 phases (the autoencoder's W = 16: 128 threads)
CIC = 32  # channels staged per barrier pair (fewer where the band would not fit)
MAX_WIDTH = 64  # small columns: a block's 4 x (ROWS / 2) x W threads stay within 512
F0 = float32(0.0)
_U2 = np.uint32(2)


def _chunk(cin, cout, width):
    """Channels per stage: up to CIC, as many as fit in shared memory with their summed weights (0: none)."""
    per_channel = 4 * ((ROWS + 2) * (width + 2) + 16 * cout)
    return min(cin, CIC, SMEM_LIMIT // per_channel)


def phase_forward_fits(cin: int, cout: int, k: int, padding: int, height: int, width: int) -> bool:
    """Whether ``phase`` runs the forward of a Conv2d cin -> cout (k x k, padding) on a height x width upsampled
    map (the conv's input, as the other versions' limits take it: even sides): k = 3, padding 1, at most
    PHASE_MAX_COUT outputs, a small map at most MAX_WIDTH wide."""
    return (k == 3 and padding == 1 and 1 <= cout <= PHASE_MAX_COUT and height >= 2 and height % 2 == 0
            and width % 2 == 0 and 2 <= width <= 2 * MAX_WIDTH and _chunk(cin, cout, width // 2) >= 1)


@functools.cache
def _kernel(cout, width, cic, epilogue):
    has_bias, relu, _ = epilogue_flags(epilogue)
    pairs = (ROWS // 2) * width  # thread slots per phase
    threads = cdiv(4 * pairs, WARP) * WARP
    band_rows, band_w = ROWS + 2, width + 2
    band_n = cic * band_rows * band_w
    sw_n = cic * 16 * cout
    T = np.uint32(threads)
    W = np.uint32(width)
    BW = np.uint32(band_w)
    BAND = np.uint32(band_rows * band_w)
    PAIRS = np.uint32(pairs)
    UROWS = np.uint32(ROWS)
    COUT = np.uint32(cout)
    SWC = np.uint32(16 * cout)  # summed weights per channel

    @jit_for(threads)
    def conv_forward_phase_up_kernel(x, w, bias, out):
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        s_in = cuda.shared.array(band_n, float32, alignment=SMEM_ALIGN)
        s_w = cuda.shared.array(sw_n, float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(2 * cout, float32)
        win = cuda.local.array(6, float32)
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
        for e in range(2 * cout):
            acc[e] = F0
        c0 = U0
        while c0 < cin:
            chunk = uint32(min(uint32(cic), uint32(cin - c0)))
            i = t
            while i < uint32(chunk * BAND):  # the band, zero outside x
                cl = uint32(i // BAND)
                rest = uint32(i - cl * BAND)
                row = uint32(rest // BW)
                col = uint32(rest - row * BW)
                y = uint32(uint32(r0 + row) - U1)  # wraps above h at the top edge
                xc = uint32(col - U1)
                v = F0
                if y < h and xc < W:
                    v = x[n, uint32(c0 + cl), y, xc]
                s_in[i] = v
                i = uint32(i + T)
            i = t
            while i < uint32(chunk * SWC):  # s_w[cl, phase, (di, dj), co]: the taps of w falling on each
                cl = uint32(i // SWC)
                rest = uint32(i - cl * SWC)
                ph = uint32(rest // uint32(4 * cout))
                rest = uint32(rest - ph * uint32(4 * cout))
                tap = uint32(rest // COUT)
                co = uint32(rest - tap * COUT)
                pa = ph >> U1
                pb = ph & U1
                di = tap >> U1
                dj = tap & U1
                s = F0
                for kh in range(uint32(di * uint32(U1 + pa)), uint32(uint32(pa + di * uint32(_U2 - pa)) + U1)):
                    for kw in range(uint32(dj * uint32(U1 + pb)), uint32(uint32(pb + dj * uint32(_U2 - pb)) + U1)):
                        s += w[co, uint32(c0 + cl), kh, kw]
                s_w[i] = s
                i = uint32(i + T)
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


def conv_forward_phase_up(x, w, bias, out, padding, relu=False, stream=0, launch=True) -> Launch:
    """out = conv(up(x), w) (+ bias) (ReLU): x (N, Cin, H, W), w (Cout, Cin, 3, 3), out (N, Cout, 2H, 2W), padding 1;
    one launch (module docstring)."""
    op = "conv_forward_phase_up"
    k = forward_checks(op, x, w, bias, out, padding, upsampled_shape(shape(x)))[0]
    n, cin, h, width = shape(x)
    cout = int(w.shape[0])
    if not phase_forward_fits(cin, cout, k, padding, 2 * h, 2 * width):
        raise ValueError(f"{op}: a {cin} -> {cout} conv (k {k}, padding {padding}) on the upsample of {h}x{width} "
                         f"maps needs k = 3, padding 1, Cout <= {PHASE_MAX_COUT} and W <= {MAX_WIDTH}; use the "
                         f"implicit GEMM")
    epilogue, aux = epilogue_args(op, bias, relu, None)
    kernel, threads = _kernel(cout, width, _chunk(cin, cout, width), epilogue)
    return bind(kernel, (cdiv(h, ROWS), n), threads, (x, w, aux, out), stream, launch,
                f"{op}[cout{cout},w{width},{epilogue}]")

