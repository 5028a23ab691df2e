"""Training of one run (a RunSpec) on a prepared dataset, for any registered variant.

Per epoch the loop (gpunn.epochs, shared with the Python API) trains over the shared batch order, then
evaluates on the test split (gpunn.evaluate), and records train loss, test loss, test accuracy (classifiers),
wall time and its forward/backward split. Every epoch's train loss and test loss go through the divergence rule
(gpunn.epochs.DivergenceRule): a diverged run stops with one GpunnError line and writes nothing, unless it keeps
diverged runs (keep_diverged, `gpunn train --keep-diverged`): then it trains on while its losses are finite and
records the first divergence.
Outputs of a run directory, all written atomically at the end:
    metrics.csv    one row per epoch
    metrics.json   the run spec (its fields, the loss reduction among them, and its path), data sizes, final
                   figures, the testing time ("test_time_s": the whole test set through the trained model's
                   forward pass after the last epoch, in batches of gpunn.evaluate.EVAL_BATCH from the float
                   images (converted once per run), outputs copied back to the host: the papers' testing time; a GPU
                   variant compiles those kernels before the first epoch), where the run came from
                   ("provenance": device,
                   threads, versions, commit; gpunn.provenance) and the seconds it waited for the timing
                   lock ("timing_lock_wait_s": the timed part runs under gpunn.timing_lock), and for GPU variants
                   the most device memory the run's own buffers held ("peak_gpu_memory_bytes", gpunn.device.MemoryPeak,
                   sampled after each epoch and evaluation: training buffers, resident data and the evaluation's
                   forward buffers for batches of EVAL_BATCH, not the CUDA context or kernel modules, nor other
                   processes on the device; null on the CPU and under the simulator); "diverged" (false, or
                   true for a kept diverged run, with "diverged_epoch", its first diverged epoch, and
                   "diverged_reason", the rule's words) and "epochs_trained" (fewer than the spec's epochs where a
                   kept run stopped at a non-finite loss)
    weights.npz    the flat parameter buffer, its layout and the spec (gpunn.weights)
The run's arrays come from gpunn.rundata, its initial model from gpunn.weights.new_model.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gpunn import io, provenance
from gpunn.backends.registry import make_backend, uses_gpu
from gpunn.data.prepare import load_prepared
from gpunn.device import MemoryPeak, open_cuda, simulator_enabled
from gpunn.epochs import DivergenceRule, train_epochs
from gpunn.evaluate import EVAL_BATCH, predict, test_metrics
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.nn.models import model_spec
from gpunn.rundata import RunData, images_to_float, run_data
from gpunn.runspec import RunSpec
from gpunn.seeding import batch_slices
from gpunn.timing_lock import timing_lock
from gpunn.weights import new_model, save_weights

METRIC_COLUMNS = [
    "epoch", "train_loss", "test_loss", "test_accuracy",
    "epoch_time_s", "forward_time_s", "backward_time_s", "eval_time_s", "test_time_s", "samples_per_s",
]


KEEP_HINT = ("; config key experiments.<experiment>.keep_diverged: true (gpunn train --keep-diverged) keeps such "
             "runs, marked diverged")


def expected_end(start: float, done: int, total: int) -> str:
    """'; 3 more epochs, ends in about 42 s (at 14:05:09)' after `done` of `total` epochs begun at perf_counter
    `start` (training and testing at the mean pace so far); '' after the last."""
    if done >= total:
        return ""
    left = (time.perf_counter() - start) / done * (total - done)
    at = time.strftime("%H:%M:%S", time.localtime(time.time() + left))
    return f"; {total - done} more epoch{'s' if total - done > 1 else ''}, ends in about {left:.0f} s (at {at})"


def train_run(spec: RunSpec, prepared_path, out_dir, log=print, progress_every_s: float = 15.0,
              keep_diverged: bool = False, test_samples: int = 0) -> dict:
    """Train `spec` on the prepared dataset; write metrics.csv, metrics.json and weights.npz to out_dir. A diverged
    run raises GpunnError before writing anything, unless `keep_diverged`. `test_samples` (0: all): test on the
    first ones only (gpunn.overlap_verdict's runs, whose clock is the epochs')."""
    started = time.perf_counter()
    data = run_data(spec, load_prepared(prepared_path))
    if test_samples:
        data = dataclasses.replace(data, x_test=data.x_test[:test_samples], y_test=data.y_test[:test_samples])
    data_s = time.perf_counter() - started
    rule = DivergenceRule(f"run {spec.path}", spec.lr, data.num_classes if model_spec(spec.model).classifier else None,
                          keep=keep_diverged, hint=KEEP_HINT)
    # data loading above, every timed step below: one timed job at a time on this machine
    simulated = simulator_enabled() and uses_gpu(spec.variant)  # a CPU variant's times are real under it too
    with timing_lock(f"gpunn train {spec.path}", log, skip=simulated) as lock:
        model, backend, rows, peak_gpu_memory, build_s = _train_epochs(spec, data, rule, log, progress_every_s)
    if rule.found:
        log(f"diverged, kept (keep_diverged): {rule.found.reason}; {len(rows)} of {spec.epochs} epochs trained")
    test_time_s = rows[-1]["test_time_s"]
    log(f"testing time: {test_time_s:.3f} s for {len(data.x_test)} test samples")

    n_train = len(data.x_train)
    startup = startup_record(data_s, build_s, rows, uses_gpu(spec.variant))
    log(startup_line(startup))
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
        "total_train_time_s": _total(rows, "epoch_time_s"),
        "mean_epoch_time_s": _total(rows, "epoch_time_s") / len(rows),
        "forward_time_s": _total(rows, "forward_time_s"),
        "backward_time_s": _total(rows, "backward_time_s"),
        "test_time_s": test_time_s,
        "block": spec.block,
        "peak_gpu_memory_bytes": peak_gpu_memory,
        "timing_lock_wait_s": lock.waited_s,
        "startup": startup,
        "finished_at": time.time(),  # epoch s: trained and tested, its files not yet written
        **rule.record(),
        "epochs_trained": len(rows),
        "provenance": provenance.collect(uses_gpu=uses_gpu(spec.variant)),
    }
    out_dir = Path(out_dir)
    save_weights(out_dir / "weights.npz", spec, model, backend.parameters(), data)
    io.write_rows_csv(out_dir / "metrics.csv", METRIC_COLUMNS, rows)  # no pandas import: 0.4 s of every job
    io.write_json(out_dir / "metrics.json", summary)
    return summary


def _train_epochs(spec: RunSpec, data: RunData, rule: DivergenceRule, log, progress_every_s: float):
    """Build the model and backend, compile, and train every epoch with its test evaluation: the timed
    part of a run. Returns (model, backend, one metrics row per epoch, the peak device memory it allocated
    in bytes or None, the seconds from the model's init to the first epoch)."""
    started = time.perf_counter()
    model = new_model(spec, data.image_shape, data.num_classes)
    if uses_gpu(spec.variant):
        open_cuda()  # the context and numba's target set-up side by side
    memory = MemoryPeak() if uses_gpu(spec.variant) else None
    backend = make_backend(spec.variant, model, spec.model, spec.lr, block=spec.block, reduction=spec.reduction)
    classifier = model_spec(spec.model).classifier
    n_train = len(data.x_train)
    slices = batch_slices(n_train, spec.batch)
    log(
        f"train {spec.path}: {n_train} train / {len(data.x_test)} test samples, "
        f"{model.num_parameters} parameters, {len(slices)} batches per epoch"
        + (f", {spec.block} threads per block" if spec.block else "")
        + (f", loss gradient of the batch {spec.reduction}" if spec.reduction != DEFAULT_REDUCTION else "")
    )

    if uses_gpu(spec.variant) and not simulator_enabled():
        # compile the forward-only kernels of the evaluation too (the simulator compiles nothing), so that every
        # epoch's testing time is warm
        predict(backend, data.x_test[:EVAL_BATCH])
    x_test = images_to_float(data.x_test)  # once per run, not in every epoch's test pass (E5's: 123 MB)
    rows = []
    build_s = None
    epochs = train_epochs(backend, data.x_train, data.y_train, epochs=spec.epochs, batch=spec.batch, seed=spec.seed,
                          rule=rule, log=log, progress_every_s=progress_every_s)
    loop_start = time.perf_counter()
    for epoch, result, epoch_s in epochs:
        eval_start = time.perf_counter()
        if build_s is None:  # from the model's init to the first epoch: backend, upload, warm-up (the compiles)
            build_s = eval_start - started - epoch_s
        outputs = predict(backend, x_test)  # outputs copied to the host: the GPU's work is done
        test_s = time.perf_counter() - eval_start
        metrics = test_metrics(spec.model, outputs, x_test, data.y_test)
        eval_s = time.perf_counter() - eval_start
        rule.check(epoch, metrics["test_loss"], kind="test")
        row = {
            "epoch": epoch, "train_loss": result.loss, **metrics,
            "epoch_time_s": epoch_s, "forward_time_s": result.forward_s, "backward_time_s": result.backward_s,
            "eval_time_s": eval_s, "test_time_s": test_s, "samples_per_s": n_train / epoch_s,
        }
        rows.append(row)
        if memory is not None:
            memory.sample()
        accuracy = f" test acc {100 * row['test_accuracy']:.2f}%" if classifier else ""
        log(f"epoch {epoch}/{spec.epochs}: train loss {row['train_loss']:.4f} test loss "
            f"{row['test_loss']:.4f}{accuracy} ({epoch_s:.2f} s){expected_end(loop_start, epoch, spec.epochs)}")

    return model, backend, rows, None if memory is None else memory.peak_bytes, build_s


def _total(rows: list[dict], column: str) -> float:
    return float(sum(row[column] for row in rows))


def startup_record(data_s: float, build_s: float, rows: list[dict], gpu: bool) -> dict:
    """What a run spent outside its timed epochs (metrics.json's "startup"): loading its data; building the model
    and backend up to the first epoch (the training set's upload, the warm-up: its kernels compiled or loaded,
    gpunn.kernel_cache); the per-epoch test passes; for a GPU
    variant the kernels this process loaded from the on-disk cache and compiled, and the cache folder (None: off)."""
    record = {"data_s": data_s, "build_s": build_s, "test_passes_s": _total(rows, "eval_time_s"),
              "kernels_loaded": None, "kernels_compiled": None, "kernel_cache": None}
    if gpu and not simulator_enabled():
        from gpunn import kernel_cache
        from gpunn.kernels.jit import cache_counts

        counts = cache_counts()
        folder = kernel_cache.configured()
        record.update(kernels_loaded=counts["loaded"], kernels_compiled=counts["compiled"],
                      kernel_cache=None if folder is None else str(folder))
    return record


def startup_line(record: dict) -> str:
    """'outside the epochs: data 0.21 s, build 1.30 s (41 kernels loaded from the kernel cache, 0 compiled), test
    passes 0.35 s'."""
    kernels = ""
    if record["kernels_loaded"] is not None:
        where = "the kernel cache" if record["kernel_cache"] else "no kernel cache (GPUNN_KERNEL_CACHE=off)"
        kernels = (f" ({record['kernels_loaded']} kernels loaded from {where}, "
                   f"{record['kernels_compiled']} compiled)")
    return (f"outside the epochs: data {record['data_s']:.2f} s, build {record['build_s']:.2f} s{kernels}, "
            f"test passes {record['test_passes_s']:.2f} s")
