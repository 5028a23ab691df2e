"""Issue 42 probe (device, stop 57): where the MLP's and CNN's resident epochs lose time between steps, and whether
one CUDA graph of the whole epoch removes it. Per model and variant, epochs of the bench's random data (batch 64,
the model's training-set size), wall seconds, median of the epochs after the first:
  engine   the engine's loop today: per step two graph launches through cuda.core and two clock marks;
  ctypes   the same loop with each graph launched by one ctypes cuGraphLaunch (the marks as today);
  epoch    one graph of the whole epoch: every step's forward and backward launches, with the clock's marks as
           event-record nodes (cuEventRecordWithFlags(..., CU_EVENT_RECORD_EXTERNAL) while capturing), launched
           once an epoch; its forward / backward sums from those events beside the engine loop's;
  bare     the same without the event nodes.
Every path trains a fresh backend from the same seed for the same epochs: the epoch losses must be equal bit for bit
(the variants are deterministic), else the probe exits 1.

    python docs/notes/issue-42/epoch_graph_probe.py OUT [models] [variants] [epochs]"""
import ctypes
import sys
import time

import numpy as np

from gpunn.backends.registry import make_backend
from gpunn.device import open_cuda
from gpunn.kernels import libcuda
from gpunn.nn import build_model
from gpunn.seeding import batch_order, batch_slices
from gpunn.timing import EPOCH_MODELS, random_training_data

out_dir = sys.argv[1]
MODELS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mlp", "cnn"]
VARIANTS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["gpu-graph", "gpu-tf32", "gpu-bf16"]
EPOCHS = int(sys.argv[4]) if len(sys.argv) > 4 else 5
BATCH = 64
CU_EVENT_RECORD_EXTERNAL = 1

lib = libcuda.library()
lib.cuGraphLaunch.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
lib.cuEventRecordWithFlags.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)


def check(err, what):
    if err:
        raise RuntimeError(f"{what}: CUDA error {err}")


def backend_for(variant, model_name, x, y):
    spec = EPOCH_MODELS[model_name]
    open_cuda()
    backend = make_backend(variant, build_model(model_name, **spec.sizes, seed=0), model_name, spec.lr)
    backend.load_train_data(x, y)
    backend.warm_up({e - s for s, e in batch_slices(len(x), BATCH)})
    backend.prepare_epoch(BATCH)
    return backend


def engine_epochs(backend, n):
    seconds, losses, split = [], [], []
    for epoch in range(EPOCHS):
        order = batch_order(0, epoch, n)
        start = time.perf_counter()
        result = backend.train_epoch(order, BATCH)
        seconds.append(time.perf_counter() - start)
        losses.append(result.loss)
        split.append((result.forward_s, result.backward_s))
    return seconds, losses, split


def ctypes_epochs(backend, n):
    """The engine's resident epoch with its graph launches through ctypes."""
    eng = backend.engine if hasattr(backend, "engine") else backend
    stream = ctypes.c_void_p(int(eng.core_stream.handle))
    seconds, losses = [], []
    for epoch in range(EPOCHS):
        order = batch_order(0, epoch, n)
        start = time.perf_counter()
        source, _, order_d, loss_d = eng._resident
        programs = eng._resident_programs(BATCH)
        order_d.copy_to_device(np.asarray(order, dtype=np.int32), stream=eng.stream)
        eng.counter.copy_to_device(np.zeros(1, dtype=np.int32), stream=eng.stream)
        clock = eng.epoch_clock
        clock.mark(0)
        handles = {}
        for i, program in enumerate(programs):
            for j, launches in enumerate((program.forward, program.backward)):
                key = id(launches)
                if key not in handles:
                    handles[key] = ctypes.c_void_p(int(eng._graph(launches).handle))
                check(lib.cuGraphLaunch(handles[key], stream), "cuGraphLaunch")
                clock.mark(2 * i + 1 + j)
        per_sample = loss_d.copy_to_host(stream=eng.stream)
        eng._sync_stream()
        seconds.append(time.perf_counter() - start)
        losses.append(float(np.sum(per_sample, dtype=np.float64)) / source.shape[0])
    return seconds, losses


