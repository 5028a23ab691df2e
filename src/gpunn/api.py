"""The Python API: train a model of gpunn.nn on the CPU or the GPU without the pipeline (paper 003's plan).

    from gpunn.api import Trainer
    from gpunn.nn import cnn
    trainer = Trainer(cnn(image_size=8, channels=(16, 32), seed=0), "cuda")   # or "cpu"
    history = trainer.fit(x, y, epochs=10, batch=32, seed=0)            # [{"epoch", "train_loss", "seconds"}, ...]
    trainer.evaluate(x_test, y_test)                                    # {"loss": ..., "accuracy": ...}
    trainer.predict(x_test)                                             # logits (reconstructions: autoencoder)

A Trainer is one training variant of gpunn.backends.registry run by the pipeline's own epoch loop (gpunn.epochs)
and evaluation (gpunn.evaluate). Device "cpu" trains with cpu-numpy, the reference; "cuda" with the model's fastest
GPU variant that runs here (registry.fastest_gpu_variant: gpu-graph on a GPU; under numba's CUDA simulator, which
has no CUDA graphs, gpu-fused for the MLP and gpu-im2col for the CNN); `variant=` names another. Whatever the
device, one seed gives the same init and the same batches (gpunn.seeding), so "cpu" and "cuda" give the same
losses and weights up to float32 rounding.

Images are uint8 pixels (scaled by 1/255 as the pipeline does) or floats in [0, 1], of the model's input shape
(a single-channel model also takes (N, H, W); the MLP any shape of its input size); labels are class indices.
"""

from __future__ import annotations

import numpy as np

from gpunn.backends.registry import fastest_gpu_variant, make_backend, variants_for
from gpunn.epochs import DivergenceRule, train_epochs
from gpunn.errors import GpunnError, install_excepthook
from gpunn.evaluate import EVAL_BATCH, predict, test_metrics
from gpunn.nn.models import model_spec
from gpunn.rundata import images_to_float
from gpunn.runspec import format_lr

DEVICES = ("cpu", "cuda")
install_excepthook()  # a script's GpunnError ends in its one line, as the CLI's do


def pick_variant(model_name: str, device: str, variant: str | None = None) -> str:
    """The variant a model trains with on `device`: `variant` when it can, else the device's default; one
    GpunnError line listing the valid choices when `device` or `variant` cannot train the model here."""
    if device not in DEVICES:
        raise GpunnError(f"device {device!r} is not known: choose one of {', '.join(DEVICES)}")
    simulator = False
    if device == "cuda":
        from numba import cuda  # imports numba: only for the GPU

        from gpunn.device import simulator_enabled

        if not cuda.is_available():
            raise GpunnError('device "cuda" needs a CUDA GPU and none is usable here (no driver or no device): '
                             'train on the CPU with device "cpu", or for tiny shapes under numba\'s CUDA simulator '
                             '(NUMBA_ENABLE_CUDASIM=1 set before numba is imported, about 1e5 times slower)')
        simulator = simulator_enabled()
    choices = variants_for(model_name, simulator=simulator, gpu=device == "cuda")
    where = "on cuda under numba's CUDA simulator" if simulator else f"on {device}"
    if not choices:
        raise GpunnError(f"no variant trains the {model_name} {where}: use device \"cpu\" "
                         f"({', '.join(variants_for(model_name, gpu=False))})")
    if variant is None:
        return fastest_gpu_variant(model_name, simulator) if device == "cuda" else "cpu-numpy"
    if variant not in choices:
        raise GpunnError(f"variant {variant!r} does not train the {model_name} {where}: "
                         f"choose one of {', '.join(choices)}")
    return variant


def _learning_rate(lr) -> float:
    """`lr` as a float, or one GpunnError line when it is not a finite number > 0."""
    try:
        value = float(lr)
    except (TypeError, ValueError):
        raise GpunnError(f"lr must be a number > 0, got {lr!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise GpunnError(f"lr must be a finite number > 0, got {lr!r}; SGD steps against the gradient at lr > 0 "
                         "(e.g. lr=0.01)")
    return value


