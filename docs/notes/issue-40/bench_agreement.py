"""Issue 40, deliverable 6: do a run's epoch times agree with gpunn.bench of the same commit, within the noise?

    python bench_agreement.py REPORT_DIR BENCH_CSV [BENCH_CSV ...] [--verdict VERDICT_JSON] [--runs RUNS_DIR]

REPORT_DIR: a machine's report folder (results/report/<machine>, or docs/results/<machine>) with e1/, e4/, e5/
summary.csv. BENCH_CSV: `python -m gpunn.bench mlp|cnn|autoencoder --out ...` files. Compared, per model and
variant: E1's MLP (mnist, mean reduction), E4's CNN (mnist), E5's autoencoder (its dataset), seconds per epoch, the
published one (the mean over the run's epochs) over the bench's (the median of its epochs after the first). With
--runs (results/runs/<machine>), also the run over the bench's own epochs (the median of the run's epochs 2..E, E
the bench's epoch count, then the median over the run and its repeats `_x<k>`): a run's later epochs can drift
from its first. The noise of a kind: its band in gpunn overlap-verdict's verdict.json when given (the prediction
band of the same run timed alone, relative to their mean), else not judged; the verdict reads the same-epochs ratio
when there is one. Prints a Markdown table.
"""

import argparse
import csv
import json
import statistics
from pathlib import Path

ROWS = {"e1": ("mlp", {"dataset": "mnist", "reduction": "mean"}), "e4": ("cnn", {"dataset": "mnist"}),
        "e5": ("autoencoder", {})}
RUN_FOLDERS = {"mlp": "mnist/standard/mlp/{variant}/w256_b64_lr0.01_e10_s0",
               "cnn": "mnist/standard/cnn/{variant}/w16-32_b64_lr0.01_e5_s0",
               "autoencoder": "*/standard/autoencoder/{variant}/w256-128_b64_lr0.002_e*_s0"}


def run_epochs(report: Path) -> dict:
    found = {}
    for experiment, (model, where) in ROWS.items():
        path = report / experiment / "summary.csv"
        if not path.is_file():
            continue
        for row in csv.DictReader(path.read_text().splitlines()):
            if all(row.get(k, v) == v for k, v in where.items()) and row.get("time_per_epoch_s"):
                found.setdefault((model, row["variant"]), float(row["time_per_epoch_s"]))
    return found


def bench_epochs(paths) -> dict:
    found = {}
    for path in paths:
        for row in csv.DictReader(Path(path).read_text().splitlines()):
            if row.get("batch") == "64" and row.get("epoch_s"):
                found[(row["model"], row["variant"])] = (float(row["epoch_s"]), int(row["epochs"]))
    return found


def same_epochs(runs: Path, model: str, variant: str, epochs: int) -> float | None:
    """The median of the run's epochs 2..epochs (epoch 1 alone when it has one), then over its repeats."""
    pattern = RUN_FOLDERS[model].format(variant=variant)
    folders = sorted(runs.glob(pattern)) + sorted(runs.glob(pattern + "_x*"))
    medians = []
    for folder in folders:
        path = folder / "metrics.csv"
        if not path.is_file():
            continue
        seconds = [float(r["epoch_time_s"]) for r in csv.DictReader(path.read_text().splitlines())]
        kept = seconds[1:epochs] if len(seconds) > 1 and epochs > 1 else seconds[:1]
        medians.append(statistics.median(kept))
    return statistics.median(medians) if medians else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("bench", nargs="+")
    p.add_argument("--verdict", default=None)
    p.add_argument("--runs", default=None)
    args = p.parse_args()
    runs, bench = run_epochs(Path(args.report)), bench_epochs(args.bench)
    noise = {}
    if args.verdict:
        for kind in json.loads(Path(args.verdict).read_text())["kinds"]:
            noise[(kind["model"], kind["variant"])] = float(kind["noise"])
    print("| model | variant | run s/epoch (published) | bench s/epoch | published / bench | run over the bench's "
          "epochs / bench | noise (alone band) | verdict |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for key in sorted(set(runs) & set(bench)):
        (bench_s, epochs), ratio = bench[key], runs[key] / bench[key][0]
        same = same_epochs(Path(args.runs), *key, epochs) if args.runs else None
        judged = ratio if same is None else same / bench_s
        spread = noise.get(key)
        verdict = "-" if spread is None else "within noise" if abs(judged - 1) <= spread else "outside noise"
        shown = "-" if spread is None else f"{spread:.1%}"
        same_text = "-" if same is None else f"{same / bench_s:.3f}"
        print(f"| {key[0]} | {key[1]} | {runs[key]:.4g} | {bench_s:.4g} | {ratio:.3f} | {same_text} | {shown} | "
              f"{verdict} |")
    for key in sorted(k for k in set(runs) ^ set(bench) if not k[1].startswith("torch")):
        shown = runs.get(key) or bench.get(key, ("-",))[0]
        where = "the run only" if key in runs else "the bench only"
        print(f"| {key[0]} | {key[1]} | {shown:.4g} | | | | | {where} |")


if __name__ == "__main__":
    main()
