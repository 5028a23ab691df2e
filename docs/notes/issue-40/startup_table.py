"""Issue 40: the per-job start-up of a pipeline run's training jobs, from the run's own clocks: start-up = the job's
wall time (its Snakemake benchmark, `s`: the placement wrapper and the job's process from start to exit) minus its
epochs (metrics.json total_train_time_s), beside the run's own split (metrics.json "startup": data, build, test
passes, kernels loaded/compiled). Prints markdown: per model and variant the min, median and max over its jobs, then
every GPU job of the MLP and the CNN (E1, E2, E4).

    python startup_table.py RESULTS_DIR
"""

import json
import statistics
import sys
from pathlib import Path


def rows(results: Path) -> list[dict]:
    out = []
    for bench in sorted((results / "benchmarks" / "train").glob("*/**/*.tsv")):
        relative = bench.relative_to(results / "benchmarks" / "train").with_suffix("")
        metrics_path = results / "runs" / relative / "metrics.json"
        lines = bench.read_text().splitlines()
        if len(lines) < 2 or not metrics_path.exists():
            continue
        wall = float(dict(zip(lines[0].split("\t"), lines[1].split("\t")))["s"])
        metrics = json.loads(metrics_path.read_text())
        start = metrics.get("startup") or {}
        parts = relative.parts  # machine, dataset, split, model, variant, hparams
        out.append({"job": "/".join(parts[1:]), "model": parts[3], "variant": parts[4], "wall_s": wall,
                    "epochs_s": metrics["total_train_time_s"], "startup_s": wall - metrics["total_train_time_s"],
                    **{k: start.get(k) for k in ("data_s", "build_s", "test_passes_s", "kernels_loaded",
                                                 "kernels_compiled")}})
    return out


def main(results: str) -> None:
    table = rows(Path(results))
    print(f"{len(table)} training jobs with a benchmark and metrics.json\n")
    print("| model | variant | jobs | start-up s min | median | max | kernels compiled (sum) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    groups = {}
    for row in table:
        groups.setdefault((row["model"], row["variant"]), []).append(row)
    for (model, variant), jobs in sorted(groups.items()):
        s = [j["startup_s"] for j in jobs]
        compiled = sum(j["kernels_compiled"] or 0 for j in jobs)
        print(f"| {model} | {variant} | {len(jobs)} | {min(s):.2f} | {statistics.median(s):.2f} | {max(s):.2f} | "
              f"{compiled} |")
    print("\n| job | wall s | epochs s | start-up s | data | build | test passes | kernels loaded/compiled |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in table:
        if row["variant"].startswith("gpu-") and row["model"] in ("mlp", "cnn"):
            print(f"| {row['job']} | {row['wall_s']:.2f} | {row['epochs_s']:.2f} | {row['startup_s']:.2f} | "
                  f"{row['data_s'] or 0:.2f} | {row['build_s'] or 0:.2f} | {row['test_passes_s'] or 0:.2f} | "
                  f"{row['kernels_loaded']}/{row['kernels_compiled']} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
