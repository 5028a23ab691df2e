"""Timing helpers: each row's provenance columns, random MNIST-shaped data, whole training epochs of a model per
variant next to PyTorch (``time_epochs``, what ``python -m gpunn.bench mlp|cnn|autoencoder`` runs) and each launch
of one training step timed alone (``step_profile``, ``bench <model> --profile``). E3's per-batch step timing is
gpunn.batch_timing. Callers run these under the machine-wide timing lock (gpunn.timing_lock).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from gpunn import provenance
from gpunn.backends.registry import VARIANTS, make_backend, uses_gpu
from gpunn.errors import GpunnError
from gpunn.flops import layer_macs, training_flops
from gpunn.nn import Conv2d, build_model, model_spec


def provenance_columns(variant: str) -> dict:
    """The provenance columns of a row timing `variant` (a gpunn variant, or a PyTorch reference on the GPU)."""
    return provenance.columns(provenance.collect(uses_gpu=uses_gpu(variant) if variant in VARIANTS else True))


# ---------------------------------------------------------------------------------------------------------
# Whole training epochs of a model (E1/E4: 60 000 MNIST-shaped samples at batch 64; E5: 50 000 CIFAR-shaped images
# at batch 64 and 1), with PyTorch in the same run, from the same initial weights, data and batch order.

EPOCH_COLUMNS = ["model", "variant", "sizes", "n", "batch", "epoch_s", "extrapolated", "timed_samples",
                 "samples_per_s", "ratio_to_torch_eager", "epoch_tflop", "tflops", "fp32_peak_pct", "fp32_peak_tflops",
                 "epochs", "epoch_loss", "gpu_mem_mib", "gpu_mem_measure", "ratio_to_torch_fastest", "torch_fastest",
                 "peak_format", "peak_pct", "peak_tflops", *provenance.CSV_COLUMNS]
# PyTorch in each setting its users run: name -> (TF32 matmuls, TF32 cuDNN convolutions, autocast dtype). "fp32" is
# strict FP32 (its rows keep the names torch-eager and torch-cuda-graph); "default" PyTorch's own defaults (cuDNN
# convolutions in TF32, matmuls in FP32); "tf32" TF32 everywhere; "bf16" torch.autocast(bfloat16) over the defaults.
TORCH_SETTINGS = {
    "fp32": (False, False, None),
    "default": (False, True, None),
    "tf32": (True, True, None),
    "bf16": (False, True, "bfloat16"),
}


def torch_variant(setting: str, graph: bool) -> str:
    """The row name of PyTorch in `setting`, eager or as a CUDA graph: torch-eager, torch-cuda-graph-bf16, ..."""
    base = "torch-cuda-graph" if graph else "torch-eager"
    return base if setting == "fp32" else f"{base}-{setting}"


class EpochModel(NamedTuple):
    """What ``bench <model>`` times by default."""

    sizes: dict              # build_model sizes
    samples: int             # samples per epoch: the real training set's size
    batches: tuple           # batch sizes
    cpu_variants: bool       # the default variant list includes the CPU ones (not where an epoch takes hours)
    lr: float                # the experiment's learning rate (config/config.yaml): a diverged epoch is no timing
    profile_steps: int = 100  # steps per epoch whose wall time gives a step profile's step_wall_ms


EPOCH_MODELS = {
    "mlp": EpochModel({"in_features": 784, "hidden": 256, "classes": 10}, 60000, (64,), True, 0.01),
    "cnn": EpochModel({"in_channels": 1, "image_size": 28, "classes": 10}, 60000, (64,), True, 0.01),
    # cpu-numpy runs a 50 000-image epoch in hours: only when asked for; E5's lr (0.01 diverges)
    "autoencoder": EpochModel({"in_channels": 3, "image_size": 32, "channels": (256, 128)}, 50000, (64, 1), False,
                              0.002, profile_steps=20),  # gpu-naive's step is 60 ms on an H100
}

# what gpu_mem_mib measures, per gpu_mem_measure
MEMORY_MEASURES = {
    "own_buffers_peak": "the most device memory the variant's own buffers held (numba's live allocations made "
                        "after it started: parameters, gradients, activations, resident data, workspaces; not the "
                        "CUDA context, kernel modules or graphs; other processes on the device do not count), read "
                        "after its epochs: gpunn.device.MemoryPeak",
    # benchmark outputs before issue 42's stop 60
    "device_in_use_delta": "device memory in use after the variant's epochs minus before it was built (cuMemGetInfo: "
                           "every process's allocations on the device counted)",
    "torch_max_allocated": "torch.cuda.max_memory_allocated from before the data upload to after the epochs (tensors "
                           "only: the caching allocator reserves more)",
}


class EpochTiming(NamedTuple):
    seconds: list            # wall seconds of each epoch
    loss: float              # mean loss of the last epoch (NaN: not read, PyTorch's rows)
    memory_mib: float        # NaN where not measured (CPU variants, the simulator)
    memory_measure: str      # a MEMORY_MEASURES key, "" where not measured


def random_training_data(n: int, seed: int = 0, sample_shape=(784,), classes: int = 10):
    """Random images in [0, 1) of one sample's shape (MNIST's, CIFAR's; not zeros: timing on zeros flatters
    kernels) and labels in [0, classes). The images are drawn first, so `classes` does not change them."""
    rng = np.random.default_rng([seed, 7])
    return rng.random((n, *sample_shape), dtype=np.float32), rng.integers(0, classes, n)


def gpunn_epoch_seconds(variant, model_name, sizes, x, y, batch, lr, epochs, seed=0) -> EpochTiming:
    """Wall seconds of each epoch of one variant, as gpunn.train runs it (the GPU work of the epoch is
    finished when each figure is taken: every backend waits for its last loss), after a warm-up that compiles
    every step shape. An epoch whose loss is not finite stops with a GpunnError: a host-loop variant stops such
    an epoch early, so its time would not be an epoch's."""
    import time

    from gpunn.device import MemoryPeak, open_cuda
    from gpunn.seeding import batch_order, batch_slices

    if VARIANTS[variant].gpu:
        open_cuda()  # the context and numba's target set-up side by side
    memory = MemoryPeak() if VARIANTS[variant].gpu else None
    backend = make_backend(variant, build_model(model_name, **sizes, seed=seed), model_name, lr)
    backend.load_train_data(x, y)
    backend.warm_up({e - s for s, e in batch_slices(len(x), batch)})
    backend.prepare_epoch(batch)
    seconds = []
    loss = float("nan")
    for epoch in range(epochs):
        order = batch_order(seed, epoch, len(x))
        start = time.perf_counter()
        result = backend.train_epoch(order, batch)
        seconds.append(time.perf_counter() - start)
        loss = result.loss
        if not math.isfinite(loss):
            raise GpunnError(f"{variant}: epoch {epoch + 1} at batch {batch} reached a non-finite loss ({loss}); "
                             "the timing of a diverged epoch means nothing")
    if memory is None or memory.peak_bytes is None:
        return EpochTiming(seconds, loss, float("nan"), "")
    memory.sample()
    return EpochTiming(seconds, loss, memory.peak_bytes / 2**20, "own_buffers_peak")


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


