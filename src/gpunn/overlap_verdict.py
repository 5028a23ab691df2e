"""Is a finished run's `timing: overlap` honest? Each job kind's clock in the run against the same job timed alone.

    python -m gpunn overlap-verdict --results DIR [--machine M] [--repeats 3] [--max-epoch-s 5] [--threads T]
                                    [--gpus auto|N] [--out DIR]

A job kind is a model and a training variant (cpu-serial, cpu-numpy's MLP, CNN and autoencoder, each GPU variant).
Per kind, among the run's runs timed under overlap: the one with the most repeats (`_x<k>`), then the longest, then
the first by path; its clock in the run is the median, over it and its repeats, of seconds per training step (mean
epoch time / steps per epoch). Then, one after another, each kind's run again alone, `repeats` times, placed by
gpunn.placement as timing: isolated places a timed job (the timing lock, `threads` threads, a GPU job on the first
GPU): as many of the run's epochs as fit in --max-epoch-s (at least one; an epoch longer than that on a training
subset of whole batches that keeps it near --max-epoch-s), tested on TEST_SAMPLES samples (outside the clock).
Verdict: within noise when the run's seconds per step differ from the alone repeats' median by no more than their
spread (max - min). Writes verdict.csv (every alone run), verdict.md and verdict.json into --out (default
<results>/overlap-verdict/<machine>, where the reports read it: gpunn.report.runs.trust_overlap). Run it on the run's
machine, otherwise idle.
"""

from __future__ import annotations

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
RUN_COLUMNS = ("model", "variant", "repeat", "run", "steps", "seconds_per_epoch", "seconds_per_step", "cores", "gpu")


@dataclasses.dataclass
class Kind:
    """One job kind of the run: its chosen run, that run's clock in the run (with its repeats), the alone runs."""

    model: str
    variant: str
    base: RunSpec
    n_train: int  # the chosen run's training samples (its subset applied)
    threads: int
    run_s_per_step: list[float]
    run_epoch_s: float
    finished: dict = dataclasses.field(default_factory=dict)  # run path -> finished_at of the run and its repeats
    alone: list[float] = dataclasses.field(default_factory=list)

    def verdict(self) -> dict:
        run = statistics.median(self.run_s_per_step)
        alone = statistics.median(self.alone)
        noise = (max(self.alone) - min(self.alone)) / alone
        change = run / alone - 1.0
        return {"model": self.model, "variant": self.variant, "run": self.base.path,
                "run_repeats": len(self.run_s_per_step), "run_ms_per_step": run * 1e3,
                "alone_ms_per_step": alone * 1e3,
                "alone_range": f"{min(self.alone) * 1e3:.4g}-{max(self.alone) * 1e3:.4g}",
                "change": change, "noise": noise, "within_noise": abs(change) <= noise}


def _steps(n_train: int, batch: int) -> int:
    return math.ceil(n_train / batch)


def _only_machine(results: Path) -> str:
    machines = sorted(p.name for p in (results / "runs").glob("*") if p.is_dir())
    if len(machines) != 1:
        raise GpunnError(f"overlap-verdict: {results / 'runs'} holds {len(machines)} machine folders "
                         f"({', '.join(machines) or 'none'}); name one with --machine")
    return machines[0]


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
                      "s_per_step": epoch / _steps(int(metrics["n_train"]), spec.batch),
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
        kinds.append(Kind(model, variant, base, members[0]["n_train"], threads,
                          [m["s_per_step"] for m in members], statistics.median(m["epoch_s"] for m in members),
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
    """Each kind's run alone, `repeats` times, one after another; every alone run as a RUN_COLUMNS row."""
    rows = []
    for kind in kinds:
        spec = alone_spec(kind, max_epoch_s)
        data = results / "data" / "prepared" / spec.dataset / f"{spec.split}.npz"
        if not data.is_file():
            raise GpunnError(f"overlap-verdict: {data} is missing; the run's prepared data must still be there")
        gpu = gpus[0] if uses_gpu(spec.variant) else None
        steps = _steps(spec.subset or kind.n_train, spec.batch)
        folder = out / "runs" / spec.variant / spec.model
        command, env = _command(spec, data, folder, kind.threads, gpu)
        for repeat in range(1, repeats + 1):
            result = run_together([(f"{kind.model} {kind.variant}", command, env, folder)])[0]
            kind.alone.append(result["seconds"] / steps)
            rows.append({"model": kind.model, "variant": kind.variant, "repeat": repeat, "run": spec.path,
                         "steps": steps, "seconds_per_epoch": result["seconds"],
                         "seconds_per_step": result["seconds"] / steps, "cores": result["cores"], "gpu": result["gpu"]})
        v = kind.verdict()
        log(f"overlap-verdict: {kind.model} {kind.variant}: in the run {v['run_ms_per_step']:.4g} ms a step, alone "
            f"{v['alone_ms_per_step']:.4g} ({v['alone_range']}), {v['change']:+.1%} against a spread of "
            f"{v['noise']:.1%}")
    return rows


def markdown(verdicts: list[dict], machine: str, repeats: int, max_epoch_s: float) -> str:
    """verdict.md: the kinds' verdicts (Kind.verdict) as a table and the whole run's answer."""
    outside = [f"{v['model']} {v['variant']}" for v in verdicts if not v["within_noise"]]
    lines = [f"# timing: overlap against alone, {machine}", "",
             f"Every job kind's clock in the run (timed under overlap: the median over its chosen run and that run's "
             f"repeats) against the same run timed alone, {repeats} times one after another (timing: isolated's "
             f"placement; about {max_epoch_s:g} s of the run's epochs each, one epoch on a training subset where the "
             "run's epoch was longer): milliseconds per training step. Spread: (max - min) / median of the alone "
             "runs; within noise when the change is no larger.", "",
             "| model | variant | run | repeats in the run | in the run | alone (median) | alone range | change | "
             "spread | verdict |", "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    lines += [f"| {v['model']} | {v['variant']} | `{v['run']}` | {v['run_repeats']} | {v['run_ms_per_step']:.4g} | "
              f"{v['alone_ms_per_step']:.4g} | {v['alone_range']} | {v['change']:+.1%} | {v['noise']:.1%} | "
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
    log(f"overlap-verdict: {len(kinds)} job kinds of {len(runs)} overlap-timed runs, {args.repeats} alone runs each")
    rows = measure(kinds, results, out, args.repeats, args.max_epoch_s, gpus, log)
    verdicts = [k.verdict() for k in kinds]
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
