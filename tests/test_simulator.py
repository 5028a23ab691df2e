"""The fix to numba's CUDA simulator in gpunn.kernels.simulator: a block's threads share their shared arrays
whatever the thread scheduling.

The bug it fixes struck at random (issue 8: an epoch loss of 2.8e14 instead of 33.66, once): a thread switch
had to land between the simulator's check for an existing allocation and its store of a new one. These
tests make that switch happen every time: the allocation table is replaced by one whose lookup, on a miss,
waits until every thread of the block has missed too (or a timeout passes). numba's own method then hands
each thread a private array, every time; the fixed one holds a lock across lookup and store, so the first
thread waits out the timeout alone and the others find its array.
"""

import contextlib
import threading

import numpy as np
import pytest
from numba import config, cuda, float32, float64, int32, uint32

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="tests a fix to numba's CUDA simulator")

from numba.cuda.simulator import kernelapi  # noqa: E402

from gpunn.kernels import simulator, softmax  # noqa: E402  (importing a kernel module installs the fix)

from test_racecheck import BLOCK, tree_sum  # noqa: E402


class _MissRendezvous(dict):
    """An allocation table whose lookup, on a miss, returns only after all `parties` threads have missed
    (or `timeout` seconds): forces the thread switch between check and store. Counts the arrays stored."""

    def __init__(self, parties: int, timeout: float):
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=timeout)
        self.stores = 0

    def get(self, key, default=None):
        found = super().get(key, default)
        if found is None:
            # the fixed allocator serialises the lookups: the first waits alone, then goes on
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait()
        return found

    def __setitem__(self, key, value):
        self.stores += 1
        super().__setitem__(key, value)


@pytest.fixture
def forced_switch(monkeypatch):
    """Every simulated launch's shared-array table is a _MissRendezvous, its threads OS threads (numba's
    scheduling); yields the list of tables."""
    tables = []
    timeout = {"s": 10.0}  # every thread arrives well within this on a loaded machine; fixed-allocator tests lower it
    original_init = kernelapi.FakeCUDAShared.__init__

    def init(self, dynshared_size):
        original_init(self, dynshared_size)
        self._allocations = _MissRendezvous(BLOCK, timeout["s"])
        tables.append(self._allocations)

    monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", init)

    def set_timeout(seconds):
        timeout["s"] = seconds

    with simulator.os_threads():  # the bug needs OS threads (greenlets switch only at a syncthreads)
        yield tables, set_timeout


def _block_sums(blocks: int, seed: int):
    x = np.random.default_rng(seed).uniform(1.0, 2.0, blocks * BLOCK).astype(np.float32)
    out = cuda.to_device(np.full(blocks, np.nan, np.float32))
    tree_sum[blocks, BLOCK](cuda.to_device(x), out)  # shared-memory tree sum per block
    return out.copy_to_host(), x.reshape(blocks, BLOCK).astype(np.float64).sum(axis=1)


def test_numba_simulator_gives_threads_private_shared_arrays_on_a_switch(forced_switch, monkeypatch):
    """The bug, shown every time: with numba's own allocation, each of the first block's threads stores its
    own array, and the tree sums slots nobody wrote (later blocks reuse the last stored array)."""
    tables, _ = forced_switch
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", simulator.unpatched())
    got, ref = _block_sums(3, seed=1)
    assert tables[-1].stores == BLOCK
    assert not np.isclose(got[0], ref[0], rtol=1e-6)
    np.testing.assert_allclose(got[1:], ref[1:], rtol=1e-6)


def test_fixed_simulator_shares_one_array_per_block_on_a_switch(forced_switch):
    tables, set_timeout = forced_switch
    set_timeout(0.3)  # the first thread waits this long, alone, holding the allocation lock
    got, ref = _block_sums(3, seed=2)
    assert tables[-1].stores == 1
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_fixed_simulator_softmax_loss_on_a_switch(forced_switch):
    """The flaky test's kernel: the first row's loss is right (with numba's allocation it is whatever the
    unwritten slots held, e.g. 2.8e14)."""
    _, set_timeout = forced_switch
    set_timeout(0.3)
    rng = np.random.default_rng(3)
    rows, classes = 3, 5
    logits = rng.standard_normal((rows, classes)).astype(np.float32)
    labels = rng.integers(0, classes, rows).astype(np.int32)
    dlogits = cuda.to_device(np.full((rows, classes), np.nan, np.float32))
    losses = cuda.to_device(np.full(rows, np.nan, np.float32))
    softmax.softmax_ce_grad(cuda.to_device(logits), cuda.to_device(labels), dlogits, losses, block=BLOCK)
    ref_dlogits, ref_losses = softmax.softmax_ce_grad_ref(logits, labels)
    np.testing.assert_allclose(losses.copy_to_host(), ref_losses, rtol=1e-5)
    np.testing.assert_allclose(dlogits.copy_to_host(), ref_dlogits, rtol=1e-5, atol=1e-7)


