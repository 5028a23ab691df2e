"""A gpunn job ends with the Snakemake that started it.

Snakemake runs a job as ``bash -c "python -m gpunn ... | tee log"``. When Snakemake is killed (SIGKILL, a lost
terminal, a cluster's time limit on the Snakemake process), the shell and gpunn are not: they are reparented and
run on, holding the machine-wide timing lock and writing outputs nobody waits for. ``exit_with_snakemake`` finds the
nearest Snakemake among the process's ancestors (Linux /proc) and starts a daemon thread that ends this process,
with one line, once that Snakemake is gone. A job run by hand has no Snakemake ancestor and is not watched (nohup
and the like keep working). Outputs are written atomically at a job's end, so a job stopped this way leaves none,
and the kernel releases the timing lock's flock with the process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

POLL_S = 1.0  # how often the watcher looks for its Snakemake


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of `pid` from /proc, or None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return int(fields[1]), fields[19].decode()  # ppid (field 4), starttime (field 22)


def starttime(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc): with the pid, it names one process even
    after the pid is reused. None when it is gone or unreadable."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _is_snakemake(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(arg) == b"snakemake" or arg == b"snakemake" for arg in argv[:3])


def snakemake_ancestor(pid: int | None = None) -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor of `pid` (default: this process) that is Snakemake, or None."""
    stat = _stat(pid or os.getpid())
    seen = 0
    while stat is not None and stat[0] > 1 and seen < 64:
        parent = stat[0]
        stat = _stat(parent)
        if stat is not None and _is_snakemake(parent):
            return parent, stat[1]
        seen += 1
    return None


def exit_with_snakemake(log=None) -> threading.Thread | None:
    """Watch this process's Snakemake ancestor, if any: once it is gone (or its pid reused), print one line and
    end this process with exit status 1. Returns the watcher thread, or None when there is nothing to watch."""
    found = snakemake_ancestor()
    if found is None:
        return None
    pid, started = found

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            stat = _stat(pid)
            if stat is None or stat[1] != started:
                message = f"gpunn: Snakemake (pid {pid}) that started this job is gone: stopping the job, no outputs"
                (log or (lambda line: print(line, file=sys.stderr, flush=True)))(message)
                os._exit(1)

    thread = threading.Thread(target=watch, name="gpunn-exit-with-snakemake", daemon=True)
    thread.start()
    return thread
