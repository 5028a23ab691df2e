"""E6's exact SVM solved on the GPU (svm method ``gpu-smo``): scikit-learn SVC's model, solved by SMO kernels of our
own (gpunn.kernels.smo) on a float32 kernel matrix that stays on the GPU.

The model is libsvm's C-SVC as SVC runs it: one binary problem per pair of classes (a < b in sorted label order;
a's points +1, b's -1), each the dual min 1/2 a'Qa - e'a, 0 <= a <= C, y'a = 0, solved until its maximal
violating pair is within ``eps`` (libsvm's 1e-3), its bias by libsvm's rule (the free vectors' mean y g, else the
middle of the bounds), and predictions by one vote a pair, ties to the lowest class. The 45 problems of ten classes
are solved side by side: each round selects every unfinished problem's working set (on the GPU by default, or on
the host: the same sets) of ``q`` points: half of the last round's set kept, the rest the largest violators from
each side, by -y g (ThunderSVM's rule: without the kept half, the rounds zig-zag between the two sides' extremes
and need ten times as many on hard problems); one launch solves all of them (libsvm's second-order pair steps, one
block a problem), one launch updates every problem's gradient from the kernel rows of the points that moved.

Memory: the training kernel takes 4 n^2 bytes on the GPU (10 GB at n = 50 000) and the test kernel 4 n m. Where
they do not fit the GPU's free memory, GpuSmoRoute keeps the float64 features there instead and the solver reads a
cache of kernel rows computed on demand (gpunn.smo_rows.RowCache: the same steps, slower by the rows it recomputes),
and the predictions are made from the test kernel a block of test points at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpunn.errors import GpunnError

EPS = 1e-3  # libsvm's (and SVC's default) stopping tolerance on the maximal violating pair
WORKING_SET = 512  # points a problem's working set holds (a power of two, at most 1024: one thread each)
KERNEL_BLOCK_ROWS = 4096  # the training kernel's row blocks, each computed from the diagonal on, then mirrored
PREDICT_BLOCK = 4096  # points predicted a block at a time where the kernel matrices are not kept (a row cache)
# where each round's working sets are chosen: "gpu" (kernels.smo.select_working_sets; only each problem's count
# comes back) or "host" (the state copied back, select_round: the same sets, about 30 ms a round for 45 problems of
# 10 000 points; docs/notes/issue-43-progress.md)
SELECTIONS = ("gpu", "host")
MAX_ROUNDS_PER_POINT = 10  # a problem of n points that needs more than max(1000, this x n / q) rounds is an error


@dataclass(frozen=True)
class PairProblems:
    """The one-vs-one decomposition: problem p = (classes[pairs[p][0]], classes[pairs[p][1]]) holds the points
    offsets[p] .. offsets[p + 1] of ``points`` (training row indices: the first class's, then the second's) and
    ``y`` (+1 for the first class, -1 for the second)."""

    classes: np.ndarray
    pairs: tuple
    points: np.ndarray
    y: np.ndarray
    offsets: np.ndarray

    @property
    def count(self) -> int:
        return len(self.pairs)


def one_vs_one(labels: np.ndarray) -> PairProblems:
    """SVC's binary problems of `labels`, in its order: (0, 1), (0, 2), ..., (1, 2), ... of the sorted classes."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if classes.size < 2:
        raise GpunnError(f"gpu-smo: the training labels hold {classes.size} class(es); an SVM needs at least two")
    members = [np.flatnonzero(labels == c) for c in classes]
    pairs, points, ys, offsets = [], [], [], [0]
    for a in range(classes.size):
        for b in range(a + 1, classes.size):
            pairs.append((a, b))
            points += [members[a], members[b]]
            ys += [np.ones(members[a].size), -np.ones(members[b].size)]
            offsets.append(offsets[-1] + members[a].size + members[b].size)
    return PairProblems(classes, tuple(pairs), np.concatenate(points).astype(np.int32), np.concatenate(ys),
                        np.asarray(offsets, dtype=np.int64))


def violation_sets(y, alpha, c):
    """libsvm's index sets: up (alpha may grow along y) and low (may shrink)."""
    up = ((y > 0) & (alpha < c)) | ((y < 0) & (alpha > 0))
    low = ((y > 0) & (alpha > 0)) | ((y < 0) & (alpha < c))
    return up, low


