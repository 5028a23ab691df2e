"""Report figures (matplotlib, Agg backend). Every function writes one PNG, and the same figure as a PDF beside it
(pdf_twin: for papers), atomically, and returns the PNG's path.

    loss_curves              per-epoch train / test loss of several runs, and test accuracy when present
    epoch_series             named per-epoch series on one axis with named reference points (E1: train loss of
                             the CPU and GPU runs under each loss reduction beside seed 000's)
    epoch_lines              per-epoch cumulative training time, train loss or test accuracy, one panel per group
                             of runs (E4: a dataset, or a variant of the block-size study), one line per run
    confusion_matrix_figure  heatmap of a confusion matrix with counts (gpunn.svm, and the E6 report)
    reconstruction_grid      originals above autoencoder reconstructions, columns titled by class
    sample_classifications   up to 25 test images titled "pred (true)", wrong ones in red
    epoch_time_bars          E1: time per epoch of each variant, bars on a log axis
    e2_heatmaps              E2 sweep: training time and test accuracy over hidden x batch, one panel per variant
    e2_phase_times           E2 sweep: training, forward and backward time against hidden size, one panel per
                             batch size
    batch_timing             E3: throughput (samples/s, ms per step), forward / backward split and latency against
                             batch size, one line per variant
    block_sweep              E3: kernel time against block size, one line per op, one panel per shape
    training_time_bars       E5: training time for all epochs on the full training set per variant (log bars;
                             extrapolated ones marked)
    speedup_bars             E5: speedup over cpu-numpy per full-set epoch per variant (log bars)

Variants keep one colour in every figure (their place in gpunn.report.tables.KNOWN_VARIANTS). In every figure
with several lines, each line also has its own marker and line style, drawn from the widest line and largest
hollow marker at the bottom to the thinnest on top: a GPU variant that reproduces cpu-numpy bit for bit draws
exactly over it, and would otherwise hide it. Lines that coincide (coinciding_groups) are named in their
panel's title. A table with a true `simulator` column marks those variants "(simulated)", and one with a true
`diverged` column (gpunn.report.divergence) those runs "(diverged)".
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Collection, Mapping, NamedTuple, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.ticker import LogFormatterSciNotation, NullLocator  # noqa: E402

from gpunn.errors import GpunnError  # noqa: E402
from gpunn.io import atomic_path  # noqa: E402
from gpunn.report.divergence import DIVERGED, diverged_in  # noqa: E402
from gpunn.report.tables import (  # noqa: E402
    KNOWN_VARIANTS,
    format_ratio,
    format_significant,
    ordered_variants,
    read_table,
    run_labels,
)

DPI = 120
# series closer than this (relative) draw as one line at any figure size
COINCIDE_RTOL = 1e-9
MARKERS = ("o", "s", "^", "D", "v")
LINESTYLES = ("-", "--", "-.", ":")
SIMULATED_LABEL = "(simulated)"
COINCIDE_NOTE_WIDTH = 60  # characters per line of a panel's coincidence note
MIN_RELATIVE_SPAN = 1e-3  # loss and accuracy axes never zoom into less than this fraction of their values

LOSS_COLUMNS = ("epoch", "train_loss", "test_loss", "test_accuracy", "epoch_time_s")
LOG_SPAN = 10.0  # a time axis whose values span more than this factor is drawn on a log scale
E2_COLUMNS = ("variant", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy")
E1_COLUMNS = ("variant", "time_per_epoch_s")
E3_COLUMNS = ("variant", "batch", "throughput_samples_per_s", "throughput_step_ms", "latency_ms", "forward_ms",
              "backward_ms")  # gpunn.batch_timing.COLUMN_NOTES says what each measures
BLOCK_COLUMNS = ("op", "block", "rows", "cols", "ms", "gb_per_s", "device")


# ------------------------------------------------------------------------------------------- helpers
def pdf_twin(out_png) -> Path:
    """The PDF written beside a figure's PNG: the PNG is for the report and the screen, the PDF (vector, fonts
    embedded) for papers."""
    return Path(out_png).with_suffix(".pdf")


def _save(fig, out_png) -> Path:
    """Write the figure as `out_png` and as its pdf_twin, each atomically (a failure leaves neither half-written)."""
    out_png = Path(out_png)
    try:
        with atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        with atomic_path(pdf_twin(out_png)) as tmp:
            # no creation date: the same figure gives the same bytes, so reruns are comparable
            fig.savefig(tmp, format="pdf", bbox_inches="tight", metadata={"CreationDate": None})
    finally:
        plt.close(fig)
    return out_png


def _variant_colors(variants: Sequence[str]) -> dict[str, str]:
    """A fixed colour per known variant (so cpu-serial looks the same in every figure), then the unknown ones."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    unknown = [v for v in variants if v not in KNOWN_VARIANTS]
    return {v: cycle[(KNOWN_VARIANTS.index(v) if v in KNOWN_VARIANTS else len(KNOWN_VARIANTS) + unknown.index(v))
                     % len(cycle)] for v in variants}


def _numeric(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in columns})


