"""Test-set evaluation of a run: its model's outputs over a set of images in batches (predict) and their
test loss and accuracy (test_metrics), used after every training epoch and by the evaluate step; and the
evaluate step itself on a trained run (evaluate_run): a GPU variant's run through its own engine on the GPU,
checked first against the CPU's float32 layers on a sample (checked_gpu_forward, which gpunn.features shares),
a CPU run through cpu-numpy. Its outputs in the evaluation directory are
    eval.json        test loss, accuracy, per-class accuracy and confusion matrix (classifiers), eval time
    predictions.npy  predicted classes (classifiers) or the first reconstructions (autoencoder)
    samples.npz      for the sample figure, the first test images with labels and predictions (classifiers);
                     for the reconstruction figure, the first test image of each class with its reconstruction,
                     label and the class names (autoencoder)
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from gpunn import io
from gpunn.backends.registry import make_backend, uses_gpu
from gpunn.data.prepare import load_prepared
from gpunn.errors import GpunnError
from gpunn.nn.functional import mse_forward, softmax_cross_entropy
from gpunn.nn.models import model_spec
from gpunn.rundata import images_to_float, run_data
from gpunn.seeding import batch_slices
from gpunn.weights import load_trained

EVAL_BATCH = 1000
# a GPU forward must give the CPU's outputs on CHECK_IMAGES images of the run's data to this relative error
CHECK_TOLERANCE = 1e-5
CHECK_IMAGES = 64


def checked_gpu_forward(spec, model, sample: np.ndarray, expected: np.ndarray, what: str, part: str,
                        layers: int | None = None, log=print):
    """The batch -> outputs function of the run's own GPU engine (`layers`: its first layers only, the autoencoder's
    encoder), after checking that on `sample` (float images of the `part` split) it gives `expected` (the CPU
    layers' outputs): max|gpu - cpu| / max|cpu| <= CHECK_TOLERANCE, else one GpunnError line naming `what`."""
    engine = make_backend(spec.variant, model, spec.model, spec.lr)

    def forward(images):
        return engine.predict(images, layers=layers)

    expected = np.asarray(expected, dtype=np.float64)
    error = float(np.max(np.abs(forward(sample) - expected)) / max(np.max(np.abs(expected)), 1e-30))
    if not error <= CHECK_TOLERANCE:
        raise GpunnError(f"the {spec.variant} {what} differs from the CPU {what} by {error:.2e} (relative) on "
                         f"{len(sample)} {part} images, more than {CHECK_TOLERANCE:g}; the GPU kernels are wrong here")
    log(f"GPU {what} ({spec.variant}) checked against the CPU {what} on {len(sample)} {part} images: max relative "
        f"difference {error:.1e}")
    return forward


class _Forward:
    """predict's backend face for a plain batch -> outputs function."""

    def __init__(self, forward):
        self.predict = forward


def predict(backend, images: np.ndarray, batch: int = EVAL_BATCH) -> np.ndarray:
    """Model outputs (logits or reconstructions) over all images, in float32 batches."""
    outs = [backend.predict(images_to_float(images[s:e])) for s, e in batch_slices(len(images), batch)]
    return np.concatenate(outs)


def test_metrics(model_name: str, outputs: np.ndarray, images: np.ndarray, labels: np.ndarray) -> dict:
    if not model_spec(model_name).classifier:
        return {"test_loss": float(mse_forward(outputs, images_to_float(images))), "test_accuracy": math.nan}
    loss, _ = softmax_cross_entropy(outputs, labels)
    return {"test_loss": float(loss), "test_accuracy": float(np.mean(outputs.argmax(axis=1) == labels))}


def first_of_each_class(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The index of the first image of each class in `labels`, in class order; a class without one is left out."""
    labels = np.asarray(labels).reshape(-1)
    firsts = [np.flatnonzero(labels == c)[:1] for c in range(num_classes)]
    return np.concatenate(firsts).astype(np.int64) if firsts else np.zeros(0, dtype=np.int64)


def evaluate_run(run_dir, prepared_path, out_dir, log=print, n_samples: int = 25) -> dict:
    """Test-set evaluation of a trained run, on the GPU for a GPU variant's run (eval.json's evaluated_with names the
    backend): eval.json (loss, accuracy, per-class accuracy and confusion matrix for classifiers), predictions.npy,
    and samples.npz (the first test images with their outputs for the
    sample-classification figure; the first test image of each class with its reconstruction for the
    reconstruction figure)."""
    spec, model = load_trained(run_dir)
    data = run_data(spec, load_prepared(prepared_path))
    backend = make_backend("cpu-numpy", model, spec.model, spec.lr)
    start = time.perf_counter()
    evaluated_with = "cpu-numpy"
    if uses_gpu(spec.variant):  # the run's own engine, checked against the CPU on the first test images
        sample = images_to_float(data.x_test[:CHECK_IMAGES])
        backend = _Forward(checked_gpu_forward(spec, model, sample, backend.predict(sample), "forward", "test",
                                                   log=log))
        evaluated_with = spec.variant
    outputs = predict(backend, data.x_test)
    metrics = test_metrics(spec.model, outputs, data.x_test, data.y_test)
    result = {"run": spec.path, "n_test": len(data.x_test), "evaluated_with": evaluated_with, **metrics}
    out_dir = Path(out_dir)
    shown = min(n_samples, len(data.x_test))
    if not model_spec(spec.model).classifier:
        each = first_of_each_class(data.y_test, data.num_classes)
        io.write_npz(out_dir / "samples.npz", images=data.x_test[each], labels=data.y_test[each],
                     # a kept diverged run's NaN outputs drawn black, not refused by the figure
                     reconstructions=np.clip(np.nan_to_num(outputs[each]), 0.0, 1.0),
                     class_names=np.array(data.class_names))
        io.write_npy(out_dir / "predictions.npy", outputs[:shown])
        log(f"evaluate {spec.path}: test MSE {result['test_loss']:.5f}")
    else:
        predicted = outputs.argmax(axis=1)
        k = data.num_classes
        confusion = np.zeros((k, k), dtype=np.int64)
        np.add.at(confusion, (data.y_test, predicted), 1)
        per_class = confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)
        result["per_class_accuracy"] = {name: float(a) for name, a in zip(data.class_names, per_class)}
        result["confusion_matrix"] = confusion.tolist()
        result["class_names"] = data.class_names
        io.write_npz(out_dir / "samples.npz", images=data.x_test[:shown], labels=data.y_test[:shown],
                     predictions=predicted[:shown], class_names=np.array(data.class_names))
        io.write_npy(out_dir / "predictions.npy", predicted.astype(np.int64))
        log(f"evaluate {spec.path}: test accuracy {100 * result['test_accuracy']:.2f}%")
    result["eval_time_s"] = time.perf_counter() - start
    io.write_json(out_dir / "eval.json", result)
    return result
