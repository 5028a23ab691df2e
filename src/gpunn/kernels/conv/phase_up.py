"""Convolution weight gradient on a 2x nearest-upsampled input, version ``phase``: a 3x3, padding-1 conv with few
output channels (Cout <= PHASE_MAX_COUT; the autoencoder's last layer, Upsample(2) then 256 -> 3), computed on the
small grid of x by the phase decomposition of the upsample.

Output pixel (2i + a, 2j + b), a, b in {0, 1}: its 3x3 window on u = up(x) (padding 1) covers small rows
i + a + di - 1, di in {0, 1}, tap row kh on di = (kh + 1 - a) >> 1 (a = 0: kh 0 -> di 0, kh 1, 2 -> di 1; a = 1:
kh 0, 1 -> di 0, kh 2 -> di 1), columns likewise with b, dj, kw. So with

    G[a, b][co, ci, di, dj] = sum over n, i, j of dy[n, co, 2i + a, 2j + b] * x[n, ci, i + a + di - 1, j + b + dj - 1]

(x zero outside), dw[co, ci, kh, kw] is the sum of the four G[a, b][co, ci, (kh + 1 - a) >> 1, (kw + 1 - b) >> 1]:
16 products per small pixel and output channel instead of 9 per upsampled pixel (36 per small pixel), and no
upsampled staging.

A block owns `group` input channels (ci0 = blockIdx.x * group) and a split of the images (blockIdx.y). Per image it
stages in shared memory its channels' small planes with a zero halo (plane stride odd: the two channels a warp
reads hit distinct banks) and the image's dy (Cout x 2H x 2W, rows at the odd stride 2W + 1), loaded through
registers one image ahead of the compute (the loads of image n + 1 in flight while image n is summed). Thread t
owns channel t // lanes and small rows lane, lane + lanes, ... (lanes = block // group): it walks each row with a
3x3 register window of x (three new values per pixel) and adds the 4 * Cout dy values of the pixel's 2x2 output
block times the window into 16 * Cout accumulators (constant indices: registers). At the end each block folds its
sums into the 9 taps: per chunk of output channels the accumulators go to shared memory and one thread per
(channel, co, tap) adds its four G entries, each over the channel's lanes in lane order, into
partials[split, (co * Cin + ci) * 9 + tap]; ``weight_grad.sum_partials`` adds the splits in order: deterministic.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import shape
from ..gemm import multiprocessors
from ..launch import LaunchGroup, bind, check_block, flat, grid_for
from .checks import SMEM_LIMIT, U0, U1, _padding, _weight, check_grid_y, check_splits, jit_for
from .checks import _geometry as _direct_geometry
from .implicit_gemm import _activation
from .upsampled import upsampled_shape
from .weight_grad import SIMULATOR_WGRAD_SPLITS, sum_partials, weight_grad_splits

__all__ = ["PHASE_BLOCK", "PHASE_GROUP", "PHASE_MAX_COUT", "conv_backward_weight_phase_up", "phase_fits",
           "phase_layout"]

PHASE_MAX_COUT = 4  # output channels: 16 * Cout accumulators per thread
PHASE_BLOCK = 256
PHASE_GROUP = 16  # input channels per block (lanes = PHASE_BLOCK // PHASE_GROUP threads per channel)
PHASE_MAX_PREFETCH = 64  # floats of the next image a thread holds in registers while staging
PHASE_BLOCKS_PER_SM = 2  # batch splits: about this many blocks per SM (whole images, at least one per split)
_U2 = np.uint32(2)


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
