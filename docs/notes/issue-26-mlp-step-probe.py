"""Issue 26, the MLP's persistent step on a GPU: epoch times of gpu-graph with each Policy.step, E1's shapes
(60 000 x 784 random images, batch 64), its launches and their grids, and each launch alone (step_profile).

    python docs/notes/issue-26-mlp-step-probe.py
"""

import dataclasses
import time

import numpy as np

from gpunn.backends.gpu.engine import GpuEngine
from gpunn.backends.gpu.policy import POLICIES
from gpunn.device import describe_device
from gpunn.nn import build_model
from gpunn.seeding import batch_order

print(describe_device())
rng = np.random.default_rng(0)
x = rng.random((60000, 784), dtype=np.float32)
y = rng.integers(0, 10, 60000)
results = {}
for step in ("layers", "persistent", "phased"):
    try:
        policy = dataclasses.replace(POLICIES["gpu-graph"], step=step)
        engine = GpuEngine(build_model("mlp", seed=0), "mlp", 0.01, policy)
        engine.load_train_data(x, y)
        engine.warm_up({64, 60000 % 64})
        engine.prepare_epoch(64)
        program = engine._resident_programs(64)[0]
        print(step, [(launch.name, launch.grid, launch.block) for launch in program.forward + program.backward])
        walls, losses = [], []
        for epoch in range(6):
            start = time.perf_counter()
            result = engine.train_epoch(batch_order(0, epoch, len(x)), 64)
            walls.append(time.perf_counter() - start)
            losses.append(result.loss)
        print(f"{step}: epoch wall median {np.median(walls[1:]):.4f} s ({1e6 * np.median(walls[1:]) / 938:.1f} us "
              f"per step), forward {result.forward_s:.4f} s backward {result.backward_s:.4f} s (epoch clock), "
              f"losses {' '.join(f'{v:.6f}' for v in losses)}")
        results[step] = engine.parameters().copy()
    except Exception as exc:  # report and go on with the next step kind
        print(f"{step}: FAILED {type(exc).__name__}: {exc}")
for step, params in results.items():
    if step != "layers" and "layers" in results:
        diff = np.abs(params - results["layers"]).max() / np.abs(results["layers"]).max()
        print(f"{step} vs layers after 6 epochs: max rel diff of the parameters {diff:.2e}")

from gpunn.timing import step_profile  # noqa: E402

for variant in ("gpu-fused", "gpu-graph"):
    try:
        step_profile("mlp", [variant], batch=64, repeats=50)
    except Exception as exc:
        print(f"profile {variant}: FAILED {type(exc).__name__}: {exc}")
