"""Convolution version ``tiled``, forward and input gradient: shared-memory input tiles with halo, COG output
channels per thread, bias + ReLU (forward) or the ReLU mask (input gradient) fused.

Block: T = TW * TH threads (1-D), thread t owns output pixel (oy0 + t // TW, ox0 + t % TW) of the block's tile
and the COG channels co0 .. co0 + COG - 1. Per chunk of CIC input channels the block stages
  s_in[cl, rr, cc] = in[n, ci0 + cl, oy0 + rr - off, ox0 + cc - off]  (rr < TH + k - 1, cc < TW + k - 1;
                      0 outside the image, off = the padding),
  s_w[c, cl, kh, kw] = the weight from input channel ci0 + cl to output channel co0 + c,
then each thread reads its k x k window once per input channel into registers and does k*k*COG FMAs with
warp-uniform (broadcast) weight reads. Napkin math at the autoencoder's 256->128 16x16 layer (k=3): per thread
and input channel 9 conflict-free ld.shared + 72 broadcast ld.shared for 72 FMA; the halo costs
(TH+2)(TW+2)/(TH*TW) = 1.4x the tile's loads at 32x8.

Input gradient: dx[n, ci, iy, ix] = sum_{co, kh, kw} dy[n, co, iy + p - kh, ix + p - kw] w[co, ci, kh, kw]
             = sum_{co, a, b} dy[n, co, iy + a - (k-1-p), ix + b - (k-1-p)] w[co, ci, k-1-a, k-1-b],
a forward convolution of dy with the transposed, flipped weight and offset k-1-p. That offset is negative when
p > k-1: the kernel's padded coordinate is then shifted by HI = -off instead (LO = 0).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv, epilogue_args, epilogue_flags, shape
from ..launch import Launch, bind
from .checks import (
    MAX_GRID_YZ,
    SMEM_LIMIT,
    U0,
    U1,
    WARP,
    backward_data_args,
    forward_args,
    jit_for,
)

__all__ = ["CI_CHUNK", "COG", "TILED_THREADS", "channel_group", "conv_backward_data_tiled", "conv_forward_tiled",
           "fitted_threads", "tile_shape"]

COG = 8  # output channels per thread (and per block): each staged input value feeds COG FMAs (fewer where the
# output has fewer channels: channel_group)
CI_CHUNK = 8  # input channels staged in shared memory per barrier pair (fewer if the tile would not fit)
MAX_TILE_W = 32  # tile width: a warp covers (at most) one 32-wide row of outputs, loads and stores coalesced
TILED_THREADS = 256  # the default block, unless the output plane is smaller (fitted_threads)


def tile_shape(block, out_width):
    """(TW, TH) of the tiled kernels for a block: an explicit (TW, TH) pair, or a thread count T, split into a
    tile as wide as the output rows need (a power of two, at most 32, dividing T) times T / TW rows."""
    if isinstance(block, (tuple, list)):
        if len(block) != 2 or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0
                                  for b in block):
            raise ValueError(f"block must be a thread count or (TW, TH), two positive ints, got {block!r}")
        return int(block[0]), int(block[1])
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block must be a thread count or (TW, TH), got {block!r}")
    threads = int(block)
    width = min(MAX_TILE_W, 1 << max(0, (int(out_width) - 1).bit_length()), threads & -threads)
    return width, threads // width


def fitted_threads(out_height: int, out_width: int) -> int:
    """The tiled kernels' default block: TILED_THREADS, or fewer where the output plane is smaller than that tile
    (a 6x6 output gets an 8x8 tile of 64 threads, not 256 threads of which 220 would idle); never under a warp."""
    def pow2(n):
        return 1 << max(0, (int(n) - 1).bit_length())

    return max(WARP, min(TILED_THREADS, pow2(min(out_width, MAX_TILE_W)) * pow2(out_height)))


def channel_group(out_ch: int) -> int:
    """Output channels per thread of the tiled kernels: COG, or the power of two covering out_ch when fewer
    (a 1-channel input gradient computes 1 channel, not 8 of which 7 are thrown away)."""
    return min(COG, 1 << max(0, (int(out_ch) - 1).bit_length()))


def _chunk(op, tw, th, k, in_ch, cog=COG):
    """Input channels per shared-memory stage: up to CI_CHUNK, as many as fit in SMEM_LIMIT."""
    region = (th + k - 1) * (tw + k - 1)
    for cic in range(min(CI_CHUNK, in_ch), 0, -1):
        if 4 * (cic * region + cog * cic * k * k) <= SMEM_LIMIT:
            return cic
    raise ValueError(f"{op}: a {tw}x{th} tile with its {k - 1} halo ({4 * region} bytes per channel) does not fit "
                     f"in {SMEM_LIMIT} bytes of shared memory; choose a smaller block")


@functools.cache
def _tiled(tw, th, k, off, cic, transposed, epilogue, cog=COG):
    has_bias, relu, mask = epilogue_flags(epilogue)
    threads = tw * th
    rh, rw = th + k - 1, tw + k - 1
    rhw = rh * rw
    kk_n = k * k
    sin_n = cic * rhw  # shared sizes: plain ints, closure constants
    sw_n = cog * cic * kk_n
    LO = np.uint32(max(off, 0))
    HI = np.uint32(max(-off, 0))
    TW = np.uint32(tw)
    TH = np.uint32(th)
    T = np.uint32(threads)
    RW = np.uint32(rw)
    RHW = np.uint32(rhw)
    K = np.uint32(k)
    KK = np.uint32(kk_n)
    CIC = np.uint32(cic)
    CWK = np.uint32(cic * kk_n)
    UCOG = np.uint32(cog)
    K1 = np.uint32(k - 1)

    @jit_for(threads)
    def conv_tiled_kernel(inp, w, aux, out):
        # Separate lines: the simulator aliases static shared arrays declared on one line.
        s_in = cuda.shared.array(sin_n, float32)
        s_w = cuda.shared.array(sw_n, float32)
        acc = cuda.local.array(cog, float32)
        win = cuda.local.array(kk_n, float32)
        in_ch = uint32(inp.shape[1])
        ih_n = uint32(inp.shape[2])
        iw_n = uint32(inp.shape[3])
        out_ch = uint32(out.shape[1])
        oh_n = uint32(out.shape[2])
        ow_n = uint32(out.shape[3])
        t = uint32(cuda.threadIdx.x)
        tx = uint32(t % TW)
        ty = uint32(t // TW)
        tiles_x = uint32((ow_n + TW - U1) // TW)
        ox0 = uint32(uint32(cuda.blockIdx.x) % tiles_x * TW)
        oy0 = uint32(uint32(cuda.blockIdx.x) // tiles_x * TH)
        co0 = uint32(uint32(cuda.blockIdx.y) * UCOG)
        n = uint32(cuda.blockIdx.z)
        oy = uint32(oy0 + ty)
        ox = uint32(ox0 + tx)
        for c in range(cog):
            acc[c] = float32(0.0)

        ci0 = U0
        while ci0 < in_ch:
            # ---- input tile + halo, zero outside the image (consecutive threads: consecutive columns)
            idx = t
            while idx < sin_n:
                cl = uint32(idx // RHW)
                rem = uint32(idx % RHW)
                r = uint32(oy0 + rem // RW + HI)  # padded coordinates
                c = uint32(ox0 + rem % RW + HI)
                ci = uint32(ci0 + cl)
                v = float32(0.0)
                if ci < in_ch and r >= LO and r < ih_n + LO and c >= LO and c < iw_n + LO:
                    v = inp[n, ci, uint32(r - LO), uint32(c - LO)]
                s_in[idx] = v
                idx = uint32(idx + T)
            # ---- the group's weights for this chunk, zero for channels past the end
            idx = t
            while idx < sw_n:
                co = uint32(co0 + idx // CWK)
                rem = uint32(idx % CWK)
                ci = uint32(ci0 + rem // KK)
                kk = uint32(rem % KK)
                v = float32(0.0)
                if co < out_ch and ci < in_ch:
                    if transposed:  # w is (forward Cout = in_ch, forward Cin = out_ch, k, k), flipped
                        v = w[ci, co, uint32(K1 - kk // K), uint32(K1 - kk % K)]
                    else:
                        v = w[co, ci, uint32(kk // K), uint32(kk % K)]
                s_w[idx] = v
                idx = uint32(idx + T)
            cuda.syncthreads()

            for cl in range(cic):
                base = uint32(uint32(cl) * RHW + ty * RW + tx)
                for kh in range(k):
                    for kw in range(k):
                        win[kh * k + kw] = s_in[uint32(base + uint32(kh) * RW + uint32(kw))]
                for c in range(cog):
                    wbase = uint32(uint32(c) * CWK + uint32(cl) * KK)
                    a = acc[c]
                    for j in range(kk_n):
                        a += win[j] * s_w[uint32(wbase + uint32(j))]
                    acc[c] = a
            cuda.syncthreads()
            ci0 = uint32(ci0 + CIC)

        if oy < oh_n and ox < ow_n:
            for c in range(cog):
                co = uint32(co0 + uint32(c))
                if co < out_ch:
                    v = acc[c]
                    if has_bias:
                        v += aux[co]
                    if relu and v < float32(0.0):
                        v = float32(0.0)
                    if mask and not aux[n, co, oy, ox] > float32(0.0):
                        v = float32(0.0)
                    out[n, co, oy, ox] = v

    return conv_tiled_kernel, threads


def _bind_tiled(op, inp, w, aux, out, k, off, transposed, epilogue, block, stream, launch):
    n, out_ch, oh, ow = shape(out)
    in_ch = shape(inp)[1]
    if block is None:
        block = fitted_threads(oh, ow)
    try:
        tw, th = tile_shape(block, ow)
    except ValueError as exc:
        raise ValueError(f"{op}: {exc}") from None
    device.check_block(op, tw * th)
    cog = channel_group(out_ch)
    cic = _chunk(op, tw, th, k, in_ch, cog)
    kernel, threads = _tiled(tw, th, k, off, cic, transposed, epilogue, cog)
    device.check_block(op, threads, kernel)
    grid = (cdiv(ow, tw) * cdiv(oh, th), cdiv(out_ch, cog), n)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(f"{op}: grid {grid} (tiles, channel groups, images) exceeds {MAX_GRID_YZ} in y or z")
    return bind(kernel, grid, threads, (inp, w, aux, out), stream, launch,
                f"{op}[{tw}x{th},k{k},off{off},{epilogue}]")


def conv_forward_tiled(x, w, bias, out, padding, relu=False, block=None, stream=0, launch=True) -> Launch:
    """Tiled forward (shared-memory input tile + halo, COG channels per thread), bias + ReLU fused.
    ``block``: threads (tile chosen by ``tile_shape``), an explicit (TW, TH) tile, or None: ``fitted_threads``."""
    op = "conv_forward_tiled"
    padding, (_, _, k) = forward_args(op, x, w, bias, out, padding)
    epilogue, aux = epilogue_args(op, bias, relu)
    return _bind_tiled(op, x, w, aux, out, k, padding, False, epilogue, block, stream, launch)


def conv_backward_data_tiled(dy, w, dx, padding, relu_mask=None, block=None, stream=0, launch=True) -> Launch:
    """Tiled backward-data: the tiled forward on dy with transposed, flipped weights; ReLU mask fused."""
    op = "conv_backward_data_tiled"
    padding, (_, _, k) = backward_data_args(op, dy, w, dx, padding, relu_mask)
    epilogue, aux = epilogue_args(op, relu_mask=relu_mask)
    return _bind_tiled(op, dy, w, aux, dx, k, k - 1 - padding, True, epilogue, block, stream, launch)

