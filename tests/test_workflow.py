"""The Snakemake workflow: lint, the default config's dry run, the config schema, run specs."""

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpunn.errors import GpunnError
from gpunn.nn.functional import REDUCTIONS
from gpunn.report.tables import markdown_table
from gpunn.runspec import PATH_FIELDS, WILDCARD_CONSTRAINTS, RunSpec, format_lr, parse_hparams, parse_run_path
from gpunn.targets import EXPERIMENTS, experiment_runs

from snakemake_helpers import run_snakemake

REPO = Path(__file__).resolve().parents[1]


def test_lint_is_clean(workflow_copy):
    out = run_snakemake(workflow_copy, "--lint")
    assert out.returncode == 0, out.stderr
    assert "Congratulations, your workflow is in a good condition" in out.stdout + out.stderr


def test_default_dry_run_lists_every_stage(workflow_copy):
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "4", "--config", "machine=gpu-box", "job_details=true")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for dataset in ("mnist", "fashion_mnist", "cifar10"):
        assert f"python -m gpunn download {dataset} " in text
    for run in ("mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0",  # E1
                "mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e10_s0",
                "mnist/e2/mlp/cpu-serial/w32_b128_lr0.01_e5_s0",  # E2
                "fashion_mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e5_s0",  # E4
                "cifar10/standard/autoencoder/cpu-numpy/w256-128_b64_lr0.002_e20_s0_n1000",  # E5: the CPU on 1 000
                "cifar10/standard/autoencoder/gpu-im2col/w256-128_b64_lr0.002_e20_s0"):  # the GPU on all 50 000
        assert f"python -m gpunn train {run} " in text
    assert "python -m gpunn time-batches --variants cpu-serial" in text  # E3, gpu-graph among its variants
    assert "python -m gpunn time-batches --variants gpu-graph --batches 1,8,32,64,128,512 --hidden 256 " \
           "--features 784 --steps 938 --samples 60000 --timed-epochs 3 --repeats 20 " in text
    assert "python -m gpunn features --run results/runs/gpu-box/cifar10/" in text  # E6, under the machine's name
    assert "python -m gpunn svm --features results/features/gpu-box/cifar10/" in text
    svm_job = _job(text, "svm")  # E6 on a GPU machine: method auto is gpu-smo, all rows, on a GPU it holds
    assert "--method gpu-smo" in svm_job and "--train-subset auto" in svm_job and "--kernel-device gpu" in svm_job
    assert "gpu=1" in svm_job and "results/svm/gpu-box/gpu-smo/cifar10/standard/autoencoder/gpu-graph/" in svm_job
    assert text.count("rule svm:") == 1
    for experiment in ("e1", "e2", "e3", "e4", "e5", "e6"):
        assert f"python -m gpunn report {experiment} " in text
    assert "NUMBA_ENABLE_CUDASIM" not in text  # the full config runs GPU variants on a GPU
    assert "python -m gpunn train mnist/standard/mlp/gpu-fused/w256_b64_lr0.01_e10_s0 " in text
    # E4: the GPU variants on both datasets, and the block-size study on MNIST
    assert "python -m gpunn train fashion_mnist/standard/cnn/gpu-im2col/w16-32_b64_lr0.01_e5_s0 " in text
    assert "python -m gpunn train mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0_t1024 " in text
    assert "fashion_mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0_t" not in text
    # E6 encodes with the fastest GPU variant's run, whose reconstructions E5's report shows
    assert "python -m gpunn features --run results/runs/gpu-box/cifar10/standard/autoencoder/gpu-graph/" in text
    assert "python -m gpunn evaluate --run results/runs/gpu-box/cifar10/standard/autoencoder/gpu-graph/" in text
    assert "python -m gpunn evaluate --run results/runs/gpu-box/cifar10/standard/autoencoder/cpu-numpy/" not in text
    assert "python -m gpunn train mnist/standard/mlp/gpu-graph/w256_b64_lr0.01_e10_s0_rsum " in text  # E1's sums
    # 8 x 2 E1 (mean and sum) + 48 E2 + (14 + 8) E4 + 7 E5 training runs, and the spread's repeats (spread_runs 3):
    # 2 more runs of each non-deterministic variant's spec, E1's gpu-naive and gpu-tiled (x 2 reductions), E4's
    # gpu-naive and gpu-optimized (x 2 datasets)
    assert text.count("python -m gpunn train ") == 93 + 2 * (2 * 2 + 2 * 2)
    assert "python -m gpunn train mnist/standard/mlp/gpu-naive/w256_b64_lr0.01_e10_s0_rsum_x2 " in text
    assert "/gpu-fused/w256_b64_lr0.01_e10_s0_x1" not in text  # deterministic: no repeats


