"""Slurm placement of the pipeline's jobs (gpunn.cluster, config key `cluster`): what each rule asks for, and
the config checks that only apply on a cluster. The real Slurm runs are in test_smoke_pipeline.py (marked slurm)."""

from pathlib import Path

import pytest
import yaml

from gpunn import cluster
from gpunn.config import load_config
from gpunn.errors import GpunnError


def config_with(**cluster_keys):
    return load_config({"cluster": cluster_keys}, log=lambda line: None, gpu_name=lambda: None)


def test_defaults_name_no_site_and_time_every_rule():
    settings = config_with()["cluster"]
    assert settings["partition"] == settings["gpu_partition"] == settings["account"] == ""
    resources = cluster.job_resources(settings, "train", timed=True, gpu=1)
    assert resources == {"mem_mb": 8000, "runtime": 240, "slurm_extra": "--exclusive"}
    assert cluster.job_resources(settings, "evaluate") == {"mem_mb": 4000, "runtime": 30}
    # a rule with no entry of its own gets `default`
    assert cluster.job_resources(settings, "some_new_rule") == {"mem_mb": 4000, "runtime": 60}


def test_config_overrides_one_rule_and_keeps_the_others():
    settings = config_with(mem_mb={"svm": 96000}, runtime={"default": 90}, exclusive_timing=False)["cluster"]
    assert cluster.job_resources(settings, "svm", timed=True) == {"mem_mb": 96000, "runtime": 480}
    assert cluster.job_resources(settings, "features") == {"mem_mb": 8000, "runtime": 60}
    assert cluster.job_resources(settings, "prepare")["runtime"] == 30
    assert cluster.job_resources(settings, "report_e1") == {"mem_mb": 4000, "runtime": 90}


class Wildcards:
    def __init__(self, variant):
        self.variant = variant


def test_gpu_jobs_go_to_the_gpu_partition_per_job():
    settings = config_with(partition="cpu", gpu_partition="gpu", account="proj")["cluster"]
    uses_gpu = lambda wildcards: int(wildcards.variant.startswith("gpu-"))  # the rules' own gpu resource
    resources = cluster.job_resources(settings, "train", timed=True, gpu=uses_gpu)
    assert resources["slurm_account"] == "proj"
    assert resources["slurm_partition"](Wildcards("gpu-tiled")) == "gpu"
    assert resources["slurm_partition"](Wildcards("cpu-numpy")) == "cpu"
    assert cluster.job_resources(settings, "sweep_blocks", gpu=1)["slurm_partition"] == "gpu"
    # no gpu_partition: GPU jobs share the one partition
    single = config_with(partition="all")["cluster"]
    assert cluster.job_resources(single, "sweep_blocks", gpu=1)["slurm_partition"] == "all"


@pytest.mark.parametrize("keys, fragment", [
    ({"mem_mb": {"trian": 100}}, "cluster.mem_mb"),
    ({"runtime": {"train": 0}}, "cluster.runtime.train"),
    ({"partition": "gpu; rm -rf /"}, "cluster.partition"),
])
def test_bad_cluster_keys_are_one_line(keys, fragment):
    with pytest.raises(GpunnError, match=fragment.replace(".", r"\.")) as caught:
        config_with(**keys)
    assert "\n" not in str(caught.value)


def test_on_a_cluster_the_gpu_machine_must_be_named():
    """machine: auto would be this (login) node's GPU, and each node would resolve its own (the workflow's
    onstart runs this check when the executor is a cluster's)."""
    quiet = {"log": lambda line: None, "gpu_name": lambda: "NVIDIA H100 80GB HBM3"}
    for raw in ({}, {"machine": "auto"}):
        with pytest.raises(GpunnError, match="config key machine is auto.*--config machine="):
            cluster.check_remote_machine(raw, load_config(raw, **quiet))
    named = {"machine": "nvidia-a100"}
    cluster.check_remote_machine(named, load_config(named, **quiet))
    # nothing to resolve: the simulator (cudasim) and the CPU-only config (cpu)
    smoke = yaml.safe_load((Path(__file__).parents[1] / "config/smoke.yaml").read_text())
    cpu_only = {"gpu": {"enabled": False}}
    for raw in (smoke, cpu_only):
        cluster.check_remote_machine(raw, load_config(raw, **quiet))


def _record(workdir: Path, path: str, endtime: float, name_max: int = 255) -> None:
    """Snakemake's metadata record of `path` as its file persistence writes it (see gpunn.targets.recorded_end)."""
    import base64
    import json

    encoded = base64.urlsafe_b64encode(path.encode()).decode()
    parts = [encoded[i:i + name_max - 1] for i in range(0, len(encoded), name_max - 1)]
    record = workdir.joinpath(".snakemake/metadata", *(["@" + p for p in parts[:-1]] + parts[-1:]))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"endtime": endtime, "rule": "train"}))


@pytest.mark.parametrize("length", [40, 400])  # a path whose encoding is longer than a file name may be
def test_recorded_end_reads_snakemakes_metadata(tmp_path, length):
    from gpunn.targets import recorded_end

    path = "results/runs/" + "x" * length + "/metrics.json"
    assert recorded_end(path, tmp_path) is None  # no record: the log alone decides
    _record(tmp_path, path, 1234.5)
    assert recorded_end(path, tmp_path) == 1234.5


def test_snakemakes_late_touch_on_a_cluster_is_no_edit(tmp_path):
    """On Slurm, Snakemake touches a job's outputs when it sees the job finish, long after the job's log was
    written; the metadata's endtime is that touch. Only a change after it is an edit."""
    import os

    from gpunn.targets import edited_intermediates, planned_intermediates

    config = load_config(yaml.safe_load((Path(__file__).parents[1] / "config/smoke.yaml").read_text()),
                         log=lambda line: None)
    path, log = next((p, l) for p, l in planned_intermediates(config, "e1").items() if l and "runs/" in p)
    for name in (path, log):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    os.utime(tmp_path / log, (1000.0, 1000.0))
    os.utime(tmp_path / path, (1060.0, 1060.0))  # touched by Snakemake a minute after the log
    assert path in edited_intermediates(config, ["e1"], tmp_path)  # without a record: looks edited
    _record(tmp_path, path, 1060.0)
    assert path not in edited_intermediates(config, ["e1"], tmp_path)
    os.utime(tmp_path / path, (1070.0, 1070.0))  # changed after Snakemake's record
    assert path in edited_intermediates(config, ["e1"], tmp_path)
