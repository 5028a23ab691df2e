"""What the Snakemake workflow builds, derived from the validated config (gpunn.config): where every output
lives, the runs of each experiment, the files each report needs, and which planned intermediate files are
missing. Kept here, not in the Snakefile, so it is plain, testable Python.

Layout (paths relative to the workflow's directory; see docs/outputs.md):
    <results_dir>/offline, data/raw, data/prepared      data: the same wherever it is made
    <results_dir>/{runs,eval,features,svm,timing,profile,report}/<machine>/...
                                                         measured: apart per device (`machine`: the GPU's
                                                         name, "cudasim" under the simulator, or "cpu"); svm
                                                         then per method: svm/<machine>/<method>/<run>
    <results_dir>/logs/...                               one log per job
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpunn import experiments
from gpunn.backends.registry import uses_gpu
from gpunn.data.integrity import MANIFEST
from gpunn.data.registry import SPLIT_SIZES, get_dataset, imitated
from gpunn.experiments import e6
from gpunn.experiments.base import as_list
from gpunn.fingerprints import matches, read_record
from gpunn.nn.models import model_spec
from gpunn.report.job_times import JOB_TIMES
from gpunn.report.sources import PROVENANCE as REPORT_PROVENANCE
from gpunn.report.step_profile import STEP_PROFILE
from gpunn.report.titles import count
from gpunn.runspec import RunSpec

EXPERIMENTS = experiments.NAMES
DEFAULT_RESULTS = "results"
DEFAULT_MACHINE = "cpu"
BENCHMARKS = "benchmarks"  # every job's Snakemake benchmark file (its wall time), <results_dir>/benchmarks/


def export_source_path(src: str) -> None:
    """Put `src` first on PYTHONPATH, which every job inherits, so `python -m gpunn` runs this checkout."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)


def export_download_options(config: dict) -> None:
    """Download options change where files come from, never what they are (every file is checksum-verified),
    so they reach the download jobs through the environment (GPUNN_MIRRORS, GPUNN_DOWNLOAD_TIMEOUT, read by
    the download rules' command) rather than as params: changing them reruns nothing."""
    os.environ["GPUNN_MIRRORS"] = config["data"]["mirror_dir"]
    os.environ["GPUNN_DOWNLOAD_TIMEOUT"] = str(config["data"]["timeout_s"])


@dataclass(frozen=True)
class Layout:
    """Where the outputs of one config go: data under `root`, measured outputs also under `machine`."""

    root: str = DEFAULT_RESULTS
    machine: str = DEFAULT_MACHINE

    @classmethod
    def of(cls, config: dict) -> Layout:
        return cls(config.get("results_dir", DEFAULT_RESULTS).rstrip("/") or ".",
                   config.get("machine", DEFAULT_MACHINE))

    def data(self, stage: str) -> str:
        """offline, data/raw or data/prepared: shared by every machine."""
        return f"{self.root}/{stage}"

    def measured(self, stage: str) -> str:
        """runs, eval, features, svm, timing, profile, report: one folder per machine."""
        return f"{self.root}/{stage}/{self.machine}"

    def logs(self, stage: str) -> str:
        return f"{self.root}/logs/{stage}"

    def job_log(self, stage: str, name: str) -> str:
        """The log of a `stage` job named `name` (its wildcards' path), <root>/logs/<stage>/<name>.log."""
        return f"{self.logs(stage)}/{name}.log"

    def job_benchmark(self, stage: str, name: str) -> str:
        """Snakemake's benchmark file of that job (its wall time `s`, peak memory, CPU time), beside the logs:
        <root>/benchmarks/<stage>/<name>.tsv."""
        return f"{self.root}/{BENCHMARKS}/{stage}/{name}.tsv"

    def benchmark_of(self, log: str) -> str:
        """The benchmark file of the job whose log is `log` (a path that job_log gives)."""
        prefix = f"{self.root}/logs/"
        if not (log.startswith(prefix) and log.endswith(".log")):
            raise ValueError(f"not a job log under {prefix}: {log}")
        return f"{self.root}/{BENCHMARKS}/{log[len(prefix):-len('.log')]}.tsv"

    def run_log(self, stage: str, spec: RunSpec) -> str:
        """The log of a per-run job (train, evaluate, features)."""
        return self.job_log(stage, f"{self.machine}/{spec.path}")

    def run_dir(self, spec: RunSpec) -> str:
        return f"{self.measured('runs')}/{spec.path}"

    def eval_dir(self, spec: RunSpec) -> str:
        return f"{self.measured('eval')}/{spec.path}"

    def features_dir(self, spec: RunSpec) -> str:
        return f"{self.measured('features')}/{spec.path}"

    def report_dir(self, experiment: str) -> str:
        return f"{self.measured('report')}/{experiment}"

    def raw_dir(self, dataset: str) -> str:
        return f"{self.data('data/raw')}/{dataset}"

    def prepared(self, dataset: str, split: str) -> str:
        return f"{self.data('data/prepared')}/{dataset}/{split}.npz"