def _job(text: str, rule: str, having: str = "") -> str:
    """The dry-run block of the first job of `rule` (from its `rule NAME:` line to its shell command) that holds
    `having`."""
    start = text.index(f"rule {rule}:")
    while True:
        block = text[start:text.index("\n", text.index("Shell command:", start))]
        if having in block:
            return block
        start = text.index(f"rule {rule}:", start + 1)


def test_svm_kernel_device_in_the_job(workflow_copy):
    """The smoke config (simulator): auto is the CPU, no GPU reserved; kernel_device gpu runs the svm job under
    the simulator on one of the config's two simulated GPUs, borrowed (gpus: 2: placed on a slot it takes only while
    it computes its kernels, so Snakemake counts no gpu for it)."""
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "2", "--config", "job_details=true", "--configfile",
                        "config/smoke.yaml")
    assert out.returncode == 0, out.stderr[-2000:]
    job = _job(out.stdout + out.stderr, "svm")
    assert "--kernel-device cpu" in job and "gpu=0" in job and "NUMBA_ENABLE_CUDASIM" not in job
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "2", "--config", "job_details=true",
                        "experiments={e6: {kernel_device: gpu}}", "--configfile", "config/smoke.yaml")
    assert out.returncode == 0, out.stderr[-2000:]
    job = _job(out.stdout + out.stderr, "svm")
    assert "--kernel-device gpu" in job and "gpu=0" in job and "NUMBA_ENABLE_CUDASIM=1 python -m gpunn.placement" in job
    assert "--timed both --timing overlap --gpu --borrow --slots 0,1 -- python -m gpunn svm" in job


def test_svm_method_gpu_smo_holds_its_gpu(workflow_copy):
    """method gpu-smo (smoke config: the simulator): the svm job solves on a GPU it holds for the whole job (gpu=1,
    placed, not borrowed), its kernel device the GPU; gpu.enabled false turns it into libsvm's exact method."""
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "2", "--config", "job_details=true",
                        "experiments={e6: {method: gpu-smo}}", "--configfile", "config/smoke.yaml")
    assert out.returncode == 0, out.stderr[-2000:]
    job = _job(out.stdout + out.stderr, "svm")
    assert "--method gpu-smo" in job and "--kernel-device gpu" in job and "gpu=1" in job
    assert "NUMBA_ENABLE_CUDASIM=1 python -m gpunn.placement" in job and "--borrow" not in job
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "2", "--config", "job_details=true",
                        "experiments={e6: {method: gpu-smo}}", "gpu={enabled: false, simulator: false}",
                        "--configfile", "config/smoke.yaml")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert "--method exact" in _job(text, "svm") and "experiments.e6.method: gpu-smo solves on the GPU" in text


def _train_job(text: str, run: str) -> str:
    """The dry-run block of the train job of `run`."""
    end = text.index(f"python -m gpunn train {run} ")
    return text[text.rindex("rule train:", 0, end):text.index("\n", end)]


