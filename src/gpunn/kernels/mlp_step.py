"""A whole training step of a two-layer ReLU MLP with softmax cross-entropy in two or three launches (the MLP's
persistent step; gpunn.backends.gpu.persistent binds it into the engine).

The model: x (rows, in) -> h = relu(x W1 + b1) (rows, hidden) -> logits = h W2 + b2 (rows, classes) -> softmax-CE.
Parameters live in the flat buffer as the engine's folded views W1b = [W1; b1] (in + 1, hidden) and
W2b = [W2; b2] (hidden + 1, classes): row `in` (row `hidden`) is the bias, multiplied by an implicit one.

Versions:

    1 persistent  forward: ONE cooperative launch, two phases separated by a grid-wide sync
                  (cuda.cg.this_grid().sync(); the grid is at most the kernel's max_cooperative_grid_blocks)
                    A  fc1 split-K partials: the batch gathered straight from the resident source by the epoch
                       order and the device step counter (as gather_rows), part[s, r, j] = sum over split s's K
                       range of x[r, k] W1b[k, j]; the sample indices and gathered [x | 1] kept for the backward
                    B  one block per row: h = relu(sum_s part[s]) (splits added in order), logits = h W2b (a
                       fixed-order tree over the block), softmax-CE gradient and the per-sample loss into the
                       epoch buffer at the step's position (as softmax_ce_grad), dh = (dlogits W2^T) * (h > 0)
                  backward: ONE plain launch of shared-memory tiles, every output one thread's sum over the rows
                    in order: dW1b = [x | 1]^T dh, dW2b = [h | 1]^T dlogits, each SGD-updated in place as made
                    (w - fmul_rn(lr, g), the engine's sgd_step rounding), then the step counter advanced;
                    or, for gradients(), written to the gradient buffer with no update and no advance
    2 phased      the same device code with phases A and B as two plain launches (no cooperative launch,
                  nothing co-resident needed): three launches a step

No atomics: every output is written by one thread, partial sums are added in a fixed order, so two runs give the
same bits. Sizes are generic (rows <= the epoch's stride, a last partial batch included); the class count is a
compile-time constant (the logits' shared buffer), at most MAX_CLASSES.

Under numba's simulator (no inter-block synchronisation: it runs one block at a time) grid.sync() is the block's
syncthreads and max_cooperative_grid_blocks is 1, so the persistent version runs one block there, every phase
grid-stride over its work; the phased version runs its full grids. The real multi-block cooperative path is
tested on the GPU (tests/test_mlp_step.py, -m gpu).

Reference: `step_ref` (float64: forward, gradients, updated parameters, losses).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32

from gpunn import device
from gpunn.nn.functional import DEFAULT_REDUCTION

from .common import cdiv, shape
from .jit import jit
from .launch import Launch, LaunchGroup, bind, check_array, check_block
from .sgd import mul_rn
from .softmax import grad_scale, softmax_ce_grad_ref

__all__ = ["BLOCK", "MAX_CLASSES", "VERSIONS", "StepBuffers", "fc1_splits", "step_backward", "step_buffers",
           "step_forward", "step_ref"]

BLOCK = 256            # threads per block (a multiple of 32, a power of two)
TILE_COLS = 32         # hidden columns of a phase-A tile and of a backward dW1 tile: one per lane
TILE_K = 32            # K step of phase A
ROWS_PER_THREAD = 8    # phase A: a thread's rows (one column): tile rows = 8 x warps
K_PER_THREAD = 4       # backward: a thread's dW1 rows (one column): tile K = 4 x warps
ROW_CHUNK = 64         # backward: batch rows staged per step (loads in flight together: ROW_CHUNK x 4 / 32 each)
SUM_BATCH = 8          # phase B: split partials loaded together before they are added in order
MAX_CLASSES = 32       # the logits' shared buffer: classes x BLOCK floats
SPLIT_BLOCKS_PER_SM = 2  # phase A aims at about this many tiles per multiprocessor ...
MIN_BLOCKS_PER_SM = 2    # ... and every kernel fits this many blocks on one (launch bounds: <= 128 registers)
VERSIONS = ("persistent", "phased")


class StepBuffers(NamedTuple):
    """Scratch of one step shape: h (rows, hidden), dlogits (rows, classes), dh (rows, hidden), the batch's sample
    indices idx (rows,) int32, fc1's split-K partials part (splits, rows, hidden) and the gathered batch with its
    ones column x (rows, in + 1), which phase A writes as it stages it and the backward reads."""

    h: object
    dlogits: object
    dh: object
    idx: object
    part: object
    x: object


def _tile_rows(block: int) -> int:
    return ROWS_PER_THREAD * (block // 32)


def _check_block(op: str, block) -> int:
    block = check_block(op, block, power_of_two=True)
    if block < 32:
        raise ValueError(f"{op}: block must be at least 32 threads (one lane per tile column), got {block}")
    return block


def fc1_splits(rows: int, in_features: int, hidden: int, block: int = BLOCK, target: int | None = None) -> int:
    """How many K ranges phase A splits fc1 into: about `target` tiles in all (default SPLIT_BLOCKS_PER_SM per
    multiprocessor), every range non-empty."""
    chunks = cdiv(in_features + 1, TILE_K)
    tiles = cdiv(rows, _tile_rows(block)) * cdiv(hidden, TILE_COLS)
    if target is None:
        target = SPLIT_BLOCKS_PER_SM * int(device.device_info()["multiprocessors"])
    per = cdiv(chunks, max(1, min(chunks, int(target) // tiles)))
    return cdiv(chunks, per)


def step_buffers(rows: int, in_features: int, hidden: int, classes: int, splits: int | None = None,
                 block: int = BLOCK) -> StepBuffers:
    """Device scratch of a step on `rows` rows (splits: fc1_splits's by default; any count >= 1 is exact)."""
    op = "step_buffers"
    for name, value in (("rows", rows), ("in_features", in_features), ("hidden", hidden), ("classes", classes)):
        if int(value) < 1:
            raise ValueError(f"{op}: {name} must be at least 1, got {value}")
    if not 2 <= classes <= MAX_CLASSES:
        raise ValueError(f"{op}: classes must be in [2, {MAX_CLASSES}] (the logits' shared buffer), got {classes}; "
                         "train wider heads with the layer stages (Policy.step 'layers')")
    if splits is None:
        splits = fc1_splits(rows, in_features, hidden, block)
    chunks = cdiv(in_features + 1, TILE_K)
    splits = cdiv(chunks, cdiv(chunks, max(1, min(int(splits), chunks))))
    return StepBuffers(cuda.device_array((rows, hidden), np.float32), cuda.device_array((rows, classes), np.float32),
                       cuda.device_array((rows, hidden), np.float32), cuda.device_array(rows, np.int32),
                       cuda.device_array((splits, rows, hidden), np.float32),
                       cuda.device_array((rows, in_features + 1), np.float32))


# --------------------------------------------------------------------------------------------- kernels
def _jit(block: int):
    """gpunn.kernels.jit of a kernel launched with `block` threads, MIN_BLOCKS_PER_SM blocks of them resident per
    SM."""
    return jit(launch_bounds=(block, MIN_BLOCKS_PER_SM))


@functools.cache
def _phases(block: int, classes: int):
    """Device functions (fc1_partials, head_rows) for one block size and class count."""
    warps = block // 32
    tile_rows = ROWS_PER_THREAD * warps

    @cuda.jit(device=True)
    def fc1_partials(source, order, counter, stride, w1, part, chunks_per_split, idx, xg):
        """Phase A: part[s, r, j] over split s's K range; block 0 also saves the batch's sample indices, and the
        first column tile's blocks the gathered batch [x | 1] (xg) for the backward."""
        xs = cuda.shared.array((tile_rows, TILE_K), float32)
        ws = cuda.shared.array((TILE_K, TILE_COLS), float32)
        rid = cuda.shared.array(tile_rows, int32)  # the tile rows' samples (-1: past the batch)
        acc = cuda.local.array(ROWS_PER_THREAD, float32)
        t = cuda.threadIdx.x
        tx = t % 32
        ty = t // 32
        splits, rows, hidden = part.shape[0], part.shape[1], part.shape[2]
        features = source.shape[1]
        kb = features + 1  # the bias row of W1b meets an implicit one
        first = (counter[0] * stride) % order.shape[0]
        if cuda.blockIdx.x == 0:
            for r in range(t, rows, block):
                idx[r] = order[first + r]
        col_tiles = (hidden + TILE_COLS - 1) // TILE_COLS
        units = splits * col_tiles * ((rows + tile_rows - 1) // tile_rows)
        for u in range(cuda.blockIdx.x, units, cuda.gridDim.x):
            s = u % splits
            rest = u // splits
            c0 = (rest % col_tiles) * TILE_COLS
            r0 = (rest // col_tiles) * tile_rows
            k_begin = s * chunks_per_split * TILE_K
            k_end = min(kb, k_begin + chunks_per_split * TILE_K)
            for i in range(ROWS_PER_THREAD):
                acc[i] = float32(0.0)
            if t < tile_rows:
                rid[t] = order[first + r0 + t] if r0 + t < rows else -1
            cuda.syncthreads()
            for k0 in range(k_begin, k_end, TILE_K):
                k = k0 + tx  # TILE_K = 32: a lane per column of the x tile
                for i in range(ROWS_PER_THREAD):  # fixed trip counts: every load of a thread in flight at once
                    sample = rid[ty + warps * i]
                    v = float32(0.0)
                    if sample >= 0 and k < k_end:
                        v = source[sample, k] if k < features else float32(1.0)
                        if c0 == 0:
                            xg[r0 + ty + warps * i, k] = v
                    xs[ty + warps * i, tx] = v
                for i in range(TILE_K // warps):
                    k = k0 + ty + warps * i
                    c = c0 + tx
                    ws[ty + warps * i, tx] = w1[k, c] if k < k_end and c < hidden else float32(0.0)
                cuda.syncthreads()
                for kk in range(TILE_K):
                    w = ws[kk, tx]
                    for i in range(ROWS_PER_THREAD):
                        acc[i] += xs[ty + warps * i, kk] * w
                cuda.syncthreads()
            c = c0 + tx
            if c < hidden:
                for i in range(ROWS_PER_THREAD):
                    r = r0 + ty + warps * i
                    if r < rows:
                        part[s, r, c] = acc[i]

    @cuda.jit(device=True)
    def head_rows(labels, order, counter, stride, w2, part, h, dlogits, dh, losses, scale):
        """Phase B, one block per row: h, logits, softmax-CE gradient and loss, dh. A thread's first hidden unit
        (j = t) keeps its h and W2 row in registers from the logits to dh; the head's bias row and the label are
        loaded before the partial sums, their latency hidden behind them."""
        buf = cuda.shared.array((classes, block), float32)
        dls = cuda.shared.array(classes, float32)
        wj = cuda.local.array(classes, float32)    # W2 row of the thread's unit j
        wt = cuda.local.array(classes, float32)    # ... of its first unit, j = t (kept for dh)
        bias = cuda.local.array(classes, float32)  # W2b's bias row
        pv = cuda.local.array(SUM_BATCH, float32)
        t = cuda.threadIdx.x
        splits, rows, hidden = part.shape[0], part.shape[1], part.shape[2]
        at = (counter[0] * stride) % losses.shape[0]
        first = (counter[0] * stride) % order.shape[0]
        for c in range(classes):
            bias[c] = w2[hidden, c]
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            label = labels[order[first + r]]
            for c in range(classes):
                buf[c, t] = float32(0.0)
            hv = float32(0.0)
            for j in range(t, hidden, block):
                for c in range(classes):
                    wj[c] = w2[j, c]
                a = float32(0.0)
                for s0 in range(0, splits, SUM_BATCH):
                    for i in range(SUM_BATCH):  # fixed trip count: the batch's loads in flight together
                        pv[i] = part[s0 + i, r, j] if s0 + i < splits else float32(0.0)
                    for i in range(SUM_BATCH):  # added in split order (the first taken as is)
                        if s0 + i == 0:
                            a = pv[i]
                        elif s0 + i < splits:
                            a += pv[i]
                v = float32(0.0) if a < 0 else a  # NaN propagates, as in relu_forward
                h[r, j] = v
                for c in range(classes):
                    buf[c, t] += v * wj[c]
                if j == t:
                    hv = v
                    for c in range(classes):
                        wt[c] = wj[c]
            width = block // 2
            while width > 0:  # fixed-order tree: buf[c, 0] = the row's logit c without its bias
                cuda.syncthreads()
                if t < width:
                    for c in range(classes):
                        buf[c, t] += buf[c, t + width]
                width //= 2
            cuda.syncthreads()
            rowmax = float32(-math.inf)
            for c in range(classes):
                rowmax = max(rowmax, buf[c, 0] + bias[c])
            total = float32(0.0)
            for c in range(classes):
                total += math.exp(buf[c, 0] + bias[c] - rowmax)
            if t == 0:
                losses[at + r] = math.log(total) - (buf[label, 0] + w2[hidden, label] - rowmax)
            inv_total = float32(1.0) / total
            for c in range(t, classes, block):
                p = math.exp(buf[c, 0] + w2[hidden, c] - rowmax) * inv_total
                if c == label:
                    p -= float32(1.0)
                dls[c] = p * scale
                dlogits[r, c] = p * scale
            cuda.syncthreads()
            for j in range(t, hidden, block):
                hj = hv
                if j != t:
                    hj = h[r, j]
                g = float32(0.0)
                if hj > 0:
                    for c in range(classes):
                        g += dls[c] * (wt[c] if j == t else w2[j, c])
                dh[r, j] = g
            cuda.syncthreads()  # buf and dls are reused by the block's next row

    return fc1_partials, head_rows


@functools.cache
def _forward_kernels(block: int, classes: int):
    """(persistent cooperative kernel, phase A kernel, phase B kernel)."""
    fc1_partials, head_rows = _phases(block, classes)

    @_jit(block)
    def persistent_forward(source, labels, order, counter, stride, w1, w2, part, chunks_per_split, idx, xg, h,
                           dlogits, dh, losses, scale):
        fc1_partials(source, order, counter, stride, w1, part, chunks_per_split, idx, xg)
        cuda.cg.this_grid().sync()
        head_rows(labels, order, counter, stride, w2, part, h, dlogits, dh, losses, scale)

    @_jit(block)
    def fc1_phase(source, order, counter, stride, w1, part, chunks_per_split, idx, xg):
        fc1_partials(source, order, counter, stride, w1, part, chunks_per_split, idx, xg)

    @_jit(block)
    def head_phase(labels, order, counter, stride, w2, part, h, dlogits, dh, losses, scale):
        head_rows(labels, order, counter, stride, w2, part, h, dlogits, dh, losses, scale)

    return persistent_forward, fc1_phase, head_phase


@functools.cache
def _backward_kernel(block: int, update: bool):
    warps = block // 32
    tile_k = K_PER_THREAD * warps

    @cuda.jit(device=True)
    def grad_tile(a, d, out, k0, c0, lr, xs, ds, acc, wv):
        """One tile_k x TILE_COLS tile of out = [a | 1]^T d (a's ones column past its last: the bias row; when `a`
        holds it already, as the gathered [x | 1] does, out has no row for the extra one), each output summed over
        the rows in order, then stored (or SGD-applied to out). Every load of a thread (the parameters it updates,
        its share of the operand tiles) is issued before any is used."""
        t = cuda.threadIdx.x
        tx = t % 32
        ty = t // 32
        rows, cols = d.shape[0], d.shape[1]
        ka = a.shape[1]
        kout = out.shape[0]
        c = c0 + tx
        for i in range(K_PER_THREAD):
            acc[i] = float32(0.0)
            if update:
                k = k0 + ty + warps * i
                wv[i] = out[k, c] if k < kout and c < cols else float32(0.0)
        for r0 in range(0, rows, ROW_CHUNK):
            for i in range(ROW_CHUNK * K_PER_THREAD // 32):  # fixed trip counts: the loads in flight at once
                e = t + block * i
                r = r0 + e // tile_k
                k = k0 + e % tile_k
                v = float32(0.0)
                if r < rows and k < ka:
                    v = a[r, k]
                elif r < rows and k == ka:
                    v = float32(1.0)  # the ones column: the bias row's gradient
                xs[e // tile_k, e % tile_k] = v
            for i in range(ROW_CHUNK // warps):
                r = r0 + ty + warps * i
                ds[ty + warps * i, tx] = d[r, c] if r < rows and c < cols else float32(0.0)
            cuda.syncthreads()
            for rr in range(ROW_CHUNK):
                dv = ds[rr, tx]
                for i in range(K_PER_THREAD):
                    acc[i] += xs[rr, ty + warps * i] * dv
            cuda.syncthreads()
        for i in range(K_PER_THREAD):
            k = k0 + ty + warps * i
            if k < kout and c < cols:
                if update:
                    out[k, c] = wv[i] - mul_rn(lr, acc[i])
                else:
                    out[k, c] = acc[i]

    @_jit(block)
    def mlp_backward(xg, h, dlogits, dh, out1, out2, lr, counter):
        xs = cuda.shared.array((ROW_CHUNK, tile_k), float32)
        ds = cuda.shared.array((ROW_CHUNK, TILE_COLS), float32)
        acc = cuda.local.array(K_PER_THREAD, float32)
        wv = cuda.local.array(K_PER_THREAD, float32)
        hidden = dh.shape[1]
        col_tiles1 = (hidden + TILE_COLS - 1) // TILE_COLS
        units1 = col_tiles1 * ((xg.shape[1] + tile_k - 1) // tile_k)  # xg = [x | 1]: features + 1 columns
        col_tiles2 = (dlogits.shape[1] + TILE_COLS - 1) // TILE_COLS
        units = units1 + col_tiles2 * ((hidden + tile_k) // tile_k)
        for u in range(cuda.blockIdx.x, units, cuda.gridDim.x):
            if u < units1:  # dW1b = [x | 1]^T dh, the batch as phase A gathered it
                grad_tile(xg, dh, out1, (u // col_tiles1) * tile_k, (u % col_tiles1) * TILE_COLS, lr, xs, ds, acc,
                          wv)
            else:  # dW2b = [h | 1]^T dlogits
                v = u - units1
                grad_tile(h, dlogits, out2, (v // col_tiles2) * tile_k, (v % col_tiles2) * TILE_COLS, lr, xs, ds,
                          acc, wv)
        if update and cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            counter[0] += 1  # nothing in this launch reads it

    return mlp_backward


# --------------------------------------------------------------------------------------------- launchers
def _check_weights(op: str, w1, w2, buffers: StepBuffers):
    check_array(op, "w1", w1, 2)
    check_array(op, "w2", w2, 2)
    rows, hidden = shape(buffers.h)
    classes = int(buffers.dlogits.shape[1])
    if shape(w1)[1] != hidden or shape(w2) != (hidden + 1, classes):
        raise ValueError(f"{op}: w1 {shape(w1)} must be (in + 1, {hidden}) and w2 {shape(w2)} ({hidden + 1}, "
                         f"{classes}) to fit the buffers (h {shape(buffers.h)}, dlogits {shape(buffers.dlogits)})")
    return rows, hidden, classes


def step_forward(source, labels, order, counter, stride: int, w1, w2, losses, buffers: StepBuffers,
                 reduction: str = DEFAULT_REDUCTION, version: str = "persistent", block: int = BLOCK, stream=0,
                 launch: bool = True) -> Launch | LaunchGroup:
    """The step's forward and loss gradient on the batch source[order[s:s + rows]], s = (counter[0] * stride) % N:
    buffers.h, .dlogits (of the batch mean, or the sum with `reduction="sum"`), .dh, .idx, and row r's loss in
    losses[(counter[0] * stride) % len(losses) + r] (losses: the batch's (rows,) with stride = rows and a zero
    counter, or an epoch-long buffer). w1 = W1b (in + 1, hidden), w2 = W2b (hidden + 1, classes): the folded
    views of the flat parameter buffer. version "persistent": one cooperative launch; "phased": two launches."""
    op = "mlp_step_forward"
    block = _check_block(op, block)
    if version not in VERSIONS:
        raise ValueError(f"{op}: version must be one of {VERSIONS}, got {version!r}")
    check_array(op, "source", source, 2)
    check_array(op, "labels", labels, 1, dtype=np.int32)
    check_array(op, "order", order, 1, dtype=np.int32)
    check_array(op, "counter", counter, 1, dtype=np.int32)
    check_array(op, "losses", losses, 1)
    rows, hidden, classes = _check_weights(op, w1, w2, buffers)
    n, features = shape(source)
    if (shape(w1)[0] != features + 1 or shape(labels) != (n,) or shape(order) != (n,)
            or not rows <= int(stride) <= n or losses.shape[0] < rows):
        raise ValueError(f"{op}: shapes do not fit source {shape(source)}, labels {shape(labels)}, order "
                         f"{shape(order)}, w1 {shape(w1)}, losses {shape(losses)}, {rows} rows, stride {stride} "
                         "(need w1 (F + 1, hidden), labels and order (N,), rows <= stride <= N, losses >= rows)")
    splits = int(buffers.part.shape[0])
    per = cdiv(cdiv(features + 1, TILE_K), splits)
    scale = grad_scale(op, reduction, rows)
    stride = np.int32(stride)
    persistent, fc1_phase, head_phase = _forward_kernels(block, classes)
    b = buffers
    a_args = (source, order, counter, stride, w1, b.part, np.int32(per), b.idx, b.x)
    b_args = (labels, order, counter, stride, w2, b.part, b.h, b.dlogits, b.dh, losses, scale)
    a_units = splits * cdiv(hidden, TILE_COLS) * cdiv(rows, _tile_rows(block))
    if version == "phased":
        return LaunchGroup([bind(fc1_phase, a_units, block, a_args, stream, launch, "mlp_fc1_partials"),
                            bind(head_phase, rows, block, b_args, stream, launch, "mlp_head_rows")])
    args = (source, labels, order, counter, stride, w1, w2, b.part, np.int32(per), b.idx, b.x, b.h, b.dlogits, b.dh,
            losses, scale)
    grid = min(max(a_units, rows), cooperative_blocks(persistent, args, block))
    return bind(persistent, grid, block, args, stream, launch, "mlp_persistent_forward")


def cooperative_blocks(kernel, args, block: int) -> int:
    """The most blocks of `block` threads a cooperative launch of `kernel` on `args` may have on this device
    (compiling it if needed); 1 under the simulator, which runs one block at a time."""
    if device.simulator_enabled():
        return int(kernel.overloads[None].max_cooperative_grid_blocks(block))
    compiled = kernel.compile(tuple(kernel.typeof_pyval(arg) for arg in args))
    blocks = int(compiled.max_cooperative_grid_blocks(block))
    if blocks < 1:
        raise ValueError(f"mlp_persistent_forward: {block} threads a block leave no room for a cooperative grid "
                         "on this device; choose a smaller block")
    return blocks


def step_backward(source, w1, w2, buffers: StepBuffers, lr: float, counter, grads=None, block: int = BLOCK,
                  stream=0, launch: bool = True) -> Launch:
    """After step_forward: dW1b = [x | 1]^T dh and dW2b = [h | 1]^T dlogits, and with `grads` None each parameter
    updated in place (w -= float32(lr) * g, rounded as sgd_step) and `counter` advanced by one; with grads =
    (g1, g2), views shaped like w1 and w2, the gradients written there and nothing else changed."""
    op = "mlp_step_backward"
    block = _check_block(op, block)
    check_array(op, "source", source, 2)
    check_array(op, "counter", counter, 1, dtype=np.int32)
    _check_weights(op, w1, w2, buffers)
    if shape(w1)[0] != shape(source)[1] + 1:
        raise ValueError(f"{op}: w1 {shape(w1)} must have {shape(source)[1] + 1} rows (source {shape(source)})")
    lr = float(lr)
    if grads is None:
        if not np.isfinite(lr) or lr <= 0:
            raise ValueError(f"{op}: lr must be a positive finite number, got {lr!r}")
        out1, out2 = w1, w2
    else:
        out1, out2 = grads
        if shape(out1) != shape(w1) or shape(out2) != shape(w2):
            raise ValueError(f"{op}: grads {shape(out1)}, {shape(out2)} must be shaped like w1 {shape(w1)} and w2 "
                             f"{shape(w2)}")
    kernel = _backward_kernel(block, grads is None)
    b = buffers
    args = (b.x, b.h, b.dlogits, b.dh, out1, out2, np.float32(lr), counter)
    rows, hidden = shape(b.h)
    classes = int(b.dlogits.shape[1])
    tile_k = K_PER_THREAD * (block // 32)
    units = cdiv(hidden, TILE_COLS) * cdiv(shape(w1)[0], tile_k) + cdiv(classes, TILE_COLS) * cdiv(hidden + 1, tile_k)
    return bind(kernel, units, block, args, stream, launch, "mlp_backward_sgd" if grads is None else "mlp_backward")


# --------------------------------------------------------------------------------------------- reference
def step_ref(x, labels, w1, w2, lr: float, reduction: str = DEFAULT_REDUCTION) -> dict:
    """One step in float64 on the batch x (rows, in) with W1b (in + 1, hidden), W2b (hidden + 1, classes): h,
    logits, dlogits, losses, dh, the gradients g1, g2 (shaped like W1b, W2b) and the updated w1, w2."""
    x = np.asarray(x, np.float64)
    w1 = np.asarray(w1, np.float64)
    w2 = np.asarray(w2, np.float64)
    ones = np.ones((len(x), 1))
    xb = np.hstack([x, ones])
    h = np.maximum(xb @ w1, 0.0)
    hb = np.hstack([h, ones])
    logits = hb @ w2
    dlogits, losses = softmax_ce_grad_ref(logits, labels, reduction)
    dh = (dlogits @ w2[:-1].T) * (h > 0)
    g1 = xb.T @ dh
    g2 = hb.T @ dlogits
    return {"h": h, "logits": logits, "dlogits": dlogits, "losses": losses, "dh": dh, "g1": g1, "g2": g2,
            "w1": w1 - lr * g1, "w2": w2 - lr * g2}
