"""Exact reruns: a change reruns exactly the jobs whose outputs it changes (issue: download options never
retrain; E2's split settings reach only E2's prepare job; a removed or corrupted raw or intermediate file
reruns its job and only what depends on it), and results of different configs never mix.

One small DAG, built once in a temporary copy of the workflow: E1 (cpu-numpy) on digits8 and E2 (one cell,
cpu-numpy) on digits28, everything else disabled. Each test asks `snakemake -n` what it would run after one
change and compares the planned jobs with the expected set; tests that change files restore them by a run.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from snakemake_helpers import run_snakemake, snakemake_command

CONFIG = {
    "threads": 1,
    "results_dir": "results/small",
    "splits": {"e2": {"train": 600, "test": 200, "seed": 0}},
    "experiments": {
        "e1": {"dataset": "digits8", "hidden": 8, "batch": 32, "lr": 0.1, "epochs": 1, "subset": 0,
               "variants": ["cpu-numpy"]},
        "e2": {"dataset": "digits28", "hidden": [8], "batch": [32], "lr": 0.1, "epochs": 1, "variants": ["cpu-numpy"]},
        **{e: {"enabled": False} for e in ("e3", "e4", "e5", "e6")},
    },
}
E1_CHAIN = {"train", "evaluate", "report_e1", "report_index", "all"}
E2_CHAIN = {"train", "report_e2", "report_index", "all"}


def _snakemake(workdir, *args, config="small.yaml"):
    return run_snakemake(workdir, *args, "--cores", "2", "--configfile", config)  # --configfile takes all after it


def planned(workdir, *args, config="small.yaml") -> Counter:
    """Rule name -> number of jobs `snakemake -n` plans (with the given extra arguments)."""
    out = _snakemake(workdir, "-n", *args, config=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # each job is its rule's one-line message, "Job <id>: <rule>: <what>" (workflow/rules/common.smk: job_message)
    return Counter(re.findall(r"^Job \d+: (\w+): ", out.stdout + out.stderr, flags=re.MULTILINE))


def planned_wildcards(workdir, *args) -> list[str]:
    """The wildcards of every planned job, from Snakemake's full job blocks (config key job_details)."""
    out = _snakemake(workdir, "-n", *args, "job_details=true")  # after the test's own --config values
    return re.findall(r"^\s+wildcards: (.*)$", out.stdout, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def small(workflow_copy):
    (workflow_copy / "small.yaml").write_text(yaml.safe_dump(CONFIG))
    out = _snakemake(workflow_copy)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert planned(workflow_copy) == Counter()
    return workflow_copy


def _rebuild(workdir) -> Counter:
    """A real run; the jobs it ran, by rule (their one-line messages), after which nothing is left to do."""
    out = _snakemake(workdir)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert planned(workdir) == Counter()
    return Counter(re.findall(r"^Job \d+: (\w+): ", out.stdout + out.stderr, flags=re.MULTILINE))


def _tree(workdir) -> dict[str, tuple[int, bytes]]:
    """Every file of the results tree and of .snakemake/metadata: its mtime (ns) and bytes."""
    files = [*(workdir / "results").rglob("*"), *(workdir / ".snakemake/metadata").rglob("*")]
    return {str(p.relative_to(workdir)): (p.stat().st_mtime_ns, p.read_bytes()) for p in files if p.is_file()}


def _dry_run_changes_nothing(workdir) -> str:
    """`snakemake -n` after a change: the tree is byte-identical (and no timestamp moved); its stderr."""
    before = _tree(workdir)
    out = _snakemake(workdir, "-n")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _tree(workdir) == before
    return out.stderr


@pytest.mark.parametrize("change", [
    ["--config", "data={timeout_s: 2}"],
    ["--config", "data={mirror_dir: /nonexistent/mirror}"],
    ["--config", "threads=2"],
])
def test_download_options_rerun_nothing(small, change):
    assert planned(small, *change) == Counter()


def test_keep_diverged_reruns_no_finished_run(small):
    """keep_diverged reaches the train jobs as a param derived from their outputs, which Snakemake does not record:
    finished runs (none of which diverged) stay as they are."""
    assert planned(small, "--config", "experiments={e1: {keep_diverged: true}, e2: {keep_diverged: true}}") == Counter()


def test_e2_split_reaches_only_e2_prepare(small):
    jobs = planned(small, "--config", "splits={e2: {train: 500}}")
    assert set(jobs) == {"prepare"} | E2_CHAIN
    assert jobs["prepare"] == 1 and jobs["train"] == 1
    assert "dataset=digits28, split=e2" in planned_wildcards(small, "--config", "splits={e2: {train: 500}}")


def test_removed_prepared_split_reruns_it_and_its_dependents(small):
    prepared = small / "results/small/data/prepared/digits8/standard.npz"
    prepared.unlink()
    jobs = planned(small)
    assert set(jobs) == {"prepare"} | E1_CHAIN  # E2 (digits28) untouched
    assert jobs["prepare"] == 1
    _rebuild(small)
    assert prepared.is_file()


def test_removed_raw_file_is_fetched_again(small):
    raw = small / "results/small/data/raw/digits28/t10k-labels-idx1-ubyte.gz"
    raw.unlink()
    jobs = planned(small)
    assert set(jobs) == {"download_idx", "prepare"} | E2_CHAIN  # E1 (digits8) untouched
    _rebuild(small)
    assert raw.is_file()


def test_corrupted_raw_file_is_fetched_again(small):
    """A raw file replaced by a valid gzip with altered pixels: its manifest no longer holds, the download is
    redone (the file is fetched again from the mirror) and what depends on it reruns."""
    raw = small / "results/small/data/raw/digits8/train-images-idx3-ubyte.gz"
    original = gzip.decompress(raw.read_bytes())
    altered = bytearray(original)
    altered[-1] ^= 0xFF
    raw.write_bytes(gzip.compress(bytes(altered)))
    said = _dry_run_changes_nothing(small)  # parsing and planning never write (the manifest stays)
    assert "train-images-idx3-ubyte.gz (" in said
    assert "a run (not this dry run) fetches it again" in said
    assert set(_rebuild(small)) == {"download_idx", "prepare"} | E1_CHAIN
    assert gzip.decompress(raw.read_bytes()) == original


def test_edited_intermediate_is_remade(small):
    """A prepared split overwritten by hand (still a valid npz, one pixel changed) after its job: it is moved
    aside and remade, and what depends on it reruns; digits28's E2 chain is untouched."""
    import numpy as np

    prepared = small / "results/small/data/prepared/digits8/standard.npz"
    with np.load(prepared) as saved:
        arrays = dict(saved)
    original = arrays["x_train"].copy()
    arrays["x_train"][0, 0, 0, 0] ^= 0xFF
    time.sleep(2.5)  # later than the prepare job's log by more than gpunn.targets.EDIT_SLACK_S
    with open(prepared, "wb") as fh:
        np.savez(fh, **arrays)
    said = _dry_run_changes_nothing(small)
    assert f"{prepared.relative_to(small)} was changed after the job that wrote it; a run (not this dry run)" in said
    assert not Path(f"{prepared}.edited").exists()
    assert set(_rebuild(small)) == {"prepare"} | E1_CHAIN
    assert Path(f"{prepared}.edited").is_file()
    with np.load(prepared) as saved:
        assert np.array_equal(saved["x_train"], original)


def test_touched_intermediates_are_no_edit(small):
    """Each job of a planned intermediate file records its outputs' fingerprints beside its log; every output
    touched later (as Snakemake does on a cluster, minutes after the log) keeps its bytes: no edit, nothing reruns.
    Without its job's record, a touched file counts as edited (the mtime alone decides)."""
    from gpunn.fingerprints import SUFFIX, fingerprint

    logs = small / "results/small/logs"
    records = {p: p.read_bytes() for p in logs.rglob(f"*{SUFFIX}")}
    assert {p.relative_to(logs).parts[0] for p in records} == {"prepare", "train", "evaluate"}
    for record in records:
        for path, recorded in json.loads(record.read_bytes()).items():
            assert fingerprint(small / path) == recorded
    outputs = [p for p in (small / "results/small").rglob("*")  # with the benchmarks (Snakemake's oldest outputs)
               if p.is_file() and p.relative_to(small / "results/small").parts[0] != "logs"]
    time.sleep(2.5)  # later than every log by more than gpunn.targets.EDIT_SLACK_S
    now = time.time()
    for path in outputs:  # one time for all: no input becomes newer than what is made from it
        os.utime(path, (now, now))
    said = _dry_run_changes_nothing(small)
    assert "was changed after" not in said
    assert planned(small) == Counter()
    (record,) = [p for p in records if p.relative_to(logs).parts[0] == "prepare" and "digits8" in p.parts]
    record.unlink()
    assert "standard.npz was changed after the job that wrote it" in _dry_run_changes_nothing(small)
    record.write_bytes(records[record])
    assert planned(small) == Counter()


def test_removed_run_output_reruns_that_run_only(small):
    (metrics,) = (small / "results/small/runs").glob("*/digits28/e2/mlp/cpu-numpy/*/metrics.json")
    metrics.unlink()
    assert set(planned(small)) == E2_CHAIN
    _rebuild(small)


def test_other_config_never_mixes_and_report_still_works(small):
    """A second config with its own results_dir: nothing of the first is touched, and the first config's
    `snakemake --report` works after both ran."""
    other = dict(CONFIG, results_dir="results/other")
    other["experiments"] = dict(CONFIG["experiments"], e2={"enabled": False})
    (small / "other.yaml").write_text(yaml.safe_dump(other))
    before = {p: p.stat().st_mtime_ns for p in (small / "results/small").rglob("*") if p.is_file()}
    out = _snakemake(small, config="other.yaml")
    assert out.returncode == 0, out.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (small / "results/small").rglob("*") if p.is_file()} == before
    assert list((small / "results/other/report").glob("*/e1/summary.md"))
    assert planned(small) == Counter()
    out = _snakemake(small, "--report", "report.zip")
    assert out.returncode == 0, out.stderr[-3000:]
    assert Path(small / "report.zip").stat().st_size > 0


