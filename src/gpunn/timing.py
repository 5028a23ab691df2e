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
from gpunn.errors import GpunnError
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
# Whole training epochs of a model (the E1/E4 target: 60 000 MNIST-shaped samples, batch 64), with PyTorch in
# the same run, from the same initial weights, data and batch order.

EPOCH_COLUMNS = ["model", "variant", "sizes", "n", "batch", "epoch_s", "samples_per_s", "ratio_to_torch_eager",
                 "epochs", *provenance.CSV_COLUMNS]
# the models ``bench mlp`` / ``bench cnn`` time: their build_model sizes and one sample's shape (MNIST's)
EPOCH_MODELS = {
    "mlp": ({"in_features": 784, "hidden": 256, "classes": 10}, (784,)),
    "cnn": ({"in_channels": 1, "image_size": 28, "classes": 10}, (1, 28, 28)),
}


def mnist_shaped_data(n: int, seed: int = 0, sample_shape=(784,), classes: int = 10):
    """Random images in [0, 1) and labels of MNIST's shapes (never zeros: timing on zeros flatters kernels)."""
    rng = np.random.default_rng([seed, 7])
    return rng.random((n, *sample_shape), dtype=np.float32), rng.integers(0, classes, n)


def gpunn_epoch_seconds(variant, model_name, sizes, x, y, batch, lr, epochs, seed=0) -> list[float]:
    """Wall seconds of each epoch of one variant, as gpunn.train runs it (the GPU work of the epoch is
    finished when each figure is taken: every backend waits for its last loss)."""
    import time

    from gpunn.seeding import batch_order, batch_slices

    backend = make_backend(variant, build_model(model_name, **sizes, seed=seed), model_name, lr)
    backend.load_train_data(x, y)
    backend.warm_up({e - s for s, e in batch_slices(len(x), batch)})
    seconds = []
    for epoch in range(epochs):
        order = batch_order(seed, epoch, len(x))
        start = time.perf_counter()
        backend.train_epoch(order, batch)
        seconds.append(time.perf_counter() - start)
    return seconds


def torch_mirror(model, torch):
    """The gpunn.nn layer list `model` as a torch.nn.Sequential holding copies of its parameters (a Linear's
    weight is stored (in, out) here, (out, in) in torch), on the CPU; the same function of the input."""
    from gpunn.nn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Upsample

    modules = []
    for layer in model.layers:
        if isinstance(layer, Linear):
            module = torch.nn.Linear(layer.in_features, layer.out_features)
            weight = layer.weight.data.T
        elif isinstance(layer, Conv2d):
            module = torch.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, padding=layer.padding)
            weight = layer.weight.data
        else:
            simple = {ReLU: torch.nn.ReLU, Flatten: torch.nn.Flatten, MaxPool2d: lambda: torch.nn.MaxPool2d(2),
                      Upsample: lambda: torch.nn.Upsample(scale_factor=2, mode="nearest")}
            if type(layer) not in simple:
                raise GpunnError(f"torch_mirror: no PyTorch equivalent for layer {layer!r}")
            modules.append(simple[type(layer)]())
            continue
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight)))
            module.bias.copy_(torch.from_numpy(layer.bias.data))
        modules.append(module)
    return torch.nn.Sequential(*modules)


def torch_epoch_seconds(model, x, y, batch, lr, epochs, seed=0, graph=False) -> list[float]:
    """The same model (``torch_mirror``: same initial weights), data and batch order in PyTorch on the GPU
    (fp32: TF32 off for matmuls and cuDNN): eager, or with the training step captured once in a CUDA graph
    and replayed (the partial last batch then runs eagerly)."""
    import time

    import torch

    from gpunn.seeding import batch_order

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    data = torch.from_numpy(x).to(dev)
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(dev)
    net = torch_mirror(model, torch).to(dev)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(index):
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(net(data[index]), labels[index])
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


