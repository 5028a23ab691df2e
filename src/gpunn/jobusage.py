"""A job's own CPU time and peak memory as one log line, for jobs that run outside the process tree Snakemake's
benchmark measures (gpunn.warm's forked jobs): the job's client prints it last, gpunn.report.job_times reads it."""

from __future__ import annotations

import math

PREFIX = "gpunn warm job:"


def usage_line(cpu_time_s: float, max_rss_mb: float, pid: int) -> str:
    return (f"{PREFIX} cpu_time_s={cpu_time_s:.3f} max_rss_mb={max_rss_mb:.1f} (process {pid}, forked by the warm "
            "server)")


def parse_usage(text: str) -> dict | None:
    """{cpu_time_s, max_rss_mb} from the last usage line in `text`, or None (no line, or one without both)."""
    _, mark, after = text.rpartition(PREFIX)
    if not mark:
        return None
    fields = dict(word.split("=", 1) for word in after.split("\n", 1)[0].split() if "=" in word)
    usage = {}
    for key in ("cpu_time_s", "max_rss_mb"):
        try:
            usage[key] = float(fields[key])
        except (KeyError, ValueError):
            return None
    return usage if all(math.isfinite(v) for v in usage.values()) else None
