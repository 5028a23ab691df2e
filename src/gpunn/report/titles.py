"""Titles of the report's tables and figures, built from the rows they show rather than written by hand, so a
smoke run on 64 digits is never captioned as the paper's MNIST run; and the provenance of their timings:
which device timed each row, and whether it ran under numba's CUDA simulator (timings then meaningless).

Provenance comes from a run's metrics.json ("provenance": {"device", "simulator", "cpu", ...}) or from the
device / simulator columns of a timing CSV. Outputs written before provenance existed lack both: their device
is UNKNOWN_DEVICE and they count as not simulated, except that a device named after the simulator (the block
sweep always wrote "numba CUDA simulator (...)") is simulated whatever the flag says.

Markdown titles are one line (parts joined by ", " and " — "); figure titles break the same parts into lines.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from gpunn.nn.models import MODELS

# the device column of every row timed under the simulator: the real device name would only mislead
SIMULATOR_DEVICE = "cuda-simulator"
UNKNOWN_DEVICE = "unknown"
SIMULATED_SUFFIX = "under the CUDA simulator: not meaningful"


# ------------------------------------------------------------------------------------------- provenance
def _is_true(value) -> bool:
    """A provenance flag read from JSON (bool) or from a CSV (bool, 'True'/'true', 1); missing counts as false."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _names_simulator(device) -> bool:
    return isinstance(device, str) and "simulator" in device.lower()


def device_fields(provenance: Mapping | None) -> dict:
    """The device, simulator and cpu fields of one row from a run's provenance dict (None: an older run)."""
    provenance = provenance or {}
    device = provenance.get("device")
    simulator = _is_true(provenance.get("simulator")) or _names_simulator(device)
    if simulator:
        device = SIMULATOR_DEVICE
    elif device is None or (isinstance(device, float) and math.isnan(device)) or not str(device).strip():
        device = UNKNOWN_DEVICE
    cpu = provenance.get("cpu")
    return {"device": str(device), "simulator": simulator, "cpu": str(cpu) if cpu else None}


def with_device_fields(frame: pd.DataFrame) -> pd.DataFrame:
    """A timing CSV's rows with device and simulator columns normalised as device_fields does (and a cpu
    column), whether or not the CSV had them."""
    columns = [c for c in ("device", "simulator", "cpu") if c in frame.columns]
    fields = [device_fields({c: row[c] for c in columns}) for _, row in frame[columns].iterrows()]
    return frame.assign(device=[f["device"] for f in fields], simulator=[f["simulator"] for f in fields],
                        cpu=[f["cpu"] for f in fields])


def _device_name(device: str, cpus: set[str]) -> str:
    """'cpu' names its processor when every CPU row ran on the same one."""
    if device.lower() == "cpu" and len(cpus) == 1:
        return f"cpu ({next(iter(cpus))})"
    return device


def timing_parts(frame: pd.DataFrame) -> list[str]:
    """What a title must say about the timings of `frame` (columns device, simulator; optional variant, cpu):
    the real devices that timed it, and which variants' timings came from the simulator."""
    parts = []
    real = frame[~frame["simulator"].map(_is_true) & (frame["device"] != UNKNOWN_DEVICE)]
    cpus = {str(c) for c in real.get("cpu", pd.Series(dtype=object)).dropna()}
    devices = list(dict.fromkeys(_device_name(str(d), cpus) for d in real["device"]))
    if devices:
        parts.append(f"timed on {join_words(devices)}")
    simulated = frame[frame["simulator"].map(_is_true)]
    if not simulated.empty:
        if "variant" in simulated:
            from gpunn.report.tables import ordered_variants

            parts.append(f"timings of {join_words(ordered_variants(simulated['variant']))} {SIMULATED_SUFFIX}")
        else:
            parts.append(f"timings {SIMULATED_SUFFIX}")
    return parts


def any_simulated(frame: pd.DataFrame) -> bool:
    return bool(frame["simulator"].map(_is_true).any())


def simulated_note(frame: pd.DataFrame) -> str | None:
    """The line under a table with rows timed under the simulator (None without any): whose timings, and why
    they must not be read as timings; the runs' losses and accuracies, where the table has them, still hold."""
    simulated = frame[frame["simulator"].map(_is_true)]
    if simulated.empty:
        return None
    why = "about 1e5 times slower than a GPU, so"
    if "variant" not in simulated:
        return f"Timed under numba's CUDA simulator on the CPU, {why} these timings are not meaningful."
    from gpunn.report.tables import ordered_variants

    variants = ordered_variants(simulated["variant"])
    their = "their" if len(variants) > 1 else "its"
    timings = f"{their} timings" + (" and speedups" if any("speedup" in str(c) for c in frame.columns) else "")
    note = (f"Device {SIMULATOR_DEVICE}: {join_words(variants)} ran under numba's CUDA simulator on the CPU, {why} "
            f"{timings} are not meaningful")
    if any(column in frame for column in ("test_accuracy", "test_loss", "test_mse")):
        note += f"; {their} losses and accuracies are"
    return note + "."


def table_title(head: str, timing: Sequence[str] = ()) -> str:
    """One Markdown line: the head, where it was timed, then the simulator warning after a dash."""
    timed = [p for p in timing if p.startswith("timed on")]
    warned = [p for p in timing if not p.startswith("timed on")]
    return ", ".join([head, *timed]) + "".join(f" — {w}" for w in warned)