def torch_flat_parameters(net, torch) -> np.ndarray:
    """The parameters of a ``torch_mirror`` network as one float32 vector in gpunn's flat layout (layer order,
    weight before bias, a Linear's weight transposed back to (in, out))."""
    parts = []
    for module in net:
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            weight = module.weight.detach().cpu().numpy()
            parts += [weight.T if isinstance(module, torch.nn.Linear) else weight, module.bias.detach().cpu().numpy()]
    return np.concatenate([np.ascontiguousarray(p, dtype=np.float32).ravel() for p in parts])


def torch_trainer(model, torch, lr, device="cpu", autocast=None):
    """(net, step): the ``torch_mirror`` of `model` on `device`, and step(xb, target), one plain-SGD step at `lr`
    on a batch with gpunn's loss, so the update is cpu-numpy's: the autoencoder's MSE is the mean over every
    element of the batch (torch.nn.MSELoss's default reduction; its target is its input), a classifier's
    softmax cross-entropy the mean over the batch. step returns the loss tensor (no wait for the device).
    `autocast` ("bfloat16"): the forward pass and the loss under torch.autocast in that type (its cast cache off,
    as CUDA graph capture requires); the weights and their update stay float32."""
    import contextlib

    net = torch_mirror(model, torch).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss() if model_spec(model.name).classifier else torch.nn.MSELoss()

    def mixed():
        if autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, autocast),
                              cache_enabled=False)

    def step(xb, target):
        optimizer.zero_grad(set_to_none=False)
        with mixed():
            loss = loss_fn(net(xb), target)
        loss.backward()
        optimizer.step()
        return loss

    return net, step


