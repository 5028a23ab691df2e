"""Is a finished run's `timing: overlap` honest? Each job kind's clock in the run against the same job timed alone.

    python -m gpunn overlap-verdict --results DIR [--machine M] [--repeats 5] [--max-epoch-s 3] [--threads T]
                                    [--gpus auto|N] [--out DIR]

A job kind is a model and a training variant (cpu-serial, cpu-numpy's MLP, CNN and autoencoder, each GPU variant).
Per kind, among the run's runs timed under overlap: the one with the most repeats (`_x<k>`), then the longest, then
the first by path. Each kind's run is timed again alone, placed by gpunn.placement as timing: isolated places a
timed job (the timing lock, `threads` threads, a GPU job on the first GPU): as many of the run's epochs as fit in
--max-epoch-s (at least one; an epoch longer than that on a training subset of whole batches that keeps it near
--max-epoch-s), tested on TEST_SAMPLES samples (outside the clock); `repeats` rounds, each timing every kind once,
so that a kind's alone runs lie minutes apart. The run's clock is taken over the same epochs (its metrics.csv), in
seconds per training step, the mean over the run and its repeats.
Verdict: within noise when that clock lies in the alone runs' prediction band, mean +- t * s * sqrt(1/k + 1/n) (s
their standard deviation, n of them, k the run's repeats), t for 95 % over all the kinds together (Bonferroni): when
overlap changes no clock, every kind lies within its band in 19 runs of 20. Writes verdict.csv (every alone run),
verdict.md and verdict.json into --out (default <results>/overlap-verdict/<machine>, where the reports read it:
gpunn.report.runs.trust_overlap). Run it on the run's machine, otherwise idle.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpunn import io, placement
from gpunn.backends.registry import uses_gpu
from gpunn.config import detect_gpu_ids
from gpunn.errors import GpunnError
from gpunn.overlap_check import run_together
from gpunn.runspec import RunSpec, parse_run_path
from gpunn.targets import VERDICT_FOLDER

TEST_SAMPLES = 64
FAMILY_CONFIDENCE = 0.95  # for the whole run: every kind within its band when overlap changes nothing
RUN_COLUMNS = ("model", "variant", "repeat", "run", "steps", "seconds_per_epoch", "seconds_per_step", "cores", "gpu")


@dataclasses.dataclass
class Kind:
    """One job kind of the run: its chosen run, that run's epoch times in the run (with its repeats), the alone
    runs' seconds per step and how many epochs each trained."""

    model: str
    variant: str
    base: RunSpec
    n_train: int  # the chosen run's training samples (its subset applied)
    threads: int
    run_epochs: list[list[float]]  # per run (it and its repeats): seconds of each epoch in the run
    run_epoch_s: float
    finished: dict = dataclasses.field(default_factory=dict)  # run path -> finished_at of the run and its repeats
    alone: list[float] = dataclasses.field(default_factory=list)
    alone_epochs: int = 0  # epochs of each alone run (0: the run's own)

    def run_s_per_step(self) -> list[float]:
        """Per run, seconds per step over the epochs the alone runs trained (the first `alone_epochs`)."""
        steps = _steps(self.n_train, self.base.batch)
        first = self.alone_epochs or None
        return [statistics.fmean(times[:first]) / steps for times in self.run_epochs]

    def verdict(self, kinds: int = 1) -> dict:
        """The run's clock against the alone runs' prediction band, at FAMILY_CONFIDENCE over `kinds` kinds."""
        from scipy.stats import t  # scikit-learn's own dependency

        run_values = self.run_s_per_step()
        run, alone = statistics.fmean(run_values), statistics.fmean(self.alone)
        n, k = len(self.alone), len(run_values)
        quantile = float(t.ppf(1.0 - (1.0 - FAMILY_CONFIDENCE) / (2 * kinds), n - 1))
        half = quantile * statistics.stdev(self.alone) * math.sqrt(1.0 / k + 1.0 / n)
        return {"model": self.model, "variant": self.variant, "run": self.base.path,
                "run_repeats": k, "run_ms_per_step": run * 1e3, "alone_ms_per_step": alone * 1e3,
                "alone_range": f"{min(self.alone) * 1e3:.4g}-{max(self.alone) * 1e3:.4g}",
                "change": run / alone - 1.0, "noise": half / alone, "within_noise": abs(run - alone) <= half}


def _steps(n_train: int, batch: int) -> int:
    return math.ceil(n_train / batch)


def _only_machine(results: Path) -> str:
    machines = sorted(p.name for p in (results / "runs").glob("*") if p.is_dir())
    if len(machines) != 1:
        raise GpunnError(f"overlap-verdict: {results / 'runs'} holds {len(machines)} machine folders "
                         f"({', '.join(machines) or 'none'}); name one with --machine")
    return machines[0]