def experiment_runs(config: dict, experiment: str) -> list[RunSpec]:
    """Training runs of one experiment (E3 times steps without training runs; E6 uses an E5 run)."""
    return experiments.get(experiment).runs(config)


def keep_diverged_runs(config: dict) -> set[str]:
    """The paths of the runs that keep diverged runs (gpunn train --keep-diverged): every run of an experiment
    whose keep_diverged is true (E1, E2, E4, E5; E6 encodes with an E5 run, so E5's setting applies), enabled or
    not. A run several experiments request is kept if any of them keeps diverged runs."""
    return {spec.path for experiment in EXPERIMENTS if config["experiments"][experiment].get("keep_diverged")
            for spec in experiment_runs(config, experiment)}


def e6_run(config: dict) -> RunSpec:
    """The E5 run whose encoder gives E6's features."""
    return e6.encoder_run(config)


def enabled_experiments(config: dict) -> list[str]:
    return [e for e in EXPERIMENTS if config["experiments"][e]["enabled"]]


PROFILED = tuple(e.name for e in experiments.ALL if e.profiled)  # experiments whose training steps are profiled


def profiled_variants(config: dict, experiment: str) -> list[str]:
    """The GPU variants of a profiled experiment (E1, E4, E5: its main runs' variants) whose training step is
    profiled; none for the other experiments, nor where gpu.enabled false has dropped the GPU variants."""
    if not experiments.get(experiment).profiled:
        return []
    return [v for v in dict.fromkeys(config["experiments"][experiment].get("variants", [])) if uses_gpu(v)]


def profile_options(config: dict, experiment: str) -> list[str]:
    """The `gpunn profile` options of an experiment's jobs: its model, dataset (the first of E4's: they share
    MNIST's shape), batch and widths, as its runs train."""
    exp, model = config["experiments"][experiment], experiments.get(experiment).model
    widths = as_list(exp[model_spec(model).width_key])
    dataset = exp["dataset"] if "dataset" in exp else exp["datasets"][0]
    return ["--model", model, "--dataset", dataset, "--batch", str(exp["batch"]),
            "--widths", ",".join(str(w) for w in widths)]


def report_figures(config: dict, experiment: str) -> list[str]:
    """The PNG figures of an experiment's report, by file name (Experiment.figures), and the step profile's where
    a GPU variant is profiled (profiled_variants). Each has a PDF twin (report_outputs)."""
    profile = [f"{STEP_PROFILE}.png"] if profiled_variants(config, experiment) else []
    return experiments.get(experiment).figures(config) + profile


def report_outputs(config: dict, experiment: str) -> list[str]:
    """The files a report step writes (the experiment's target files): its tables (CSV + Markdown), its figures
    as PNG then as PDF, and provenance.json. E3's block tables only with its kernel block sweep, E4's only with
    a block-size study, the step profile table only with a profiled variant."""
    base = Layout.of(config).report_dir(experiment)
    tables = experiments.get(experiment).tables(config)
    tables += [STEP_PROFILE] if profiled_variants(config, experiment) else []
    tables.append(JOB_TIMES)
    figures = report_figures(config, experiment)
    table_files = [f"{base}/{table}.{ext}" for table in tables for ext in ("csv", "md")]
    table_files += [f"{base}/{name}" for name in experiments.get(experiment).files(config)]
    return (table_files + [f"{base}/{name}" for name in figures]
            + [f"{base}/{name[:-len('.png')]}.pdf" for name in figures] + [f"{base}/{REPORT_PROVENANCE}"])


