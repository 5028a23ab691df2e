"""Does overlapping timed jobs change their times? The same training runs timed alone and side by side.

    python -m gpunn overlap-check --cpu RUN --cpu-data NPZ --gpu RUN --gpu-data NPZ [--threads T] [--gpus auto|N]
                                  [--repeats 3] [--scenario all|cpu|gpu|placement|untimed] --out DIR

Each repeat runs, one after another: the CPU run alone, the GPU run alone on the first GPU (and, with two GPUs, on
the second), then both at once (the CPU-timed job beside the GPU-timed one, as config key `timing: overlap` lets the
pipeline run them; the CPU run starts when the GPU run's warm-up has ended, so that its epoch meets the GPU's) and,
with two GPUs, two GPU runs at once, one per GPU; a job's alone time serves both scenarios. --scenario untimed: the
CPU run beside an untimed run (--neighbour, default the CPU run itself) placed as the pipeline places its untimed jobs,
on the other cores (--neighbour-threads, default all of them), started first. Every run goes through
gpunn.placement with timing overlap, alone too, so that it has the same cores and GPU both ways and only its
neighbour differs. The figure compared is the run's own timing, metrics.json's mean epoch time (what the reports
use). The run-to-run noise is the spread (max - min) / median of a job's alone repeats; a change of the median
within it is "within noise". Writes overlap.csv (every run) and overlap.md (the comparison) into DIR; the runs'
weights are deleted. Run it on an otherwise idle machine: it measures what the machine does besides.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from gpunn import io, placement
from gpunn.config import detect_gpu_ids
from gpunn.epochs import WARMED_UP
from gpunn.errors import GpunnError
from gpunn.runspec import parse_run_path

PLACEMENT = "placed against unplaced"  # --scenario placement: each run alone, placed (overlap) and not (isolated)
UNTIMED = "cpu beside untimed cpu"  # --scenario untimed: the CPU run beside an untimed run on the other cores
COLUMNS = ("scenario", "repeat", "job", "together", "gpu", "cores", "seconds", "train_loss")


def _job(name, run, data, out, threads, gpu=None, placed=True, timed=True):
    """One training run: (name, command, environment). Placed as timing: overlap places it (its cores, its GPU), or
    not (`placed` false: as under timing: isolated, `threads` threads on any core, the GPU `gpu` named); `timed`
    false: placed as an untimed job (cores from the highest down, no timing lock), as the pipeline's evaluate,
    features and SVM jobs run."""
    spec = parse_run_path(run)  # a bad run path stops here, with its one line
    prefix = placement.prefix(threads, gpu is not None, timed, "overlap", [gpu] if gpu is not None else [])
    command = f"{prefix if placed else ''}{sys.executable} -m gpunn train {spec.path} --data {data} --out {out}"
    env = {**os.environ, **{v: str(threads) for v in placement.THREAD_VARIABLES}}
    if not placed and gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return name, command.split(), env, Path(out)


class _Started:
    """A started job: its process, its output as it comes, and whether its warm-up has ended."""

    def __init__(self, name, command, env, out):
        shutil.rmtree(out, ignore_errors=True)
        self.name, self.out, self.lines, self.warm = name, out, [], threading.Event()
        self.proc = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if WARMED_UP in line:
                self.warm.set()
        self.warm.set()  # ended (or failed) without saying so: nobody waits for it any longer

    def result(self) -> dict:
        self.proc.wait()
        self.reader.join()
        if self.proc.returncode != 0:
            last = "".join(self.lines).strip().splitlines()[-1:] or ["no output"]
            raise GpunnError(f"overlap-check: the {self.name} run failed (exit {self.proc.returncode}): {last[0]}")
        metrics = json.loads((self.out / "metrics.json").read_text())
        prov = metrics.get("provenance", {})
        (self.out / "weights.npz").unlink(missing_ok=True)
        return {"job": self.name, "gpu": prov.get("gpu_slot"), "cores": prov.get("cores"),
                "seconds": float(metrics["mean_epoch_time_s"]), "train_loss": float(metrics["final_train_loss"])}


def run_together(jobs, stagger: bool = False) -> list[dict]:
    """Run the jobs at once, each one's placement and mean epoch time. `stagger`: the last job starts once the
    first has warmed up (its kernels compiled), so that its epochs run while the first one's do (a CPU epoch is
    shorter than a GPU job's compile)."""
    started = [_Started(*job) for job in (jobs[:-1] if stagger else jobs)]
    if stagger:
        started[0].warm.wait()
        started.append(_Started(*jobs[-1]))
    return [job.result() for job in started]


