"""One timed job at a time on a machine, across processes and users.

Two timed jobs running together (Snakemake with several cores, a benchmark started by hand next to a
pipeline, two users on one GPU machine) share the GPU, the memory bandwidth and the CPU cores, and both
report times that are too slow. Every timed command therefore runs its timed work inside ``timing_lock``:
an exclusive ``fcntl.flock`` on one machine-wide file, ``$GPUNN_TIMING_LOCK`` or
``<tempdir>/gpunn-timing.lock`` (created world-writable, so every user's jobs share it; opened with
``O_NOFOLLOW`` and refused, in one line, when it is a symbolic link, not a regular file or has other hard links, so a
file planted in the shared temp folder cannot redirect a job's writes to another file). The kernel drops
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
from stat import S_ISREG

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
        for fd in fds:  # a shared lock's record names one of its holders: the last to take it
            write_holder(fd, what)
        _held.depth = 1
        try:
            yield TimingLock(locks[-1][0], waited)
        finally:
            _held.depth = 0
            for fd, (_, mode) in zip(fds, locks):
                if mode == fcntl.LOCK_EX:  # no stale holder for the next reader (a shared one's may still hold it)
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, 0)
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


# never through a symbolic link (a link planted in the shared temp folder would have the job truncate and write the
# file it points to), and never inherited by a command the job starts (gpunn.placement hands its slots on itself)
OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def open_lock_file(path: str) -> int:
    """A lock file opened for reading and writing (created world-writable when missing); one GpunnError line when
    it cannot be opened or is not a plain file of its own (a symbolic link, a device, a hard link to another file)."""
    # an existing file is opened without O_CREAT: Linux's fs.protected_regular refuses O_CREAT on another
    # user's file in a sticky world-writable directory such as /tmp, even when the file itself is writable
    try:
        try:
            fd = os.open(path, OPEN_FLAGS)
        except FileNotFoundError:
            try:
                fd = os.open(path, OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:  # another job created it in between
                fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP
            raise GpunnError(_not_plain(path, f"is a symbolic link (to {os.readlink(path)})")) from None
        raise GpunnError(
            f"cannot open the timing lock file {path} ({exc.strerror}); make it writable for every user "
            f"(chmod 666 {path}) or set {ENV_VARIABLE} to a writable path"
        ) from None
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise GpunnError(_not_plain(path, "is not a regular file"))
        if stat.st_nlink != 1:
            raise GpunnError(_not_plain(path, f"has {stat.st_nlink} hard links"))
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):
        if stat.st_uid == os.getuid() and stat.st_mode & 0o777 != 0o666:
            os.fchmod(fd, 0o666)  # the umask took write access from other users' jobs
    return fd


def _not_plain(path: str, what: str) -> str:
    return (f"the lock file {path} {what}: gpunn writes into its lock files and refuses one that could lead its "
            f"writes elsewhere; remove it if it is yours (ls -l {path}), or set {ENV_VARIABLE} to a file in a folder "
            "of your own")


def describe_holder(path: str) -> str:
    """Who holds the lock file `path`, from its record (best effort: 'another process (not yet recorded)')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "another process (not yet recorded)"
    try:
        return _describe_holder(fd)
    finally:
        os.close(fd)


def write_holder(fd: int, what: str) -> None:
    """Record in the held lock file who holds it (pid, `what`, since when) for the jobs that wait for it."""
    record = json.dumps({"pid": os.getpid(), "what": what, "since": time.time()})
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode() + b"\n", 0)


def _describe_holder(fd: int) -> str:
    """'pid N (what, since HH:MM:SS)' from the holder's record, best effort (it may not have written it yet)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        with contextlib.suppress(PermissionError):  # another user's live process
            os.kill(int(record["pid"]), 0)  # a record left by a holder that has exited: not the holder now
        since = time.strftime("%H:%M:%S", time.localtime(float(record["since"])))
        # another user's job may have written the record: only printable text, and not a whole screen of it
        what = "".join(c if c.isprintable() else "?" for c in str(record["what"]))
        what = what if len(what) <= 160 else what[:157] + "..."
        return f"pid {int(record['pid'])} ({what}, since {since})"
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return "another process (not yet recorded)"
