"""The epoch loop every training path shares: a pipeline run (gpunn.train) and the Python API (gpunn.api).

Both load the training set into a backend once, compile its steps outside any timing, then train each epoch over
the shared batch order (gpunn.seeding.batch_order(seed, epoch, n)): two backends given the same seed see the same
batches, so cpu-numpy and a GPU variant can be compared epoch by epoch. A loss that stops being finite ends
training with one GpunnError line.
"""

from __future__ import annotations

import math
import time

from gpunn.errors import GpunnError
from gpunn.rundata import images_to_float
from gpunn.seeding import batch_order, batch_slices


def check_finite(value: float, where: str, what: str, lr: float) -> None:
    """One GpunnError line when a loss is NaN or infinite: `where` in the training of `what`."""
    if not math.isfinite(value):
        raise GpunnError(
            f"training diverged: loss is {value} at {where} of {what}; lower the learning rate "
            f"(now {lr}) or check the input data"
        )


def train_epochs(backend, x, y, *, epochs: int, batch: int, seed: int, what: str, first_epoch: int = 0,
                 log=None, progress_every_s: float = 15.0):
    """Load (x, y) into `backend` (uint8 pixels or float32 in [0, 1] of the model's input shape; y is ignored by
    the autoencoder), compile the steps of every batch size the epochs use, then train epochs first_epoch ..
    first_epoch + epochs - 1 (0-based: the batch order's epoch). A generator: yields (1-based epoch, EpochResult,
    the epoch's wall seconds) after each epoch, so the caller may evaluate in between, outside the epoch's time.
    With `log`, the warm-up and the progress within long epochs are logged."""
    n = len(x)
    batch = min(batch, n)  # the same single batch, and a resident GPU epoch's batch stride must not exceed n
    slices = batch_slices(n, batch)
    # the whole training set as float32 once: a resident backend copies it to its device, the others index it
    backend.load_train_data(images_to_float(x), None if backend.autoencoder else y)
    if log is not None:
        log(f"warm-up of {backend.name} (kernels compile on their first launch: not inside the first epoch's time)")
    backend.warm_up({e - s for s, e in slices})

    last = first_epoch + epochs
    for epoch in range(first_epoch, last):
        order = batch_order(seed, epoch, n)
        progress = None if log is None else progress_log(log, epoch, last, progress_every_s)
        start = time.perf_counter()
        result = backend.train_epoch(order, batch, progress)
        seconds = time.perf_counter() - start
        where = f"epoch {epoch + 1}" + (f" batch {result.diverged_at}" if result.diverged_at else "")
        check_finite(result.loss, where, what, backend.lr)
        yield epoch + 1, result, seconds


def progress_log(log, epoch: int, epochs: int, every_s: float):
    """A progress callback for Backend.train_epoch that logs at most every `every_s` seconds."""
    start = last = time.perf_counter()

    def progress(number: int, total: int, loss_so_far: float) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= every_s and number < total:
            log(f"  epoch {epoch + 1}/{epochs} batch {number}/{total} loss {loss_so_far:.4f} ({now - start:.1f} s)")
            last = now

    return progress