def scenarios(args, gpus: list[str]) -> list[tuple[str, list, list]]:
    """(scenario, jobs): the CPU run beside the GPU run; two GPU runs on two GPUs; --scenario placement: each run
    placed as timing: overlap places it against unplaced, as under isolated (`threads` threads, any core)."""
    root = Path(args.out) / "runs"
    cpu = _job("cpu", args.cpu, args.cpu_data, root / "cpu", args.threads)
    gpu0 = _job(f"gpu on {gpus[0]}", args.gpu, args.gpu_data, root / "gpu0", 1, gpus[0]) if gpus else None
    found = [("cpu beside gpu", [gpu0, cpu])] if args.scenario in ("all", "cpu") else []
    if len(gpus) >= 2 and args.scenario in ("all", "gpu"):
        gpu1 = _job(f"gpu on {gpus[1]}", args.gpu, args.gpu_data, root / "gpu1", 1, gpus[1])
        found.append(("gpu beside gpu", [gpu0, gpu1]))
    if args.scenario == "untimed":  # the CPU run beside untimed CPU work on the other cores
        threads = getattr(args, "neighbour_threads", None) or max(1, len(os.sched_getaffinity(0)) - args.threads)
        neighbour = _job("untimed neighbour", getattr(args, "neighbour", None) or args.cpu,
                         getattr(args, "neighbour_data", None) or args.cpu_data, root / "neighbour", threads,
                         timed=False)
        found = [(UNTIMED, [neighbour, cpu])]
    if args.scenario == "placement":  # each run alone, placed and unplaced
        unplaced_cpu = _job("cpu", args.cpu, args.cpu_data, root / "cpu-unplaced", args.threads, placed=False)
        unplaced_gpu = _job(gpu0[0], args.gpu, args.gpu_data, root / "gpu0-unplaced", args.threads, gpus[0],
                            placed=False)
        found += [(PLACEMENT, [cpu, unplaced_cpu]), (PLACEMENT, [gpu0, unplaced_gpu])]
    return found


