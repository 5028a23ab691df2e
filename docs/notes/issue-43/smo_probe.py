"""Issue 43's probe (stops 60, 61) of gpunn.smo on a GPU (not a test; run from the repository root, PYTHONPATH=src):
    python docs/notes/issue-43/smo_probe.py OUT [n_train n_sub n_test dim]   (defaults: E6's 50000 10000 10000 8192)
1. A stratified subset of n_sub training rows: libsvm (SVC precomputed on the same float32 kernel values) beside
   gpu-smo: each pair's dual objective, prediction agreement on the test points, accuracies, times.
2. E6's shape with synthetic features (10 overlapping Gaussian classes in 8 192 dimensions, standardised, gamma
   'scale' = 1 / D): the float32 training kernel (GpuSmoRoute's: row blocks, mirrored) and (train, test) kernel on
   the GPU, gpu-smo's fit (C = 10) with the working sets chosen on the GPU, then on the host, and its predictions,
   each timed after a sync.
Writes OUT/probe.json after each part and prints a summary."""

import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

from gpunn.device import describe_device
from gpunn.kernels.gemm import rbf
from gpunn.smo import GpuSmo, GpuSmoRoute

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 50000
n_sub = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
n_test = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
dim = int(sys.argv[5]) if len(sys.argv) > 5 else 8192
classes, C = 10, 10.0
facts = {"device": describe_device(), "n_train": n_train, "n_test": n_test, "dim": dim}


def log(line):
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def clock(fn):
    cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    cuda.synchronize()
    return result, time.perf_counter() - t0


rng = np.random.default_rng(0)
centers = rng.standard_normal((classes, dim), dtype=np.float32) * 0.02
y = np.arange(n_train) % classes
yt = np.arange(n_test) % classes
x = centers[y] + rng.standard_normal((n_train, dim), dtype=np.float32)
xt = centers[yt] + rng.standard_normal((n_test, dim), dtype=np.float32)
mean, std = x.mean(0, dtype=np.float64), x.std(0, dtype=np.float64)
x = ((x - mean) / std)
xt = ((xt - mean) / std)
gamma = 1.0 / (dim * float(x.var(dtype=np.float64)))
log(f"features ready: {n_train} + {n_test} x {dim}, gamma {gamma:.4g}")


def kernel(a, b):
    """float32 rbf(a, b) on the device, (len(a), len(b)), from float64 operands."""
    da, db = cuda.to_device(a.astype(np.float64)), cuda.to_device(b.astype(np.float64))
    a_sq, b_sq = cuda.device_array(len(a)), cuda.device_array(len(b))
    rbf.row_sq_norms(da, a_sq)
    rbf.row_sq_norms(db, b_sq)
    k = cuda.device_array((len(a), len(b)), dtype=np.float32)
    rbf.rbf_gemm(da, db, k, a_sq, b_sq, gamma)
    return k


kernel(x[:64], x[:64])  # compile
# the subset beside libsvm
from sklearn.svm import SVC  # noqa: E402

sub = np.concatenate([np.flatnonzero(y == c)[:n_sub // classes] for c in range(classes)])
ks = kernel(x[sub], x[sub])
kst = kernel(x[sub], xt)
ks_host, kst_host = ks.copy_to_host().astype(np.float64), kst.copy_to_host().astype(np.float64)
t0 = time.perf_counter()
svc = SVC(kernel="precomputed", C=C, cache_size=1024).fit(ks_host, y[sub])
facts["sub_libsvm_fit_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
ref = svc.predict(kst_host.T)
facts["sub_libsvm_predict_s"] = time.perf_counter() - t0
GpuSmo(C, log=log).fit(kernel(x[:300], x[:300]), y[:300])  # compile the solver's kernels
mod, facts["sub_fit_s"] = clock(lambda: GpuSmo(C, log=log, progress_every_s=5).fit(ks, y[sub]))
got = mod.predict(kst)
facts.update(sub_n=int(sub.size), sub_agreement=float(np.mean(got == ref)),
             sub_acc_gpu=float(np.mean(got == yt)), sub_acc_libsvm=float(np.mean(ref == yt)),
             sub_support_gpu=int(mod.support_.size), sub_support_libsvm=int(svc.support_.size),
             sub_fit_parts_s=mod.seconds_, sub_rounds_max=int(mod.rounds_.max()))
# each pair's dual objective from libsvm's coefficients
sv, coef, lab = svc.support_, svc.dual_coef_, y[sub]
rel = []
for p, (a, b) in enumerate(mod.problems_.pairs):
    ia, ib = np.flatnonzero(lab[sv] == a), np.flatnonzero(lab[sv] == b)
    rows = np.concatenate([sv[ia], sv[ib]])
    cc = np.concatenate([coef[b - 1, ia], coef[a, ib]])
    obj = 0.5 * cc @ ks_host[np.ix_(rows, rows)] @ cc - np.abs(cc).sum()
    rel.append(abs(mod.objective_[p] - obj) / abs(obj))
facts["sub_objective_rel_max"] = float(max(rel))
(out / "probe.json").write_text(json.dumps(facts, indent=1) + "\n")
log("subset done: " + json.dumps(facts))
ks = kst = None

route = GpuSmoRoute(C, gamma, log)  # the svm step's kernels: row blocks from the diagonal, mirrored
route.kernels(x.astype(np.float64), xt.astype(np.float64))
k_train, k_test = route.train_kernel, route.test_kernel
facts["kernel_s"], facts["test_kernel_s"] = route.kernel_time, route.predict_kernel_time
check = kernel(x[4096:8192], x[:8192]).copy_to_host()  # the second row block (half mirrored) against one whole
facts["mirror_max_abs_diff"] = float(np.abs(k_train[4096:8192].copy_to_host()[:, :8192] - check).max())
log(f"kernels: train {facts['kernel_s']:.2f} s, test {facts['test_kernel_s']:.2f} s")
GpuSmo(C, log=log, selection="gpu").fit(kernel(x[:300], x[:300]), y[:300])  # compile the selection kernel
gpu_sel, facts["fit_gpu_selection_s"] = clock(lambda: GpuSmo(C, log=log, selection="gpu").fit(k_train, y))
facts["fit_gpu_selection_parts_s"] = gpu_sel.seconds_
model, facts["fit_s"] = clock(lambda: GpuSmo(C, log=log, progress_every_s=5).fit(k_train, y))
facts["selections_agree"] = bool(np.array_equal(gpu_sel.predict(k_test), model.predict(k_test)))
facts["fit_parts_s"] = model.seconds_
facts["rounds"] = model.rounds_.tolist()
facts["support_vectors"] = int(model.support_.size)
pred, facts["predict_s"] = clock(lambda: model.predict(k_test))
facts["test_accuracy"] = float(np.mean(pred == yt))
facts["train_accuracy"] = float(np.mean(model.predict(k_train) == y))
log(f"gpu-smo full: fit {facts['fit_s']:.2f} s {model.seconds_}, rounds max {max(facts['rounds'])}, "
    f"{facts['support_vectors']} SVs, predict {facts['predict_s']:.2f} s, test acc {facts['test_accuracy']:.4f}")

log(json.dumps({k: v for k, v in facts.items() if k != "rounds"}))
(out / "probe.json").write_text(json.dumps(facts, indent=1) + "\n")
