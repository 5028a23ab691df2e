"""E6: an RBF support-vector machine on the autoencoder's encoder features.

Three routes:

* ``method="exact"``: ``StandardScaler -> SVC(kernel="rbf", C, gamma)``, the setting of the paper (which
  ran it with cuML on a GPU). libsvm evaluates each kernel value as a D-long dot product, one at a time, so
  its cost grows like n_train^2 * n_features. When the float64 n_train x n_train kernel matrix fits in memory
  (``precompute_kernel``), it is computed once and SVC is trained on it with ``kernel="precomputed"``: the
  same model (same dual problem, solver and one-vs-one voting, kernel values equal up to float rounding),
  many times faster. Where that kernel is computed is ``kernel_device``: ``"gpu"`` by our float64 RBF GEMM
  (gpunn.kernels.gemm.rbf, ``rbf_kernel_gpu_into``: row blocks sized to the GPU's free memory, streamed
  into the host matrix), ``"cpu"`` by NumPy's BLAS (``rbf_kernel_into``), ``"auto"`` the GPU when a real one
  is present (never the simulator), else the CPU. The test-vs-train kernel is computed with the training one,
  before the fit, so that a GPU the job borrows (gpunn.placement --borrow: the pipeline's svm job) is held only
  while they are computed and is free for other jobs while libsvm fits and predicts on the CPU. Without a GPU,
  only a subset of the 50 000 training rows is practical (``train_subset``; ``"auto"``: all rows when the GPU
  computes the kernel and its matrix fits in memory, else a stratified 5 000, with the reason logged); a subset
  run says so in its log, its metrics.json (``subset``, ``train_subset``, ``n_train_total``) and its figure title.
* ``method="nystroem"``: an APPROXIMATION for the full set on a CPU: ``StandardScaler -> Nystroem(rbf,
  gamma, n_components) -> LinearSVC(C)``. The gamma is the numeric value ``gamma="scale"`` would give on
  the scaled training features, ``1 / (n_features * X_scaled.var())``, so both routes use the same kernel.
  The linear SVM is one-vs-rest on an explicit ``n_components``-dimensional approximation of the kernel
  feature map, where SVC is one-vs-one on the exact kernel: expect accuracies close to, not equal to, the
  exact route's.
* ``method="gpu-smo"``: SVC's model (the same duals, tolerance, bias and votes) solved on the GPU by our SMO
  solver (gpunn.smo), its float32 kernel matrices computed and kept there (a cache of kernel rows where they do not
  fit), predictions on the GPU too; all training rows.

Inputs are ``.npy`` files: float features of shape (N, D) (trailing dimensions, e.g. an (N, 128, 8, 8)
latent, are flattened) and integer labels of shape (N,). Every output is written atomically and only
after all inputs were validated, with ``metrics.json`` last, so a failed run leaves nothing behind. The fit and
the predictions run under the machine-wide timing lock (gpunn.timing_lock); ``metrics.json`` records the
seconds waited for it and where the result came from (``provenance``, gpunn.provenance).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn import placement, provenance
from gpunn.errors import GpunnError, remake_hint
from gpunn.io import write_csv, write_json
from gpunn.rbf_kernel import gb, rbf_kernel_gpu_into, rbf_kernel_into
from gpunn.report.titles import count
from gpunn.timing_lock import timing_lock

METHODS = ("exact", "nystroem", "gpu-smo")
PREDICTIONS = "predictions.csv"  # each test point's row in the test features, true and predicted label

# Separate random streams for the train and the test subset, so changing one size never moves the other.
_TRAIN_STREAM = 0
_TEST_STREAM = 1

# libsvm's kernel cache in MB (sklearn's default is 200). Only speed depends on it, never the result.
_SVC_CACHE_MB = 1024
# "auto" precomputes the exact kernel matrix when its float64 copy takes at most this share of the memory.
_KERNEL_MEMORY_FRACTION = 0.4
# Where the precomputed kernel is computed (resolve_kernel_device), and train_subset "auto"'s subset size.
KERNEL_DEVICES = ("auto", "cpu", "gpu")
AUTO_TRAIN_SUBSET = 5000


# --------------------------------------------------------------------------------------------- inputs
def _load_npy(path, what: str) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise GpunnError(f"{path}: {what} file not found; run the feature-extraction step first or fix the path")
    try:
        # memory-mapped, so that a small subset of a large feature file reads only the rows it needs
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # corrupt header, pickled object array, not an .npy at all
        raise GpunnError(f"{path}: cannot read {what} as a .npy array ({exc}); {remake_hint(path)}") from exc


def _check_features(arr: np.ndarray, path) -> None:
    if arr.ndim < 2:
        raise GpunnError(
            f"{path}: features must have shape (N, D), got {arr.shape}; save one row per sample")
    if arr.shape[0] == 0 or math.prod(arr.shape[1:]) == 0:
        raise GpunnError(f"{path}: features are empty (shape {arr.shape}); {remake_hint(path)}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise GpunnError(f"{path}: features must be numeric, got dtype {arr.dtype}; save them as float32")


def _check_labels(arr: np.ndarray, path, n_rows: int, features_path) -> np.ndarray:
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise GpunnError(f"{path}: labels must have shape (N,), got {arr.shape}; save one integer per sample")
    if not np.issubdtype(arr.dtype, np.integer):
        raise GpunnError(f"{path}: labels must be integers, got dtype {arr.dtype}; save them as int64")
    if arr.shape[0] != n_rows:
        raise GpunnError(
            f"{path}: {arr.shape[0]} labels but {features_path} has {n_rows} feature rows; "
            "regenerate the two files together")
    labels = np.asarray(arr, dtype=np.int64)
    if labels.min() < 0:
        raise GpunnError(f"{path}: labels must be non-negative class indices, found {labels.min()}")
    return labels


def _materialise(features: np.ndarray, rows: np.ndarray | None, path) -> np.ndarray:
    """The selected rows as a C-contiguous float32 (n, D) array; NaN or inf are refused."""
    x = features if rows is None else features[rows]
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1)
    if not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x).all(axis=1)))
        raise GpunnError(
            f"{path}: {bad} of the selected feature rows contain NaN or inf; "
            "the encoder probably diverged: retrain it or regenerate the features")
    return x


def stratified_subset(labels: np.ndarray, n: int | None, seed: int = 0, stream: int = _TRAIN_STREAM) -> np.ndarray:
    """Sorted row indices of a stratified random subset of ``n`` rows (all rows when ``n`` is None or >= len).

    Each class gets its share of ``n`` in proportion to its frequency (largest remainders break ties, every
    class present keeps at least one row when ``n`` allows); the rows within a class are drawn without
    replacement from ``default_rng([seed, stream])``. The same (labels, n, seed, stream) always gives the same
    indices.
    """
    labels = np.asarray(labels)
    total = labels.shape[0]
    if n is None or n >= total:
        return np.arange(total)
    n = int(n)
    if n <= 0:
        raise GpunnError(f"subset size must be positive, got {n}")
    classes, counts = np.unique(labels, return_counts=True)
    if n < classes.size:
        raise GpunnError(
            f"a stratified subset of {n} rows cannot hold all {classes.size} classes; ask for at least {classes.size}")
    exact = counts * (n / total)
    take = np.floor(exact).astype(np.int64)
    # largest remainders get the rows left over (fewer than the number of classes; no class can overflow,
    # since exact < counts whenever n < total)
    order = np.argsort(-(exact - take), kind="stable")
    take[order[: n - int(take.sum())]] += 1
    # every class present keeps at least one row, taken from the currently largest share
    for i in np.flatnonzero(take == 0):
        take[int(np.argmax(take))] -= 1
        take[i] = 1
    rng = np.random.default_rng([int(seed), int(stream)])
    chosen = []
    for cls, k in zip(classes, take):
        rows = np.flatnonzero(labels == cls)
        chosen.append(rng.choice(rows, size=int(k), replace=False))
    return np.sort(np.concatenate(chosen))


def _resolve_class_names(class_names: Sequence[str] | None, classes: np.ndarray) -> list[str]:
    if class_names is None:
        return [str(int(c)) for c in classes]
    names = [str(n) for n in class_names]
    if int(classes.max()) >= len(names):
        raise GpunnError(
            f"class_names has {len(names)} entries but the labels go up to {int(classes.max())}; "
            "give one name per class index")
    return [names[int(c)] for c in classes]


def resolve_gamma(gamma, x_scaled: np.ndarray) -> float:
    """The numeric RBF gamma SVC would use: 'scale' = 1 / (D * X.var()), 'auto' = 1 / D, or the number."""
    n_features = x_scaled.shape[1]
    if gamma == "scale":
        var = float(x_scaled.var(dtype=np.float64))
        return 1.0 / (n_features * var) if var > 0 else 1.0
    if gamma == "auto":
        return 1.0 / n_features
    try:
        value = float(gamma)
    except (TypeError, ValueError):
        raise GpunnError(f"svm gamma must be 'scale', 'auto' or a positive number, got {gamma!r}") from None
    if not value > 0:
        raise GpunnError(f"svm gamma must be positive, got {gamma!r}")
    return value


# ---------------------------------------------------------------------------------------------- model
def _physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def kernel_bytes(n_train: int, n_test: int = 0) -> int:
    """Bytes of the float64 n_train x n_train kernel matrix and, given n_test, the n_test x n_train test kernel."""
    return 8 * int(n_train) * (int(n_train) + int(n_test))


def kernel_fits_in_memory(n_train: int, fraction: float = _KERNEL_MEMORY_FRACTION, n_test: int = 0) -> bool:
    """Whether the float64 kernel matrices (kernel_bytes) take at most `fraction` of the physical memory."""
    return kernel_bytes(n_train, n_test) <= fraction * _physical_memory_bytes()


def _gpu_present() -> bool:
    """A real CUDA GPU is usable here (the simulator does not count: "auto" never picks it)."""
    from gpunn import device

    if device.simulator_enabled():
        return False
    from numba import cuda

    return bool(cuda.is_available())


def resolve_kernel_device(kernel_device: str) -> str:
    """'gpu' or 'cpu': where the precomputed RBF kernel is computed. 'auto' is the GPU when a real one is
    present (not numba's simulator), else the CPU; 'gpu' needs a GPU or the simulator (tiny sizes only)."""
    if kernel_device not in KERNEL_DEVICES:
        raise GpunnError(f"svm kernel_device must be one of {', '.join(KERNEL_DEVICES)}, got {kernel_device!r}")
    if kernel_device == "auto":
        return "gpu" if _gpu_present() else "cpu"
    if kernel_device == "gpu":
        from gpunn import device

        device.require_gpu("svm kernel_device 'gpu'")
    return kernel_device


def resolve_train_subset(train_subset, n_total: int, method: str, kernel_device: str,
                         precompute_kernel) -> tuple[int | None, str | None]:
    """The training subset size (None: all rows) and, for ``"auto"``, why. ``kernel_device`` is resolved.

    "auto" takes all rows for the Nystroem route (made for the full set) and gpu-smo (its own check of the
    GPU's memory refuses a set that does not fit), and for the exact route when the GPU
    computes the kernel and its float64 matrix fits in memory (``kernel_fits_in_memory``); otherwise a
    stratified ``AUTO_TRAIN_SUBSET`` rows (libsvm or a CPU BLAS kernel on 50 000 x 8 192 takes hours on a
    small machine; set 0 for all rows where the CPU and memory allow)."""
    if train_subset is None or train_subset == 0:
        return None, None
    if train_subset != "auto":
        if isinstance(train_subset, bool) or not isinstance(train_subset, (int, np.integer)) or train_subset < 0:
            raise GpunnError(f"svm train_subset must be 'auto', 0 (all rows) or a positive row count, "
                             f"got {train_subset!r}")
        return int(train_subset), None
    if method == "nystroem":
        return None, "the Nystroem route is made for the full set"
    if method == "gpu-smo":
        return None, "gpu-smo keeps its float32 kernel matrices (or a cache of their rows) on the GPU"
    matrix = f"its float64 {n_total} x {n_total} matrix ({gb(kernel_bytes(n_total))})"
    if kernel_device == "gpu" and precompute_kernel is not False and kernel_fits_in_memory(n_total):
        return None, f"the GPU computes the kernel and {matrix} fits in memory"
    if n_total <= AUTO_TRAIN_SUBSET:
        return None, f"all {n_total} rows are at most {AUTO_TRAIN_SUBSET}"
    if kernel_device != "gpu":
        why = "no GPU computes the kernel here (kernel_device cpu)"
    elif precompute_kernel is False:
        why = "the kernel is not precomputed (precompute_kernel false)"
    else:
        why = (f"{matrix} exceeds {_KERNEL_MEMORY_FRACTION:.0%} of this machine's memory "
               f"({gb(_physical_memory_bytes())})")
    return AUTO_TRAIN_SUBSET, why


class _PrecomputedRbfSVC:
    """SVC(kernel="rbf") trained on a precomputed kernel matrix (kernel="precomputed"), computed on the GPU
    (``rbf_kernel_gpu_into``) or with CPU BLAS (``rbf_kernel_into``): the same dual problem, the same libsvm
    solver and one-vs-one voting, so the same model as SVC on the raw features up to float rounding of the
    kernel values, but each kernel evaluation is a lookup instead of a D-long dot product. kernels() computes
    the training and test kernels (all of the device's work), then fit() and predict() run libsvm on the CPU.
    Costs 8 * n_train * (n_train + n_test) bytes of host memory."""

    def __init__(self, C: float, gamma_value: float, kernel_device: str, log):
        from sklearn.svm import SVC

        self.gamma_value = gamma_value
        self.kernel_device = kernel_device
        self.log = log
        self.svc = SVC(kernel="precomputed", C=C, cache_size=_SVC_CACHE_MB)

    def _kernel(self, out, a, b, what):
        if self.kernel_device == "gpu":
            return rbf_kernel_gpu_into(out, a, b, self.gamma_value, log=self.log, what=what)
        return rbf_kernel_into(out, a, b, self.gamma_value, log=self.log, what=what)

    def kernels(self, xs_train: np.ndarray, xs_test: np.ndarray) -> None:
        """The n_train x n_train training kernel and the n_test x n_train test kernel of scaled features."""
        n, m = xs_train.shape[0], xs_test.shape[0]
        t0 = time.perf_counter()
        self.train_kernel = self._kernel(np.empty((n, n), dtype=np.float64), xs_train, None, "train kernel")
        self.kernel_time = time.perf_counter() - t0
        self.log(f"svm[exact]: {n} x {n} kernel matrix computed on the {self.kernel_device} in "
                 f"{self.kernel_time:.2f} s")
        t0 = time.perf_counter()
        self.test_kernel = self._kernel(np.empty((m, n), dtype=np.float64), xs_test, xs_train, "test kernel")
        self.predict_kernel_time = time.perf_counter() - t0

    def fit(self, y: np.ndarray) -> np.ndarray:
        """libsvm on the training kernel; returns the training predictions (train_predict_time: their seconds)."""
        self.svc.fit(self.train_kernel, y)
        self.support_ = self.svc.support_
        t0 = time.perf_counter()
        pred = self.svc.predict(self.train_kernel)
        self.train_predict_time = time.perf_counter() - t0
        return pred

    def predict(self) -> np.ndarray:
        """Predictions of the test rows from the test kernel (libsvm reads the support vectors' columns)."""
        return self.svc.predict(self.test_kernel)


def _release_gpu(gpu) -> None:
    """Close this process's CUDA context (its memory with it), then give the borrowed GPU back. The device's name and
    driver, which the provenance asks the GPU for, are read first (they are kept): nothing touches the GPU after."""
    from numba import cuda

    provenance.gpu_name()
    provenance.driver_version()
    cuda.close()
    gpu.release()


def _fit_exact(x_train, y_train, C, gamma):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    model = make_pipeline(StandardScaler(), SVC(kernel="rbf", C=C, gamma=gamma, cache_size=_SVC_CACHE_MB))
    model.fit(x_train, y_train)
    return model


def _fit_nystroem(x_train, y_train, C, gamma_value, n_components, seed):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    # Primal squared-hinge solver (liblinear): fast when n_train > n_components, the case this route is for.
    model = make_pipeline(
        StandardScaler(),
        Nystroem(kernel="rbf", gamma=gamma_value, n_components=n_components, random_state=seed),
        LinearSVC(C=C, dual=False, max_iter=5000),
    )
    model.fit(x_train, y_train)
    return model


def run_svm(
    train_x_path,
    train_y_path,
    test_x_path,
    test_y_path,
    out_dir,
    train_subset: int | str | None = None,
    test_subset: int | None = None,
    method: str = "exact",
    C: float = 10.0,
    gamma="scale",
    nystroem_components: int = 2000,
    seed: int = 0,
    class_names: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
    precompute_kernel: bool | str = "auto",
    kernel_device: str = "auto",
) -> dict:
    """Fit an RBF SVM on encoder features and write metrics.json, per_class.csv, confusion.csv, confusion.png and
    predictions.csv (PREDICTIONS).

    ``train_subset``: None or 0 (all rows), a row count (a stratified subset), or "auto" (``resolve_train_subset``:
    all rows when the GPU computes the kernel and it fits in memory, or for the Nystroem route; else
    ``AUTO_TRAIN_SUBSET``). ``precompute_kernel`` (method "exact" only): True computes the n_train x n_train
    RBF kernel matrix and trains ``SVC(kernel="precomputed")`` on it (the same model, many times faster for
    wide features, 8 * n_train^2 bytes of memory); False lets libsvm evaluate the kernel itself; "auto"
    precomputes when the matrix takes at most 40 % of the physical memory. ``kernel_device`` ("auto", "cpu",
    "gpu", ``resolve_kernel_device``) says where the precomputed kernel is computed. ``fit_time_s`` includes
    the kernel computation (``kernel_time_s``), ``predict_time_s`` the test kernel (``predict_kernel_time_s``).

    Returns the metrics dict (also written to ``out_dir/metrics.json``).
    """
    if method not in METHODS:
        raise GpunnError(f"svm method must be one of {', '.join(METHODS)}, got {method!r}")
    if not C > 0:
        raise GpunnError(f"svm C must be positive, got {C!r}")
    if precompute_kernel not in (True, False, "auto"):
        raise GpunnError(f"svm precompute_kernel must be true, false or 'auto', got {precompute_kernel!r}")
    if kernel_device not in KERNEL_DEVICES:
        raise GpunnError(f"svm kernel_device must be one of {', '.join(KERNEL_DEVICES)}, got {kernel_device!r}")
    if method == "gpu-smo" and kernel_device == "cpu":
        raise GpunnError("svm method gpu-smo solves on the GPU, where it computes its kernel: kernel_device cpu does "
                         "not apply; use kernel_device auto or gpu, or method exact")
    if kernel_device == "gpu" and (method == "nystroem" or (method == "exact" and precompute_kernel is False)):
        raise GpunnError("svm kernel_device 'gpu' computes the precomputed kernel of method 'exact'; "
                         f"method {method!r} with precompute_kernel {precompute_kernel!r} computes none: "
                         "use kernel_device auto or cpu")
    out_dir = Path(out_dir)

    # ---- validate everything before any work or output
    tr_x = _load_npy(train_x_path, "training features")
    _check_features(tr_x, train_x_path)
    tr_y = _check_labels(_load_npy(train_y_path, "training labels"), train_y_path, tr_x.shape[0], train_x_path)
    te_x = _load_npy(test_x_path, "test features")
    _check_features(te_x, test_x_path)
    te_y = _check_labels(_load_npy(test_y_path, "test labels"), test_y_path, te_x.shape[0], test_x_path)
    d_train, d_test = math.prod(tr_x.shape[1:]), math.prod(te_x.shape[1:])
    if d_train != d_test:
        raise GpunnError(
            f"{test_x_path}: {d_test} features per row but {train_x_path} has {d_train}; "
            "extract both with the same encoder")
    if np.unique(tr_y).size < 2:
        raise GpunnError(f"{train_y_path}: the training labels hold a single class; an SVM needs at least two")

    # where the kernel is computed (the device is probed once, here), and how many training rows follow from it
    if method == "gpu-smo":
        from gpunn import device

        device.require_gpu("svm method gpu-smo")
        device_name = "gpu"
    else:
        device_name = resolve_kernel_device(kernel_device) if method == "exact" else "cpu"
    n_train_total, n_test_total = tr_x.shape[0], te_x.shape[0]
    train_n, why = resolve_train_subset(train_subset, n_train_total, method, device_name, precompute_kernel)
    if why is not None:
        chosen = f"{count(train_n)} of {count(n_train_total)} rows" if train_n and train_n < n_train_total \
            else f"all {count(n_train_total)} rows"
        log(f"svm[{method}]: train_subset auto: {chosen}: {why}")
    tr_rows = stratified_subset(tr_y, train_n, seed, _TRAIN_STREAM)
    te_rows = stratified_subset(te_y, test_subset, seed, _TEST_STREAM)
    train_is_subset, test_is_subset = tr_rows.size < n_train_total, te_rows.size < n_test_total
    if train_is_subset:
        log(f"svm[{method}]: training on a stratified subset of {count(tr_rows.size)} of {count(n_train_total)} rows")
    if test_is_subset:
        log(f"svm[{method}]: testing on a stratified subset of {count(te_rows.size)} of {count(n_test_total)} rows")
    x_train = _materialise(tr_x, None if not train_is_subset else tr_rows, train_x_path)
    x_test = _materialise(te_x, None if not test_is_subset else te_rows, test_x_path)
    y_train, y_test = tr_y[tr_rows], te_y[te_rows]
    del tr_x, te_x

    classes = np.union1d(np.unique(y_train), np.unique(y_test))
    names = _resolve_class_names(class_names, classes)

    # gamma as a number, computed exactly as SVC does for 'scale' (on the scaled training features)
    from sklearn.preprocessing import StandardScaler

    n_train, n_test, n_features = x_train.shape[0], x_test.shape[0], x_train.shape[1]
    fits = kernel_fits_in_memory(n_train, n_test=n_test)
    precompute = method == "gpu-smo" or (
        method == "exact" and (precompute_kernel is True or (precompute_kernel == "auto" and fits)))
    if device_name == "gpu" and not precompute:
        if kernel_device == "gpu":
            raise GpunnError(
                f"svm kernel_device 'gpu': the float64 kernel matrices ({n_train} x {n_train} and {n_test} x "
                f"{n_train}: {gb(kernel_bytes(n_train, n_test))}) exceed {_KERNEL_MEMORY_FRACTION:.0%} of this "
                "machine's memory "
                f"({gb(_physical_memory_bytes())}); use a smaller train_subset")
        device_name = "cpu"  # auto: libsvm evaluates the kernel itself, on the CPU
    scaler = StandardScaler().fit(x_train)
    xs_train = scaler.transform(x_train)
    gamma_value = resolve_gamma(gamma, xs_train)
    if not precompute:
        del xs_train  # the pipelines scale on their own

    extra = ""
    n_components = None
    if method == "nystroem":
        n_components = int(min(nystroem_components, n_train))
        if n_components < nystroem_components:
            log(f"svm[nystroem]: n_components lowered from {nystroem_components} to n_train = {n_train}")
        extra = f", {n_components} Nystroem components"
    elif method == "gpu-smo":
        extra = ", solved on the gpu (float32 kernel matrices resident there)"
    elif precompute:
        extra = f", kernel matrix precomputed on the {device_name}"
    log(f"svm[{method}]: fitting on {n_train} x {n_features} ({classes.size} classes, C={C}, "
        f"gamma={gamma!r} = {gamma_value:.4g}{extra}); testing on {n_test}")

    # the inputs are loaded and checked; fit and predict are timed: one timed job at a time on this machine
    kernel_time = predict_kernel_time = None
    # a GPU given to this job without its lock (gpunn.placement --borrow) is taken before the timing lock, as every
    # GPU job takes its GPU first, and given back once the kernels are computed
    with contextlib.ExitStack() as held:
        gpu = held.enter_context(placement.borrowed_gpu(log)) if precompute and device_name == "gpu" else None
        lock = held.enter_context(timing_lock(f"gpunn svm {method} on {n_train} x {n_features}", log))
        if precompute:
            if method == "gpu-smo":
                from gpunn.smo import GpuSmoRoute

                model = GpuSmoRoute(C, gamma_value, log, labels=y_train)
            else:
                model = _PrecomputedRbfSVC(C, gamma_value, device_name, log)
            model.kernels(xs_train, scaler.transform(x_test))
            if gpu is not None and method == "exact":
                _release_gpu(gpu)
                log(f"svm[exact]: GPU {gpu.slot} given back; libsvm fits and predicts on the CPU")
            t0 = time.perf_counter()
            pred_train = model.fit(y_train)
            fit_time = model.kernel_time + time.perf_counter() - t0 - model.train_predict_time
            t0 = time.perf_counter()
            pred_test = model.predict()
            predict_time = model.predict_kernel_time + time.perf_counter() - t0
            kernel_time, predict_kernel_time = model.kernel_time, model.predict_kernel_time
        else:
            t0 = time.perf_counter()
            if method == "exact":
                model = _fit_exact(x_train, y_train, C, gamma)
            else:
                model = _fit_nystroem(x_train, y_train, C, gamma_value, n_components, seed)
            fit_time = time.perf_counter() - t0
            t0 = time.perf_counter()
            pred_test = model.predict(x_test)
            predict_time = time.perf_counter() - t0
            pred_train = model.predict(x_train)
    log(f"svm[{method}]: fit took {fit_time:.2f} s; predicting {n_test} test rows took {predict_time:.2f} s")

    # ---- metrics
    matrix = np.zeros((classes.size, classes.size), dtype=np.int64)  # rows: true class, columns: predicted
    np.add.at(matrix, (np.searchsorted(classes, y_test), np.searchsorted(classes, pred_test)), 1)
    per_class_n = matrix.sum(axis=1)
    per_class_acc = [float(matrix[i, i] / per_class_n[i]) if per_class_n[i] else None for i in range(classes.size)]
    train_acc = float(np.mean(pred_train == y_train))
    test_acc = float(np.trace(matrix) / matrix.sum())

    metrics = {
        "method": method,
        "approximate": method == "nystroem",
        "C": float(C),
        "gamma": gamma if isinstance(gamma, str) else float(gamma),
        "gamma_value": gamma_value,
        "nystroem_components": n_components,
        "kernel_precomputed": bool(precompute),
        "kernel_device": device_name,
        "seed": int(seed),
        "n_train": int(n_train),
        "n_test": int(n_test),
        "subset": bool(train_is_subset),
        "train_subset": int(n_train) if train_is_subset else None,
        "n_train_total": int(n_train_total),
        "test_subset": int(n_test) if test_is_subset else None,
        "n_test_total": int(n_test_total),
        "n_features": int(n_features),
        "n_classes": int(classes.size),
        "train_accuracy": train_acc,
        "test_accuracy": test_acc,
        "fit_time_s": fit_time,
        "predict_time_s": predict_time,
        "kernel_time_s": kernel_time,
        "predict_kernel_time_s": predict_kernel_time,
        "per_class_accuracy": {name: acc for name, acc in zip(names, per_class_acc)},
        "timing_lock_wait_s": lock.waited_s,
        "provenance": provenance.collect(uses_gpu=precompute and device_name == "gpu"),
    }
    if method != "nystroem":
        metrics["n_support_vectors"] = int((model if precompute else model[-1]).support_.size)

    per_class = pd.DataFrame({
        "class": [int(c) for c in classes],
        "name": names,
        "n_test": per_class_n.astype(np.int64),
        "accuracy": [np.nan if a is None else a for a in per_class_acc],
    })
    confusion = pd.DataFrame(matrix, columns=names)
    confusion.insert(0, "true", names)

    from gpunn.report.figures import confusion_matrix_figure

    write_csv(out_dir / "per_class.csv", per_class)
    write_csv(out_dir / PREDICTIONS, pd.DataFrame({"row": te_rows.astype(np.int64), "true": y_test.astype(np.int64),
                                                   "predicted": np.asarray(pred_test).astype(np.int64)}))
    write_csv(out_dir / "confusion.csv", confusion)
    confusion_matrix_figure(
        matrix, names, out_dir / "confusion.png",
        f"SVM ({method}{', approximate' if method == 'nystroem' else ''}): test accuracy {100 * test_acc:.2f} % "
        f"(n_train={n_train}{f', a stratified subset of {n_train_total}' if train_is_subset else ''})")
    write_json(out_dir / "metrics.json", metrics)
    log(f"svm[{method}]: train accuracy {100 * train_acc:.2f} %, test accuracy {100 * test_acc:.2f} %"
        + (f" (trained on a stratified subset of {count(n_train)} of {count(n_train_total)} rows)"
           if train_is_subset else ""))
    return metrics
