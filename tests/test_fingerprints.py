"""Hand-edit detection (gpunn.targets.edited_intermediates) by the fingerprints a job records beside its log
(gpunn.fingerprints): an edit is found, a mere touch (Snakemake's, on a cluster minutes after the log) is not, and
nothing reads Snakemake's private files."""

import builtins
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpunn.config import load_config
from gpunn.fingerprints import fingerprint, matches, read_record, record_path, write_record
from gpunn.targets import Layout, edited_intermediates, enabled_experiments, planned_intermediates

ROOT = Path(__file__).parents[1]


def test_record_round_trip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("out").mkdir()
    Path("out/a.csv").write_text("a,b\n1,2\n")
    assert read_record("job.log") == {}  # no record
    write_record("job.log", ["./out/a.csv", "out/missing.npz"])  # a missing output is left out
    prints = read_record("job.log")
    assert list(prints) == ["out/a.csv"] and prints["out/a.csv"] == fingerprint("out/a.csv")
    assert prints["out/a.csv"]["size"] == 8
    assert matches("out/a.csv", prints["out/a.csv"]) is True
    Path("out/a.csv").write_text("a,b\n1,3\n")  # same size, other bytes
    assert matches("out/a.csv", prints["out/a.csv"]) is False
    assert matches("out/a.csv", None) is None
    record_path("job.log").write_text("{not json")
    assert read_record("job.log") == {}


def test_command_line_writes_the_record(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"\0" * 10)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "gpunn.fingerprints", "x.log", "x.npy"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_record(tmp_path / "x.log") == {"x.npy": fingerprint(tmp_path / "x.npy")}


@pytest.fixture
def finished_job(tmp_path, monkeypatch):
    """A planned run output and its train job's log, as that job left them at t=1000 (log) with its record,
    in a workflow folder that is the working directory (as jobs and planning see it)."""
    monkeypatch.chdir(tmp_path)
    config = load_config(yaml.safe_load((ROOT / "config/smoke.yaml").read_text()), log=lambda line: None)
    path, log = next((p, g) for p, g in planned_intermediates(config, "e1").items() if g and "runs/" in p)
    for name in (path, log):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text('{"loss": 0.5}')
    Path(log).write_text("gpunn train: done in 1.0 s\n")
    write_record(log, [path])
    os.utime(log, (1000.0, 1000.0))
    os.utime(path, (1000.0, 1000.0))
    return config, path, log


def test_a_touch_after_the_log_is_no_edit(finished_job):
    """On Slurm, Snakemake touches a job's outputs when it sees the job finish, long after its log: same bytes,
    so no edit. Without a record (a job of an older checkout) the mtime alone decides."""
    config, path, log = finished_job
    assert edited_intermediates(config, ["e1"]) == []
    os.utime(path, (1060.0, 1060.0))  # touched a minute after the log
    assert edited_intermediates(config, ["e1"]) == []
    record_path(log).unlink()
    assert edited_intermediates(config, ["e1"]) == [path]


def test_an_edit_after_the_log_is_found(finished_job):
    config, path, log = finished_job
    Path(path).write_text('{"loss": 0.4}')  # same size, other bytes
    os.utime(path, (1060.0, 1060.0))
    assert edited_intermediates(config, ["e1"]) == [path]
    Path(path).write_text('{"loss": 0.5, "x": 1}')  # other size
    os.utime(path, (1060.0, 1060.0))
    assert edited_intermediates(config, ["e1"]) == [path]
    os.utime(path, (1001.0, 1001.0))  # within EDIT_SLACK_S of the log: taken as the job's own write
    assert edited_intermediates(config, ["e1"]) == []


def test_edit_detection_reads_no_snakemake_file(finished_job, monkeypatch):
    """No file under .snakemake/ is opened, listed or stat-ed while looking for edits, and no source of the
    package or the workflow names that folder."""
    config, path, log = finished_job
    touched = []

    def spied(module, name):
        real = getattr(module, name)

        def spy(target, *args, **kwargs):
            touched.append(str(target))
            return real(target, *args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    for module, name in ((os, "stat"), (os, "scandir"), (os, "listdir"), (io, "open"), (builtins, "open")):
        spied(module, name)
    Path(path).write_text('{"loss": 0.4}')
    os.utime(path, (1060.0, 1060.0))
    assert edited_intermediates(config, ["e1"]) == [path]
    assert str(record_path(log)) in touched  # the spies see what is read
    assert not [t for t in touched if ".snakemake" in t]
    sources = [*(ROOT / "src/gpunn").rglob("*.py"), *(ROOT / "workflow").rglob("*.smk"), ROOT / "Snakefile"]
    assert not [str(p) for p in sources if ".snakemake" in p.read_text(encoding="utf-8")]


def test_every_job_of_a_planned_file_records_it(workflow_copy):
    """Each planned intermediate file of the smoke config (all experiments) is fingerprinted by the job that
    writes it, into its log's record: the job's shell command ends by recording its outputs."""
    from snakemake.utils import update_config

    from snakemake_helpers import run_snakemake

    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "2", "--configfile", "config/smoke.yaml")
    assert out.returncode == 0, out.stderr[-2000:]
    recorded = {}  # log -> the outputs its job records
    for line in re.findall(r"python -m gpunn\.fingerprints ([^;]*)", out.stdout + out.stderr):
        log, *outputs = shlex.split(line)
        recorded[log] = outputs
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config/smoke.yaml").read_text()))
    config = load_config(config, log=lambda line: None)
    planned = {p: g for e in enabled_experiments(config) for p, g in planned_intermediates(config, e).items() if g}
    logs = Layout.of(config).logs("")  # <results_dir>/logs/<rule>/...
    assert {Path(log).relative_to(logs).parts[0] for log in planned.values()} == {
        "prepare", "train", "evaluate", "features", "svm", "time_batches", "sweep_blocks", "step_profile"}
    assert not [path for path, log in planned.items() if path not in recorded.get(log, [])]
