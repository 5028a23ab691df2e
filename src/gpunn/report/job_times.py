"""Where a reproduction's time went: each job's wall time, from the benchmark file Snakemake writes for it
(<results_dir>/benchmarks/<stage>/<job>.tsv, column `s`: the job's whole shell, Python start and imports
included), and when it started and ended, from the clock lines its log opens and closes with (the workflow's job
shell writes them: `gpunn job clock: start|end <epoch s>`, logs/<stage>/<job>.log). Each experiment's report lists
the jobs it depends on (jobs.csv, jobs.md); the entry page gives per experiment and for the whole run (a job that
several experiments use counted once) the wall time, the time during which at least one job ran, beside the jobs'
summed times, and names the machine, the timing mode and the longest jobs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gpunn import io
from gpunn.errors import GpunnError
from gpunn.jobusage import parse_usage
from gpunn.provenance import CPU_DEVICE
from gpunn.report import sources

JOB_TIMES = "jobs"  # every report's table of the wall time of each job it depends on (.csv, .md)
JOB_COLUMNS = ("stage", "job", "wall_s", "max_rss_mb", "cpu_time_s", "start", "end")  # start, end: epoch s
BENCHMARK_DIR = "/benchmarks/"
LOG_DIR = "/logs/"
CLOCK = "gpunn job clock:"  # a job log's first line 'gpunn job clock: start <epoch s>', its last '... end <epoch s>'
CLOCK_TAIL_BYTES = 4096  # where a log's end line is looked for
LONGEST = 3  # jobs named per experiment on the entry page
RUN_LONGEST = 5  # jobs named for the whole run


def job_name(path) -> tuple[str, str]:
    """(stage, job) of a benchmark file: the rule's stage and the job's wildcards as a path, e.g. ('train',
    'nvidia-h100-80gb-hbm3/mnist/standard/mlp/gpu-naive/w256_b64_lr0.01_e10_s0')."""
    text = "/" + str(path).replace("\\", "/")
    head, sep, tail = text.rpartition(BENCHMARK_DIR)
    if not sep or not tail.endswith(".tsv") or "/" not in tail:
        raise GpunnError(f"{path}: not a job's benchmark file (<results_dir>/benchmarks/<stage>/<job>.tsv)")
    stage, _, job = tail[:-len(".tsv")].partition("/")
    return stage, job


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):  # '-': Snakemake measured nothing
        return float("nan")


def job_log(path) -> str:
    """The log of the job whose benchmark file is `path`: <results_dir>/logs/<stage>/<job>.log (targets.Layout)."""
    job_name(path)
    head, _, tail = ("/" + str(path).replace("\\", "/")).rpartition(BENCHMARK_DIR)
    return (head + LOG_DIR + tail[:-len(".tsv")] + ".log")[1:]


def _clock_value(line: str, mark: str) -> float:
    words = line.split()
    if " ".join(words[:3]) != CLOCK or len(words) != 5 or words[3] != mark:
        return float("nan")
    value = _number(words[4])
    return value if math.isfinite(value) else float("nan")


def _log_ends(log) -> tuple[str, str] | None:
    """(first line, last CLOCK_TAIL_BYTES) of a job log, or None when it cannot be read."""
    try:
        with open(log, "rb") as fh:
            first = fh.readline(256).decode("utf-8", "replace")
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - CLOCK_TAIL_BYTES, 0))
            return first, fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def _clock(ends: tuple[str, str] | None) -> tuple[float, float]:
    if ends is None:
        return float("nan"), float("nan")
    first, tail = ends
    _, mark, after = tail.rpartition(f"{CLOCK} end ")  # the log's end, maybe after output without a newline
    start, end = _clock_value(first, "start"), _clock_value(f"{mark}{after}" if mark else "", "end")
    if start == start and end == end and end < start:
        end = float("nan")
    return start, end


def read_clock(log) -> tuple[float, float]:
    """(start, end) in epoch seconds from a job log's clock lines, NaN for each one the log lacks (a log from before
    they were written, a job that failed or still runs: no end) or that is out of order (an end before the start)."""
    return _clock(_log_ends(log))


def read_benchmark(path) -> dict:
    """One job's row: its stage, name, wall time in seconds, peak resident memory (MB) and CPU time (s); the times
    NaN when the file is missing (a job from before benchmark files were written); its start and end (epoch s)
    from its log's clock lines; a warm job's memory and CPU time from its log's `gpunn warm job:` line."""
    stage, job = job_name(path)
    ends = _log_ends(job_log(path))  # read once: the clock lines, and a warm job's usage line
    start, end = _clock(ends)
    row = {"stage": stage, "job": job, "wall_s": float("nan"), "max_rss_mb": float("nan"),
           "cpu_time_s": float("nan"), "start": start, "end": end}
    try:
        table = pd.read_csv(path, sep="\t")
    except FileNotFoundError:
        return row
    except (pd.errors.EmptyDataError, pd.errors.ParserError):
        raise GpunnError(f"{path}: not a Snakemake benchmark file; delete it and rerun its job") from None
    if table.empty or "s" not in table.columns:
        raise GpunnError(f"{path}: no 's' column; delete it and rerun its job")
    first = table.iloc[0]
    row.update(wall_s=_number(first["s"]), max_rss_mb=_number(first.get("max_rss")),
               cpu_time_s=_number(first.get("cpu_time")))
    usage = parse_usage(ends[1]) if ends else None
    if usage is not None:  # a warm job: its own process's figures (gpunn.warm: its forked process is not in the
        # process tree Snakemake's benchmark measures)
        row.update(max_rss_mb=usage["max_rss_mb"], cpu_time_s=usage["cpu_time_s"])
    return row


