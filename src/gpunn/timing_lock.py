"""One timed job at a time on a machine, across processes and users.

Two timed jobs running together (Snakemake with several cores, a benchmark started by hand next to a
pipeline, two users on one GPU machine) share the GPU, the memory bandwidth and the CPU cores, and both
report times that are too slow. Every timed command therefore runs its timed work inside ``timing_lock``:
an exclusive ``fcntl.flock`` on one machine-wide file, ``$GPUNN_TIMING_LOCK`` or
``<tempdir>/gpunn-timing.lock`` (created world-writable, so every user's jobs share it). The kernel drops
the lock when its holder exits, however it exits, so a killed job never leaves a stale lock. Under config key
`timing: overlap` (gpunn.placement sets ``GPUNN_TIMING_RESOURCE``) a timed job holds the machine-wide lock shared
and its resource's own lock (``gpunn-timing-cpu.lock``, ``gpunn-timing-gpu<id>.lock``) exclusively: a CPU-timed
and a GPU-timed job overlap, two of one resource do not, and a bench started by hand waits for all of them.

A job that had to wait says so in its log, with who held the lock (the holder writes its pid, what it runs
and since when into the file), and how long it waited; the wait is also returned, for metrics.json. GPU
work under numba's CUDA simulator takes no lock (its callers pass ``skip``): its times measure nothing, and a
laptop's smoke run should not queue behind another pipeline's timed jobs. CPU variants hold it there too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpunn.errors import GpunnError

ENV_VARIABLE = "GPUNN_TIMING_LOCK"
DEFAULT_NAME = "gpunn-timing.lock"
# set by gpunn.placement under timing: overlap: the one resource (cpu, gpu<id>) a timed job keeps to itself
RESOURCE_VARIABLE = "GPUNN_TIMING_RESOURCE"

# depth > 0 while this thread holds the lock: a nested timing_lock (a timed command calling another timed
# function) must not wait for its own process, which flock would make it do forever
_held = threading.local()


@dataclass
class TimingLock:
    """The held lock: its file and the seconds spent waiting for it (0.0 when it was free)."""

    path: str
    waited_s: float = 0.0


def lock_path() -> str:
    return os.environ.get(ENV_VARIABLE) or os.path.join(tempfile.gettempdir(), DEFAULT_NAME)


@contextlib.contextmanager
def timing_lock(what: str, log: Callable[[str], None] = print, skip: bool = False) -> Iterator[TimingLock]:
    """Hold the machine-wide timing lock for the block; `what` (e.g. "gpunn train mnist/...") is shown to
    jobs waiting for it. Released on leaving the block, by an exception or KeyboardInterrupt too. With `skip`
    (a job whose times are not measurements: the simulator's) the block runs without the lock (path "")."""
    if skip:
        yield TimingLock("")
        return
    path = lock_path()
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield TimingLock(path)
        finally:
            _held.depth -= 1
        return
    resource = os.environ.get(RESOURCE_VARIABLE, "")
    # overlap (gpunn.placement): the machine-wide lock shared with the other timed jobs, so that a hand-run bench
    # still waits for all of them, and the locks of the job's own resources ("cpu,gpu0"), in one order for all
    locks = [(path, fcntl.LOCK_SH)] + [(resource_lock_path(name), fcntl.LOCK_EX)
                                       for name in sorted(resource.split(","))] if resource else [(path, fcntl.LOCK_EX)]
    fds = []
    try:
        waited = 0.0
        for lock_file, mode in locks:
            fd = open_lock_file(lock_file)
            fds.append(fd)
            waited += _acquire(fd, mode, lock_file, log)
        _write_holder(fds[-1], what)
        _held.depth = 1
        try:
            yield TimingLock(locks[-1][0], waited)
        finally:
            _held.depth = 0
            with contextlib.suppress(OSError):
                os.ftruncate(fds[-1], 0)  # no stale holder for the next reader
    finally:
        for fd in fds:
            os.close(fd)  # closing the last descriptor releases the flock


def resource_lock_path(resource: str) -> str:
    """The timing lock of one resource ("cpu", "gpu0") under timing: overlap, beside the machine-wide one."""
    return os.path.join(os.path.dirname(os.path.abspath(lock_path())), f"gpunn-timing-{resource}.lock")


def _acquire(fd: int, mode: int, path: str, log: Callable[[str], None]) -> float:
    """flock `fd` in `mode`, saying so when it has to wait; the seconds waited."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        log(f"waiting for the timing lock {path}: held by {_describe_holder(fd)}")
        start = time.monotonic()
        fcntl.flock(fd, mode)
        waited = time.monotonic() - start
        log(f"got the timing lock after {waited:.1f} s of waiting")
        return waited


def open_lock_file(path: str) -> int:
    """A lock file opened for reading and writing (created world-writable when missing)."""
    # an existing file is opened without O_CREAT: Linux's fs.protected_regular refuses O_CREAT on another
    # user's file in a sticky world-writable directory such as /tmp, even when the file itself is writable
    try:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:  # another job created it in between
                fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise GpunnError(
            f"cannot open the timing lock file {path} ({exc.strerror}); make it writable for every user "
            f"(chmod 666 {path}) or set {ENV_VARIABLE} to a writable path"
        ) from None
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.getuid() and os.fstat(fd).st_mode & 0o777 != 0o666:
            os.fchmod(fd, 0o666)  # the umask took write access from other users' jobs
    return fd


def _write_holder(fd: int, what: str) -> None:
    record = json.dumps({"pid": os.getpid(), "what": what, "since": time.time()})
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode() + b"\n", 0)


def _describe_holder(fd: int) -> str:
    """'pid N (what, since HH:MM:SS)' from the holder's record, best effort (it may not have written it yet)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        since = time.strftime("%H:%M:%S", time.localtime(float(record["since"])))
        return f"pid {int(record['pid'])} ({record['what']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (not yet recorded)"
