"""Summary tables written twice: as CSV (raw values, for machines) and as Markdown (formatted, for the README).

Formatting rules of the Markdown (the CSV keeps the raw numbers):
  * a column whose name ends with ``accuracy`` holds fractions in [0, 1] and is shown as a percentage with
    two decimals (0.9793 -> ``97.93 %``);
  * a time column (name ends with ``_s``, ``_ms`` or ``_us``, or contains ``time``; rates such as
    ``samples_per_s`` are not times) is shown with three significant digits and never in scientific
    notation (0.01234 -> ``0.0123``, 2.254 -> ``2.25``, 298.6 -> ``299``, 29678.4 -> ``29678``);
  * other floats get at most four significant digits the same way, trailing zeros dropped (132.7, 0.0045, 1);
    integers, and whole-number floats in a column of whole numbers, are printed as integers;
  * a learning-rate column (``lr``) as in run names (gpunn.runspec.format_lr: 0.01, 1e-5);
  * text as is (``|`` escaped); missing values (None / NaN) as ``-``.
``formats`` overrides any column with a format string (``"{:.1f}x"``) or a callable; ``headers`` relabels columns
in the Markdown only (the CSV keeps the column names, the formats follow them).

``read_table`` reads any CSV input of a report (per-epoch metrics, summaries, timings) with one-line errors;
``ordered_variants`` gives the order in which every table and figure lists the training variants, ``run_labels``
the name of each run in a figure (its variant, and its loss reduction where runs differ in it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError, remake_hint
from gpunn.io import write_csv, write_text
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.runspec import format_lr

MISSING = "-"
_TIME_SUFFIXES = ("_s", "_ms", "_us")
# Baselines first, then the GPU variants from the plainest to the most optimised (the MLP's and the CNN's
# interleaved, so that each experiment lists its own in that order); unknown names follow, sorted.
KNOWN_VARIANTS = ("cpu-serial", "cpu-numpy", "gpu-naive", "gpu-tiled", "gpu-optimized", "gpu-fused", "gpu-im2col",
                  "gpu-graph", "gpu-tf32", "gpu-bf16")


def variant_rank(variant: str) -> int:
    """Position of a known variant in KNOWN_VARIANTS; every unknown one ranks after them."""
    return KNOWN_VARIANTS.index(variant) if variant in KNOWN_VARIANTS else len(KNOWN_VARIANTS)


def ordered_variants(names) -> list[str]:
    """The distinct variant names among `names` in report order (KNOWN_VARIANTS, then the rest by name)."""
    return sorted({str(n) for n in names}, key=lambda v: (variant_rank(v), v))


def run_labels(frame: pd.DataFrame) -> pd.Series:
    """Each row's name in a figure: its variant, and its loss reduction in brackets ('cpu-numpy (sum)') when the
    rows hold a reduction other than the batch mean (E1 trains every variant with both); rows without a
    `reduction` column (tables written before it) are the mean's."""
    variants = frame["variant"].astype(str)
    if "reduction" not in frame:
        return variants
    reductions = frame["reduction"].fillna(DEFAULT_REDUCTION).astype(str)
    if (reductions == DEFAULT_REDUCTION).all():
        return variants
    return variants + " (" + reductions + ")"


def read_table(path, columns: Sequence[str], what: str) -> pd.DataFrame:
    """Read the CSV `path`, which must exist, parse, have `columns` and at least one row."""
    path = Path(path)
    if not path.is_file():
        raise GpunnError(f"{path}: {what} not found; run the step that writes it first or fix the path")
    try:
        frame = pd.read_csv(path)
    except Exception as exc:
        reason = " ".join(str(exc).split())  # parser messages span lines; the error is one line
        raise GpunnError(f"{path}: cannot read {what} as CSV ({reason}); {remake_hint(path)}") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise GpunnError(f"{path}: {what} lacks column(s) {', '.join(missing)}; expected {', '.join(columns)}")
    if frame.empty:
        raise GpunnError(f"{path}: {what} has no rows; {remake_hint(path)}")
    return frame


def is_accuracy_column(name: str) -> bool:
    return str(name).lower().endswith("accuracy")


def is_lr_column(name: str) -> bool:
    return str(name).lower() in ("lr", "learning_rate")


def is_time_column(name: str) -> bool:
    name = str(name).lower()
    if "per_s" in name or "per_ms" in name:  # a rate (samples_per_s), not a time
        return False
    return name.endswith(_TIME_SUFFIXES) or "time" in name


def is_missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def format_significant(value: float, digits: int = 3) -> str:
    """`digits` significant digits without scientific notation; the integer part is never rounded away."""
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{value:.{decimals}f}"
    # rounding can carry into a new digit (9.996 -> "10.00"): drop the now superfluous decimal
    if decimals > 0 and len(text.replace("-", "").replace(".", "").lstrip("0")) > digits:
        text = f"{value:.{decimals - 1}f}"
    return text


# A Markdown table shows at most about this many columns (the CSV beside it holds every one); boolean flags that
# are False on every row say nothing there and are left out.
MARKDOWN_COLUMNS = 12
QUIET_FLAGS = ("diverged", "at_chance", "simulator")

RATIO_FLOOR = 0.001  # ratios below this print as "<0.001x": more digits say nothing a reader can use


def format_ratio(value: float) -> str:
    """A speedup or ratio: 3 significant digits and an "x" ("4.12x", "0.031x"), "<0.001x" below RATIO_FLOOR."""
    value = float(value)
    if math.isfinite(value) and 0 < value < RATIO_FLOOR:
        return f"<{RATIO_FLOOR:g}x"
    return f"{format_significant(value, 3)}x"


