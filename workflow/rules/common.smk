# Helpers shared by the rules (no rules here): the config check, the output layout, wildcard constraints,
# input functions and the integrity checks that decide what must be remade.

import os
import shlex
import sys

# The workflow and its jobs use the gpunn package of this checkout, installed or not (e.g. jobs in a
# --use-conda environment built from environment.yml): PYTHONPATH is inherited by every job.
_SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, _SRC)

from gpunn.config import (
    CPU_MACHINE,
    SIMULATOR_MACHINE,
    gpu_slots,
    load_config,
    load_schema,
    missing_gpu_note,
    read_config_file,
)
from gpunn.data.registry import DATASETS
from gpunn.svm import METHODS as SVM_METHODS
from gpunn import experiments
from gpunn.report.captions import rst_name as caption_file
from gpunn.errors import GpunnError
from gpunn.runspec import RUN_PATTERN as RUN
from gpunn.runspec import WILDCARD_CONSTRAINTS, format_run_path
from gpunn.targets import (
    EXPERIMENTS,
    FEATURE_FILES,
    SVM_FILES,
    PROFILED,
    Layout,
    edited_intermediates,
    enabled_experiments,
    experiment_data,
    export_download_options,
    export_source_path,
    index_args,
    index_outputs,
    job_benchmarks,
    keep_diverged_runs,
    missing_intermediates,
    profile_options,
    raw_outputs,
    report_inputs,
    report_options,
    report_outputs,
)
from gpunn.cluster import check_remote_machine, job_resources
from gpunn import failures, placement
from gpunn.backends.registry import cpu_threads as variant_cpu_threads
from gpunn.backends.registry import uses_gpu as variant_uses_gpu


def _checked_config():
    """The config validated against the schema and the registries, or one line and exit 1 (no traceback,
    no schema dump, before any job is planned)."""
    try:
        checked = load_config(
            dict(config),
            load_schema(os.path.join(workflow.basedir, "workflow/schemas/config.schema.yaml")),
            log=lambda line: print(line, file=sys.stderr),
        )
    except GpunnError as exc:
        print(f"gpunn: config error: {exc}", file=sys.stderr)
        sys.exit(1)
    config.clear()
    config.update(checked)


def _with_base_config():
    """config/config.yaml extended by what the command line gave (--configfile, --config), as a `configfile:`
    directive would (snakemake.utils.update_config: nested keys merged)."""
    from snakemake.utils import update_config

    try:  # bad YAML: one line with its line and column (Snakemake itself reads --configfile files, not this one)
        base = read_config_file(os.path.join(workflow.basedir, "config/config.yaml"))
    except GpunnError as exc:
        print(f"gpunn: config error: {exc}", file=sys.stderr)
        sys.exit(1)
    update_config(base, dict(config))
    config.clear()
    config.update(base)


def _gpu_slots():
    """The GPU ids GPU jobs are placed on (config key gpus, gpunn.config.gpu_slots), or one line and exit 1."""
    try:
        return gpu_slots(config)
    except GpunnError as exc:
        print(f"gpunn: config error: {exc}", file=sys.stderr)
        sys.exit(1)


_with_base_config()
RAW_CONFIG = dict(config)  # as given, before `machine` is resolved (onstart's cluster check)
_checked_config()
GPU_SLOTS = _gpu_slots()
# Snakemake's `gpu` resource: one job per GPU slot at a time, unless --resources (or a profile) gives it; a cluster
# run lifts it again in onstart (the executor is not known yet here), where Slurm places the GPU jobs
GPU_LIMIT_SET = "gpu" not in workflow.global_resources
if GPU_LIMIT_SET:
    workflow.register_resource("gpu", max(1, len(GPU_SLOTS)))
# config key cpu_lanes (timing: overlap): the `timing` resource, which CPU-timed jobs take, one per lane
if config["cpu_lanes"] > 1:
    workflow.register_resource("timing", config["cpu_lanes"])
export_source_path(_SRC)
GPU_NOTE = [missing_gpu_note(RAW_CONFIG, config)]  # printed by the first planned GPU job, then cleared
LAYOUT = Layout.of(config)
R = LAYOUT.root  # data outputs: <results_dir>/...
M = LAYOUT.machine  # measured outputs: <results_dir>/<stage>/<machine>/...
ENV_FILE = "../../environment.yml"

export_download_options(config)