def test_a_failing_job_shows_its_error_on_the_terminal(small):
    """A job's error reaches the terminal, not only its log: here a GPU variant on a machine without a GPU,
    whose one-line error names the config key that runs it under the simulator."""
    failing = dict(CONFIG, results_dir="results/failing")
    failing["experiments"] = dict(CONFIG["experiments"], e1=dict(CONFIG["experiments"]["e1"], variants=["gpu-naive"]),
                                  e2={"enabled": False})
    (small / "failing.yaml").write_text(yaml.safe_dump(failing))
    out = _snakemake(small, "e1", config="failing.yaml")
    assert out.returncode != 0
    errors = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("gpunn: error:")]
    assert errors and "gpu.simulator: true" in errors[0] and "NUMBA_ENABLE_CUDASIM=1" in errors[0]
    # and it is the last thing printed, after Snakemake's error blocks: the job, its log, its line (onerror)
    failed, line, last = out.stderr.splitlines()[-3:]
    assert failed.startswith("gpunn: failed: ") and "(its log: results/failing/logs/" in failed
    assert line == f"  {errors[0]}" and last.startswith("gpunn: 1 job failed")
    # the first GPU job to run fails (gpu-naive's train or its step profile for E1's report) and stops Snakemake:
    # that job's own log holds the same line
    logs = [log for log in (small / "results/failing/logs").rglob("*.log") if errors[0] in log.read_text()]
    assert len(logs) == 1 and logs[0].relative_to(small / "results/failing/logs").parts[0] in ("train",
                                                                                                  "step_profile"), logs


