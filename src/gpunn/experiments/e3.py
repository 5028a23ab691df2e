"""E3: the MLP's training step per batch size and variant, against paper 003 (a project plan: its expected speedup
and its tolerance).

Report: throughput (ms per step, samples/s), forward / backward split and latency (gpunn.batch_timing) per batch size
and variant; with a GPU, the kernels' time per block size (blocks: the fastest block per op and shape; block_sweep).
It trains no runs: its jobs time steps (rules time_batches and sweep_blocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gpunn.backends.registry import uses_gpu
from gpunn.errors import GpunnError
from gpunn.experiments.base import Experiment, Headline
from gpunn.report import figures, paper_vs_ours, tables, titles
from gpunn.report.captions import Caption
from gpunn.report.paper_vs_ours import SIMULATED, joined, range_note, require_columns, run_device, value_row
from gpunn.report.papers import PaperValue, select
from gpunn.report.runs import clocks_comparable, join_notes, read_csvs, sorted_rows, timing_mode
from gpunn.report.tables import ordered_variants, read_table

PAPER = "003_4a1c4467d7dd6247.txt"
# paper 003 plans custom GPU kernels against a NumPy CPU baseline
PHASES = {"NumPy CPU": ("cpu-numpy",), "GPU": ("gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph")}
# paper 003 plans these batch sizes for its benchmarks (a setting, not a result)
E3_PLAN_BATCHES = (1, 8, 32, 128, 512)
PAPER_VALUES = (
    PaperValue(experiment="e3", paper=PAPER, phases=PHASES, source="Benchmarking Plan", anchor=("Benchmarking Plan",),
               quantity="expected_speedup", unit="x", text="5", upper_text="50", phase="GPU", versus="NumPy CPU",
               hardware="any NVIDIA GPU (a plan)", dataset="mnist", note="'Expect 5-50x speedups on large batches'"),
    PaperValue(experiment="e3", paper=PAPER, phases=PHASES, source="Numerical Correctness & Tests",
               anchor=("Numerical Correctness & Tests",), quantity="relative_error", unit="relative", text="1e-4",
               phase="GPU", versus="NumPy CPU", hardware="any NVIDIA GPU (a plan)", dataset="mnist",
               note="'Tolerance: relative error < 1e-4' (an upper bound)"),
)
E3_SHOWN = ("variant", "device", "batch", "steps", "throughput_step_ms", "throughput_samples_per_s", "forward_ms",
            "backward_ms", "clock", "latency_ms")
BLOCK_KEYS = ("op", "rows", "cols")


def block_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per op and shape (in the sweep's op order, then by size): the time at every block size
    ('block_<b>_ms', NaN where that block did not run) and the fastest block with its time and bandwidth
    (ties go to the smaller block)."""
    repeated = sweep[sweep.duplicated([*BLOCK_KEYS, "block"])]
    if not repeated.empty:
        first = repeated.iloc[0]
        raise GpunnError(f"block sweep has two rows for {first['op']} {first['rows']}x{first['cols']} block "
                         f"{first['block']}; keep one")
    wide = sweep.pivot(index=list(BLOCK_KEYS), columns="block", values="ms")
    table = pd.DataFrame({f"block_{int(b)}_ms": wide[b] for b in sorted(wide.columns)}, index=wide.index)
    fastest = (sweep.dropna(subset=["ms"]).sort_values(["ms", "block"], kind="stable")
               .drop_duplicates(list(BLOCK_KEYS)).set_index(list(BLOCK_KEYS)))
    table["best_block"] = fastest["block"].reindex(table.index)
    table["best_ms"] = fastest["ms"].reindex(table.index)
    table["best_gb_per_s"] = fastest["gb_per_s"].reindex(table.index)
    op_order = {op: i for i, op in enumerate(dict.fromkeys(sweep["op"]))}
    table = table.reset_index()
    return table.sort_values(["op", "rows", "cols"], key=lambda col: col.map(op_order) if col.name == "op" else col,
                             kind="stable").reset_index(drop=True)


