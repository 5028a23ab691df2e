"""Report figures (matplotlib, Agg backend). Every function writes one PNG atomically and returns its path.

    loss_curves              per-epoch train / test loss of several runs, and test accuracy when present
    confusion_matrix_figure  heatmap of a confusion matrix with counts (used by gpunn.svm)
    reconstruction_grid      originals above autoencoder reconstructions
    sample_classifications   up to 25 test images titled "pred (true)", wrong ones in red
    epoch_time_bars          E1: time per epoch of each variant, bars on a log axis
    e2_heatmaps              E2 sweep: training time and test accuracy over hidden x batch, one panel per variant
    e2_phase_times           E2 sweep: forward and backward time against hidden size, one panel per batch size
    batch_timing             E3: samples/s, step, forward and backward time against batch size, one line per variant
    block_sweep              E3: kernel time against block size, one line per op, one panel per shape

Variants keep one colour in every figure (their place in gpunn.report.tables.KNOWN_VARIANTS).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from gpunn.errors import GpunnError  # noqa: E402
from gpunn.io import atomic_path  # noqa: E402
from gpunn.report.tables import (  # noqa: E402
    KNOWN_VARIANTS,
    format_significant,
    ordered_variants,
    read_table,
)

DPI = 120

LOSS_COLUMNS = ("epoch", "train_loss", "test_loss", "test_accuracy", "epoch_time_s")
E2_COLUMNS = ("variant", "hidden", "batch", "train_time_s", "forward_time_s", "backward_time_s", "test_accuracy")
E1_COLUMNS = ("variant", "time_per_epoch_s")
E3_COLUMNS = ("variant", "batch", "forward_ms", "backward_ms", "step_ms", "samples_per_s")
BLOCK_COLUMNS = ("op", "block", "rows", "cols", "ms", "gb_per_s", "device")


# ------------------------------------------------------------------------------------------- helpers
def _save(fig, out_png) -> Path:
    out_png = Path(out_png)
    try:
        with atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
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
def loss_curves(metrics_csvs: Mapping[str, str | Path], out_png, title: str) -> Path:
    """Train (solid) and test (dashed) loss per epoch for each labelled run; a test-accuracy panel if any run
    has accuracies (the autoencoder's are empty)."""
    if not metrics_csvs:
        raise GpunnError(f"{out_png}: loss_curves needs at least one metrics CSV")
    runs = {label: read_table(path, LOSS_COLUMNS, "per-epoch metrics CSV") for label, path in metrics_csvs.items()}
    has_acc = any(pd.to_numeric(f["test_accuracy"], errors="coerce").notna().any() for f in runs.values())
    ncols = 2 if has_acc else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.0 * ncols, 4.2), squeeze=False)
    ax_loss = axes[0, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, frame) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        epoch = pd.to_numeric(frame["epoch"], errors="coerce")
        ax_loss.plot(epoch, pd.to_numeric(frame["train_loss"], errors="coerce"), "-o", ms=3, color=color,
                     label=f"{label} train")
        ax_loss.plot(epoch, pd.to_numeric(frame["test_loss"], errors="coerce"), "--s", ms=3, color=color,
                     label=f"{label} test")
        if has_acc:
            acc = pd.to_numeric(frame["test_accuracy"], errors="coerce")
            if acc.notna().any():
                axes[0, 1].plot(epoch, 100.0 * acc, "-o", ms=3, color=color, label=label)
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss per epoch")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize="small")
    if has_acc:
        ax_acc = axes[0, 1]
        ax_acc.set_xlabel("epoch")
        ax_acc.set_ylabel("test accuracy (%)")
        ax_acc.set_title("test accuracy per epoch")
        ax_acc.grid(alpha=0.3)
        ax_acc.legend(fontsize="small")
    for ax in axes.ravel():
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title)
    fig.tight_layout()
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


