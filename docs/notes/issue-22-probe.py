"""Probe (issue 22, run on the GPU machine): driver call costs and a hand-written host-batch step loop with a
timestamp between its parts, against the engine's own epochs (cuStreamSynchronize vs polling). Needs a real GPU:
    PYTHONPATH=src python3 docs/notes/issue-22-probe.py
Its output on the H100 is in issue-22-host-path.md."""
import ctypes, time, sys
import numpy as np
from numba import cuda
from gpunn.kernels import libcuda
from gpunn.nn import build_model
from gpunn.backends.registry import make_backend
from gpunn.timing import random_training_data, EPOCH_MODELS
from gpunn.seeding import batch_order

lib = libcuda.library()
cuda.current_context()
flags = ctypes.c_uint()
lib.cuCtxGetFlags = getattr(lib, "cuCtxGetFlags"); lib.cuCtxGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint)]
print("ctx flags", lib.cuCtxGetFlags(ctypes.byref(flags)), flags.value)

def per_call_us(fn, n=3000):
    for _ in range(100): fn()
    t = time.perf_counter()
    for _ in range(n): fn()
    return 1e6 * (time.perf_counter() - t) / n

ev = cuda.event()
rec = libcuda.bound("cuEventRecord", int(ev.handle), 0)
sync = libcuda.bound("cuStreamSynchronize", 0)
print(f"cuEventRecord ctypes {per_call_us(rec):.2f} us")
from cuda.bindings import driver as cu
print(f"cuEventRecord bindings {per_call_us(lambda: cu.cuEventRecord(int(ev.handle), 0)):.2f} us")
print(f"cuStreamSynchronize idle {per_call_us(sync):.2f} us")
q = lib.cuStreamQuery; q.argtypes = [ctypes.c_void_p]; q.restype = ctypes.c_int
print(f"cuStreamQuery idle {per_call_us(lambda: q(None)):.2f} us")

@cuda.jit
def tiny(a):
    a[0] = 1.0
from gpunn.kernels.launch import bind
a = cuda.device_array(1, np.float32)
l = bind(tiny, 1, 32, (a,)); l(); cuda.synchronize()
print(f"tiny launch (1 array) {per_call_us(l):.2f} us (direct={l.direct}, packed={l.packed})"); cuda.synchronize()
def launch_then_sync(): l(); sync()
print(f"tiny launch + sync {per_call_us(launch_then_sync, 2000):.2f} us"); 

model_name, variant = "mlp", "gpu-tiled"
for model_name, variant in [("mlp", "gpu-tiled"), ("cnn", "gpu-naive")]:
    sizes = EPOCH_MODELS[model_name].sizes
    model = build_model(model_name, **sizes, seed=0)
    x, y = random_training_data(64 * 200, 0, model.input_shape, 10)
    b = make_backend(variant, model, model_name, 0.01)
    b.load_train_data(x, y); b.warm_up({64}); b.train_epoch(batch_order(0, 0, len(x)), 64)
    prog = b._step_program(64, x.shape[1:])
    from gpunn.backends.gpu.engine import _launches
    single = list(_launches(prog.forward + prog.backward))
    print(model_name, variant, "launches", len(single), [f"{per_call_us(s, 300):.1f}" for s in single[:6]]); cuda.synchronize()
    from gpunn.backends.gpu import host_steps
    from gpunn.kernels import transfers
    io = host_steps.host_io(b, 64, x.shape[1:])
    copies = (*host_steps.uploads(b, io, prog, 64, 0),
              transfers.BoundCopy(prog.losses, io.losses[:64], b.stream, upload=False))
    clock = b.epoch_clock; clock.resize(3)
    marks = np.zeros((200, 8))
    idx = np.arange(64)
    for i in range(200):
        t0 = time.perf_counter()
        copies[0](); copies[1]()
        t1 = time.perf_counter()
        clock.mark(0); b._execute(prog.forward); clock.mark(1)
        t2 = time.perf_counter()
        b._execute(prog.backward); clock.mark(2)
        t3 = time.perf_counter()
        copies[2]()
        np.take(x, idx, axis=0, out=io.x[1][:64], mode="clip")
        t4 = time.perf_counter()
        sync()
        t5 = time.perf_counter()
        s = float(np.sum(io.losses[:64], dtype=np.float64))
        t6 = time.perf_counter()
        marks[i] = [t0, t1, t2, t3, t4, t5, t6, 1e-3 * clock.seconds(0, 2)]
    d = np.diff(marks[:, :7], axis=1) * 1e6
    print("  upload / fwd launches / bwd launches / download+gather / sync wait / loss sum (us, median):",
          np.round(np.median(d, axis=0), 1), "gpu phases", round(1e6 * np.median(marks[:, 7]) * 1e3, 1),
          "step", round(np.median(marks[1:, 0] - marks[:-1, 0]) * 1e6, 1))
    # whole epochs with stream sync vs spin on query
    for mode in ("sync", "spin"):
        b._step_wait = transfers.synchronizer(b.stream, spin=mode == "spin")
        ws = []
        for e in range(3):
            t = time.perf_counter(); r = b.train_epoch(batch_order(0, e, len(x)), 64); ws.append(time.perf_counter() - t)
        print(f"  epoch {mode}: {1e6 * np.median(ws) / 200:.1f} us/step, phases {1e6 * (r.forward_s + r.backward_s) / 200:.1f} us")
