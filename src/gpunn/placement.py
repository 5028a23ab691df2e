"""Where a pipeline job runs on one machine: its GPU (a slot) and its CPU cores, and which timed jobs may overlap.

    python -m gpunn.placement --threads T [--gpu [--borrow] --slots 0,1] [--timed cpu|gpu|both]
                              [--timing overlap] [--lanes N] -- COMMAND...

Each job of a local run goes through this wrapper, which takes its slots and then runs COMMAND in its place (exec):
- **GPU slot**: a GPU job takes one free GPU of ``--slots`` (the ids that config key `gpus` resolved to) through
  that GPU's lock file, exclusively, for the whole job, and runs with ``CUDA_VISIBLE_DEVICES`` set to it. Two GPU jobs
  never share a GPU, timed or not; a job finding every GPU taken waits (Snakemake's `gpu` resource, one per slot,
  normally keeps it from having to). With ``--borrow`` (the SVM, which computes on its GPU for a part of its run)
  the job is given a GPU (the first free one, else the first) without its lock, and takes the lock itself only
  while it computes on it (``borrowed_gpu``).
- **Cores** (timing ``overlap`` only): a job takes ``threads`` free cores through per-core lock files and is bound to
  them (``sched_setaffinity``, inherited by its threads and by COMMAND): jobs timing CPU work from the lowest cores
  up, every other job from the highest down, so a CPU baseline and a GPU job's host thread never share a core.
- **Timing**: ``overlap`` names the job's timed resources (``cpu``, ``gpu<id>`` or both) in
  ``GPUNN_TIMING_RESOURCE``; its timing lock (gpunn.timing_lock) then shuts out only timed jobs of the same ones.
  With ``--lanes N`` (config key cpu_lanes) a CPU-timed job takes one of N lanes (a lock file each) and times
  against ``cpu<lane>``: up to N CPU-timed jobs at once, each on cores of its own.
  ``isolated`` keeps the one machine-wide timing lock: one timed job at a time.

The locks are ``flock``s on files beside the timing lock (``$GPUNN_TIMING_LOCK``'s folder, else the temp folder),
opened as gpunn.timing_lock opens its own (never through a symbolic link), held by open descriptors that COMMAND
inherits: they are released when the job exits, however it exits. The job taking a slot writes its pid, its command
and the time into the slot's file, and a job that has to wait names the holders in its one waiting line. Under
Slurm (``SLURM_JOB_ID`` set) the cluster has placed the job; only the timing mode is recorded. The wrapper prints
nothing unless it has to wait; the job's GPU, slot count, cores, mode and the time it had them go into its
provenance (gpunn.provenance.placement_record).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from gpunn.errors import GpunnError
from gpunn.timing_lock import RESOURCE_VARIABLE, describe_holder, lock_path, open_lock_file, write_holder

MODES = ("isolated", "overlap")
MODE_VARIABLE = "GPUNN_TIMING_MODE"
GPU_SLOT_VARIABLE = "GPUNN_GPU_SLOT"
GPU_SLOTS_VARIABLE = "GPUNN_GPU_SLOTS"
BORROW_VARIABLE = "GPUNN_GPU_BORROWED"  # "1": the job's GPU (GPU_SLOT_VARIABLE) is not held for it (--borrow)
PLACED_AT_VARIABLE = "GPUNN_PLACED_AT"  # when the job had its slots (epoch s), for its provenance
POLL_S = 0.2
# Snakemake's own per-job variables for BLAS and OpenMP thread pools (snakemake/shell.py); the bench sets them too
THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def lock_dir() -> str:
    return os.path.dirname(os.path.abspath(lock_path()))


def _lock_file(name: str) -> str:
    """The lock file of slot `name` (gpu-<id>, core-<n>, cpu-lane-<k>) beside the timing lock."""
    return os.path.join(lock_dir(), f"gpunn-{name}.lock")


def _try_lock(path: str) -> int | None:
    """An open descriptor holding an exclusive flock on `path`, or None when another process holds it."""
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _holder_command() -> str:
    """What this process runs, for the holder record of the slots it takes: the command after -- (placement)."""
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv
    return " ".join(argv)


def _take(names: Sequence[str], count: int, log: Callable[[str], None], what: str) -> list[tuple[str, int]]:
    """`count` of `names` (in that order of preference) whose lock files are free, all or none at once (so two jobs
    waiting for cores never hold half each); waits, saying so once with who holds the others, while too few are
    free. The taken files record this job as their holder."""
    said = False
    while True:
        held, busy = [], []
        for name in names:
            fd = _try_lock(_lock_file(name))
            if fd is None:
                busy.append(name)
                continue
            held.append((name, fd))
            if len(held) == count:
                for _, taken in held:
                    write_holder(taken, _holder_command())
                return held
        for _, fd in held:
            os.close(fd)
        if not said:
            holders = list(dict.fromkeys(describe_holder(_lock_file(name)) for name in busy))
            shown = "; ".join(holders[:3]) + (f"; and {len(holders) - 3} more" if len(holders) > 3 else "")
            log(f"placement: waiting for {count} free {what} ({len(held)} of {len(names)} free now; "
                f"held by {shown})")
            said = True
        time.sleep(POLL_S)


def take_gpu(slots: Sequence[str], log: Callable[[str], None] = print) -> tuple[str, int]:
    """One free GPU of `slots` (ids), with the descriptor that holds it."""
    (name, fd), = _take([f"gpu-{s}" for s in slots], 1, log, f"GPU of {','.join(slots)}")
    return name[len("gpu-"):], fd


def _first_free(slots: Sequence[str]) -> str:
    """The first of `slots` whose lock is free at this moment (the lock not kept), else the first."""
    for slot in slots:
        fd = _try_lock(_lock_file(f"gpu-{slot}"))
        if fd is not None:
            os.close(fd)
            return slot
    return slots[0]


class BorrowedGpu:
    """A borrowed GPU's slot lock, held from borrowed_gpu until release() (or the end of the with block)."""

    def __init__(self, slot: str, fd: int | None):
        self.slot, self._fd = slot, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def borrowed_gpu(log: Callable[[str], None] = print, environ=None) -> Iterator[BorrowedGpu | None]:
    """The lock of the GPU this job was given with --borrow (waiting, saying so once, while another job holds it),
    held until release() or the end of the block; None where the job's GPU is not borrowed (placement holds it for
    the whole job, Slurm placed the job, or no wrapper ran)."""
    environ = os.environ if environ is None else environ
    slot = environ.get(GPU_SLOT_VARIABLE)
    if environ.get(BORROW_VARIABLE) != "1" or not slot:
        yield None
        return
    _, fd = take_gpu([slot], log)
    gpu = BorrowedGpu(slot, fd)
    try:
        yield gpu
    finally:
        gpu.release()