@pytest.mark.parametrize("timing", ["isolated", "overlap"])
def test_timed_jobs_resources_and_placement_follow_config_keys_timing_and_gpus(workflow_copy, timing):
    """On a GPU machine (named: no GPU here) with two GPUs: every GPU job takes one `gpu` and is placed on one of
    them; under isolated every timed job takes the `timing` resource, under overlap only the CPU-timed ones and the
    SVM (its solver runs on the CPU; its GPU borrowed, so no `gpu` resource)."""
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "16", "--config", "machine=gpu-box", "job_details=true",
                        f"timing={timing}", "gpus=2", "threads=14", "experiments={e6: {method: [gpu-smo, exact]}}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    gpu = _train_job(text, "mnist/standard/cnn/gpu-graph/w16-32_b64_lr0.01_e5_s0")
    cpu = _train_job(text, "mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e5_s0")
    assert "gpu=1," in gpu and "gpu=0," in cpu
    assert f"timing={0 if timing == 'overlap' else 1}," in gpu and "timing=1," in cpu
    host = 1 if timing == "overlap" else 14  # under overlap a GPU job's host thread gets one core of its own
    assert f"python -m gpunn.placement --threads {host} --timed gpu --timing {timing} --gpu --slots 0,1 -- " in gpu
    assert f"python -m gpunn.placement --threads 14 --timed cpu --timing {timing} -- " in cpu
    # warm_jobs (default true): a GPU job of a real GPU machine starts from the warm server, a CPU job does not
    assert "GPUNN_WARM=1 python -m gpunn.placement" in gpu and "GPUNN_WARM" not in cpu
    svm = _job(text, "svm", "--method exact")  # libsvm: its kernels on a GPU it borrows
    assert "gpu=0," in svm and "timing=1," in svm and "--timed both" in svm and "--gpu --borrow --slots 0,1" in svm
    smo = _job(text, "svm", "--method gpu-smo")  # the GPU solver: a GPU it holds, as a GPU job
    assert "gpu=1," in smo and "timing=1," in smo and "--timed both" in smo and "--gpu --slots 0,1 --" in smo
    assert "results/svm/gpu-box/exact/cifar10/" in svm and "results/svm/gpu-box/gpu-smo/cifar10/" in smo
    if timing == "overlap":  # config key cpu_lanes: the CPU-timed jobs' placement takes a lane of that many
        out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "32", "--config", "machine=gpu-box", "timing=overlap",
                            "gpus=2", "threads=14", "cpu_lanes=2", "job_details=true",
                            "experiments={e6: {method: exact}}")
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-3000:]
        cpu = _train_job(text, "mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e5_s0")
        gpu = _train_job(text, "mnist/standard/cnn/gpu-graph/w16-32_b64_lr0.01_e5_s0")
        assert "--timed cpu --timing overlap --lanes 2 -- " in cpu and "timing=1," in cpu
        svm = _job(text, "svm", "--method exact")
        assert "--lanes" not in gpu and "--timed both --timing overlap --gpu --borrow --slots 0,1 --lanes 2 -- " in svm


def test_target_rules_list_the_experiments(workflow_copy):
    out = run_snakemake(workflow_copy, "--list-target-rules")
    names = out.stdout.split()
    assert out.returncode == 0
    for experiment in ("all", "e1", "e2", "e3", "e4", "e5", "e6"):
        assert experiment in names


def test_bad_config_key_is_rejected(workflow_copy, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"experiments": {"e1": {"batch": 0}}}))
    out = run_snakemake(workflow_copy, "-n", "--cores", "1", "--configfile", str(bad))
    assert out.returncode != 0
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("gpunn")]
    assert line == "gpunn: config error: config key experiments.e1.batch: 0 is less than the minimum of 1"


def test_schema_reductions_are_the_codes():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    reductions = schema["properties"]["experiments"]["properties"]["e1"]["properties"]["reductions"]
    assert tuple(reductions["items"]["enum"]) == REDUCTIONS and tuple(reductions["default"]) == REDUCTIONS


def test_every_schema_key_has_default_and_description():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())

    def walk(node, where):
        for key, sub in node.get("properties", {}).items():
            assert "default" in sub, f"{where}.{key} has no default"
            if sub.get("type") != "object":
                assert sub.get("description"), f"{where}.{key} has no description"
            walk(sub, f"{where}.{key}")

    walk(schema, "config")


