"""Where a training step's time goes (E1, E4, E5 reports): from the step profile CSVs (rule step_profile, one per GPU
variant, gpunn.timing.step_profile: one row per launch of one training step), step_profile.png (one bar per variant,
its kernels' GPU time stacked by op, plus the host overhead) and step_profile.csv/.md (the three largest launches of
each variant, with the step's step_kernels_ms, step_wall_ms and host_overhead_us).

An op is a kernel: the launch name up to its first '[' (gemm_naive[NN,none] and gemm_naive[TN,none] are one op);
ops under OTHER_SHARE of every variant's kernel time, and those past the MAX_OPS largest, are merged into "other".
Profiles written under numba's CUDA simulator have no times: the figure then counts each variant's launches per op,
says so in its title, and the table lists every launch without times.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpunn.errors import GpunnError
from gpunn.nn.models import MODELS
from gpunn.report import figures, tables, titles

STEP_PROFILE = "step_profile"  # the report's table (.csv, .md) and figure (.png, .pdf)
COLUMNS = ("model", "variant", "batch", "order", "phase", "launch", "grid", "block", "ms", "share", "step_wall_ms",
           "kernel_ms", "step_kernels_ms", "host_overhead_us")
TOP = 3                 # launches per variant in the table
OTHER_SHARE = 0.05      # an op below this share of every variant's kernel time goes into "other"
MAX_OPS = 8             # at most this many ops keep a segment of their own
OTHER, HOST = "other", "host overhead"
UNTIMED = "launch list only, no times (simulator)"
TABLE_COLUMNS = ("variant", "order", "phase", "launch", "grid", "block", "ms", "share", "kernel_ms", "step_kernels_ms",
                 "step_wall_ms", "host_overhead_us", "device", "simulator")
TIME_COLUMNS = ("ms", "share", "kernel_ms", "step_kernels_ms", "step_wall_ms", "host_overhead_us")  # not untimed
NOTE = ("Each launch of one training step timed alone: queued behind a GPU sleep, so that its CUDA events time the "
        "kernel and not the host's launch, the median of repeated launches (ms; share: of kernel_ms, their sum). "
        "step_kernels_ms: the whole step's launches timed the same way as one, back to back (no host gaps, and not "
        "the 2 us of event overhead each launch timed alone carries); step_wall_ms: the step's wall time as the "
        "variant's training loop runs it (epoch wall / steps); host_overhead_us = 1000 x (step_wall_ms - "
        "step_kernels_ms): host work, batch copies and synchronisations, everything that is not kernel time. A "
        "step replayed from CUDA graphs can read a slightly negative host overhead (run-to-run noise): then the "
        "host costs nothing measurable.")
UNTIMED_NOTE = ("Listed under numba's CUDA simulator, whose host clock says nothing about a kernel's GPU time: every "
                "launch of the step in its order, without times.")


def read_profiles(paths: Sequence) -> pd.DataFrame:
    """The rows of the step profile CSVs, with device and simulator columns (titles.with_device_fields); one
    GpunnError line for a variant profiled twice or a mix of timed and untimed profiles."""
    frame = pd.concat([tables.read_table(p, COLUMNS, "step profile CSV").assign(source=str(p)) for p in paths],
                      ignore_index=True)
    twice = frame.groupby("variant")["source"].nunique()
    if (twice > 1).any():
        raise GpunnError(f"step profiles: {twice[twice > 1].index[0]} is profiled in more than one of "
                         f"{', '.join(map(str, paths))}; keep one CSV per variant")
    timed = frame["ms"].notna()
    if timed.any() and not timed.all():
        raise GpunnError(f"step profiles {', '.join(map(str, paths))} mix timed launches with untimed ones (the "
                         "simulator's); rerun the step_profile jobs on one machine")
    frame = frame.assign(variant=frame["variant"].astype(str), launch=frame["launch"].astype(str))
    return titles.with_device_fields(frame)


def is_timed(frame: pd.DataFrame) -> bool:
    return bool(frame["ms"].notna().all())


def _variants(frame: pd.DataFrame) -> list[str]:
    return tables.ordered_variants(frame["variant"])


def op_name(launch: str) -> str:
    """'gemm_naive[NN,none]' -> 'gemm_naive': a launch's kernel, without its configuration."""
    return launch.split("[", 1)[0]


