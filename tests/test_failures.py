"""gpunn.failures on its own: which line of a failed job's log is its error, and the last lines of a failed or
stopped run (the pipeline's cases are in test_reruns.py: a failing job, a diverged run, SIGTERM, a stale report)."""

import os
import signal
import subprocess
import sys
import time

from gpunn.failures import KILLED, descendants, error_line, stale_report_line, summary


def _log(tmp_path, text):
    path = tmp_path / "job.log"
    path.write_text(text)
    return str(path)


def test_the_error_line_is_gpunns_else_the_last_line_of_the_job(tmp_path):
    clock, traced = "gpunn job clock: start 1.0\n", "+ python -m gpunn train x\n"
    gpunn = _log(tmp_path, f"{clock}{traced}epoch 1/3\ngpunn: config error: bad key\nTraceback (most recent...)\n")
    assert error_line(gpunn) == "gpunn: config error: bad key"
    crash = _log(tmp_path, f"{clock}{traced}epoch 1/3\n  File \"x.py\"\nValueError: shapes differ\n\n")
    assert error_line(crash) == "ValueError: shapes differ"
    assert error_line(_log(tmp_path, f"{clock}{traced}")) is None
    assert error_line(str(tmp_path / "missing.log")) is None


def test_summary_of_failed_and_of_stopped_runs(tmp_path):
    log = _log(tmp_path, "gpunn: error: training diverged: run r\n")
    lines = summary([("train r", log), ("svm", None)])
    assert lines == [f"gpunn: failed: train r (its log: {log})", "  gpunn: error: training diverged: run r",
                     "gpunn: failed: svm", f"  ({KILLED})",
                     "gpunn: 2 jobs failed (above, each with its log); the jobs that finished are kept: fix the "
                     "cause and rerun the same command"]
    assert summary([]) == []
    (stopped,) = summary([("train r", log)], stopped_by=signal.SIGTERM)
    assert stopped.startswith("gpunn: stopped by SIGTERM; 1 running job stopped, no outputs kept: train r. ")
    assert "no job was running" in summary([], stopped_by=signal.SIGTERM)[0]


def test_descendants_lists_children_and_grandchildren():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"])
    try:
        for _ in range(100):
            if descendants(child.pid):
                break
            time.sleep(0.05)
        (grandchild,) = descendants(child.pid)
        assert child.pid in descendants() and grandchild in descendants()
    finally:
        for pid in [*descendants(child.pid), child.pid]:
            os.kill(pid, signal.SIGTERM)
        child.wait()


def test_stale_report_line_counts_the_jobs_by_rule():
    class Job:
        def __init__(self, name):
            self.rule = type("Rule", (), {"name": name})

    assert stale_report_line([]) is None
    line = stale_report_line([Job("train"), Job("train"), Job("report_e1")])
    assert line.startswith("gpunn: report refused: 3 jobs of this config must run first (train x2, report_e1); ")
