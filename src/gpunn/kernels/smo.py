"""The SMO kernels of E6's GPU support-vector solver (gpunn.smo): many binary C-SVC dual problems solved side by
side, each a slice of one concatenated set of points.

Layout. Problem p owns points ``offsets[p] .. offsets[p + 1]`` of the float64 arrays ``y`` (+1 / -1), ``alpha``
and ``grad`` (the dual gradient Q alpha - 1, Q_ij = y_i y_j K_ij); point i is training point ``rows[i]``, whose
kernel row is row ``slot[rows[i]]`` of the float32 array ``K`` (n columns): the whole matrix with slot the
identity, or a cache of rows (gpunn.smo_rows) where the working sets' rows have been computed. A working set is
up to ``Q`` point indices a problem (``ws[p, :ws_count[p]]``).

Versions:

    1 local_smo      one block of Q threads a problem solves its working set with libsvm's pair steps: the
                     maximal violator i, then j by second-order information (libsvm's WSS 2), the pair's analytic
                     step clipped to the box, the working set's gradients updated; until the working set's own
                     violation falls under max(eps, 0.1 x its first) or Q x 10 steps. Reductions are
                     shared-memory trees (the simulator has no warp shuffles). Writes alpha and the steps' sums
                     (``delta``: new - old alpha of each working-set point)
    2 update_grad    grad_i += y_i sum_k y_k delta_k K[rows[ws_k], rows[i]] over each problem's points, in
                     float64 (a zero delta is skipped: no read)
    3 decision       dec[t, c] = sum over the support list of classifier c of coef * K[row, t] - rho[c], float64
                     sums; K here is (kernel rows) x (points to classify): the training matrix itself (it is
                     symmetric) or a test kernel computed as rbf(train, test)
    4 select_working_sets  each problem's gap and working set (gpunn.smo.select_round's rule: half of the last
                     working set kept, the fresh part from both sides' extremes, each part in position order), the
                     k-th key of a side found by bisecting its values' range: no sort

The float64 NumPy references (``local_smo_ref``, ``update_grad_ref``, ``decision_ref``) run the same steps in
the same order: the kernels agree with them up to the float32 kernel values they both read.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float64, int32

from gpunn import device

from .jit import jit
from .launch import bind, check_array

__all__ = ["LOCAL_STEPS_PER_POINT", "TAU", "decision", "decision_ref", "local_smo", "local_smo_ref", "pair_step",
           "select_working_sets", "update_grad", "update_grad_ref"]

TAU = 1e-12  # libsvm's floor for a non-positive second derivative (duplicate points)
LOCAL_STEPS_PER_POINT = 10  # a working set of q points stops after q x this many pair steps
LOCAL_EPS_SHARE = 0.1  # ... or when its violation falls under max(eps, this share of its first)
_NEG = -1e300
_POS = 1e300


# --------------------------------------------------------------------------------------------- local solver
@cuda.jit(device=True, inline=True)
def _in_up(y, a, c):
    return (y > 0 and a < c) or (y < 0 and a > 0)


@cuda.jit(device=True, inline=True)
def _in_low(y, a, c):
    return (y > 0 and a > 0) or (y < 0 and a < c)


def pair_step(yi, yj, ai, aj, gi, gj, kii, kjj, kij, c):
    """libsvm's analytic step on the pair (i, j), clipped to [0, c]: the new (alpha_i, alpha_j). gi, gj: the dual
    gradient; kii, kjj, kij: kernel values (unsigned: libsvm's Q_ij is y_i y_j K_ij)."""
    quad = kii + kjj - 2.0 * kij  # the pair's second derivative along its feasible line (either label pairing)
    if quad <= 0.0:
        quad = TAU
    if yi != yj:
        delta = (-gi - gj) / quad
        diff = ai - aj
        ai += delta
        aj += delta
        if diff > 0.0:
            if aj < 0.0:
                aj = 0.0
                ai = diff
        elif ai < 0.0:
            ai = 0.0
            aj = -diff
        if diff > 0.0:
            if ai > c:
                ai = c
                aj = c - diff
        elif aj > c:
            aj = c
            ai = c + diff
    else:
        delta = (gi - gj) / quad
        total = ai + aj
        ai -= delta
        aj += delta
        if total > c:
            if ai > c:
                ai = c
                aj = total - c
        elif aj < 0.0:
            aj = 0.0
            ai = total
        if total > c:
            if aj > c:
                aj = c
                ai = total - c
        elif ai < 0.0:
            ai = 0.0
            aj = total
    return ai, aj


_pair_step = cuda.jit(device=True, inline=True)(pair_step)


@functools.cache
def _local_smo_kernel(q: int):
    """The local solver for working sets of up to q points (q a power of two): one block of q threads a problem."""

    @jit(launch_bounds=q)  # registers bounded so that a block of q threads always launches
    def local_smo_kernel(k, rows, slot, y, alpha, grad, ws, ws_count, c, eps, max_steps, delta):
        val = cuda.shared.array(q, float64)
        idx = cuda.shared.array(q, int32)
        low = cuda.shared.array(q, float64)
        pair = cuda.shared.array(6, float64)  # j's alpha, gradient, label, K_ij; then the step's two deltas
        pick = cuda.shared.array(2, int32)  # j, stop
        p = cuda.blockIdx.x
        t = cuda.threadIdx.x
        count = ws_count[p]
        if count == 0:  # a problem that has converged (select_working_sets leaves its row empty)
            return
        mine = t < count
        point = ws[p, t] if mine else ws[p, 0]
        row = rows[point]
        yt = y[point] if mine else 0.0
        a = alpha[point] if mine else 0.0
        a0 = a
        g = grad[point] if mine else 0.0
        ktt = float64(k[slot[row], row])
        local_eps = eps
        for step in range(max_steps):
            # i: the largest -y g over the up set (ties: the lowest working-set position)
            f = -yt * g
            val[t] = f if mine and _in_up(yt, a, c) else _NEG
            idx[t] = t
            cuda.syncthreads()
            s = q // 2
            while s > 0:
                if t < s and (val[t + s] > val[t] or (val[t + s] == val[t] and idx[t + s] < idx[t])):
                    val[t] = val[t + s]
                    idx[t] = idx[t + s]
                cuda.syncthreads()
                s //= 2
            gmax = val[0]
            i = idx[0]
            cuda.syncthreads()
            pi = ws[p, i]
            ri = rows[pi]
            kii = float64(k[slot[ri], ri])
            kti = float64(k[slot[ri], row])
            # j: the largest second-order gain over the low set; the low set's smallest -y g closes the gap
            in_low = mine and _in_low(yt, a, c)
            low[t] = f if in_low else _POS
            obj = _POS
            if in_low and f < gmax:
                quad = kii + ktt - 2.0 * kti
                if quad <= 0.0:
                    quad = TAU
                b = gmax - f
                obj = -(b * b) / quad
            val[t] = obj
            idx[t] = t
            cuda.syncthreads()
            s = q // 2
            while s > 0:
                if t < s:
                    if val[t + s] < val[t] or (val[t + s] == val[t] and idx[t + s] < idx[t]):
                        val[t] = val[t + s]
                        idx[t] = idx[t + s]
                    if low[t + s] < low[t]:
                        low[t] = low[t + s]
                cuda.syncthreads()
                s //= 2
            if t == 0:
                gap = gmax - low[0]
                if step == 0:
                    local_eps = max(eps, LOCAL_EPS_SHARE * gap)
                pick[0] = idx[0]
                pick[1] = 1 if gap < local_eps or val[0] >= _POS else 0
            cuda.syncthreads()
            if pick[1] == 1:
                break
            j = pick[0]
            if t == j:
                pair[0] = a
                pair[1] = g
                pair[2] = yt
                pair[3] = kti
            cuda.syncthreads()
            if t == i:
                pj = ws[p, j]
                ai, aj = _pair_step(yt, pair[2], a, pair[0], g, pair[1], ktt, float64(k[slot[rows[pj]], rows[pj]]),
                                    pair[3], c)
                pair[4] = ai - a
                pair[5] = aj - pair[0]
            cuda.syncthreads()
            yi = y[pi]
            yj = pair[2]
            dai = pair[4]
            daj = pair[5]
            ktj = float64(k[slot[rows[ws[p, j]]], row])
            if mine:
                g += yt * (yi * dai * kti + yj * daj * ktj)
                if t == i:
                    a += dai
                if t == j:
                    a += daj
            cuda.syncthreads()
        if mine:
            alpha[point] = a
            delta[p, t] = a - a0

    return local_smo_kernel


def _check_problem_arrays(op, k, rows, slot, y, alpha, grad):
    check_array(op, "k", k, 2)
    check_array(op, "slot", slot, 1, np.int32)
    if slot.shape[0] != k.shape[1]:
        raise ValueError(f"{op}: slot needs one entry a training point (k's {k.shape[1]} columns), got "
                         f"{slot.shape[0]}")
    check_array(op, "rows", rows, 1, np.int32)
    for name, arr in (("y", y), ("alpha", alpha), ("grad", grad)):
        check_array(op, name, arr, 1, np.float64)
        if arr.shape[0] != rows.shape[0]:
            raise ValueError(f"{op}: {name} has {arr.shape[0]} points, rows {rows.shape[0]}")


def local_smo(k, rows, slot, y, alpha, grad, ws, ws_count, c: float, eps: float, delta, stream=0, launch=True):
    """Version 1: each problem's working set ws[p, :ws_count[p]] solved by pair steps (module docstring); alpha
    updated in place, delta[p, t] = its change; grad is read, not written (update_grad applies the steps)."""
    op = "local_smo"
    _check_problem_arrays(op, k, rows, slot, y, alpha, grad)
    check_array(op, "ws", ws, 2, np.int32)
    check_array(op, "ws_count", ws_count, 1, np.int32)
    check_array(op, "delta", delta, 2, np.float64)
    problems, q = ws.shape
    if q & (q - 1) or delta.shape != ws.shape or ws_count.shape[0] != problems:
        raise ValueError(f"{op}: ws {tuple(ws.shape)} needs a power-of-two width, delta of its shape "
                         f"(got {tuple(delta.shape)}) and one ws_count a row (got {ws_count.shape[0]})")
    kernel = _local_smo_kernel(q)
    return bind(kernel, problems, q, (k, rows, slot, y, alpha, grad, ws, ws_count, np.float64(c), np.float64(eps),
                                      np.int32(LOCAL_STEPS_PER_POINT * q), delta), stream, launch, op)


# --------------------------------------------------------------------------------------------- gradient
UPDATE_THREADS = 256


@jit
def _update_grad_kernel(k, rows, slot, y, grad, starts, stops, ws, ws_count, delta):
    p = cuda.blockIdx.y
    i = starts[p] + cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i >= stops[p]:
        return
    col = rows[i]
    acc = 0.0
    for s in range(ws_count[p]):
        d = delta[p, s]
        if d != 0.0:  # the same for every thread of the block: a skipped step reads nothing
            point = ws[p, s]
            acc += y[point] * d * float64(k[slot[rows[point]], col])
    grad[i] += y[i] * acc


def update_grad(k, rows, slot, y, grad, starts, stops, widest: int, ws, ws_count, delta, stream=0, launch=True):
    """Version 2: grad_i += y_i sum_s y_ws[s] delta[p, s] K[slot[rows[ws[p, s]]], rows[i]] for the points i of
    problem p, starts[p] <= i < stops[p] (one grid row a problem; `widest`: the largest stops[p] - starts[p])."""
    op = "update_grad"
    check_array(op, "slot", slot, 1, np.int32)
    check_array(op, "starts", starts, 1, np.int32)
    check_array(op, "stops", stops, 1, np.int32)
    grid = (max(1, math.ceil(widest / UPDATE_THREADS)), ws.shape[0])
    return bind(_update_grad_kernel, grid, UPDATE_THREADS, (k, rows, slot, y, grad, starts, stops, ws, ws_count,
                                                            delta), stream, launch, op)


# --------------------------------------------------------------------------------------------- decision
DECISION_THREADS = 128


@jit
def _decision_kernel(k, sv_rows, sv_coef, sv_offsets, rho, dec, points):
    t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    c = cuda.blockIdx.y
    if t >= points:
        return
    acc = 0.0
    for s in range(sv_offsets[c], sv_offsets[c + 1]):
        acc += sv_coef[s] * float64(k[sv_rows[s], t])
    dec[t, c] = acc - rho[c]


def decision(k, sv_rows, sv_coef, sv_offsets, rho, dec, stream=0, launch=True):
    """Version 3: dec (points, classifiers) from k (kernel rows, points), the classifiers' support lists
    (sv_offsets[c] .. sv_offsets[c + 1] of sv_rows / sv_coef) and rho."""
    op = "decision"
    check_array(op, "k", k, 2)
    check_array(op, "sv_rows", sv_rows, 1, np.int32)
    check_array(op, "sv_coef", sv_coef, 1, np.float64)
    check_array(op, "sv_offsets", sv_offsets, 1, np.int32)
    check_array(op, "rho", rho, 1, np.float64)
    check_array(op, "dec", dec, 2, np.float64)
    points, classifiers = dec.shape
    if k.shape[1] != points or rho.shape[0] != classifiers or sv_offsets.shape[0] != classifiers + 1:
        raise ValueError(f"{op}: k {tuple(k.shape)}, dec {tuple(dec.shape)}, rho {tuple(rho.shape)} and "
                         f"sv_offsets {tuple(sv_offsets.shape)} disagree")
    grid = (math.ceil(points / DECISION_THREADS), classifiers)
    return bind(_decision_kernel, grid, DECISION_THREADS, (k, sv_rows, sv_coef, sv_offsets, rho, dec, points),
                stream, launch, op)


# --------------------------------------------------------------------------------------------- references
def local_smo_ref(k, rows, slot, y, alpha, grad, ws, ws_count, c, eps):
    """local_smo in NumPy float64, the same steps in the same order: returns (new alpha, delta)."""
    k = np.asarray(k)
    alpha = np.array(alpha, dtype=np.float64)
    delta = np.zeros(ws.shape, dtype=np.float64)
    q = ws.shape[1]
    for p in range(ws.shape[0]):
        pts = ws[p, :ws_count[p]]
        r = rows[pts]
        yy, a, g = y[pts].astype(np.float64), alpha[pts].copy(), grad[pts].astype(np.float64).copy()
        kk = k[np.ix_(slot[r], r)].astype(np.float64)
        diag = np.diag(kk)
        local_eps = eps
        for step in range(LOCAL_STEPS_PER_POINT * q):
            f = -yy * g
            up = ((yy > 0) & (a < c)) | ((yy < 0) & (a > 0))
            lo = ((yy > 0) & (a > 0)) | ((yy < 0) & (a < c))
            if not up.any():
                break
            i = int(np.flatnonzero(up)[np.argmax(f[up])])
            gmax = f[i]
            gap = gmax - (f[lo].min() if lo.any() else _POS)
            cand = lo & (f < gmax)
            quad = diag[i] + diag - 2.0 * kk[i]
            quad = np.where(quad <= 0.0, TAU, quad)
            obj = np.where(cand, -((gmax - f) ** 2) / quad, _POS)
            if step == 0:
                local_eps = max(eps, LOCAL_EPS_SHARE * gap)
            if gap < local_eps or not cand.any():
                break
            j = int(np.argmin(obj))
            ai, aj = pair_step(yy[i], yy[j], a[i], a[j], g[i], g[j], diag[i], diag[j], kk[i, j], c)
            dai, daj = ai - a[i], aj - a[j]
            g += yy * (yy[i] * dai * kk[i] + yy[j] * daj * kk[j])
            a[i] += dai
            a[j] += daj
        delta[p, :pts.size] = a - alpha[pts]
        alpha[pts] = a
    return alpha, delta


def update_grad_ref(k, rows, slot, y, grad, starts, stops, ws, ws_count, delta):
    """update_grad in NumPy float64, each point's sum in the kernel's order."""
    grad = np.array(grad, dtype=np.float64)
    for p in range(ws.shape[0]):
        pts = np.arange(starts[p], stops[p])
        acc = np.zeros(pts.size)
        for s in range(ws_count[p]):
            if delta[p, s] != 0.0:
                point = ws[p, s]
                acc += y[point] * delta[p, s] * k[slot[rows[point]], rows[pts]].astype(np.float64)
        grad[pts] += y[pts] * acc
    return grad


def decision_ref(k, sv_rows, sv_coef, sv_offsets, rho) -> np.ndarray:
    """decision in NumPy float64."""
    k = np.asarray(k, dtype=np.float64)
    out = np.empty((k.shape[1], rho.shape[0]))
    for c in range(rho.shape[0]):
        s = slice(sv_offsets[c], sv_offsets[c + 1])
        out[:, c] = sv_coef[s] @ k[sv_rows[s]] - rho[c]
    return out


# --------------------------------------------------------------------------------------------- working sets
SELECT_THREADS = 1024  # a block a problem on a GPU
SIMULATOR_SELECT_THREADS = 16  # under the simulator, where each thread is a Python thread
_INF = np.inf


@cuda.jit(device=True, inline=True)
def _key(side, yv, av, gv, c, marked):
    """The selection key of a point: the up side's -(-y g) (its largest violators first), the low side's -y g; inf
    where the point is not on that side or is taken already."""
    f = -yv * gv
    if marked != 0:
        return _INF
    if side == 0:
        return -f if _in_up(yv, av, c) else _INF
    return f if _in_low(yv, av, c) else _INF


@functools.cache
def _select_kernel(threads: int):
    """Working sets for many problems, a block of `threads` a problem: module docstring, version 4."""

    @cuda.jit(device=True)
    def min_and(fa, fb, t, b_max):
        """Tree reductions over the block: fa[0] the smallest of fa, fb[0] the largest (b_max) or smallest of fb."""
        h = threads // 2
        while h > 0:
            if t < h:
                fa[t] = min(fa[t], fa[t + h])
                fb[t] = max(fb[t], fb[t + h]) if b_max else min(fb[t], fb[t + h])
            cuda.syncthreads()
            h //= 2

    @jit(launch_bounds=threads)  # registers bounded so that a block of `threads` always launches
    def select_kernel(y, alpha, grad, marks, starts, stops, c, eps, q, ws, ws_count, gaps, prev_ws, prev_count):
        fa = cuda.shared.array(threads, float64)
        fb = cuda.shared.array(threads, float64)
        ia = cuda.shared.array(threads, int32)
        ib = cuda.shared.array(threads, int32)
        p = cuda.blockIdx.x
        t = cuda.threadIdx.x
        s = starts[p]
        n = stops[p] - s
        chunk = (n + threads - 1) // threads
        first, last = s + t * chunk, min(stops[p], s + (t + 1) * chunk)
        # the gap: the smallest up key (the largest violator) and the smallest low key
        mu = _INF
        ml = _INF
        for i in range(first, last):
            mu = min(mu, _key(0, y[i], alpha[i], grad[i], c, 0))
            ml = min(ml, _key(1, y[i], alpha[i], grad[i], c, 0))
        fa[t] = mu
        fb[t] = ml
        cuda.syncthreads()
        min_and(fa, fb, t, False)
        gap = -fa[0] - fb[0]
        cuda.syncthreads()
        if t == 0:
            gaps[p] = gap
        if not gap >= eps:
            if t == 0:
                ws_count[p] = 0
            return
        kept = min(prev_count[p], q // 2)  # the last working set's first half stays, taken by neither side
        for j in range(t, kept, threads):
            marks[prev_ws[p, j]] = 1
        cuda.syncthreads()
        budget = q - kept
        taken = 0
        for stage in range(3):  # the up side's first budget / 2, the low side's until budget, the up side's until then
            side = 1 if stage == 1 else 0
            want = (budget // 2 if stage == 0 else budget) - taken
            if want <= 0:
                continue
            # v: the want-th smallest finite key of the side, in (lo, hi]
            lo = -_INF
            hi = _INF
            below = 0  # keys <= lo
            v = _INF
            for _ in range(4096):
                mn = _INF
                mx = -_INF
                for i in range(first, last):
                    key = _key(side, y[i], alpha[i], grad[i], c, marks[i])
                    if key > lo and key <= hi and key < _INF:
                        mn = min(mn, key)
                        mx = max(mx, key)
                fa[t] = mn
                fb[t] = mx
                cuda.syncthreads()
                min_and(fa, fb, t, True)
                mn = fa[0]
                mx = fb[0]
                cuda.syncthreads()
                if mn >= _INF or mn == mx:  # no finite key left (fewer than want: all taken) or one value
                    v = mn if mn < _INF else hi
                    break
                pivot = mn + (mx - mn) * 0.5
                if pivot >= mx:
                    pivot = mn
                count = 0
                for i in range(first, last):
                    key = _key(side, y[i], alpha[i], grad[i], c, marks[i])
                    if key > lo and key <= pivot:
                        count += 1
                ia[t] = count
                cuda.syncthreads()
                h = threads // 2
                while h > 0:
                    if t < h:
                        ia[t] += ia[t + h]
                    cuda.syncthreads()
                    h //= 2
                count = ia[0]
                cuda.syncthreads()
                if below + count >= want:
                    hi = pivot
                else:
                    lo = pivot
                    below += count
            # the keys under v, then those equal to v in position order, up to want, written in position order
            n_lt = 0
            n_eq = 0
            for i in range(first, last):
                key = _key(side, y[i], alpha[i], grad[i], c, marks[i])
                if key < v:
                    n_lt += 1
                elif key == v and key < _INF:
                    n_eq += 1
            ia[t] = n_lt
            ib[t] = n_eq
            cuda.syncthreads()
            h = 1
            while h < threads:  # inclusive scans (Hillis-Steele), then each thread's exclusive offsets
                a_add = ia[t - h] if t >= h else 0
                b_add = ib[t - h] if t >= h else 0
                cuda.syncthreads()
                ia[t] += a_add
                ib[t] += b_add
                cuda.syncthreads()
                h *= 2
            lt_total = ia[threads - 1]
            eq_before = ib[t] - n_eq
            lt_before = ia[t] - n_lt
            eq_allowed = want - lt_total  # ties at v taken in position order
            cuda.syncthreads()
            # this thread's first pick goes after the picks of the threads before it: their keys under v and the
            # ties among the first eq_allowed
            out = taken + lt_before + min(eq_before, max(eq_allowed, 0))
            rank = eq_before
            for i in range(first, last):
                key = _key(side, y[i], alpha[i], grad[i], c, marks[i])
                pick = key < v
                if key == v and key < _INF:
                    pick = rank < eq_allowed
                    rank += 1
                if pick:
                    ws[p, out] = i
                    out += 1
            cuda.syncthreads()
            added = lt_total + min(max(eq_allowed, 0), ib[threads - 1])
            for j in range(taken + t, taken + added, threads):
                marks[ws[p, j]] = 1
            taken += added
            cuda.syncthreads()
        for j in range(t, kept, threads):
            ws[p, taken + j] = prev_ws[p, j]
            marks[prev_ws[p, j]] = 0
        for j in range(t, taken, threads):
            marks[ws[p, j]] = 0
        if t == 0:
            ws_count[p] = taken + kept

    return select_kernel


def select_working_sets(y, alpha, grad, marks, starts, stops, c: float, eps: float, q: int, ws, ws_count, gaps,
                        prev_ws, prev_count, threads: int | None = None, stream=0, launch=True):
    """Version 4: for each problem p (points starts[p] .. stops[p]), its gap (largest -y g over the up set minus the
    smallest over the low set) into gaps[p], and where it is at least eps a working set into ws[p, :ws_count[p]]
    (else ws_count[p] = 0): the first min(prev_count[p], q / 2) points of prev_ws[p] kept, at the end, and before
    them the fresh part of q minus those: the up side's largest -y g (half of it), then the low side's smallest not
    taken, until it is full, then more of the up side; ties at a side's last value in position order, each part
    written in position order (gpunn.smo.select_round's sets, in its order).
    The k-th value of a side is found by bisecting the range of its values (no sort); `marks` (int32, one a point,
    zero) holds the points taken while the block runs and is zero again after it. ``threads``: a block's, default
    SELECT_THREADS (SIMULATOR_SELECT_THREADS under the simulator)."""
    op = "select_working_sets"
    if threads is None:
        threads = SIMULATOR_SELECT_THREADS if device.simulator_enabled() else SELECT_THREADS
    for name, arr in (("y", y), ("alpha", alpha), ("grad", grad)):
        check_array(op, name, arr, 1, np.float64)
    check_array(op, "marks", marks, 1, np.int32)
    check_array(op, "ws", ws, 2, np.int32)
    check_array(op, "ws_count", ws_count, 1, np.int32)
    check_array(op, "gaps", gaps, 1, np.float64)
    check_array(op, "prev_ws", prev_ws, 2, np.int32)
    check_array(op, "prev_count", prev_count, 1, np.int32)
    if threads & (threads - 1) or ws.shape[1] < q:
        raise ValueError(f"{op}: threads must be a power of two (got {threads}) and ws at least q = {q} wide "
                         f"(got {ws.shape[1]})")
    return bind(_select_kernel(threads), ws.shape[0], threads, (y, alpha, grad, marks, starts, stops, np.float64(c),
                np.float64(eps), np.int32(q), ws, ws_count, gaps, prev_ws, prev_count), stream, launch, op)