class Trainer:
    """Trains `model` (built by gpunn.nn.mlp, cnn, autoencoder or build_model) on `device` with plain SGD at `lr`;
    `Trainer(model, "cuda")` or `Trainer(model, "cpu")`. After fit, `model.flat` holds the trained weights."""

    def __init__(self, model, device: str = "cuda", variant: str | None = None, lr: float = 0.01, block: int = 0):
        if getattr(model, "name", None) is None or getattr(model, "input_shape", None) is None:
            raise GpunnError("this model was not built by gpunn.nn.mlp, cnn, autoencoder or build_model: a trainer "
                             "needs its name and input shape (set model.name and model.input_shape)")
        self.model = model
        self.device = device
        self.variant = pick_variant(model.name, device, variant)
        if device == "cuda" and model.dtype != np.float32:
            raise GpunnError(f"the GPU variants train float32 models, this {model.name} is {model.dtype}: "
                             "build it with dtype=np.float32 or use model.astype(np.float32)")
        self.lr = _learning_rate(lr)
        self.backend = make_backend(self.variant, model, model.name, self.lr, block=block)
        self.epochs_done = 0  # fit continues the epoch count: the batch order of epoch k is the same either way
        # the pipeline's divergence rule, over every fit: later epochs are held against the first fit's first epoch
        classes = getattr(model.layers[-1], "out_features", None) if model_spec(model.name).classifier else None
        self._divergence = DivergenceRule(f"the {model.name} on {self.variant}", self.lr, classes)

    def __repr__(self) -> str:
        return (f"Trainer({self.model.name} on {self.device}: {self.variant}, lr {format_lr(self.lr)}, "
                f"{self.epochs_done} epochs trained)")

    def fit(self, x, y=None, epochs: int = 1, batch: int = 64, seed: int = 0, log=None) -> list[dict]:
        """Train `epochs` epochs over (x, y) in batches of `batch` (the last one partial), in the pipeline's batch
        order for `seed`; the autoencoder takes no y. A later fit goes on from the epochs trained so far (two
        fit(epochs=1) calls see the batches of one fit(epochs=2)). `log` (e.g. print) gets one line per epoch.
        Returns one {"epoch", "train_loss" (mean per-sample loss), "seconds"} per epoch. Training that diverges
        (gpunn.epochs.DivergenceRule, as in the pipeline) stops with one GpunnError line."""
        for name, value in (("epochs", epochs), ("batch", batch)):
            if int(value) != value or value < 1:
                raise GpunnError(f"fit: {name} must be a positive integer, got {value!r}")
        x = self._images(x, "fit")
        y = self._labels(y, len(x), "fit")
        history = []
        for epoch, result, seconds in train_epochs(self.backend, x, y, epochs=int(epochs), batch=int(batch),
                                                   seed=seed, rule=self._divergence, first_epoch=self.epochs_done,
                                                   log=log):
            self.epochs_done = epoch
            history.append({"epoch": epoch, "train_loss": result.loss, "seconds": seconds})
            if log is not None:
                log(f"epoch {epoch}: train loss {result.loss:.4f} ({seconds:.2f} s)")
        self.backend.parameters()  # a GPU variant copies the trained weights back into model.flat
        return history

    def predict(self, x, batch: int = EVAL_BATCH) -> np.ndarray:
        """The model's outputs for x (logits, or the autoencoder's reconstructions) as float32, in batches."""
        return predict(self.backend, self._images(x, "predict"), batch)

    def evaluate(self, x, y=None, batch: int = EVAL_BATCH) -> dict:
        """{"loss": mean per-sample loss, "accuracy": fraction of correct classes (NaN for the autoencoder)} on
        (x, y), as the pipeline evaluates its test set."""
        x = self._images(x, "evaluate")
        metrics = test_metrics(self.model.name, predict(self.backend, x, batch), x, self._labels(y, len(x), "evaluate"))
        return {"loss": metrics["test_loss"], "accuracy": metrics["test_accuracy"]}

    def parameters(self) -> np.ndarray:
        """The flat parameter buffer (model.flat, brought up to date with the device's copy)."""
        return self.backend.parameters()

    # ---- input checks: one clear line instead of a shape error deep inside a kernel launch
    def _images(self, x, what: str) -> np.ndarray:
        x = np.asarray(x)
        shape = self.model.input_shape
        if x.ndim < 2 or len(x) == 0:
            raise GpunnError(f"{what}: expected a non-empty array of samples (samples on the first axis), "
                             f"got shape {x.shape}")
        if np.issubdtype(x.dtype, np.floating):
            finite = np.isfinite(x)
            if not finite.all():
                kinds = " and ".join(k for k, n in (("NaN", np.isnan(x).sum()), ("inf", np.isinf(x).sum())) if n)
                raise GpunnError(f"{what}: float images must be finite and in [0, 1], got {kinds} in "
                                 f"{int((~finite).sum())} of {x.size} values; replace or drop those samples")
            if x.min() < 0 or x.max() > 1:
                raise GpunnError(f"{what}: float images must be finite and in [0, 1], got values in "
                                 f"[{x.min()}, {x.max()}]; divide 0-255 pixels by 255 or pass uint8")
        elif x.dtype != np.uint8:
            raise GpunnError(f"{what}: images must be uint8 pixels or floats in [0, 1], got {x.dtype}")
        got = x.shape[1:]
        if got != shape:
            flat_input = len(shape) == 1 and int(np.prod(got)) == shape[0]
            no_channel_axis = shape[0] == 1 and got == shape[1:]
            if not (flat_input or no_channel_axis):
                also = (" (or any shape of that size)" if len(shape) == 1
                        else f" (or {shape[1:]})" if shape[0] == 1 else "")
                raise GpunnError(f"{what}: the {self.model.name} takes samples of shape {shape}{also}, "
                                 f"got {got} (array of shape {x.shape})")
            x = x.reshape(len(x), *shape)
        return images_to_float(x)

    def _labels(self, y, n: int, what: str) -> np.ndarray | None:
        name = self.model.name
        if not model_spec(name).classifier:
            if y is not None:
                raise GpunnError(f"{what}: the {name}'s target is its input; pass no labels")
            return None
        classes = self.model.layers[-1].out_features
        if y is None:
            raise GpunnError(f"{what}: the {name} is a classifier: pass labels y, class indices in [0, {classes})")
        y = np.asarray(y)
        if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
            raise GpunnError(f"{what}: expected {n} integer labels (one per image, a 1-D array), "
                             f"got {y.dtype} of shape {y.shape}")
        if y.min() < 0 or y.max() >= classes:
            raise GpunnError(f"{what}: labels must be class indices in [0, {classes}), got [{y.min()}, {y.max()}]")
        return y.astype(np.int64)
