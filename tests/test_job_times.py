"""Job wall times (gpunn.report.job_times): Snakemake's benchmark files read, each report's jobs table, and the
entry page's per-experiment and whole-run sums; the benchmark files each report depends on (targets.job_benchmarks)."""

import math
from pathlib import Path

import pandas as pd
import pytest

from gpunn.errors import GpunnError
from gpunn.publish import load_files
from gpunn.report import job_times
from gpunn.targets import EXPERIMENTS, Layout, enabled_experiments, experiment_runs, job_benchmarks

ROOT = Path(__file__).resolve().parents[1]
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _benchmark(root: Path, stage: str, job: str, seconds: float, rss="180.63") -> Path:
    """A benchmark file as Snakemake 9 writes it (a header, then one row; '-' where it measured nothing)."""
    path = root / "benchmarks" / stage / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds:.2f}\t0:00:{int(seconds):02d}\t{rss}\t3406.09\t-\t-\t1.38\t0.03\t52.55\t6.69\n")
    return path


def test_a_benchmark_file_gives_the_jobs_stage_name_and_wall_time(tmp_path):
    path = _benchmark(tmp_path / "results", "train", "gpu/mnist/standard/mlp/gpu-naive/w8_b4_lr0.1_e1_s0", 11.85)
    row = job_times.read_benchmark(path)
    assert row["stage"] == "train" and row["job"] == "gpu/mnist/standard/mlp/gpu-naive/w8_b4_lr0.1_e1_s0"
    assert row["wall_s"] == pytest.approx(11.85) and row["max_rss_mb"] == pytest.approx(180.63)
    assert row["cpu_time_s"] == pytest.approx(6.69)
    unmeasured = job_times.read_benchmark(_benchmark(tmp_path / "results", "prepare", "mnist/standard", 0.5, rss="-"))
    assert unmeasured["wall_s"] == pytest.approx(0.5) and math.isnan(unmeasured["max_rss_mb"])


def test_a_missing_benchmark_file_is_an_unknown_time_and_a_foreign_file_one_error_line(tmp_path):
    row = job_times.read_benchmark(tmp_path / "results/benchmarks/train/gpu/x.tsv")
    assert row["job"] == "gpu/x" and math.isnan(row["wall_s"])
    with pytest.raises(GpunnError, match="not a job's benchmark file"):
        job_times.read_benchmark(tmp_path / "results/logs/train/x.log")
    bad = tmp_path / "results/benchmarks/train/y.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text("seconds\n3\n")
    with pytest.raises(GpunnError, match="y.tsv: no 's' column"):
        job_times.read_benchmark(bad)


def test_a_reports_jobs_table_lists_its_jobs_longest_first_with_their_sum(tmp_path):
    root = tmp_path / "results"
    paths = [_benchmark(root, "prepare", "mnist/standard", 1.0), _benchmark(root, "train", "gpu/run-a", 125.0),
             _benchmark(root, "evaluate", "gpu/run-a", 4.0), root / "benchmarks/train/gpu/old-run.tsv"]
    out = tmp_path / "report"
    out.mkdir()
    job_times.write(out, "e1", paths + paths[:1])  # a path given twice counts once
    table = pd.read_csv(out / "jobs.csv")
    assert list(table["job"]) == ["gpu/run-a", "gpu/run-a", "mnist/standard", "gpu/old-run"]
    assert list(table["stage"]) == ["train", "evaluate", "prepare", "train"]
    page = (out / "jobs.md").read_text()
    assert page.startswith("## E1: 4 jobs, 2.2 min of job wall time in all, longest first")  # 130 s
    assert "1 job(s) have no benchmark file" in page
    assert page.index("| train | gpu/run-a | 2.1 min | 125.0 |") < page.index("| prepare | mnist/standard | 1 s |")


def test_the_entry_pages_wall_times_count_a_shared_job_once_in_the_whole_run(tmp_path):
    root, report = tmp_path / "results", tmp_path / "report"
    shared = _benchmark(root, "train", "gpu/cifar/ae-run", 600.0)
    for experiment, paths in {"e5": [shared, _benchmark(root, "train", "gpu/cifar/ae-cpu", 60.0)],
                              "e6": [shared, _benchmark(root, "svm", "gpu/cifar/ae-run", 120.0)]}.items():
        (report / experiment).mkdir(parents=True)
        job_times.write(report / experiment, experiment, paths)
    rows = job_times.summary_rows(report, ["e5", "e6"])
    by_experiment = {row["experiment"]: row for row in rows}
    assert by_experiment["E5"]["wall_s"] == pytest.approx(660.0) and by_experiment["E6"]["wall_s"] == 720.0
    whole = by_experiment["Whole run"]
    assert whole["jobs"] == 3 and whole["wall_s"] == pytest.approx(780.0) and whole["wall"] == "13.0 min"
    assert whole["longest"].startswith("train cifar/ae-run (10.0 min); svm cifar/ae-run (2.0 min)")
    assert job_times.summary_rows(report, ["e1"]) == []  # no report with a jobs table: no section


@pytest.mark.parametrize("seconds, text", [(42.4, "42 s"), (89.6, "90 s"), (366.0, "6.1 min"), (7200.0, "2.00 h"),
                                           (float("nan"), "-")])
def test_durations_read_at_a_glance(seconds, text):
    assert job_times.format_duration(seconds) == text


def test_every_report_depends_on_the_benchmark_of_each_job_upstream_of_it():
    config = load_files([ROOT / "config/smoke.yaml"], results_dir="results/x")  # the smoke run: every stage
    assert config["machine"] == "cudasim"
    layout = Layout.of(config)
    for experiment in enabled_experiments(config):
        files = job_benchmarks(config, experiment)
        assert len(files) == len(set(files)) and all(f.startswith("results/x/benchmarks/") for f in files)
        assert all(f.endswith(".tsv") for f in files)
        for spec in experiment_runs(config, experiment):  # its runs' training, and their data's download
            assert layout.job_benchmark("train", f"cudasim/{spec.path}") in files, experiment
            assert layout.job_benchmark("download", spec.dataset) in files
    e5_data = experiment_runs(config, "e5")[0].dataset
    assert layout.job_benchmark("make_offline", e5_data) in job_benchmarks(config, "e5")
    assert "results/x/benchmarks/sweep_blocks/cudasim.tsv" in job_benchmarks(config, "e3")
    e6 = job_benchmarks(config, "e6")
    assert any(f.startswith("results/x/benchmarks/svm/") for f in e6)
    assert any(f.startswith("results/x/benchmarks/features/") for f in e6)
    assert set(EXPERIMENTS) >= set(enabled_experiments(config))
