"""Training and evaluation of one run (a RunSpec) on a prepared dataset, for any registered variant.

Per epoch the loop trains over the shared batch order, then evaluates on the test split, and records
train loss, test loss, test accuracy (classifiers), wall time and its forward/backward split. Outputs of
a run directory, all written atomically at the end:
    metrics.csv    one row per epoch
    metrics.json   the run spec, data sizes, final figures, where the run came from ("provenance": device,
                   threads, versions, commit; gpunn.provenance) and the seconds it waited for the timing
                   lock ("timing_lock_wait_s": the timed part runs under gpunn.timing_lock)
    weights.npz    the flat parameter buffer, its layout and the spec
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn import io, provenance
from gpunn.data.prepare import Prepared, load_prepared
from gpunn.errors import GpunnError
from gpunn.nn import build_model
from gpunn.nn.functional import mse_forward, softmax_cross_entropy
from gpunn.runspec import RunSpec
from gpunn.seeding import batch_order, batch_slices
from gpunn.timing_lock import timing_lock
from gpunn.variants import make_backend, uses_gpu

EVAL_BATCH = 1000
METRIC_COLUMNS = [
    "epoch", "train_loss", "test_loss", "test_accuracy",
    "epoch_time_s", "forward_time_s", "backward_time_s", "eval_time_s", "samples_per_s",
]


def images_to_float(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 in [0, 1]; every backend normalises with exactly this expression."""
    return images.astype(np.float32) / np.float32(255.0)


