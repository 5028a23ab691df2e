"""Issue 40: cpu-numpy's training step and test forward, per code tree and thread count, each in a process of its own
(BLAS and the sample threads read their thread count at start). Random MNIST- and CIFAR-shaped data, batch 64.

    python cpu_steps.py OUT_DIR THREADS[,THREADS...] NAME=SRC [NAME=SRC ...]

A tree named `*-nopool` runs with gpunn.nn.sample_threads held to one thread (BLAS keeps THREADS): the sample
threads' own share; `*-tN` with OPENBLAS_THREAD_TIMEOUT=N (BLAS threads sleep after 2^N cycles instead of spinning
for about 2^28 beside the sample threads: 2 threads here, CNN step 38/34 -> 29/26 ms). Env MODELS: which models
(default mlp,cnn,autoencoder). Prints and writes cpu_steps.csv: median and min step ms over REPEATS steps after a
warm-up, and the test forward's seconds (MLP and CNN: 10 000 images, autoencoder: 1 000) through
CpuNumpyBackend.predict.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPEATS = {"mlp": 200, "cnn": 40, "autoencoder": 8}
TEST_IMAGES = {"mlp": 10000, "cnn": 10000, "autoencoder": 1000}

CHILD = r"""
import json, sys, time
import numpy as np
name, nopool, repeats, test_images = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
try:
    from gpunn.heap import keep_freed_memory  # as gpunn's CLI does (trees before it: none, or in the backend)
    keep_freed_memory()
except ImportError:
    pass
if nopool:
    from gpunn.nn import sample_threads
    sample_threads.thread_count = lambda: 1
from gpunn.nn.models import build_model
from gpunn.backends.cpu_numpy import CpuNumpyBackend
rng = np.random.default_rng(0)
backend = CpuNumpyBackend(build_model(name), name, 0.01)
shape = {"mlp": (784,), "cnn": (1, 28, 28)}.get(name, (3, 32, 32))
x = rng.random((64, *shape), dtype=np.float32)
y = x if name == "autoencoder" else rng.integers(0, 10, 64)
for _ in range(3):
    backend.train_step(x, y)
steps = []
for _ in range(repeats):
    t = time.perf_counter(); backend.train_step(x, y); steps.append(time.perf_counter() - t)
test = rng.random((test_images, *shape), dtype=np.float32)
t = time.perf_counter(); backend.predict(test); test_s = time.perf_counter() - t
print(json.dumps({"step_ms_median": 1e3 * float(np.median(steps)), "step_ms_min": 1e3 * min(steps),
                  "test_forward_s": test_s}))
"""


MODELS = [m for m in os.environ.get("MODELS", "mlp,cnn,autoencoder").split(",") if m]


def main(out: str, threads: str, *trees: str) -> None:
    import pandas as pd

    rows = []
    for count in threads.split(","):
        for model in MODELS:
            for tree in trees:
                name, src = tree.split("=", 1)
                env = {**os.environ, "PYTHONPATH": src, "GPUNN_KERNEL_CACHE": "off",
                       **{v: count for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
                if "-t" in name:  # OpenBLAS's threads sleep after 2^N cycles of spinning (default: about 2^28)
                    env["OPENBLAS_THREAD_TIMEOUT"] = name.rsplit("-t", 1)[1]
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-c", CHILD, model, "1" if name.endswith("-nopool") else "0",
                                       str(REPEATS[model]), str(TEST_IMAGES[model])],
                                      capture_output=True, text=True, env=env)
                if done.returncode:
                    print(done.stderr[-2000:], flush=True)
                    continue
                row = {"threads": int(count), "model": model, "code": name, **json.loads(done.stdout.splitlines()[-1]),
                       "process_s": time.perf_counter() - start}
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(Path(out) / "cpu_steps.csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
