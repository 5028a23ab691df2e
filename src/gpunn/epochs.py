"""The epoch loop every training path shares: a pipeline run (gpunn.train) and the Python API (gpunn.api).

Both load the training set into a backend once, compile its steps outside any timing, then train each epoch over
the shared batch order (gpunn.seeding.batch_order(seed, epoch, n)): two backends given the same seed see the same
batches, so cpu-numpy and a GPU variant can be compared epoch by epoch.

The divergence rule (DivergenceRule, for both paths): training diverged when a loss is not finite, or when an
epoch's mean train loss exceeds DIVERGENCE_FACTOR times the first epoch's. The first epoch (a 1-epoch run's only
one) is held against the loss it starts near, reference_loss: ln(classes) for a classifier, 1 for the
autoencoder. A diverged training stops with one GpunnError line naming the run, the epoch, the loss and the
learning rate; a run that keeps diverged runs (gpunn train --keep-diverged) records the first divergence and
trains on while its loss is finite, stopping after the first epoch whose train or test loss is not.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gpunn.errors import GpunnError
from gpunn.runspec import format_lr
from gpunn.seeding import batch_order, batch_slices

DIVERGENCE_FACTOR = 10.0  # an epoch's train loss above this times the first epoch's (or reference_loss): diverged

# the progress line that ends the warm-up (gpunn.overlap_check starts a neighbour when it sees it)
WARMED_UP = "warm-up done"


def reference_loss(classes: int | None) -> float:
    """What the first epoch's train loss is held against: ln(classes), the cross-entropy of a uniform guess, for a
    classifier (None: the autoencoder); 1 for the autoencoder, the largest MSE of outputs in [0, 1] against pixels
    in [0, 1]."""
    return math.log(max(int(classes), 2)) if classes else 1.0


@dataclass(frozen=True)
class Divergence:
    """The first divergence of a training: its 1-based epoch, the loss that broke the rule and why, in words."""

    epoch: int
    loss: float
    reason: str  # 'train loss 3.1e+20 at epoch 2 is over 10x the first epoch's loss (2.31)'

    def record(self) -> dict:
        """The fields a kept run's metrics.json holds (gpunn.train)."""
        return {"diverged": True, "diverged_epoch": self.epoch, "diverged_reason": self.reason}


NOT_DIVERGED = {"diverged": False, "diverged_epoch": None, "diverged_reason": None}


class DivergenceRule:
    """The divergence rule applied to one training (`what`: 'run <path>', or 'the mlp on cpu-numpy') at learning
    rate `lr`, of a classifier of `classes` classes or the autoencoder (None). check() raises the GpunnError line,
    or with `keep` records the first divergence (`found`) and sets `stop` once a loss is not finite (NaN weights
    cannot train on). `hint` ends the error line (how to keep such runs)."""

    def __init__(self, what: str, lr: float, classes: int | None, keep: bool = False, hint: str = ""):
        self.what, self.lr, self.classes, self.keep, self.hint = what, float(lr), classes, keep, hint
        self.first_loss: float | None = None
        self.found: Divergence | None = None
        self.stop = False

    def _against(self) -> tuple[float, str]:
        if self.first_loss is not None:
            return self.first_loss, f"the first epoch's loss ({self.first_loss:.4g})"
        reference = reference_loss(self.classes)
        if self.classes:
            guess = f"ln {self.classes} = {reference:.4g}"
            return reference, f"the loss of a uniform guess over {self.classes} classes ({guess})"
        return reference, "the largest MSE of outputs in [0, 1] (1)"

    def check(self, epoch: int, loss: float, kind: str = "train", batch: int = 0) -> Divergence | None:
        """Apply the rule to epoch `epoch`'s mean train loss (`batch`: the step whose loss stopped a host-loop
        epoch) or, with kind 'test', to the test loss after it (finiteness only). Returns the divergence found,
        if kept; None when the loss is within the rule."""
        where = f"epoch {epoch}" + (f" batch {batch}" if batch else "")
        if not math.isfinite(loss):
            reason = f"{kind} loss is {loss} at {where}"
            self.stop = True
        elif kind != "train":
            return None
        else:
            limit, against = self._against()
            if self.first_loss is None:
                self.first_loss = loss
            if loss <= DIVERGENCE_FACTOR * limit:
                return None
            reason = f"train loss {loss:.4g} at {where} is over {DIVERGENCE_FACTOR:g}x {against}"
        found = Divergence(epoch, float(loss), reason)
        if not self.keep:
            raise GpunnError(f"training diverged: {self.what} at learning rate {format_lr(self.lr)}: {reason}; "
                             f"lower the learning rate or check the input data{self.hint}")
        self.found = self.found or found
        return found

    def record(self) -> dict:
        """diverged, diverged_epoch and diverged_reason for metrics.json: the first divergence found, or none."""
        return self.found.record() if self.found else dict(NOT_DIVERGED)


def train_epochs(backend, x, y, *, epochs: int, batch: int, seed: int, rule: DivergenceRule, first_epoch: int = 0,
                 log=None, progress_every_s: float = 15.0):
    """Load (x, y) into `backend` (uint8 pixels or float32 in [0, 1] of the model's input shape; y is ignored by
    the autoencoder), compile the steps of every batch size the epochs use, then train epochs first_epoch ..
    first_epoch + epochs - 1 (0-based: the batch order's epoch). A generator: yields (1-based epoch, EpochResult,
    the epoch's wall seconds) after each epoch, so the caller may evaluate in between, outside the epoch's time.
    Each epoch's train loss goes through `rule` (which raises, or, keeping diverged runs, ends the epochs after
    the one yielded once `rule.stop`: the caller's rule.check of a test loss stops them too). With `log`, the
    warm-up and the progress within long epochs are logged."""
    n = len(x)
    batch = min(batch, n)  # the same single batch, and a resident GPU epoch's batch stride must not exceed n
    slices = batch_slices(n, batch)
    # the whole training set once: a resident backend copies the pixels to its device and converts them there,
    # the others make float32 images on the host (Backend.load_train_data) and index them
    backend.load_train_data(x, None if backend.target_is_input else y)
    if log is not None:
        log(f"warm-up of {backend.name} (kernels compile on their first launch: not inside the first epoch's time)")
    warm_up_start = time.perf_counter()
    backend.warm_up({e - s for s, e in slices})
    backend.prepare_epoch(batch)
    if log is not None:
        log(f"{WARMED_UP} in {time.perf_counter() - warm_up_start:.1f} s; epoch {first_epoch + 1} starts")

    last = first_epoch + epochs
    for epoch in range(first_epoch, last):
        order = batch_order(seed, epoch, n)
        progress = None if log is None else progress_log(log, epoch, last, progress_every_s)
        start = time.perf_counter()
        result = backend.train_epoch(order, batch, progress)
        seconds = time.perf_counter() - start
        rule.check(epoch + 1, result.loss, batch=result.diverged_at)
        yield epoch + 1, result, seconds
        if rule.stop:
            return


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