# A run's path, as gpunn.runspec defines it: in input/output/log patterns as RUN (one wildcard per field,
# constrained here), in shell commands as {params.run} (params: run=format_run_path, from the wildcards).
wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


def logged(command, fingerprints=False):
    """A job's shell: `command` with its output on the terminal and in the job's log, the command itself traced into
    the log (bash xtrace on file descriptor 3) instead of printed by Snakemake: each rule's short `message:` names
    the job on the terminal (profiles: printshellcmds off, reasons quiet), so that no terminal line lists files.
    Only the command's subshell traces: a traced `tee` would race it for the log's first line. With `fingerprints`
    (jobs of planned intermediate files), once the command succeeded (bash pipefail), its outputs' sizes and hashes
    go to `<log>.outputs.json` (gpunn.fingerprints), which tells a hand edit from Snakemake's later touch. The log's
    first line and, once all that succeeded, its last are the job's clock, `gpunn job clock: start|end <epoch s>`
    (gpunn.report.job_times reads them)."""
    clock = 'echo "gpunn job clock: {} $(date +%s.%N)"'
    traced = f"( BASH_XTRACEFD=3; set -x; {command} ) 2>&1 | tee -a {{log}}"
    shell = f"exec 3>{{log}}; {clock.format('start')} >&3; {traced}"
    if fingerprints:
        shell += "; python -m gpunn.fingerprints {log:q} {output:q}"
    return f"{shell}; {clock.format('end')} >> {{log}}"


def job_log(stage, name):
    """A job's log, <results_dir>/logs/<stage>/<name>.log (`name`: the job's wildcards as a path)."""
    return LAYOUT.job_log(stage, name)


def job_benchmark(stage, name):
    """A job's Snakemake benchmark file beside its log, <results_dir>/benchmarks/<stage>/<name>.tsv: its wall time
    in seconds (`s`), peak memory and CPU time; each report's job_times table and the entry page sum them."""
    return LAYOUT.job_benchmark(stage, name)


RUN_NAME = RUN.replace("{", "{wildcards.")  # the run's path in a message: {wildcards.dataset}/...


def job_message(text):
    """A rule's `message:`, "<rule>: <what>", one line per job on the terminal; None (Snakemake's full job block)
    under config key job_details."""
    return None if config["job_details"] else text


def cpu_threads(wildcards):
    """Single-threaded baselines get one core, the others config key `threads` (the registry's fact); a GPU
    variant under the CUDA simulator one too (its kernels run as Python threads under one interpreter lock), and
    under timing: overlap (its host thread, on a core of its own beside a CPU baseline's `threads`)."""
    if (config["gpu"]["simulator"] or config["timing"] == "overlap") and variant_uses_gpu(wildcards.variant):
        return 1
    return variant_cpu_threads(wildcards.variant, config["threads"])


def gpu_job(wildcards=None):
    """The `gpu` resource of a job that needs a GPU: 1; the first such job planned on a machine without one prints
    GPU_NOTE (a job's resources are evaluated only once it is planned: --list-target-rules, --unlock or a CPU-only
    target print nothing)."""
    if GPU_NOTE[0]:
        print(GPU_NOTE.pop(), file=sys.stderr)
        GPU_NOTE.append(None)
    return 1


def uses_gpu(wildcards):
    """The `gpu` resource of a job of `wildcards.variant`: gpu_job for a GPU variant, else 0."""
    return gpu_job() if variant_uses_gpu(wildcards.variant) else 0


onstart:
    # The executor is known only now (the Snakefile is read before it is chosen), and before any job is
    # submitted: on a cluster (profiles/slurm) the jobs run on other nodes than this one.
    if workflow.non_local_exec:
        if GPU_LIMIT_SET:
            workflow.register_resource("gpu", sys.maxsize)
        try:
            check_remote_machine(RAW_CONFIG, config)
        except GpunnError as exc:
            print(f"gpunn: config error: {exc}", file=sys.stderr)
            sys.exit(1)
        if workflow.resource_settings.resources.get("timing") == 1:
            # --profile keeps the workflow profile (profiles/default), whose one-machine limits would run the
            # cluster's timed jobs one at a time; on Slurm each has a node of its own instead (gpunn.cluster)
            print(
                "gpunn: note: resources timing=1 (profiles/default) lets one timed job run at a time on the "
                "whole cluster; use --workflow-profile profiles/slurm, which replaces it",
                file=sys.stderr,
            )
    else:
        # SIGTERM stops the running jobs too, at once, instead of waiting for them to end; after it or Ctrl-C,
        # onerror says which jobs were stopped (gpunn.failures)
        failures.forward_signals(workflow)


