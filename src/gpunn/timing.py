"""E3 timing: forward, backward and full training-step time of the MLP per variant and batch size.

Random (not zero) inputs, a warm-up step first (numba compiles on first call), then the median over
`repeats` steps. Host clocks are fine for CPU variants; GPU variants time themselves with CUDA events
inside their train_step and report the same StepTimes fields. Every row carries the provenance columns
(gpunn.provenance.CSV_COLUMNS: device, thread counts, versions, commit) of the variant it times; callers run
these functions under the machine-wide timing lock (gpunn.timing_lock).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpunn import provenance
from gpunn.nn import build_model
from gpunn.backends.registry import VARIANTS, make_backend, uses_gpu

TIMING_COLUMNS = ["variant", "batch", "hidden", "forward_ms", "backward_ms", "step_ms", "samples_per_s", "repeats",
                  *provenance.CSV_COLUMNS]


def provenance_columns(variant: str) -> dict:
    """The provenance columns of a row timing `variant` (a gpunn variant, or a PyTorch reference on the GPU)."""
    return provenance.columns(provenance.collect(uses_gpu=uses_gpu(variant) if variant in VARIANTS else True))


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
            backend.warm_up({batch})  # compilation, outside the timing
            backend.train_step(*pool[0])  # and one step for the caches
            steps = [backend.train_step(*pool[i % len(pool)]) for i in range(repeats)]
            forward = float(np.median([s.forward_s for s in steps]))
            backward = float(np.median([s.backward_s for s in steps]))
            step = float(np.median([s.forward_s + s.backward_s for s in steps]))
            rows.append({"variant": variant, "batch": batch, "hidden": hidden, "forward_ms": 1e3 * forward,
                         "backward_ms": 1e3 * backward, "step_ms": 1e3 * step,
                         "samples_per_s": batch / step, "repeats": repeats, **provenance_columns(variant)})
            log(f"{variant:>12} batch {batch:>4}: forward {1e3 * forward:8.3f} ms  backward {1e3 * backward:8.3f} ms"
                f"  {batch / step:10.0f} samples/s")
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


# ---------------------------------------------------------------------------------------------------------
# Whole training epochs of the MLP (the E1 target: 60 000 samples, batch 64), with PyTorch in the same run.

EPOCH_COLUMNS = ["variant", "n", "batch", "hidden", "epoch_s", "samples_per_s", "ratio_to_torch_eager", "epochs",
                 *provenance.CSV_COLUMNS]


def mnist_shaped_data(n: int, seed: int = 0, features: int = 784, classes: int = 10):
    """Random images in [0, 1) and labels of MNIST's shapes (never zeros: timing on zeros flatters kernels)."""
    rng = np.random.default_rng([seed, 7])
    return rng.random((n, features), dtype=np.float32), rng.integers(0, classes, n)


def gpunn_epoch_seconds(variant, x, y, batch, hidden, lr, epochs, seed=0) -> list[float]:
    """Wall seconds of each epoch of one variant, as gpunn.train runs it (the GPU work of the epoch is
    finished when each figure is taken: every backend waits for its last loss)."""
    import time

    from gpunn.seeding import batch_order, batch_slices

    model = build_model("mlp", in_features=x.shape[1], hidden=hidden, classes=int(y.max()) + 1, seed=seed)
    backend = make_backend(variant, model, "mlp", lr)
    backend.load_train_data(x, y)
    backend.warm_up({e - s for s, e in batch_slices(len(x), batch)})
    seconds = []
    for epoch in range(epochs):
        order = batch_order(seed, epoch, len(x))
        start = time.perf_counter()
        backend.train_epoch(order, batch)
        seconds.append(time.perf_counter() - start)
    return seconds


def torch_epoch_seconds(x, y, batch, hidden, lr, epochs, seed=0, graph=False) -> list[float]:
    """The same MLP, data and batch order in PyTorch on the GPU (fp32, TF32 off): eager, or with the training
    step captured once in a CUDA graph and replayed (the partial last batch then runs eagerly)."""
    import time

    import torch

    from gpunn.seeding import batch_order

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(seed)
    data = torch.from_numpy(x).to(dev)
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(dev)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, int(y.max()) + 1)).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(index):
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(model(data[index]), labels[index])
        loss.backward()
        optimizer.step()
        return loss

    replay = None
    if graph:
        index_static = torch.arange(batch, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up before capture, as torch's graph docs require
                step(index_static)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            step(index_static)

        def replay(index):
            index_static.copy_(index)
            captured.replay()

    seconds = []
    n = len(x)
    for epoch in range(epochs):
        order = torch.from_numpy(batch_order(seed, epoch, n).astype(np.int64)).to(dev)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for s in range(0, n, batch):
            index = order[s:s + batch]
            if replay is not None and len(index) == batch:
                replay(index)
            else:
                step(index)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


def time_mlp_epochs(variants, n=60000, batch=64, hidden=256, lr=0.01, epochs=3, seed=0, torch_reference=True,
                    log=print) -> pd.DataFrame:
    """Median epoch time (epochs after the first) per variant on MNIST-shaped random data, plus PyTorch eager
    and CUDA-graph rows when torch and a GPU are there; ratios to PyTorch eager from this same run."""
    x, y = mnist_shaped_data(n, seed)
    timed = {variant: gpunn_epoch_seconds(variant, x, y, batch, hidden, lr, epochs, seed) for variant in variants}
    if torch_reference:
        try:
            import torch

            if torch.cuda.is_available():
                timed["torch-eager"] = torch_epoch_seconds(x, y, batch, hidden, lr, epochs, seed)
                timed["torch-cuda-graph"] = torch_epoch_seconds(x, y, batch, hidden, lr, epochs, seed, graph=True)
        except ImportError:
            log("torch is not importable: no PyTorch reference rows")
    rows = []
    for variant, seconds in timed.items():
        epoch_s = float(np.median(seconds[1:] if len(seconds) > 1 else seconds))
        rows.append({"variant": variant, "n": n, "batch": batch, "hidden": hidden, "epoch_s": epoch_s,
                     "samples_per_s": n / epoch_s, "epochs": len(seconds), **provenance_columns(variant)})
    frame = pd.DataFrame(rows)
    eager = frame.loc[frame["variant"] == "torch-eager", "epoch_s"]
    frame["ratio_to_torch_eager"] = frame["epoch_s"] / float(eager.iloc[0]) if len(eager) else np.nan
    for row in frame.itertuples():
        log(f"{row.variant:>16}: {row.epoch_s:8.4f} s/epoch  {row.samples_per_s:10.0f} samples/s"
            f"  x{row.ratio_to_torch_eager:.3f} of torch eager")
    return frame[EPOCH_COLUMNS]
