"""What the Snakemake workflow builds, derived from the (validated) config: the runs of each experiment
and the datasets they need. Kept here, not in the Snakefile, so it is plain, testable Python.

Every path is relative to the workflow's directory; see the README for the layout of results/.
"""

from __future__ import annotations

import os

from gpunn.runspec import RunSpec

EXPERIMENTS = ("e1", "e2", "e3", "e4", "e5", "e6")
RESULTS = "results"


def export_source_path(src: str) -> None:
    """Put `src` first on PYTHONPATH, which every job inherits, so `python -m gpunn` runs this checkout."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def experiment_runs(config: dict, experiment: str) -> list[RunSpec]:
    """Training runs of one experiment (E3 times steps without training runs; E6 uses an E5 run)."""
    exp = config["experiments"][experiment]
    if experiment == "e1":
        return [RunSpec(exp["dataset"], "standard", "mlp", v, (exp["hidden"],), exp["batch"], exp["lr"],
                        exp["epochs"], exp["seed"], exp["subset"]) for v in exp["variants"]]
    if experiment == "e2":
        return [RunSpec(exp["dataset"], "e2", "mlp", v, (h,), b, exp["lr"], exp["epochs"], exp["seed"])
                for v in exp["variants"] for h in _as_list(exp["hidden"]) for b in _as_list(exp["batch"])]
    if experiment == "e4":
        return [RunSpec(d, "standard", "cnn", v, tuple(exp["channels"]), exp["batch"], exp["lr"], exp["epochs"],
                        exp["seed"], exp["subset"]) for d in exp["datasets"] for v in exp["variants"]]
    if experiment == "e5":
        return [RunSpec(exp["dataset"], "standard", "autoencoder", v, tuple(exp["channels"]), exp["batch"], exp["lr"],
                        exp["epochs"], exp["seed"], exp["subset"]) for v in exp["variants"]]
    if experiment == "e6":
        return [r for r in experiment_runs(config, "e5") if r.variant == config["experiments"]["e6"]["variant"]]
    return []


def e6_run(config: dict) -> RunSpec:
    runs = experiment_runs(config, "e6")
    if not runs:
        from gpunn.errors import GpunnError

        raise GpunnError(
            f"config key experiments.e6.variant = '{config['experiments']['e6']['variant']}' is not one of "
            f"experiments.e5.variants {config['experiments']['e5']['variants']}"
        )
    return runs[0]


def enabled_experiments(config: dict) -> list[str]:
    return [e for e in EXPERIMENTS if config["experiments"][e]["enabled"]]


def run_dir(spec: RunSpec) -> str:
    return f"{RESULTS}/runs/{spec.path}"


def eval_dir(spec: RunSpec) -> str:
    return f"{RESULTS}/eval/{spec.path}"


def report_outputs(config: dict, experiment: str) -> list[str]:
    """The files a report step writes (the experiment's target files)."""
    base = f"{RESULTS}/report/{experiment}"
    exp = config["experiments"][experiment]
    tables = ["summary"] + {"e2": ["paper_table"], "e3": ["blocks"]}.get(experiment, [])
    figures = {
        "e1": ["loss_curves.png", "epoch_time.png", "samples.png"],
        "e2": ["heatmaps.png", "forward_backward.png"],
        "e3": ["batch_timing.png", "block_sweep.png"],
        "e4": ["loss_curves.png"] + [f"samples_{d}.png" for d in exp.get("datasets", [])],
        "e5": ["loss_curves.png", "reconstructions.png"],
        "e6": [],
    }[experiment]
    table_files = [f"{base}/{table}.{ext}" for table in tables for ext in ("csv", "md")]
    return table_files + [f"{base}/{name}" for name in figures]
