"""The README's smoke run: the whole DAG on tiny offline data, in a temporary copy of the workflow.

One run of the pipeline (module-scoped) feeds several checks: every stage's outputs exist, the CPU MLP
and CNN learn (clearly above chance), the GPU MLP variants (under the CUDA simulator, on tiny shapes) end
where cpu-numpy ends, the SVM ran on real encoder features, reruns are no-ops.

The same smoke run then goes through a real single-node Slurm cluster (tests/slurm_cluster.py) with
profiles/slurm (tests marked `slurm`): every cluster job went through sbatch and shows in sacct, the results
equal the local run's, and a job that Slurm cancels is reported and resumed. These tests live here, beside the
local run they compare with, so that both runs happen once, in one pytest-xdist worker (--dist loadfile).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from slurm_cluster import SlurmCluster, SlurmUnavailable, missing_programs
from snakemake_helpers import copy_workflow, readme_commands, snakemake_command
from snakemake_helpers import run_snakemake as _run_snakemake

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
E1_VARIANTS = ["cpu-numpy", "cpu-serial", "gpu-naive", "gpu-tiled", "gpu-fused"]  # config/smoke.yaml
E4_VARIANTS = ["cpu-numpy", "gpu-naive", "gpu-optimized", "gpu-im2col"]  # on digits8_mini, + gpu-naive _t32


# config/smoke.yaml: results_dir results/smoke; GPU jobs under the simulator, so measured outputs are under
# <stage>/cudasim/
MACHINE = "cudasim"


def run_snakemake(workdir: Path, *args, timeout=600):
    return _run_snakemake(workdir, "--cores", "2", "--configfile", "config/smoke.yaml", *args, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("smoke"))
    start = time.perf_counter()
    out = run_snakemake(workdir)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    (workdir / "smoke-output.txt").write_text(out.stdout + out.stderr)
    return workdir / "results/smoke", elapsed, workdir


def _runs(results: Path, pattern: str):
    found = sorted(results.glob(f"runs/{MACHINE}/{pattern}/metrics.json"))
    assert found, f"no run matches {pattern}"
    return [json.loads(p.read_text()) for p in found]


def test_the_output_is_quiet(smoke):
    """What the terminal shows: each job as its one-line message and its own progress lines, no warning, no
    traceback, no line over ~200 characters (file lists and commands are in the jobs' logs)."""
    _, _, workdir = smoke
    lines = (workdir / "smoke-output.txt").read_text().splitlines()
    assert not [line for line in lines if "warning" in line.lower() or "Traceback" in line]
    long = [line for line in lines if len(line) > 200 and not line.startswith("  Command: ")]
    assert not long, long[:3]
    assert any(line.startswith("Job ") and line.endswith(": report_e1: tables, figures, the paper beside ours")
               for line in lines)
    clock, log = (workdir / "results/smoke/logs/report/cudasim/e1.log").read_text().split("\n", 1)
    assert clock.startswith("gpunn job clock: start ")  # the job's start (gpunn.report.job_times), then
    assert log.startswith("+ python -m gpunn report e1 --out results/smoke/report/cudasim/e1 ")  # the command
    logs = sorted((workdir / "results/smoke/logs").rglob("*.log"))
    assert len(logs) >= 40
    for path in logs:  # each job's log opens with its traced command, never with the tee that copies its output
        clock, text = path.read_text().split("\n", 1)
        assert text.startswith("+ ") and "+ tee " not in text, (path, text[:300])
        assert text.rstrip("\n").rsplit("\n", 1)[-1].startswith("gpunn job clock: end "), path


def test_every_stage_left_its_outputs(smoke):
    results, _, _ = smoke
    for dataset, split in (("digits8_mini", "standard"), ("synthetic_mnist_small", "e2"),
                           ("synthetic_cifar10_small", "standard")):
        assert (results / f"offline/{dataset}/manifest.json").is_file()
        assert (results / f"data/raw/{dataset}/manifest.json").is_file()
        assert (results / f"data/prepared/{dataset}/{split}.npz").is_file()
    for pattern in (*(f"digits8_mini/standard/mlp/{variant}/*" for variant in E1_VARIANTS),
                    "*/standard/cnn/cpu-numpy/*", "synthetic_cifar10_small/standard/autoencoder/cpu-numpy/*"):
        for summary in _runs(results, pattern):
            run = results / "runs" / MACHINE / summary["spec"]["path"]
            frame = pd.read_csv(run / "metrics.csv")
            assert list(frame["epoch"]) == list(range(1, summary["spec"]["epochs"] + 1))
            assert np.isfinite(frame[["train_loss", "test_loss", "epoch_time_s"]].to_numpy()).all()
            assert (run / "weights.npz").is_file()
    e3_variants = set(pd.read_csv(results / f"report/{MACHINE}/e3/summary.csv")["variant"])
    assert e3_variants == {"cpu-numpy", "cpu-serial", "gpu-fused"}  # time_batches ran a GPU variant (simulated)
    for experiment, figures in {"e1": ["loss_curves", "samples", "epoch_time", "reduction_gap", "step_profile"],
                                "e2": ["heatmaps", "forward_backward"], "e3": ["batch_timing", "block_sweep"],
                                "e4": ["cumulative_time", "loss_curves", "block_time", "block_loss", "step_profile"],
                                "e5": ["mse_curves", "reconstructions", "training_time", "speedup"],
                                "e6": ["confusion"]}.items():
        report = results / "report" / MACHINE / experiment
        table = pd.read_csv(report / "summary.csv")
        assert len(table) >= 1
        assert (report / "summary.md").read_text().count("\n|") >= len(table)
        for name in figures:
            assert (report / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
            assert (report / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
        assert json.loads((report / "provenance.json").read_text())["sources"]
    # E5's cpu-numpy trains on 500 images: the paper's tables show its epoch extrapolated to 50 000
    e5_paper = pd.read_csv(results / "report" / MACHINE / "e5" / "paper_table.csv")
    assert list(e5_paper["implementation"]) == ["CPU (extrapolated)"]


def test_markdown_tables_are_narrow_and_csvs_complete(smoke):
    """Every Markdown table of the report shows at most MARKDOWN_COLUMNS columns; a summary that leaves some out
    names them, and its CSV holds them."""
    from gpunn.report.tables import MARKDOWN_COLUMNS

    results, _, _ = smoke
    pages = sorted((results / "report" / MACHINE).rglob("*.md"))
    assert len(pages) >= 15
    for page in pages:
        text = page.read_text()
        widths = [line.count(" | ") + 1 for line in text.splitlines() if line.startswith("| ")]
        assert widths and max(widths) <= MARKDOWN_COLUMNS, (page.name, max(widths))
        left_out = next((line for line in text.splitlines() if line.startswith(f"Also in {page.stem}.csv: ")), None)
        if left_out:
            csv_columns = set(pd.read_csv(page.with_suffix(".csv")).columns)
            assert set(left_out.split(": ", 1)[1].rstrip(".").split(", ")) <= csv_columns, page.name


def test_the_entry_page_covers_every_experiment(smoke):
    """report/<machine>/index.md: every experiment's headline rows (the simulated ones labelled), links to its
    tables and figures, and the provenance of the runs."""
    results, _, _ = smoke
    page = (results / "report" / MACHINE / "index.md").read_text()
    for experiment in ("E1", "E2", "E3", "E4", "E5", "E6"):
        assert f"\n| {experiment} | " in page and f"### {experiment}: " in page
    assert "not run:" not in page  # the smoke config runs every experiment
    assert "| cuda-simulator |" in page and "not meaningful" in page
    assert "(e5/reconstructions.png) ([PDF](e5/reconstructions.pdf)): " in page
    assert "## Provenance" in page and "| 0.30.4 |" in page  # numba-cuda's version, as pinned
    summary = pd.read_csv(results / "report" / MACHINE / "index.csv")
    assert set(summary["experiment"]) == {"E1", "E2", "E3", "E4", "E5", "E6"}


def test_every_report_lists_the_wall_time_of_each_job_it_depends_on(smoke):
    """jobs.csv of each report: one row per job upstream of it (targets.job_benchmarks), each timed by its benchmark
    file; the entry page sums them per experiment and over the whole run."""
    from gpunn.publish import load_files
    from gpunn.targets import job_benchmarks

    results, _, workdir = smoke
    config = load_files([workdir / "config/smoke.yaml"])
    for experiment in ("e1", "e2", "e3", "e4", "e5", "e6"):
        jobs = pd.read_csv(results / "report" / MACHINE / experiment / "jobs.csv")
        assert len(jobs) == len(job_benchmarks(config, experiment)) and jobs["wall_s"].notna().all(), experiment
        assert (jobs["wall_s"] > 0).all() and list(jobs["wall_s"]) == sorted(jobs["wall_s"], reverse=True)
    page = (results / "report" / MACHINE / "index.md").read_text()
    assert "## How long it took" in page and "\n| Whole run | " in page


def test_every_job_log_has_its_clock_and_the_entry_page_the_runs_wall_time(smoke):
    """Each job's log opens and closes with its clock (common.smk's logged), which jobs.csv carries; the entry page
    states the run's wall time from them (every job clocked: no fallback to the sum), the machine and the longest
    jobs."""
    from gpunn.report import job_times

    results, _, _ = smoke
    train_logs = sorted((results / "logs/train").rglob("*.log"))
    assert train_logs
    for log in train_logs:
        start, end = job_times.read_clock(log)
        assert 1.7e9 < start <= end < start + 3600, log  # epoch seconds, this run's
    every = pd.concat(pd.read_csv(results / "report" / MACHINE / e / "jobs.csv") for e in ("e1", "e4", "e6"))
    assert every[["start", "end"]].notna().all().all() and (every["start"] <= every["end"]).all()
    page = (results / "report" / MACHINE / "index.md").read_text()
    run = page.split("**The run.**", 1)[1].split("\n\n", 2)[1]
    assert "during which at least one job ran" in run and not re.search(r"\d (s|min|h) \(sum\)", page), run
    assert "\n- Machine: " in run and " Timing: " in run and "\n- 5 longest jobs: " in run
    assert "| Wall time | Job time (sum) |" in page


def test_jobs_were_placed_on_two_simulated_gpus_and_cores_of_their_own(smoke):
    """config/smoke.yaml: gpus 2, timing overlap. Every GPU run names its slot; two GPU jobs that ran at the same
    time were on different slots; a CPU-timed job shared its cores with no job that ran beside it. A job runs with
    its slots from `placed_at` (provenance) until its process exits, after `finished_at` (metrics.json): a job's clock
    (its log) also spans any wait for slots, so two clocks may overlap where the later job waited for the earlier's
    slot."""
    from gpunn.report import job_times

    results, _, _ = smoke
    jobs = []
    for path in sorted(results.glob(f"runs/{MACHINE}/**/metrics.json")):
        prov = json.loads(path.read_text())["provenance"]
        log = results / "logs/train" / f"{path.parent.relative_to(results / 'runs')}.log"
        clock_start, clock_end = job_times.read_clock(log)
        start, end = prov["placed_at"], json.loads(path.read_text())["finished_at"]
        assert clock_start <= start < end <= clock_end, (path, clock_start, start, end, clock_end)
        cores = {int(c) for part in prov["cores"].split(",") for c in
                 range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
        jobs.append({"gpu": prov["device"] != "cpu", "slot": prov["gpu_slot"], "cores": cores, "start": start,
                     "end": end, "mode": prov["timing_mode"], "slots": prov["gpu_slots"]})
        # OpenBLAS's idle threads asleep in the convolutional models' jobs only (gpunn.blas_idle)
        convolutional = {"cnn", "autoencoder"} & set(path.parts)
        assert prov["blas_idle"] == ("4" if convolutional else None), path
    gpu = [j for j in jobs if j["gpu"]]
    assert gpu and all(j["slot"] in ("0", "1") and j["slots"] == 2 for j in gpu)
    assert all(j["mode"] == "overlap" for j in jobs)
    together = [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1:] if a["start"] < b["end"] and
                b["start"] < a["end"]]
    assert together  # two cores, ~40 runs: some ran side by side
    for a, b in together:
        assert not (a["cores"] & b["cores"]), (a, b)
        if a["gpu"] and b["gpu"]:
            assert a["slot"] != b["slot"], (a, b)
    page = (results / "report" / MACHINE / "index.md").read_text()
    assert "2 GPUs (cuda-simulator)" in page and "Timing: overlap" in page


def _published_readme(tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text("# gpunn\n\n## Results\n\n<!-- gpunn publish: begin published (generated) -->\nold text\n"
                      "<!-- gpunn publish: end -->\n\n## Next\n")
    return readme


def _publish(workdir: Path, *args):
    argv, env = snakemake_command()
    return subprocess.run([str(Path(argv[0]).parent / "python"), "-m", "gpunn", "publish", "--configfile",
                           "config/smoke.yaml", *args], cwd=workdir, capture_output=True, text=True, env=env,
                          timeout=300)


def test_publish_copies_the_reports_without_pdfs_and_writes_the_readmes_results(smoke, tmp_path):
    from gpunn.report import readme

    _, _, workdir = smoke
    readme_path = _published_readme(tmp_path)
    out = _publish(workdir, "--to", str(tmp_path / "published"), "--readme", str(readme_path))
    assert out.returncode == 0, out.stderr[-2000:]
    published = tmp_path / "published"
    files = sorted(p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file())
    assert "index.md" in files and "e5/reconstructions.png" in files and "e6/jobs.md" in files
    assert not [f for f in files if f.endswith((".pdf", ".npz", ".npy"))]
    page = (published / "index.md").read_text()
    assert "(e5/reconstructions.png): " in page and "[PDF]" not in page  # links only to what was copied
    text = readme_path.read_text()
    assert "old text" not in text and text.endswith("<!-- gpunn publish: end -->\n\n## Next\n")
    assert readme.current(readme_path) == (readme.section(published, tmp_path), "published")
    assert "| E5 | " in text and "| Whole run | " in text and "](published/e1/summary.md)" in text
    again = _publish(workdir, "--to", str(published))  # an earlier copy is replaced
    assert again.returncode == 0, again.stderr[-2000:]
    taken = _publish(workdir, "--to", str(workdir / "workflow"))  # never into a folder that is not a copy
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and "not a published report" in taken.stderr


def test_publish_rebuilds_the_reports_of_a_tree_returned_without_npz_files(smoke, tmp_path):
    """A run split over machines returns its results without weights and .npz files: --rebuild redraws every
    report from the run folders, keeping the sample figures their report jobs drew."""
    results, _, workdir = smoke
    copy = tmp_path / "work"
    shutil.copytree(workdir / "config", copy / "config")
    shutil.copytree(results, copy / "results/smoke", ignore=shutil.ignore_patterns("*.npz", "*.npy", "data"))
    summary = copy / "results/smoke/report" / MACHINE / "e4/summary.md"
    summary.unlink()
    out = _publish(copy, "--to", str(tmp_path / "published"), "--rebuild")
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary.read_text() == (results / "report" / MACHINE / "e4/summary.md").read_text()
    assert "gpunn report: kept " in out.stderr and (tmp_path / "published/e5/reconstructions.png").is_file()
    shutil.rmtree(copy / "results/smoke/runs")
    missing = _publish(copy, "--to", str(tmp_path / "published"), "--rebuild")
    assert missing.returncode == 2 and "missing" in missing.stderr and "snakemake e1" in missing.stderr


def test_cpu_models_learn_on_smoke_data(smoke):
    results, _, _ = smoke
    for summary in _runs(results, "synthetic_mnist_small/e2/mlp/*/*"):  # E2 cells: 3 short epochs
        assert summary["final_test_accuracy"] >= 0.60, summary["spec"]["path"]
    (ae,) = _runs(results, "synthetic_cifar10_small/standard/autoencoder/cpu-numpy/*")
    # the autoencoder must beat the best constant answer: the mean training image
    with np.load(results / "data/prepared/synthetic_cifar10_small/standard.npz") as data:
        train = data["x_train"][: ae["n_train"]].astype(np.float64) / 255
        test = data["x_test"].astype(np.float64) / 255
    mean_image_mse = float(((test - train.mean(axis=0)) ** 2).mean())
    assert ae["final_test_loss"] < 0.95 * mean_image_mse


@pytest.mark.parametrize("variant", [v for v in E1_VARIANTS if v != "cpu-numpy"])
def test_e1_variants_end_where_cpu_numpy_ends(smoke, variant):
    """Same init, same batches: every variant's E1 run (GPU ones under the simulator) matches cpu-numpy."""
    results, _, _ = smoke
    numpy_run, = _runs(results, "digits8_mini/standard/mlp/cpu-numpy/*")
    (other,) = _runs(results, f"digits8_mini/standard/mlp/{variant}/*")  # smoke.yaml: spread_runs 1, no repeats
    summary = pd.read_csv(results / "report" / MACHINE / "e1" / "summary.csv")
    assert (summary["spread_runs"] == 0).all() and summary["accuracy_band_pp"].isna().all()
    assert abs(numpy_run["final_test_accuracy"] - other["final_test_accuracy"]) <= 0.001  # within 0.1 point
    assert other["final_train_loss"] == pytest.approx(numpy_run["final_train_loss"], rel=1e-4)
    assert other["final_test_loss"] == pytest.approx(numpy_run["final_test_loss"], rel=1e-4)
    assert numpy_run["final_test_accuracy"] > 0.2  # 10 classes: it learned from its 64 samples


@pytest.mark.parametrize("run", [*(f"{v}/*" for v in E4_VARIANTS[1:]), "gpu-naive/*_t32"])
def test_e4_gpu_variants_end_where_cpu_numpy_ends(smoke, run):
    """E4 under the simulator: every CNN variant (and the block-size study's run) from cpu-numpy's init and
    batches ends at cpu-numpy's losses and accuracy; the block study and the paper's table are reported."""
    results, _, _ = smoke
    (numpy_run,) = _runs(results, "digits8_mini/standard/cnn/cpu-numpy/*")
    (other,) = [r for r in _runs(results, f"digits8_mini/standard/cnn/{run}")
                if ("_t" in r["spec"]["path"]) == run.endswith("_t32")]
    assert other["final_train_loss"] == pytest.approx(numpy_run["final_train_loss"], rel=1e-4)
    assert other["final_test_loss"] == pytest.approx(numpy_run["final_test_loss"], rel=1e-4)
    assert abs(numpy_run["final_test_accuracy"] - other["final_test_accuracy"]) <= 0.001
    assert other["test_time_s"] > 0
    report = results / "report" / MACHINE / "e4"
    assert list(pd.read_csv(report / "blocks.csv")["block"]) == [32]
    assert set(pd.read_csv(report / "paper_table.csv")["variant"]) == set(E4_VARIANTS)


def test_svm_on_encoder_features(smoke):
    results, _, _ = smoke
    (features_dir,) = [p.parent for p in results.glob(f"features/{MACHINE}/**/train_features.npy")]
    train = np.load(features_dir / "train_features.npy")
    assert train.dtype == np.float32 and train.ndim == 2 and train.shape[1] == 8 * 8 * 8  # latent C x H/4 x W/4
    assert len(np.load(features_dir / "train_labels.npy")) == len(train)
    (metrics_path,) = results.glob(f"svm/{MACHINE}/**/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["n_train"] == 1000 and metrics["test_accuracy"] > 0.2  # 10 classes: chance is 0.1
    confusion = pd.read_csv(metrics_path.parent / "confusion.csv", index_col=0)
    assert confusion.to_numpy().sum() == metrics["n_test"]


def test_second_run_has_nothing_to_do(smoke):
    _, _, workdir = smoke
    out = run_snakemake(workdir, "-n")
    assert out.returncode == 0
    assert "Nothing to be done" in out.stdout + out.stderr


def test_snakemake_report_bundles_the_figures(smoke):
    """The README's report command for the smoke run, as written."""
    _, _, workdir = smoke
    (command,) = [c for c in readme_commands() if "--report" in c and "config/smoke.yaml" in c]
    out = _run_snakemake(workdir, *shlex.split(command)[1:])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    import zipfile

    with zipfile.ZipFile(workdir / "report.zip") as bundle:
        names = bundle.namelist()
    for figure in ("loss_curves.png", "heatmaps.png", "batch_timing.png", "reconstructions.png", "confusion.png"):
        assert any(name.endswith(figure) for name in names), figure
    with zipfile.ZipFile(workdir / "report.zip") as bundle:
        page = bundle.read("report/report.html").decode()
    # its front page is the entry page's summary table, each figure has its own caption naming the paper figure
    assert "CPU test accuracy" in page and "Provenance" in page
    assert "paper 001&#39;s Figure 1" in page or "paper 001's Figure 1" in page


# --- the smoke run on Slurm ---------------------------------------------------------------------------------

# Rules that run where Snakemake runs (localrule), never as Slurm jobs
LOCAL_RULES = {"all", "make_offline", "download_idx", "download_cifar10", "report_index",
               *(f"report_e{n}" for n in range(1, 7))}
# Columns of a run's metrics.csv that are results, not timings
RESULT_COLUMNS = ["epoch", "train_loss", "test_loss", "test_accuracy"]


@pytest.fixture(scope="module")
def slurm():
    """A running single-node Slurm cluster. Where its programs are missing the tests are skipped, except
    under GPUNN_REQUIRE_SLURM=1 (.ci/run), where they fail: CI never skips them silently."""
    problem = None
    if missing_programs():
        problem = f"Slurm is not installed here: missing {', '.join(missing_programs())}"
    elif os.geteuid() != 0:
        problem = "the Slurm test cluster must run as root (slurmd starts the jobs)"
    if problem:
        if os.environ.get("GPUNN_REQUIRE_SLURM") == "1":
            pytest.fail(f"cannot start Slurm: {problem}", pytrace=False)
        pytest.skip(f"{problem} (.ci/run installs it and runs these tests)")
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.fail(f"cannot start Slurm: {exc}", pytrace=False)
    yield cluster
    cluster.stop()


# The one-node test cluster answers at once: Snakemake checks its jobs every 2 s, not every 10 as on a real one
FAST_POLLING = ("--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2")


def run_on_slurm(cluster: SlurmCluster, workdir: Path, *args, timeout=1200):
    # targets before --configfile, which takes every word after it up to the next option
    return _run_snakemake(workdir, *args, *FAST_POLLING, "--workflow-profile", "profiles/slurm", "--configfile",
                          "config/smoke.yaml", timeout=timeout, env_extra={"SLURM_CONF": cluster.env["SLURM_CONF"]})


def sacct_jobs(cluster: SlurmCluster) -> pd.DataFrame:
    """Every job the cluster has run: id, rule (from the plugin's --comment), state, requested TRES."""
    out = cluster.run("sacct", "-X", "-P", "-n", "--starttime=2000-01-01",
                      "--format=JobID,Comment%300,State,ReqTRES%200,Elapsed").stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    frame = pd.DataFrame(rows, columns=["job", "comment", "state", "req_tres", "elapsed"])
    frame["rule"] = frame["comment"].str.extract(r"^rule_(.+?)(?:_wildcards_|$)")[0]
    return frame


def job_counts(snakemake_output: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table (rule -> jobs) of a run."""
    lines = snakemake_output.split("Job stats:", 1)[1].splitlines()
    counts = {}
    for line in lines[3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


# The Slurm run starts from a copy of the local run (its results and Snakemake's records of them) less these
# outputs, so that Slurm recomputes a job of every cluster rule kind, CPU and GPU (simulated), and what depends on
# them: the CIFAR-format prepared split (its prepare job, the autoencoder's training run, its evaluation, encoder
# features and SVM), the E4 block-study run (a GPU training job) and one step profile (a GPU job). Recomputing the
# whole smoke run on Slurm took 10 minutes of the suite's 20 and tested nothing more.
RECOMPUTED_ON_SLURM = ("data/prepared/synthetic_cifar10_small/standard.npz",
                       f"runs/{MACHINE}/digits8_mini/standard/cnn/gpu-naive/w2-4_b4_lr0.3_e1_s0_n4_t32",
                       f"profile/{MACHINE}/e1/gpu-naive.csv")


def slurm_workdir(smoke_workdir: Path, dest: Path) -> Path:
    """A copy of the workflow holding the local smoke run's results/ and .snakemake/metadata (times kept), less
    RECOMPUTED_ON_SLURM."""

    workdir = copy_workflow(dest)
    shutil.copytree(smoke_workdir / "results", workdir / "results")
    shutil.copytree(smoke_workdir / ".snakemake/metadata", workdir / ".snakemake/metadata")
    for name in RECOMPUTED_ON_SLURM:
        path = workdir / "results/smoke" / name
        assert path.exists(), f"the local smoke run has no {name}: update RECOMPUTED_ON_SLURM"
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return workdir


@pytest.fixture(scope="module")
def slurm_smoke(slurm, smoke, tmp_path_factory):
    workdir = slurm_workdir(smoke[2], tmp_path_factory.mktemp("slurm-smoke"))
    start = time.perf_counter()
    out = run_on_slurm(slurm, workdir)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    jobs = sacct_jobs(slurm)
    report = os.environ.get("GPUNN_SLURM_REPORT")
    if report:  # .ci/run prints it: the jobs as Slurm saw them
        Path(report).write_text(f"{slurm.version}; local smoke run: {smoke[1]:.0f} s; the Slurm run from its copy: "
                                f"{elapsed:.0f} s, {len(jobs)} jobs\n"
                                + jobs[["job", "rule", "state", "req_tres", "elapsed"]].to_string(index=False) + "\n")
    return workdir, out.stdout + out.stderr, jobs


@pytest.mark.slurm
def test_every_cluster_job_went_through_slurm(slurm_smoke):
    """Each job of a non-local rule is one sbatch job that sacct shows COMPLETED; local rules never are; GPU
    jobs (here under the simulator) asked for one GPU, CPU jobs for none."""
    _, output, jobs = slurm_smoke
    planned = job_counts(output)
    for rule in ("prepare", "train", "evaluate", "features", "svm", "step_profile"):  # RECOMPUTED_ON_SLURM
        assert planned.get(rule, 0) >= 1, rule
    assert planned["train"] == 2  # the autoencoder's run (its split was recomputed) and the E4 block-study run
    assert "has been submitted with SLURM jobid" in output, output[-2000:]  # the plugin's line per sbatch
    expected = {rule: n for rule, n in planned.items() if rule not in LOCAL_RULES}
    assert expected and set(planned) - set(expected) <= LOCAL_RULES
    assert jobs["rule"].value_counts().to_dict() == expected
    assert set(jobs["state"]) == {"COMPLETED"}
    gpu_asked = jobs["req_tres"].str.contains("gres/gpu=1")
    assert gpu_asked[jobs["rule"] == "step_profile"].all()  # a GPU job whatever its wildcards
    assert not gpu_asked[jobs["rule"].isin(["prepare", "evaluate"])].any()
    assert gpu_asked[jobs["rule"] == "train"].any() and not gpu_asked[jobs["rule"] == "train"].all()


@pytest.mark.slurm
def test_slurm_results_equal_the_local_run(smoke, slurm_smoke):
    """Same outputs, and the same losses, accuracies, features and SVM scores as the local smoke run (those of
    the jobs that ran on Slurm compared with the local ones; the rest are the local run's copies)."""
    local, _, _ = smoke
    workdir, _, _ = slurm_smoke
    remote = workdir / "results/smoke"

    def outputs(root):
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.parts[len(root.parts)] != "logs"}
    assert outputs(remote) == outputs(local)
    curves = sorted(local.glob("runs/**/metrics.csv"))
    assert len(curves) >= 19
    for curve in curves:
        ours = pd.read_csv(curve)[RESULT_COLUMNS]
        theirs = pd.read_csv(remote / curve.relative_to(local))[RESULT_COLUMNS]
        pd.testing.assert_frame_equal(theirs, ours, check_exact=True, obj=str(curve.relative_to(local)))
    for pattern in ("eval/**/eval.json", "svm/**/metrics.json"):
        for path in local.glob(pattern):
            ours, theirs = json.loads(path.read_text()), json.loads((remote / path.relative_to(local)).read_text())
            for key in ("test_accuracy", "train_accuracy", "test_loss", "n_train", "n_test"):
                # NaN where a value does not apply (the autoencoder's accuracy) equals NaN
                assert pd.Series([theirs.get(key)]).equals(pd.Series([ours.get(key)])), (path, key)
    for path in local.glob("features/**/*.npy"):
        np.testing.assert_array_equal(np.load(remote / path.relative_to(local)), np.load(path))


@pytest.mark.slurm
def test_second_slurm_run_has_nothing_to_do(slurm, slurm_smoke):
    """Snakemake touches a cluster job's outputs when it sees the job end, later than the job's own log: the
    workflow's check for hand-edited files must not take that for an edit: the outputs' bytes still match the
    fingerprints their jobs recorded (gpunn.fingerprints)."""
    workdir, _, _ = slurm_smoke
    out = run_on_slurm(slurm, workdir, "-n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Nothing to be done" in out.stdout + out.stderr and "was changed after" not in out.stderr


@pytest.mark.slurm
def test_a_job_cancelled_by_slurm_is_reported_then_resumed(slurm, slurm_smoke):
    """scancel on one of two jobs: Snakemake names the rule, the Slurm state and the job's log; the other
    job finishes (--keep-going); the next run redoes only the cancelled job."""
    workdir, _, _ = slurm_smoke
    names = [f"results/smoke/timing/{MACHINE}/e3/{variant}.csv" for variant in ("cpu-numpy", "cpu-serial")]
    targets = [workdir / name for name in names]
    for target in targets:
        target.unlink()
    argv, env = snakemake_command(*names, "--keep-going", *FAST_POLLING, "--workflow-profile", "profiles/slurm",
                                  "--configfile", "config/smoke.yaml",
                                  env_extra={"SLURM_CONF": slurm.env["SLURM_CONF"]})
    run = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cancelled = None
    deadline = time.monotonic() + 120
    while cancelled is None and time.monotonic() < deadline and run.poll() is None:
        queue = slurm.run("squeue", "-h", "-o", "%i|%k", check=False).stdout.splitlines()
        for line in queue:
            job, comment = line.split("|", 1)
            if comment.startswith("rule_time_batches") and "cpu-numpy" in comment:
                slurm.run("scancel", job)
                cancelled = job
        time.sleep(0.2)
    output, _ = run.communicate(timeout=600)
    assert cancelled, "the cpu-numpy time_batches job never showed in squeue:\n" + output[-3000:]
    assert run.returncode != 0
    assert "Error in rule time_batches" in output and f"SLURM-job '{cancelled}' failed" in output, output[-3000:]
    assert "CANCELLED" in output
    assert f"results/smoke/logs/time_batches/{MACHINE}/cpu-numpy.log" in output  # the rule's log, named
    assert not targets[0].exists() and targets[1].is_file()
    kept = targets[1].stat().st_mtime_ns

    rerun = run_on_slurm(slurm, workdir, *names)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert job_counts(rerun.stdout + rerun.stderr) == {"time_batches": 1}
    assert targets[0].is_file() and targets[1].stat().st_mtime_ns == kept
