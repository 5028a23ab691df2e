"""Where compiled GPU kernels are kept between jobs: numba-cuda's on-disk kernel cache (``cache=True``, which every
gpunn kernel gets through gpunn.kernels.jit; cpu-serial's njit functions use the same folder through numba's CPU
cache) under one folder per state of gpunn's source.

The folder is ``$GPUNN_KERNEL_CACHE`` if set, else ``$XDG_CACHE_HOME/gpunn/kernels`` (``~/.cache/gpunn/kernels``);
``GPUNN_KERNEL_CACHE=off`` turns the cache off (every job compiles every kernel, as before the cache). Inside it,
one subfolder per source state: a hash of every .py file of the gpunn package and of numba's and numba-cuda's
versions. numba keys an entry on the kernel's bytecode, the values its factory closed over, its signature and the
GPU's compute capability, but not on the device functions and constants it reads from other modules, nor on its
compile options: the source hash covers the first (any edit to gpunn starts a fresh subfolder), and
gpunn.kernels.jit names each kernel after its options for the second. Subfolders beyond the KEEP most recently
used are removed when a new one is made. ``python -m gpunn kernel-cache`` shows the folder (``--clear`` empties it).
Nothing here imports numba until configure() runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

VARIABLE = "GPUNN_KERNEL_CACHE"
OFF_VALUES = ("off", "0", "false", "no", "none")
KEEP = 4  # source states kept side by side (a few checkouts or branches on one machine)
PACKAGE = Path(__file__).resolve().parent
_configured: Path | None = None
_decided = False  # configure() has chosen _configured (None: off or unwritable)


def root() -> Path | None:
    """The cache's folder for every source state, None when GPUNN_KERNEL_CACHE turns it off."""
    value = os.environ.get(VARIABLE)
    if value is not None and value.strip().lower() in OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpunn" / "kernels"


def source_state() -> str:
    """16 hex digits naming the compiled code's inputs: every .py file of the package (its path inside the package
    and its bytes) and the numba and numba-cuda versions."""
    from importlib import metadata

    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("numba", "numba-cuda"):
        try:
            digest.update(f"{dist}={metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=absent\0".encode())
    return digest.hexdigest()[:16]


def byte_compile_kernels() -> None:
    """Write the kernels package's missing or stale .pyc files before its modules load (gpunn.kernels does this on
    import). numba hashes the values a kernel's factory closes over by pickling them, and a function's pickle
    differs between code compiled from source and code loaded from a .pyc (which strings are one object): without
    this, the first job after a checkout or an edit would store entries that every later job misses. Nothing is
    written where Python writes no bytecode (PYTHONDONTWRITEBYTECODE): every process then compiles from source,
    and their keys agree."""
    import sys

    if sys.dont_write_bytecode:
        return
    import compileall

    compileall.compile_dir(PACKAGE / "kernels", quiet=2)


def folder() -> Path | None:
    """This source state's cache folder (not created), None when the cache is off."""
    base = root()
    return None if base is None else base / source_state()


def configure(target: str = "cuda") -> Path | None:
    """Point numba's cache for `target` ("cuda": numba-cuda's kernels; "cpu": numba's njit functions, cpu-serial's)
    at this source state's folder (made, its stale siblings pruned) and return it; None (caching off) when
    GPUNN_KERNEL_CACHE says off or the folder cannot be made. Idempotent; call it before the first function of that
    target is decorated."""
    global _configured, _decided
    if target not in _TARGETS:
        raise ValueError(f"kernel cache target must be one of {sorted(_TARGETS)}, got {target!r}")
    if not _decided:  # once per process: every kernel's decoration asks
        _configured, _decided = _make(folder()), True
    if _configured is not None and target not in _pointed:
        _TARGETS[target]().CACHE_DIR = str(_configured)
        _pointed.add(target)
    return _configured


def _make(path: Path | None) -> Path | None:
    if path is None:
        return None
    try:
        fresh = not path.is_dir()
        path.mkdir(parents=True, exist_ok=True)
        os.utime(path)  # most recently used: what prune() keeps
        if fresh:
            prune(path.parent, keep=KEEP)
    except OSError:
        return None  # an unwritable cache compiles as without one
    return path


def _cuda_config():
    from numba.cuda.core import config

    return config


def _cpu_config():
    from numba.core import config

    return config


_TARGETS = {"cuda": _cuda_config, "cpu": _cpu_config}
_pointed: set[str] = set()


def configured() -> Path | None:
    """The folder configure() chose in this process, None before it ran or with the cache off."""
    return _configured


def prune(base: Path, keep: int = KEEP) -> list[Path]:
    """Remove all but the `keep` most recently used source-state folders under `base`; the ones removed."""
    states = sorted((p for p in base.iterdir() if p.is_dir() and len(p.name) == 16), key=lambda p: p.stat().st_mtime,
                    reverse=True)
    removed = states[keep:]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def usage(base: Path) -> list[dict]:
    """One row per source-state folder under `base`: its name, files and bytes, and whether it is this source's."""
    if not base.is_dir():
        return []
    current = source_state()
    rows = []
    for path in sorted(p for p in base.iterdir() if p.is_dir()):
        files = [f for f in path.rglob("*") if f.is_file()]
        rows.append({"state": path.name, "files": len(files), "bytes": sum(f.stat().st_size for f in files),
                     "current": path.name == current})
    return rows


def main(clear: bool = False, log=print) -> int:
    """`gpunn kernel-cache`: where the cache is and what it holds; with `clear`, remove it."""
    base = root()
    if base is None:
        log(f"kernel cache: off ({VARIABLE}={os.environ.get(VARIABLE)}); every GPU job compiles its kernels")
        return 0
    if clear:
        shutil.rmtree(base, ignore_errors=True)
        log(f"kernel cache: removed {base}")
        return 0
    rows = usage(base)
    log(f"kernel cache: {base} (set {VARIABLE} to move it, {VARIABLE}=off to turn it off)")
    if not rows:
        log("  empty: the next GPU job compiles its kernels and stores them here")
    for row in rows:
        mark = "  <- this source" if row["current"] else ""
        log(f"  {row['state']}: {row['files']} files, {row['bytes'] / 2**20:.1f} MiB{mark}")
    return 0