def op_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant (rows, report order) the kernel time of each op (columns, largest first, "other" last) in ms: its
    share of the launches timed alone times the step's back-to-back kernel time (step_kernels_ms), then the host
    overhead in ms (column HOST, NaN where not measured); untimed profiles: launch counts, no HOST column."""
    timed = is_timed(frame)
    per_op = frame.assign(op=frame["launch"].map(op_name)).pivot_table(
        index="variant", columns="op", values="ms" if timed else "order", aggfunc="sum" if timed else "count",
        fill_value=0)
    per_op = per_op.reindex(_variants(frame))
    shares = per_op.div(per_op.sum(axis=1), axis=0)
    ranked = shares.max().sort_values(ascending=False, kind="stable")
    kept = [op for op in ranked.index[:MAX_OPS] if ranked[op] >= OTHER_SHARE]
    merged = [op for op in per_op.columns if op not in kept]
    table = per_op[kept].copy()
    if merged:
        table[OTHER] = per_op[merged].sum(axis=1)
    if timed:
        step = frame.groupby("variant")[["step_kernels_ms", "host_overhead_us"]].first().reindex(table.index)
        table = table.mul(step["step_kernels_ms"] / per_op.sum(axis=1), axis=0)
        table[HOST] = step["host_overhead_us"] / 1000.0
    return table


def top_launches(frame: pd.DataFrame, n: int = TOP) -> pd.DataFrame:
    """The table's rows: per variant (report order) its `n` largest launches by ms (ties: the earlier launch first);
    untimed profiles: every launch in step order, without the TIME_COLUMNS."""
    timed = is_timed(frame)
    parts = []
    for variant in _variants(frame):
        rows = frame[frame["variant"] == variant].sort_values("order", kind="stable")
        parts.append(rows.sort_values("ms", ascending=False, kind="stable").head(n) if timed else rows)
    return pd.concat(parts, ignore_index=True)[[c for c in TABLE_COLUMNS if timed or c not in TIME_COLUMNS]]


STEP_WHAT = " of one {model} training step per GPU variant"


def _head(experiment: str, frame: pd.DataFrame, what: str) -> str:
    """'E4: ' + `what` with {model} filled in ('CNN', 'MLP', 'autoencoder') + ', batch 64'."""
    model = titles.one_or_set(frame["model"], lambda m: MODELS[m].short if m in MODELS else str(m))
    return f"{experiment.upper()}: {what.format(model=model)}, batch {titles.one_or_set(frame['batch'])}"


def _timing(frame: pd.DataFrame) -> list[str]:
    return titles.timing_parts(frame) if is_timed(frame) else [UNTIMED]


def _stacked_bars(ax, segments: pd.DataFrame, colors: dict) -> None:
    """One bar per row of `segments` (variants), its columns stacked bottom to top; the host overhead hatched."""
    positions = np.arange(len(segments))
    bottom = np.zeros(len(segments))
    for column in segments.columns:
        heights = segments[column].to_numpy(dtype=float)
        ax.bar(positions, heights, bottom=bottom, color=colors[column], label=column,
               edgecolor="black" if column == HOST else "white", hatch="//" if column == HOST else None)
        bottom += heights
    ax.set_xticks(positions)
    ax.set_xticklabels(segments.index, rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3)


def figure(frame: pd.DataFrame, out_png, title: str) -> Path:
    """step_profile.png. Timed: one bar per variant of its step's time in ms, the ops' kernel time stacked and the
    host overhead on top (hatched; none where it is not measured or negative: run-to-run noise of a graph's step),
    each bar labelled with its kernel and host times; beside it the same as shares of the
    step. Untimed (title ending in UNTIMED): each variant's launches per op, counted."""
    table = op_table(frame)
    ops = [c for c in table.columns if c != HOST]
    # tab10's grey is "other"'s
    palette = [c for i, c in enumerate(figures.pyplot().get_cmap("tab10").colors) if i != 7]
    colors = {op: palette[i % len(palette)] for i, op in enumerate(ops)} | {OTHER: "0.75", HOST: "white"}
    segments = table.clip(lower=0).fillna(0)
    timed = is_timed(frame)
    panels = 2 if timed else 1
    size = (panels * (1.1 * len(table) + 3.0) + 2.5, 4.6)
    fig, axes = figures.pyplot().subplots(1, panels, figsize=size, squeeze=False)
    axes = axes[0]
    _stacked_bars(axes[0], segments, colors)
    if timed:
        axes[0].set_ylabel("time per training step (ms)")
        for x, variant in enumerate(table.index):
            step = frame.loc[frame["variant"] == variant].iloc[0]
            label = f"kernels {tables.format_significant(step['step_kernels_ms'], 3)} ms"
            if pd.notna(step["host_overhead_us"]):
                label += f"\nhost {tables.format_significant(step['host_overhead_us'], 3)} µs"
            axes[0].annotate(label, (x, segments.loc[variant].sum()), xytext=(0, 3), textcoords="offset points",
                             ha="center", va="bottom", fontsize=8)
        axes[0].margins(y=0.2)  # room above the tallest bar for its label
        _stacked_bars(axes[1], 100.0 * segments.div(segments.sum(axis=1), axis=0), colors)
        axes[1].set_ylabel("share of the step (%)")
    else:
        axes[0].set_ylabel("launches per training step (count)")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles[::-1], labels[::-1], title="kernel (op)", fontsize=8, bbox_to_anchor=(1.02, 1),
                    loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return figures.save(fig, out_png)


def report(experiment: str, profiles: Sequence, out_dir) -> dict[str, str]:
    """Write step_profile.csv/.md and step_profile.png (+ PDF) of `experiment` from its step profile CSVs into
    `out_dir`; returns their titles by file name ({} without profiles: the experiment ran no GPU variant)."""
    if not profiles:
        return {}
    frame = read_profiles(profiles)
    out_dir = Path(out_dir)
    timed, timing = is_timed(frame), _timing(frame)
    table_what = ("the three largest launches" if timed else "the launches") + STEP_WHAT
    figure_what = ("where one {model} training step's time goes per GPU variant (kernel time by kernel, host overhead)"
                   if timed else f"the launches{STEP_WHAT}, counted by kernel")
    written = {f"{STEP_PROFILE}.md": titles.table_title(_head(experiment, frame, table_what), timing),
               f"{STEP_PROFILE}.png": titles.figure_title(_head(experiment, frame, figure_what), timing)}
    rows = top_launches(frame)
    tables.summary_table(rows.to_dict("records"), out_dir / f"{STEP_PROFILE}.csv", out_dir / f"{STEP_PROFILE}.md",
                         written[f"{STEP_PROFILE}.md"], formats={"share": lambda v: f"{100 * v:.1f} %"},
                         shown=[c for c in rows.columns if c != "device"],  # the title names the device
                         note=NOTE if timed else UNTIMED_NOTE)
    figure(frame, out_dir / f"{STEP_PROFILE}.png", written[f"{STEP_PROFILE}.png"])
    return written