def job_table(paths) -> pd.DataFrame:
    """Every job of `paths` (benchmark files), longest first."""
    rows = [read_benchmark(p) for p in dict.fromkeys(paths)]
    table = pd.DataFrame(rows, columns=list(JOB_COLUMNS))
    return table.sort_values("wall_s", ascending=False, na_position="last", kind="stable").reset_index(drop=True)


def format_duration(seconds: float) -> str:
    """42 s, 6.1 min, 1.2 h; '-' when unknown."""
    if seconds != seconds:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _missing_note(table: pd.DataFrame) -> str:
    missing = int(table["wall_s"].isna().sum())
    return (f" {missing} job(s) have no benchmark file (run before gpunn wrote them): not counted." if missing
            else "")


def write(out_dir, experiment: str, paths) -> dict[str, str]:
    """jobs.csv and jobs.md of one experiment's report: the jobs its report depends on, longest first."""
    table = job_table(paths)
    out_dir = Path(out_dir)
    title = (f"## {experiment.upper()}: {len(table)} jobs, {format_duration(table['wall_s'].sum())} of job wall time"
             " in all, longest first")
    lines = [title, "",
             "Each job's wall time from its Snakemake benchmark file (`benchmarks/<stage>/<job>.tsv`): the whole job, "
             "Python start-up, imports, data loading, compilation, writing and any wait for the timing lock included. "
             "A job that other experiments use too (E6's encoder run is an E5 run; the data jobs) is listed in each."
             + _missing_note(table), "",
             "| stage | job | wall time | s | peak memory (MB) |", "|---|---|---:|---:|---:|"]
    for row in table.itertuples():
        lines.append(f"| {row.stage} | {row.job} | {format_duration(row.wall_s)} | "
                     f"{'-' if row.wall_s != row.wall_s else f'{row.wall_s:.1f}'} | "
                     f"{'-' if row.max_rss_mb != row.max_rss_mb else f'{row.max_rss_mb:.0f}'} |")
    io.write_csv(out_dir / "jobs.csv", table)
    io.write_text(out_dir / "jobs.md", "\n".join(lines) + "\n")
    return {"jobs.md": title[3:]}


def read(report_root, experiment: str) -> pd.DataFrame | None:
    """An experiment's jobs.csv from its report folder, or None where the report has none (a jobs.csv from before
    the clock columns gets them empty)."""
    path = Path(report_root) / experiment / "jobs.csv"
    if not path.is_file():
        return None
    return pd.read_csv(path, dtype={"stage": str, "job": str}).reindex(columns=list(JOB_COLUMNS))


def _short(job: str) -> str:
    return job.split("/", 1)[-1] if "/" in job else job  # without the machine


def _longest(table: pd.DataFrame, count: int = LONGEST) -> str:
    known = table.dropna(subset=["wall_s"])
    return "; ".join(f"{row.stage} {_short(row.job)} ({format_duration(row.wall_s)})"
                     for row in known.head(count).itertuples()) or "-"


def busy_time(intervals) -> tuple[float, float]:
    """(busy, span) of [start, end] intervals: the length of their union (the time during which at least one ran; a
    gap between them, such as between two sittings of a resumed run, not counted) and first start to last end."""
    busy, reach, first = 0.0, -math.inf, math.inf
    for start, end in sorted((float(a), float(b)) for a, b in intervals):
        busy += max(end - max(start, reach), 0.0)
        reach, first = max(reach, end), min(first, start)
    return (busy, reach - first) if first < math.inf else (0.0, 0.0)


def run_clock(table: pd.DataFrame) -> dict:
    """The times of the jobs of `table` (rows of jobs.csv): `busy_s` and `span_s` of their clocks (busy_time, over
    the clocked ones), `sum_s` of their wall times, `unclocked`: how many lack a start or an end; `wall_s` is busy_s
    where every job has both, else sum_s, `wall_source` saying which ('clock' or 'sum')."""
    clocked = table.dropna(subset=["start", "end"])
    busy, span = busy_time(zip(clocked["start"], clocked["end"]))
    total = float(table["wall_s"].sum())
    unclocked = len(table) - len(clocked)
    source = "sum" if unclocked or not len(table) else "clock"
    return {"busy_s": busy, "span_s": span, "sum_s": total, "unclocked": unclocked, "wall_source": source,
            "wall_s": busy if source == "clock" else total}