def test_a_diverged_run_fails_its_job_unless_its_experiment_keeps_it(small):
    """E1 at a huge learning rate: the train job stops with the divergence line and writes no outputs; with
    experiments.e1.keep_diverged the pipeline finishes and its summary and entry page mark the run diverged."""
    diverged = dict(CONFIG, results_dir="results/diverged")
    diverged["experiments"] = dict(CONFIG["experiments"], e1=dict(CONFIG["experiments"]["e1"], lr=1e6),
                                   e2={"enabled": False})
    (small / "diverged.yaml").write_text(yaml.safe_dump(diverged))
    out = _snakemake(small, config="diverged.yaml")
    assert out.returncode != 0
    errors = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("gpunn: error:")]
    assert errors and errors[0].startswith("gpunn: error: training diverged: run digits8/standard/mlp/cpu-numpy/")
    assert "at learning rate 1e6: train loss" in errors[0]
    failed, line, last = out.stderr.splitlines()[-3:]  # the last lines: the failed job, its log and its line
    assert failed.startswith("gpunn: failed: train digits8/standard/mlp/cpu-numpy/w8_b32_lr1e6_e1_s0")
    log = failed.split("(its log: ")[1].rstrip(")")
    assert line == f"  {errors[0]}" and errors[0] in (small / log).read_text()
    assert last == ("gpunn: 1 job failed (above, each with its log); the jobs that finished are kept: fix the cause "
                    "and rerun the same command")
    assert not list((small / "results/diverged/runs").rglob("metrics.json"))
    out = run_snakemake(small, "--cores", "2", "--configfile", "diverged.yaml", "--config",
                        "experiments={e1: {keep_diverged: true}}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (summary,) = (small / "results/diverged/report").glob("*/e1/summary.csv")
    assert pd.read_csv(summary)["diverged"].tolist() == [True, True]  # E1's mean and sum runs
    page = (summary.parent.parent / "index.md").read_text()
    assert "## Diverged runs" in page and "- E1: cpu-numpy, reduction mean, dataset digits8" in page


def test_a_report_of_jobs_still_to_run_is_refused(small):
    """`snakemake --report` of a config whose jobs have not all run (here E1 at another learning rate, as after its
    train job failed) stops with one line, instead of bundling the figures on disk (another config's) under its
    runs' names; the config that was run gets its report (test_other_config_never_mixes_and_report_still_works)."""
    out = run_snakemake(small, "--report", "stale.html", "--cores", "2", "--configfile", "small.yaml", "--config",
                        "experiments={e1: {lr: 1e6}}")
    assert out.returncode == 1 and not (small / "stale.html").exists()
    last = out.stderr.splitlines()[-1]
    assert last.startswith("gpunn: report refused: 5 jobs of this config must run first (") and "train x2" in last


def test_sigterm_stops_the_running_job_at_once_and_says_so(small):
    """SIGTERM to Snakemake: the running train job is stopped too (not waited for), leaves no outputs, its log says
    why, and the last line says the run was stopped and how to resume (gpunn.failures.forward_signals)."""
    argv, env = snakemake_command("e1", "--cores", "2", "--configfile", "small.yaml", "--config",
                                  "experiments={e1: {epochs: 100000}}")
    run = subprocess.Popen(argv, cwd=small, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = small / "results/small/logs/train"
    deadline = time.monotonic() + 120
    while not any("epoch 1/" in log.read_text() for log in logs.rglob("*_e100000_s0*.log")):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.2)
    sent = time.monotonic()
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert time.monotonic() - sent < 10 and run.returncode != 0
    # E1's two runs (mean and sum reduction) are one CPU-timed job at a time, in either order
    stopped = re.fullmatch(r"gpunn: stopped by SIGTERM; 1 running job stopped, no outputs kept: train "
                           r"(digits8/standard/mlp/cpu-numpy/w8_b32_lr0\.1_e100000_s0(?:_rsum)?)\. The jobs that "
                           r"finished are kept: rerun the same command to resume", stderr.splitlines()[-1])
    assert stopped, stderr.splitlines()[-1]
    assert not list((small / "results/small/runs").rglob("*_e100000_s0*"))
    (log,) = logs.rglob(stopped.group(1).rsplit("/", 1)[1] + ".log")
    assert log.read_text().endswith("gpunn: stopped: Snakemake was sent SIGTERM; no outputs kept\n")
    time.sleep(0.5)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, b"_e100000_s0")]


def _cmdline_has(pid: str, text: bytes) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