E3_SUMMARY_COLUMNS = ("variant", "device", "batch", "hidden", "features", "steps", "timed_epochs",
                      "throughput_step_ms", "throughput_samples_per_s", "forward_ms", "backward_ms", "clock",
                      "latency_ms", "repeats", "simulator")


def e3_head(frame: pd.DataFrame) -> str:
    """'E3: MLP training step per batch size and variant (hidden 256, inputs 784, throughput over 100 steps,
    latency median of 20 calls)', from the columns the timing CSVs have."""
    sizes = [f"{name} {titles.one_or_set(frame[column])}" for column, name in (("hidden", "hidden"),
                                                                            ("features", "inputs"))
             if column in frame]
    if "steps" in frame:
        sizes.append(f"throughput over {titles.one_or_set(frame['steps'])} steps")
    if "repeats" in frame:
        calls = titles.one_or_set(frame["repeats"])
        sizes.append(f"latency median of {calls} call{'' if calls == '1' else 's'}")
    return "E3: MLP training step per batch size and variant" + (f" ({', '.join(sizes)})" if sizes else "")


def e3_note() -> str:
    """What each measured column of E3's table is (gpunn.batch_timing.COLUMN_NOTES)."""
    from gpunn.batch_timing import COLUMN_NOTES

    return " ".join(f"{column}: {text}." for column, text in COLUMN_NOTES.items())


def report_e3(timings, out_dir, blocks=(), **_) -> dict[str, str]:
    frame = sorted_rows(read_csvs(timings, E3_COLUMNS, "E3 timing CSV"), ["variant", "batch"])
    head, timing = e3_head(frame), titles.timing_parts(frame)
    written = {"summary.md": titles.table_title(head, timing),
               "batch_timing.png": titles.figure_title(head, timing)}
    tables.summary_table(frame.to_dict("records"), out_dir / "summary.csv", out_dir / "summary.md",
                         written["summary.md"], columns=[c for c in E3_SUMMARY_COLUMNS if c in frame], shown=E3_SHOWN,
                         note=join_notes(e3_note(), titles.simulated_note(frame)))
    batch_timing(out_dir / "summary.csv", out_dir / "batch_timing.png", written["batch_timing.png"])
    written["paper_vs_ours.md"] = paper_vs_ours.report(e3_rows(frame), out_dir, head, PAPER)
    if not blocks:  # the block-size sweep is optional by hand; the workflow always passes it
        return written
    sweep = read_csvs(blocks, BLOCK_COLUMNS, "block-size sweep CSV")
    devices = titles.distinct(sweep.loc[sweep["device"] != titles.UNKNOWN_DEVICE, "device"])
    if len(devices) > 1:
        raise GpunnError(f"{', '.join(map(str, blocks))}: block sweep mixes devices {', '.join(sorted(devices))}; "
                         "the fastest block is only meaningful on one")
    table = block_table(sweep)
    timing = titles.timing_parts(sweep)
    written["blocks.md"] = titles.table_title("E3: kernel time (ms) against threads per block", timing)
    written["block_sweep.png"] = titles.figure_title("E3: kernel time against block size", timing)
    tables.summary_table(table.to_dict("records"), out_dir / "blocks.csv", out_dir / "blocks.md",
                         written["blocks.md"],
                         note=join_notes("One row per op and shape (rows x cols); '-': that block size did not run. "
                                    "best_gb_per_s: bandwidth at the fastest block.", titles.simulated_note(sweep)))
    block_sweep(blocks, out_dir / "block_sweep.png", written["block_sweep.png"])
    return written


E3_COLUMNS = ("variant", "batch", "throughput_samples_per_s", "throughput_step_ms", "latency_ms", "forward_ms",
              "backward_ms")  # gpunn.batch_timing.COLUMN_NOTES says what each measures
