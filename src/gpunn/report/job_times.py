"""Where a reproduction's time went: each job's wall time, from the benchmark file Snakemake writes for it
(<results_dir>/benchmarks/<stage>/<job>.tsv, column `s`: the job's whole shell, Python start and imports
included). Each experiment's report lists the jobs it depends on (jobs.csv, jobs.md); the entry page sums them
per experiment and over the whole run, counting a job that several experiments use once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpunn import io
from gpunn.errors import GpunnError

JOB_TIMES = "jobs"  # every report's table of the wall time of each job it depends on (.csv, .md)
JOB_COLUMNS = ("stage", "job", "wall_s", "max_rss_mb", "cpu_time_s")
BENCHMARK_DIR = "/benchmarks/"
LONGEST = 3  # jobs named per experiment on the entry page


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


def read_benchmark(path) -> dict:
    """One job's row: its stage, name, wall time in seconds, peak resident memory (MB) and CPU time (s); the times
    NaN when the file is missing (a job from before benchmark files were written)."""
    stage, job = job_name(path)
    row = {"stage": stage, "job": job, "wall_s": float("nan"), "max_rss_mb": float("nan"),
           "cpu_time_s": float("nan")}
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
    """An experiment's jobs.csv from its report folder, or None where the report has none."""
    path = Path(report_root) / experiment / "jobs.csv"
    if not path.is_file():
        return None
    return pd.read_csv(path, dtype={"stage": str, "job": str})


def _longest(table: pd.DataFrame, count: int = LONGEST) -> str:
    known = table.dropna(subset=["wall_s"])
    return "; ".join(f"{row.stage} {row.job.split('/', 1)[-1] if '/' in row.job else row.job} "
                     f"({format_duration(row.wall_s)})" for row in known.head(count).itertuples()) or "-"


def summary_rows(report_root, ran) -> list[dict]:
    """The entry page's wall-time table: one row per experiment that ran (its jobs, their summed wall time, its
    longest jobs), then the whole run, each job counted once. Empty when no report has jobs.csv."""
    tables = {experiment: read(report_root, experiment) for experiment in ran}
    tables = {e: t for e, t in tables.items() if t is not None}
    if not tables:
        return []
    rows = [{"experiment": e.upper(), "jobs": len(t), "wall_s": float(t["wall_s"].sum()),
             "wall": format_duration(t["wall_s"].sum()), "longest": _longest(t)} for e, t in tables.items()]
    every = pd.concat(tables.values()).drop_duplicates(subset=["stage", "job"])
    every = every.sort_values("wall_s", ascending=False, na_position="last", kind="stable")
    rows.append({"experiment": "Whole run", "jobs": len(every), "wall_s": float(every["wall_s"].sum()),
                 "wall": format_duration(every["wall_s"].sum()), "longest": _longest(every, LONGEST + 2)})
    return rows


SUMMARY_TEXT = ("Summed wall times of the jobs each experiment's report depends on, from Snakemake's benchmark files "
                "(each experiment's jobs.md lists them). On one GPU machine timed jobs run one at a time, so the "
                "whole run's elapsed time is close to its sum; where jobs run side by side (under the simulator, on "
                "a cluster) it is less. A job that several experiments use counts in each experiment and once in "
                "the whole run; the report jobs themselves (seconds each) are not in it.")