onerror:
    # Printed last, after Snakemake's own error blocks: each failed job with gpunn's error line from its log and the
    # log's path, or that a signal (SIGTERM, Ctrl-C) stopped the run and which jobs it stopped (gpunn.failures)
    failures.at_exit(workflow)


def _needed(gpu, wildcards):
    return gpu(wildcards) if callable(gpu) else gpu


def _timing_resource(timed, gpu):
    """A job's `timing` resource (profiles/default limits it to 1; gpunn.placement.resources): timed jobs take it
    under timing: isolated, only those that time CPU work under overlap ("cpu", "both"), none under the CUDA
    simulator (whose times measure nothing; such a job takes no timing lock either)."""

    def resource(wildcards):
        return placement.resources(config["timing"], timed, _needed(gpu, wildcards), config["gpu"]["simulator"])[
            "timing"
        ]

    return resource


def _borrowed_gpu_resource(gpu):
    """The `gpu` resource of a job that borrows its GPU: none on this machine (the GPU's slot lock, taken by the
    job while it computes, keeps GPU jobs apart), `gpu` on a cluster, whose job must be given one."""

    def resource(wildcards):
        return _needed(gpu, wildcards) if workflow.non_local_exec else 0

    return resource


def _local_gpu_resource(gpu):
    """The `gpu` resource of a job: `gpu`, except on this machine under the CUDA simulator, where a "GPU" job is
    one CPU thread: 0, so that simulator jobs run side by side on the cores (--cores) instead of one at a time,
    unless config key gpus names simulated GPUs (slots, as on a GPU machine). A cluster run (profiles/slurm) keeps
    `gpu`: its jobs ask for a GPU as on a real cluster. The executor is known once jobs are planned, when Snakemake
    evaluates this."""
    if not config["gpu"]["simulator"] or GPU_SLOTS:
        return gpu

    def resource(wildcards):
        return _needed(gpu, wildcards) if workflow.non_local_exec else 0

    return resource


def _gpu_resource(gpu, borrow):
    """A job's `gpu` resource: borrowed (_borrowed_gpu_resource) or its own (_local_gpu_resource), by `borrow`, a
    bool or a function of the wildcards."""
    if not callable(borrow):
        return _borrowed_gpu_resource(gpu) if borrow else _local_gpu_resource(gpu)
    borrowed, own = _borrowed_gpu_resource(gpu), _local_gpu_resource(gpu)

    def resource(wildcards):
        return _needed(borrowed if borrow(wildcards) else own, wildcards)

    return resource


def rule_resources(rule, timed=False, gpu=0, borrow=False):
    """A rule's resources, from its facts: whether its jobs are timed (True, or "both" for a GPU job that times
    CPU work too), whether they need a GPU (0/1 or a function of the wildcards) and whether they borrow it (the SVM:
    gpunn.placement --borrow, the GPU held only while the job computes on it, so Snakemake counts none on one
    machine). On one machine: gpu, and the `timing` resource of timed jobs (_timing_resource: config key timing). On
    Slurm, also memory, runtime, partition, account and --exclusive for timed jobs (gpunn.cluster, config key
    cluster), which local runs ignore; a borrowing job asks the cluster for its GPU as any GPU job."""
    local_gpu = _gpu_resource(gpu, borrow)
    one_machine = {"gpu": local_gpu, "timing": _timing_resource(timed, gpu)} if timed else {"gpu": local_gpu}
    return {**one_machine, **job_resources(config["cluster"], rule, timed=timed, gpu=gpu)}


def svm_kernel_device(method):
    """E6's kernel_device as an svm job of `method` gets it: auto stays auto (the job looks for a real GPU itself),
    except under gpu.simulator, where it is cpu (auto never picks the simulator; kernel_device: gpu runs there); gpu
    for method gpu-smo.
    gpu.enabled false has made it cpu already (gpunn.config)."""
    device = config["experiments"]["e6"]["kernel_device"]
    if method == "gpu-smo":
        return "gpu"  # it solves on the GPU (under gpu.simulator, the simulated one), where it computes its kernel
    return "cpu" if device == "auto" and config["gpu"]["simulator"] else device


def svm_borrows(wildcards):
    """Whether the svm job borrows its GPU (held only while it computes its kernels, libsvm then fitting on the CPU):
    not for method gpu-smo, which solves on the GPU and holds it for the whole job, as any GPU job."""
    return wildcards.method != "gpu-smo"