BLOCK_COLUMNS = ("op", "block", "rows", "cols", "ms", "gb_per_s", "device")


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
    frame = figures.numeric(frame.assign(variant=frame["variant"].astype(str)), E3_COLUMNS[1:])
    variants = ordered_variants(frame["variant"])
    colors = figures.variant_colors(variants)
    styles = dict(zip(variants, figures.series_styles(len(variants))))
    simulated = figures.simulated_variants(frame)
    batches = sorted(frame["batch"].dropna().unique())
    panels = (("throughput_samples_per_s", "samples / s", "throughput: steps back to back"),
              ("throughput_step_ms", "time per step (ms)", "throughput: time per step"),
              ("latency_ms", "time per call (ms)", "latency: one synchronous step"),
              ("forward_ms", "forward time per step (ms)", "split: forward pass and loss"),
              ("backward_ms", "backward time per step (ms)", "split: backward pass and update"))
    fig, axes = figures.pyplot().subplot_mosaic([[0, 0, 1, 1, 2, 2], [3, 3, 3, 4, 4, 4]], figsize=(14.0, 8.6),
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
        figures.log2_ticks(ax, batches)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        figures.titled_with_coincidences(ax, panel_title + (_clock_note(frame) if k >= 3 else ""), lines)
        ax.grid(alpha=0.3, which="both")
    fig.legend(handles.values(), [figures.variant_label(v, simulated) for v in handles], loc="outside lower center",
               ncols=min(len(handles), 6), fontsize="small")
    fig.suptitle(title)
    return figures.save(fig, out_png)


def block_sweep(block_csvs: Sequence[str | Path], out_png, title: str | None = None) -> Path:
    """Time per launch against threads per block, one line per op and one panel per shape (rows x cols), log
    axes; a star marks each op's fastest block. Without a title: a generic one naming the CSVs' devices."""
    if not block_csvs:
        raise GpunnError(f"{out_png}: block_sweep needs at least one block-size sweep CSV")
    frame = pd.concat([read_table(path, BLOCK_COLUMNS, "block-size sweep CSV") for path in block_csvs],
                      ignore_index=True)
    frame = figures.numeric(frame.assign(op=frame["op"].astype(str)), ["block", "rows", "cols", "ms"])
    ops = list(dict.fromkeys(frame["op"]))  # the sweep's own order
    palette = figures.pyplot().get_cmap("tab10" if len(ops) <= 10 else "tab20")
    colors = {op: palette(i % palette.N) for i, op in enumerate(ops)}
    styles = dict(zip(ops, figures.series_styles(len(ops))))
    shapes = sorted({(int(r), int(c)) for r, c in zip(frame["rows"], frame["cols"])}, key=lambda s: (s[0] * s[1], s))
    blocks = sorted(frame["block"].dropna().unique())
    ncols = min(len(shapes), 3)
    nrows = math.ceil(len(shapes) / ncols)
    fig, axes = figures.pyplot().subplots(nrows, ncols, figsize=(4.6 * ncols + 0.6, 3.9 * nrows + 1.2), squeeze=False,
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
        figures.log2_ticks(ax, blocks)
        figures.titled_with_coincidences(ax, f"{rows} x {cols}", panel_lines)
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
    return figures.save(fig, out_png)


def e3_rows(frame: pd.DataFrame) -> list[dict]:
    """Paper 003's plan against E3's throughput: its expected 5-50x on large batches beside each GPU variant's
    throughput speedup over cpu-numpy (cpu-numpy's time per step, steps run back to back, over the variant's) at our
    large batches (128 and up; else the largest we timed); its tolerance, which the test suite checks and the
    pipeline does not measure."""
    require_columns(frame, ("variant", "batch", "throughput_step_ms", "device", "simulator"), "e3")
    rows = []
    expected = select(PAPER_VALUES, "e3", "expected_speedup")[0]
    batches = sorted(int(b) for b in frame["batch"].unique())
    large = [b for b in batches if b >= 128] or batches[-1:]
    cpu = frame[frame["variant"] == "cpu-numpy"].set_index("batch")
    gpu = [v for v in tables.ordered_variants(frame["variant"]) if uses_gpu(v)]
    for variant in gpu or [None]:
        for batch in large:
            row = value_row(expected, None)
            row["column"] = f"{row['column']}, batch {batch}"
            notes = [expected.note]
            of = frame[(frame["variant"] == variant) & (frame["batch"] == batch)] if variant else frame.iloc[:0]
            if of.empty:
                notes.append("no GPU variant timed here")
            else:
                run = of.iloc[0]
                row.update(variant=variant, our_device=run_device(run), simulator=bool(run["simulator"]))
                if batch in cpu.index and not clocks_comparable(timing_mode(run), timing_mode(cpu.loc[batch])):
                    notes.append(f"no speedup: {variant} ({timing_mode(run)}) and cpu-numpy "
                                 f"({timing_mode(cpu.loc[batch])}) were not both timed alone (config key timing)")
                elif batch in cpu.index:
                    row["ours"] = float(cpu.loc[batch, "throughput_step_ms"]) / float(run["throughput_step_ms"])
                    notes.append("ours: throughput (time per step, steps back to back)")
                    row["variant"] = f"{variant} vs cpu-numpy"
                    row["our_device"] = joined([run_device(run), run_device(cpu.loc[batch])])
                    notes.append(range_note(row["ours"], expected))
                else:
                    notes.append("cpu-numpy not timed at this batch")
                if row["simulator"]:
                    notes.append(SIMULATED)
                if batch < 128:
                    notes.append(f"our largest batch timed is {batch}")
            row["note"] = "; ".join(n for n in notes if n)
            rows.append(row)
    tolerance = select(PAPER_VALUES, "e3", "relative_error")[0]
    rows.append({**value_row(tolerance, None),
                 "note": f"{tolerance.note}; checked by the test suite (GPU variants against cpu-numpy, "
                         "tests/test_gpu_*.py), not measured by the pipeline"})
    return rows


CAPTIONS = {
    "batch_timing.png": Caption(
        "The MLP's training step against batch size, one line per variant, log axes. Throughput (top left, top "
        "middle): steps run back to back as the training loop runs them, through the variant's own data path (its "
        "per-step batch copies, or its data resident on the GPU), as samples per second and as an epoch's wall time "
        "over its steps. Latency (top right): the wall time of one synchronous training step called from Python on "
        "a host batch: the copy, the launches and the wait for the GPU. Split (bottom): the forward pass with the "
        "loss, and the backward pass with the update, per step of the throughput epochs: GPU time from CUDA events "
        "around each phase for the GPU variants (the batch copy excluded), the host clock for the CPU variants and "
        "under numba's simulator (panel titles name the clock).",
        "paper 003's benchmarking plan (batch sizes 1 to 512, custom kernels against a NumPy CPU baseline), which "
        "has no figure", "paper 003 plan"),
    "block_sweep.png": Caption(
        "Kernel time against threads per block, one line per op, one panel per matrix shape.",
        "paper 003's planned block-size sweep, which has no figure", "paper 003 plan"),
}



def block_sweep_enabled(config: dict) -> bool:
    """The kernel block-size sweep needs a GPU (or the simulator): dropped with gpu.enabled false."""
    return bool(config.get("gpu", {}).get("enabled", True))


def inputs(config: dict, layout) -> dict[str, list[str]]:
    """The timing CSV of each variant (rule time_batches) and, with a GPU, the block sweep's (rule sweep_blocks)."""
    timing = layout.measured("timing")
    found = {"timings": [f"{timing}/e3/{v}.csv" for v in config["experiments"]["e3"]["variants"]]}
    if block_sweep_enabled(config):
        found["blocks"] = [f"{timing}/e3/blocks.csv"]
    return found


EXPERIMENT = Experiment(
    name="e3", title="MLP step throughput, forward / backward split and latency per batch size, kernel block sizes",
    description="MLP step throughput, forward / backward split and latency per batch size and variant",
    model="mlp", paper=PAPER, runs=lambda config: [],
    tables=lambda config: ["summary"] + (["blocks"] if block_sweep_enabled(config) else []) + ["paper_vs_ours"],
    figures=lambda config: ["batch_timing.png"] + (["block_sweep.png"] if block_sweep_enabled(config) else []),
    report=report_e3, captions=CAPTIONS, paper_values=PAPER_VALUES, inputs=inputs,
    without_gpu=lambda config: ["E3's kernel block sweep is not run"],
    headlines=(
        Headline("e3", "expected GPU speedup over NumPy (ours: the best throughput speedup, batch >= 128)",
                 "expected_speedup", {}, match=("table", "row", "quantity")),
    ),
)
