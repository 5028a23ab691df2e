"""Probe (issue 22, device only): variants of host_steps.sync_epoch's loop (no gather, a gather thread, no label upload,
no marks, the next upload queued before the wait, one launch fewer) against the engine's epoch, us per step.
    PYTHONPATH=src python3 docs/notes/issue-22-probe-loop.py 38400
Its output on the H100 (at 097ab22) is in issue-22-host-path.md."""
import sys, time, threading, ctypes
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from numba import cuda
from gpunn.nn import build_model
from gpunn.backends.registry import make_backend
from gpunn.timing import random_training_data, EPOCH_MODELS
from gpunn.seeding import batch_order, batch_slices
from gpunn.backends.gpu import host_steps
from gpunn.kernels import libcuda, transfers

N = int(sys.argv[1]) if len(sys.argv) > 1 else 64 * 600
lib = libcuda.library()

def gather_cost(x, order, batch=64, reps=300):
    out = transfers.host_buffer((batch, *x.shape[1:]), np.float32)
    ts = []
    for i in range(reps):
        idx = order[(i * batch) % (len(order) - batch):][:batch]
        t = time.perf_counter(); np.take(x, idx, axis=0, out=out, mode="clip"); ts.append(time.perf_counter() - t)
    return 1e6 * np.median(ts)

def loop(b, order, batch, gather_mode="inline", skip_labels=False, skip=(), early_upload=False, marks=True):
    x, y = b._loaded(); n = len(x)
    slices = batch_slices(n, batch); count = len(slices)
    plan = host_steps.sync_plan(b, n, batch, x.shape[1:]); io = b._io
    labels = b._labels(y, n)
    clock = b.epoch_clock; clock.resize(3 * count); mark = clock.mark; wait = b._step_wait
    pool = ThreadPoolExecutor(1) if gather_mode == "thread" else None
    ev = cuda.event(); evb = transfers.BoundEvent(ev, b.stream)
    q = lib.cuEventQuery if hasattr(lib, "cuEventQuery") else None

    def gather(i):
        s, e = slices[i]; slot = i % 2
        np.take(x, order[s:e], axis=0, out=io.x[slot][:e - s], mode="clip")
        np.take(labels, order[s:e], out=io.y[slot][:e - s], mode="clip")

    steps = [(ux, uy, tuple(c for k, c in enumerate(f + bw) if k not in skip), len(f), d)
             for ux, uy, f, bw, d in plan.steps]
    gather(0)
    fut = None
    t0 = time.perf_counter()
    for i, (ux, uy, calls, nf, down) in enumerate(steps):
        if fut is not None:
            fut.result(); fut = None
        if not (early_upload and i > 0):
            ux()
            if not skip_labels:
                uy()
        if marks: mark(3 * i)
        for c in calls[:nf]:
            c()
        if marks: mark(3 * i + 1)
        for c in calls[nf:]:
            c()
        if marks: mark(3 * i + 2)
        down()
        if i + 1 < count:
            if gather_mode == "inline":
                gather(i + 1)
            elif gather_mode == "thread":
                fut = pool.submit(gather, i + 1)
        if early_upload and i + 1 < count:
            evb.record()
            if fut is not None:
                fut.result(); fut = None
            steps[i + 1][0]()
            if not skip_labels:
                steps[i + 1][1]()
            evb.synchronize()
        else:
            wait()
    wait()
    wall = time.perf_counter() - t0
    if pool: pool.shutdown()
    return 1e6 * wall / count

def run(model_name, variant, configs, epochs=3, n=None):
    sizes = EPOCH_MODELS[model_name].sizes
    model = build_model(model_name, **sizes, seed=0)
    x, y = random_training_data(n or N, 0, model.input_shape, 10)
    b = make_backend(variant, model, model_name, 0.01)
    b.load_train_data(x, y); b.warm_up({64}); b.train_epoch(batch_order(0, 0, len(x)), 64)
    prog = b._step_program(64, x.shape[1:])
    from gpunn.backends.gpu.engine import _launches
    names = [getattr(l, "name", None) or getattr(getattr(l, "kernel", None), "__name__", "?") for l in _launches(prog.forward + prog.backward)]
    print(f"{model_name} {variant}: {len(names)} launches; gather alone {gather_cost(x, batch_order(0, 1, len(x))):.1f} us")
    t0 = time.perf_counter()
    for _ in range(2):
        b.train_epoch(batch_order(0, 1, len(x)), 64)
    res = {}
    for e in range(epochs):
        t = time.perf_counter(); b.train_epoch(batch_order(0, e, len(x)), 64)
        res.setdefault("sync_epoch", []).append(1e6 * (time.perf_counter() - t) / len(batch_slices(len(x), 64)))
        for name, kw in configs:
            res.setdefault(name, []).append(loop(b, batch_order(0, e, len(x)), 64, **kw))
    for name, v in res.items():
        print(f"   {name:28s} {np.median(v):7.1f} us/step  {[round(a, 1) for a in v]}")

configs = [("hand", {}), ("no gather", dict(gather_mode="none")), ("thread gather", dict(gather_mode="thread")),
           ("no label upload", dict(skip_labels=True)), ("no marks", dict(marks=False)),
           ("early upload", dict(early_upload=True)), ("early upload + thread", dict(early_upload=True, gather_mode="thread")),
           ("minus 1 launch", dict(skip=(8,)))]
lib.cuEventQuery = getattr(lib, "cuEventQuery")
run("mlp", "gpu-tiled", configs)
run("mlp", "gpu-naive", configs[:3] + configs[5:7])
run("cnn", "gpu-naive", [("hand", {}), ("early upload", dict(early_upload=True))], epochs=2, n=64 * 60)
run("cnn", "gpu-optimized", [], epochs=2, n=64 * 300)