def torch_epoch_seconds(model, x, y, batch, lr, epochs, seed=0, graph=False, setting="fp32") -> EpochTiming:
    """The same model (``torch_trainer``: same initial weights and loss), data and batch order in PyTorch on the GPU
    in `setting` (TORCH_SETTINGS; fp32: TF32 off for matmuls and cuDNN): eager, or with the training step captured
    once in a CUDA graph and replayed (the partial last batch then runs eagerly). Peak tensor memory from before
    the data upload. The TF32 switches are put back to fp32's afterwards."""
    import torch

    matmul_tf32, cudnn_tf32, autocast = TORCH_SETTINGS[setting]
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    try:
        return _torch_epochs(model, x, y, batch, lr, epochs, seed, graph, autocast)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def _torch_epochs(model, x, y, batch, lr, epochs, seed, graph, autocast) -> EpochTiming:
    import time

    import torch

    from gpunn.seeding import batch_order

    dev = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    data = torch.from_numpy(x).to(dev)
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(dev)
    _, train_step = torch_trainer(model, torch, lr, dev, autocast)
    classifier = model_spec(model.name).classifier

    def step(index):
        xb = data[index]
        return train_step(xb, labels[index] if classifier else xb)

    replay = None
    if graph and len(x) >= batch:  # (no full batch: nothing to replay)
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
    else:
        step(torch.arange(min(batch, len(x)), device=dev))  # warm-up: cuDNN's choices, first launches, not timed

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
    return EpochTiming(seconds, float("nan"), torch.cuda.max_memory_allocated() / 2**20, "torch_max_allocated")


def _torch_on_gpu(wanted: bool, log):
    """torch, when the PyTorch rows are wanted and torch with CUDA is importable; else None (and why, logged)."""
    if not wanted:
        return None
    try:
        import torch
    except ImportError:
        log("torch is not importable: no PyTorch reference rows")
        return None
    if not torch.cuda.is_available():
        log("torch has no CUDA device: no PyTorch reference rows")
        return None
    return torch