def time_epochs(model_name, variants, n=60000, batch=64, lr=0.01, epochs=3, seed=0, torch_reference=True,
                log=print, **sizes) -> pd.DataFrame:
    """Median epoch time (epochs after the first) per variant of `model_name` (EPOCH_MODELS, `sizes` overriding
    its sizes) on MNIST-shaped random data, plus PyTorch eager and CUDA-graph rows when torch and a GPU are
    there; ratios to PyTorch eager from this same run."""
    defaults, sample_shape = EPOCH_MODELS[model_name]
    sizes = {**defaults, **sizes}
    x, y = mnist_shaped_data(n, seed, sample_shape, sizes["classes"])
    timed = {}
    for variant in variants:
        log(f"{model_name} {variant}: {epochs} epochs of {n} samples ...")
        timed[variant] = gpunn_epoch_seconds(variant, model_name, sizes, x, y, batch, lr, epochs, seed)
    if torch_reference:
        try:
            import torch

            if torch.cuda.is_available():
                model = build_model(model_name, **sizes, seed=seed)
                timed["torch-eager"] = torch_epoch_seconds(model, x, y, batch, lr, epochs, seed)
                timed["torch-cuda-graph"] = torch_epoch_seconds(model, x, y, batch, lr, epochs, seed, graph=True)
        except ImportError:
            log("torch is not importable: no PyTorch reference rows")
    rows = []
    for variant, seconds in timed.items():
        epoch_s = float(np.median(seconds[1:] if len(seconds) > 1 else seconds))
        rows.append({"model": model_name, "variant": variant, "sizes": _sizes_text(sizes), "n": n, "batch": batch,
                     "epoch_s": epoch_s,
                     "samples_per_s": n / epoch_s, "epochs": len(seconds), **provenance_columns(variant)})
    frame = pd.DataFrame(rows)
    eager = frame.loc[frame["variant"] == "torch-eager", "epoch_s"]
    frame["ratio_to_torch_eager"] = frame["epoch_s"] / float(eager.iloc[0]) if len(eager) else np.nan
    for row in frame.itertuples():
        log(f"{row.variant:>16}: {row.epoch_s:8.4f} s/epoch  {row.samples_per_s:10.0f} samples/s"
            f"  x{row.ratio_to_torch_eager:.3f} of torch eager")
    return frame[EPOCH_COLUMNS]


def _sizes_text(sizes: dict) -> str:
    """{'hidden': 256, 'channels': (16, 32)} -> 'hidden=256 channels=16x32' (one CSV cell)."""
    return " ".join(f"{key}={'x'.join(map(str, value)) if isinstance(value, (tuple, list)) else value}"
                    for key, value in sizes.items())


# ---------------------------------------------------------------------------------------------------------
# Where a training step's time goes: each bound launch of one step program timed alone (GPU time, queued behind a
# GPU sleep like the kernel benchmarks: gpunn.bench.core.median_launch_ms), in the step's order.

PROFILE_COLUMNS = ["model", "variant", "batch", "order", "phase", "launch", "grid", "block", "ms", "share",
                   *provenance.CSV_COLUMNS]


def step_profile(model_name, variants, batch=64, repeats=50, seed=0, log=print, **sizes) -> pd.DataFrame:
    """One row per launch of a training step at `batch` for each GPU variant: its median GPU time and share of the
    step's summed kernel time. A graph variant is profiled through its eager twin (the same launches, not
    captured: a graph replays exactly these kernels). Launches repeat on one random batch: the parameters drift,
    which changes no kernel's work."""
    import dataclasses

    from gpunn.backends.gpu.engine import GpuEngine, _launches
    from gpunn.backends.gpu.policy import POLICIES
    from gpunn.bench.core import median_launch_ms, numba_clock

    defaults, _ = EPOCH_MODELS[model_name]
    sizes = {**defaults, **sizes}
    sample_shape = ((sizes["in_features"],) if model_name == "mlp"
                    else (sizes["in_channels"], sizes["image_size"], sizes["image_size"]))
    x, y = mnist_shaped_data(batch, seed, sample_shape, sizes["classes"])
    rows = []
    for variant in variants:
        policy = dataclasses.replace(POLICIES[variant], graphs=False)
        engine = GpuEngine(build_model(model_name, **sizes, seed=seed), model_name, 0.01, policy)
        engine.train_step(x, y)  # compiles every kernel of the program
        program = engine._step_program(batch, sample_shape)
        phases = [("forward", launch) for launch in _launches(program.forward)]
        phases += [("backward", launch) for launch in _launches(program.backward)]
        clock = numba_clock(engine.stream)
        timed = [(phase, launch, median_launch_ms(launch, repeats, clock).ms) for phase, launch in phases]
        total = sum(ms for _, _, ms in timed)
        log(f"{model_name} {variant}: {len(timed)} launches per step, kernels {total:.4f} ms in all")
        for order, (phase, launch, ms) in enumerate(timed):
            rows.append({"model": model_name, "variant": variant, "batch": batch, "order": order, "phase": phase,
                         "launch": launch.name, "grid": str(launch.grid), "block": str(launch.block), "ms": ms,
                         "share": ms / total, **provenance_columns(variant)})
            log(f"  {order:2d} {phase:8s} {ms:8.4f} ms {100 * ms / total:5.1f}%  {launch.name} "
                f"grid {launch.grid} block {launch.block}")
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)