def test_fix_is_installed_and_keys_by_kernel_line():
    """Importing a kernel module installs the fix; allocations are keyed by the kernel's file and line, so
    two call sites get two arrays and one call site one array per launch."""
    assert kernelapi.FakeCUDAShared.array is not simulator.unpatched()

    @cuda.jit
    def two_sites(out):
        a = cuda.shared.array(BLOCK, float32)
        b = cuda.shared.array(BLOCK, float32)
        t = cuda.threadIdx.x
        a[t] = float32(t)
        b[t] = float32(10 * t)
        cuda.syncthreads()
        out[t] = a[(t + 1) % BLOCK] + b[(t + 2) % BLOCK]

    out = cuda.to_device(np.full(BLOCK, np.nan, np.float32))
    two_sites[1, BLOCK](out)
    t = np.arange(BLOCK)
    np.testing.assert_array_equal(out.copy_to_host(), (t + 1) % BLOCK + 10 * ((t + 2) % BLOCK))


# ---- the barrier block runner (simulator.patch replaces numba's polling loop)

@cuda.jit
def _rounds(out, active, rounds):
    """Threads below `active` add their neighbours' values over `rounds` syncthreads-separated rounds; the
    others return at once (they leave the block's barrier, as exited threads do on a GPU)."""
    buf = cuda.shared.array(BLOCK, float32)
    t = cuda.threadIdx.x
    if t >= active:
        return
    buf[t] = float32(t)
    for _ in range(rounds):
        cuda.syncthreads()
        v = buf[(t + 1) % active]
        cuda.syncthreads()
        buf[t] += v
    out[cuda.blockIdx.x, t] = buf[t]


def _rounds_reference(active, rounds):
    buf = np.arange(active, dtype=np.float64)
    for _ in range(rounds):
        buf = buf + np.roll(buf, -1)
    return buf


@pytest.mark.parametrize("active", [BLOCK, 5, 1])
def test_barrier_rounds_match_numpy_with_exited_threads(active):
    """Every round sees the previous round's writes; threads that returned early never hold the others."""
    out = cuda.to_device(np.full((2, BLOCK), np.nan, np.float32))
    _rounds[2, BLOCK](out, active, 3)
    got = out.copy_to_host()
    for block in range(2):
        np.testing.assert_array_equal(got[block, :active], _rounds_reference(active, 3))
        assert np.isnan(got[block, active:]).all()


@cuda.jit
def _fails_in_one_thread(out, bad):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == bad:
        out[10 ** 6] = 1.0  # out of bounds: an IndexError in this thread only
    cuda.syncthreads()
    cuda.syncthreads()
    out[t] = 1.0


def test_an_exception_in_one_thread_is_the_launch_error_and_the_next_launch_runs():
    """The failing thread's own error (its thread index named), not the others' aborts; the launch leaves no thread
    behind, and the next launch of the same kernel runs normally."""
    threads = threading.active_count()
    out = cuda.to_device(np.zeros(BLOCK, np.float32))
    with pytest.raises(IndexError, match=r"tid=\[3, 0, 0\]"):
        _fails_in_one_thread[1, BLOCK](out, 3)
    assert threading.active_count() == threads
    _fails_in_one_thread[1, BLOCK](out, BLOCK)  # no thread fails
    np.testing.assert_array_equal(out.copy_to_host(), np.ones(BLOCK, np.float32))


@cuda.jit
def _fails_before_its_first_barrier(out):
    t = cuda.threadIdx.x
    if t == 0:
        out[10 ** 6] = 1.0  # thread 0 fails first: the others then meet the abort at their first syncthreads
    cuda.syncthreads()
    out[t] = 1.0


