"""Shared pytest setup.

On machines without an NVIDIA driver (no ``nvidia-smi`` on PATH) the numba.cuda kernels run under the
CUDA simulator, so ``NUMBA_ENABLE_CUDASIM=1`` is set here; on the GPU machine it is left unset and the
real device is used. Numba reads these variables when it is first imported, and pytest imports this
file before any test module, so nothing may import numba above this point. ``setdefault`` lets a user
override either choice from the environment.

The timed code paths take the machine-wide timing lock (gpunn.timing_lock); the tests use a lock file of
their own (GPUNN_TIMING_LOCK, inherited by the subprocesses they start; one per pytest-xdist worker), so they
never wait for, nor delay, a real timed job on the same machine, nor each other. Likewise a kernel cache folder of
their own (GPUNN_KERNEL_CACHE).
"""

import atexit
import collections
import csv
import os
import shutil
import tempfile
import time

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# Tiny test grids trigger numba's low-occupancy warnings; they are noise here.
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

# One lock file per test process: with pytest-xdist each worker (PYTEST_XDIST_WORKER, set before this file is
# imported) makes its own instead of inheriting the controller's, so one worker's timed jobs never wait for, nor
# fail, another worker's lock tests. A lock path the user set (no GPUNN_TESTS_LOCK_OF) is kept.
_process = os.environ.get("PYTEST_XDIST_WORKER", "main")
if "GPUNN_TIMING_LOCK" not in os.environ or os.environ.get("GPUNN_TESTS_LOCK_OF", _process) != _process:
    _lock_dir = tempfile.mkdtemp(prefix=f"gpunn-tests-{_process}-")
    atexit.register(shutil.rmtree, _lock_dir, True)
    os.environ["GPUNN_TIMING_LOCK"] = os.path.join(_lock_dir, "timing.lock")
    os.environ["GPUNN_TESTS_LOCK_OF"] = _process

# Compiled kernels and cpu-serial's functions (gpunn.kernel_cache) go to a folder of this test process, removed at
# its end, not to the user's cache: the subprocesses it starts (pipeline jobs) share it. A folder the user set stays.
if "GPUNN_KERNEL_CACHE" not in os.environ or os.environ.get("GPUNN_TESTS_CACHE_OF", _process) != _process:
    _cache_dir = tempfile.mkdtemp(prefix=f"gpunn-tests-cache-{_process}-")
    atexit.register(shutil.rmtree, _cache_dir, True)
    os.environ["GPUNN_KERNEL_CACHE"] = _cache_dir
    os.environ["GPUNN_TESTS_CACHE_OF"] = _process

import pytest  # noqa: E402

from snakemake_helpers import copy_workflow  # noqa: E402


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory):
    """A copy of the workflow of this checkout in a temporary folder (see snakemake_helpers.copy_workflow)."""
    return copy_workflow(tmp_path_factory.mktemp("workflow"))


@pytest.fixture(autouse=os.environ.get("GPUNN_RACECHECK") == "1")
def racecheck_every_launch():
    """With GPUNN_RACECHECK=1 (simulator only), every kernel a test launches runs under the race checker
    (gpunn.kernels.racecheck), so a racy kernel fails its tests instead of failing now and then."""
    from gpunn.kernels.racecheck import racecheck

    with racecheck():
        yield


# The longest files first, longest first (their times: a whole run's --durations, in
# docs/notes/issue-38-suite-time.md). With pytest-xdist's --dist loadfile a free worker takes the next file in this
# order, so a long file started last would end minutes after the other worker ran out of files; longest first, the
# short files even out the end. xdist (3.8) would reorder the files by their number of tests instead:
# pytest_configure turns that off. A stable sort: every worker collects the same order, within each file the order
# stays as written, and the files not named keep theirs after these.
LONGEST_FIRST = (
    "test_smoke_pipeline.py",  # the pipeline locally, then on Slurm
    "test_reruns.py",
    "test_kernels_conv_winograd.py",
    "test_report.py",
    "test_kernels_gemm.py",
    "test_kernels_wgrad_bias.py",
    "test_kernels_conv_pool.py",
    "test_placement.py",
    "test_readme.py",
    "test_bench.py",
    "test_kernels_conv_up.py",
    "test_gpu_autoencoder.py",
    "test_gpu_pool_fusion.py",
    "test_kernels_conv_gemm.py",
    "test_gpu_upsample_fusion.py",
    "test_kernels_conv.py",
    "test_linear_head.py",
    "test_workflow.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's --dist loadfile: keep LONGEST_FIRST's order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


# ---- the budget guard: the suite's time, each worker's load and the slowest tests, printed after every run
SUITE_BUDGET_S = 12 * 60  # the tests' budget on CI's 2-core machine (README, docs/development.md: Tests)
SLOWEST_SHOWN = 15
GUARD_FROM_TESTS = 100  # runs of fewer tests (one file, a -k selection) print no guard
_clock = {"start": None, "busy": collections.Counter(), "done": {}, "tests": collections.Counter(), "worker": {}}


def pytest_sessionstart(session):
    _clock["start"] = time.monotonic()


def pytest_runtest_logreport(report):
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    _clock["busy"][worker] += report.duration
    _clock["tests"][report.nodeid] += report.duration
    _clock["worker"][report.nodeid] = worker
    _clock["done"][worker] = time.monotonic() - _clock["start"]


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or _clock["start"] is None or len(_clock["tests"]) < GUARD_FROM_TESTS:
        return  # a worker process (the controller reports), or a run of a few tests
    wall = time.monotonic() - _clock["start"]
    write = terminalreporter.write_line
    terminalreporter.section("suite time (budget guard, docs/development.md: Tests)")
    verdict = "within" if wall <= SUITE_BUDGET_S else f"OVER by {_mmss(wall - SUITE_BUDGET_S)}: shorten the slowest"
    write(f"suite: {_mmss(wall)} wall, {verdict} the {_mmss(SUITE_BUDGET_S)} budget of the whole suite on 2 cores")
    for worker in sorted(_clock["busy"]):
        write(f"  {worker}: {_mmss(_clock['busy'][worker])} of tests, its last test ended at "
              f"{_mmss(_clock['done'][worker])}")
    write(f"the {SLOWEST_SHOWN} slowest tests (setup + call + teardown, seconds):")
    for nodeid, seconds in _clock["tests"].most_common(SLOWEST_SHOWN):
        write(f"  {seconds:7.1f}  {nodeid}")
    times = os.environ.get("GPUNN_SUITE_TIMES")
    if times:  # every test's time and worker, for a per-file table (docs/notes/issue-38-suite-time.md)
        with open(times, "w", newline="") as out:
            rows = csv.writer(out)
            rows.writerow(["test", "file", "worker", "seconds"])
            for nodeid, seconds in _clock["tests"].most_common():
                rows.writerow([nodeid, nodeid.split("::")[0], _clock["worker"][nodeid], f"{seconds:.3f}"])
        write(f"every test's time: {times}")
