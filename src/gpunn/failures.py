"""What a run that did not finish prints last: the failed jobs with gpunn's own error line, a run stopped by a signal,
and a `snakemake --report` of outputs that are not all built.

Snakemake ends a failed run with its own blocks (RuleException, `Error in rule` with the whole shell command) and
"At least one job did not complete successfully"; gpunn's one-line error is in the job's log, scrolled far above.
The Snakefile's `onerror` (workflow/rules/common.smk) calls `at_exit`, which prints `summary`'s lines after all of
that, when Snakemake's process exits: each failed job, its error line and its log.

SIGTERM: Snakemake's own handler only stops scheduling and waits for the running jobs to end by themselves (minutes
for a training run), which then still count as failed. `forward_signals` (installed by onstart, local runs only)
also sends SIGTERM to every process of the running jobs (Snakemake's descendants): they end at once, their outputs
removed by Snakemake as those of any failed job (and gpunn writes its outputs atomically at a job's end), and the
summary says the run was stopped, and which jobs it stopped, not that they failed. Likewise after Ctrl-C (SIGINT,
which the terminal sends to the jobs too).

Nothing here runs while the workflow is parsed or planned: onstart and onerror run only when Snakemake executes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterable

ERROR_PREFIX = "gpunn: "
CLOCK_PREFIX = "gpunn job clock: "  # the first and last line of a job's log (workflow/rules/common.smk: logged)
KILLED = "its log has no error line: the job was killed (out of memory, a time limit, scancel)"
STOPPED: list[tuple[int, list]] = []  # the signal that stopped this run and the jobs that were running then


def error_line(log: str) -> str | None:
    """The line that says why a job failed, from its log: gpunn's last `gpunn: ...error...` line, else the log's
    last line that is neither a traced command (`+ ...`) nor the job clock (e.g. a traceback's last line); None
    when the log is missing or empty."""
    try:
        with open(log, encoding="utf-8", errors="replace") as handle:
            lines = [line.rstrip() for line in handle]
    except OSError:
        return None
    lines = [line for line in lines if line.strip() and not line.startswith(("+", CLOCK_PREFIX))]
    gpunn = [line for line in lines if line.startswith(ERROR_PREFIX) and "error" in line.split(":", 2)[1]]
    if gpunn:
        return gpunn[-1]
    return lines[-1].strip() if lines else None


def summary(jobs: Iterable[tuple[str, str | None]], stopped_by: int | None = None) -> list[str]:
    """The last lines of a run that did not finish, for its `jobs` that failed, each (name, log). Stopped by a
    signal: one line naming it and the jobs it stopped. Otherwise two lines per job (its name and log, then its error
    line) and a last line saying what to do. Nothing for a run that failed without a failed job."""
    jobs = list(jobs)
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name + (" (Ctrl-C)" if stopped_by == signal.SIGINT else "")
        stopped = "; no job was running" if not jobs else (
            f"; {_count(len(jobs), 'running job')} stopped, no outputs kept: " + ", ".join(n for n, _ in jobs))
        return [f"gpunn: stopped by {name}{stopped}. The jobs that finished are kept: rerun the same command to "
                "resume"]
    lines = []
    for name, log in jobs:
        lines.append(f"gpunn: failed: {name}" + (f" (its log: {log})" if log else ""))
        found = error_line(log) if log else None
        lines.append(f"  {found}" if found else f"  ({KILLED})")
    if lines:
        lines.append(f"gpunn: {_count(len(jobs), 'job')} failed (above, each with its log); the jobs that finished are "
                     "kept: fix the cause and rerun the same command")
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def job_name(job) -> str:
    """A Snakemake job as `rule wildcard/values` (a train job: `train dataset/split/model/variant/run`)."""
    values = "/".join(str(v) for v in job.wildcards)  # a Namedlist: its values, in the rule's order
    return f"{job.rule.name} {values}" if values else job.rule.name


def _named(jobs) -> list[tuple[str, str | None]]:
    """(name, log) of each of Snakemake's `jobs`, in job id order."""
    return [(job_name(job), str(job.log[0]) if job.log else None) for job in sorted(jobs, key=lambda job: job.jobid)]


def failed_jobs(workflow) -> list[tuple[str, str | None]]:
    """(name, log) of each job of this run that failed (Snakemake's scheduler's `failed`)."""
    return _named(getattr(getattr(workflow, "scheduler", None), "failed", None) or ())


def running_jobs(workflow) -> list[tuple[str, str | None]]:
    """(name, log) of each job running now (Snakemake's scheduler's `running`)."""
    running = getattr(getattr(workflow, "scheduler", None), "running", None) or ()
    for _ in range(3):  # a job thread may change the set meanwhile
        with contextlib.suppress(RuntimeError):
            return _named(list(running))
    return []


def at_exit(workflow) -> None:
    """Print `summary` of this run once Snakemake's process exits, after Snakemake's own last lines (onerror runs
    before them). After a signal (`forward_signals`), also end each stopped job's log with a line saying so."""
    if STOPPED:
        signum, jobs = STOPPED[0]
        lines = summary(jobs, signum)
        for _, log in jobs:  # their logs end mid-run: say why
            with contextlib.suppress(OSError, TypeError), open(log, "a", encoding="utf-8") as handle:
                handle.write(f"gpunn: stopped: Snakemake was sent {signal.Signals(signum).name}; no outputs kept\n")
    else:
        lines = summary(failed_jobs(workflow))
    if lines:
        atexit.register(lambda: print("\n".join(lines), file=sys.stderr, flush=True))


def descendants(pid: int | None = None) -> list[int]:
    """The pids of every descendant of `pid` (default: this process), from /proc; children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid or os.getpid()]
    while queue:
        for child in children.get(queue.pop(0), ()):
            found.append(child)
            queue.append(child)
    return found


def forward_signals(workflow) -> None:
    """Record which jobs a SIGTERM or SIGINT stopped (for `at_exit`), then let Snakemake's handler act; on SIGTERM
    also stop the running jobs: SIGTERM to every descendant process (the jobs' shells, gpunn and tee). Snakemake's
    SIGTERM handler alone schedules no new job but waits for the running ones to end by themselves; a SIGINT (Ctrl-C)
    reaches the jobs from the terminal already (one process group). A signal that is ignored stays ignored."""
    for number in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(number)
        if callable(previous):
            signal.signal(number, _handler(workflow, previous))


def _handler(workflow, previous):
    def handler(signum, frame):
        if not STOPPED:
            STOPPED.append((signum, running_jobs(workflow)))
        # first Snakemake's own: SIGINT raises KeyboardInterrupt here (Snakemake stops its jobs); after SIGTERM's no
        # job starts (the handler runs where Snakemake schedules), and the running ones are stopped below
        previous(signum, frame)
        if signum != signal.SIGTERM:
            return
        for pid in descendants():
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, signal.SIGTERM)

    return handler


def stale_report_line(jobs: Iterable) -> str | None:
    """The one line refusing `snakemake --report` while Snakemake would still run `jobs` for this config (its outputs
    missing or out of date): a report would bundle figures of other runs under this config's names. None when there
    are none."""
    counts = Counter(job.rule.name for job in jobs)
    if not counts:
        return None
    listed = ", ".join(f"{rule} x{n}" if n > 1 else rule for rule, n in counts.items())
    return (f"gpunn: report refused: {_count(sum(counts.values()), 'job')} of this config must run first ({listed}); "
            "the figures on disk are not this config's. Run the same command without --report (or fix the job that "
            "failed), then --report again")
