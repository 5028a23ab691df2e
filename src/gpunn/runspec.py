"""Run specifications: one training run is named by a path that Snakemake wildcards carry,

    <dataset>/<split>/<model>/<variant>/<hparams>

with hparams like `w256_b64_lr0.01_e10_s0` (model widths, batch size, learning rate, epochs, seed), an
optional `_n1000` (train on the first 1000 samples of the split), an optional `_t256` (threads per block of
the kernels that take one, for the GPU variants whose registry entry says `blocks`; absent: each kernel's own
default), an optional `_rsum` (the loss gradient is the sum over the batch instead of the mean,
gpunn.nn.functional.REDUCTIONS; absent: the mean) and an optional `_x<k>` (the k-th repeat of the same run: same
init, batch order and settings, so it differs from the first only where a variant's arithmetic order is not fixed,
such as gpu-naive's atomics; absent: the run itself, repeat 0). GPU variants and sweeps are new values
of these fields, so the pipeline needs no new plumbing for them.

This module is the one statement of that grammar; everything else imports it:
    RunSpec.path, parse_run_path         the path and back (parse_hparams reads its last part)
    RunSpec.to_dict, RunSpec.from_dict   the record kept in metrics.json and weights.npz, and back
    RUN_PATTERN, WILDCARD_CONSTRAINTS    the path as a Snakemake pattern (a wildcard per field) and what each
                                         field may hold (workflow/rules/common.smk)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from gpunn.data.registry import DATASETS
from gpunn.errors import GpunnError
from gpunn.nn.functional import DEFAULT_REDUCTION, REDUCTIONS
from gpunn.nn.models import MODELS, model_spec

SPLITS = ("standard", "e2")
# threads per block a run may ask for (`_t<block>`): powers of two from one warp to CUDA's per-block limit
BLOCK_SIZES = (32, 64, 128, 256, 512, 1024)

PATH_FIELDS = ("dataset", "split", "model", "variant", "hparams")
RUN_PATTERN = "/".join(f"{{{field}}}" for field in PATH_FIELDS)  # {dataset}/{split}/{model}/{variant}/{hparams}

# The hparams text; its named groups are the RunSpec fields it holds.
_HPARAMS_REGEX = (r"w(?P<widths>\d+(?:-\d+)*)_b(?P<batch>\d+)_lr(?P<lr>[0-9.eE+-]+)_e(?P<epochs>\d+)_s(?P<seed>\d+)"
                  r"(?:_n(?P<subset>\d+))?(?:_t(?P<block>\d+))?(?:_r(?P<reduction>[a-z]+))?(?:_x(?P<repeat>\d+))?")
# (any word after _r: a reduction that is not one of REDUCTIONS is refused by RunSpec with one line naming them,
# instead of the path not matching at all)
_HPARAMS = re.compile(_HPARAMS_REGEX)

# What each path field may hold, as Snakemake wildcard constraints (it wraps each in a named group of its own,
# so the hparams regex goes in with its groups unnamed). Variants are lowercase words joined by hyphens.
WILDCARD_CONSTRAINTS = {
    "dataset": "|".join(DATASETS),
    "split": "|".join(SPLITS),
    "model": "|".join(MODELS),
    "variant": "[a-z0-9]+(?:-[a-z0-9]+)*",
    "hparams": re.sub(r"\(\?P<\w+>", "(?:", _HPARAMS_REGEX),
}


def model_sizes(model: str, widths: tuple[int, ...], image_shape: tuple[int, int, int], num_classes: int,
                dataset: str = "") -> dict:
    """Keyword arguments for gpunn.nn.build_model: `model` at `widths` (mlp: hidden; cnn, autoencoder: the two
    convolutions' channels) on data of `image_shape` (C, H, W) and `num_classes` classes."""
    spec = model_spec(model)
    _, height, width = image_shape
    if spec.square_images and height != width:
        raise GpunnError(f"{model} needs square images, dataset {dataset} has {height}x{width}")
    return spec.sizes(widths, image_shape, num_classes)


@dataclass(frozen=True)
class RunSpec:
    dataset: str
    split: str
    model: str
    variant: str
    widths: tuple[int, ...]
    batch: int
    lr: float
    epochs: int
    seed: int
    subset: int = 0  # 0: the whole training split
    block: int = 0   # threads per block of the kernels that take one (0: each kernel's default)
    # the loss gradient over the batch: "mean" or "sum" (REDUCTIONS); the path leaves the default mean out, so
    # every run path from before names the same run
    reduction: str = DEFAULT_REDUCTION
    # the k-th repeat of the same run (0: the run itself, no suffix): for the run-to-run spread of a variant whose
    # arithmetic order is not fixed
    repeat: int = 0

    def __post_init__(self):
        count = model_spec(self.model).width_count
        if self.split not in SPLITS:
            raise GpunnError(f"unknown split '{self.split}': choose one of {', '.join(SPLITS)}")
        if len(self.widths) != count:
            raise GpunnError(f"model {self.model} takes {count} width(s), got {list(self.widths)}")
        for name, value in (("batch", self.batch), ("epochs", self.epochs), *(("width", w) for w in self.widths)):
            if value <= 0:
                raise GpunnError(f"{name} must be positive, got {value}")
        if not self.lr > 0:
            raise GpunnError(f"learning rate must be positive, got {self.lr}")
        if self.subset < 0 or self.seed < 0 or self.repeat < 0:
            raise GpunnError("subset, seed and repeat must not be negative")
        if self.block and self.block not in BLOCK_SIZES:
            raise GpunnError(f"block size {self.block} (_t{self.block}) is not one of "
                             f"{', '.join(map(str, BLOCK_SIZES))} threads per block")
        if self.reduction not in REDUCTIONS:
            raise GpunnError(f"loss reduction '{self.reduction}' (_r{self.reduction}) is not one of "
                             f"{', '.join(REDUCTIONS)}; write _rsum for the batch sum, nothing for the mean")

    @property
    def hparams(self) -> str:
        text = f"w{format_widths(self.widths)}_b{self.batch}_lr{format_lr(self.lr)}_e{self.epochs}_s{self.seed}"
        return (text + (f"_n{self.subset}" if self.subset else "") + (f"_t{self.block}" if self.block else "")
                + (f"_r{self.reduction}" if self.reduction != DEFAULT_REDUCTION else "")
                + (f"_x{self.repeat}" if self.repeat else ""))

    @property
    def path(self) -> str:
        """'<dataset>/<split>/<model>/<variant>/<hparams>': parse_run_path reads it back."""
        return format_run_path({field: getattr(self, field) for field in PATH_FIELDS})

    def model_sizes(self, image_shape: tuple[int, int, int], num_classes: int) -> dict:
        """Keyword arguments for gpunn.nn.build_model, from the widths and the data's shape."""
        return model_sizes(self.model, self.widths, image_shape, num_classes, self.dataset)

    def to_dict(self) -> dict:
        """The record kept with a run's outputs: every field (for readers of the JSON) and the path."""
        out = asdict(self)
        out["widths"] = list(self.widths)
        out["path"] = self.path
        return out

    @classmethod
    def from_dict(cls, record: dict) -> RunSpec:
        """The spec of a to_dict record, read from its path (which holds every field)."""
        return parse_run_path(record["path"])


# learning rates from 1e-4 up to 1e4 are written as decimals, others in compact scientific notation
_DECIMAL_RANGE = (1e-4, 1e4)


def format_lr(value: float) -> str:
    """The one text of a learning rate, in run paths, logs and tables: the shortest that reads back as the same
    float, as a decimal within _DECIMAL_RANGE (0.01 -> '0.01', 2.0 -> '2.0') and otherwise as mantissa 'e'
    exponent without '+' or leading zeros (1e6 -> '1e6', 1e-05 -> '1e-5', 2.5e-07 -> '2.5e-7')."""
    value = float(value)
    low, high = _DECIMAL_RANGE
    if low <= abs(value) < high or not math.isfinite(value) or not value:
        return repr(value)  # Python's shortest round trip, a decimal throughout this range
    return np.format_float_scientific(value, unique=True, trim="-", exp_digits=1).replace("+", "")


def format_widths(widths) -> str:
    """Model widths as in hparams: (256, 128) -> '256-128'."""
    return "-".join(str(w) for w in widths)


def format_run_path(fields) -> str:
    """The run path from a mapping of the PATH_FIELDS (a RunSpec's values, or a Snakemake job's wildcards)."""
    return RUN_PATTERN.format(**{field: fields[field] for field in PATH_FIELDS})


def parse_hparams(text: str) -> dict:
    match = _HPARAMS.fullmatch(text)
    if not match:
        raise GpunnError(
            f"cannot read hyperparameters '{text}': expected e.g. w256_b64_lr0.01_e10_s0 (optionally _n1000, then "
            "_t256, then _rsum, then _x1)"
        )
    if match["reduction"] == DEFAULT_REDUCTION:
        # one path per run: the default is written as no suffix, so `_rmean` would name a second folder for it
        raise GpunnError(f"cannot read hyperparameters '{text}': the mean reduction is the default, leave out "
                         f"_r{DEFAULT_REDUCTION}")
    written = match["repeat"]
    if written is not None and written != str(int(written) or ""):
        # one path per run: the run itself (repeat 0) has no suffix, and a repeat one spelling
        repeat = int(written)
        raise GpunnError(f"cannot read hyperparameters '{text}': write repeat {repeat} as "
                         + (f"_x{repeat}" if repeat else "no suffix (the run itself)"))
    try:
        lr = float(match["lr"])
    except ValueError:
        raise GpunnError(f"cannot read the learning rate in '{text}'") from None
    if format_lr(lr) != match["lr"]:
        # one path per run: 1e-2, 0.010 and 0.01 would otherwise name three folders for one learning rate
        raise GpunnError(f"cannot read hyperparameters '{text}': write the learning rate {match['lr']} as "
                         f"lr{format_lr(lr)}")
    return {
        "widths": tuple(int(w) for w in match["widths"].split("-")),
        "batch": int(match["batch"]),
        "lr": lr,
        "epochs": int(match["epochs"]),
        "seed": int(match["seed"]),
        "subset": int(match["subset"] or 0),
        "block": int(match["block"] or 0),
        "reduction": match["reduction"] or DEFAULT_REDUCTION,
        "repeat": int(match["repeat"] or 0),
    }


def parse_run_path(path: str) -> RunSpec:
    """RunSpec from '<dataset>/<split>/<model>/<variant>/<hparams>' (extra leading folders are ignored)."""
    parts = [p for p in str(path).strip("/").split("/") if p]
    if len(parts) < 5:
        raise GpunnError(f"run path '{path}' must look like <dataset>/<split>/<model>/<variant>/<hparams>")
    dataset, split, model, variant, hparams = parts[-5:]
    return RunSpec(dataset=dataset, split=split, model=model, variant=variant, **parse_hparams(hparams))