INDEX_FILES = ("index.md", "index.csv", "index.rst")


def index_args(config: dict) -> list[str]:
    """The `gpunn index` arguments of a config (unquoted, one per list item): index_setting as options."""
    ran, not_run, notes = index_setting(config)
    args = ["--machine", Layout.of(config).machine, "--ran", *ran]
    if not_run:
        args += ["--not-run", *(f"{e}={why}" for e, why in not_run.items())]
    if notes:
        args += ["--note", *notes]
    return args


def index_setting(config: dict) -> tuple[list[str], dict[str, str], list[str]]:
    """What the entry page of a config states: the experiments that ran, why the others did not, and the config
    facts that leave rows empty or make timings meaningless."""
    ran = enabled_experiments(config)
    not_run = {e: f"experiments.{e}.enabled is false in this config" for e in EXPERIMENTS if e not in ran}
    notes = []
    gpu = config.get("gpu", {})
    if not gpu.get("enabled", True):
        notes.append("gpu.enabled is false (the CPU-only reproduction): no GPU variant and no kernel block sweep "
                     "ran, so their rows read '-'.")
    elif gpu.get("simulator", False):
        notes.append("gpu.simulator is true: the GPU variants ran under numba's CUDA simulator on tiny data.")
    notes += synthetic_data_notes(config, ran)
    return ran, not_run, notes


def synthetic_data_notes(config: dict, ran) -> list[str]:
    """One note per synthetic dataset (synthetic_*: generated offline in a real dataset's format, at its size or
    smaller) that an experiment of `ran` trained on: its numbers are timings of the real image shapes, not results
    on the real data; a smaller one says how much smaller (gpunn.data.registry.SPLIT_SIZES)."""
    users: dict[str, list[str]] = {}
    for experiment in ran:
        for dataset, _ in experiment_data(config, experiment):
            users.setdefault(dataset, []).append(experiment.upper())
    return [f"{' and '.join(used)} ran on {name}, {get_dataset(name).description}, {_synthetic_size(name)}; "
            "their losses and accuracies are not the real dataset's, nor comparable with the paper's."
            for name, used in users.items() if name.startswith("synthetic_")]


def _synthetic_size(name: str) -> str:
    """How a synthetic dataset's size stands to the real one's it imitates."""
    real = imitated(name)
    ours, theirs = SPLIT_SIZES.get(name), SPLIT_SIZES.get(real)
    if real is None or ours is None or theirs is None:
        return "generated offline: their times are those of its image shapes"
    if ours == theirs:
        return (f"generated offline in {real}'s format and size: their times are those of the real shapes and "
                "sizes")
    return (f"generated offline in {real}'s format, smaller ({count(ours[0])} train / {count(ours[1])} test images "
            f"against {real}'s {count(theirs[0])} / {count(theirs[1])}): their times are those of the real image "
            "shapes over fewer images")


def index_outputs(config: dict) -> list[str]:
    """The report's entry page (gpunn.report.index): index.md beside the experiments' folders, its summary table
    as index.csv, and index.rst, the front page of `snakemake --report`."""
    root = Layout.of(config).measured("report")
    return [f"{root}/{name}" for name in INDEX_FILES]


def experiment_data(config: dict, experiment: str) -> list[tuple[str, str]]:
    """(dataset, split) pairs an experiment's runs train on."""
    return list(dict.fromkeys((r.dataset, r.split) for r in experiment_runs(config, experiment)))


def raw_outputs(config: dict, dataset: str) -> list[str]:
    """The files the download step leaves for a dataset: its registry files, then manifest.json."""
    raw = Layout.of(config).raw_dir(dataset)
    return [f"{raw}/{name}" for name in get_dataset(dataset).files] + [f"{raw}/{MANIFEST}"]


