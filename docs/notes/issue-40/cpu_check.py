"""Issue 40's CPU-baseline check: the same cpu-numpy / cpu-serial runs with the code before (OLD_SRC) and this tree's
(NEW_SRC), one after the other, each `python -m gpunn train` with THREADS BLAS threads: per run its epochs' times,
testing time, wall, and whether every epoch's printed train loss, test loss and accuracy are the same. Writes
cpu_check.csv into OUT_DIR.

    python cpu_check.py OLD_SRC NEW_SRC PREPARED_DIR OUT_DIR [THREADS]
"""

import json
import sys
from pathlib import Path

import pandas as pd
from startup import train  # this folder's start-up study: one `gpunn train` process

RUNS = [  # (prepared file, run path)
    ("mnist", "mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e1_s0"),
    ("synthetic_cifar10", "synthetic_cifar10/standard/autoencoder/cpu-numpy/w256-128_b64_lr0.002_e1_s0_n1000"),
    ("mnist", "mnist/standard/mlp/cpu-serial/w256_b64_lr0.01_e2_s0"),
]


def check(src: str, data: Path, run_path: str, out: Path, threads: str) -> dict:
    wall, done, metrics = train(src, run_path, data, out, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
                                MKL_NUM_THREADS=threads)
    if metrics is None:
        return {"wall_s": wall, "rc": done.returncode}
    printed = [line.split(" (")[0] for line in done.stdout.splitlines() if line.startswith("epoch ")]
    return {"wall_s": wall, "rc": 0, "epochs_s": metrics["total_train_time_s"], "test_time_s": metrics["test_time_s"],
            "printed": " | ".join(printed)}


def main(old: str, new: str, prepared: str, out: str, threads: str = "16") -> None:
    out = Path(out)
    rows = []
    for dataset, run_path in RUNS:
        pair = {}
        for code, src in (("before", old), ("after", new)):
            pair[code] = check(src, Path(prepared) / f"{dataset}.npz", run_path, out / "runs" / code / dataset, threads)
            rows.append({"run": run_path, "code": code, **pair[code]})
            print(json.dumps(rows[-1]), flush=True)
        rows[-1]["same_printed"] = pair["before"].get("printed") == pair["after"].get("printed")
        pd.DataFrame(rows).to_csv(out / "cpu_check.csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
