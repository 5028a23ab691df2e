"""gpunn overlap-verdict: a finished run's job kinds timed under overlap against the same runs timed alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunn.errors import GpunnError
from gpunn.overlap_verdict import Kind, alone_spec, job_kinds, overlap_runs
from gpunn.runspec import parse_run_path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _metrics(root: Path, run: str, epoch_s: float, n_train: int, mode="overlap", threads=14, epochs=None):
    folder = root / "runs" / "box" / run
    folder.mkdir(parents=True)
    provenance = {"timing_mode": mode, "blas_threads": threads} if mode else {"blas_threads": threads}
    (folder / "metrics.json").write_text(json.dumps({"mean_epoch_time_s": epoch_s, "n_train": n_train,
                                                     "provenance": provenance}))
    if epochs:
        (folder / "metrics.csv").write_text("epoch,train_loss,epoch_time_s\n" + "".join(
            f"{i},0.5,{t}\n" for i, t in enumerate(epochs, 1)))


def test_a_kind_is_its_run_with_the_most_repeats_then_the_longest(tmp_path):
    cnn = "mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0"
    _metrics(tmp_path, cnn, 4.8, 60000)
    _metrics(tmp_path, cnn + "_x1", 5.0, 60000)
    _metrics(tmp_path, cnn + "_x2", 4.9, 60000)
    _metrics(tmp_path, "mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e1_s0_t128", 9.0, 60000)  # longer, alone
    _metrics(tmp_path, "fashion_mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0", 4.7, 60000, mode="isolated")
    mlp = "mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e10_s0"
    _metrics(tmp_path, mlp, 3.3, 60000)
    _metrics(tmp_path, "mnist/e2/mlp/cpu-serial/w256_b64_lr0.01_e5_s0", 2.0, 37800)  # shorter in all
    _metrics(tmp_path, "mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0", 1.0, 60000, mode=None)  # before modes
    runs = overlap_runs(tmp_path, "box")
    assert len(runs) == 6  # the isolated run and the one without a mode are not overlap runs
    kinds = {(k.model, k.variant): k for k in job_kinds(runs, threads=14)}
    assert set(kinds) == {("cnn", "gpu-naive"), ("mlp", "cpu-serial")}
    naive = kinds["cnn", "gpu-naive"]
    assert naive.base == parse_run_path(cnn) and naive.run_epoch_s == 4.9
    assert naive.run_s_per_step() == pytest.approx([4.8 / 938, 5.0 / 938, 4.9 / 938])  # 60 000 / 64: 938 steps
    assert kinds["mlp", "cpu-serial"].base == parse_run_path(mlp)


def test_the_run_clock_covers_the_epochs_the_alone_runs_train(tmp_path):
    """A GPU run whose later epochs ran slower (a warming GPU): an alone run of 2 epochs is compared with the run's
    first 2 (metrics.csv), not with the mean of all 10."""
    run = "mnist/standard/mlp/gpu-graph/w256_b64_lr0.01_e10_s0"
    _metrics(tmp_path, run, 1.42, 60000, epochs=[1.0, 1.2] + [1.5] * 8)
    kind = job_kinds(overlap_runs(tmp_path, "box"), threads=14)[0]
    assert kind.run_s_per_step() == pytest.approx([1.42 / 938])  # no alone run yet: every epoch
    kind.alone_epochs = alone_spec(kind, 3.0).epochs
    assert kind.alone_epochs == 2 and kind.run_s_per_step() == pytest.approx([1.1 / 938])


def test_an_alone_run_is_one_epoch_of_whole_batches_near_the_epoch_limit():
    base = parse_run_path("mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e5_s0")
    long = Kind("cnn", "cpu-numpy", base, 60000, 14, [0.036], 33.7)
    spec = alone_spec(long, 5.0)
    assert spec.epochs == 1 and spec.repeat == 0 and spec.subset == 139 * 64  # floor(938 * 5 / 33.7) batches
    short = Kind("mlp", "gpu-graph", parse_run_path("mnist/standard/mlp/gpu-graph/w256_b64_lr0.01_e10_s0_x2"), 60000,
                 14, [4e-5], 0.04)
    assert alone_spec(short, 5.0) == parse_run_path("mnist/standard/mlp/gpu-graph/w256_b64_lr0.01_e10_s0")  # all 10
    middle = Kind("mlp", "cpu-serial", parse_run_path("mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e10_s0"), 60000,
                  14, [3.5e-3], 2.4)
    assert alone_spec(middle, 5.0) == parse_run_path("mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e2_s0")
    subset = Kind("autoencoder", "cpu-numpy", parse_run_path(
        "synthetic_cifar10/standard/autoencoder/cpu-numpy/w256-128_b64_lr0.002_e1_s0_n1000"), 1000, 14, [0.88], 14.1)
    assert alone_spec(subset, 5.0).subset == 5 * 64  # floor(16 * 5 / 14.1) batches of its 1000 samples


def test_verdict_judges_the_run_by_the_alone_runs_prediction_band():
    """mean +- t s sqrt(1/k + 1/n), t at 95 % over all the kinds together: wider for more kinds, narrower for more
    alone runs; a change inside a band of noisy alone runs is within noise, the same change beside steady ones not."""
    from scipy.stats import t

    base = parse_run_path("mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0")
    run = [[1.05e-3 * 938], [1.10e-3 * 938], [1.15e-3 * 938]]  # three runs in the run: 1.10 ms a step on average
    kind = Kind("mlp", "cpu-numpy", base, 60000, 14, run, 1.0, alone=[0.80e-3, 0.82e-3, 0.84e-3])
    verdict = kind.verdict(kinds=1)
    half = t.ppf(0.975, 2) * 0.02e-3 * (1 / 3 + 1 / 3) ** 0.5
    assert verdict["change"] == pytest.approx(1.10 / 0.82 - 1) and verdict["noise"] == pytest.approx(half / 0.82e-3)
    assert verdict["run_repeats"] == 3 and not verdict["within_noise"]
    kind.alone = [0.9e-3, 1.2e-3, 1.0e-3]  # +6 % against alone runs that vary by 30 %
    assert kind.verdict(kinds=1)["within_noise"]
    kind.alone = [1.00e-3, 1.01e-3, 1.02e-3, 1.03e-3, 1.04e-3]  # +7 % against five steady alone runs
    one, sixteen = kind.verdict(kinds=1), kind.verdict(kinds=16)
    assert sixteen["noise"] > one["noise"] and not sixteen["within_noise"]
    kind.alone = [1.06e-3, 1.08e-3, 1.10e-3, 1.12e-3, 1.14e-3]  # the same mean as the run
    assert kind.verdict(kinds=16)["change"] == pytest.approx(0.0) and kind.verdict(kinds=16)["within_noise"]


def test_no_overlap_runs_or_no_machine_folder_is_one_line(tmp_path):
    _metrics(tmp_path, "mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e10_s0", 3.3, 60000, mode="isolated")
    with pytest.raises(GpunnError, match="no run under .* was timed under timing: overlap"):
        overlap_runs(tmp_path, "box")
    with pytest.raises(GpunnError, match="holds no runs; give the --results and --machine of a finished run"):
        overlap_runs(tmp_path, "other")


def test_overlap_verdict_times_each_kind_of_a_run_alone(tmp_path):
    """Two runs timed under overlap through gpunn.placement (a CPU and a simulated GPU one), then the verdict: each
    run again alone in three rounds, tested on TEST_SAMPLES samples, its weights deleted, verdict.csv and verdict.md
    written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNN_", "SLURM_", "CUDA_VISIBLE"))}
    env.update(GPUNN_TIMING_LOCK=str(tmp_path / "gpunn-timing.lock"), PYTHONPATH=SRC, NUMBA_ENABLE_CUDASIM="1")
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    gpunn = [sys.executable, "-m", "gpunn"]
    results = tmp_path / "results"
    data = results / "data/prepared/digits8_mini/standard.npz"
    for command in (["make-offline", "digits8_mini", "--out", str(tmp_path / "raw")],
                    ["prepare", "digits8_mini", "--raw", str(tmp_path / "raw"), "--out", str(data)]):
        subprocess.run([*gpunn, *command], env=env, check=True, capture_output=True)
    runs = {"digits8_mini/standard/mlp/cpu-numpy/w8_b8_lr0.3_e2_s0_n16": [],
            "digits8_mini/standard/mlp/gpu-fused/w8_b8_lr0.3_e1_s0_n8": ["--gpu", "--slots", "0"]}
    for run, gpu in runs.items():
        placed = [sys.executable, "-m", "gpunn.placement", "--threads", "1", "--timed", "gpu" if gpu else "cpu",
                  "--timing", "overlap", *gpu, "--"]
        subprocess.run([*placed, *gpunn, "train", run, "--data", str(data), "--out", str(results / "runs/sim" / run)],
                       env=env, check=True, capture_output=True)
    out = tmp_path / "verdict"
    done = subprocess.run([*gpunn, "overlap-verdict", "--results", str(results), "--repeats", "3", "--gpus", "1",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = (out / "verdict.csv").read_text().splitlines()
    assert rows[0] == "model,variant,repeat,run,steps,seconds_per_epoch,seconds_per_step,cores,gpu"
    assert len(rows) == 1 + 3 * 2
    assert [r.split(",")[1:3] for r in rows[1:]] == [[v, str(i)] for i in (1, 2, 3) for v in ("cpu-numpy", "gpu-fused")]
    assert any(",gpu-fused,1,digits8_mini/standard/mlp/gpu-fused/w8_b8_lr0.3_e1_s0_n8,1," in r for r in rows)
    text = (out / "verdict.md").read_text()
    assert "| mlp | cpu-numpy | `digits8_mini/standard/mlp/cpu-numpy/w8_b8_lr0.3_e2_s0_n16` | 1 |" in text
    assert "Every job kind within its noise: " in text
    metrics = [json.loads(p.read_text()) for p in (out / "runs").rglob("metrics.json")]
    assert len(metrics) == 2 and all(m["n_test"] == 40 for m in metrics)  # digits8_mini has 40, under TEST_SAMPLES
    assert all(m["provenance"]["timing_mode"] == "isolated" for m in metrics)
    assert not list((out / "runs").rglob("weights.npz"))
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["machine"] == "sim" and verdict["repeats"] == 3 and len(verdict["kinds"]) == 2
    assert set(verdict["runs"]) == set(runs) and all(isinstance(at, float) for at in verdict["runs"].values())
    assert verdict["every_kind_within_noise"] == all(k["within_noise"] for k in verdict["kinds"])
    # gpunn train --test-samples: the per-epoch test passes on the first N test samples
    subprocess.run([*gpunn, "train", "digits8_mini/standard/mlp/cpu-numpy/w8_b8_lr0.3_e1_s0_n16", "--data", str(data),
                    "--out", str(tmp_path / "few"), "--test-samples", "5"], env=env, check=True, capture_output=True)
    few = json.loads((tmp_path / "few/metrics.json").read_text())
    assert few["n_test"] == 5
    assert few["provenance"]["blas_idle"] is None  # an MLP job: OpenBLAS's own idle threads (gpunn.blas_idle)


@pytest.fixture
def trust_reset():
    from gpunn.report import runs

    saved = dict(runs._OVERLAP)
    yield runs
    runs._OVERLAP.update(saved)


def _verdict(results: Path, within=(True, True), finished_at=100.0, commit="abc1234"):
    """A finished overlap run of machine `box` (two runs' metrics.json) and its verdict.json at the default place."""
    paths = [f"mnist/standard/mlp/{v}/w256_b64_lr0.01_e10_s0" for v in ("cpu-numpy", "gpu-graph")]
    for run in paths:
        folder = results / "runs" / "box" / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps({"finished_at": finished_at}))
    verdict = results / "overlap-verdict" / "box" / "verdict.json"
    verdict.parent.mkdir(parents=True, exist_ok=True)
    kinds = [{"model": "mlp", "variant": v, "within_noise": w} for v, w in zip(("cpu-numpy", "gpu-graph"), within)]
    verdict.write_text(json.dumps({"machine": "box", "commit": commit, "repeats": 3, "kinds": kinds,
                                   "runs": dict.fromkeys(paths, 100.0)}))
    return verdict


def test_a_verdict_with_every_kind_within_noise_lets_overlap_clocks_compare(tmp_path, trust_reset):
    import pandas as pd

    runs = trust_reset
    assert not runs.clocks_comparable("overlap", "isolated")
    runs.trust_overlap(_verdict(tmp_path))
    assert runs.clocks_comparable("overlap", "isolated") and runs.clocks_comparable("overlap")
    frame = pd.DataFrame({"variant": ["cpu-numpy", "gpu-graph"], "timing_mode": ["overlap", "overlap"],
                          "dataset": "mnist", "time_per_epoch_s": [1.0, 0.04]})
    assert list(runs.speedup(frame, "cpu-numpy", "time_per_epoch_s", ["dataset"])) == pytest.approx([1.0, 25.0])
    note = runs.clock_note(frame)
    assert note.startswith("Clocks timed under overlap are compared like isolated ones: gpunn overlap-verdict (box, "
                           "code at abc1234) timed each of the run's 2 job kinds alone in 3 rounds")


def test_a_verdict_with_a_kind_outside_its_noise_or_of_earlier_runs_is_not_trusted(tmp_path, trust_reset):
    import pandas as pd

    runs = trust_reset
    runs.trust_overlap(_verdict(tmp_path / "a", within=(False, True)))
    assert not runs.clocks_comparable("overlap")
    frame = pd.DataFrame({"variant": ["cpu-numpy", "gpu-graph"], "timing_mode": ["overlap", "overlap"],
                          "dataset": "mnist", "time_per_epoch_s": [1.0, 0.04]})
    assert runs.speedup(frame, "cpu-numpy", "time_per_epoch_s", ["dataset"]).isna().all()
    assert runs.clock_note(frame).endswith("job kinds alone in 3 rounds: mlp cpu-numpy outside the alone runs' band.")
    runs.trust_overlap(_verdict(tmp_path / "b", finished_at=200.0))  # the runs were trained again since the verdict
    assert not runs.clocks_comparable("overlap")
    assert "but mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0 has been trained again since: run gpunn " \
           "overlap-verdict again" in runs.clock_note(frame)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"machine": "box"}))
    with pytest.raises(GpunnError, match=r"bad.json: not a verdict of gpunn overlap-verdict \('kinds'\)"):
        runs.trust_overlap(bad)


def test_reports_take_the_verdict_under_overlap_once_it_exists(tmp_path):
    from gpunn.config import load_config
    from gpunn.targets import report_inputs, report_options

    config = load_config({"results_dir": str(tmp_path), "timing": "overlap"}, gpu_name=lambda: "NVIDIA H200",
                         log=lambda line: None)
    assert "verdict" not in report_inputs(config, "e1")  # none written yet: the plan reads, never waits for one
    machine = config["machine"]
    verdict = tmp_path / "overlap-verdict" / machine / "verdict.json"
    verdict.parent.mkdir(parents=True)
    verdict.write_text("{}")
    assert report_inputs(config, "e1")["verdict"] == [str(verdict)]
    assert report_options(report_inputs(config, "e6"))["verdict"] == [str(verdict)]  # the file itself
    isolated = load_config({"results_dir": str(tmp_path), "timing": "isolated"}, gpu_name=lambda: "NVIDIA H200",
                           log=lambda line: None)
    assert "verdict" not in report_inputs(isolated, "e1")
