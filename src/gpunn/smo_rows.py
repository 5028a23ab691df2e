"""The training kernel's rows as gpu-smo's solver reads them (gpunn.smo.GpuSmo): a device array K of n columns and
a slot map, training point r's kernel row being K[slot[r]] (gpunn.kernels.smo).

* ``FullRows``: the whole float32 n x n matrix resident, slot the identity (4 n^2 bytes: 10 GB at n = 50 000).
* ``RowCache``: when that does not fit, a cache of ``capacity`` rows; before each round's launches the rows of its
  working sets are made present: the missing ones computed on the GPU from the float64 features kept there (the
  RBF GEMM, gpunn.kernels.gemm.rbf, in blocks of COMPUTE_ROWS), into the slots free or least recently used. A row
  computed here equals the whole matrix's (the same GEMM on the same operands), so the solver takes the same steps;
  it is slower by the rows it recomputes (``computed`` counts them).
"""

from __future__ import annotations

import numpy as np

from gpunn.errors import GpunnError

COMPUTE_ROWS = 1024  # missing rows computed a block at a time (a float32 staging block of 1 024 x n)


class FullRows:
    """The whole training kernel matrix (a square float32 device array)."""

    def __init__(self, k):
        from numba import cuda

        self.matrix, self.capacity, self.computed = k, k.shape[0], 0
        self.slot = cuda.to_device(np.arange(k.shape[0], dtype=np.int32))

    def ensure(self, rows: np.ndarray) -> None:
        """Every row is resident."""


class RowCache:
    """`capacity` kernel rows of the n training points (float64 features x on the device, their squared norms sq,
    the RBF's gamma), computed on demand; least recently used rows make room."""

    def __init__(self, x, sq, gamma: float, capacity: int):
        from numba import cuda

        n = x.shape[0]
        if not 1 <= capacity <= n:
            raise GpunnError(f"gpu-smo: a kernel-row cache holds from 1 to {n} rows, got {capacity}")
        self.x, self.sq, self.gamma, self.capacity, self.computed = x, sq, float(gamma), int(capacity), 0
        self.matrix = cuda.device_array((self.capacity, n), dtype=np.float32)
        self.slot_of = np.full(n, -1, dtype=np.int32)  # each training row's slot, -1 where absent
        self.owner = np.full(self.capacity, -1, dtype=np.int64)  # each slot's training row, -1 where free
        self.used = np.zeros(self.capacity, dtype=np.int64)  # the call that last needed each slot
        self.calls = 0
        self.slot = cuda.to_device(self.slot_of)
        block = min(COMPUTE_ROWS, self.capacity)
        self._x_rows = cuda.device_array((block, x.shape[1]), dtype=np.float64)
        self._sq_rows = cuda.device_array((block, 1), dtype=np.float64)
        self._k_rows = cuda.device_array((block, n), dtype=np.float32)

    def ensure(self, rows: np.ndarray) -> None:
        """Make the kernel rows of these training rows (at most `capacity` distinct ones) resident and update the
        slot map on the device."""
        from numba import cuda

        from gpunn.kernels import rows as moves
        from gpunn.kernels.gemm import rbf

        need = np.unique(np.asarray(rows, dtype=np.int64))
        if need.size > self.capacity:
            raise GpunnError(f"gpu-smo: a round needs {need.size} kernel rows, the cache holds {self.capacity}")
        self.calls += 1
        present = need[self.slot_of[need] >= 0]
        self.used[self.slot_of[present]] = self.calls
        missing = need[self.slot_of[need] < 0]
        if missing.size == 0:
            return
        free = np.flatnonzero(self.owner < 0)
        if free.size < missing.size:  # evict the least recently used slots that this call does not need
            taken = np.flatnonzero((self.owner >= 0) & (self.used < self.calls))
            victims = taken[np.argsort(self.used[taken], kind="stable")][:missing.size - free.size]
            self.slot_of[self.owner[victims]] = -1
            self.owner[victims] = -1
            free = np.flatnonzero(self.owner < 0)
        slots = free[:missing.size]
        for start in range(0, missing.size, self._x_rows.shape[0]):
            part, into = missing[start:start + self._x_rows.shape[0]], slots[start:start + self._x_rows.shape[0]]
            b = part.size
            src, at = cuda.to_device(part.astype(np.int32)), cuda.to_device(np.arange(b, dtype=np.int32))
            moves.copy_rows(self.x, src, self._x_rows[:b], at)
            moves.copy_rows(self.sq.reshape(self.sq.shape[0], 1), src, self._sq_rows[:b], at)
            rbf.rbf_gemm(self._x_rows[:b], self.x, self._k_rows[:b], self._sq_rows[:b, 0], self.sq, self.gamma)
            moves.copy_rows(self._k_rows[:b], at, self.matrix, cuda.to_device(into.astype(np.int32)))
        self.owner[slots] = missing
        self.slot_of[missing] = slots
        self.used[slots] = self.calls
        self.computed += int(missing.size)
        self.slot.copy_to_device(self.slot_of)