@pytest.mark.parametrize("os", [False, True])
def test_threads_after_a_failure_abort_at_their_first_barrier(os):
    out = cuda.to_device(np.zeros(BLOCK, np.float32))
    with (simulator.os_threads() if os else contextlib.nullcontext(),
          pytest.raises(IndexError, match=r"tid=\[0, 0, 0\]")):
        _fails_before_its_first_barrier[1, BLOCK](out)
    np.testing.assert_array_equal(out.copy_to_host(), 0)  # no thread passed the barrier


def test_os_threads_run_the_same_rounds_and_errors():
    """`os_threads()` (the OS-thread runner at the `_Barrier`, as debug launches use) gives the greenlets' results
    and errors."""
    with simulator.os_threads():
        out = cuda.to_device(np.full((2, BLOCK), np.nan, np.float32))
        _rounds[2, BLOCK](out, 5, 3)
        with pytest.raises(IndexError, match=r"tid=\[3, 0, 0\]"):
            _fails_in_one_thread[1, BLOCK](cuda.to_device(np.zeros(BLOCK, np.float32)), 3)
    assert not simulator._state["os_threads"]
    got = out.copy_to_host()
    for block in range(2):
        np.testing.assert_array_equal(got[block, :5], _rounds_reference(5, 3))


# ---- the faster simulator: debug launches keep numba's threads, device calls, casts, dynamic shared memory

_rounds_debug = cuda.jit(debug=True)(_rounds.py_func)


def test_a_debug_launch_runs_on_numbas_own_threads_with_the_same_rounds(monkeypatch):
    """debug=True launches (numba's debug wrapper) take numba's BlockThread at a `_Barrier`, one per block."""
    barriers = []

    class CountedBarrier(simulator._Barrier):
        def __init__(self, threads):
            super().__init__(threads)
            barriers.append(threads)

    monkeypatch.setattr(simulator, "_Barrier", CountedBarrier)
    out = cuda.to_device(np.full((2, BLOCK), np.nan, np.float32))
    _rounds_debug[2, BLOCK](out, 5, 3)
    got = out.copy_to_host()
    for block in range(2):
        np.testing.assert_array_equal(got[block, :5], _rounds_reference(5, 3))
    assert barriers == [BLOCK, BLOCK]
    _rounds[2, BLOCK](out, 5, 3)  # not a debug launch: greenlets, no barrier
    assert barriers == [BLOCK, BLOCK]


@cuda.jit(device=True)
def _lane_times(k):
    return cuda.threadIdx.x * k  # this module's `cuda`: the launch's fake module while a launch runs


@cuda.jit
def _calls_a_device_function(out):
    t = cuda.threadIdx.x
    out[t] = _lane_times(uint32(3)) + float32(0.5)


def test_device_functions_see_the_launch_and_the_module_is_restored_after_it():
    """A device function's module is swapped to the launch's fake `cuda` once, at its first call, and back when the
    launch ends; a second swap of the same module in the launch (another thread's) changes nothing."""
    real = globals()["cuda"]
    out = cuda.to_device(np.full(BLOCK, np.nan, np.float32))
    _calls_a_device_function[1, BLOCK](out)
    np.testing.assert_array_equal(out.copy_to_host(), 3 * np.arange(BLOCK) + 0.5)
    assert globals()["cuda"] is real and not simulator._swapped
    fake = object()
    simulator._swap_in(globals(), fake)
    try:
        assert globals()["cuda"] is fake
        simulator._swap_in(globals(), object())  # already swapped in this launch: kept
        assert globals()["cuda"] is fake
    finally:
        simulator._restore_swapped()
    assert globals()["cuda"] is real and not simulator._swapped


def _outcome(call, *args):
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001  (the same error is the expected outcome)
        return type(exc)


def test_scalar_casts_are_numbas_values_and_signatures_stay_signatures():
    numbas = simulator._state["type_call"]  # numba's own Type.__call__
    for value in (7, 7.9, -1, np.int64(2**33 + 5), np.float64(1.5), np.uint32(9), True):
        for numba_type in (uint32, int32, float32, float64):
            got, want = _outcome(numba_type, value), _outcome(numbas, numba_type, value)
            assert type(got) is type(want) and (got is want or got == want), (numba_type, value, got, want)
    assert str(float32(float32, uint32)) == "(float32, uint32) -> float32"  # a signature, as numba's


