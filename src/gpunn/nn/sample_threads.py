"""Sample-parallel passes of the NumPy layers: a batch's copies and elementwise work cut into contiguous ranges of
samples that run on a pool of threads (NumPy releases the GIL inside each array operation).

Each range applies the same operation to its samples as one call over the whole batch would, so every output
element is the same bits whatever the thread count (an elementwise pass of several operations may run each range in
blocks of samples that fit a core's cache, BLOCK_ELEMENTS, so that one operation's output is still in cache for the
next); GEMMs and reductions across samples stay single calls (BLAS
threads those itself). The thread count is the job's: OMP_NUM_THREADS (the pipeline and the bench set it to a job's
`threads`), else the cores this process may run on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# elements of work per range (1 MB of float32): a range's work must dwarf the tens of microseconds a thread takes to
# start on it and to take the GIL; a smaller pass stays on the calling thread
MIN_ELEMENTS = 1 << 18
# elements of work per block within a range (256 KB of float32 in each array the pass touches): about a core's L2
BLOCK_ELEMENTS = 1 << 16
BLOCKED_FROM = 32  # blocks of a pass below which it runs unblocked (the CNN's 64x32x24x24 activations: 18)
THREADS_VARIABLE = "OMP_NUM_THREADS"

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def thread_count() -> int:
    """Threads a pass may use: OMP_NUM_THREADS when it is a positive integer, else the cores of this process."""
    value = os.environ.get(THREADS_VARIABLE, "")
    if value.strip().isdigit() and int(value) > 0:
        return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def sample_ranges(n: int, elements: int, threads: int | None = None) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges covering n samples: one per thread, fewer when the pass (`elements` in all)
    would give a range under MIN_ELEMENTS, never an empty one."""
    threads = thread_count() if threads is None else threads
    parts = max(1, min(threads, n, elements // MIN_ELEMENTS))
    bounds = [n * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpunn-samples")
            _pool_size = workers
        return _pool


def _blocked(n: int, elements: int, fn: Callable[[int, int], object], block: int | None):
    """fn over [start, end) in consecutive blocks of samples of about `block` elements (at least one sample); in one
    piece when `block` is None or the pass is under BLOCKED_FROM blocks (it stays in cache as it is)."""
    if block is None or elements < BLOCKED_FROM * block:
        return fn
    step = max(1, block * n // max(elements, 1))

    def run(start: int, end: int) -> None:
        for s in range(start, end, step):
            fn(s, min(s + step, end))

    return run


def over_samples(n: int, elements: int, fn: Callable[[int, int], object], block: int | None = None) -> None:
    """fn(start, end) over the sample_ranges of a pass over n samples (`elements` in all), each range in blocks of
    about `block` elements when given (_blocked): the first range on the calling thread, the others on the pool;
    returns when all are done and raises the first error any of them raised."""
    ranges = sample_ranges(n, elements)
    run = _blocked(n, elements, fn, block)
    if len(ranges) == 1:
        run(0, n)
        return
    pool = _executor(len(ranges) - 1)
    futures = [pool.submit(run, s, e) for s, e in ranges[1:]]
    try:
        run(*ranges[0])
    finally:
        for future in futures:
            future.result()