def svm_uses_gpu(wildcards):
    """Resource gpu of the svm job: 1 when it computes its kernel on the GPU, i.e. kernel_device gpu, or auto
    when this config's machine is a GPU (detected or named; not cpu, not the simulator)."""
    device = svm_kernel_device(wildcards.method)
    on_gpu_machine = config["machine"] not in (CPU_MACHINE, SIMULATOR_MACHINE)
    return 1 if device == "gpu" or (device == "auto" and on_gpu_machine) else 0


def svm_params(wildcards):
    """The svm job's settings from experiments.e6, less `method` (its wildcard): a method added to the list reruns
    no other method's job."""
    return {k: v for k, v in config["experiments"]["e6"].items() if k != "method"}


def job_prefix(timed=False, gpu=0, borrow=False):
    """params.env of a job's command (the same facts as rule_resources): the CUDA simulator for a GPU job under
    config key gpu.simulator, or a warm start (gpunn.warm) on a real GPU under warm_jobs, then gpunn.placement,
    which takes the job's GPU slot and, under timing: overlap, its cores ({threads} of them) before running the
    command."""

    def prefix(wildcards, threads):
        needed = bool(_needed(gpu, wildcards))
        simulator = "NUMBA_ENABLE_CUDASIM=1 " if needed and config["gpu"]["simulator"] else ""
        warm = "GPUNN_WARM=1 " if needed and config["warm_jobs"] and not config["gpu"]["simulator"] else ""
        return (
            simulator
            + warm
            + placement.prefix(
                threads, needed, timed, config["timing"], GPU_SLOTS, config["cpu_lanes"], _needed(borrow, wildcards)
            )
        )

    return prefix


def profile_args(wildcards):
    """A step_profile job's experiment's model, dataset, batch and widths as `gpunn profile` options."""
    return " ".join(shlex.quote(a) for a in profile_options(config, wildcards.experiment))


KEEP_DIVERGED = keep_diverged_runs(config)


def keep_diverged_option(wildcards, output):
    """--keep-diverged for a run that an experiment with keep_diverged: true requests (gpunn.targets.
    keep_diverged_runs). It takes `output`, so Snakemake counts it as derived from the outputs and does not record
    it among the params that trigger reruns: changing keep_diverged reruns no finished run, as with `threads`."""
    return "--keep-diverged" if format_run_path(wildcards) in KEEP_DIVERGED else ""


def download_input(wildcards):
    return [f"{R}/offline/{wildcards.dataset}/manifest.json"] if DATASETS[wildcards.dataset].offline else []


def offline_mirror(wildcards, input):
    """The folder an offline dataset is generated into, tried as a mirror (after config data.mirror_dir)."""
    return f"--mirror {os.path.dirname(input[0])}" if input else ""


def folder_of(kind, index=0):
    """Param function: the folder holding a job's first input or output file (`kind` "input" or "output")."""
    return lambda wildcards, input, output: os.path.dirname((input if kind == "input" else output)[index])


# The raw files of each on-disk format (what the download rules of workflow/rules/data.smk write).
RAW_FILES_BY_KIND = {}
for _spec in DATASETS.values():
    RAW_FILES_BY_KIND.setdefault(_spec.kind, tuple(_spec.files))


def raw_files(wildcards):
    return raw_outputs(config, wildcards.dataset)


def split_options(wildcards):
    """Only E2's split depends on splits.e2: the standard split's jobs never see (nor rerun for) it."""
    e2 = config["splits"]["e2"]
    return f"--e2-train {e2['train']} --e2-test {e2['test']} --seed {e2['seed']}" if wildcards.split == "e2" else ""


def report_args(inputs):
    """`gpunn report` options naming the run, eval and svm folders and the CSV and benchmark files
    (gpunn.targets.report_options)."""
    return " ".join(f"--{kind} " + " ".join(paths) for kind, paths in report_options(inputs).items())


def report_files(experiment):
    """Targets of the report: tables, PDFs and provenance.json as plain outputs, the PNG figures marked for
    `snakemake --report`, in the experiment's category, each with its own caption (the experiment's CAPTIONS,
    generated into workflow/report/captions/) and its paper's figure as a label."""
    found, files = experiments.get(experiment), []
    for path in report_outputs(config, experiment):
        if path.endswith(".png"):
            name = os.path.basename(path)
            key = found.caption_key(name)
            path = report(
                path,
                caption=f"../report/captions/{caption_file(experiment, key)}",
                category=report_category(experiment),
                labels={"figure": name, "mirrors": found.captions[key].paper},
            )
        files.append(path)
    return files


