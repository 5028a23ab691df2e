# Helpers shared by the rules (no rules here): config validation, wildcard constraints, input functions.

import os
import sys

from snakemake.utils import validate

# The workflow and its jobs use the gpunn package of this checkout, installed or not (e.g. jobs in a
# --use-conda environment built from environment.yml): PYTHONPATH is inherited by every job.
_SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, _SRC)

from gpunn.data.registry import DATASETS
from gpunn.pipeline import (
    EXPERIMENTS,
    export_source_path,
    e6_run,
    enabled_experiments,
    eval_dir,
    experiment_runs,
    report_outputs,
    run_dir,
)


validate(config, schema="../schemas/config.schema.yaml", set_default=True)
export_source_path(_SRC)

ENV_FILE = "../../environment.yml"


wildcard_constraints:
    dataset="|".join(DATASETS),
    split="standard|e2",
    model="mlp|cnn|autoencoder",
    variant="[a-z0-9]+(-[a-z0-9]+)*",
    hparams="w[0-9-]+_b[0-9]+_lr[0-9.eE+-]+_e[0-9]+_s[0-9]+(_n[0-9]+)?",
    experiment="e[1-6]",


# A run's path: in input/output/log patterns as RUN, in shell commands as {params.run} (params=run_path).
RUN = "{dataset}/{split}/{model}/{variant}/{hparams}"


def run_path(wildcards):
    return RUN.format(**wildcards)


def cpu_threads(wildcards):
    """Single-threaded baselines get one core; NumPy variants get config key `threads`."""
    return 1 if wildcards.variant.endswith("serial") else config["threads"]


def uses_gpu(wildcards):
    return 1 if wildcards.variant.startswith("gpu") else 0


def gpu_env(gpu_job):
    """Shell prefix of a GPU job: the CUDA simulator when config key gpu.simulator is true."""
    return "NUMBA_ENABLE_CUDASIM=1 " if gpu_job and config["gpu"]["simulator"] else ""


def variant_env(wildcards):
    return gpu_env(uses_gpu(wildcards))


def download_input(wildcards):
    return [f"results/offline/{wildcards.dataset}/manifest.json"] if DATASETS[wildcards.dataset].offline else []


def download_mirrors(wildcards):
    mirrors = [config["data"]["mirror_dir"]] if config["data"]["mirror_dir"] else []
    if DATASETS[wildcards.dataset].offline:
        mirrors.append(f"results/offline/{wildcards.dataset}")
    return " ".join(f"--mirror {m}" for m in mirrors)


def report_inputs(experiment):
    """Input files of one experiment's report, by kind (runs, evals, timings, blocks, svm)."""
    if experiment == "e3":
        return {
            "timings": expand("results/timing/e3/{variant}.csv", variant=config["experiments"]["e3"]["variants"]),
            "blocks": ["results/timing/e3/blocks.csv"],
        }
    if experiment == "e6":
        return {"svm": [f"results/svm/{e6_run(config).path}/metrics.json"]}
    runs = experiment_runs(config, experiment)
    inputs = {"runs": [f"{run_dir(r)}/metrics.json" for r in runs]}
    if experiment in ("e1", "e4", "e5"):
        shown = {}  # sample figures from the first listed variant (the reference) of each dataset
        for r in runs:
            shown.setdefault(r.dataset, r)
        inputs["evals"] = [f"{eval_dir(r)}/eval.json" for r in shown.values()]
    return inputs


# Report inputs passed as the CSV files themselves; every other kind is passed as the folder holding the file.
CSV_REPORT_INPUTS = ("timings", "blocks")


def report_args(inputs):
    """Command-line options naming the run, eval and svm folders (and the timing and block-sweep CSVs)."""
    parts = []
    for kind, paths in inputs.items():
        folders = paths if kind in CSV_REPORT_INPUTS else [os.path.dirname(p) for p in paths]
        parts.append(f"--{kind} " + " ".join(folders))
    return " ".join(parts)


def report_files(experiment):
    """Targets of the report: tables as plain outputs, figures marked for `snakemake --report`."""
    files = []
    for path in report_outputs(config, experiment):
        files.append(report(path, caption="../report/figure.rst", category=experiment.upper()) if path.endswith(".png") else path)
    return files