RUN_FILES = ("metrics.json", "metrics.csv", "weights.npz")
EVAL_FILES = ("eval.json", "samples.npz", "predictions.npy")
SVM_FILES = ("metrics.json", "confusion.csv", "per_class.csv", "predictions.csv", "confusion.png")
FEATURE_FILES = tuple(f"{part}_{kind}.npy" for part in ("train", "test") for kind in ("features", "labels"))


def shown_runs(config: dict, experiment: str) -> list[RunSpec]:
    """The runs whose evaluation an experiment's report shows (Experiment.shown_runs: E1's and E4's first variant
    per dataset, E5's encoder run)."""
    return experiments.get(experiment).shown_runs(config)


def report_inputs(config: dict, experiment: str) -> dict[str, list[str]]:
    """Input files of one experiment's report, by kind: its own (Experiment.inputs: E3's timings and blocks, E6's
    svm), else runs (metrics.json), evals (eval.json of the shown_runs) and profiles (a step profile CSV per
    profiled variant)."""
    layout = Layout.of(config)
    own = experiments.get(experiment).inputs
    if own is not None:
        return {**own(config, layout), **overlap_verdict_input(config, layout)}
    inputs = {"runs": [f"{layout.run_dir(r)}/metrics.json" for r in experiment_runs(config, experiment)]}
    if shown := shown_runs(config, experiment):
        inputs["evals"] = [f"{layout.eval_dir(r)}/eval.json" for r in shown]
    if profiled := profiled_variants(config, experiment):
        inputs["profiles"] = [f"{layout.measured('profile')}/{experiment}/{v}.csv" for v in profiled]
    return {**inputs, **overlap_verdict_input(config, layout)}


VERDICT_FOLDER = "overlap-verdict"  # gpunn overlap-verdict's default --out: <results>/overlap-verdict/<machine>


def overlap_verdict_input(config: dict, layout: Layout) -> dict[str, list[str]]:
    """{"verdict": [file]} under timing: overlap when gpunn overlap-verdict has written one for this machine's runs
    (<results>/overlap-verdict/<machine>/verdict.json; no pipeline step makes it, so only an existing one is an
    input: once written, the reports are rebuilt with it); else {}."""
    path = f"{layout.measured(VERDICT_FOLDER)}/verdict.json"
    return {"verdict": [path]} if config.get("timing") == "overlap" and os.path.isfile(path) else {}


# passed to `gpunn report` as the files themselves
CSV_REPORT_INPUTS = ("timings", "blocks", "profiles", "jobs", "verdict")


def report_options(inputs: dict[str, list[str]]) -> dict[str, list[str]]:
    """A report's inputs (report_inputs, plus "jobs": job_benchmarks) as `gpunn report` takes them: the CSV and
    benchmark files themselves, every other kind as the folder holding the file (a run, an evaluation, an SVM)."""
    return {kind: list(paths) if kind in CSV_REPORT_INPUTS else [os.path.dirname(p) for p in paths]
            for kind, paths in inputs.items()}


def planned_intermediates(config: dict, experiment: str) -> dict[str, str | None]:
    """Every file the experiment's report depends on through the DAG, upstream first (raw files, prepared
    splits, run outputs, the evaluations the report shows, E6's encoder features and SVM, E3's timings, the step
    profiles), each with the log of the job that writes it (None for raw files, which their manifest.json vouches
    for instead)."""
    layout = Layout.of(config)
    files: dict[str, str | None] = {}
    for dataset, split in experiment_data(config, experiment):
        files.update(dict.fromkeys(raw_outputs(config, dataset)))
        files[layout.prepared(dataset, split)] = f"{layout.logs('prepare')}/{dataset}/{split}.log"
    encodes = "svm" in report_inputs(config, experiment)  # E6: the features of its encoder run
    for spec in experiment_runs(config, experiment):
        log = layout.run_log("train", spec)
        files.update({f"{layout.run_dir(spec)}/{name}": log for name in RUN_FILES})
        if encodes:
            log = layout.run_log("features", spec)
            files.update({f"{layout.features_dir(spec)}/{name}": log for name in FEATURE_FILES})
    for spec in shown_runs(config, experiment):
        log = layout.run_log("evaluate", spec)
        files.update({f"{layout.eval_dir(spec)}/{name}": log for name in EVAL_FILES})
    files.update(_measured_inputs(config, experiment, layout))
    return files