def test_default_config_has_the_papers_settings():
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.setdefault("splits", {})
    e1 = experiment_runs(config, "e1")
    # every variant with the batch-mean and the batch-sum gradient (paper 000's CPU-GPU accuracy gap)
    assert [(r.variant, r.reduction) for r in e1 if not r.repeat] == [
        (v, reduction) for v in ("cpu-numpy", "cpu-serial", "gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph",
                                 "gpu-tf32", "gpu-bf16") for reduction in ("mean", "sum")]
    # then the spread's repeats, runs 1 and 2 of each non-deterministic variant's spec (after every run itself)
    assert [(r.variant, r.reduction, r.repeat) for r in e1[16:]] == [
        (v, reduction, k) for k in (1, 2) for v in ("gpu-naive", "gpu-tiled") for reduction in ("mean", "sum")]
    assert all((r.widths, r.batch, r.lr, r.epochs) == ((256,), 64, 0.01, 10) for r in e1)
    e2 = experiment_runs(config, "e2")
    assert len(e2) == 4 * 3 * 4
    assert {r.variant for r in e2} == {"cpu-serial", "gpu-naive", "gpu-tiled", "gpu-fused"}
    assert {(r.widths[0], r.batch) for r in e2} == {(h, b) for h in (32, 64, 128, 256) for b in (32, 64, 128)}
    assert {r.dataset for r in experiment_runs(config, "e4")} == {"mnist", "fashion_mnist"}
    e5 = {r.variant: r for r in experiment_runs(config, "e5")}
    assert list(e5) == ["cpu-numpy", "gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph", "gpu-tf32", "gpu-bf16"]
    assert all(r.widths == (256, 128) and r.epochs == 20 and r.batch == 64 for r in e5.values())
    # the paper's CPU trained on 1 000 images, its GPU versions on all 50 000
    assert e5["cpu-numpy"].subset == 1000 and {r.subset for v, r in e5.items() if v != "cpu-numpy"} == {0}


@pytest.mark.parametrize("config_file", ["config/config.yaml", "config/smoke.yaml"])
def test_every_report_input_is_a_planned_intermediate(config_file):
    """Snakemake does not remake a missing input of an up-to-date job: every report input must be a planned
    intermediate (gpunn.targets.missing_intermediates makes a missing one a target), each with its job's log."""
    from snakemake.utils import update_config

    from gpunn.config import load_config
    from gpunn.targets import planned_intermediates, report_inputs

    raw = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(raw, yaml.safe_load((REPO / config_file).read_text()))
    config = load_config(raw, log=lambda line: None, gpu_name=lambda: "NVIDIA H100 80GB HBM3")
    for experiment in EXPERIMENTS:
        planned = planned_intermediates(config, experiment)
        # the overlap verdict is an input only while it exists, made by no job (gpunn overlap-verdict, by hand)
        inputs = [path for kind, paths in report_inputs(config, experiment).items() if kind != "verdict"
                  for path in paths]
        assert inputs and set(inputs) <= set(planned), experiment
        assert all(planned[path].startswith(f"{config['results_dir']}/logs/") for path in inputs), experiment
        kinds = set(report_inputs(config, experiment))
        assert {"e3": {"timings", "blocks"}, "e6": {"svm"}}.get(experiment, {"runs"}) <= kinds


def test_run_path_round_trip():
    spec = RunSpec("cifar10", "standard", "autoencoder", "cpu-numpy", (256, 128), 32, 1e-3, 20, 0, 1000)
    assert spec.path == "cifar10/standard/autoencoder/cpu-numpy/w256-128_b32_lr0.001_e20_s0_n1000"
    assert parse_run_path("results/runs/" + spec.path) == spec
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert spec.reduction == "mean" and spec.to_dict()["reduction"] == "mean"  # the default: no suffix


@pytest.mark.parametrize("lr, text", [(0.01, "0.01"), (0.3, "0.3"), (2.0, "2.0"), (1e-4, "0.0001"), (1e-5, "1e-5"),
                                      (2.5e-7, "2.5e-7"), (1e6, "1e6"), (1.5e30, "1.5e30"),
                                      (0.1 + 0.2, "0.30000000000000004")])
def test_one_text_per_learning_rate(lr, text):
    """Run paths, divergence errors and report tables write a learning rate one way (format_lr), which reads
    back as the same float; any other spelling of it in a path is refused with the one to use."""
    assert format_lr(lr) == text and float(text) == lr
    spec = RunSpec("digits8", "standard", "mlp", "cpu-numpy", (8,), 16, lr, 1, 0)
    assert f"_lr{text}_" in spec.path and parse_run_path(spec.path) == spec
    assert markdown_table(pd.DataFrame({"lr": [lr]})).splitlines()[-1].strip("| ") == text
    other = f"{lr:.3e}" if text != f"{lr:.3e}" else repr(lr)
    if float(other) == lr:
        with pytest.raises(GpunnError, match=f"write the learning rate {re.escape(other)} as lr{re.escape(text)}$"):
            parse_hparams(f"w8_b16_lr{other}_e1_s0")


