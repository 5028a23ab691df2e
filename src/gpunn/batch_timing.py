"""E3: the MLP's training step per variant and batch size, measured three ways (column groups of E3's CSV):

    throughput  epochs of `steps` steps back to back as the training loop runs them (fewer where `samples` caps
                an epoch's samples: epoch_steps), through the variant's own data path (load_train_data on random
                data of batch * steps samples, warm_up, train_epoch): an epoch's wall time over its steps, median
                over `timed_epochs` epochs (default TIMED_EPOCHS) after an untimed one
    split       forward and backward time per step of those same epochs (EpochResult.forward_s / backward_s over
                steps): CUDA events around each phase of each step for a GPU variant (batch copy excluded), the
                host clock for a CPU variant and under numba's simulator (column `clock`)
    latency     one synchronous train_step called from Python on a host batch, wall time, median over `repeats`

Each row ends with its variant's provenance columns; callers hold the machine-wide timing lock (gpunn.timing_lock).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from gpunn import provenance
from gpunn.backends.registry import make_backend, uses_gpu
from gpunn.errors import GpunnError
from gpunn.nn import build_model
from gpunn.seeding import batch_order
from gpunn.timing import provenance_columns, random_training_data

TIMED_EPOCHS = 3  # default throughput epochs timed after the untimed first one (median)
WARM_S = 0.3  # the untimed first epoch is repeated until this many seconds have passed: a short epoch (gpu-fused's
              # 100 steps at batch 64 take 8 ms) would otherwise be timed before the GPU's clocks have risen (on the
              # H100, E3's gpu-fused step at batch 64 read 0.127 ms after one untimed epoch, E1's 0.087 ms)
WARM_MAX_EPOCHS = 200
CLOCK_EVENTS = "cuda events"
CLOCK_HOST = "host"
BATCH_TIMING_COLUMNS = ["variant", "batch", "hidden", "features", "steps", "timed_epochs", "throughput_step_ms",
                        "throughput_samples_per_s", "forward_ms", "backward_ms", "clock", "latency_ms", "repeats",
                        *provenance.CSV_COLUMNS]
# what each measured column is: E3's table note and docs/experiments.md (E3's measures) say the same
COLUMN_NOTES = {
    "throughput_step_ms": "wall time of an epoch of `steps` steps run back to back through the variant's own data "
                          "path (train_epoch), over steps; median of `timed_epochs` epochs after an untimed one",
    "throughput_samples_per_s": "batch / throughput_step_ms",
    "forward_ms": "forward pass and loss per step in those epochs, by `clock`",
    "backward_ms": "backward pass and update per step in those epochs, by `clock`",
    "clock": f"'{CLOCK_EVENTS}': GPU time from CUDA events around each phase (the batch copy excluded); "
             f"'{CLOCK_HOST}': the host clock (CPU variants, and GPU variants under numba's simulator)",
    "latency_ms": "wall time of one synchronous train_step called from Python on a host batch (copy, launches, "
                  "wait for the GPU); median of `repeats` calls",
}


def split_clock(variant: str, simulator: bool) -> str:
    """What times a variant's forward / backward split: CUDA events on a real GPU, else the host clock."""
    return CLOCK_EVENTS if uses_gpu(variant) and not simulator else CLOCK_HOST


def throughput(backend, x, y, batch: int, seed: int, timed_epochs: int = TIMED_EPOCHS, warm: bool = True) -> dict:
    """Per-step medians (seconds) over `timed_epochs` epochs of the loaded (x, y) after an untimed one (repeated
    until WARM_S have passed; none with `warm` False: under the simulator, where no time is a measurement): 'wall'
    (the epoch's wall time), 'forward' and 'backward' (its EpochResult phases), each over the epoch's steps. An
    epoch that diverged or stopped early is a GpunnError: its time would not be an epoch's."""
    steps = len(x) // batch
    backend.load_train_data(x, y)
    backend.warm_up({batch})
    backend.prepare_epoch(batch)
    measured = {"wall": [], "forward": [], "backward": []}
    count = 0

    def epoch(order):
        nonlocal count
        count += 1
        start = time.perf_counter()
        result = backend.train_epoch(order, batch)
        wall = time.perf_counter() - start
        if not math.isfinite(result.loss) or result.steps != steps:
            raise GpunnError(f"{backend.name}: E3 epoch {count} at batch {batch} ran {result.steps} of {steps} "
                             f"steps to loss {result.loss}; a diverged epoch is no timing")
        return wall, result

    if warm:
        warmed = [epoch(batch_order(seed, 0, len(x)))[0]]  # the untimed epoch, repeated while short: a GPU's clocks
        while sum(warmed) < WARM_S and len(warmed) < WARM_MAX_EPOCHS:  # ramp up in milliseconds
            warmed.append(epoch(batch_order(seed, 0, len(x)))[0])
    for number in range(1, timed_epochs + 1):
        wall, result = epoch(batch_order(seed, number, len(x)))
        for key, seconds in (("wall", wall), ("forward", result.forward_s), ("backward", result.backward_s)):
            measured[key].append(seconds / steps)
    return {key: float(np.median(values)) for key, values in measured.items()}