@cuda.jit
def _dynamic_reverse(x, out):
    buf = cuda.shared.array(0, float32)  # dynamic shared memory: numba's own allocation
    t = cuda.threadIdx.x
    buf[t] = x[t]
    cuda.syncthreads()
    out[t] = buf[cuda.blockDim.x - 1 - t]


def test_dynamic_shared_memory_keeps_numbas_buffer():
    x = np.arange(BLOCK, dtype=np.float32)
    out = cuda.to_device(np.full(BLOCK, np.nan, np.float32))
    _dynamic_reverse[1, BLOCK, 0, BLOCK * 4](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), x[::-1])


@cuda.jit
def _marks_its_thread(out):
    t = cuda.threadIdx.x
    out[cuda.blockIdx.x, t] = cuda.blockIdx.x * 100 + t


@cuda.jit
def _notes_its_thread(out):
    t = cuda.threadIdx.x
    thread = simulator.current_thread()  # the simulated thread (plain Python under the simulator)
    out[cuda.blockIdx.x, t] = getattr(thread, "_noted", 0)
    thread._noted = 1


_SEEN: list = []


@cuda.jit
def _names_its_thread(out):
    _SEEN.append(repr(simulator.current_thread()))  # plain Python under the simulator
    out[cuda.threadIdx.x] = 1


def test_a_simulated_thread_reads_as_numbas_and_numbas_module_sees_it():
    """A thread's repr is numba's BlockThread text (it never ran Thread.__init__); numba's fake module finds the
    running thread through simulator.current_thread and the rest of `threading` as before."""
    _SEEN.clear()
    _names_its_thread[2, 2](cuda.to_device(np.zeros(2, np.int64)))
    assert sorted(_SEEN) == sorted(f"Thread <<<({b}, 0, 0), ({t}, 0, 0)>>>" for b in range(2) for t in range(2))
    assert kernelapi.threading.current_thread is simulator.current_thread
    assert kernelapi.threading.Lock is threading.Lock
    assert simulator.current_thread() is threading.current_thread()  # outside a launch: the OS thread


def test_each_block_starts_on_new_threads():
    """Block after block: each thread's indices are the block's, and an attribute set on a thread during a block
    (as the race checker's barrier count) is not there in the next."""
    out = cuda.to_device(np.full((3, BLOCK), -1, np.int64))
    _marks_its_thread[3, BLOCK](out)
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(3)[:, None] * 100 + np.arange(BLOCK))
    noted = cuda.to_device(np.full((3, BLOCK), -1, np.int64))
    _notes_its_thread[3, BLOCK](noted)
    np.testing.assert_array_equal(noted.copy_to_host(), 0)


@cuda.jit
def _exits_in_one_thread(out, bad):
    t = cuda.threadIdx.x
    if t == bad:
        raise SystemExit  # numba's BlockThread.run catches Exception only: the thread ends, the launch goes on
    out[t] = 1.0


def test_a_thread_that_exits_ends_alone_and_the_next_block_runs():
    out = cuda.to_device(np.zeros(BLOCK, np.float32))
    _exits_in_one_thread[1, BLOCK](out, 2)
    got = out.copy_to_host()
    assert got[2] == 0 and (np.delete(got, 2) == 1).all()  # as numba's simulator: no error, that thread's write missing
    marks = cuda.to_device(np.full((2, BLOCK), -1, np.int64))
    _marks_its_thread[2, BLOCK](marks)
    np.testing.assert_array_equal(marks.copy_to_host(), np.arange(2)[:, None] * 100 + np.arange(BLOCK))


@cuda.jit
def _interrupted_in_one_thread(out, bad):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == bad:
        raise KeyboardInterrupt  # Ctrl-C lands in whatever a greenlet is running
    cuda.syncthreads()
    out[t] = 1.0


def test_ctrl_c_in_a_thread_stops_the_launch():
    """A KeyboardInterrupt is not a thread's error (numba's threads catch Exception only): it stops the launch, and
    the threads left at their barrier are dropped; the next launch runs."""
    out = cuda.to_device(np.zeros(BLOCK, np.float32))
    with pytest.raises(KeyboardInterrupt):
        _interrupted_in_one_thread[1, BLOCK](out, 2)
    _interrupted_in_one_thread[1, BLOCK](out, BLOCK)
    np.testing.assert_array_equal(out.copy_to_host(), np.ones(BLOCK, np.float32))
