"""E3 timing: forward, backward and full training-step time of the MLP per variant and batch size.

Random (not zero) inputs, a warm-up step first (numba compiles on first call), then the median over
`repeats` steps. Host clocks are fine for CPU variants; GPU variants time themselves with CUDA events
inside their train_step and report the same StepTimes fields.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpunn.nn import build_model
from gpunn.variants import make_backend

TIMING_COLUMNS = ["variant", "batch", "hidden", "forward_ms", "backward_ms", "step_ms", "samples_per_s", "repeats"]


def time_mlp_batches(variants, batch_sizes, hidden=256, in_features=784, classes=10, repeats=20,
                     seed=0, lr=0.01, log=print) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for variant in variants:
        for batch in batch_sizes:
            model = build_model("mlp", in_features=in_features, hidden=hidden, classes=classes, seed=seed)
            backend = make_backend(variant, model, "mlp", lr)
            pool = [(rng.random((batch, in_features), dtype=np.float32), rng.integers(0, classes, batch))
                    for _ in range(4)]
            backend.train_step(*pool[0])  # warm-up (compilation, caches)
            steps = [backend.train_step(*pool[i % len(pool)]) for i in range(repeats)]
            forward = float(np.median([s.forward_s for s in steps]))
            backward = float(np.median([s.backward_s for s in steps]))
            step = float(np.median([s.forward_s + s.backward_s for s in steps]))
            rows.append({"variant": variant, "batch": batch, "hidden": hidden, "forward_ms": 1e3 * forward,
                         "backward_ms": 1e3 * backward, "step_ms": 1e3 * step,
                         "samples_per_s": batch / step, "repeats": repeats})
            log(f"{variant:>12} batch {batch:>4}: forward {1e3 * forward:8.3f} ms  backward {1e3 * backward:8.3f} ms"
                f"  {batch / step:10.0f} samples/s")
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)