def _row(experiment: str, table: pd.DataFrame, count: int) -> dict:
    clock = run_clock(table)
    wall = format_duration(clock["wall_s"]) + (" (sum)" if clock["wall_source"] == "sum" else "")
    return {"experiment": experiment, "jobs": len(table), **clock, "wall": wall,
            "job_sum": format_duration(clock["sum_s"]), "longest": _longest(table, count)}


def summary_rows(report_root, ran) -> list[dict]:
    """The entry page's wall-time table: one row per experiment that ran (its jobs, their wall time and summed job
    time (run_clock), its longest jobs), then the whole run, each job counted once (its row with `top`: the
    RUN_LONGEST longest jobs). Empty when no report has jobs.csv."""
    tables = {experiment: read(report_root, experiment) for experiment in ran}
    tables = {e: t for e, t in tables.items() if t is not None}
    if not tables:
        return []
    rows = [_row(e.upper(), t, LONGEST) for e, t in tables.items()]
    every = pd.concat(tables.values()).drop_duplicates(subset=["stage", "job"])
    every = every.sort_values("wall_s", ascending=False, na_position="last", kind="stable")
    whole = _row("Whole run", every, RUN_LONGEST)
    whole["top"] = [(row.stage, _short(row.job), float(row.wall_s))
                    for row in every.dropna(subset=["wall_s"]).head(RUN_LONGEST).itertuples()]
    return rows + [whole]


SUMMARY_TEXT = ("Wall time: how long at least one of the jobs ran, the union of their start-to-end times from the "
                "clock lines each job's log opens and closes with (a pause between two sittings of a resumed run is "
                "not counted). Job time (sum): their wall times from Snakemake's benchmark files added up, more than "
                "the wall time where jobs ran side by side (timing: overlap, several GPUs, the simulator, a "
                "cluster). A wall time marked (sum) is that sum: some of its jobs have no clock lines (run before "
                "gpunn wrote them). A job that several experiments use counts in each experiment and once in the "
                "whole run; the report jobs themselves (seconds each) are not in it; each experiment's jobs.md lists "
                "its jobs.")


def _counted(values: list[int], unit: str, known: str = "") -> str:
    """'16 cores', '64 cores (records: 8, 16, 64)', '1 GPU (NVIDIA H100)': the largest value, with what is `known`
    and every value where records disagree."""
    notes = [known] if known else []
    notes += [f"records: {', '.join(map(str, values))}"] if len(values) > 1 else []
    return f"{values[-1]} {unit}{'s' if values[-1] != 1 else ''}" + (f" ({'; '.join(notes)})" if notes else "")


def machine_line(records: list[dict]) -> str:
    """'Machine: 16 cores, 1 GPU (NVIDIA H100 80GB HBM3). Timing: overlap.', from provenance records: the largest
    machine_cores, the largest gpu_slots of the GPU records and their devices, timing_mode; 'not recorded' for a
    fact that no record has (records from before gpunn recorded it)."""
    def values(rows, key) -> list:
        return sorted({v for r in rows for v in sources.run_values(r, key)}, key=str)

    cores = sorted({int(v) for v in values(records, "machine_cores")})
    gpu_records = [r for r in records if str(r.get("device")) not in (CPU_DEVICE, sources.UNKNOWN)]
    devices = ", ".join(dict.fromkeys(str(r["device"]) for r in gpu_records))
    slots = sorted({int(v) for v in values(gpu_records, "gpu_slots")})
    gpus = (("no GPU" if not gpu_records else f"GPU count not recorded ({devices})") if not slots
            else _counted(slots, "GPU", devices))
    modes = [str(v) for v in values(records, "timing_mode")]
    timing = (", ".join(modes) + (" (records differ)" if len(modes) > 1 else "")) if modes else "not recorded"
    return f"Machine: {_counted(cores, 'core') if cores else 'cores not recorded'}, {gpus}. Timing: {timing}."


def run_lines(whole: dict, records: list[dict]) -> list[str]:
    """The entry page's "The run" block (Markdown lines): the whole run's wall time (its summary_rows row), the
    machine and timing mode (machine_line), its longest jobs."""
    if whole["wall_source"] == "clock":
        wall = (f"Wall time: {format_duration(whole['busy_s'])} during which at least one job ran "
                f"({format_duration(whole['span_s'])} from the first job's start to the last one's end); the jobs' "
                f"times add up to {format_duration(whole['sum_s'])}.")
    else:
        wall = (f"Wall time: {format_duration(whole['sum_s'])}, the sum of the jobs' times: {whole['unclocked']} of "
                f"{whole['jobs']} jobs have no start and end in their logs (run before gpunn wrote them), so how "
                f"much the jobs overlapped is unknown"
                + (f" (the {whole['jobs'] - whole['unclocked']} clocked ones: {format_duration(whole['busy_s'])})"
                   if whole["unclocked"] < whole["jobs"] else "") + ".")
    longest = "; ".join(f"{stage} {job} ({format_duration(seconds)})" for stage, job, seconds in whole["top"])
    return ["**The run.**", "", f"- {wall}", f"- {machine_line(records)}",
            f"- {len(whole['top'])} longest jobs: {longest or '-'}.", ""]