def measure(args, log: Callable[[str], None] = print) -> pd.DataFrame:
    gpus = detect_gpu_ids() if args.gpus == "auto" else [str(i) for i in range(int(args.gpus))]
    if not gpus and args.scenario != "untimed":
        raise GpunnError("overlap-check: no GPU found (nvidia-smi, CUDA_VISIBLE_DEVICES); give --gpus N")
    rows = []
    for repeat in range(1, args.repeats + 1):
        found = scenarios(args, gpus)
        alone = {}
        for job in {j[0]: j for scenario, jobs in found if scenario != PLACEMENT for j in jobs}.values():  # once
            alone[job[0]] = run_together([job])[0]
            log(f"overlap-check: repeat {repeat}: {job[0]} alone {alone[job[0]]['seconds']:.4f} s/epoch")
        for scenario, (placed, unplaced) in ((s, jobs) for s, jobs in found if s == PLACEMENT):
            rows += [{"scenario": scenario, "repeat": repeat, "together": False, **run_together([unplaced])[0]},
                     {"scenario": scenario, "repeat": repeat, "together": True, **run_together([placed])[0]}]
            log(f"overlap-check: repeat {repeat}, {placed[0]}: unplaced {rows[-2]['seconds']:.4f}, placed "
                f"{rows[-1]['seconds']:.4f} s/epoch")
        for scenario, jobs in ((s, jobs) for s, jobs in found if s != PLACEMENT):
            rows += [{"scenario": scenario, "repeat": repeat, "together": False, **alone[job[0]]} for job in jobs]
            both = run_together(jobs, stagger=scenario in ("cpu beside gpu", UNTIMED))
            rows += [{"scenario": scenario, "repeat": repeat, "together": True, **r} for r in both]
            log(f"overlap-check: repeat {repeat}, {scenario}: together "
                + ", ".join(f"{r['job']} {r['seconds']:.4f}" for r in both) + " s/epoch")
    return pd.DataFrame(rows, columns=list(COLUMNS))


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and job: the medians alone and together, the change, the alone repeats' spread (the noise)."""
    out = []
    for (scenario, job), rows in frame.groupby(["scenario", "job"], sort=False):
        alone, together = rows[~rows["together"]]["seconds"], rows[rows["together"]]["seconds"]
        median = float(alone.median())
        noise = float((alone.max() - alone.min()) / median)
        change = float(together.median() / median - 1.0)
        out.append({"scenario": scenario, "job": job, "alone_s": median, "together_s": float(together.median()),
                    "alone_range": f"{alone.min():.4f}-{alone.max():.4f}",
                    "together_range": f"{together.min():.4f}-{together.max():.4f}",
                    "change": change, "noise": noise,
                    "verdict": "within noise" if abs(change) <= noise else "outside noise"})
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame, frame: pd.DataFrame, args) -> str:
    lines = ["# Timed jobs alone and side by side", "",
             f"CPU run `{args.cpu}` ({args.threads} threads), GPU run `{args.gpu}`; {args.repeats} repeats; seconds "
             "per epoch from each run's metrics.json. Noise: (max - min) / median of the alone repeats. "
             f"'{PLACEMENT}': 'alone' is the run unplaced (as under timing: isolated: {args.threads} threads, any "
             "core), 'together' the same run alone, placed as under timing: overlap (its cores, one for a GPU run).",
             "",
             "| scenario | job | alone (median) | alone range | together (median) | together range | change | "
             "noise | verdict |", "|---|---|---:|---|---:|---|---:|---:|---|"]
    lines += [f"| {r.scenario} | {r.job} | {r.alone_s:.4f} | {r.alone_range} | {r.together_s:.4f} | "
              f"{r.together_range} | {r.change:+.1%} | {r.noise:.1%} | {r.verdict} |" for r in table.itertuples()]
    same = {run: bool((rows["train_loss"] == rows["train_loss"].iloc[0]).all())
            for run, rows in frame.assign(run=frame["job"].str.split(" ").str[0]).groupby("run", sort=False)}
    lines += ["", "Final train loss the same in every run of a job (alone, together, on either GPU): " + "; ".join(
        f"{run} {'yes' if equal else 'no'}" for run, equal in same.items()) + "."]
    places = frame.drop_duplicates(subset=["job"])[["job", "gpu", "cores"]]
    lines += ["", "Placement: " + "; ".join(f"{r.job}: GPU {r.gpu if isinstance(r.gpu, str) else '-'}, cores {r.cores}"
                                            for r in places.itertuples()) + "."]
    return "\n".join(lines) + "\n"


def run(args, log: Callable[[str], None] = print) -> pd.DataFrame:
    start = time.perf_counter()
    frame = measure(args, log)
    table = compare(frame)
    io.write_csv(Path(args.out) / "overlap.csv", frame)
    io.write_text(Path(args.out) / "overlap.md", markdown(table, frame, args))
    print(markdown(table, frame, args), flush=True)
    log(f"overlap-check: {len(frame)} runs in {time.perf_counter() - start:.0f} s")
    return table