def latency(backend, x, y, batch: int, repeats: int, warm: bool = True) -> float:
    """Median wall seconds of one synchronous train_step on host batches of (x, y), after an untimed one (none with
    `warm` False)."""
    batches = [(x[s:s + batch], y[s:s + batch]) for s in range(0, len(x) - batch + 1, batch)]
    if warm:
        backend.train_step(*batches[0])
    seconds = []
    for i in range(repeats):
        xb, yb = batches[i % len(batches)]
        start = time.perf_counter()
        backend.train_step(xb, yb)
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def epoch_steps(batch: int, steps: int, samples: int = 0) -> int:
    """Steps of an E3 throughput epoch at `batch`: `steps`, or with `samples` (> 0) as many whole batches as that
    many samples hold, at most `steps` and at least one. E3's config holds E1's 60 000 samples and 938 steps, so
    that an epoch at batch 64 is E1's (an epoch's fixed cost, spread over its steps, then weighs the same) while a
    batch-1 epoch stays 938 steps."""
    return max(1, min(steps, samples // batch)) if samples > 0 else steps


def time_batches(variants, batch_sizes, *, hidden=256, in_features=784, classes=10, steps=100, samples=0,
                 repeats=20, timed_epochs=TIMED_EPOCHS, seed=0, lr=0.01, log=print) -> pd.DataFrame:
    """One row per variant and batch size (BATCH_TIMING_COLUMNS): throughput, forward / backward split and latency
    of the in_features-hidden-classes MLP on random data, a fresh model per row; throughput epochs of
    epoch_steps(batch, steps, samples) steps."""
    if min(steps, repeats, timed_epochs) < 1 or samples < 0:
        raise GpunnError(f"E3 timing needs at least one step, repeat and timed epoch and samples >= 0 (got steps "
                         f"{steps}, repeats {repeats}, timed_epochs {timed_epochs}, samples {samples})")
    rows = []
    for variant in variants:
        where = provenance_columns(variant)
        clock = split_clock(variant, bool(where["simulator"]))
        for batch in batch_sizes:
            model = build_model("mlp", in_features=in_features, hidden=hidden, classes=classes, seed=seed)
            backend = make_backend(variant, model, "mlp", lr)
            count = epoch_steps(batch, steps, samples)
            x, y = random_training_data(batch * count, seed, (in_features,), classes)
            warm = not where["simulator"]  # the simulator compiles nothing and its times measure nothing
            per_step = throughput(backend, x, y, batch, seed, timed_epochs, warm)
            sync = latency(backend, x, y, batch, repeats, warm)
            rows.append({"variant": variant, "batch": batch, "hidden": hidden, "features": in_features,
                         "steps": count, "timed_epochs": timed_epochs, "throughput_step_ms": 1e3 * per_step["wall"],
                         "throughput_samples_per_s": batch / per_step["wall"],
                         "forward_ms": 1e3 * per_step["forward"], "backward_ms": 1e3 * per_step["backward"],
                         "clock": clock, "latency_ms": 1e3 * sync, "repeats": repeats, **where})
            log(f"{variant:>12} batch {batch:>4}: throughput {1e3 * per_step['wall']:8.3f} ms/step "
                f"{batch / per_step['wall']:10.0f} samples/s; forward {1e3 * per_step['forward']:8.3f} ms backward "
                f"{1e3 * per_step['backward']:8.3f} ms ({clock}); latency {1e3 * sync:8.3f} ms")
    return pd.DataFrame(rows, columns=BATCH_TIMING_COLUMNS)