def _epoch_times(path: Path) -> list[float]:
    """Each epoch's seconds from a run's metrics.csv (none when it is missing or has no epoch_time_s)."""
    if not path.is_file():
        return []
    rows = csv.DictReader(path.read_text().splitlines())
    return [float(row["epoch_time_s"]) for row in rows if row.get("epoch_time_s")]


def overlap_runs(results: Path, machine: str) -> list[dict]:
    """Every run of `machine` in `results` timed under overlap: its spec, seconds per step and epoch, threads."""
    root = results / "runs" / machine
    if not root.is_dir():
        raise GpunnError(f"overlap-verdict: {root} holds no runs; give the --results and --machine of a finished run")
    found = []
    for path in sorted(root.rglob("metrics.json")):
        metrics = json.loads(path.read_text())
        prov = metrics.get("provenance") or {}
        if prov.get("timing_mode") != "overlap":
            continue
        spec = parse_run_path(path.parent.relative_to(root).as_posix())
        epoch = float(metrics["mean_epoch_time_s"])
        found.append({"spec": spec, "n_train": int(metrics["n_train"]), "epoch_s": epoch,
                      "epochs": _epoch_times(path.parent / "metrics.csv") or [epoch],
                      "threads": int(prov.get("blas_threads") or 1), "commit": prov.get("commit"),
                      "finished_at": metrics.get("finished_at")})
    if not found:
        raise GpunnError(f"overlap-verdict: no run under {root} was timed under timing: overlap")
    return found


def job_kinds(runs: list[dict], threads: int) -> list[Kind]:
    """One Kind per model and variant (the run with the most repeats, then the longest, then the first by path)."""
    groups: dict[tuple[str, str], dict[RunSpec, list[dict]]] = {}
    for run in runs:
        spec = run["spec"]
        bases = groups.setdefault((spec.model, spec.variant), {})
        bases.setdefault(dataclasses.replace(spec, repeat=0), []).append(run)
    kinds = []
    for (model, variant), bases in sorted(groups.items()):
        base, members = min(bases.items(), key=lambda item: (-len(item[1]), -sum(m["epoch_s"] * m["spec"].epochs
                                                                                  for m in item[1]), item[0].path))
        kinds.append(Kind(model, variant, base, members[0]["n_train"], threads, [m["epochs"] for m in members],
                          statistics.median(m["epoch_s"] for m in members),
                          {m["spec"].path: m["finished_at"] for m in members}))
    return kinds


def alone_spec(kind: Kind, max_epoch_s: float) -> RunSpec:
    """The kind's run timed alone for about max_epoch_s of epochs: as many of its own epochs as fit (at most the
    run's, at least one), and an epoch longer than that on the first whole batches that keep it near max_epoch_s."""
    steps = _steps(kind.n_train, kind.base.batch)
    subset = kind.base.subset
    if kind.run_epoch_s > max_epoch_s:
        keep = max(1, math.floor(steps * max_epoch_s / kind.run_epoch_s))
        subset = min(kind.n_train, keep * kind.base.batch)
    epochs = max(1, min(kind.base.epochs, math.floor(max_epoch_s / kind.run_epoch_s)))
    return dataclasses.replace(kind.base, epochs=epochs, subset=subset, repeat=0)


def _command(spec: RunSpec, data: Path, out: Path, threads: int, gpu: str | None):
    prefix = placement.prefix(threads, gpu is not None, True, "isolated", [gpu] if gpu is not None else [])
    command = (f"{prefix}{sys.executable} -m gpunn train {spec.path} --data {data} --out {out} "
               f"--test-samples {TEST_SAMPLES}")
    env = {**os.environ, **{v: str(threads) for v in placement.THREAD_VARIABLES}}
    env.pop("GPUNN_WARM", None)
    return command.split(), env


def measure(kinds: list[Kind], results: Path, out: Path, repeats: int, max_epoch_s: float, gpus: list[str],
            log: Callable[[str], None] = print) -> list[dict]:
    """Every kind's run alone, in `repeats` rounds of one run per kind; every alone run as a RUN_COLUMNS row."""
    planned = []
    for kind in kinds:
        spec = alone_spec(kind, max_epoch_s)
        data = results / "data" / "prepared" / spec.dataset / f"{spec.split}.npz"
        if not data.is_file():
            raise GpunnError(f"overlap-verdict: {data} is missing; the run's prepared data must still be there")
        gpu = gpus[0] if uses_gpu(spec.variant) else None
        folder = out / "runs" / spec.variant / spec.model
        kind.alone_epochs = spec.epochs
        planned.append((kind, spec, _steps(spec.subset or kind.n_train, spec.batch), folder,
                        _command(spec, data, folder, kind.threads, gpu)))
    rows = []
    for repeat in range(1, repeats + 1):
        started = time.perf_counter()
        for kind, spec, steps, folder, (command, env) in planned:
            result = run_together([(f"{kind.model} {kind.variant}", command, env, folder)])[0]
            kind.alone.append(result["seconds"] / steps)
            rows.append({"model": kind.model, "variant": kind.variant, "repeat": repeat, "run": spec.path,
                         "steps": steps, "seconds_per_epoch": result["seconds"],
                         "seconds_per_step": result["seconds"] / steps, "cores": result["cores"], "gpu": result["gpu"]})
        log(f"overlap-verdict: round {repeat} of {repeats}: {len(planned)} kinds alone in "
            f"{time.perf_counter() - started:.0f} s")
    for kind in kinds:
        v = kind.verdict(len(kinds))
        log(f"overlap-verdict: {kind.model} {kind.variant}: in the run {v['run_ms_per_step']:.4g} ms a step, alone "
            f"{v['alone_ms_per_step']:.4g} ({v['alone_range']}), {v['change']:+.1%} against a band of "
            f"+-{v['noise']:.1%}")
    return rows


