"""Shared pytest setup.

On machines without an NVIDIA driver (no ``nvidia-smi`` on PATH) the numba.cuda kernels run under the
CUDA simulator, so ``NUMBA_ENABLE_CUDASIM=1`` is set here; on the GPU machine it is left unset and the
real device is used. Numba reads these variables when it is first imported, and pytest imports this
file before any test module, so nothing may import numba above this point. ``setdefault`` lets a user
override either choice from the environment.

The timed code paths take the machine-wide timing lock (gpunn.timing_lock); the tests use a lock file of
their own (GPUNN_TIMING_LOCK, inherited by the subprocesses they start; one per pytest-xdist worker), so they
never wait for, nor delay, a real timed job on the same machine, nor each other.
"""

import atexit
import os
import shutil
import tempfile

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


# The longest file first: test_smoke_pipeline.py runs the pipeline locally and on Slurm (about 15 of the
# suite's minutes on 2 cores). With pytest-xdist's --dist loadfile, files go to workers in collection order, so
# started last it would end minutes after the other worker ran out of files. A stable sort: every worker
# collects the same order, and within each file the order stays as written.
LONGEST_FIRST = ("test_smoke_pipeline.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)