@dataclass
class RunData:
    """The arrays one run trains and tests on (the training subset already applied)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, int, int]
    num_classes: int
    class_names: list[str]


def run_data(spec: RunSpec, prepared: Prepared) -> RunData:
    if prepared.dataset != spec.dataset or prepared.split != spec.split:
        raise GpunnError(
            f"prepared data is {prepared.dataset}/{prepared.split} but the run asks for {spec.dataset}/{spec.split}"
        )
    n_train = len(prepared.x_train)
    if spec.subset > n_train:
        raise GpunnError(f"subset of {spec.subset} training samples asked, {spec.dataset}/{spec.split} has {n_train}")
    keep = spec.subset or n_train
    return RunData(
        x_train=prepared.x_train[:keep],
        y_train=prepared.y_train[:keep].astype(np.int64),
        x_test=prepared.x_test,
        y_test=prepared.y_test.astype(np.int64),
        image_shape=tuple(prepared.image_shape),
        num_classes=int(prepared.num_classes),
        class_names=[str(c) for c in prepared.class_names],
    )


def new_model(spec: RunSpec, image_shape, num_classes: int):
    return build_model(spec.model, seed=spec.seed, **spec.model_sizes(image_shape, num_classes))


def predict(backend, images: np.ndarray, batch: int = EVAL_BATCH) -> np.ndarray:
    """Model outputs (logits or reconstructions) over all images, in float32 batches."""
    outs = [backend.predict(images_to_float(images[s:e])) for s, e in batch_slices(len(images), batch)]
    return np.concatenate(outs)


def test_metrics(model_name: str, outputs: np.ndarray, images: np.ndarray, labels: np.ndarray) -> dict:
    if model_name == "autoencoder":
        return {"test_loss": float(mse_forward(outputs, images_to_float(images))), "test_accuracy": math.nan}
    loss, _ = softmax_cross_entropy(outputs, labels)
    return {"test_loss": float(loss), "test_accuracy": float(np.mean(outputs.argmax(axis=1) == labels))}


def _check_finite(value: float, where: str, spec: RunSpec) -> None:
    if not math.isfinite(value):
        raise GpunnError(
            f"training diverged: loss is {value} at {where} of {spec.path}; lower the learning rate "
            f"(now {spec.lr}) or check the input data"
        )


def train_run(spec: RunSpec, prepared_path, out_dir, log=print, progress_every_s: float = 15.0) -> dict:
    """Train `spec` on the prepared dataset; write metrics.csv, metrics.json and weights.npz to out_dir."""
    data = run_data(spec, load_prepared(prepared_path))
    # data loading above, every timed step below: one timed job at a time on this machine
    with timing_lock(f"gpunn train {spec.path}", log) as lock:
        model, backend, rows = _train_epochs(spec, data, log, progress_every_s)

    n_train = len(data.x_train)
    frame = pd.DataFrame(rows, columns=METRIC_COLUMNS)
    summary = {
        "spec": spec.to_dict(),
        "n_train": n_train,
        "n_test": len(data.x_test),
        "image_shape": list(data.image_shape),
        "num_classes": data.num_classes,
        "num_parameters": int(model.num_parameters),
        "final_train_loss": rows[-1]["train_loss"],
        "final_test_loss": rows[-1]["test_loss"],
        "final_test_accuracy": rows[-1]["test_accuracy"],
        "total_train_time_s": float(frame["epoch_time_s"].sum()),
        "mean_epoch_time_s": float(frame["epoch_time_s"].mean()),
        "forward_time_s": float(frame["forward_time_s"].sum()),
        "backward_time_s": float(frame["backward_time_s"].sum()),
        "timing_lock_wait_s": lock.waited_s,
        "provenance": provenance.collect(uses_gpu=uses_gpu(spec.variant)),
    }
    out_dir = Path(out_dir)
    save_weights(out_dir / "weights.npz", spec, model, backend.flat_params(), data)
    io.write_csv(out_dir / "metrics.csv", frame)
    io.write_json(out_dir / "metrics.json", summary)
    return summary


def _train_epochs(spec: RunSpec, data: RunData, log, progress_every_s: float):
    """Build the model and backend, compile, and train every epoch with its test evaluation: the timed
    part of a run. Returns (model, backend, one metrics row per epoch)."""
    model = new_model(spec, data.image_shape, data.num_classes)
    backend = make_backend(spec.variant, model, spec.model, spec.lr)
    autoencoder = spec.model == "autoencoder"
    n_train = len(data.x_train)
    slices = batch_slices(n_train, spec.batch)
    log(
        f"train {spec.path}: {n_train} train / {len(data.x_test)} test samples, "
        f"{model.num_parameters} parameters, {len(slices)} batches per epoch"
    )

    if hasattr(backend, "warm_up"):  # GPU kernels compile on first launch: not inside the first epoch's time
        log(f"compiling the kernels of {spec.variant} (first launch)")
        backend.warm_up({e - s for s, e in slices})
    resident = hasattr(backend, "train_epoch")  # the backend keeps the training set on its device
    if resident:
        backend.load_train_data(images_to_float(data.x_train), data.y_train)

    rows = []
    for epoch in range(spec.epochs):
        order = batch_order(spec.seed, epoch, n_train)
        start = time.perf_counter()
        if resident:
            result = backend.train_epoch(order, spec.batch)
            loss_sum, forward_s, backward_s = result.loss_sum, result.forward_s, result.backward_s
            _check_finite(loss_sum, f"epoch {epoch + 1}", spec)
        else:
            loss_sum, forward_s, backward_s = _train_batches(backend, data, order, slices, autoencoder, spec,
                                                             epoch, log, progress_every_s)
        epoch_s = time.perf_counter() - start
        eval_start = time.perf_counter()
        metrics = test_metrics(spec.model, predict(backend, data.x_test), data.x_test, data.y_test)
        eval_s = time.perf_counter() - eval_start
        _check_finite(metrics["test_loss"], f"the test set after epoch {epoch + 1}", spec)
        row = {
            "epoch": epoch + 1, "train_loss": loss_sum / n_train, **metrics,
            "epoch_time_s": epoch_s, "forward_time_s": forward_s, "backward_time_s": backward_s,
            "eval_time_s": eval_s, "samples_per_s": n_train / epoch_s,
        }
        rows.append(row)
        accuracy = "" if autoencoder else f" test acc {100 * row['test_accuracy']:.2f}%"
        log(f"epoch {epoch + 1}/{spec.epochs}: train loss {row['train_loss']:.4f} test loss "
            f"{row['test_loss']:.4f}{accuracy} ({epoch_s:.2f} s)")

    return model, backend, rows


def _train_batches(backend, data: RunData, order, slices, autoencoder: bool, spec: RunSpec, epoch: int, log,
                   progress_every_s: float):
    """One epoch batch by batch: the loop gathers each batch on the host and hands it to the backend."""
    loss_sum = forward_s = backward_s = 0.0
    start = last_report = time.perf_counter()
    for number, (s, e) in enumerate(slices, 1):
        index = order[s:e]
        xb = images_to_float(data.x_train[index])
        step = backend.train_step(xb, xb if autoencoder else data.y_train[index])
        _check_finite(step.loss, f"epoch {epoch + 1} batch {number}", spec)
        loss_sum += step.loss * (e - s)
        forward_s += step.forward_s
        backward_s += step.backward_s
        now = time.perf_counter()
        if now - last_report >= progress_every_s and number < len(slices):
            log(f"  epoch {epoch + 1}/{spec.epochs} batch {number}/{len(slices)} "
                f"loss {loss_sum / e:.4f} ({now - start:.1f} s)")
            last_report = now
    return loss_sum, forward_s, backward_s


def save_weights(path, spec: RunSpec, model, flat: np.ndarray, data: RunData) -> None:
    names, offsets, shapes = zip(*model.layout())
    io.write_npz(
        path,
        flat=np.asarray(flat, dtype=np.float32),
        names=np.array(names),
        offsets=np.array(offsets, dtype=np.int64),
        shapes=np.array(json.dumps([list(s) for s in shapes])),
        spec=np.array(json.dumps(spec.to_dict())),
        image_shape=np.array(data.image_shape, dtype=np.int64),
        num_classes=np.array(data.num_classes),
    )


def load_trained(run_dir):
    """(spec, cpu-numpy model holding the trained weights) from a run directory."""
    path = Path(run_dir) / "weights.npz"
    if not path.is_file():
        raise GpunnError(f"{path}: no trained weights; run the training step for this run first")
    try:
        with np.load(path, allow_pickle=False) as saved:
            spec = RunSpec.from_dict(json.loads(str(saved["spec"])))
            model = new_model(spec, tuple(int(v) for v in saved["image_shape"]), int(saved["num_classes"]))
            flat = saved["flat"]
    except (OSError, ValueError, KeyError) as exc:
        raise GpunnError(f"{path}: unreadable weights file ({exc}); delete it and train again") from None
    if flat.shape != model.flat.shape:
        raise GpunnError(f"{path}: holds {flat.size} parameters, the model needs {model.flat.size}; train again")
    model.load_flat(flat)
    return spec, model


def evaluate_run(run_dir, prepared_path, out_dir, log=print, n_samples: int = 25) -> dict:
    """Test-set evaluation of a trained run: eval.json (loss, accuracy, per-class accuracy and confusion
    matrix for classifiers), predictions.npy, and samples.npz (the first test images with their outputs,
    for the sample-classification or reconstruction figure)."""
    spec, model = load_trained(run_dir)
    data = run_data(spec, load_prepared(prepared_path))
    backend = make_backend("cpu-numpy", model, spec.model, spec.lr)
    start = time.perf_counter()
    outputs = predict(backend, data.x_test)
    result = {"run": spec.path, "n_test": len(data.x_test), **test_metrics(spec.model, outputs, data.x_test, data.y_test)}
    out_dir = Path(out_dir)
    shown = min(n_samples, len(data.x_test))
    if spec.model == "autoencoder":
        recon = np.clip(outputs[:shown], 0.0, 1.0)
        io.write_npz(out_dir / "samples.npz", images=data.x_test[:shown], reconstructions=recon)
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


def extract_features(run_dir, prepared_path, out_dir, train_limit: int = 0, batch: int = 256, log=print) -> dict:
    """Encoder outputs of a trained autoencoder, flattened to (N, C*H*W) float32 .npy, with labels, for
    the whole training split (or its first `train_limit` samples) and the whole test split."""
    spec, model = load_trained(run_dir)
    if spec.model != "autoencoder":
        raise GpunnError(f"features come from an autoencoder run, {run_dir} is a {spec.model}")
    prepared = load_prepared(prepared_path)
    out_dir = Path(out_dir)
    sizes = {}
    for part, images, labels in (("train", prepared.x_train, prepared.y_train), ("test", prepared.x_test, prepared.y_test)):
        if part == "train" and train_limit:
            images, labels = images[:train_limit], labels[:train_limit]
        chunks, start, last_report = [], time.perf_counter(), time.perf_counter()
        for s, e in batch_slices(len(images), batch):
            chunks.append(model.encode(images_to_float(images[s:e])).reshape(e - s, -1))
            if time.perf_counter() - last_report >= 15.0:
                log(f"  {part} features {e}/{len(images)} ({time.perf_counter() - start:.1f} s)")
                last_report = time.perf_counter()
        features = np.concatenate(chunks).astype(np.float32, copy=False)
        io.write_npy(out_dir / f"{part}_features.npy", features)
        io.write_npy(out_dir / f"{part}_labels.npy", labels.astype(np.int64))
        sizes[part] = list(features.shape)
        log(f"features {part}: {features.shape[0]} x {features.shape[1]} ({time.perf_counter() - start:.1f} s)")
    return sizes