def _log2_ticks(ax, values) -> None:
    """Log-2 x axis labelled with exactly the swept values (batch, hidden or block sizes)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([f"{int(v)}" for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _coincide(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    if a.shape != b.shape:
        return False
    missing = np.isnan(a)
    if not np.array_equal(missing, np.isnan(b)):
        return False
    a, b = a[~missing], b[~missing]
    with np.errstate(invalid="ignore"):  # inf - inf: equal infinities are caught by a == b
        close = np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b))
    return bool(np.all((a == b) | close))


def coinciding_groups(series: Mapping[str, Sequence[float]], rtol: float = COINCIDE_RTOL) -> list[list[str]]:
    """Labels of the series that would draw over one another: same length, NaN (nothing drawn) at the same
    places and every other value within `rtol` relative of the group's first series. Only groups of two or
    more, each in the order of `series`; a series without a finite value draws nothing and joins none."""
    groups: list[tuple[np.ndarray, list[str]]] = []
    for label, values in series.items():
        arr = np.asarray(values, dtype=np.float64).ravel()
        if not np.isfinite(arr).any():
            continue
        for reference, labels in groups:
            if _coincide(reference, arr, rtol):
                labels.append(label)
                break
        else:
            groups.append((arr, [label]))
    return [labels for _, labels in groups if len(labels) > 1]


def coincide_note(groups: Sequence[Sequence[str]]) -> str:
    """'cpu-numpy, gpu-tiled and gpu-fused coincide' (groups separated by '; '); empty without groups."""
    return "; ".join(f"{', '.join(g[:-1])} and {g[-1]} coincide" for g in groups)


def _on_common_x(lines: Mapping[str, tuple]) -> dict[str, np.ndarray]:
    """Each line's y values on the sorted union of all x values (NaN where it has none), so lines over
    different x ranges compare point by point."""
    xs = sorted({float(x) for x_values, _ in lines.values() for x in np.asarray(x_values, dtype=np.float64)
                 if np.isfinite(x)})
    out = {}
    for label, (x_values, y_values) in lines.items():
        by_x = pd.Series(np.asarray(y_values, dtype=np.float64), index=np.asarray(x_values, dtype=np.float64))
        out[label] = by_x[~by_x.index.duplicated()].reindex(xs).to_numpy()
    return out


def _titled_with_coincidences(ax, title: str, lines: Mapping[str, tuple]) -> None:
    """Panel title, with the lines that coincide on it named below (wrapped to the panel's width), or 'all N
    coincide' when every line does."""
    groups = coinciding_groups(_on_common_x(lines))
    if not groups:
        ax.set_title(title)
        return
    note = f"all {len(lines)} coincide" if len(groups[0]) == len(lines) else coincide_note(groups)
    ax.set_title(f"{title}\n" + textwrap.fill(f"({note})", width=COINCIDE_NOTE_WIDTH, break_on_hyphens=False),
                 fontsize="medium")


LOSS_LOG_DECADES = 1.0  # loss panels spanning more than this many decades get a log y axis


def _readable_y_span(ax, values, rel: float = MIN_RELATIVE_SPAN) -> None:
    """Keep a linear y axis at least `rel` of its values wide: float rounding between variants (1e-8 relative)
    would otherwise fill the panel, labelled '1e-8+2.304391', as if it were a difference."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    ax.ticklabel_format(axis="y", useOffset=False)
    if finite.size == 0:
        return
    lo, hi = float(finite.min()), float(finite.max())
    half = 0.5 * rel * max(abs(lo + hi) / 2, 1e-12)
    if hi - lo < 2 * half:
        center = (lo + hi) / 2
        ax.set_ylim(center - half, center + half)


def loss_axis_scale(values, decades: float = LOSS_LOG_DECADES) -> str:
    """'log' for losses spanning more than `decades` decades (all positive), else 'linear'. A short run's first
    loss (E5's cpu-numpy epoch over 1 000 images: 0.33) would otherwise flatten 20 epochs of 0.04 -> 0.009 into
    one line along the bottom."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0 or finite.min() <= 0:
        return "linear"
    return "log" if np.log10(finite.max() / finite.min()) > decades else "linear"


def series_styles(n: int) -> list[dict]:
    """Plot keyword arguments of `n` series: its own marker and line style each, line width and hollow marker
    size shrinking from the first (drawn at the bottom) to the last (on top), so that series drawn exactly
    over one another all stay visible."""
    styles = []
    for i in range(n):
        frac = i / max(n - 1, 1)
        styles.append({"marker": MARKERS[i % len(MARKERS)], "linestyle": LINESTYLES[i % len(LINESTYLES)],
                       "linewidth": 3.0 - 1.9 * frac, "markersize": 10.0 - 5.5 * frac, "markerfacecolor": "none",
                       "markeredgewidth": 1.3, "zorder": 2 + i})
    return styles


def simulated_variants(frame: pd.DataFrame) -> set[str]:
    """Variants with a row whose `simulator` column is true (none when the table has no such column)."""
    if "simulator" not in frame:
        return set()
    flags = frame["simulator"].map(lambda v: str(v).strip().lower() in ("true", "1"))
    return {str(v) for v in frame.loc[flags, "variant"]}


def _variant_label(label: str, simulated: set[str], sep: str = " ", variant: str | None = None,
                   diverged: Collection[str] = ()) -> str:
    """`label` marked as simulated when its variant (the label itself unless given) ran under the simulator, and
    as diverged when the label is in `diverged`."""
    marks = [SIMULATED_LABEL] if (label if variant is None else variant) in simulated else []
    marks += [f"({DIVERGED})"] if label in diverged else []
    return sep.join([label, *marks])


def _as_images(images, what: str) -> np.ndarray:
    """(N, C, H, W) or (N, H, W) uint8 / float -> (N, H, W, 3) or (N, H, W) float in [0, 1] for imshow."""
    arr = np.asarray(images)
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[1] not in (1, 3):
        raise GpunnError(f"{what}: images must have shape (N, C, H, W) with C = 1 or 3, got {arr.shape}")
    if arr.shape[0] == 0:
        raise GpunnError(f"{what}: no images to show")
    if arr.dtype == np.uint8:
        out = arr.astype(np.float32) / 255.0
    else:
        out = arr.astype(np.float32)
        if not np.isfinite(out).all():
            raise GpunnError(f"{what}: images contain NaN or inf")
        lo, hi = float(out.min()), float(out.max())
        if lo < -0.25 or hi > 1.25:
            # standardised inputs (not in [0, 1]): stretch each image to [0, 1] for display
            flat = out.reshape(out.shape[0], -1)
            mins = flat.min(axis=1)[:, None, None, None]
            spans = np.maximum(flat.max(axis=1) - flat.min(axis=1), 1e-12)[:, None, None, None]
            out = (out - mins) / spans
        out = np.clip(out, 0.0, 1.0)  # reconstructions may overshoot a little
    if out.shape[1] == 1:
        return out[:, 0]
    return out.transpose(0, 2, 3, 1)


def _show(ax, image) -> None:
    if image.ndim == 2:
        ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(image, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


# ------------------------------------------------------------------------------------------- figures
def loss_curves(metrics_csvs: Mapping[str, str | Path], out_png, title: str, quantity: str = "loss",
                legend: Mapping[str, str] | None = None, variants: Mapping[str, str] | None = None) -> Path:
    """Train loss, test loss and (when any run has accuracies; the autoencoder's are empty) test accuracy per
    epoch, one panel each and one line per labelled run. Train and test get their own panels because every
    run needs its own line style: runs that reproduce one another exactly would otherwise be hidden.
    `quantity` names the loss on the axes and panel titles ("MSE"); `legend` gives a label's text in the legend
    where it should say more than the label (a variant's training-set size); colours follow the labels, or the
    variant each label's run is of where `variants` says so (E1's 'cpu-numpy (sum)' in cpu-numpy's colour)."""
    if not metrics_csvs:
        raise GpunnError(f"{out_png}: loss_curves needs at least one metrics CSV")
    runs = {label: read_table(path, LOSS_COLUMNS, "per-epoch metrics CSV") for label, path in metrics_csvs.items()}
    has_acc = any(pd.to_numeric(f["test_accuracy"], errors="coerce").notna().any() for f in runs.values())
    panels = [("train_loss", quantity, f"train {quantity} per epoch", 1.0),
              ("test_loss", quantity, f"test {quantity} per epoch", 1.0)]
    if has_acc:
        panels.append(("test_accuracy", "test accuracy (%)", "test accuracy per epoch", 100.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 0.4, 4.6), squeeze=False,
                             layout="constrained")
    variant_of = {label: (variants or {}).get(label, label) for label in runs}
    palette = _variant_colors(list(dict.fromkeys(variant_of.values())))
    colors = {label: palette[variant_of[label]] for label in runs}
    styles = dict(zip(runs, series_styles(len(runs))))
    handles = {}
    # train and test loss share one scale: the same quantity should not read linear in one panel, log in the next
    loss_scale = loss_axis_scale(np.concatenate([pd.to_numeric(f[c], errors="coerce").to_numpy(np.float64)
                                                 for f in runs.values() for c in ("train_loss", "test_loss")]))
    for ax, (column, ylabel, panel_title, scale) in zip(axes[0], panels):
        lines = {}
        for label, frame in runs.items():
            epoch = pd.to_numeric(frame["epoch"], errors="coerce")
            values = scale * pd.to_numeric(frame[column], errors="coerce")
            if values.notna().any():
                (handles[label],) = ax.plot(epoch, values, color=colors[label], label=label, **styles[label])
                lines[label] = (epoch, values)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        _titled_with_coincidences(ax, panel_title, lines)
        panel_values = np.concatenate([np.asarray(y, dtype=np.float64) for _, y in lines.values()] or [[]])
        if column != "test_accuracy" and loss_scale == "log":
            ax.set_yscale("log")
        else:
            _readable_y_span(ax, panel_values)
        ax.grid(alpha=0.3)
        _epoch_ticks(ax, lines)
    # one legend for all panels, below them: inside a panel it would cover the curves
    legend = dict(legend or {})
    fig.legend(handles.values(), [legend.get(label, label) for label in handles], loc="outside lower center",
               ncols=min(len(handles), 4 if not legend else 2), fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


REFERENCE_MARKERS = ("*", "P", "X", "h")  # reference points: large, filled, unlike any series' marker


def epoch_series(series: Mapping[str, tuple], out_png, title: str, ylabel: str,
                 references: Mapping[str, tuple] | None = None, variants: Mapping[str, str] | None = None) -> Path:
    """Per-epoch values of several named series ({label: (epochs, values)}) as lines on one axis, and named
    reference points ({label: (epochs, values)}: a paper's numbers) as large filled markers in black over them,
    so that our curves and the paper's points compare at a glance. The y axis is logarithmic where all the values
    span more than a decade (loss_axis_scale). Colours follow each label's variant where `variants` says so (E1's
    'cpu-numpy (sum)' in cpu-numpy's colour), else the label."""
    if not series:
        raise GpunnError(f"{out_png}: epoch_series needs at least one series")
    references = dict(references or {})
    variant_of = {label: (variants or {}).get(label, label) for label in series}
    palette = _variant_colors(list(dict.fromkeys(variant_of.values())))
    styles = dict(zip(series, series_styles(len(series))))
    fig, ax = plt.subplots(figsize=(7.2, 5.0), layout="constrained")
    lines, drawn = {}, []
    for label, (epochs, values) in series.items():
        epochs, values = np.asarray(epochs, dtype=np.float64), np.asarray(values, dtype=np.float64)
        ax.plot(epochs, values, color=palette[variant_of[label]], label=label, **styles[label])
        lines[label] = (epochs, values)
        drawn.append(values)
    for i, (label, (epochs, values)) in enumerate(references.items()):
        values = np.asarray(values, dtype=np.float64)
        ax.plot(epochs, values, REFERENCE_MARKERS[i % len(REFERENCE_MARKERS)], color="black", markersize=15,
                markeredgecolor="white", markeredgewidth=1.0, linestyle="none", label=label,
                zorder=3 + len(series))
        drawn.append(values)
    values = np.concatenate(drawn)
    if loss_axis_scale(values) == "log":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PlainLogFormatter())
        ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))
        ylabel = f"{ylabel}, log scale"
    else:
        _readable_y_span(ax, values)
    groups = coinciding_groups(_on_common_x(lines))
    if groups:  # name the series drawn over one another, as every figure does
        ax.set_title(textwrap.fill(f"({coincide_note(groups)})", width=COINCIDE_NOTE_WIDTH, break_on_hyphens=False),
                     fontsize="medium")
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    _epoch_ticks(ax, {**lines, **{label: (np.asarray(e, dtype=np.float64), v) for label, (e, v)
                                  in references.items()}})
    # below the axis, as in loss_curves: inside it would cover the curves
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


def _epoch_ticks(ax, lines: Mapping[str, tuple]) -> None:
    """An epoch axis: with few epochs exactly those ticks (one epoch would get 0.96 ... 1.04), else integers."""
    epochs = sorted({float(e) for x, _ in lines.values() for e in x if np.isfinite(e)})
    if 0 < len(epochs) <= 12:
        ax.set_xticks(epochs)
        ax.set_xticklabels([f"{e:g}" for e in epochs])
    else:
        ax.xaxis.get_major_locator().set_params(integer=True)


class EpochMeasure(NamedTuple):
    """What epoch_lines draws from a metrics.csv column: its axis label and panel title, whether it is a time
    summed over the epochs so far (drawn on a log axis when it spans more than LOG_SPAN), its display factor."""

    column: str
    axis: str
    title: str
    cumulative_time: bool = False
    scale: float = 1.0


EPOCH_MEASURES = {
    "cumulative_time": EpochMeasure("epoch_time_s", "cumulative training time (s)", "cumulative training time",
                                    cumulative_time=True),
    "train_loss": EpochMeasure("train_loss", "average train loss", "average train loss per epoch"),
    "test_accuracy": EpochMeasure("test_accuracy", "test accuracy (%)", "test accuracy per epoch", scale=100.0),
}


class _PlainLogFormatter(LogFormatterSciNotation):
    """Labels the ticks matplotlib labels on a log axis, as plain numbers: '60', '0.5', not '6 x 10^1'."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def _ordinal_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """Colours along a sequential map, in the order of `labels` (block sizes, small to large)."""
    cmap = plt.get_cmap("viridis")
    return {label: cmap(0.9 * i / max(len(labels) - 1, 1)) for i, label in enumerate(labels)}


def epoch_lines(groups: Mapping[str, Mapping[str, str | Path]], measures: Sequence[str], out_png, title: str,
                legend_title: str | None = None, simulated: Collection[str] = (), ordinal: bool = False,
                diverged: Collection[str] = ()) -> Path:
    """Per-epoch lines of several runs against the epoch: one column of panels per group of `groups` ({panel
    name: {line label: metrics.csv}}; E4: a dataset, or a variant of the block-size study) and one row per
    measure of EPOCH_MEASURES ('cumulative_time': the training time up to each epoch, seed 001's Figures 1
    and 3; 'train_loss': the epoch's average train loss, its Figures 2 and 4; 'test_accuracy'). A line keeps
    its colour and style in every panel: variants their fixed colours, or with `ordinal` ordered settings
    (block sizes) a sequential colour map. Panels of a row share their y axis. Group names and line labels
    in `simulated` are marked so, and line labels in `diverged` (runs that diverged) too."""
    if not groups or not any(groups.values()):
        raise GpunnError(f"{out_png}: epoch_lines needs at least one metrics CSV")
    unknown = [m for m in measures if m not in EPOCH_MEASURES]
    if unknown or not measures:
        raise GpunnError(f"{out_png}: epoch_lines draws {', '.join(EPOCH_MEASURES)}, "
                         f"not {', '.join(unknown) or 'nothing'}")
    runs = {(group, label): read_table(path, LOSS_COLUMNS, "per-epoch metrics CSV")
            for group, lines in groups.items() for label, path in lines.items()}
    labels = list(dict.fromkeys(label for _, label in runs))
    colors = _ordinal_colors(labels) if ordinal else _variant_colors(labels)
    styles = dict(zip(labels, series_styles(len(labels))))

    def marked(name):
        return f"{name} {SIMULATED_LABEL}" if name in simulated else str(name)

    def legend_label(label):
        return f"{marked(label)} ({DIVERGED})" if str(label) in diverged else marked(label)

    fig, axes = plt.subplots(len(measures), len(groups), figsize=(4.8 * len(groups) + 0.4, 3.9 * len(measures) + 0.9),
                             squeeze=False, sharey="row", layout="constrained")
    handles = {}
    for row, measure in enumerate(EPOCH_MEASURES[m] for m in measures):
        drawn = []
        for ax, (group, lines_of) in zip(axes[row], groups.items()):
            lines = {}
            for label in lines_of:
                frame = runs[(group, label)]
                epoch = pd.to_numeric(frame["epoch"], errors="coerce")
                values = measure.scale * pd.to_numeric(frame[measure.column], errors="coerce")
                if measure.cumulative_time:
                    values = values.cumsum()
                if values.notna().any():
                    (handles[label],) = ax.plot(epoch, values, color=colors[label], label=label, **styles[label])
                    lines[label] = (epoch, values)
                    drawn.append(values.to_numpy(dtype=np.float64))
            _titled_with_coincidences(ax, f"{marked(group)}: {measure.title}", lines)
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3, which="both")
            _epoch_ticks(ax, lines)
        axes[row, 0].set_ylabel(measure.axis)
        values = np.concatenate(drawn or [[]])
        positive = values[np.isfinite(values) & (values > 0)]
        if measure.cumulative_time and positive.size and positive.max() > LOG_SPAN * positive.min():
            axes[row, 0].set_yscale("log")  # the row shares its y axis
            axes[row, 0].yaxis.set_major_formatter(_PlainLogFormatter())
            axes[row, 0].yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))
            axes[row, 0].set_ylabel(f"{measure.axis}, log scale")
        else:
            _readable_y_span(axes[row, 0], values)
    # one legend for all panels, below them: inside a panel it would cover the lines
    fig.legend(handles.values(), [legend_label(label) for label in handles], loc="outside lower center",
               ncols=min(len(handles), 5), fontsize="small", title=legend_title, title_fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


def confusion_matrix_figure(matrix, class_names: Sequence[str], out_png, title: str) -> Path:
    """Heatmap of a confusion matrix (rows: true class, columns: predicted), coloured by the fraction of
    each true class and annotated with the counts."""
    m = np.asarray(matrix)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise GpunnError(f"{out_png}: confusion matrix must be square, got shape {m.shape}")
    names = [str(n) for n in class_names]
    if len(names) != m.shape[0]:
        raise GpunnError(f"{out_png}: {len(names)} class names for a {m.shape[0]}x{m.shape[0]} confusion matrix")
    k = m.shape[0]
    rows = m.sum(axis=1, keepdims=True).astype(np.float64)
    frac = np.divide(m, rows, out=np.zeros(m.shape, dtype=np.float64), where=rows > 0)
    size = max(4.5, 0.6 * k + 2.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    im = ax.imshow(frac, cmap="Blues", vmin=0.0, vmax=1.0)
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cbar.set_label("fraction of the true class")
    fontsize = 9 if k <= 12 else 7 if k <= 20 else 5
    for i in range(k):
        for j in range(k):
            count = m[i, j]
            text = f"{int(count)}" if float(count).is_integer() else f"{count:.2g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize,
                    color="white" if frac[i, j] > 0.5 else "black")
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yticklabels(names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title)
    fig.tight_layout()
    return _save(fig, out_png)


def reconstruction_grid(originals, reconstructions, out_png, title: str, max_columns: int = 10,
                        column_titles: Sequence[str] | None = None) -> Path:
    """Originals (top row) above their reconstructions (bottom row), up to ``max_columns`` images; each column
    headed by its entry of `column_titles` (the image's class) when given."""
    orig = _as_images(originals, f"{out_png} (originals)")
    recon = _as_images(reconstructions, f"{out_png} (reconstructions)")
    if orig.shape != recon.shape:
        raise GpunnError(
            f"{out_png}: originals {orig.shape} and reconstructions {recon.shape} must have the same shape")
    if column_titles is not None and len(column_titles) != orig.shape[0]:
        raise GpunnError(f"{out_png}: {len(column_titles)} column titles for {orig.shape[0]} images")
    n = min(orig.shape[0], max_columns)
    fig, axes = plt.subplots(2, n, figsize=(1.3 * n + 0.8, 3.2 + 0.3 * (column_titles is not None)),
                             squeeze=False)
    for j in range(n):
        _show(axes[0, j], orig[j])
        _show(axes[1, j], recon[j])
        if column_titles is not None:
            axes[0, j].set_title(str(column_titles[j]), fontsize=9)
    axes[0, 0].set_ylabel("original")
    axes[1, 0].set_ylabel("reconstruction")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def sample_classifications(images, labels, predictions, class_names: Sequence[str] | None, out_png,
                           title: str, max_images: int = 25) -> Path:
    """A square grid of up to 25 images titled "pred (true)"; misclassified ones are titled in red."""
    imgs = _as_images(images, str(out_png))
    labels = np.asarray(labels).reshape(-1)
    predictions = np.asarray(predictions).reshape(-1)
    if not (labels.shape[0] == predictions.shape[0] == imgs.shape[0]):
        raise GpunnError(
            f"{out_png}: {imgs.shape[0]} images, {labels.shape[0]} labels and {predictions.shape[0]} predictions "
            "must match")

    def name(c) -> str:
        c = int(c)
        if class_names is not None and 0 <= c < len(class_names):
            return str(class_names[c])
        return str(c)

    n = min(imgs.shape[0], max_images)
    side = math.ceil(math.sqrt(n))
    nrows = math.ceil(n / side)
    fig, axes = plt.subplots(nrows, side, figsize=(1.9 * side, 2.0 * nrows + 0.4), squeeze=False)
    wrong = 0
    for idx, ax in enumerate(axes.ravel()):
        if idx >= n:
            ax.axis("off")
            continue
        _show(ax, imgs[idx])
        ok = int(labels[idx]) == int(predictions[idx])
        wrong += not ok
        ax.set_title(f"{name(predictions[idx])} ({name(labels[idx])})", fontsize=8,
                     color="black" if ok else "red")
    fig.suptitle(f"{title}\npredicted (true); {wrong} of {n} wrong, in red", fontsize=10)
    fig.tight_layout()
    return _save(fig, out_png)


def _annotate(ax, values, fmt, dark) -> None:
    """Write fmt(value) in every finite cell; white text where `dark` (the cell colour is dark)."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                ax.text(j, i, fmt(values[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if dark[i, j] else "black")


def e2_heatmaps(table_csv, out_png, title: str = "E2: MLP hidden size x batch size") -> Path:
    """One column of panels per variant: training time (top row, one shared log colour scale, annotated in
    seconds) and test accuracy (bottom row, annotated in %) over hidden size (rows) x batch size (columns)."""
    frame = read_table(table_csv, E2_COLUMNS, "E2 sweep table")
    variants = ordered_variants(frame["variant"])
    frame = frame.assign(variant=frame["variant"].astype(str))
    simulated, diverged = simulated_variants(frame), diverged_in(frame)
    hiddens = sorted(pd.unique(frame["hidden"]))
    batches = sorted(pd.unique(frame["batch"]))
    times = pd.to_numeric(frame["train_time_s"], errors="coerce")
    accs = pd.to_numeric(frame["test_accuracy"], errors="coerce")
    has_acc = accs.notna().any()
    positive = times[times > 0]
    if positive.empty:
        raise GpunnError(f"{table_csv}: E2 sweep table has no positive train_time_s")
    norm = LogNorm(vmin=float(positive.min()), vmax=max(float(positive.max()), float(positive.min()) * 1.01))
    acc_lo = float(accs.min()) * 100 if has_acc else 0.0
    acc_hi = float(accs.max()) * 100 if has_acc else 100.0
    if acc_hi - acc_lo < 0.5:
        acc_lo, acc_hi = acc_lo - 0.25, acc_hi + 0.25

    nv = len(variants)
    nrows = 2 if has_acc else 1
    fig, axes = plt.subplots(nrows, nv, figsize=(3.2 * nv + 1.5, 3.1 * nrows + 0.6), squeeze=False,
                             layout="constrained")

    def grid(sub, column):
        g = np.full((len(hiddens), len(batches)), np.nan)
        for _, r in sub.iterrows():
            g[hiddens.index(r["hidden"]), batches.index(r["batch"])] = r[column]
        return g

    im_t = im_a = None
    for k, variant in enumerate(variants):
        sub = frame[frame["variant"] == variant].copy()
        sub["train_time_s"] = pd.to_numeric(sub["train_time_s"], errors="coerce")
        sub["test_accuracy"] = pd.to_numeric(sub["test_accuracy"], errors="coerce") * 100
        t = grid(sub, "train_time_s")
        ax = axes[0, k]
        t = np.where(t > 0, t, np.nan)
        im_t = ax.imshow(np.ma.masked_invalid(t), cmap="viridis", norm=norm, aspect="auto")
        # viridis is dark at the low end
        _annotate(ax, t, lambda v: f"{v:.3g} s", np.ma.filled(norm(np.nan_to_num(t, nan=norm.vmax)), 1.0) < 0.5)
        ax.set_title(f"{_variant_label(variant, simulated, diverged=diverged)}: training time")
        if has_acc:
            a = grid(sub, "test_accuracy")
            ax2 = axes[1, k]
            im_a = ax2.imshow(np.ma.masked_invalid(a), cmap="magma", vmin=acc_lo, vmax=acc_hi, aspect="auto")
            # magma is dark at the low end
            _annotate(ax2, a, lambda v: f"{v:.2f}%", np.nan_to_num((a - acc_lo) / (acc_hi - acc_lo), nan=1.0) < 0.5)
            ax2.set_title(f"{_variant_label(variant, simulated, diverged=diverged)}: test accuracy")
        for ax_ in axes[:, k]:
            ax_.set_xticks(range(len(batches)))
            ax_.set_xticklabels([str(b) for b in batches])
            ax_.set_yticks(range(len(hiddens)))
            ax_.set_yticklabels([str(h) for h in hiddens])
            ax_.set_xlabel("batch size")
            if k == 0:
                ax_.set_ylabel("hidden units")
    fig.colorbar(im_t, ax=list(axes[0, :]), fraction=0.05, pad=0.02).set_label("training time (s, log scale)")
    if has_acc:
        fig.colorbar(im_a, ax=list(axes[1, :]), fraction=0.05, pad=0.02).set_label("test accuracy (%)")
    fig.suptitle(title)
    return _save(fig, out_png)


def epoch_time_bars(table_csv, out_png, title: str = "E1: time per epoch per variant") -> Path:
    """Mean time per training epoch of each variant (and, where the table has runs of more than the batch-mean
    loss reduction, of each variant and reduction: tables.run_labels) as a bar on a log axis, annotated in seconds
    and, where the table has it, with the speedup over cpu-serial; simulated variants' bars are hatched and
    labelled so."""
    frame = read_table(table_csv, E1_COLUMNS, "E1 summary table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), ["time_per_epoch_s"])
    frame = frame.assign(label=run_labels(frame))
    rank = {v: i for i, v in enumerate(ordered_variants(frame["variant"]))}
    frame = frame.sort_values("variant", key=lambda col: col.map(rank), kind="stable")  # reductions as listed
    rows = [frame[frame["label"] == label].iloc[0] for label in dict.fromkeys(frame["label"])]
    variants = [r["variant"] for r in rows]
    times = np.array([r["time_per_epoch_s"] for r in rows], dtype=np.float64)
    if not (times > 0).any():
        raise GpunnError(f"{table_csv}: E1 summary table has no positive time_per_epoch_s")
    colors = _variant_colors(list(dict.fromkeys(variants)))
    simulated = simulated_variants(frame)
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 3.0, 4.2))
    positions = np.arange(len(rows))
    ax.bar(positions, np.where(times > 0, times, np.nan), color=[colors[v] for v in variants],
           hatch=["//" if v in simulated else None for v in variants], edgecolor="white")
    for x, row, t in zip(positions, rows, times):
        if not t > 0:
            continue
        label = f"{format_significant(t, 3)} s"
        speedup = row.get("speedup_vs_cpu_serial", np.nan)
        if row["variant"] != "cpu-serial" and pd.notna(speedup):
            label += f"\n{format_ratio(speedup)}"
        ax.annotate(label, (x, t), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.margins(y=0.25)  # room above the tallest bar for its label
    ax.set_xticks(positions)
    diverged = diverged_in(frame, "label")
    ax.set_xticklabels([_variant_label(r["label"], simulated, "\n", r["variant"], diverged) for r in rows],
                       rotation=20, ha="right")
    ax.set_ylabel("time per epoch (s, log scale)")
    ax.set_title("speedup over cpu-serial under each bar's time" if "speedup_vs_cpu_serial" in frame else "",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


E5_COLUMNS = ("variant", "full_train_time_s", "full_set_extrapolated", "speedup_vs_cpu_numpy")
EXTRAPOLATED_HATCH = "xx"
SIMULATED_HATCH = "//"


def _flags(values) -> list[bool]:
    """A boolean column read back from a CSV (True / 'True' / 1)."""
    return [str(v).strip().lower() in ("true", "1") for v in values]


def _count(n: int) -> str:
    """50000 -> '50 000', as titles write sample counts."""
    return f"{int(n):,}".replace(",", " ")


def _duration(seconds: float) -> str:
    """'593560 s (165 h)', '2359 s (39.3 min)', '12.0 s': seconds, and hours or minutes where they read better."""
    text = f"{format_significant(seconds, 3)} s"
    if seconds >= 2 * 3600:
        return f"{text} ({format_significant(seconds / 3600, 3)} h)"
    if seconds >= 120:
        return f"{text} ({format_significant(seconds / 60, 3)} min)"
    return text


def _variant_bars(ax, frame: pd.DataFrame, column: str, label, flag: str = "full_set_extrapolated") -> np.ndarray:
    """One bar per variant of `frame` (report order) of `column` on a log axis, annotated with label(row);
    extrapolated bars (column `flag`) cross-hatched and named so under the axis, simulated ones hatched. Returns
    the values."""
    rows = [frame[frame["variant"] == v].iloc[0] for v in ordered_variants(frame["variant"])]
    variants = [str(r["variant"]) for r in rows]
    values = np.array([r[column] for r in rows], dtype=np.float64)
    extrapolated = dict(zip(variants, _flags(r[flag] for r in rows)))
    simulated = simulated_variants(frame)
    colors = _variant_colors(variants)
    positions = np.arange(len(variants))
    shown = np.where(values > 0, values, np.nan)
    ax.bar(positions, shown, color=[colors[v] for v in variants], edgecolor="white",
           hatch=[EXTRAPOLATED_HATCH if extrapolated[v] else SIMULATED_HATCH if v in simulated else None
                  for v in variants])
    for x, row, value in zip(positions, rows, values):
        if value > 0:
            ax.annotate(label(row), (x, value), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_PlainLogFormatter())
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))
    ax.margins(y=0.3)  # room above the tallest bar for its label
    ax.set_xticks(positions)
    diverged = diverged_in(frame)
    ax.set_xticklabels([_variant_label(v, simulated, "\n", diverged=diverged)
                        + ("\n(extrapolated)" if extrapolated[v] else "") for v in variants], rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3, which="both")
    return values


def training_time_bars(table_csv, out_png, title: str, full_train_size: int = 50000) -> Path:
    """E5 (seed 004's section 3.2 'total training time'): each variant's training time for all its epochs over
    `full_train_size` images as a bar on a log axis, annotated in seconds (and hours or minutes); a bar
    extrapolated from a smaller training set or from fewer epochs is cross-hatched and labelled 'extrapolated'."""
    frame = read_table(table_csv, E5_COLUMNS, "E5 summary table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), ["full_train_time_s"])
    if not (frame["full_train_time_s"] > 0).any():
        raise GpunnError(f"{table_csv}: E5 summary table has no positive full_train_time_s")
    n = frame["variant"].nunique()
    fig, ax = plt.subplots(figsize=(1.4 * n + 3.4, 4.6))
    # the training time is extrapolated from fewer epochs too (summary tables from before that have no such column)
    flag = "train_time_extrapolated" if "train_time_extrapolated" in frame else "full_set_extrapolated"
    _variant_bars(ax, frame, "full_train_time_s",
                  lambda row: _duration(row["full_train_time_s"]) + ("\nextrapolated" if _flags([row[flag]])[0] else ""),
                  flag)
    ax.set_ylabel(f"training time, all epochs on {_count(full_train_size)} images\n(s, log scale)")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def speedup_bars(table_csv, out_png, title: str, full_train_size: int = 50000) -> Path:
    """E5 (seed 004's section 3.2 'cumulative speedup'): each variant's speedup over cpu-numpy per epoch on
    `full_train_size` images as a bar on a log axis, annotated '251x', with cpu-numpy's 1x as a dashed line;
    without a cpu-numpy run the panel says so."""
    frame = read_table(table_csv, E5_COLUMNS, "E5 summary table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), ["speedup_vs_cpu_numpy"])
    n = frame["variant"].nunique()
    fig, ax = plt.subplots(figsize=(1.4 * n + 3.4, 4.6))
    if (frame["speedup_vs_cpu_numpy"] > 0).any():
        _variant_bars(ax, frame, "speedup_vs_cpu_numpy",
                      lambda row: format_ratio(row['speedup_vs_cpu_numpy']))
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0, zorder=0)
        ax.set_ylabel(f"speedup over cpu-numpy per epoch\nof {_count(full_train_size)} images (log scale)")
    else:
        ax.text(0.5, 0.5, "no cpu-numpy run: no speedup over it to show", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def e2_phase_times(table_csv, out_png,
                   title: str = "E2: training, forward and backward time against hidden size") -> Path:
    """Training time (top row: seed 002's figure, training time against hidden size per batch size and variant),
    then its forward and backward parts (the rows below), each summed over training, against hidden size; one
    column of panels per batch size and one line per variant. Log axes shared by all panels, so batch sizes and
    phases compare directly."""
    frame = read_table(table_csv, E2_COLUMNS, "E2 sweep table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)),
                     ["hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s"])
    variants = ordered_variants(frame["variant"])
    colors = _variant_colors(variants)
    styles = dict(zip(variants, series_styles(len(variants))))
    simulated = simulated_variants(frame)
    hiddens = sorted(frame["hidden"].dropna().unique())
    batches = sorted(frame["batch"].dropna().unique())
    phases = (("train_time_s", "training", "training time (s)"),
              ("forward_time_s", "forward", "forward time over training (s)"),
              ("backward_time_s", "backward", "backward time over training (s)"))
    fig, axes = plt.subplots(len(phases), len(batches), figsize=(4.0 * len(batches) + 0.8, 3.8 * len(phases)),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    handles = {}
    for row, (column, phase, ylabel) in enumerate(phases):
        for k, batch in enumerate(batches):
            ax = axes[row, k]
            lines = {}
            for variant in variants:
                sub = frame[(frame["variant"] == variant) & (frame["batch"] == batch)].sort_values("hidden")
                seconds = sub[column].where(sub[column] > 0)
                (handles[variant],) = ax.plot(sub["hidden"], seconds, color=colors[variant], **styles[variant])
                lines[variant] = (sub["hidden"], seconds)
            ax.set_yscale("log")
            _log2_ticks(ax, hiddens)
            _titled_with_coincidences(ax, f"{phase}, batch {int(batch)}", lines)
            ax.grid(alpha=0.3, which="both")
            if row == len(phases) - 1:
                ax.set_xlabel("hidden units")
            if k == 0:
                ax.set_ylabel(ylabel)
    fig.legend(handles.values(), [_variant_label(v, simulated, diverged=diverged_in(frame)) for v in handles],
               loc="outside lower center", ncols=min(len(handles), 4), fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


def _clock_note(frame: pd.DataFrame) -> str:
    """What timed the forward / backward split of the variants drawn, from E3's `clock` column, as a second title
    line: (CUDA events), (host clock), or (CUDA events; host clock: the variants it timed); '' without the column."""
    from gpunn.batch_timing import CLOCK_EVENTS

    if "clock" not in frame:
        return ""
    host = ordered_variants(frame.loc[frame["clock"].astype(str) != CLOCK_EVENTS, "variant"])
    if not host:
        return "\n(CUDA events)"
    if len(host) == frame["variant"].nunique():
        return "\n(host clock)"
    return f"\n(CUDA events; host clock: {', '.join(host)})"


def batch_timing(table_csv, out_png, title: str = "E3: MLP training step against batch size") -> Path:
    """Against batch size, one line per variant, log axes (CPU baselines and GPU variants differ by orders of
    magnitude): throughput as samples/s and as ms per step, latency, and the forward and backward time per step."""
    frame = read_table(table_csv, E3_COLUMNS, "E3 batch timing table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), E3_COLUMNS[1:])
    variants = ordered_variants(frame["variant"])
    colors = _variant_colors(variants)
    styles = dict(zip(variants, series_styles(len(variants))))
    simulated = simulated_variants(frame)
    batches = sorted(frame["batch"].dropna().unique())
    panels = (("throughput_samples_per_s", "samples / s", "throughput: steps back to back"),
              ("throughput_step_ms", "time per step (ms)", "throughput: time per step"),
              ("latency_ms", "time per call (ms)", "latency: one synchronous step"),
              ("forward_ms", "forward time per step (ms)", "split: forward pass and loss"),
              ("backward_ms", "backward time per step (ms)", "split: backward pass and update"))
    fig, axes = plt.subplot_mosaic([[0, 0, 1, 1, 2, 2], [3, 3, 3, 4, 4, 4]], figsize=(14.0, 8.6),
                                   layout="constrained")
    handles = {}
    for k, (column, ylabel, panel_title) in enumerate(panels):
        ax, lines = axes[k], {}
        for variant in variants:
            sub = frame[frame["variant"] == variant].sort_values("batch")
            values = sub[column].where(sub[column] > 0)
            (handles[variant],) = ax.plot(sub["batch"], values, color=colors[variant], **styles[variant])
            lines[variant] = (sub["batch"], values)
        ax.set_yscale("log")
        _log2_ticks(ax, batches)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        _titled_with_coincidences(ax, panel_title + (_clock_note(frame) if k >= 3 else ""), lines)
        ax.grid(alpha=0.3, which="both")
    fig.legend(handles.values(), [_variant_label(v, simulated) for v in handles], loc="outside lower center",
               ncols=min(len(handles), 6), fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


def block_sweep(block_csvs: Sequence[str | Path], out_png, title: str | None = None) -> Path:
    """Time per launch against threads per block, one line per op and one panel per shape (rows x cols), log
    axes; a star marks each op's fastest block. Without a title: a generic one naming the CSVs' devices."""
    if not block_csvs:
        raise GpunnError(f"{out_png}: block_sweep needs at least one block-size sweep CSV")
    frame = pd.concat([read_table(path, BLOCK_COLUMNS, "block-size sweep CSV") for path in block_csvs],
                      ignore_index=True)
    frame = _numeric(frame.assign(op=frame["op"].astype(str)), ["block", "rows", "cols", "ms"])
    ops = list(dict.fromkeys(frame["op"]))  # the sweep's own order
    palette = plt.get_cmap("tab10" if len(ops) <= 10 else "tab20")
    colors = {op: palette(i % palette.N) for i, op in enumerate(ops)}
    styles = dict(zip(ops, series_styles(len(ops))))
    shapes = sorted({(int(r), int(c)) for r, c in zip(frame["rows"], frame["cols"])}, key=lambda s: (s[0] * s[1], s))
    blocks = sorted(frame["block"].dropna().unique())
    ncols = min(len(shapes), 3)
    nrows = math.ceil(len(shapes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 0.6, 3.9 * nrows + 1.2), squeeze=False,
                             layout="constrained")
    lines = {}
    for ax, (rows, cols) in zip(axes.ravel(), shapes):
        shape = frame[(frame["rows"] == rows) & (frame["cols"] == cols)]
        panel_lines = {}
        for op in ops:
            sub = shape[shape["op"] == op].sort_values("block")
            ms = sub["ms"].where(sub["ms"] > 0)
            if ms.notna().any():
                (lines[op],) = ax.plot(sub["block"], ms, color=colors[op], label=op, **styles[op])
                panel_lines[op] = (sub["block"], ms)
                best = ms.idxmin()
                ax.plot(sub.loc[best, "block"], ms[best], "*", ms=12, color=colors[op], zorder=3 + len(ops))
        ax.set_yscale("log")
        _log2_ticks(ax, blocks)
        _titled_with_coincidences(ax, f"{rows} x {cols}", panel_lines)
        ax.set_xlabel("threads per block")
        ax.set_ylabel("time per launch (ms)")
        ax.grid(alpha=0.3, which="both")
    for ax in axes.ravel()[len(shapes):]:
        ax.axis("off")
    # one legend for all panels, below them: ten or so ops would hide the lines inside a panel
    drawn = [op for op in ops if op in lines]
    fig.legend([lines[op] for op in drawn], drawn, loc="outside lower center", ncols=min(len(drawn), 4),
               fontsize="small", title="op (star: its fastest block)", title_fontsize="small")
    if title is None:
        devices = sorted({str(d) for d in frame["device"].dropna()})
        title = "E3: kernel time against block size" + (f"\n{', '.join(devices)}" if devices else "")
    fig.suptitle(title)
    return _save(fig, out_png)