def reconstruction_grid(originals, reconstructions, out_png, title: str, max_columns: int = 10) -> Path:
    """Originals (top row) above their reconstructions (bottom row), up to ``max_columns`` images."""
    orig = _as_images(originals, f"{out_png} (originals)")
    recon = _as_images(reconstructions, f"{out_png} (reconstructions)")
    if orig.shape != recon.shape:
        raise GpunnError(
            f"{out_png}: originals {orig.shape} and reconstructions {recon.shape} must have the same shape")
    n = min(orig.shape[0], max_columns)
    fig, axes = plt.subplots(2, n, figsize=(1.3 * n + 0.8, 3.2), squeeze=False)
    for j in range(n):
        _show(axes[0, j], orig[j])
        _show(axes[1, j], recon[j])
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
        ax.set_title(f"{variant}: training time")
        if has_acc:
            a = grid(sub, "test_accuracy")
            ax2 = axes[1, k]
            im_a = ax2.imshow(np.ma.masked_invalid(a), cmap="magma", vmin=acc_lo, vmax=acc_hi, aspect="auto")
            # magma is dark at the low end
            _annotate(ax2, a, lambda v: f"{v:.2f}%", np.nan_to_num((a - acc_lo) / (acc_hi - acc_lo), nan=1.0) < 0.5)
            ax2.set_title(f"{variant}: test accuracy")
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
    """Mean time per training epoch of each variant as a bar on a log axis, annotated in seconds and, where the
    table has it, with the speedup over cpu-serial."""
    frame = read_table(table_csv, E1_COLUMNS, "E1 summary table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), ["time_per_epoch_s"])
    variants = ordered_variants(frame["variant"])
    rows = [frame[frame["variant"] == v].iloc[0] for v in variants]
    times = np.array([r["time_per_epoch_s"] for r in rows], dtype=np.float64)
    if not (times > 0).any():
        raise GpunnError(f"{table_csv}: E1 summary table has no positive time_per_epoch_s")
    colors = _variant_colors(variants)
    fig, ax = plt.subplots(figsize=(1.3 * len(variants) + 3.0, 4.2))
    positions = np.arange(len(variants))
    ax.bar(positions, np.where(times > 0, times, np.nan), color=[colors[v] for v in variants])
    for x, row, t in zip(positions, rows, times):
        if not t > 0:
            continue
        label = f"{format_significant(t, 3)} s"
        speedup = row.get("speedup_vs_cpu_serial", np.nan)
        if row["variant"] != "cpu-serial" and pd.notna(speedup):
            label += f"\n{format_significant(float(speedup), 3)}x"
        ax.annotate(label, (x, t), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.margins(y=0.25)  # room above the tallest bar for its label
    ax.set_xticks(positions)
    ax.set_xticklabels(variants, rotation=20, ha="right")
    ax.set_ylabel("time per epoch (s, log scale)")
    ax.set_title("speedup over cpu-serial under each bar's time" if "speedup_vs_cpu_serial" in frame else "",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def e2_phase_times(table_csv, out_png, title: str = "E2: forward and backward time against hidden size") -> Path:
    """Forward (top row) and backward (bottom row) time summed over training, against hidden size, one column of
    panels per batch size and one line per variant; log axes shared by all panels, so phases compare directly."""
    frame = read_table(table_csv, E2_COLUMNS, "E2 sweep table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)),
                     ["hidden", "batch", "forward_time_s", "backward_time_s"])
    variants = ordered_variants(frame["variant"])
    colors = _variant_colors(variants)
    hiddens = sorted(frame["hidden"].dropna().unique())
    batches = sorted(frame["batch"].dropna().unique())
    fig, axes = plt.subplots(2, len(batches), figsize=(4.0 * len(batches) + 0.8, 7.0), squeeze=False,
                             sharex=True, sharey=True)
    for row, (column, phase) in enumerate((("forward_time_s", "forward"), ("backward_time_s", "backward"))):
        for k, batch in enumerate(batches):
            ax = axes[row, k]
            for variant in variants:
                sub = frame[(frame["variant"] == variant) & (frame["batch"] == batch)].sort_values("hidden")
                ax.plot(sub["hidden"], sub[column].where(sub[column] > 0), "-o", ms=4, color=colors[variant],
                        label=variant)
            ax.set_yscale("log")
            _log2_ticks(ax, hiddens)
            ax.set_title(f"{phase}, batch {int(batch)}")
            ax.grid(alpha=0.3, which="both")
            if row == 1:
                ax.set_xlabel("hidden units")
            if k == 0:
                ax.set_ylabel(f"{phase} time over training (s)")
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def batch_timing(table_csv, out_png, title: str = "E3: MLP training step against batch size") -> Path:
    """Samples/s, time per training step, forward and backward time against batch size, one line per variant,
    log axes (CPU baselines and GPU variants differ by orders of magnitude)."""
    frame = read_table(table_csv, E3_COLUMNS, "E3 batch timing table")
    frame = _numeric(frame.assign(variant=frame["variant"].astype(str)), E3_COLUMNS[1:])
    variants = ordered_variants(frame["variant"])
    colors = _variant_colors(variants)
    batches = sorted(frame["batch"].dropna().unique())
    panels = (("samples_per_s", "samples / s", "training throughput"),
              ("step_ms", "time per step (ms)", "time per training step"),
              ("forward_ms", "forward time (ms)", "forward pass and loss"),
              ("backward_ms", "backward time (ms)", "backward pass and update"))
    fig, axes = plt.subplots(2, 2, figsize=(11.0, 8.0))
    for ax, (column, ylabel, panel_title) in zip(axes.ravel(), panels):
        for variant in variants:
            sub = frame[frame["variant"] == variant].sort_values("batch")
            ax.plot(sub["batch"], sub[column].where(sub[column] > 0), "-o", ms=4, color=colors[variant],
                    label=variant)
        ax.set_yscale("log")
        _log2_ticks(ax, batches)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def block_sweep(block_csvs: Sequence[str | Path], out_png, title: str = "E3: kernel time against block size") -> Path:
    """Time per launch against threads per block, one line per op and one panel per shape (rows x cols), log
    axes; a star marks each op's fastest block."""
    if not block_csvs:
        raise GpunnError(f"{out_png}: block_sweep needs at least one block-size sweep CSV")
    frame = pd.concat([read_table(path, BLOCK_COLUMNS, "block-size sweep CSV") for path in block_csvs],
                      ignore_index=True)
    frame = _numeric(frame.assign(op=frame["op"].astype(str)), ["block", "rows", "cols", "ms"])
    ops = list(dict.fromkeys(frame["op"]))  # the sweep's own order
    palette = plt.get_cmap("tab10" if len(ops) <= 10 else "tab20")
    colors = {op: palette(i % palette.N) for i, op in enumerate(ops)}
    shapes = sorted({(int(r), int(c)) for r, c in zip(frame["rows"], frame["cols"])}, key=lambda s: (s[0] * s[1], s))
    blocks = sorted(frame["block"].dropna().unique())
    ncols = min(len(shapes), 3)
    nrows = math.ceil(len(shapes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 0.6, 3.9 * nrows + 1.2), squeeze=False,
                             layout="constrained")
    lines = {}
    for ax, (rows, cols) in zip(axes.ravel(), shapes):
        shape = frame[(frame["rows"] == rows) & (frame["cols"] == cols)]
        for op in ops:
            sub = shape[shape["op"] == op].sort_values("block")
            ms = sub["ms"].where(sub["ms"] > 0)
            if ms.notna().any():
                (lines[op],) = ax.plot(sub["block"], ms, "-o", ms=4, color=colors[op], label=op)
                best = ms.idxmin()
                ax.plot(sub.loc[best, "block"], ms[best], "*", ms=12, color=colors[op])
        ax.set_yscale("log")
        _log2_ticks(ax, blocks)
        ax.set_title(f"{rows} x {cols}")
        ax.set_xlabel("threads per block")
        ax.set_ylabel("time per launch (ms)")
        ax.grid(alpha=0.3, which="both")
    for ax in axes.ravel()[len(shapes):]:
        ax.axis("off")
    # one legend for all panels, below them: ten or so ops would hide the lines inside a panel
    drawn = [op for op in ops if op in lines]
    fig.legend([lines[op] for op in drawn], drawn, loc="outside lower center", ncols=min(len(drawn), 4),
               fontsize="small", title="op (star: its fastest block)", title_fontsize="small")
    devices = sorted({str(d) for d in frame["device"].dropna()})
    fig.suptitle(title + (f"\n{', '.join(devices)}" if devices else ""))
    return _save(fig, out_png)
