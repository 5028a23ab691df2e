"""Report figures (matplotlib, Agg backend). Every function writes one PNG, and the same figure as a PDF beside it
(pdf_twin: for papers), atomically, and returns the PNG's path.

    loss_curves              per-epoch train / test loss of several runs, and test accuracy when present
    epoch_series             named per-epoch series on one axis with named reference points (E1: train loss of
                             the CPU and GPU runs under each loss reduction beside paper 000's)
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
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.io import atomic_path
from gpunn.report.divergence import DIVERGED
from gpunn.report.tables import (
    KNOWN_VARIANTS,
    read_table,
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


# ------------------------------------------------------------------------------------------- helpers
def pyplot():
    """matplotlib.pyplot on the Agg backend, imported when the first figure is drawn: the experiment modules, which
    draw, are imported when the workflow is planned, and planning loads no matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def plain_log_labels(axis) -> None:
    """Label the ticks matplotlib labels on a log `axis` (ax.yaxis) as plain numbers: '60', '0.5', not '6 x 10^1'."""
    class Plain(pyplot().matplotlib.ticker.LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def log_norm(vmin: float, vmax: float):
    """A logarithmic colour scale from vmin to vmax."""
    return pyplot().matplotlib.colors.LogNorm(vmin=vmin, vmax=vmax)


def pdf_twin(out_png) -> Path:
    """The PDF written beside a figure's PNG: the PNG is for the report and the screen, the PDF (vector, fonts
    embedded) for papers."""
    return Path(out_png).with_suffix(".pdf")


def save(fig, out_png) -> Path:
    """Write the figure as `out_png` and as its pdf_twin, each atomically (a failure leaves neither half-written)."""
    out_png = Path(out_png)
    try:
        with atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        with atomic_path(pdf_twin(out_png)) as tmp:
            # no creation date: the same figure gives the same bytes, so reruns are comparable
            fig.savefig(tmp, format="pdf", bbox_inches="tight", metadata={"CreationDate": None})
    finally:
        pyplot().close(fig)
    return out_png


def variant_colors(variants: Sequence[str]) -> dict[str, str]:
    """A fixed colour per known variant (so cpu-serial looks the same in every figure), then the unknown ones."""
    cycle = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    unknown = [v for v in variants if v not in KNOWN_VARIANTS]
    return {v: cycle[(KNOWN_VARIANTS.index(v) if v in KNOWN_VARIANTS else len(KNOWN_VARIANTS) + unknown.index(v))
                     % len(cycle)] for v in variants}


def numeric(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in columns})


def log2_ticks(ax, values) -> None:
    """Log-2 x axis labelled with exactly the swept values (batch, hidden or block sizes)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([f"{int(v)}" for v in values])
    ax.xaxis.set_minor_locator(pyplot().NullLocator())


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


def titled_with_coincidences(ax, title: str, lines: Mapping[str, tuple]) -> None:
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


def variant_label(label: str, simulated: set[str], sep: str = " ", variant: str | None = None,
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
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4.8 * len(panels) + 0.4, 4.6), squeeze=False,
                             layout="constrained")
    variant_of = {label: (variants or {}).get(label, label) for label in runs}
    palette = variant_colors(list(dict.fromkeys(variant_of.values())))
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
        titled_with_coincidences(ax, panel_title, lines)
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
    return save(fig, out_png)


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
    palette = variant_colors(list(dict.fromkeys(variant_of.values())))
    styles = dict(zip(series, series_styles(len(series))))
    fig, ax = pyplot().subplots(figsize=(7.2, 5.0), layout="constrained")
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
        plain_log_labels(ax.yaxis)
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
    return save(fig, out_png)


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


def _ordinal_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """Colours along a sequential map, in the order of `labels` (block sizes, small to large)."""
    cmap = pyplot().get_cmap("viridis")
    return {label: cmap(0.9 * i / max(len(labels) - 1, 1)) for i, label in enumerate(labels)}


def epoch_lines(groups: Mapping[str, Mapping[str, str | Path]], measures: Sequence[str], out_png, title: str,
                legend_title: str | None = None, simulated: Collection[str] = (), ordinal: bool = False,
                diverged: Collection[str] = ()) -> Path:
    """Per-epoch lines of several runs against the epoch: one column of panels per group of `groups` ({panel
    name: {line label: metrics.csv}}; E4: a dataset, or a variant of the block-size study) and one row per
    measure of EPOCH_MEASURES ('cumulative_time': the training time up to each epoch, paper 001's Figures 1
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
    colors = _ordinal_colors(labels) if ordinal else variant_colors(labels)
    styles = dict(zip(labels, series_styles(len(labels))))

    def marked(name):
        return f"{name} {SIMULATED_LABEL}" if name in simulated else str(name)

    def legend_label(label):
        return f"{marked(label)} ({DIVERGED})" if str(label) in diverged else marked(label)

    size = (4.8 * len(groups) + 0.4, 3.9 * len(measures) + 0.9)
    fig, axes = pyplot().subplots(len(measures), len(groups), figsize=size,
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
            titled_with_coincidences(ax, f"{marked(group)}: {measure.title}", lines)
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3, which="both")
            _epoch_ticks(ax, lines)
        axes[row, 0].set_ylabel(measure.axis)
        values = np.concatenate(drawn or [[]])
        positive = values[np.isfinite(values) & (values > 0)]
        if measure.cumulative_time and positive.size and positive.max() > LOG_SPAN * positive.min():
            axes[row, 0].set_yscale("log")  # the row shares its y axis
            plain_log_labels(axes[row, 0].yaxis)
            axes[row, 0].set_ylabel(f"{measure.axis}, log scale")
        else:
            _readable_y_span(axes[row, 0], values)
    # one legend for all panels, below them: inside a panel it would cover the lines
    fig.legend(handles.values(), [legend_label(label) for label in handles], loc="outside lower center",
               ncols=min(len(handles), 5), fontsize="small", title=legend_title, title_fontsize="small")
    fig.suptitle(title)
    return save(fig, out_png)


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
    fig, ax = pyplot().subplots(figsize=(size + 1.0, size))
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
    return save(fig, out_png)


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
    fig, axes = pyplot().subplots(2, n, figsize=(1.3 * n + 0.8, 3.2 + 0.3 * (column_titles is not None)),
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
    return save(fig, out_png)


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
    fig, axes = pyplot().subplots(nrows, side, figsize=(1.9 * side, 2.0 * nrows + 0.4), squeeze=False)
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
    return save(fig, out_png)


def annotate(ax, values, fmt, dark) -> None:
    """Write fmt(value) in every finite cell; white text where `dark` (the cell colour is dark)."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                ax.text(j, i, fmt(values[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if dark[i, j] else "black")