def epoch_graph(eng, events: bool):
    programs = eng._resident_programs(BATCH)
    clock = eng.epoch_clock
    clock.resize(2 * len(programs) + 1)
    builder = eng.core_stream.create_graph_builder().begin_building()
    capture = ctypes.c_void_p(int(builder.stream.handle)) if events else None

    def mark(i):
        if events:
            check(lib.cuEventRecordWithFlags(ctypes.c_void_p(clock._handles[i]), capture,
                                             CU_EVENT_RECORD_EXTERNAL), "cuEventRecordWithFlags")

    t0 = time.perf_counter()
    mark(0)
    nodes = 0
    for i, program in enumerate(programs):
        for launch in program.forward:
            launch.on(builder)
        mark(2 * i + 1)
        for launch in program.backward:
            launch.on(builder)
        mark(2 * i + 2)
        nodes += len(program.forward) + len(program.backward)
    t1 = time.perf_counter()
    graph = builder.end_building().complete()
    t2 = time.perf_counter()
    print(f"   epoch graph ({'events' if events else 'bare'}): {len(programs)} steps, {nodes} launch entries, "
          f"capture {t1 - t0:.3f} s, instantiate {t2 - t1:.3f} s", flush=True)
    return graph, len(programs)


def graph_epochs(backend, n, events):
    eng = backend.engine if hasattr(backend, "engine") else backend
    graph, steps = epoch_graph(eng, events)
    stream = ctypes.c_void_p(int(eng.core_stream.handle))
    handle = ctypes.c_void_p(int(graph.handle))
    seconds, losses, split = [], [], []
    for epoch in range(EPOCHS):
        order = batch_order(0, epoch, n)
        start = time.perf_counter()
        source, _, order_d, loss_d = eng._resident
        order_d.copy_to_device(np.asarray(order, dtype=np.int32), stream=eng.stream)
        eng.counter.copy_to_device(np.zeros(1, dtype=np.int32), stream=eng.stream)
        check(lib.cuGraphLaunch(handle, stream), "cuGraphLaunch")
        per_sample = loss_d.copy_to_host(stream=eng.stream)
        eng._sync_stream()
        seconds.append(time.perf_counter() - start)
        losses.append(float(np.sum(per_sample, dtype=np.float64)) / source.shape[0])
        if events:
            c = eng.epoch_clock
            split.append((sum(c.seconds(2 * i, 2 * i + 1) for i in range(steps)),
                          sum(c.seconds(2 * i + 1, 2 * i + 2) for i in range(steps))))
    return seconds, losses, split, graph


rows, failed = [], False
for model_name in MODELS:
    spec = EPOCH_MODELS[model_name]
    n = spec.samples
    shaped = build_model(model_name, **spec.sizes)
    x, y = random_training_data(n, 0, shaped.input_shape, spec.sizes.get("classes", 1))
    for variant in VARIANTS:
        results = {}
        b = backend_for(variant, model_name, x, y)
        s, losses, split = engine_epochs(b, n)
        results["engine"] = (s, losses, split)
        b = backend_for(variant, model_name, x, y)
        s, losses = ctypes_epochs(b, n)
        results["ctypes"] = (s, losses, None)
        graphs = []
        for label, events in (("epoch", True), ("bare", False)):
            b = backend_for(variant, model_name, x, y)
            try:
                s, losses, split, graph = graph_epochs(b, n, events)
            except Exception as exc:  # noqa: BLE001 (a probe: report and go on)
                print(f"   {label}: FAILED {type(exc).__name__}: {exc}", flush=True)
                failed = True
                continue
            graphs.append((graph, b))  # kept alive until the model's rows are done
            results[label] = (s, losses, split or None)
        ref = results["engine"][1]
        for label, (s, losses, split) in results.items():
            same = losses == ref
            failed |= not same
            med = float(np.median(s[1:]))
            fwd = bwd = float("nan")
            if split:
                fwd = float(np.median([f for f, _ in split[1:]]))
                bwd = float(np.median([b_ for _, b_ in split[1:]]))
            rows.append((model_name, variant, label, med, med / (-(-n // BATCH)) * 1e6, fwd, bwd, same))
            print(f"{model_name:4s} {variant:9s} {label:7s} epoch {med:.4f} s ({rows[-1][4]:.1f} us a step) "
                  f"forward {fwd:.4f} backward {bwd:.4f} losses equal {same}  {[f'{v:.6f}' for v in losses]}",
                  flush=True)
with open(f"{out_dir}/epoch_graph_probe.csv", "w") as f:
    f.write("model,variant,path,epoch_s,step_us,forward_s,backward_s,losses_equal\n")
    f.writelines(",".join(map(str, r)) + "\n" for r in rows)
sys.exit(1 if failed else 0)