def test_sum_reduction_in_the_run_path():
    spec = RunSpec("mnist", "standard", "mlp", "gpu-fused", (256,), 64, 0.01, 10, 0, 100, block=0, reduction="sum")
    assert spec.path == "mnist/standard/mlp/gpu-fused/w256_b64_lr0.01_e10_s0_n100_rsum"
    assert parse_run_path(spec.path) == spec and RunSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["reduction"] == "sum"  # as metrics.json and weights.npz record it
    assert parse_hparams("w16-32_b8_lr0.3_e1_s0_t32_rsum")["reduction"] == "sum"  # after the block size
    assert re.fullmatch(WILDCARD_CONSTRAINTS["hparams"], "w256_b64_lr0.01_e10_s0_n100_rsum")
    with pytest.raises(GpunnError, match="the mean reduction is the default, leave out _rmean"):
        parse_hparams("w256_b64_lr0.01_e10_s0_rmean")  # one path per run
    with pytest.raises(GpunnError) as error:
        parse_run_path("mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0_ravg")
    assert str(error.value) == ("loss reduction 'avg' (_ravg) is not one of mean, sum; write _rsum for the batch "
                                "sum, nothing for the mean")


def test_repeats_in_the_run_path():
    """A repeat of a run (`_x<k>`, last): the same settings, its own folder; the run itself has no suffix."""
    spec = RunSpec("mnist", "standard", "mlp", "gpu-naive", (256,), 64, 0.01, 10, 0, reduction="sum", repeat=2)
    assert spec.path == "mnist/standard/mlp/gpu-naive/w256_b64_lr0.01_e10_s0_rsum_x2"
    assert parse_run_path(spec.path) == spec and RunSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["repeat"] == 2 and parse_hparams("w8_b16_lr0.3_e1_s0")["repeat"] == 0
    assert parse_hparams("w16-32_b8_lr0.3_e1_s0_n4_t32_x1")["repeat"] == 1  # after the other suffixes
    assert re.fullmatch(WILDCARD_CONSTRAINTS["hparams"], spec.hparams)
    for text, message in (("_x0", "write repeat 0 as no suffix"), ("_x01", "write repeat 1 as _x1")):
        with pytest.raises(GpunnError, match=message):
            parse_hparams(f"w8_b16_lr0.3_e1_s0{text}")  # one path per run
    with pytest.raises(GpunnError, match="expected e.g."):
        parse_hparams("w8_b16_lr0.3_e1_s0_x1_rsum")  # the order is fixed
    with pytest.raises(GpunnError, match="must not be negative"):
        RunSpec("mnist", "standard", "mlp", "gpu-naive", (256,), 64, 0.01, 10, 0, repeat=-1)


def test_wildcard_constraints_match_every_run_path_of_the_config():
    """The Snakemake rules find a run's job by these constraints: each must accept its field of every path
    RunSpec writes (workflow/rules/common.smk imports them from gpunn.runspec)."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    specs = [spec for experiment in EXPERIMENTS for spec in experiment_runs(config, experiment)]
    assert specs
    for spec in specs:
        for field, value in zip(PATH_FIELDS, spec.path.split("/"), strict=True):
            assert re.fullmatch(WILDCARD_CONSTRAINTS[field], value), (field, value)


BAD_HPARAMS = ["w256_b64_lr0.01_e10", "w256_b64_lrx_e10_s0", "h256_b64_lr0.01_e10_s0", "w256-_b64_lr0.01_e10_s0", ""]


@pytest.mark.parametrize("text", BAD_HPARAMS)
def test_bad_hparams_name_the_expected_form(text):
    with pytest.raises(GpunnError, match="expected e.g. w256_b64_lr0.01_e10_s0"):
        parse_hparams(text)
    assert not re.fullmatch(WILDCARD_CONSTRAINTS["hparams"], text)  # no rule's job is planned for it either


@pytest.mark.parametrize("change, message", [
    ({"model": "rnn"}, "unknown model"), ({"widths": (16, 32)}, "takes 1 width"), ({"batch": 0}, "batch must be"),
    ({"lr": 0.0}, "learning rate"), ({"split": "x"}, "unknown split"), ({"reduction": "Sum"}, "loss reduction 'Sum'"),
])
def test_bad_run_specs(change, message):
    fields = dict(dataset="mnist", split="standard", model="mlp", variant="cpu-numpy", widths=(8,), batch=4,
                  lr=0.1, epochs=1, seed=0)
    fields.update(change)
    with pytest.raises(GpunnError, match=message):
        RunSpec(**fields)