def take_cores(count: int, low_first: bool, log: Callable[[str], None] = print) -> tuple[list[int], list[int]]:
    """`count` free cores of this process's affinity set (at most all of them): (cores, descriptors)."""
    cores = sorted(os.sched_getaffinity(0))
    order = cores if low_first else cores[::-1]
    held = _take([f"core-{c}" for c in order], min(count, len(cores)), log, "cores")
    return sorted(int(name[len("core-"):]) for name, _ in held), [fd for _, fd in held]


def resources(timing: str, timed: bool | str, gpu: int, simulator: bool) -> dict:
    """The `timing` resource of a job (profiles/default limits it to 1): timed jobs take it when ``isolated``; under
    ``overlap`` only those timing CPU work do (CPU jobs, and GPU jobs marked ``timed="both"``: the SVM, whose solver
    runs on the CPU), since GPU-timed jobs are kept apart by their GPU slots. Jobs under the simulator take none:
    their times measure nothing."""
    if not timed or (simulator and gpu):
        return {"timing": 0}
    return {"timing": 1 if timing == "isolated" or not gpu or timed == "both" else 0}


def timed_kind(timed: bool | str, gpu: bool) -> str:
    """What a job times, as --timed takes it: cpu, gpu, both (GPU and CPU work) or none."""
    if not timed:
        return "none"
    return "both" if timed == "both" and gpu else "gpu" if gpu else "cpu"


