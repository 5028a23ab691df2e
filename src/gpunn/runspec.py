"""Run specifications: one training run is named by a path that Snakemake wildcards carry,

    <dataset>/<split>/<model>/<variant>/<hparams>

with hparams like `w256_b64_lr0.01_e10_s0` (model widths, batch size, learning rate, epochs, seed) and an
optional `_n1000` (train on the first 1000 samples of the split). GPU variants and sweeps are new values
of these fields, so the pipeline needs no new plumbing for them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from gpunn.errors import GpunnError

MODELS = ("mlp", "cnn", "autoencoder")
SPLITS = ("standard", "e2")
# widths per model: mlp (hidden,), cnn and autoencoder (first conv channels, second conv channels)
WIDTH_COUNT = {"mlp": 1, "cnn": 2, "autoencoder": 2}

_HPARAMS = re.compile(
    r"^w(?P<widths>\d+(?:-\d+)*)_b(?P<batch>\d+)_lr(?P<lr>[0-9.eE+-]+)_e(?P<epochs>\d+)_s(?P<seed>\d+)"
    r"(?:_n(?P<subset>\d+))?$"
)


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

    def __post_init__(self):
        if self.model not in MODELS:
            raise GpunnError(f"unknown model '{self.model}': choose one of {', '.join(MODELS)}")
        if self.split not in SPLITS:
            raise GpunnError(f"unknown split '{self.split}': choose one of {', '.join(SPLITS)}")
        if len(self.widths) != WIDTH_COUNT[self.model]:
            raise GpunnError(
                f"model {self.model} takes {WIDTH_COUNT[self.model]} width(s), got {list(self.widths)}"
            )
        for name, value in (("batch", self.batch), ("epochs", self.epochs), *(("width", w) for w in self.widths)):
            if value <= 0:
                raise GpunnError(f"{name} must be positive, got {value}")
        if not self.lr > 0:
            raise GpunnError(f"learning rate must be positive, got {self.lr}")
        if self.subset < 0 or self.seed < 0:
            raise GpunnError("subset and seed must not be negative")

    @property
    def hparams(self) -> str:
        text = (
            f"w{'-'.join(str(w) for w in self.widths)}_b{self.batch}_lr{format_float(self.lr)}"
            f"_e{self.epochs}_s{self.seed}"
        )
        return text + (f"_n{self.subset}" if self.subset else "")

    @property
    def path(self) -> str:
        return f"{self.dataset}/{self.split}/{self.model}/{self.variant}/{self.hparams}"

    def model_sizes(self, image_shape: tuple[int, int, int], num_classes: int) -> dict:
        """Keyword arguments for gpunn.nn.build_model, from the widths and the data's shape."""
        channels, height, width = image_shape
        if self.model == "mlp":
            return {"in_features": channels * height * width, "hidden": self.widths[0], "classes": num_classes}
        if height != width:
            raise GpunnError(f"{self.model} needs square images, dataset {self.dataset} has {height}x{width}")
        if self.model == "cnn":
            return {"in_channels": channels, "image_size": height, "channels": self.widths, "classes": num_classes}
        return {"in_channels": channels, "image_size": height, "channels": self.widths}

    def to_dict(self) -> dict:
        out = asdict(self)
        out["widths"] = list(self.widths)
        out["path"] = self.path
        return out


def format_float(value: float) -> str:
    """Shortest text that reads back as the same float (0.01 -> '0.01', 1e-05 -> '1e-05')."""
    return repr(float(value))


def parse_hparams(text: str) -> dict:
    match = _HPARAMS.match(text)
    if not match:
        raise GpunnError(
            f"cannot read hyperparameters '{text}': expected e.g. w256_b64_lr0.01_e10_s0 (optionally _n1000)"
        )
    try:
        lr = float(match["lr"])
    except ValueError:
        raise GpunnError(f"cannot read the learning rate in '{text}'") from None
    return {
        "widths": tuple(int(w) for w in match["widths"].split("-")),
        "batch": int(match["batch"]),
        "lr": lr,
        "epochs": int(match["epochs"]),
        "seed": int(match["seed"]),
        "subset": int(match["subset"] or 0),
    }


def parse_run_path(path: str) -> RunSpec:
    """RunSpec from '<dataset>/<split>/<model>/<variant>/<hparams>' (extra leading folders are ignored)."""
    parts = [p for p in str(path).strip("/").split("/") if p]
    if len(parts) < 5:
        raise GpunnError(f"run path '{path}' must look like <dataset>/<split>/<model>/<variant>/<hparams>")
    dataset, split, model, variant, hparams = parts[-5:]
    return RunSpec(dataset=dataset, split=split, model=model, variant=variant, **parse_hparams(hparams))
