"""The contract every training variant implements, CPU or GPU: one protocol, no capability probing.

    warm_up(batch_sizes)     compile / allocate whatever the steps at these batch sizes need, outside any timing
    load_train_data(x, y)    the training set (uint8 pixels, or float32 images in [0, 1], of the model's input
                             shape; int labels; an autoencoder ignores y: its target is its input), made float32 by
                             gpunn.rundata.images_to_float's expression. A GPU backend keeps it resident.
    train_epoch(order, batch, progress) -> EpochResult
                             one epoch over the loaded data in `order`, batches of `batch` rows (the last one
                             partial), exactly the batches gpunn.seeding.batch_slices gives
    train_step(xb, target) -> StepTimes
                             one step on a host batch (E3's per-step timing, tests)
    predict(xb)              model outputs (logits or reconstructions) of a host batch, as float32 NumPy
    parameters()             the flat parameter buffer (host copy, the model's layout: gpunn.nn.Sequential.layout)

Losses have one unit everywhere: the mean per-sample loss (cross-entropy per sample; for the autoencoder the
per-sample mean squared error over its pixels, so the batch or epoch mean is the mean over all elements,
as gpunn.nn.MSELoss computes it). `StepTimes.loss` is the mean over the step's batch, `EpochResult.loss` over
the epoch's samples.

`Backend.train_epoch` runs `train_step` over host batches; a backend with device-resident data replaces it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpunn.errors import GpunnError
from gpunn.nn.functional import DEFAULT_REDUCTION, REDUCTIONS
from gpunn.nn.models import MODELS, model_spec
from gpunn.rundata import images_to_float
from gpunn.seeding import batch_slices


def check_reduction_setting(model_name: str, reduction: str) -> None:
    """A one-line GpunnError when a run asks for a loss reduction that is unknown or that `model_name` lacks
    (called by the backends that build a loss head for any model: cpu-numpy and the GPU engine)."""
    if reduction not in REDUCTIONS:
        raise GpunnError(f"loss reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
    if reduction not in model_spec(model_name).reductions:
        takers = [name for name, spec in MODELS.items() if reduction in spec.reductions]
        raise GpunnError(f"loss reduction {reduction} (_r{reduction}) is for the classifiers "
                         f"({', '.join(takers)}); the {model_name}'s MSE loss trains with the batch "
                         f"{DEFAULT_REDUCTION} only: drop _r{reduction} from the run path")


@dataclass
class StepTimes:
    loss: float        # mean per-sample loss of the batch
    forward_s: float   # forward pass and loss (and the host-to-device copy of the batch, where there is one)
    backward_s: float  # backward pass and parameter update


@dataclass
class EpochResult:
    loss: float        # mean per-sample loss over the epoch (NaN or inf once training diverged)
    forward_s: float   # summed over the epoch's steps
    backward_s: float
    steps: int         # steps run: fewer than the epoch's batches when a non-finite loss stopped it
    diverged_at: int = 0  # 1-based batch number whose loss was not finite (0: none, or not known per step)


class DeferredSplitEpoch(EpochResult):
    """An EpochResult whose forward and backward sums are read when first asked for: `split()` returns them, or
    raises once they can no longer be read (the next epoch re-records the marks they come from). So an epoch's timed
    region ends when its work and losses are done: a GPU's resident epoch reads 2 x steps event pairs for its split,
    about 5 ms of host time an MLP epoch (938 steps) on an H200."""

    def __init__(self, loss: float, steps: int, split: Callable[[], tuple[float, float]]):
        self.loss, self.steps, self.diverged_at = loss, steps, 0
        self._split, self._sums = split, None

    def _read(self) -> tuple[float, float]:
        if self._sums is None:
            self._sums = self._split()
        return self._sums

    @property
    def forward_s(self) -> float:
        return self._read()[0]

    @property
    def backward_s(self) -> float:
        return self._read()[1]


# progress(batch number, batches in the epoch, mean loss so far): called after each host-loop step (the
# caller decides when to print), by the GPU's host-batch epochs every host_steps.PROGRESS_STEPS steps;
# device-resident epochs, which wait for the GPU once, do not call it
Progress = Callable[[int, int, float], None]


class Backend:
    """Base of every variant: host-side epoch loop over `train_step`; subclasses define the step."""

    name = "backend"

    def __init__(self, model, model_name: str, lr: float):
        self.model = model
        self.model_name = model_name
        self.lr = float(lr)
        self.model_spec = model_spec(model_name)
        self.target_is_input = not self.model_spec.classifier  # the autoencoder: a step's target is its input
        self._train_x = self._train_y = None

    # ---- the contract
    def warm_up(self, batch_sizes) -> None:
        """Nothing to compile by default."""

    def prepare_epoch(self, batch: int) -> None:
        """Make what an epoch of the loaded training set at `batch` runs (bound copies, events, step programs,
        graphs) before it is timed, so that the first epoch's time is an epoch's; nothing to make by default."""

    def load_train_data(self, x: np.ndarray, y: np.ndarray | None) -> None:
        self._train_x = images_to_float(np.asarray(x))
        self._train_y = None if y is None else np.asarray(y)

    def train_epoch(self, order: np.ndarray, batch: int, progress: Progress | None = None) -> EpochResult:
        """Every batch of the epoch through `train_step`; stops at the first non-finite step loss."""
        x, y = self._loaded()
        slices = batch_slices(len(x), batch)
        loss_sum = forward_s = backward_s = 0.0
        for number, (s, e) in enumerate(slices, 1):
            index = order[s:e]
            xb = x[index]
            step = self.train_step(xb, xb if self.target_is_input else y[index])
            forward_s += step.forward_s
            backward_s += step.backward_s
            if not math.isfinite(step.loss):
                return EpochResult(step.loss, forward_s, backward_s, number, diverged_at=number)
            loss_sum += step.loss * (e - s)
            if progress is not None:
                progress(number, len(slices), loss_sum / e)
        return EpochResult(loss_sum / len(x), forward_s, backward_s, len(slices))

    def train_step(self, xb: np.ndarray, target: np.ndarray) -> StepTimes:
        raise NotImplementedError

    def predict(self, xb: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def parameters(self) -> np.ndarray:
        raise NotImplementedError

    # ---- helpers
    def _loaded(self):
        if self._train_x is None:
            raise RuntimeError(f"{self.name}: load_train_data() before train_epoch()")
        if self._train_y is None and not self.target_is_input:
            raise RuntimeError(f"{self.name}: a classifier needs labels in load_train_data()")
        return self._train_x, self._train_y