def markdown(verdicts: list[dict], machine: str, repeats: int, max_epoch_s: float) -> str:
    """verdict.md: the kinds' verdicts (Kind.verdict) as a table and the whole run's answer."""
    outside = [f"{v['model']} {v['variant']}" for v in verdicts if not v["within_noise"]]
    lines = [f"# timing: overlap against alone, {machine}", "",
             "Every job kind's clock in the run (timed under overlap: seconds per training step over the epochs the "
             f"alone runs trained, the mean over its chosen run and that run's repeats) against the same run timed "
             f"alone in {repeats} rounds, each timing every kind once (timing: isolated's placement; about "
             f"{max_epoch_s:g} s of the run's epochs each, one epoch on a training subset where the run's epoch was "
             "longer). Band: the alone runs' prediction band for the run's clock, t s sqrt(1/k + 1/n) around their "
             f"mean, t for {FAMILY_CONFIDENCE:.0%} over all {len(verdicts)} kinds together (Bonferroni): when overlap "
             "changes no clock, every kind lies within its band in 19 runs of 20. A wide band says the alone runs "
             "vary too much to show a change that small.", "",
             "| model | variant | run | repeats in the run | in the run | alone (mean) | alone range | change | "
             "band | verdict |", "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    lines += [f"| {v['model']} | {v['variant']} | `{v['run']}` | {v['run_repeats']} | {v['run_ms_per_step']:.4g} | "
              f"{v['alone_ms_per_step']:.4g} | {v['alone_range']} | {v['change']:+.1%} | +-{v['noise']:.1%} | "
              f"{'within noise' if v['within_noise'] else 'outside noise'} |" for v in verdicts]
    lines += ["", "Every job kind within its noise: " + ("yes." if not outside else f"no: {', '.join(outside)}.")]
    return "\n".join(lines) + "\n"


def run(args, log: Callable[[str], None] = print) -> list[dict]:
    start = time.perf_counter()
    results = Path(args.results)
    machine = args.machine or _only_machine(results)
    out = Path(args.out) if args.out else results / VERDICT_FOLDER / machine
    runs = overlap_runs(results, machine)
    threads = args.threads or max(r["threads"] for r in runs)
    kinds = job_kinds(runs, threads)
    gpus = detect_gpu_ids() if args.gpus == "auto" else [str(i) for i in range(int(args.gpus))]
    needing = [f"{k.model} {k.variant}" for k in kinds if uses_gpu(k.variant)]
    if needing and not gpus:
        raise GpunnError(f"overlap-verdict: the run has GPU jobs ({', '.join(needing)}) and no GPU was found "
                         "(nvidia-smi, CUDA_VISIBLE_DEVICES); give --gpus N")
    log(f"overlap-verdict: {len(kinds)} job kinds of {len(runs)} overlap-timed runs, {args.repeats} rounds of "
        "alone runs")
    rows = measure(kinds, results, out, args.repeats, args.max_epoch_s, gpus, log)
    verdicts = [k.verdict(len(kinds)) for k in kinds]
    io.write_rows_csv(out / "verdict.csv", RUN_COLUMNS, rows)
    text = markdown(verdicts, machine, args.repeats, args.max_epoch_s)
    io.write_text(out / "verdict.md", text)
    commits = sorted({str(r["commit"]) for r in runs})
    io.write_json(out / "verdict.json", {
        "machine": machine, "commit": ", ".join(commits), "repeats": args.repeats, "max_epoch_s": args.max_epoch_s,
        "kinds": verdicts, "runs": {path: at for k in kinds for path, at in k.finished.items()},
        "every_kind_within_noise": all(v["within_noise"] for v in verdicts)})
    print(text, flush=True)
    log(f"overlap-verdict: {len(rows)} alone runs in {time.perf_counter() - start:.0f} s")
    return verdicts
