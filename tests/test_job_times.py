"""Job wall times (gpunn.report.job_times): Snakemake's benchmark files and the jobs' clock lines read, each report's
jobs table, the entry page's per-experiment and whole-run wall times (the union of the jobs' clocks, else the sum)
and its "The run" block; the benchmark files each report depends on (targets.job_benchmarks)."""

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
    assert whole["jobs"] == 3 and whole["wall_s"] == pytest.approx(780.0) and whole["job_sum"] == "13.0 min"
    assert whole["wall"] == "13.0 min (sum)" and whole["unclocked"] == 3  # no logs: the sum, marked
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


def _log(root: Path, stage: str, job: str, *lines: str) -> Path:
    path = root / "logs" / stage / f"{job}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_jobs_log_beside_its_benchmark_file_gives_its_start_and_end(tmp_path):
    root = tmp_path / "results"
    layout = Layout(str(root), "gpu")
    bench = layout.job_benchmark("train", "gpu/mnist/run-a")
    assert job_times.job_log(bench) == layout.job_log("train", "gpu/mnist/run-a")
    assert job_times.job_log("results/benchmarks/prepare/mnist.tsv") == "results/logs/prepare/mnist.log"
    _log(root, "train", "gpu/mnist/run-a", "gpunn job clock: start 1764174000.125", "+ python -m gpunn train",
         "epoch 1/1", *["progress"] * 2000, "gpunn job clock: end 1764174042.5")  # a long log: its tail is read
    _benchmark(root, "train", "gpu/mnist/run-a", 42.0)
    row = job_times.read_benchmark(bench)
    assert row["start"] == pytest.approx(1764174000.125) and row["end"] == pytest.approx(1764174042.5)


def test_a_warm_jobs_cpu_time_and_memory_come_from_its_logs_usage_line(tmp_path):
    """gpunn.warm: the job ran in a process Snakemake's benchmark did not see; its client's last line says what the
    job used, and that replaces the benchmark's CPU time and memory (the wall time stays the benchmark's)."""
    from gpunn.jobusage import PREFIX as USAGE_PREFIX

    root = tmp_path / "results"
    for job, usage in (("warm", f"{USAGE_PREFIX} cpu_time_s=3.250 max_rss_mb=812.5 (process 7, forked by the warm "
                                "server)"), ("plain", "done"), ("torn", f"{USAGE_PREFIX} cpu_time_s=3.2")):
        _log(root, "train", f"gpu/{job}", "gpunn job clock: start 5", "+ python -m gpunn train", usage,
             "gpunn job clock: end 9")
        _benchmark(root, "train", f"gpu/{job}", 4.0)
    warm = job_times.read_benchmark(root / "benchmarks/train/gpu/warm.tsv")
    assert (warm["wall_s"], warm["cpu_time_s"], warm["max_rss_mb"]) == (4.0, 3.25, 812.5)
    for job in ("plain", "torn"):  # no line, or a line without both figures: the benchmark's
        row = job_times.read_benchmark(root / f"benchmarks/train/gpu/{job}.tsv")
        assert (row["cpu_time_s"], row["max_rss_mb"]) == (pytest.approx(6.69), pytest.approx(180.63))


@pytest.mark.parametrize("lines, start, end", [
    (["+ python -m gpunn train", "done"], None, None),  # a log from before the clock lines
    (["gpunn job clock: start 100.5", "+ false"], 100.5, None),  # a job that failed or still runs
    (["+ x", "gpunn job clock: end 7"], None, 7.0),
    (["gpunn job clock: start 100", "gpunn job clock: end 99"], 100.0, None),  # an end before the start
    (["gpunn job clock: start 1764174000.N", "gpunn job clock: end 1764174001.5"], None, 1764174001.5),  # no %N
    (["gpunn job clock: end 100", "gpunn job clock: start 101"], None, None),  # each line in its place only
    (["gpunn job clock: start 5", "progress 3/3\rgpunn job clock: end 9"], 5.0, 9.0),  # output without a newline
])
def test_clock_lines_missing_partial_or_out_of_order_read_as_unknown(tmp_path, lines, start, end):
    found = job_times.read_clock(_log(tmp_path, "train", "x", *lines))
    assert [None if math.isnan(v) else v for v in found] == [start, end]
    assert all(math.isnan(v) for v in job_times.read_clock(tmp_path / "missing.log"))


def test_the_busy_time_is_the_union_of_the_jobs_intervals_and_the_span_first_start_to_last_end():
    assert job_times.busy_time([(20, 25), (0, 10), (5, 12)]) == (17.0, 25.0)  # overlapping and disjoint
    assert job_times.busy_time([(0, 10), (2, 5), (10, 11)]) == (11.0, 11.0)  # one inside another; touching
    assert job_times.busy_time([(3, 4)]) == (1.0, 1.0) and job_times.busy_time([]) == (0.0, 0.0)


def _clocked_report(tmp_path, clocks: dict) -> Path:
    """A report e1 over jobs named by `clocks` ({job: (start, end, wall_s)}, start None: a log without clocks)."""
    root, report = tmp_path / "results", tmp_path / "report"
    paths = []
    for job, (start, end, seconds) in clocks.items():
        paths.append(_benchmark(root, "train", f"gpu/{job}", seconds))
        _log(root, "train", f"gpu/{job}", *([] if start is None else [f"gpunn job clock: start {start}"]),
             "+ python -m gpunn train", *([] if start is None else [f"gpunn job clock: end {end}"]))
    (report / "e1").mkdir(parents=True)
    job_times.write(report / "e1", "e1", paths)
    return report