def job_benchmarks(config: dict, experiment: str) -> list[str]:
    """The benchmark files of every job an experiment's report depends on, upstream first: its datasets' generation
    (offline ones) and download, then the jobs of planned_intermediates (prepare, train, evaluate, features, SVM,
    E3's timings, the step profiles). The report lists their wall times (gpunn.report.job_times)."""
    layout = Layout.of(config)
    logs = []
    for dataset in dict.fromkeys(dataset for dataset, _ in experiment_data(config, experiment)):
        if get_dataset(dataset).offline:
            logs.append(layout.job_log("make_offline", dataset))
        logs.append(layout.job_log("download", dataset))
    logs += [log for log in planned_intermediates(config, experiment).values() if log]
    return [layout.benchmark_of(log) for log in dict.fromkeys(logs)]


def _measured_inputs(config: dict, experiment: str, layout: Layout) -> dict[str, str]:
    """The report's inputs that no run folder holds, each with its job's log: E3's timing CSVs and block sweep,
    the step profiles, E6's SVM outputs."""
    inputs, files = report_inputs(config, experiment), {}
    for path in inputs.get("timings", []):
        files[path] = f"{layout.logs('time_batches')}/{layout.machine}/{Path(path).stem}.log"
    for path in inputs.get("blocks", []):
        files[path] = f"{layout.logs('sweep_blocks')}/{layout.machine}.log"
    for path in inputs.get("profiles", []):
        files[path] = f"{layout.logs('step_profile')}/{layout.machine}/{experiment}/{Path(path).stem}.log"
    if inputs.get("svm"):
        spec = e6_run(config)
        for method in config["experiments"]["e6"]["method"]:
            folder = e6.svm_dir(layout, method, spec)
            files.update({f"{folder}/{name}": layout.job_log("svm", f"{layout.machine}/{method}/{spec.path}")
                          for name in SVM_FILES})
    return files


# A job's log is finished after its outputs are renamed into place (its last line says "done"); the job then
# records its outputs' fingerprints beside the log (gpunn.fingerprints), and Snakemake touches every output. On
# a cluster that touch comes when Snakemake sees the job finish, seconds to minutes after the log. An output
# modified later than its log, by more than this slack for coarse file-system clocks, whose bytes no longer
# match its recorded fingerprint (or that has none recorded) was changed by hand.
EDIT_SLACK_S = 2.0


def edited_intermediates(config: dict, experiments, workdir: str | Path = ".") -> list[str]:
    """Planned intermediate files changed after the job that wrote them finished (edited, overwritten,
    truncated by hand): they no longer are what that job made. The workflow moves each aside (to
    `<file>.edited`), so that it is remade and everything that depends on it reruns. Only files newer than
    their log are hashed; a file only touched keeps its fingerprint and is no edit."""
    workdir = Path(workdir)
    edited, checked, records = [], set(), {}
    for experiment in experiments:
        for path, log in planned_intermediates(config, experiment).items():
            if log is None or path in checked:
                continue
            checked.add(path)
            try:
                written = (workdir / path).stat().st_mtime
                finished = (workdir / log).stat().st_mtime
            except FileNotFoundError:
                continue  # missing: see missing_intermediates; no log: not made by this workflow's job
            if written <= finished + EDIT_SLACK_S:
                continue
            if log not in records:
                records[log] = read_record(workdir / log)
            if not matches(workdir / path, records[log].get(os.path.normpath(path))):
                edited.append(path)
    return edited


def missing_intermediates(config: dict, experiments, workdir: str | Path = ".") -> list[str]:
    """Planned intermediate files of the experiments that are absent. Snakemake would not remake them while
    what depends on them is up to date; the workflow lists them as inputs of its target rules, so removing
    a file reruns the job that makes it and, after it, everything that depends on it (and nothing else)."""
    workdir = Path(workdir)
    planned = dict.fromkeys(f for e in experiments for f in planned_intermediates(config, e))
    return [f for f in planned if not (workdir / f).exists()]
