"""Provenance records: their keys, the device naming, the commit of the checkout, the thread counts, and
that asking for them without a GPU never touches numba.cuda."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from numba import config

from gpunn import provenance
from gpunn.errors import GpunnError
from gpunn.backends.registry import GPU_MLP_VARIANTS, uses_gpu


def test_cpu_record_has_exactly_the_documented_keys():
    prov = provenance.collect(uses_gpu=False)
    assert tuple(prov) == provenance.PROVENANCE_KEYS
    assert prov["device"] == "cpu" and prov["simulator"] is False and prov["driver"] is None
    assert prov["numpy"] == metadata.version("numpy") and prov["numba"] == metadata.version("numba")
    assert prov["numba_threads"] == config.NUMBA_NUM_THREADS
    assert prov["hostname"] and isinstance(prov["cpu"], str)
    assert prov["commit"] == "unknown" or len(prov["commit"].split("-")[0]) == 40
    assert json.loads(json.dumps(prov)) == prov
    assert tuple(provenance.columns(prov)) == provenance.CSV_COLUMNS
    assert provenance.columns(prov)["device"] == "cpu"


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="names the simulator only under it")
def test_gpu_work_under_the_simulator_says_so():
    prov = provenance.collect(uses_gpu=True)
    assert prov["device"] == "cuda-simulator" and prov["simulator"] is True
    assert prov["driver"] is None  # the simulator has no driver to name


def test_driver_version_reads_the_kernel_module_line(tmp_path, monkeypatch):
    """The NVIDIA kernel module's version comes from its /proc line; with no such file and no CUDA driver, None."""
    version_file = tmp_path / "version"
    version_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Jun 3 2025\n"
                            "GCC version:  gcc version 12.2.0\n")
    monkeypatch.setattr(provenance, "_simulator_enabled", lambda: False)
    monkeypatch.setattr(provenance, "NVIDIA_DRIVER_FILE", str(version_file))
    provenance.driver_version.cache_clear()
    try:
        assert provenance.driver_version().startswith("NVIDIA 580.159.04")
        monkeypatch.setattr(provenance, "NVIDIA_DRIVER_FILE", str(tmp_path / "absent"))
        provenance.driver_version.cache_clear()
        found = provenance.driver_version()
        assert found is None or found.startswith("CUDA ")  # only a real CUDA driver could answer here
    finally:
        provenance.driver_version.cache_clear()


def test_cpu_record_never_imports_numba_cuda():
    code = ("import sys\nfrom gpunn import provenance\nassert 'numba.cuda' not in sys.modules\n"
            "provenance.collect(uses_gpu=False)\nprint('numba.cuda' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_commit_of_a_checkout_clean_dirty_and_untracked(tmp_path):
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance.git_commit(package) == head
    (package / "notes.txt").write_text("untracked\n")
    assert provenance.git_commit(package) == head  # untracked files do not change the code that ran
    (package / "__init__.py").write_text("x = 2\n")
    assert provenance.git_commit(package) == head + "-dirty"
    # a directory that git does not track (an installed package inside some checkout) is not that commit
    (repo / "venv").mkdir()
    assert provenance.git_commit(repo / "venv") == "unknown"


def test_commit_unknown_outside_git_or_without_git(tmp_path, monkeypatch):
    assert provenance.git_commit(tmp_path) == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable
    assert provenance.git_commit(os.path.dirname(provenance.__file__)) == "unknown"


def test_blas_threads_without_threadpoolctl(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # makes the import fail
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert provenance.blas_threads() == 3
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert provenance.blas_threads() == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert provenance.blas_threads() is None


def test_blas_threads_from_threadpoolctl():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    pools = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    if not pools:
        pytest.skip("no BLAS loaded that threadpoolctl can see")
    assert provenance.blas_threads() in {p["num_threads"] for p in pools}


def test_uses_gpu_comes_from_the_registry():
    assert not uses_gpu("cpu-numpy") and not uses_gpu("cpu-serial")
    assert all(uses_gpu(v) for v in GPU_MLP_VARIANTS)
    with pytest.raises(GpunnError, match="unknown variant 'gpu-fast'"):
        uses_gpu("gpu-fast")


def test_time_batches_rows_carry_their_variants_provenance(tmp_path):
    from gpunn import cli
    from gpunn.timing import TIMING_COLUMNS

    import pandas as pd

    out = tmp_path / "timing.csv"
    assert cli.main(["time-batches", "--variants", "cpu-numpy", "gpu-naive", "--batches", "2", "--hidden", "4",
                     "--features", "8", "--repeats", "1", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == TIMING_COLUMNS
    assert tuple(TIMING_COLUMNS[-len(provenance.CSV_COLUMNS):]) == provenance.CSV_COLUMNS
    cpu, gpu = (frame[frame["variant"] == v].iloc[0] for v in ("cpu-numpy", "gpu-naive"))
    assert cpu["device"] == "cpu" and not cpu["simulator"]
    assert gpu["device"] == provenance.gpu_name() and bool(gpu["simulator"]) == bool(config.ENABLE_CUDASIM)
    assert cpu["numpy"] == metadata.version("numpy") and cpu["commit"] == gpu["commit"]


def test_commit_named_by_the_environment_wins(monkeypatch):
    code = "from gpunn import provenance\nprint(provenance.collect(uses_gpu=False)['commit'])"
    env = {**os.environ, provenance.COMMIT_VARIABLE: "0123abc-exported"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0123abc-exported"
