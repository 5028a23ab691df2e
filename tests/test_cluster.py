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

    def uses_gpu(wildcards):  # the rules' own gpu resource
        return int(wildcards.variant.startswith("gpu-"))

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
