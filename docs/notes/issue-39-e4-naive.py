"""Issue 39, E4's naive: the conv weight and bias gradients of gpu-naive against the other plausible design of paper
001's naive ConvLayerBackward (one thread per output-gradient element, atomics), and the training steps and epochs
of gpu-naive with each design beside gpu-optimized. Results in docs/notes/issue-39-e4-naive.md.

    PYTHONPATH=src python docs/notes/issue-39-e4-naive.py OUT_DIR [MNIST_DIR] [--quick] [--epochs-of=P1,P2]

Writes OUT_DIR/kernels.csv (each weight / bias gradient version of the CNN's conv1 and conv2 at batch 64, CUDA events,
median of REPEATS after warm-up), OUT_DIR/steps.csv (each launch of one training step per policy, timed alone) and
OUT_DIR/epochs.csv (seconds per epoch on MNIST_DIR's real training set, or random data of its shape). --quick: tiny
sizes, for the simulator; --epochs-of: only these policies' epochs (POLICY_SET's names).
"""

from __future__ import annotations

import csv
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

from gpunn import provenance
from gpunn.backends.gpu.engine import GpuEngine, _launches
from gpunn.backends.gpu.policy import BIAS_WITH_WEIGHT, POLICIES
from gpunn.bench.core import median_launch_ms, numba_clock
from gpunn.kernels import conv as C
from gpunn.kernels.launch import LaunchGroup
from gpunn.nn import build_model
from gpunn.seeding import batch_order

REPEATS = 20
BLOCKS = (128, 256, 1024)
NAIVE = POLICIES["gpu-naive"]
# gpu-naive with each design of the conv weight / bias gradients (only the conv dict differs)
POLICY_SET = {
    "gpu-naive": NAIVE,
    "naive+bias-in-wgrad": dataclasses.replace(NAIVE, name="naive+bias-in-wgrad", conv={
        **NAIVE.conv, "bias_grad": BIAS_WITH_WEIGHT}),
    "naive+atomic": dataclasses.replace(NAIVE, name="naive+atomic", conv={
        **NAIVE.conv, "backward_weight": "atomic", "bias_grad": "atomic"}),
    "naive+atomic-fused": dataclasses.replace(NAIVE, name="naive+atomic-fused", conv={
        **NAIVE.conv, "backward_weight": "atomic", "bias_grad": BIAS_WITH_WEIGHT}),
    "gpu-optimized": POLICIES["gpu-optimized"],
}


