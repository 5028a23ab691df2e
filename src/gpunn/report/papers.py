"""A paper's numbers as data: `PaperValue`, one number as printed with where it stands in the paper, what it
measures (QUANTITIES), its unit (UNITS) and the setting it was measured in; `select` finds values.

The papers are the five files under ../shared/seeds; each experiment module (gpunn.experiments.eN) holds the
values of its paper and PHASES, the paper's implementations mapped to the gpunn variants that reproduce them.
`text` is the number exactly as printed (thousands commas kept, '%' and '×' not); `value` is it as a float in
`unit`. `anchor` is text of the paper, found in order, after which the value stands (before it, for a table whose
caption is below it: `caption_below`), `row` / `column` its table cell as printed: tests/test_papers.py checks
every value against its paper. Left out on purpose: theory and design numbers, settings (they are the values'
settings instead), profiler shares, and the text's less precise re-statements of a table value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpunn.errors import GpunnError

QUANTITIES = {  # name: what it measures
    "train_time": "training time over all epochs",
    "epoch_time": "time of one training epoch",
    "block_time": "training time of a block of 100 images",
    "test_time": "the test set through the trained model once",
    "forward_time": "forward-pass time summed over training",
    "backward_time": "backpropagation time summed over training",
    "fit_time": "SVM training time",
    "speedup": "the `versus` phase's time over this phase's",
    "expected_speedup": "a speedup the paper expects or targets, not measures",
    "time_reduction": "training time saved against the `versus` phase, in % of its time",
    "memory_reduction": "host memory saved against the `versus` phase, in % of its memory",
    "test_accuracy": "accuracy on the test set",
    "train_accuracy": "accuracy on the training set",
    "expected_accuracy": "an accuracy the paper expected",
    "accuracy_gap": "the `versus` phase's test accuracy minus this phase's",
    "train_loss": "mean training loss of an epoch (`epoch`; None: the last)",
    "train_mse": "mean training MSE of an epoch (`epoch`; None: the last)",
    "test_mse": "MSE on the test set after training",
    "gpu_memory": "GPU memory the training used",
    "host_memory": "host memory the training used",
    "parameters": "trainable parameters of the model",
    "relative_error": "a tolerance: GPU against CPU, relative error",
}
TIME_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}  # unit: seconds
UNITS = {**{u: "time" for u in TIME_UNITS}, "%": "percent", "fraction": "a fraction in [0, 1]",
         "pp": "percentage points", "x": "times (a ratio of times)", "CE": "cross-entropy per sample",
         "MSE": "mean squared error", "MiB": "2^20 bytes", "count": "a number of things",
         "relative": "a relative error"}


@dataclass(frozen=True)
class PaperValue:
    """One number of a paper, as printed, in its setting (module docstring)."""

    experiment: str            # e1 ... e6
    paper: str                 # the paper's file name under ../shared/seeds
    source: str                # the table or section as the paper names it
    anchor: tuple[str, ...]    # seed text found in this order; the value stands after the last (caption_below: before)
    quantity: str              # a key of QUANTITIES
    unit: str                  # a key of UNITS
    text: str                  # the number as printed (a range: its lower bound)
    phase: str                 # the paper's implementation or device; phases[phase]: our variants
    hardware: str              # what the paper ran it on
    dataset: str
    n_train: int | None = None
    n_test: int | None = None
    batch: int | None = None
    epochs: int | None = None
    row: str | None = None     # table cell: row and column labels as printed (None: running text)
    column: str | None = None
    caption_below: bool = False
    versus: str | None = None  # the other phase of a speedup, gap or reduction (the baseline)
    upper_text: str | None = None  # a range's upper bound as printed ("5-50x": text "5", upper_text "50")
    hidden: int | None = None
    block: int | None = None   # threads per block
    epoch: int | None = None   # the epoch of a per-epoch value
    workers: int | None = None  # paper 001's PyTorch DataLoader settings
    pin_memory: bool | None = None
    note: str = ""
    # the paper's phase -> the gpunn variants that reproduce it, first preferred (its experiment's PHASES)
    phases: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def number(self) -> Decimal:
        """The printed number, exactly (Decimal keeps its precision)."""
        return Decimal(self.text.replace(",", ""))

    @property
    def value(self) -> float:
        return float(self.number)

    @property
    def upper(self) -> float | None:
        return None if self.upper_text is None else float(Decimal(self.upper_text.replace(",", "")))

    @property
    def decimals(self) -> int:
        """Digits printed after the decimal point."""
        return max(0, -self.number.as_tuple().exponent)

    @property
    def ours(self) -> tuple[str, ...]:
        """The gpunn variants that reproduce this phase, the first preferred; () where gpunn has none."""
        return self.phases[self.phase]

    @property
    def seconds(self) -> float | None:
        """A time in seconds (None: not a time)."""
        return self.value * TIME_UNITS[self.unit] if self.unit in TIME_UNITS else None


def select(values: Iterable[PaperValue], experiment: str | None = None, quantity: str | None = None,
           **fields) -> tuple[PaperValue, ...]:
    """The entries of `values` of `experiment` (None: any) measuring `quantity` (None: any) whose other fields
    equal `fields` (e.g. phase='GPU naive', source=..., unit='s', batch=64), in their order."""
    unknown = [name for name in fields if name not in PaperValue.__dataclass_fields__]
    if unknown:
        raise GpunnError(f"paper values: no field {', '.join(unknown)}; the fields are "
                         f"{', '.join(PaperValue.__dataclass_fields__)}")
    return tuple(entry for entry in values
                 if (experiment is None or entry.experiment == experiment)
                 and (quantity is None or entry.quantity == quantity)
                 and all(getattr(entry, name) == want for name, want in fields.items()))


def select_one(values: Iterable[PaperValue], experiment: str | None, quantity: str, **fields) -> PaperValue:
    """The one entry `select` finds; a GpunnError naming the selection when there are none or several."""
    found = select(values, experiment, quantity, **fields)
    if len(found) != 1:
        where = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise GpunnError(f"papers: {len(found)} values of {experiment or 'any experiment'} {quantity} with "
                         f"{where or 'no filter'}; expected one")
    return found[0]


def column_labels(values: Iterable[PaperValue], source: str) -> tuple[str, ...]:
    """The column labels of a paper's table `source`, as printed, in the order of its entries."""
    return tuple(dict.fromkeys(e.column for e in values if e.source == source and e.column))