def prefix(threads: int, gpu: bool, timed: bool | str, timing: str, slots: Sequence[str], lanes: int = 1,
           borrow: bool = False) -> str:
    """The shell prefix that runs a job's command through this wrapper (`borrow`: its GPU given, not held)."""
    kind = timed_kind(timed, gpu)
    parts = ["python -m gpunn.placement", f"--threads {int(threads)}", f"--timed {kind}", f"--timing {timing}"]
    if gpu and slots:
        parts += ["--gpu", *(["--borrow"] if borrow else []), f"--slots {','.join(slots)}"]
    if lanes > 1 and timing == "overlap" and kind in ("cpu", "both"):
        parts.append(f"--lanes {int(lanes)}")
    return " ".join(parts) + " -- "


def take_lane(lanes: int, log: Callable[[str], None] = print) -> tuple[int, int]:
    """One free CPU lane of `lanes` (config key cpu_lanes), with the descriptor that holds it."""
    (name, fd), = _take([f"cpu-lane-{k}" for k in range(lanes)], 1, log, f"CPU lane of {lanes}")
    return int(name[len("cpu-lane-"):]), fd


def describe_cores(cores: Sequence[int]) -> str:
    """'0-13' / '15' / '2,5-7': a core set as Linux's cpulist format."""
    cores, runs = sorted(cores), []
    for core in cores:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def place(args: argparse.Namespace, environ: dict, log: Callable[[str], None]) -> list[int]:
    """Take the job's slots, bind it and fill `environ`; the descriptors that hold the slots (kept open)."""
    environ[MODE_VARIABLE] = args.timing
    if environ.get("SLURM_JOB_ID"):
        return []
    held = []
    if args.gpu and args.slots:
        slots = [s for s in args.slots.split(",") if s]
        if args.borrow:
            gpu = _first_free(slots)
            environ[BORROW_VARIABLE] = "1"
        else:
            gpu, fd = take_gpu(slots, log)
            held.append(fd)
        environ.update({"CUDA_VISIBLE_DEVICES": gpu, GPU_SLOT_VARIABLE: gpu, GPU_SLOTS_VARIABLE: str(len(slots))})
    if args.timing == "overlap":
        times_cpu, cpu = args.timed in ("cpu", "both"), "cpu"
        if times_cpu and args.lanes > 1:  # a lane of its own, then cores: CPU-timed jobs of other lanes run beside it
            lane, fd = take_lane(args.lanes, log)
            held.append(fd)
            cpu = f"cpu{lane}"
        cores, fds = take_cores(args.threads, low_first=times_cpu, log=log)
        held += fds
        os.sched_setaffinity(0, cores)
        gpu = f"gpu{environ.get(GPU_SLOT_VARIABLE, '')}"
        # a borrowing job's GPU work is kept apart by the GPU's slot lock, which it holds only while it computes
        both = [cpu] if args.borrow else [cpu, gpu]
        names = {"cpu": [cpu], "gpu": [gpu], "both": both}.get(args.timed)
        if names:
            environ[RESOURCE_VARIABLE] = ",".join(names)
    environ[PLACED_AT_VARIABLE] = f"{time.time():.6f}"
    return held


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpunn.placement", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="the job's threads: cores it is bound to (overlap)")
    p.add_argument("--gpu", action="store_true", help="the job needs a GPU: take one of --slots")
    p.add_argument("--borrow", action="store_true",
                   help="with --gpu: give the job a GPU without holding it; the job holds it while it computes on it")
    p.add_argument("--slots", default="", help="the GPU ids jobs are placed on, comma-separated")
    p.add_argument("--timed", choices=("cpu", "gpu", "both", "none"), default="none",
                   help="what the job times: CPU work, GPU work, both (the SVM), nothing")
    p.add_argument("--timing", choices=MODES, default="isolated", help="config key timing")
    p.add_argument("--lanes", type=int, default=1,
                   help="config key cpu_lanes: under overlap, a CPU-timed job takes one of this many lanes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("gpunn.placement: no command given after --", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"gpunn.placement: --threads {args.threads}: give at least 1", file=sys.stderr)
        return 2
    try:
        held = place(args, os.environ, lambda line: print(line, file=sys.stderr, flush=True))
    except GpunnError as exc:
        print(f"gpunn: error: {exc}", file=sys.stderr)
        return 1
    for fd in held:
        os.set_inheritable(fd, True)  # COMMAND keeps the slots until it exits
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"gpunn.placement: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