def write(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def kernels(out, quick):
    cases = ({"conv1": (2, 1, 3, 7, 7)} if quick else
             {"conv1": (64, 1, 16, 28, 28), "conv2": (64, 16, 32, 26, 26)})
    blocks = (32,) if quick else BLOCKS
    clock = numba_clock(0)
    rng = np.random.default_rng(0)
    rows = []
    for case, (n, cin, cout, h, w) in cases.items():
        x = cuda.to_device(rng.random((n, cin, h, w), dtype=np.float32))
        dy = cuda.to_device(rng.standard_normal((n, cout, h - 2, w - 2)).astype(np.float32))
        dw, db = cuda.device_array((cout, cin, 3, 3), np.float32), cuda.device_array(cout, np.float32)
        wg, bg = C.VERSIONS["backward_weight"], C.VERSIONS["bias_grad"]
        runs = []
        for block in blocks:
            runs += [("dw", "naive", block, wg["naive"].launcher(x, dy, dw, 0, block=block, launch=False)),
                     ("db", "naive", block, bg["naive"].launcher(dy, db, block=block, launch=False)),
                     ("dw+db", "naive", block, wg["naive"].with_bias(x, dy, dw, db, 0, block=block, launch=False)),
                     ("dw", "atomic", block, wg["atomic"].launcher(x, dy, dw, 0, block=block, launch=False)),
                     ("db", "atomic", block, bg["atomic"].launcher(dy, db, block=block, launch=False)),
                     ("dw+db", "atomic", block, wg["atomic"].with_bias(x, dy, dw, db, 0, block=block, launch=False))]
        shuffle = "block" if quick else "shuffle"  # (the simulator has no warp shuffles)
        runs += [("dw", shuffle, 256, wg[shuffle].launcher(x, dy, dw, 0, block=256, launch=False)),
                 ("db", "block", 256, bg["block"].launcher(dy, db, block=256, launch=False)),
                 ("dw", "deterministic", 256, wg["deterministic"].launcher(x, dy, dw, 0, block=256, launch=False))]
        for grad, version, block, launch in runs:
            parts = launch.launches if isinstance(launch, LaunchGroup) else (launch,)
            ms = median_launch_ms(launch, REPEATS, clock).ms
            row = {"case": case, "shape": f"{n}x{cin}x{h}x{w}->{cout}", "grad": grad, "version": version,
                   "block": block, "ms": round(ms, 5), "launches": len(parts),
                   "grids": " ".join(str(p.grid) for p in parts)}
            rows.append(row)
            print(row, flush=True)
    write(out / "kernels.csv", rows)


def steps(out, quick, x, y):
    batch = 64 if not quick else 4
    rows = []
    for name, policy in POLICY_SET.items():
        engine = GpuEngine(build_model("cnn", **SIZES, seed=0), "cnn", 0.01, policy)
        engine.train_step(x[:batch], y[:batch])  # compiles the step's kernels
        program = engine._step_program(batch, x.shape[1:])
        phases = [("forward", launch) for launch in _launches(program.forward)]
        phases += [("backward", launch) for launch in _launches(program.backward)]
        clock = numba_clock(engine.stream)
        times = [median_launch_ms(launch, REPEATS, clock).ms for _, launch in phases]
        together = median_launch_ms(LaunchGroup([launch for _, launch in phases]), REPEATS, clock).ms
        print(f"{name}: {len(phases)} launches, {sum(times):.4f} ms alone summed, {together:.4f} ms back to back",
              flush=True)
        for order, ((phase, launch), ms) in enumerate(zip(phases, times)):
            rows.append({"policy": name, "order": order, "phase": phase, "launch": launch.name,
                         "grid": str(launch.grid), "block": str(launch.block), "ms": round(ms, 5),
                         "share": round(ms / sum(times), 4), "step_ms": round(together, 5)})
            print(f"  {order:2d} {phase:8s} {ms:8.4f} ms {100 * ms / sum(times):5.1f}%  {launch.name} grid "
                  f"{launch.grid}", flush=True)
    write(out / "steps.csv", rows)


def epochs(out, quick, x, y, xt, yt, names):
    batch = 64 if not quick else 4
    rows = []
    for name, policy in POLICY_SET.items():
        if names and name not in names:
            continue
        engine = GpuEngine(build_model("cnn", **SIZES, seed=0), "cnn", 0.01, policy)
        engine.load_train_data(x, y)
        engine.warm_up({batch, len(x) % batch or batch})
        engine.prepare_epoch(batch)
        count = 1 if quick else 3 if name == "gpu-optimized" else 2
        for epoch in range(count):
            start = time.perf_counter()
            result = engine.train_epoch(batch_order(0, epoch, len(x)), batch)
            seconds = time.perf_counter() - start
            accuracy = ""
            if epoch == count - 1 and xt is not None:
                correct = sum(int((engine.predict(xt[s:s + 1000]).argmax(1) == yt[s:s + 1000]).sum())
                              for s in range(0, len(xt), 1000))
                accuracy = round(correct / len(xt), 4)
            row = {"policy": name, "epoch": epoch + 1, "seconds": round(seconds, 4), "loss": round(result.loss, 5),
                   "test_accuracy": accuracy}
            rows.append(row)
            print(row, flush=True)
    write(out / "epochs.csv", rows)


SIZES = {"in_channels": 1, "image_size": 28, "classes": 10}


def main(argv):
    quick = "--quick" in argv
    names = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--epochs-of=")), None)
    args = [a for a in argv if not a.startswith("--")]
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    print(f"device {provenance.gpu_name()}, driver {provenance.driver_version()}", flush=True)
    xt = yt = None
    if len(args) > 1:
        from gpunn.data.idx import read_idx
        from gpunn.rundata import images_to_float

        mnist = Path(args[1])
        x = images_to_float(read_idx(mnist / "train-images-idx3-ubyte.gz")).reshape(-1, 1, 28, 28)
        y = read_idx(mnist / "train-labels-idx1-ubyte.gz").astype(np.int64)
        xt = images_to_float(read_idx(mnist / "t10k-images-idx3-ubyte.gz")).reshape(-1, 1, 28, 28)
        yt = read_idx(mnist / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    else:
        rng = np.random.default_rng(7)
        x, y = rng.random((60000, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 60000)
    if quick:  # 8x8 crops, 2 repeats: what the simulator gets through in a minute
        global REPEATS
        REPEATS = 2
        SIZES["image_size"] = 8
        x, y = np.ascontiguousarray(x[:16, :, 10:18, 10:18]), y[:16]
        xt, yt = (None, None) if xt is None else (np.ascontiguousarray(xt[:8, :, 10:18, 10:18]), yt[:8])
    kernels(out, quick)
    steps(out, quick, x, y)
    epochs(out, quick, x, y, xt, yt, names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