def test_the_whole_runs_wall_time_is_the_busy_time_of_its_jobs_clocks(tmp_path):
    report = _clocked_report(tmp_path, {"a": (1000, 1010, 10), "b": (1005, 1012, 7), "c": (1020, 1025, 5),
                                        "d": (1021, 1022, 1), "e": (1000, 1001, 1), "f": (1002, 1003, 1)})
    table = pd.read_csv(report / "e1/jobs.csv")
    assert list(table.columns) == list(job_times.JOB_COLUMNS) and list(table.columns[-2:]) == ["start", "end"]
    assert list(table["job"][:3]) == ["gpu/a", "gpu/b", "gpu/c"] and list(table["start"][:3]) == [1000, 1005, 1020]
    *_, whole = job_times.summary_rows(report, ["e1"])
    assert whole["wall_source"] == "clock" and whole["wall_s"] == 17.0 and whole["span_s"] == 25.0
    assert whole["sum_s"] == pytest.approx(25.0) and whole["wall"] == "17 s" and whole["job_sum"] == "25 s"
    assert [job for _, job, _ in whole["top"]] == ["a", "b", "c", "d", "e"]  # the five longest, machine dropped
    lines = job_times.run_lines(whole, [])
    assert lines[0] == "**The run.**" and "- 5 longest jobs: train a (10 s); train b (7 s); train c (5 s);" in lines[4]
    assert lines[2] == ("- Wall time: 17 s during which at least one job ran (25 s from the first job's start to the "
                        "last one's end); the jobs' times add up to 25 s.")


def test_a_run_with_unclocked_jobs_shows_the_sum_and_says_so(tmp_path):
    report = _clocked_report(tmp_path, {"a": (1000, 1010, 10), "b": (1005, 1012, 7), "old": (None, None, 30)})
    first, whole = job_times.summary_rows(report, ["e1"])
    assert first["experiment"] == "E1" and first["wall"] == "47 s (sum)"
    assert whole["wall_source"] == "sum" and whole["wall_s"] == pytest.approx(47.0) and whole["unclocked"] == 1
    assert whole["busy_s"] == 12.0  # of the clocked ones
    (wall,) = [line for line in job_times.run_lines(whole, []) if line.startswith("- Wall time")]
    assert wall.startswith("- Wall time: 47 s, the sum of the jobs' times: 1 of 3 jobs have no start and end")
    assert wall.endswith("(the 2 clocked ones: 12 s).")
    assert "marked (sum)" in job_times.SUMMARY_TEXT and "one at a time" not in job_times.SUMMARY_TEXT


def test_a_jobs_csv_from_before_the_clocks_reads_as_unclocked(tmp_path):
    (tmp_path / "e1").mkdir()
    pd.DataFrame([{"stage": "train", "job": "gpu/a", "wall_s": 5.0, "max_rss_mb": 1.0, "cpu_time_s": 1.0}]).to_csv(
        tmp_path / "e1/jobs.csv", index=False)
    _, whole = job_times.summary_rows(tmp_path, ["e1"])
    assert whole["wall_source"] == "sum" and whole["unclocked"] == 1 and whole["wall"] == "5 s (sum)"


GPU = {"device": "NVIDIA H100 80GB HBM3", "driver": "NVIDIA 580.1, CUDA 13.0"}


@pytest.mark.parametrize("records, line", [
    ([{**GPU, "machine_cores": [16], "gpu_slots": [1], "timing_mode": ["overlap"]},
      {"device": "cpu", "machine_cores": [16], "gpu_slots": [0], "timing_mode": ["overlap"]}],
     "Machine: 16 cores, 1 GPU (NVIDIA H100 80GB HBM3). Timing: overlap."),
    ([{**GPU, "machine_cores": [16, 64], "gpu_slots": [2, 4], "timing_mode": ["isolated"]},
      {"device": "cpu", "machine_cores": [8], "timing_mode": ["overlap"]}],
     "Machine: 64 cores (records: 8, 16, 64), 4 GPUs (NVIDIA H100 80GB HBM3; records: 2, 4). "
     "Timing: isolated, overlap (records differ)."),
    ([{"device": "cpu", "machine_cores": 2, "gpu_slots": 0, "timing_mode": "isolated"}],  # one unmerged record
     "Machine: 2 cores, no GPU. Timing: isolated."),
    ([GPU, {"device": "cpu"}],  # records from before gpunn recorded the machine
     "Machine: cores not recorded, GPU count not recorded (NVIDIA H100 80GB HBM3). Timing: not recorded."),
])
def test_the_machine_line_reads_the_provenance_records_with_or_without_the_run_keys(records, line):
    assert job_times.machine_line(records) == line


def test_merged_provenance_records_keep_every_value_of_the_run_keys():
    from gpunn.report import sources

    first = {**GPU, "commit": "abc", "machine_cores": 16, "gpu_slots": 2, "gpu_slot": "1", "timing_mode": "overlap"}
    merged = sources.merge([("a", first), ("b", {**first, "gpu_slot": "0"}), ("c", {**first, "machine_cores": 8}),
                            ("d", {**GPU, "commit": "abc"})])
    (record,) = merged
    assert record["machine_cores"] == [16, 8] and record["gpu_slots"] == [2] and record["timing_mode"] == ["overlap"]
    again = sources.merge([("E1", record), ("E2", {**record, "timing_mode": ["isolated"]})], label="experiments")
    assert again[0]["timing_mode"] == ["overlap", "isolated"] and again[0]["count"] == 2