def format_cell(column: str, value, fmt: str | Callable | None = None, integral_column: bool = False) -> str:
    """One Markdown cell. `integral_column`: every value of the column is a whole number (ints that pandas
    turned into floats because of a missing value), so print them as integers."""
    if is_missing(value):
        return MISSING
    if fmt is not None:
        return fmt(value) if callable(fmt) else fmt.format(value)
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, Real) and is_lr_column(column):
        return format_lr(value)
    if isinstance(value, Real) and not isinstance(value, Integral) and is_accuracy_column(column):
        return f"{100.0 * float(value):.2f} %"
    if isinstance(value, Integral):
        if is_accuracy_column(column):  # 0 or 1 as an accuracy fraction
            return f"{100.0 * int(value):.2f} %"
        return str(int(value))
    if isinstance(value, Real):
        if integral_column and not is_time_column(column):
            return str(int(value))
        if is_time_column(column):
            return format_significant(value, 3)
        text = format_significant(value, 4)
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value).replace("|", "\\|").replace("\n", " ")


def _is_numeric_column(series: pd.Series) -> bool:
    values = [v for v in series if not is_missing(v)]
    return bool(values) and all(isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) for v in values)


def _is_integral_column(series: pd.Series) -> bool:
    values = [v for v in series if not is_missing(v)]
    return _is_numeric_column(series) and all(math.isfinite(float(v)) and float(v).is_integer() for v in values)


def markdown_table(frame: pd.DataFrame, formats: Mapping[str, str | Callable] | None = None,
                   headers: Mapping[str, str] | None = None) -> str:
    """A GitHub pipe table of `frame` (no index) with padded, aligned columns: numbers right, text left; each
    column headed by its name or by its label in `headers`."""
    formats, headers = dict(formats or {}), dict(headers or {})
    columns = [str(c) for c in frame.columns]
    cells = []
    for c, col in zip(columns, frame.columns):
        integral = _is_integral_column(frame[col])
        cells.append([format_cell(c, v, formats.get(c), integral) for v in frame[col].tolist()])
    header = [headers.get(c, c).replace("|", "\\|") for c in columns]
    right = [_is_numeric_column(frame[col]) for col in frame.columns]
    widths = [max([len(h), 3] + [len(v) for v in col_cells]) for h, col_cells in zip(header, cells)]

    def line(items):
        padded = [it.rjust(w) if r else it.ljust(w) for it, w, r in zip(items, widths, right)]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if r else ("-" * w) for w, r in zip(widths, right)) + " |"
    lines = [line(header), rule]
    for i in range(len(frame)):
        lines.append(line([col_cells[i] for col_cells in cells]))
    return "\n".join(lines) + "\n"


def markdown_section(title: str, frame: pd.DataFrame, formats: Mapping[str, str | Callable] | None = None,
                     headers: Mapping[str, str] | None = None, note: str | None = None, level: int = 2) -> str:
    """A Markdown heading of `level` with `title`, the pipe table of `frame` (markdown_table) and an optional note."""
    md = f"{'#' * level} {title}\n\n" + markdown_table(frame, formats, headers)
    if note:
        md += f"\n{note.strip()}\n"
    return md


def markdown_frame(frame: pd.DataFrame, shown: Sequence[str] | None = None) -> pd.DataFrame:
    """The columns of `frame` a Markdown table shows: `shown` (default all) less the QUIET_FLAGS that are False
    on every row."""
    columns = [c for c in (shown if shown is not None else frame.columns) if c in frame.columns]
    quiet = [c for c in QUIET_FLAGS if c in columns and not any(bool(v) for v in frame[c] if not is_missing(v))]
    return frame[[c for c in columns if c not in quiet]]


def left_out_line(frame: pd.DataFrame, shown: pd.DataFrame, csv_name: str) -> str | None:
    """The line under a Markdown table that names the columns only its CSV holds (None: it shows them all)."""
    left = [str(c) for c in frame.columns if c not in shown.columns]
    if not left:
        return None
    return f"Also in {csv_name}: {', '.join(left)}."


def summary_table(rows: Sequence[Mapping], out_csv, out_md, title: str, columns: Sequence[str] | None = None,
                  formats: Mapping[str, str | Callable] | None = None, note: str | None = None,
                  headers: Mapping[str, str] | None = None, shown: Sequence[str] | None = None) -> pd.DataFrame:
    """Write `rows` (one dict per row) as CSV (raw values, every column) and as Markdown (``## title``, a pipe
    table, an optional note, the line naming what only the CSV holds). `columns` picks and orders the columns
    (default: first appearance over the rows); `shown` those of the Markdown (default all, at most about
    MARKDOWN_COLUMNS), where QUIET_FLAGS false on every row are left out too; `headers` relabels them in the
    Markdown. Returns the DataFrame written."""
    rows = [dict(r) for r in rows]
    if not rows:
        raise GpunnError(f"{out_csv}: summary table '{title}' has no rows; check that its inputs were produced")
    seen: dict[str, None] = {}
    for r in rows:
        for key in r:
            seen.setdefault(str(key), None)
    if columns is None:
        columns = list(seen)
    else:
        columns = [str(c) for c in columns]
        unknown = [c for c in columns if c not in seen]
        if unknown:
            raise GpunnError(
                f"{out_csv}: summary table '{title}' asks for column(s) {', '.join(unknown)} that no row has; "
                f"the rows have {', '.join(seen)}")
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    table = markdown_frame(frame, shown)
    left_out = left_out_line(frame, table, Path(out_csv).name)
    md = markdown_section(title, table, formats, headers, "\n\n".join(n for n in (note, left_out) if n))
    write_csv(Path(out_csv), frame)
    write_text(Path(out_md), md)
    return frame