FIGURE_TITLE_WIDTH = 95


def _wrapped(text: str, width: int = FIGURE_TITLE_WIDTH) -> list[str]:
    """`text` in lines of at most `width` characters where it can, broken only at spaces outside braces and
    parentheses (never inside '{32, 64}' or '(e2 split, 1 500 train / 500 test)')."""
    lines: list[str] = []
    for chunk in re.split(r" (?![^{]*\})(?![^(]*\))", text):
        if lines and len(lines[-1]) + 1 + len(chunk) <= width:
            lines[-1] += " " + chunk
        else:
            lines.append(chunk)
    return lines


def figure_title(head: str, timing: Sequence[str] = ()) -> str:
    """The head on the first line(s), wrapped to fit a figure, then each timing part on a line of its own."""
    return "\n".join([*_wrapped(head), *timing])


# ------------------------------------------------------------------------------------------- data and model
def join_words(items: Iterable) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def count(n) -> str:
    """A sample count grouped by thin spaces as in the papers' text: 37800 -> '37 800'."""
    return f"{int(n):,}".replace(",", " ")


def distinct(values: Iterable) -> list:
    """The distinct non-missing values in order of first appearance."""
    return list(dict.fromkeys(v for v in values if not (v is None or (isinstance(v, float) and math.isnan(v)))))


def one_or_set(values: Iterable, fmt=str) -> str:
    """'16' when every row has the same value, '{16, 32}' when they differ (sorted when comparable)."""
    values = distinct(values)
    if not values:
        return "?"
    if len(values) == 1:
        return fmt(values[0])
    with contextlib.suppress(TypeError):  # mixed types keep their order
        values = sorted(values)
    return "{" + ", ".join(fmt(v) for v in values) + "}"


def _epochs(values) -> str:
    values = distinct(values)
    return f"{one_or_set(values)} epoch{'' if values == [1] else 's'}"


def mlp_in_features(summary: Mapping, hidden: int) -> int | None:
    """Inputs of a run's MLP: the product of the image shape metrics.json records; for a metrics.json without
    it, solved from the parameter count (in + 1) * hidden + (hidden + 1) * classes; None if neither works."""
    shape = summary.get("image_shape")
    if shape:
        return int(math.prod(int(s) for s in shape))
    classes, params = summary.get("num_classes"), summary.get("num_parameters")
    if not classes or not params or hidden <= 0:
        return None
    inputs, rest = divmod(int(params) - (hidden + 1) * int(classes), hidden)
    return inputs - 1 if rest == 0 and inputs > 1 else None


def model_description(rows: pd.DataFrame) -> str:
    """'MLP 784-256-10', 'MLP 784-hidden-10' (several hidden sizes), 'CNN (conv channels 16, 32)',
    'convolutional autoencoder (conv channels 256, 128)'."""
    models = distinct(rows["model"])
    if any(m not in MODELS or MODELS[m].square_images for m in models):  # conv models: named with their channels
        return " and ".join(f"{MODELS[m].title if m in MODELS else m} (conv channels "
                            f"{one_or_set(rows.loc[rows['model'] == m, 'widths'], lambda w: w.replace('-', ', '))})"
                            for m in models)
    hidden = distinct(rows["widths"])
    inputs = one_or_set(rows.get("in_features", pd.Series(dtype=object)), lambda v: str(int(v)))
    classes = one_or_set(rows.get("classes", pd.Series(dtype=object)), lambda v: str(int(v)))
    if inputs == "?" and classes == "?":
        return f"MLP hidden {one_or_set(hidden)}"
    return f"MLP {inputs}-{hidden[0] if len(hidden) == 1 else 'hidden'}-{classes}"


def data_description(rows: pd.DataFrame) -> str:
    """Each dataset with its split and sample counts: 'digits8 (64 train / 360 test)',
    'mnist (e2 split, 37 800 train / 4 200 test)'; several datasets joined by 'and'."""
    parts = []
    for dataset in distinct(rows["dataset"]):
        of = rows[rows["dataset"] == dataset]
        sizes = f"{one_or_set(of['n_train'], count)} train / {one_or_set(of['n_test'], count)} test"
        splits = [s for s in distinct(of["split"]) if s != "standard"]
        parts.append(f"{dataset} ({''.join(f'{s} split, ' for s in splits)}{sizes})")
    return join_words(parts)


def training_description(rows: pd.DataFrame, sweep: Sequence[str] = ()) -> str:
    """'batch 64, 10 epochs'; the columns in `sweep` are left out (the title names them as the sweep)."""
    parts = [] if "batch" in sweep else [f"batch {one_or_set(rows['batch'])}"]
    return ", ".join([*parts, _epochs(rows["epochs"])])


def runs_head(experiment: str, rows: pd.DataFrame, what: str = "") -> str:
    """'E1: MLP 64-16-10 on digits8 (64 train / 360 test), batch 16, 1 epoch[, what]'."""
    head = f"{experiment}: {model_description(rows)} on {data_description(rows)}, {training_description(rows)}"
    return f"{head}, {what}" if what else head
