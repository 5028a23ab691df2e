"""Issue 40's start-up study: each GPU training job of E1, E4 and E5, run by hand (`python -m gpunn train`) three
times: with the code before the kernel cache (OLD_SRC), then with this tree's code on an empty cache folder (cold:
compiles and stores) and again on it (warm: loads). A job's start-up is its wall time (process start to exit,
imports and writes included) minus its epochs. One cache folder per job, so that a cold job is cold for all its
kernels. Writes a CSV (one row per job and mode) with the run's own split of the rest (metrics.json "startup",
this tree's code only).

    python startup.py OLD_SRC NEW_SRC PREPARED_DIR OUT_DIR [MODES [JOBS]]
        MODES: default before,cold,warm; JOBS: experiment/variant pairs, e.g. e1/gpu-graph,e4/gpu-naive (default all)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

JOBS = [  # (experiment, prepared file, run path): E1 at its config; E4 and E5 one epoch (E5 on 5 000 images)
    *[("e1", "mnist", f"mnist/standard/mlp/{v}/w256_b64_lr0.01_e10_s0")
      for v in ("gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph")],
    *[("e4", "mnist", f"mnist/standard/cnn/{v}/w16-32_b64_lr0.01_e1_s0")
      for v in ("gpu-naive", "gpu-optimized", "gpu-im2col", "gpu-graph")],
    *[("e5", "synthetic_cifar10", f"synthetic_cifar10/standard/autoencoder/{v}/w256-128_b64_lr0.002_e1_s0_n5000")
      for v in ("gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph")],
]


def train(src, run_path: str, data: Path, out: Path, **env):
    """`python -m gpunn train` of run_path with src on PYTHONPATH and `env` added: (wall s, the finished process,
    its metrics.json or None when it failed, its stderr's tail printed)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpunn", "train", run_path, "--data", str(data), "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src), **env})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stderr[-3000:], flush=True)
        return wall, done, None
    return wall, done, json.loads((out / "metrics.json").read_text())


def run(src: Path, run_path: str, data: Path, out: Path, cache: Path) -> dict:
    wall, done, metrics = train(src, run_path, data, out, GPUNN_KERNEL_CACHE=str(cache))
    if metrics is None:
        return {"wall_s": wall, "rc": done.returncode}
    startup = metrics.get("startup") or {}
    # 'gpunn train: done in 5.0 s' (the CLI's main); the rest of the wall is the interpreter, imports and exit
    done = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "gpunn train: done in" in line]
    main_s = float(done[-1].split("done in")[1].split()[0]) if done else None
    return {"wall_s": wall, "rc": 0, "epochs_s": metrics["total_train_time_s"],
            "outside_main_s": None if main_s is None else wall - main_s,
            "startup_s": wall - metrics["total_train_time_s"], **{k: startup.get(k) for k in (
                "data_s", "build_s", "test_passes_s", "kernels_loaded", "kernels_compiled")}}


def main(old: str, new: str, prepared: str, out: str, modes: str = "before,cold,warm", jobs: str = "") -> None:
    out = Path(out)
    rows = []
    for experiment, dataset, run_path in JOBS:
        variant = run_path.split("/")[3]
        if jobs and f"{experiment}/{variant}" not in jobs.split(","):
            continue
        cache = out / "cache" / f"{experiment}-{variant}"
        for mode in modes.split(","):
            src = old if mode == "before" else new
            row = {"experiment": experiment, "variant": variant, "mode": mode,
                   **run(Path(src), run_path, Path(prepared) / f"{dataset}.npz",
                         out / "runs" / experiment / variant / mode, cache)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            pd.DataFrame(rows).to_csv(out / "startup.csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