_REPORT_CHECKED = []  # report_category's one check: the refusal line, or None


def report_category(experiment):
    """A report figure's category, the experiment's name, as a function: `snakemake --report` calls it while it
    bundles the figures, once the DAG is built. If any job of this config must still run (its outputs missing or out
    of date: a failed or killed job, another config's figures on disk under the same names), it prints one line and
    exits 1 instead of bundling figures that are not this config's (gpunn.failures.stale_report_line)."""

    def category(wildcards):
        if not _REPORT_CHECKED:  # once per report: the DAG does not change while Snakemake bundles the figures
            _REPORT_CHECKED.append(failures.stale_report_line(job for job in workflow.dag.needrun_jobs() if job.output))
        refused = _REPORT_CHECKED[0]
        if refused:
            print(refused, file=sys.stderr, flush=True)
            sys.exit(1)
        return experiment.upper()

    return category


def report_front_page():
    """The first page of `snakemake --report`: index.rst of the report_index job, the papers' numbers beside ours
    with their provenance, once written; until then the static description saying how to build it."""
    built = os.path.abspath(index_outputs(config)[-1])  # results_dir is relative to the working directory
    return built if os.path.exists(built) else "workflow/report/workflow.rst"


def executing():
    """True while the main Snakemake process plans jobs it will run: not a dry run (-n), a summary (plugin None) or
    a cluster job's own Snakemake. Parsing and planning only read; the two checks below move or remove files only
    then, and under a dry run say what a run would do."""
    return workflow.is_main_process and workflow.executor_plugin is not None and not workflow.dryrun


def invalidate_changed_downloads(experiments, act):
    """A raw file that no longer matches its manifest (edited, replaced, truncated) makes that manifest a lie:
    remove the manifest (when `act`), so the download job reruns (re-verifying every file and re-fetching the bad
    ones) and, after it, everything that depends on the dataset."""
    from gpunn.data.integrity import MANIFEST, raw_status

    datasets = dict.fromkeys(d for e in experiments for d, _ in experiment_data(config, e))
    for dataset in datasets:
        raw = LAYOUT.raw_dir(dataset)
        manifest = os.path.join(raw, MANIFEST)
        if not os.path.exists(manifest):
            continue
        bad = {name: state for name, state in raw_status(dataset, raw).items() if state != "ok"}
        if bad:
            listed = ", ".join(f"{name} ({state})" for name, state in bad.items())
            if act:
                print(
                    f"gpunn: {raw}: {listed} no longer match {MANIFEST}; it is fetched again, and what depends "
                    "on it rerun",
                    file=sys.stderr,
                )
                os.remove(manifest)
            else:
                print(
                    f"gpunn: {raw}: {listed} no longer match {MANIFEST}; a run (not this dry run) fetches it "
                    "again and reruns what depends on it",
                    file=sys.stderr,
                )


def set_aside_edited(experiments, act):
    """Intermediate files changed by hand after their job (gpunn.targets.edited_intermediates) are moved to
    `<file>.edited` (when `act`): the job that makes them reruns, and everything that depends on them."""
    for path in edited_intermediates(config, experiments):
        if act:
            os.replace(path, f"{path}.edited")
            print(
                f"gpunn: {path} was changed after the job that wrote it; moved to {path}.edited, it is remade "
                "and what depends on it rerun",
                file=sys.stderr,
            )
        else:
            print(
                f"gpunn: {path} was changed after the job that wrote it; a run (not this dry run) moves it to "
                f"{path}.edited and remakes it",
                file=sys.stderr,
            )


def target_inputs(experiments):
    """The input function of the target rules all and e1 .. e6: the experiments' reports, and every planned
    intermediate file that is missing, so that removing one reruns it and what depends on it (see
    gpunn.targets.missing_intermediates). An input function runs when the DAG is built, once Snakemake knows
    whether it will execute (executing()); only the target asked for checks its files."""

    def inputs(wildcards):
        if workflow.is_main_process:
            invalidate_changed_downloads(experiments, executing())
            if not workflow.touch:  # --touch refreshes outputs on purpose
                set_aside_edited(experiments, executing())
        files = [f for e in experiments for f in report_outputs(config, e)]
        return files + missing_intermediates(config, experiments)

    return inputs