def time_epochs(model_name, variants, n=None, batch=64, lr=None, epochs=3, seed=0, torch_reference=True,
                max_steps=None, log=print, torch_settings=tuple(TORCH_SETTINGS), **sizes) -> pd.DataFrame:
    """Median epoch time (epochs after the first) per variant of `model_name` (EPOCH_MODELS, `sizes` overriding
    its sizes) and batch size (`batch`: one or a list) on random data of the model's input shape (n samples,
    default the model's training-set size; lr default the model's), plus PyTorch eager and CUDA-graph rows in each
    of `torch_settings` (TORCH_SETTINGS) when torch and a GPU are there; ratios to PyTorch eager in fp32 and to
    PyTorch's fastest row (named in torch_fastest) at the same batch size from this same run. Same data, init and
    batch order for every variant.

    `max_steps`: an epoch of more steps than that (batch 1: n steps) is timed over the first max_steps * batch
    samples only (the same prefix and its own permutation for every variant) and its time scaled by
    steps / max_steps; such rows have ``extrapolated`` true and ``timed_samples`` < n (their gpu_mem_mib is that
    of the smaller loaded set). A printed table ends the run (``epoch_table``)."""
    spec = EPOCH_MODELS[model_name]
    sizes = {**spec.sizes, **sizes}
    n = spec.samples if n is None else int(n)
    lr = spec.lr if lr is None else float(lr)
    batches = [int(b) for b in batch] if isinstance(batch, (list, tuple)) else [int(batch)]
    shaped = build_model(model_name, **sizes)  # its input shape and its arithmetic (gpunn.flops)
    x, y = random_training_data(n, seed, shaped.input_shape, sizes.get("classes", 1))
    torch = _torch_on_gpu(torch_reference, log)
    rows = []
    for size in batches:
        steps = -(-n // size)
        timed_steps = min(steps, max_steps) if max_steps else steps
        timed_n = n if timed_steps == steps else timed_steps * size
        xs, ys = x[:timed_n], y[:timed_n]
        timed = {}
        for variant in variants:
            log(f"{model_name} {variant}: {epochs} epochs of {timed_n} samples, batch {size} ...")
            timed[variant] = gpunn_epoch_seconds(variant, model_name, sizes, xs, ys, size, lr, epochs, seed)
        if torch is not None:
            model = build_model(model_name, **sizes, seed=seed)
            for setting in torch_settings:
                log(f"{model_name} PyTorch {setting}, eager and CUDA graph: {epochs} epochs each of {timed_n} "
                    f"samples, batch {size} ...")
                for graph in (False, True):
                    timed[torch_variant(setting, graph)] = torch_epoch_seconds(model, xs, ys, size, lr, epochs,
                                                                               seed, graph=graph, setting=setting)
            torch.cuda.empty_cache()  # the next variants' memory figures start from an empty cache
        for variant, timing in timed.items():
            seconds = timing.seconds[1:] if len(timing.seconds) > 1 else timing.seconds
            epoch_s = float(np.median(seconds)) * steps / timed_steps
            rows.append({"model": model_name, "variant": variant, "sizes": _sizes_text(sizes), "n": n, "batch": size,
                         "epoch_s": epoch_s, "extrapolated": timed_n < n, "timed_samples": timed_n,
                         "samples_per_s": n / epoch_s, "epochs": len(timing.seconds), "epoch_loss": timing.loss,
                         "gpu_mem_mib": timing.memory_mib, "gpu_mem_measure": timing.memory_measure,
                         **provenance_columns(variant)})
    frame = pd.DataFrame(rows)
    frame["ratio_to_torch_eager"] = np.nan
    frame["ratio_to_torch_fastest"] = np.nan
    frame["torch_fastest"] = ""
    for size in batches:
        at = frame["batch"] == size
        eager = frame.loc[at & (frame["variant"] == "torch-eager"), "epoch_s"]
        if len(eager):
            frame.loc[at, "ratio_to_torch_eager"] = frame.loc[at, "epoch_s"] / float(eager.iloc[0])
        torch_rows = frame[at & frame["variant"].str.startswith("torch-")]
        if len(torch_rows):
            fastest = torch_rows.loc[torch_rows["epoch_s"].idxmin()]
            frame.loc[at, "ratio_to_torch_fastest"] = frame.loc[at, "epoch_s"] / float(fastest["epoch_s"])
            frame.loc[at, "torch_fastest"] = fastest["variant"]
    frame = with_arithmetic(frame, shaped, n)[EPOCH_COLUMNS]
    log(epoch_table(frame))
    return frame


def with_arithmetic(frame: pd.DataFrame, model, n: int) -> pd.DataFrame:
    """`frame` with each row's arithmetic: the epoch's TFLOP (gpunn.flops.training_flops x n samples), the TFLOP/s
    that its epoch_s achieves, and, for GPU rows on a real GPU, that as % of the device's FP32 peak (no tensor
    cores, gpunn.device.fp32_peak_tflops) and as % of the peak in the row's own format (``row_format``: FP32, or
    the TF32 or BF16 tensor-core peak, gpunn.device.tensor_peak_tflops; NaN where the device's is unknown)."""
    from gpunn.device import device_info, simulator_enabled

    epoch_tflop = training_flops(model) * n / 1e12
    on_gpu = frame["variant"].map(_on_gpu)
    info = None if simulator_enabled() or not on_gpu.any() else device_info()
    peak = None if info is None else info["fp32_peak_tflops"]
    tflops = epoch_tflop / frame["epoch_s"]
    convolutional = any(isinstance(layer, Conv2d) for layer, _ in layer_macs(model))
    formats = frame["variant"].map(lambda variant: row_format(variant, convolutional))
    peaks = formats.map(lambda fmt: np.nan if info is None or info[f"{fmt}_peak_tflops"] is None
                        else info[f"{fmt}_peak_tflops"]).astype(float)
    return frame.assign(epoch_tflop=epoch_tflop, tflops=tflops,
                        fp32_peak_pct=(100.0 * tflops / peak).where(on_gpu) if peak else np.nan,
                        fp32_peak_tflops=peak if peak else np.nan, peak_format=formats,
                        peak_pct=(100.0 * tflops / peaks).where(on_gpu), peak_tflops=peaks.where(on_gpu))


def row_format(variant: str, convolutional: bool) -> str:
    """The number format a row's multiplications run in: a gpunn variant's policy precision (fp32, tf32, bf16);
    PyTorch's from its setting (TORCH_SETTINGS): fp32, tf32, bf16, and default: tf32 where the model has
    convolutions (cuDNN's), else fp32."""
    from gpunn.backends.gpu.policy import POLICIES  # plain data

    if variant in POLICIES:
        return POLICIES[variant].precision
    for setting in TORCH_SETTINGS:
        if variant in (torch_variant(setting, False), torch_variant(setting, True)):
            if setting == "default":
                return "tf32" if convolutional else "fp32"
            return setting
    return "fp32"


def _on_gpu(variant: str) -> bool:
    """A gpunn GPU variant or a PyTorch reference (which runs on the GPU)."""
    return uses_gpu(variant) if variant in VARIANTS else True


def epoch_table(frame: pd.DataFrame) -> str:
    """The printed summary of ``time_epochs``: variant, batch, s/epoch (marked when extrapolated), ratios to PyTorch
    eager and to PyTorch's fastest, images/s, TFLOP/s and % of the peak in the row's format, GPU memory and what it
    measures, then the legend."""
    lines = [f"{'variant':>24} {'batch':>5} {'s/epoch':>11} {'x eager':>8} {'x fastest':>9} {'images/s':>10} "
             f"{'TFLOP/s':>8} {'% peak':>12} {'GPU MiB':>8}  memory measure"]
    for row in frame.itertuples():
        mark = "*" if row.extrapolated else " "
        ratio = "" if np.isnan(row.ratio_to_torch_eager) else f"{row.ratio_to_torch_eager:.3f}"
        fastest = "" if np.isnan(row.ratio_to_torch_fastest) else f"{row.ratio_to_torch_fastest:.3f}"
        memory = "" if np.isnan(row.gpu_mem_mib) else f"{row.gpu_mem_mib:.0f}"
        peak = "" if np.isnan(row.peak_pct) else f"{row.peak_pct:.1f} {row.peak_format}"
        lines.append(f"{row.variant:>24} {row.batch:>5} {row.epoch_s:10.4f}{mark} {ratio:>8} {fastest:>9} "
                     f"{row.samples_per_s:10.0f} {row.tflops:8.3f} {peak:>12} {memory:>8}  {row.gpu_mem_measure}")
    for row in frame[frame["torch_fastest"] != ""].drop_duplicates("batch").itertuples():
        lines.append(f"x eager: over torch-eager (PyTorch in strict FP32); x fastest: over {row.torch_fastest}, "
                     f"PyTorch's fastest row at batch {row.batch} in this run")
    for row in frame[frame["extrapolated"]].drop_duplicates("batch").itertuples():
        lines.append(f"* extrapolated: at batch {row.batch}, {row.timed_samples} of {row.n} samples timed per epoch, "
                     f"the time scaled by the epoch's steps")
    for measure in dict.fromkeys(m for m in frame["gpu_mem_measure"] if m):
        lines.append(f"{measure}: {MEMORY_MEASURES[measure]}")
    first = frame.iloc[0]
    peaks = {row.peak_format: row.peak_tflops for row in frame.itertuples() if not np.isnan(row.peak_tflops)}
    peak = "" if not peaks else ("; % peak: of the GPU's peak in the row's format (" + ", ".join(
        f"{fmt}: {value:.1f} TFLOP/s" + (" without tensor cores" if fmt == "fp32" else " dense tensor cores")
        for fmt, value in peaks.items()) + ")")
    lines.append(f"TFLOP/s: {first.epoch_tflop:.4g} TFLOP per epoch (the Linear and Conv2d multiply-adds of forward, "
                 f"weight and input gradients, gpunn.flops) / s per epoch{peak}; counted as direct convolutions for "
                 f"every variant: one whose convolutions do fewer multiplications (gpu-graph's Winograd passes) is "
                 f"credited the direct count, so its figure is an equivalent rate, not the rate its FMA units ran at")
    return "\n".join(lines)


def _sizes_text(sizes: dict) -> str:
    """{'hidden': 256, 'channels': (16, 32)} -> 'hidden=256 channels=16x32' (one CSV cell)."""
    return " ".join(f"{key}={'x'.join(map(str, value)) if isinstance(value, (tuple, list)) else value}"
                    for key, value in sizes.items())


# ---------------------------------------------------------------------------------------------------------
# Where a training step's time goes: each bound launch of one step program timed alone (GPU time, queued behind a
# GPU sleep like the kernel benchmarks: gpunn.bench.core.median_launch_ms), in the step's order, beside the step's
# wall time as the variant's own epoch loop runs it; the difference is the host's share.

PROFILE_COLUMNS = ["model", "variant", "batch", "order", "phase", "launch", "grid", "block", "ms", "share",
                   "step_wall_ms", "step_gpu_ms", "kernel_ms", "step_kernels_ms", "host_overhead_us", "wall_steps",
                   *provenance.CSV_COLUMNS]
PROFILE_EPOCHS = 3   # such epochs; the median after the first (which settles caches and clocks) is kept
SIMULATOR_PROFILE_EPOCHS = 1  # under the simulator, whose times measure nothing: the loop runs once


class StepWall(NamedTuple):
    wall_ms: float  # wall milliseconds per step as the epoch loop runs them
    gpu_ms: float   # the steps' forward + backward GPU time per step (CUDA events around each phase, in the loop)


def step_wall(model_name, variant, sizes, batch, steps, epochs=None, seed=0, policy=None) -> StepWall:
    """Milliseconds per training step of `variant` as its epoch loop runs steps back to back (its own data path:
    the per-step copies and loss reads, or the resident gather; a graph variant's replays): the median epoch wall
    time over `steps` steps of random data, divided by `steps`, and the GPU time of those epochs' phases. With
    `policy`, that GPU policy's engine instead of the variant's (the simulator's eager twin of a graph variant).
    `epochs`: PROFILE_EPOCHS (SIMULATOR_PROFILE_EPOCHS under the simulator)."""
    import time

    from gpunn.device import simulator_enabled
    from gpunn.seeding import batch_order

    model = build_model(model_name, **sizes, seed=seed)
    x, y = random_training_data(batch * steps, seed, model.input_shape, sizes.get("classes", 1))
    if epochs is None:
        epochs = SIMULATOR_PROFILE_EPOCHS if simulator_enabled() else PROFILE_EPOCHS
    if policy is None:
        backend = make_backend(variant, model, model_name, EPOCH_MODELS[model_name].lr)
    else:
        from gpunn.backends.gpu.engine import GpuEngine

        backend = GpuEngine(model, model_name, EPOCH_MODELS[model_name].lr, policy)
    backend.load_train_data(x, y)
    backend.warm_up({batch})
    backend.prepare_epoch(batch)
    walls, gpus = [], []
    for epoch in range(epochs):
        start = time.perf_counter()
        result = backend.train_epoch(batch_order(seed, epoch, len(x)), batch)
        walls.append(time.perf_counter() - start)
        gpus.append(result.forward_s + result.backward_s)
        if not math.isfinite(result.loss):
            raise GpunnError(f"{variant}: a profile epoch reached a non-finite loss ({result.loss})")
    keep = slice(1, None) if epochs > 1 else slice(None)  # the first settles caches and clocks
    return StepWall(1e3 * float(np.median(walls[keep])) / steps, 1e3 * float(np.median(gpus[keep])) / steps)


def step_profile(model_name, variants, batch=64, repeats=50, seed=0, log=print, timed=True, steps=None,
                 **sizes) -> pd.DataFrame:
    """One row per launch of a training step at `batch` for each GPU variant: its median GPU time alone (``ms``) and
    share of the launches' sum (``kernel_ms``), and per variant (repeated on its rows): ``step_kernels_ms``, the
    GPU time of the step's launches run back to back (queued behind a GPU sleep, one event pair around the step:
    no host gaps, no per-launch event overhead); the step's wall time as its training loop runs it
    (``step_wall_ms``, over `steps` steps, default the model's profile_steps; ``step_gpu_ms`` the GPU time of its
    phases there, from events: launch gaps included where the host is slower than the GPU) and
    ``host_overhead_us`` = step_wall_ms - step_kernels_ms: host work, batch copies and waits, everything that is
    not kernel time. A graph variant's launches are profiled through its eager twin (the same kernels; the graph
    replays exactly these), its wall time with its graphs. Launches repeat on one random batch: the parameters
    drift, which changes no kernel's work. With `timed` false (numba's simulator, where times mean nothing) the
    rows list the launches with every time NaN."""
    import dataclasses

    from gpunn.backends.gpu.engine import GpuEngine, _launches
    from gpunn.backends.gpu.policy import POLICIES
    from gpunn.bench.core import median_launch_ms, numba_clock
    from gpunn.device import simulator_enabled
    from gpunn.kernels.launch import LaunchGroup

    sizes = {**EPOCH_MODELS[model_name].sizes, **sizes}
    steps = EPOCH_MODELS[model_name].profile_steps if steps is None else int(steps)
    sample_shape = build_model(model_name, **sizes).input_shape
    x, y = random_training_data(batch, seed, sample_shape, sizes.get("classes", 1))
    rows = []
    for variant in variants:
        policy = dataclasses.replace(POLICIES[variant], graphs=False)
        engine = GpuEngine(build_model(model_name, **sizes, seed=seed), model_name, 0.01, policy)
        if timed:
            engine.train_step(x, y)  # compiles every kernel of the program
        program = engine._step_program(batch, sample_shape)
        phases = [("forward", launch) for launch in _launches(program.forward)]
        phases += [("backward", launch) for launch in _launches(program.backward)]
        nan = float("nan")
        if timed:
            clock = numba_clock(engine.stream)
            timed_ms = [median_launch_ms(launch, repeats, clock).ms for _, launch in phases]
            kernel_ms = sum(timed_ms)
            step_ms = median_launch_ms(LaunchGroup([launch for _, launch in phases]), repeats, clock).ms
            twin = policy if simulator_enabled() and POLICIES[variant].graphs else None  # (no graphs there)
            wall_ms, gpu_ms = step_wall(model_name, variant, sizes, batch, steps, seed=seed, policy=twin)
            log(f"{model_name} {variant}: {len(phases)} launches per step, kernels {step_ms:.4f} ms back to back "
                f"({kernel_ms:.4f} ms each alone, summed), step wall {wall_ms:.4f} ms (phases in the loop "
                f"{gpu_ms:.4f} ms GPU), host overhead {1e3 * (wall_ms - step_ms):.1f} us")
        else:
            timed_ms, kernel_ms, step_ms, wall_ms, gpu_ms = [nan] * len(phases), nan, nan, nan, nan
            log(f"{model_name} {variant}: {len(phases)} launches per step (not timed)")
        step = {"step_wall_ms": wall_ms, "step_gpu_ms": gpu_ms, "kernel_ms": kernel_ms, "step_kernels_ms": step_ms,
                "host_overhead_us": 1e3 * (wall_ms - step_ms), "wall_steps": steps if timed else 0}
        for order, ((phase, launch), ms) in enumerate(zip(phases, timed_ms)):
            rows.append({"model": model_name, "variant": variant, "batch": batch, "order": order, "phase": phase,
                         "launch": launch.name, "grid": str(launch.grid), "block": str(launch.block), "ms": ms,
                         "share": ms / kernel_ms if timed else nan, **step, **provenance_columns(variant)})
            if timed:
                log(f"  {order:2d} {phase:8s} {ms:8.4f} ms {100 * ms / kernel_ms:5.1f}%  {launch.name} "
                    f"grid {launch.grid} block {launch.block}")
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)
