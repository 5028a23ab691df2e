"""Placement of the pipeline's jobs on a Slurm cluster, from config key `cluster` (workflow/schemas).

Snakemake's Slurm executor plugin (profiles/slurm) turns a job's resources into sbatch options:
``mem_mb`` -> ``--mem``, ``runtime`` (minutes) -> ``-t``, ``threads`` -> ``--cpus-per-task``, ``gpu`` -> ``--gpus``,
``slurm_partition`` -> ``-p``, ``slurm_account`` -> ``-A``, ``slurm_extra`` appended as is. The rules take their
resources from `job_resources` (through workflow/rules/common.smk); local runs ignore all but ``gpu`` and
``timing``, which profiles/default limits to one job at a time on the one machine.

On a cluster, timed jobs cannot all wait for one `timing` slot without losing the cluster's point, so each asks
for a node of its own (``--exclusive``, config key cluster.exclusive_timing): its timings are as undisturbed as
on one machine, and timed jobs on different nodes run side by side.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import GpunnError


def rule_setting(cluster: dict, key: str, rule: str) -> int:
    """cluster.<key>.<rule>, else cluster.<key>.default (`key`: mem_mb or runtime)."""
    table = cluster[key]
    return int(table.get(rule, table["default"]))


def partition(cluster: dict, gpu_job: bool) -> str:
    """The partition of a job ("" for the cluster's default): GPU jobs go to gpu_partition when it is set."""
    return (cluster["gpu_partition"] or cluster["partition"]) if gpu_job else cluster["partition"]


def job_resources(cluster: dict, rule: str, timed: bool = False,
                  gpu: int | Callable[..., int] = 0) -> dict:
    """The Slurm resources of `rule`'s jobs: memory, runtime, and partition, account and --exclusive where the
    config asks for them. `gpu`: whether the job needs a GPU, 0/1 or a function of the wildcards (the rule's own
    `gpu` resource), which picks the partition per job."""
    resources = {"mem_mb": rule_setting(cluster, "mem_mb", rule),
                 "runtime": rule_setting(cluster, "runtime", rule)}
    if cluster["partition"] or cluster["gpu_partition"]:
        if callable(gpu):
            resources["slurm_partition"] = lambda wildcards: partition(cluster, bool(gpu(wildcards)))
        else:
            resources["slurm_partition"] = partition(cluster, bool(gpu))
    if cluster["account"]:
        resources["slurm_account"] = cluster["account"]
    if timed and cluster["exclusive_timing"]:
        resources["slurm_extra"] = "--exclusive"
    return resources


def check_remote_machine(raw: dict, config: dict) -> None:
    """On a cluster the jobs run on other nodes than Snakemake, so `machine: auto` (this host's GPU) would name
    the wrong device, and each node would resolve its own: GpunnError unless it is named or cannot vary (the
    simulator's cudasim, the CPU-only config's cpu)."""
    if raw.get("machine", "auto") != "auto" or config["gpu"]["simulator"] or not config["gpu"]["enabled"]:
        return
    raise GpunnError("config key machine is auto, but on a cluster the jobs run on other nodes than this one: "
                     "name the GPU nodes' device, e.g. --config machine=nvidia-a100-sxm4-80gb "
                     "(docs/slurm.md)")
