"""Where a result came from: the device, the host, the thread counts, the package versions and the git commit
of the gpunn checkout that produced it.

A timing is only comparable with another one taken on the same device, with the same BLAS and numba thread
counts and the same code; metrics.json files and every timing CSV row therefore carry this record, so that a
figure mixing two machines, two commits or the CUDA simulator with a real GPU can be spotted (and refused)
from the results alone.

Importing this module imports nothing heavy; only ``collect(uses_gpu=True)`` touches numba.cuda, and the
expensive parts (git, threadpoolctl, the device query) run once per process.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from gpunn import blas_idle

# every key of collect()'s record, in this order
PROVENANCE_KEYS = ("device", "driver", "simulator", "cpu", "hostname", "blas_threads", "blas_idle", "numba_threads",
                   "python", "numpy", "numba", "numba_cuda", "snakemake", "commit", "machine_cores", "cores",
                   "gpu_slot", "gpu_slots", "timing_mode", "placed_at")
# the subset repeated on every row of a timing CSV (columns() gives them)
# (timing_mode: whether a speedup may divide the row's clock)
CSV_COLUMNS = ("device", "driver", "simulator", "blas_threads", "blas_idle", "numba_threads", "numpy", "numba",
               "numba_cuda", "snakemake", "commit", "timing_mode")
SIMULATOR_DEVICE = "cuda-simulator"
CPU_DEVICE = "cpu"
UNKNOWN_COMMIT = "unknown"
# names the commit of a copy of the code whose own git state says nothing (an export, a copy shipped to a GPU
# machine whose .git is another commit's): recorded as given, instead of asking git
COMMIT_VARIABLE = "GPUNN_COMMIT"
GIT_TIMEOUT_S = 5.0
# distribution names whose versions are recorded, by record key
_PACKAGES = {"numpy": "numpy", "numba": "numba", "numba_cuda": "numba-cuda", "snakemake": "snakemake"}


def collect(uses_gpu: bool) -> dict:
    """The provenance record of work done in this process: a flat, JSON-serialisable dict with the keys
    ``PROVENANCE_KEYS``. ``uses_gpu`` says whether the work ran on the CUDA device (a GPU variant or kernel);
    ``device`` is then the GPU's name, or "cuda-simulator" under numba's CUDA simulator, and "cpu" otherwise;
    ``simulator`` is true only for GPU work that ran under the simulator; ``driver`` names the GPU driver of real
    GPU work (driver_version), None otherwise."""
    simulator = bool(uses_gpu) and _simulator_enabled()
    return {
        "device": (SIMULATOR_DEVICE if simulator else gpu_name()) if uses_gpu else CPU_DEVICE,
        "driver": driver_version() if uses_gpu and not simulator else None,
        "simulator": simulator,
        **_host_record(),
        **placement_record(),
    }


def placement_record() -> dict:
    """Where the job ran (gpunn.placement): the machine's cores, the cores this process may use (cpulist), the GPU
    it was given and of how many GPU slots, the timing mode, and when the wrapper had taken its slots (epoch s: from
    then until the job's process exits it holds them); None where nothing placed it."""
    from gpunn import placement

    slots = os.environ.get(placement.GPU_SLOTS_VARIABLE)
    placed_at = os.environ.get(placement.PLACED_AT_VARIABLE)
    return {
        "machine_cores": os.cpu_count(),
        "cores": placement.describe_cores(os.sched_getaffinity(0)),
        "gpu_slot": os.environ.get(placement.GPU_SLOT_VARIABLE),
        "gpu_slots": int(slots) if slots else None,
        "timing_mode": os.environ.get(placement.MODE_VARIABLE),
        "placed_at": float(placed_at) if placed_at else None,
    }


def columns(prov: dict) -> dict:
    """The part of a provenance record that goes into timing CSV columns (``CSV_COLUMNS``)."""
    return {key: prov[key] for key in CSV_COLUMNS}


def _simulator_enabled() -> bool:
    from numba import config  # numba itself, not numba.cuda

    return bool(config.ENABLE_CUDASIM)


@functools.lru_cache(maxsize=1)
def gpu_name() -> str:
    """Name of the current CUDA device ("cuda-simulator" under the simulator, "unavailable" without one)."""
    if _simulator_enabled():
        return SIMULATOR_DEVICE
    from numba import cuda

    if not cuda.is_available():
        return "unavailable"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


@functools.lru_cache(maxsize=1)
def driver_version() -> str | None:
    """The GPU driver as 'NVIDIA 580.159.04, CUDA 13.0': the kernel module's version (NVIDIA_DRIVER_FILE, Linux)
    and the CUDA driver API version it implements; either part alone when only it is known, None without a real
    GPU (or under the simulator)."""
    if _simulator_enabled():
        return None
    parts = []
    try:
        with open(NVIDIA_DRIVER_FILE, encoding="utf-8", errors="replace") as fh:
            words = fh.readline().split()  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>"
        module = next((w for w in words if w[:1].isdigit() and w.count(".") >= 1), None)
        if module:
            parts.append(f"NVIDIA {module}")
    except OSError:
        pass
    try:
        from numba import cuda

        if cuda.is_available():
            major, minor = cuda.cudadrv.driver.driver.get_version()
            parts.append(f"CUDA {major}.{minor}")
    except Exception:  # noqa: BLE001  (a driver that cannot answer leaves the part out; the record still counts)
        pass
    return ", ".join(parts) or None


@functools.lru_cache(maxsize=1)
def _host_record() -> dict:
    from numba import config

    return {
        "cpu": cpu_model(),
        "hostname": socket.gethostname(),
        "blas_threads": blas_threads(),
        # OpenBLAS's idle threads: log2 of the cycles they spin after a GEMM (gpunn.blas_idle), None: its default
        "blas_idle": os.environ.get(blas_idle.VARIABLE),
        "numba_threads": int(config.NUMBA_NUM_THREADS),
        "python": platform.python_version(),
        **{key: package_version(dist) for key, dist in _PACKAGES.items()},
        "commit": os.environ.get(COMMIT_VARIABLE) or git_commit(Path(__file__).resolve().parent),
    }


def cpu_model() -> str:
    """The CPU model string ("model name" in /proc/cpuinfo, else platform.processor()), or ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or ""


def blas_threads() -> int | None:
    """Threads of NumPy's BLAS: from threadpoolctl when importable (it ships with scikit-learn), else from
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, else None (unknown: the library's own default)."""
    try:
        import numpy  # noqa: F401  (loads the BLAS threadpoolctl should find)
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        pools = [pool for pool in threadpool_info() if pool.get("user_api") == "blas"]
        # numpy's own BLAS when several are loaded (scipy's can be another copy)
        own = [pool for pool in pools if "numpy" in str(pool.get("filepath", ""))]
        for pool in own or pools:
            return int(pool["num_threads"])
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            return int(os.environ[variable])
        except (KeyError, ValueError):
            continue
    return None


def package_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_commit(directory) -> str:
    """HEAD of the git checkout holding `directory`, with "-dirty" when tracked files differ from it;
    "unknown" when `directory` is not tracked in a git checkout (an installed package) or git is missing."""

    def git(*args) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    # a package installed inside some other checkout (a virtualenv in a repository) is not that commit's code
    tracked = git("ls-files", "--", ".")
    head = git("rev-parse", "HEAD")
    if not tracked or not tracked.strip() or not head or not head.strip():
        return UNKNOWN_COMMIT
    status = git("status", "--porcelain", "--untracked-files=no")
    return head.strip() + ("-dirty" if status is None or status.strip() else "")  # unreadable status: not clean
