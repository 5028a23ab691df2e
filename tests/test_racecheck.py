"""The simulator race checker (gpunn.kernels.racecheck) catches what it claims to, and passes correct kernels.

Why it exists: a kernel with a race gives, under the simulator, a result that depends on thread scheduling,
so an output comparison fails now and then (heavy machine load) instead of every time. Under the checker
the same kernel fails deterministically. The whole kernel suite can run under it:
``GPUNN_RACECHECK=1 python -m pytest tests/test_kernels_*.py tests/test_gpu_*.py`` (tests/conftest.py).
"""

import numpy as np
import pytest
from numba import config, cuda, float32

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="the race checker instruments the simulator")

from gpunn.kernels.racecheck import RaceError, racecheck  # noqa: E402

BLOCK = 8


@cuda.jit
def tree_sum(x, out):
    """Block sums of x, correct: a barrier after the stores and after every tree level."""
    buf = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    buf[t] = x[cuda.blockIdx.x * BLOCK + t]
    cuda.syncthreads()
    s = BLOCK // 2
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[cuda.blockIdx.x] = buf[0]


@cuda.jit
def tree_sum_missing_first_barrier(x, out):
    buf = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    buf[t] = x[cuda.blockIdx.x * BLOCK + t]
    s = BLOCK // 2
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]  # reads a neighbour's store with no barrier between
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[cuda.blockIdx.x] = buf[0]


@cuda.jit
def reuse_without_barrier(x, out):
    """Reads buf[0] after the tree, then overwrites buf before every thread has read it."""
    buf = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    cuda.syncthreads()
    first = buf[0]
    buf[t] = first * 2  # thread 0 may overwrite buf[0] while another thread still reads it
    cuda.syncthreads()
    out[t] = buf[t]


@cuda.jit
def every_block_writes_one_element(out):
    if cuda.threadIdx.x == 0:
        out[0] = cuda.blockIdx.x


@cuda.jit
def atomic_count(out):
    cuda.atomic.add(out, 0, 1.0)


@cuda.jit
def atomic_then_plain_read(out, seen):
    cuda.atomic.add(out, 0, 1.0)
    seen[cuda.threadIdx.x] = out[0]  # a plain read racing with the other threads' atomics


@cuda.jit
def reads_shared_before_any_write(out):
    buf = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    if t > 0:
        buf[t] = t
    cuda.syncthreads()
    out[t] = buf[(t + 1) % BLOCK] + buf[0]  # buf[0] was never written: garbage on a GPU


def _data():
    x = np.random.default_rng(0).standard_normal(3 * BLOCK).astype(np.float32)
    return cuda.to_device(x), x


def test_correct_kernels_pass_and_compute():
    d_x, x = _data()
    out = cuda.to_device(np.full(3, np.nan, np.float32))
    counter = cuda.to_device(np.zeros(1, np.float32))
    with racecheck():
        tree_sum[3, BLOCK](d_x, out)
        atomic_count[2, 5](counter)
    np.testing.assert_allclose(out.copy_to_host(), x.reshape(3, BLOCK).sum(axis=1), rtol=1e-6)
    assert counter.copy_to_host()[0] == 10


@pytest.mark.parametrize(("kernel", "found"), [
    (tree_sum_missing_first_barrier, "shared memory"),
    (reuse_without_barrier, "shared memory element 0"),
])
def test_missing_barriers_fail_every_time(kernel, found):
    d_x, _ = _data()
    out = cuda.device_array(3 * BLOCK, np.float32)
    for _ in range(3):  # not a matter of luck: the same report each time
        with racecheck(), pytest.raises(RaceError, match=found):
            kernel[3, BLOCK](d_x, out)


def test_unordered_blocks_race_on_global_memory():
    out = cuda.device_array(1, np.float32)
    with racecheck(), pytest.raises(RaceError, match=r"global memory .* block \(0, 0, 0\) .* block \(1, 0, 0\)"):
        every_block_writes_one_element[2, 4](out)


def test_atomics_against_a_plain_read_race():
    out = cuda.to_device(np.zeros(1, np.float32))
    seen = cuda.device_array(4, np.float32)
    with racecheck(), pytest.raises(RaceError, match="atomic write"):
        atomic_then_plain_read[1, 4](out, seen)


def test_uninitialised_shared_reads_are_reported():
    out = cuda.device_array(BLOCK, np.float32)
    with racecheck(), pytest.raises(RaceError, match="uninitialised read .* element 0"):
        reads_shared_before_any_write[1, BLOCK](out)


def test_checker_is_removed_afterwards():
    """Outside the block kernels run unchecked again (a racy kernel completes)."""
    d_x, _ = _data()
    out = cuda.device_array(3 * BLOCK, np.float32)
    with racecheck(), pytest.raises(RaceError):
        reuse_without_barrier[1, BLOCK](d_x, out)
    reuse_without_barrier[1, BLOCK](d_x, out)


@cuda.jit
def local_partly_initialised(out):
    acc = cuda.local.array(4, float32)
    for i in range(3):  # acc[3] is never set
        acc[i] = 0.0
    for i in range(4):
        acc[i] += 1.0
    out[cuda.threadIdx.x] = acc[0] + acc[3]


def test_uninitialised_local_reads_are_reported():
    out = cuda.device_array(2, np.float32)
    with racecheck(), pytest.raises(RaceError, match=r"uninitialised read: local array element 3"):
        local_partly_initialised[1, 2](out)
