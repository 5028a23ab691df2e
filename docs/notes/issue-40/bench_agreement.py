"""Issue 40, deliverable 6: do a run's epoch times agree with gpunn.bench of the same commit, within the noise?

    python bench_agreement.py REPORT_DIR BENCH_CSV [BENCH_CSV ...] [--verdict VERDICT_JSON]

REPORT_DIR: a machine's report folder (results/report/<machine>, or docs/results/<machine>) with e1/, e4/, e5/
summary.csv. BENCH_CSV: `python -m gpunn.bench mlp|cnn|autoencoder --out ...` files. Compared, per model and
variant: E1's MLP (mnist, mean reduction), E4's CNN (mnist), E5's autoencoder (its dataset), seconds per epoch, the
run's over the bench's. The noise of a kind: its band in gpunn overlap-verdict's verdict.json when given (the
prediction band of the same run timed alone, relative to their mean), else not judged. Prints a Markdown table.
"""

import argparse
import csv
import json
from pathlib import Path

ROWS = {"e1": ("mlp", {"dataset": "mnist", "reduction": "mean"}), "e4": ("cnn", {"dataset": "mnist"}),
        "e5": ("autoencoder", {})}


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
                found[(row["model"], row["variant"])] = float(row["epoch_s"])
    return found


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("bench", nargs="+")
    p.add_argument("--verdict", default=None)
    args = p.parse_args()
    runs, bench = run_epochs(Path(args.report)), bench_epochs(args.bench)
    noise = {}
    if args.verdict:
        for kind in json.loads(Path(args.verdict).read_text())["kinds"]:
            noise[(kind["model"], kind["variant"])] = float(kind["noise"])
    print("| model | variant | run s/epoch | bench s/epoch | run / bench | noise (alone band) | verdict |")
    print("|---|---|---:|---:|---:|---:|---|")
    for key in sorted(set(runs) & set(bench)):
        ratio = runs[key] / bench[key]
        spread = noise.get(key)
        verdict = "-" if spread is None else "within noise" if abs(ratio - 1) <= spread else "outside noise"
        shown = "-" if spread is None else f"{spread:.1%}"
        print(f"| {key[0]} | {key[1]} | {runs[key]:.4g} | {bench[key]:.4g} | {ratio:.3f} | {shown} | {verdict} |")
    for key in sorted(k for k in set(runs) ^ set(bench) if not k[1].startswith("torch")):
        print(f"| {key[0]} | {key[1]} | {runs.get(key, '-')} | {bench.get(key, '-')} | not in both | | |")


if __name__ == "__main__":
    main()
