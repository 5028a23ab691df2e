"""Issue 40: how much of a warm GPU job's start-up a process that outlives the job could save. A parent imports gpunn's
CLI, numba and numba-cuda and sets up numba's CUDA target (no CUDA context: it would not survive a fork); each job
is then a forked child running `gpunn train` (its own context, its kernels from the disk cache). Against the same
jobs as fresh processes. Start-up = the job's wall (fork to exit, or process start to exit) minus its epochs.

    python zygote.py PREPARED_DIR OUT_DIR CACHE_DIR [REPEATS]

Run each job once before (fresh) so that CACHE_DIR is warm. A measurement, not gpunn code.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

JOBS = [("mnist", "mnist/standard/mlp/gpu-graph/w256_b64_lr0.01_e10_s0"),
        ("mnist", "mnist/standard/cnn/gpu-graph/w16-32_b64_lr0.01_e1_s0"),
        ("mnist", "mnist/standard/cnn/gpu-im2col/w16-32_b64_lr0.01_e1_s0")]


def epochs_s(out: Path) -> float:
    return json.loads((out / "metrics.json").read_text())["total_train_time_s"]


def fresh(prepared: Path, run: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpunn", "train", run, "--data", str(prepared), "--out", str(out)],
                   check=True, capture_output=True)
    return time.perf_counter() - start - epochs_s(out)


def forked(prepared: Path, run: str, out: Path) -> float:
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: a job
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        from gpunn import cli

        code = 1
        try:
            code = cli.main(["train", run, "--data", str(prepared), "--out", str(out)]) or 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return time.perf_counter() - start - epochs_s(out)


def main(prepared: str, out: str, cache: str, repeats: str = "3") -> None:
    os.environ["GPUNN_KERNEL_CACHE"] = cache
    out = Path(out)
    for dataset, run in JOBS:  # fill the cache
        fresh(Path(prepared) / f"{dataset}.npz", run, out / "warm-up")
    start = time.perf_counter()
    from numba.cuda.descriptor import cuda_target

    import gpunn.cli  # noqa: F401
    import gpunn.train  # noqa: F401

    cuda_target.target_context.refresh()
    print(json.dumps({"parent_preload_s": time.perf_counter() - start}), flush=True)
    for dataset, run in JOBS:
        data = Path(prepared) / f"{dataset}.npz"
        for _ in range(int(repeats)):
            row = {"run": run, "fresh_startup_s": fresh(data, run, out / "fresh"),
                   "forked_startup_s": forked(data, run, out / "forked")}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