def gap(y, alpha, grad, c) -> float:
    """The maximal violating pair's gap, max over up of -y g minus min over low of -y g (libsvm stops under eps)."""
    f = -y * grad
    up, low = violation_sets(y, alpha, c)
    if not up.any() or not low.any():
        return -np.inf
    return float(f[up].max() - f[low].min())


def select_working_set(y, alpha, grad, c, q: int, kept=()) -> np.ndarray:
    """Up to q positions: `kept` (the previous working set's first half, at the end), and before them the fresh part
    of q - len(kept): the largest -y g of the up set (half of it), then the smallest of the low set until it is full,
    then more of the up set; the kept points taken by neither side, each part in position order."""
    f = -y * grad
    up, low = violation_sets(y, alpha, c)
    kept = np.asarray(kept, dtype=np.int64)
    up[kept] = low[kept] = False
    return _fresh_and_kept(np.where(up, -f, np.inf), np.where(low, f, np.inf), q, kept)


def _fresh_and_kept(up_key, low_key, q: int, kept: np.ndarray) -> np.ndarray:
    """The working set from the sides' keys (inf: not on that side, or kept): see select_working_set."""
    budget = q - kept.size
    up_order, low_order = _smallest(up_key, budget), _smallest(low_key, budget)
    first = np.sort(up_order[:budget // 2])
    low_part = np.sort(low_order[~np.isin(low_order, first)][:budget - first.size])
    rest = up_order[budget // 2:]
    rest = np.sort(rest[~np.isin(rest, low_part)][:budget - first.size - low_part.size])
    return np.concatenate([first, low_part, rest, kept]).astype(np.int64)


def _smallest(values: np.ndarray, q: int) -> np.ndarray:
    """Positions of the q smallest values in (value, position) order: the first q of a stable sort, found without
    sorting them all (infinite values are never taken)."""
    keep = np.argpartition(values, q - 1)[:q] if values.size > q else np.arange(values.size)
    return _first_by_value(values, keep, q)


def _first_by_value(values: np.ndarray, candidates: np.ndarray, q: int) -> np.ndarray:
    """The first q positions in (value, position) order, given `candidates`: any q positions holding the q smallest
    values (argpartition's, whose choice among ties at the q-th value is its own); finite values only."""
    if candidates.size == 0:
        return candidates
    kth = values[candidates].max()
    below = np.flatnonzero(values < kth)
    keep = np.concatenate([below, np.flatnonzero(values == kth)[: q - below.size]])
    keep = keep[np.isfinite(values[keep])]
    return keep[np.lexsort((keep, values[keep]))]


def select_round(y, alpha, grad, c, offsets, active, q: int, eps: float, previous=None):
    """One round's bookkeeping for the problems `active` (their points offsets[p] .. offsets[p + 1]): those whose gap
    is still at least eps, and for each its working set (global positions), the same as gap() and
    select_working_set() give problem by problem, with -y g and the index sets computed once for all. `previous`:
    {problem: its last working set}, whose first q / 2 points are kept (ThunderSVM's rule: half of each working set
    stays for the next round, which keeps the rounds from zig-zagging between the two sides' extremes)."""
    f = -y * grad
    up, low = violation_sets(y, alpha, c)
    up_key = np.where(up, -f, np.inf)  # the up side's largest -y g first
    low_key = np.where(low, f, np.inf)  # the low side's smallest first
    still, sets = [], []
    for p in active:
        s, e = offsets[p], offsets[p + 1]
        if -up_key[s:e].min() - low_key[s:e].min() < eps:  # -inf where a side is empty
            continue
        kept = np.asarray((previous or {}).get(p, ()), dtype=np.int64)[:q // 2] - s
        ups, lows = up_key[s:e].copy(), low_key[s:e].copy()
        ups[kept] = lows[kept] = np.inf
        still.append(p)
        sets.append(s + _fresh_and_kept(ups, lows, q, kept))
    return still, sets


def rho(y, alpha, grad, c) -> float:
    """libsvm's bias: the mean of y g over the free vectors, else the middle of the bounds the others give."""
    yg = y * grad
    free = (alpha > 0) & (alpha < c)
    if free.any():
        return float(yg[free].mean())
    at_upper = alpha >= c
    ub_mask = (at_upper & (y < 0)) | (~at_upper & (y > 0))
    lb_mask = (at_upper & (y > 0)) | (~at_upper & (y < 0))
    ub = yg[ub_mask].min() if ub_mask.any() else np.inf
    lb = yg[lb_mask].max() if lb_mask.any() else -np.inf
    return float((ub + lb) / 2)


def dual_objective(alpha, grad) -> float:
    """1/2 a'Qa - e'a from the gradient g = Qa - e: 1/2 a'(g - e)."""
    return float(0.5 * alpha @ (grad - 1.0))


class GpuSmo:
    """Fit on a device kernel matrix (float32, the training points' rows and columns), predict from a device
    matrix of (training rows) x (points). ``q``: working-set size (a power of two, at most 1024); ``selection``:
    where the rounds' working sets are chosen (SELECTIONS)."""

    def __init__(self, C: float, eps: float = EPS, q: int = WORKING_SET, log: Callable[[str], None] = print,
                 progress_every_s: float = 15.0, selection: str = "gpu"):
        if selection not in SELECTIONS:
            raise GpunnError(f"gpu-smo: selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
        self.selection = selection
        if not C > 0:
            raise GpunnError(f"gpu-smo: C must be positive, got {C!r}")
        if q < 2 or q > 1024 or q & (q - 1):
            raise GpunnError(f"gpu-smo: the working set must be a power of two from 2 to 1024, got {q}")
        self.C, self.eps, self.q, self.log, self.progress_every_s = float(C), float(eps), int(q), log, progress_every_s

    def width(self, problems: PairProblems) -> int:
        """The working sets' width for these problems: q, or the power of two just above the largest problem."""
        return min(self.q, 1 << int(max(1, np.diff(problems.offsets).max() - 1)).bit_length())

    def warm_up(self, q: int | None = None) -> None:
        """Launch each kernel once on a two-point problem with working sets of q points (default: this solver's),
        so that their compilation (or their load from the kernel cache) is not inside a timed fit."""
        from numba import cuda

        from gpunn.kernels import smo

        q = self.q if q is None else q
        k = cuda.to_device(np.eye(2, dtype=np.float32))
        rows, y = cuda.to_device(np.arange(2, dtype=np.int32)), cuda.to_device(np.array([1.0, -1.0]))
        alpha, grad = cuda.to_device(np.zeros(2)), cuda.to_device(-np.ones(2))
        ws = np.zeros((1, q), dtype=np.int32)
        ws[0, 1] = 1
        d_ws, counts, delta = cuda.to_device(ws), cuda.to_device(np.array([2], np.int32)), cuda.device_array((1, q))
        smo.local_smo(k, rows, rows, y, alpha, grad, d_ws, counts, self.C, self.eps, delta)
        ends = cuda.to_device(np.array([0, 2], np.int32))
        smo.update_grad(k, rows, rows, y, grad, ends[:1], ends[1:], 2, d_ws, counts, delta)
        sv = cuda.to_device(np.array([0, 2], np.int32))
        smo.decision(k, rows, y, sv, cuda.to_device(np.zeros(1)), cuda.device_array((2, 1)))
        if self.selection == "gpu":
            counts0 = cuda.to_device(np.zeros(1, np.int32))
            smo.select_working_sets(y, alpha, grad, cuda.to_device(np.zeros(2, np.int32)), ends[:1], ends[1:], self.C,
                                    self.eps, q, d_ws, counts, cuda.device_array(1), cuda.to_device(ws), counts0)
        cuda.synchronize()

    def fit(self, k_train, labels: np.ndarray) -> GpuSmo:
        """Solve on the training kernel: a square float32 device matrix, or its rows as gpunn.smo_rows gives them
        (a RowCache computes each round's missing rows)."""
        from numba import cuda

        from gpunn.kernels import smo
        from gpunn.smo_rows import FullRows

        source = k_train if hasattr(k_train, "ensure") else FullRows(k_train)
        k, d_slot = source.matrix, source.slot
        problems = one_vs_one(labels)
        n_points = problems.points.size
        sizes = np.diff(problems.offsets)
        q = self.width(problems)
        c, y = self.C, problems.y
        d_rows = cuda.to_device(problems.points)
        d_y = cuda.to_device(y)
        d_alpha = cuda.to_device(np.zeros(n_points))
        d_grad = cuda.to_device(-np.ones(n_points))
        limit = np.maximum(1000, MAX_ROUNDS_PER_POINT * sizes // q)
        rounds = np.zeros(problems.count, dtype=np.int64)
        active = list(range(problems.count))
        started = last_line = time.perf_counter()
        host_s = wait_s = 0.0  # the rounds' copies and selections; their waits for the launches before them
        d_marks = cuda.to_device(np.zeros(n_points, dtype=np.int32)) if self.selection == "gpu" else None
        # every round launches a block for every problem (a converged one's row has no working set: each launch
        # skips it); the working sets and counts alternate between two buffers, the last round's kept half read
        # from one while the next is written into the other
        d_starts = cuda.to_device(problems.offsets[:-1].astype(np.int32))
        d_stops = cuda.to_device(problems.offsets[1:].astype(np.int32))
        widest = int(sizes.max())
        ws_bufs = [cuda.to_device(np.zeros((problems.count, q), dtype=np.int32)) for _ in range(2)]
        count_bufs = [cuda.to_device(np.zeros(problems.count, dtype=np.int32)) for _ in range(2)]
        d_gaps = cuda.device_array(problems.count, dtype=np.float64)
        d_delta = cuda.device_array((problems.count, q), dtype=np.float64)
        d_chunk = cuda.device_array(problems.count, dtype=np.int32)  # a group's counts (the others' zero)
        previous: dict[int, np.ndarray] = {}
        while True:
            t0 = time.perf_counter()
            cuda.synchronize()
            wait_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            turn = int(rounds.max()) % 2  # the rounds so far: every unfinished problem took part in each
            d_ws, d_counts = ws_bufs[turn], count_bufs[turn]
            prev_ws, prev_counts = ws_bufs[1 - turn], count_bufs[1 - turn]
            if d_marks is None:  # on the host: the state copied back, the working sets copied over
                alpha, grad = d_alpha.copy_to_host(), d_grad.copy_to_host()
                still, sets = select_round(y, alpha, grad, c, problems.offsets, active, q, self.eps, previous)
                ws = np.zeros((problems.count, q), dtype=np.int32)
                counts = np.zeros(problems.count, dtype=np.int32)
                for p, w in zip(still, sets):
                    ws[p, :w.size], counts[p] = w, w.size
                previous = dict(zip(still, sets))
                d_ws.copy_to_device(ws)
                d_counts.copy_to_device(counts)
            else:  # on the GPU: only the counts come back
                smo.select_working_sets(d_y, d_alpha, d_grad, d_marks, d_starts, d_stops, c, self.eps, q, d_ws,
                                        d_counts, d_gaps, prev_ws, prev_counts)
                counts = d_counts.copy_to_host()
                still = [p for p in active if counts[p] > 0]
            late = [p for p in still if rounds[p] >= limit[p]]
            if late:
                p = late[0]
                s, e = problems.offsets[p], problems.offsets[p + 1]
                a, b = problems.classes[list(problems.pairs[p])]
                alpha, grad = d_alpha.copy_to_host(), d_grad.copy_to_host()
                raise GpunnError(f"gpu-smo: the problem of classes {a} and {b} did not converge in {rounds[p]} "
                                 f"rounds (gap {gap(y[s:e], alpha[s:e], grad[s:e], c):.3g} > eps {self.eps})")
            host_s += time.perf_counter() - t0
            if not still:
                break
            if isinstance(source, FullRows):
                groups = [(still, d_counts)]
            else:  # the rows each group of problems reads, made present before its launches
                ws_host = ws if d_marks is None else d_ws.copy_to_host()
                groups = self._groups(problems, still, ws_host, counts, source, d_chunk)
            for _group, group_counts in groups:
                smo.local_smo(k, d_rows, d_slot, d_y, d_alpha, d_grad, d_ws, group_counts, c, self.eps, d_delta)
                smo.update_grad(k, d_rows, d_slot, d_y, d_grad, d_starts, d_stops, widest, d_ws, group_counts,
                                d_delta)
            rounds[still] += 1
            active = still
            now = time.perf_counter()
            if now - last_line >= self.progress_every_s:
                last_line = now
                self.log(f"gpu-smo: {problems.count - len(still)} of {problems.count} problems converged after "
                         f"{now - started:.0f} s ({rounds.max()} rounds)")
        self.rows_computed_ = source.computed
        self._finish(problems, d_alpha.copy_to_host(), d_grad.copy_to_host(), rounds, q)
        self.seconds_ = {"total": time.perf_counter() - started, "host": host_s, "waiting for the GPU": wait_s}
        return self

    @staticmethod
    def _groups(problems: PairProblems, still, ws, counts, source, d_chunk):
        """The unfinished problems in groups whose working sets' training rows fit the cache, each group's rows made
        present (source.ensure) as it is yielded with its counts on the device (the other problems' zero)."""
        group, rows = [], np.zeros(0, dtype=np.int64)
        for p in [*still, None]:
            mine = problems.points[ws[p, :counts[p]]] if p is not None else None
            if p is None or (group and np.union1d(rows, mine).size > source.capacity):
                source.ensure(rows)
                chunk = np.zeros(problems.count, dtype=np.int32)
                chunk[group] = np.asarray(counts)[group]
                d_chunk.copy_to_device(chunk)
                yield group, d_chunk
                group, rows = [], np.zeros(0, dtype=np.int64)
            if p is not None:
                group.append(p)
                rows = np.union1d(rows, mine)

    def _finish(self, problems: PairProblems, alpha, grad, rounds, q) -> None:
        from numba import cuda

        c, y = self.C, problems.y
        self.classes_, self.problems_, self.rounds_, self.q_ = problems.classes, problems, rounds, q
        self.rho_ = np.empty(problems.count)
        self.objective_ = np.empty(problems.count)
        sv_rows, sv_coef, offsets = [], [], [0]
        for p in range(problems.count):
            s, e = problems.offsets[p], problems.offsets[p + 1]
            self.rho_[p] = rho(y[s:e], alpha[s:e], grad[s:e], c)
            self.objective_[p] = dual_objective(alpha[s:e], grad[s:e])
            sv = np.flatnonzero(alpha[s:e] > 0)
            sv_rows.append(problems.points[s:e][sv])
            sv_coef.append(y[s:e][sv] * alpha[s:e][sv])
            offsets.append(offsets[-1] + sv.size)
        self.sv_rows_ = np.concatenate(sv_rows).astype(np.int32)
        self.sv_coef_ = np.concatenate(sv_coef)
        self.sv_offsets_ = np.asarray(offsets, dtype=np.int32)
        self.support_ = np.unique(self.sv_rows_)  # training rows that are a support vector of some problem
        self.alpha_ = alpha
        self._device = tuple(cuda.to_device(v) for v in (self.sv_rows_, self.sv_coef_, self.sv_offsets_, self.rho_))

    def decision_function(self, k_rows) -> np.ndarray:
        """(points, problems) decision values from a device (training rows, points) float32 kernel matrix."""
        from numba import cuda

        from gpunn.kernels import smo

        dec = cuda.device_array((k_rows.shape[1], self.problems_.count), dtype=np.float64)
        smo.decision(k_rows, *self._device, dec)
        return dec.copy_to_host()

    def predict(self, k_rows) -> np.ndarray:
        """Labels by one-vs-one votes (a positive decision votes for the pair's first class), ties to the lowest."""
        return vote(self.decision_function(k_rows), self.problems_)


def vote(dec: np.ndarray, problems: PairProblems) -> np.ndarray:
    """libsvm's votes: problem (a, b) votes a where its decision value is positive, else b; the most votes win,
    ties to the lowest class."""
    votes = np.zeros((dec.shape[0], problems.classes.size), dtype=np.int64)
    rows = np.arange(dec.shape[0])
    for p, (a, b) in enumerate(problems.pairs):
        np.add.at(votes, (rows, np.where(dec[:, p] > 0, a, b)), 1)
    return problems.classes[np.argmax(votes, axis=1)]


class GpuSmoRoute:
    """svm method gpu-smo inside gpunn.svm.run_svm: the float32 training kernel (its row blocks from the diagonal
    on, the rest mirrored) and the (training, test) kernel computed on the GPU from float64 scaled features
    (gpunn.kernels.gemm.rbf, rounded once as stored) and kept there, GpuSmo fitted on the first and predicting from
    the second; the GPU is held from the kernels to the last prediction. Where the two matrices do not fit the GPU's
    free memory (or `cache_rows` asks for it), the features stay there instead, the solver reads a RowCache of
    cache_rows rows (default: as many as fit) and predictions come from the kernel a block of PREDICT_BLOCK points
    at a time. The interface of svm's precomputed route: kernels(), fit(), predict() and their times."""

    def __init__(self, C: float, gamma_value: float, log: Callable[[str], None], labels: np.ndarray | None = None,
                 cache_rows: int | None = None):
        self.C, self.gamma_value, self.log, self.labels, self.cache_rows = C, gamma_value, log, labels, cache_rows

    def kernels(self, xs_train: np.ndarray, xs_test: np.ndarray) -> None:
        from numba import cuda

        from gpunn.kernels.gemm import rbf
        from gpunn.rbf_kernel import gb
        from gpunn.smo_rows import COMPUTE_ROWS, FullRows, RowCache

        n, m, d = xs_train.shape[0], xs_test.shape[0], xs_train.shape[1]
        features = 8 * d * (n + m) + 16 * (n + m)
        whole = 4 * n * (n + m) + features
        free = 0.9 * float(cuda.current_context().get_memory_info()[0])
        self.cached = self.cache_rows is not None or whole > free
        self._warm_up()
        t0 = time.perf_counter()
        if self.cached:  # the features stay; the solver's rows come from a cache
            staging = 4 * n * (COMPUTE_ROWS + PREDICT_BLOCK) + 8 * d * COMPUTE_ROWS
            fits = int((free - features - staging) // (4 * n)) if np.isfinite(free) else n  # the simulator: inf
            capacity = min(n, self.cache_rows or fits)
            widest = n if self.labels is None else int(np.diff(one_vs_one(self.labels).offsets).max())
            if capacity < min(widest, WORKING_SET) or capacity > max(fits, 0):  # a working set's rows at least
                raise GpunnError(f"svm method gpu-smo: the float64 features ({n} + {m} x {d}: {gb(features)}) and a "
                                 f"cache of {capacity} kernel rows ({gb(4 * n * capacity)}) do not fit the GPU's "
                                 f"{gb(free / 0.9)} free; use a smaller train_subset")
        self.d_train = cuda.to_device(np.ascontiguousarray(xs_train, dtype=np.float64))
        self.sq_train = cuda.device_array(n, dtype=np.float64)
        rbf.row_sq_norms(self.d_train, self.sq_train)
        if self.cached:
            self.rows = RowCache(self.d_train, self.sq_train, self.gamma_value, capacity)
            cuda.synchronize()
            self.kernel_time = time.perf_counter() - t0
            self.log(f"svm[gpu-smo]: the {n} x {n} float32 kernel matrix and the test kernel ({gb(whole - features)}) "
                     f"{'do not fit the GPU' if whole > free else 'are not kept (cache_rows)'}: a cache of "
                     f"{capacity} kernel rows ({gb(4 * n * capacity)}) computed on demand, predictions a block of "
                     f"{PREDICT_BLOCK} points at a time")
            t0 = time.perf_counter()
            self.d_test = cuda.to_device(np.ascontiguousarray(xs_test, dtype=np.float64))
            self.sq_test = cuda.device_array(m, dtype=np.float64)
            rbf.row_sq_norms(self.d_test, self.sq_test)
            cuda.synchronize()
            self.predict_kernel_time = time.perf_counter() - t0
            return
        self.train_kernel = k = cuda.device_array((n, n), dtype=np.float32)
        for start in range(0, n, KERNEL_BLOCK_ROWS):  # each row block from the diagonal on: half of the FLOP
            stop = min(n, start + KERNEL_BLOCK_ROWS)
            rbf.rbf_gemm(self.d_train[start:stop], self.d_train[start:], k[start:stop, start:],
                         self.sq_train[start:stop], self.sq_train[start:], self.gamma_value)
        rbf.mirror_upper(k)
        self.rows = FullRows(k)
        cuda.synchronize()
        self.kernel_time = time.perf_counter() - t0
        self.log(f"svm[gpu-smo]: {n} x {n} float32 kernel matrix computed on the gpu in {self.kernel_time:.2f} s")
        t0 = time.perf_counter()
        d_test = cuda.to_device(np.ascontiguousarray(xs_test, dtype=np.float64))
        sq_test = cuda.device_array(m, dtype=np.float64)
        rbf.row_sq_norms(d_test, sq_test)
        self.test_kernel = cuda.device_array((n, m), dtype=np.float32)  # (training rows, test points)
        rbf.rbf_gemm(self.d_train, d_test, self.test_kernel, self.sq_train, sq_test, self.gamma_value)
        self.d_train = self.sq_train = None  # the kernels hold all the solver and the predictions read
        cuda.synchronize()
        self.predict_kernel_time = time.perf_counter() - t0

    def _warm_up(self) -> None:
        """Every kernel's first launch on tiny operands of the same types and layouts (a row block past the first is
        a strided view), outside the timed parts: their compilation, or their load from the kernel cache."""
        from numba import cuda

        from gpunn.kernels import rows
        from gpunn.kernels.gemm import rbf

        x = cuda.to_device(np.eye(3))
        sq = cuda.device_array(3)
        rbf.row_sq_norms(x, sq)
        out = cuda.device_array((3, 3), dtype=np.float32)
        for start in (0, 1):
            rbf.rbf_gemm(x[start:start + 1], x[start:], out[start:start + 1, start:], sq[start:start + 1], sq[start:],
                         self.gamma_value)
        rbf.rbf_gemm(x, x, out, sq, sq, self.gamma_value)
        rbf.mirror_upper(out)
        at = cuda.to_device(np.arange(3, dtype=np.int32))
        rows.copy_rows(x, at, cuda.device_array((3, 3)), at)
        rows.copy_rows(out, at, cuda.device_array((3, 3), dtype=np.float32), at)
        if self.labels is not None:
            solver = GpuSmo(self.C, log=self.log)
            solver.warm_up(solver.width(one_vs_one(self.labels)))
        cuda.synchronize()

    def fit(self, y: np.ndarray) -> np.ndarray:
        """The solver on the training kernel; returns the training predictions (train_predict_time: their seconds)."""
        self.model = GpuSmo(self.C, log=self.log).fit(self.rows, y)
        self.support_ = self.model.support_
        t0 = time.perf_counter()
        pred = self._predict(self.d_train, self.sq_train) if self.cached else self.model.predict(self.train_kernel)
        self.train_predict_time = time.perf_counter() - t0
        self.log(f"svm[gpu-smo]: {problems_line(self.model)}")
        return pred

    def predict(self) -> np.ndarray:
        return self._predict(self.d_test, self.sq_test) if self.cached else self.model.predict(self.test_kernel)

    def _predict(self, points, sq_points) -> np.ndarray:
        """Labels of these device points from their kernel against the training features, a block at a time."""
        from numba import cuda

        from gpunn.kernels.gemm import rbf

        dec = []
        for start in range(0, points.shape[0], PREDICT_BLOCK):
            stop = min(points.shape[0], start + PREDICT_BLOCK)
            block = cuda.device_array((self.d_train.shape[0], stop - start), dtype=np.float32)
            rbf.rbf_gemm(self.d_train, points[start:stop], block, self.sq_train, sq_points[start:stop],
                         self.gamma_value)
            dec.append(self.model.decision_function(block))
        return vote(np.concatenate(dec), self.model.problems_)


def problems_line(model: GpuSmo) -> str:
    """One line on a fitted solver: its problems, rounds, support vectors and where its seconds went."""
    seconds = ", ".join(f"{k} {v:.2f} s" for k, v in model.seconds_.items())
    return (f"{model.problems_.count} binary problems solved in {int(model.rounds_.min())}-{int(model.rounds_.max())} "
            f"rounds of working sets of {model.q_}, {model.support_.size} support vectors ({seconds})"
            + (f"; {model.rows_computed_} kernel rows computed on demand" if model.rows_computed_ else ""))
