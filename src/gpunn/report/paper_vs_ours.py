"""Paper vs ours: every number of a paper's tables and text (gpunn.report.papers) beside the same number from our
runs, one row per paper cell, grouped as the paper groups them (its tables and sections, rows and columns labelled
as it prints them), both devices named. Written as paper_vs_ours.csv (tidy, raw values) and paper_vs_ours.md by
each experiment's report.

How the two are compared:
  * times also as speedups: the paper's time over its own CPU baseline's (the same table and setting) beside ours
    over our run of the same baseline, since a time measured on another machine compares only as a ratio;
    `speedup_ratio` is ours over the paper's; the absolute times stand side by side with `ratio` = ours / paper;
  * a speedup the paper prints (`versus` another phase) against the same ratio of our two runs;
  * accuracies directly: `diff_pp` is ours minus the paper's, in percentage points; losses, MSE, memory and
    parameter counts by `ratio`;
  * a range or target the paper expects: ours is placed within, below or above it (note), no ratio.
Which of our runs stands for a paper phase: the experiment's PHASES (the first variant that ran), in the entry's setting
(dataset, hidden size, batch size, block size); where our setting differs (a smoke run's dataset, batch 64
against the paper's 1), the note says so. A row whose run did not happen shows '-' for ours and says why; a number
produced under numba's CUDA simulator has device cuda-simulator and a note that its timing is not meaningful; one
from a run that diverged (kept by keep_diverged) names the variant '(diverged)' and says so in its note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from gpunn import io
from gpunn.errors import GpunnError
from gpunn.report import divergence, tables, titles
from gpunn.report.papers import TIME_UNITS, PaperValue, select
from gpunn.report.runs import clocks_comparable, timing_mode
from gpunn.report.tables import format_ratio, format_significant

COLUMNS = ("table", "row", "column", "quantity", "unit", "paper_text", "paper", "ours", "ratio", "diff_pp",
           "paper_speedup", "our_speedup", "speedup_ratio", "epoch_times", "paper_device", "variant", "our_device",
           "simulator", "our_setting", "note")
TIME_QUANTITIES = ("train_time", "epoch_time", "block_time", "test_time", "forward_time", "backward_time", "fit_time")
# quantities that compare two phases of the paper (`versus`): ours is the same comparison of two of our runs
BETWEEN_QUANTITIES = ("speedup", "expected_speedup", "time_reduction", "memory_reduction", "accuracy_gap")
# compared by their difference in percentage points, not a ratio
ACCURACY_QUANTITIES = ("test_accuracy", "train_accuracy", "expected_accuracy", "accuracy_gap")
# a cell of the paper holding two numbers ('1024 / 116 MiB'): each row says which it is
CELL_PARTS = {"host_memory": "RAM", "gpu_memory": "VRAM"}
SIMULATED = "under numba's CUDA simulator: its timing is not meaningful"


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def require_columns(frame: pd.DataFrame, columns: Sequence[str], experiment: str) -> None:
    """A one-line GpunnError when the summary frame of `experiment` lacks any of `columns`."""
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise GpunnError(f"{experiment.upper()} paper_vs_ours: our summary lacks column(s) {', '.join(absent)}; "
                         f"it has {', '.join(map(str, frame.columns))}")


def run_device(run: pd.Series) -> str:
    """The device of one of our runs; the CPU by its model where the run recorded it."""
    device = str(run.get("device", titles.UNKNOWN_DEVICE))
    cpu = run.get("cpu")
    return f"cpu ({cpu})" if device == "cpu" and isinstance(cpu, str) and cpu else device


def joined(values) -> str:
    return " vs ".join(dict.fromkeys(str(v) for v in values))


class Ours:
    """How one experiment's summary frame answers for the paper's entries: `run` finds our run standing for a paper
    phase in an entry's setting (subclasses narrow it with `candidates` and `choose`), `measure` gives our value of
    the entry's quantity from that run (each subclass), `time` the seconds its speedups compare."""

    experiment = ""
    needs: tuple[str, ...] = ()    # the summary frame's columns it reads
    base_phase: str | None = None  # the paper's CPU baseline phase: speedups of its times are over it
    time_column = "train_time_s"   # the time a speedup compares

    def __init__(self, frame: pd.DataFrame, values: Sequence[PaperValue]):
        require_columns(frame, ("device", "simulator", *self.needs), self.experiment)
        self.frame = frame
        self.values = tuple(values)  # the experiment's paper values

    # --- to give
    def candidates(self, entry: PaperValue) -> pd.DataFrame:
        """The frame's rows in the entry's setting (any variant)."""
        return self.frame

    def measure(self, entry: PaperValue, run: pd.Series) -> tuple[float | None, str]:
        raise NotImplementedError

    # --- shared
    def run(self, entry: PaperValue, phase: str) -> tuple[pd.Series | None, str]:
        """Our run of the first variant of PHASES[seed][phase] that ran in the entry's setting, and why none."""
        variants = entry.phases[phase]
        if not variants:
            return None, f"gpunn has no counterpart of the paper's {phase}"
        rows = self.candidates(entry)
        for variant in variants:
            of_variant = rows[rows["variant"] == variant]
            if not of_variant.empty:
                return self.choose(entry, phase, of_variant)
        return None, f"not run here: {' or '.join(variants)}{self.where(entry)}"

    def choose(self, entry: PaperValue, phase: str, rows: pd.DataFrame) -> tuple[pd.Series, str]:
        return rows.iloc[0], ""

    def where(self, entry: PaperValue) -> str:
        return ""

    def time(self, entry: PaperValue, run: pd.Series) -> float | None:
        """The seconds a speedup of `run` compares."""
        value = run.get(self.time_column)
        return None if missing(value) else float(value)

    def epoch_seconds(self, run: pd.Series) -> tuple[float | None, str]:
        """`run`'s seconds per epoch as the paper's epochs count them, and how they were had ('': measured)."""
        value = run.get("time_per_epoch_s")
        return (None, "") if missing(value) else (float(value), "")

    def paper_baseline(self, entry: PaperValue) -> PaperValue | None:
        """The paper's entry of its CPU baseline that a time entry's speedup is over (itself for the baseline)."""
        if self.base_phase is None or entry.quantity not in TIME_QUANTITIES:
            return None
        found = select(self.values, entry.experiment, entry.quantity, phase=self.base_phase, source=entry.source,
                       batch=entry.batch, hidden=entry.hidden, dataset=entry.dataset)
        return one_baseline(found, entry)

    def differences(self, entry: PaperValue, run: pd.Series) -> list[str]:
        """Where our run's setting differs from the paper's: ['digits8', 'batch 16', '1 epoch']."""
        differs = []
        for field in ("dataset", "batch", "epochs"):
            paper, our = getattr(entry, field), run.get(field)
            if paper is None or missing(our) or str(paper) == str(our):
                continue
            if field == "dataset" and str(paper).split(" ")[0] == str(our):
                continue  # 'cifar10 encoder features (8192)' is cifar10
            differs.append({"dataset": f"{our}", "batch": f"batch {our}",
                            "epochs": f"{our} epoch{'' if str(our) == '1' else 's'}"}[field])
        return differs

    def setting_note(self, entry: PaperValue, run: pd.Series) -> str:
        differs = self.differences(entry, run)
        return f"ours: {', '.join(differs)}" if differs else ""


def one_baseline(found: Sequence[PaperValue], entry: PaperValue) -> PaperValue | None:
    """The baseline among `found`: the one in the entry's unit, else the only one (compared in seconds)."""
    same_unit = [f for f in found if f.unit == entry.unit]
    if len(same_unit) == 1:
        return same_unit[0]
    return found[0] if len(found) == 1 else None


def scaled_time(seconds: float | None, unit: str) -> float | None:
    return None if seconds is None else seconds / TIME_UNITS[unit]


def accuracy_in(value, unit: str) -> float | None:
    """An accuracy fraction in the entry's unit (% or fraction)."""
    if missing(value):
        return None
    return 100.0 * float(value) if unit == "%" else float(value)


def epoch_loss(run: pd.Series, epoch: int | None, final_column: str) -> tuple[float | None, str]:
    """The run's mean train loss of `epoch` (its metrics.csv; None: the last epoch, the summary's)."""
    if epoch is None:
        value = run.get(final_column)
        return (None, "not recorded") if missing(value) else (float(value), "")
    if int(run["epochs"]) < epoch:
        return None, f"our run trained {int(run['epochs'])} epoch{'' if int(run['epochs']) == 1 else 's'}"
    path = run.get("metrics_csv")
    if path is None:
        return None, "per-epoch losses not available"
    losses = tables.read_table(path, ["epoch", "train_loss"], "per-epoch metrics")
    at = losses.loc[losses["epoch"] == epoch, "train_loss"]
    return (None, f"epoch {epoch} not in {path}") if at.empty else (float(at.iloc[0]), "")


def range_note(ours: float | None, entry: PaperValue, spread: tuple[float, float] | None = None) -> str:
    """Where ours falls against a range (low-high) or a target (> low); with `spread` (ours' lowest and highest over
    the runs' repeats), a bound inside it is said to be unsettled by these runs instead."""
    if ours is None:
        return ""
    low, high = entry.value, entry.upper
    if spread is not None:
        bounds = [b for b in (low, high) if b is not None and spread[0] < b < spread[1]]
        if bounds:
            return (f"ours spans {_number(spread[0])}-{_number(spread[1])} over the runs' repeats, across the paper's "
                    f"{_number(bounds[0])}: not settled by these runs")
    over = f" (ours {_number(spread[0])}-{_number(spread[1])} over the runs' repeats)" if spread is not None else ""
    if ours < low:
        return ("below the paper's range" if high is not None else "below the paper's target") + over
    if high is not None and ours > high:
        return "above the paper's range" + over
    return ("within the paper's range" if high is not None else "above the paper's target") + over


def speedup_spread(value: float | None, run: pd.Series | None, base: pd.Series | None) -> tuple[float, float] | None:
    """Our speedup's lowest and highest over the repeats of its two runs (spread.with_bands' train_time_low_s and
    train_time_high_s beside train_time_s), None where neither run was repeated."""
    if value is None or run is None or base is None:
        return None

    def factors(row):
        t, lo, hi = (row.get(c) for c in ("train_time_s", "train_time_low_s", "train_time_high_s"))
        if missing(t) or missing(lo) or missing(hi) or not t > 0:
            return None
        return lo / t, hi / t

    run_f, base_f = factors(run), factors(base)
    if run_f is None and base_f is None:
        return None
    run_f, base_f = run_f or (1.0, 1.0), base_f or (1.0, 1.0)
    return value * base_f[0] / run_f[1], value * base_f[1] / run_f[0]


def compare(entries: Sequence[PaperValue], ours: Ours) -> list[dict]:
    """One row per entry: the paper's value beside ours, their ratio or difference, speedups of times, devices."""
    rows = []
    for entry in entries:
        notes = [entry.note] if entry.note else []
        run, why = ours.run(entry, entry.phase)
        runs, whys = [run], [why]
        value = None
        if entry.quantity in BETWEEN_QUANTITIES:
            base, base_why = ours.run(entry, entry.versus)
            runs.append(base)
            whys.append(base_why)
            if run is not None and base is not None:
                value, measured_why = _between(entry, ours, run, base)
                whys.append(measured_why)
            if entry.quantity in TIMED_BETWEEN:
                row_times = _epoch_times(entry, ours, [(entry.phase, run), (entry.versus, base)])
        elif run is not None:
            value, measured_why = ours.measure(entry, run)
            whys.append(measured_why)
        # our variants and devices only where our run of the paper's phase exists (not its baseline's alone)
        runs = [r for r in runs if r is not None] if run is not None else []
        row = value_row(entry, value)
        if entry.quantity in TIMED_BETWEEN:
            row["epoch_times"], baseline_note = row_times
            notes.append(baseline_note)
        if entry.quantity in TIME_QUANTITIES:
            whys.append(_add_speedups(row, entry, ours, value, run))
        if runs:
            row.update(variant=joined(divergence.marked(r["variant"], r) for r in runs),
                       our_device=joined(run_device(r) for r in runs),
                       simulator=any(bool(r.get("simulator")) for r in runs))
            notes += [divergence.paper_note(runs), ours.setting_note(entry, runs[0])]
            # where our run's setting is not the paper's ('digits8_mini, batch 16, 1 epoch'): the entry page then
            # shows no accuracy difference, which would read as a result (gpunn.report.index)
            row["our_setting"] = ", ".join(ours.differences(entry, runs[0])) or None
            if row["simulator"] and (entry.quantity in TIME_QUANTITIES or "speedup" in entry.quantity
                                     or "reduction" in entry.quantity):
                notes.append(SIMULATED)
        notes.extend(dict.fromkeys(w for w in whys if w))
        if entry.upper_text is not None or entry.quantity.startswith("expected"):
            spread = (speedup_spread(value, run, runs[-1] if len(runs) > 1 else None)
                      if "speedup" in entry.quantity else None)
            notes.append(range_note(value, entry, spread))
        row["note"] = "; ".join(n for n in notes if n)
        rows.append(row)
    return rows


def _between(entry: PaperValue, ours: Ours, run: pd.Series, base: pd.Series) -> tuple[float | None, str]:
    """Ours for a comparison of two phases: speedup (base's time over run's), reduction (% of base's saved),
    accuracy gap (base's test accuracy minus run's, pp)."""
    if entry.quantity == "accuracy_gap":
        a, b = run.get("test_accuracy"), base.get("test_accuracy")
        return (None, "accuracy not recorded") if missing(a) or missing(b) else (100.0 * (b - a), "")
    if entry.quantity == "memory_reduction":
        return None, "gpunn does not record host memory"
    t, t_base = ours.time(entry, run), ours.time(entry, base)
    if t is None or t_base is None or t <= 0:
        return None, "no time recorded"
    if not clocks_comparable(run.get("timing_mode", "isolated"), base.get("timing_mode", "isolated")):
        return None, _apart(run, base)
    if entry.quantity == "time_reduction":
        return 100.0 * (1.0 - t / t_base), ""
    return t_base / t, ""


def value_row(entry: PaperValue, ours: float | None) -> dict:
    paper = entry.value
    ratio = None if ours is None or paper == 0 or entry.upper_text is not None else ours / paper
    diff = None
    if entry.quantity in ACCURACY_QUANTITIES and ours is not None and entry.upper_text is None:
        diff = (ours - paper) * (100.0 if entry.unit == "fraction" else 1.0)
        ratio = None
    column = entry.column or _label(entry)
    if entry.column and entry.quantity in CELL_PARTS:
        column = f"{column}: {CELL_PARTS[entry.quantity]}"
    return {"table": entry.source, "row": entry.row or entry.phase, "column": column,
            "quantity": entry.quantity, "unit": entry.unit,
            "paper_text": entry.text + (f"-{entry.upper_text}" if entry.upper_text is not None else ""),
            "paper": paper, "ours": ours, "ratio": ratio, "diff_pp": diff, "paper_speedup": None,
            "our_speedup": None, "speedup_ratio": None, "paper_device": entry.hardware, "variant": None,
            "our_device": None, "simulator": None, "our_setting": None}


def row_key(entry: PaperValue) -> dict:
    """The columns that find an entry's row in paper_vs_ours.csv: table, row, column, quantity, unit and the
    paper's text (as value_row writes them)."""
    row = value_row(entry, None)
    return {key: row[key] for key in ("table", "row", "column", "quantity", "unit", "paper_text")}


def _label(entry: PaperValue) -> str:
    """A text entry's column label: its quantity and what sets it apart ('train_loss, epoch 2')."""
    parts = [entry.quantity + (f" vs {entry.versus}" if entry.versus else "")]
    for field in ("epoch", "block", "hidden", "batch", "workers"):
        if field in ("hidden", "batch") and entry.experiment != "e2":
            continue  # the experiment's fixed setting, not what sets this entry apart
        if getattr(entry, field) is not None:
            parts.append(f"{field} {getattr(entry, field)}")
    return ", ".join(parts)


def _add_speedups(row: dict, entry: PaperValue, ours: Ours, value: float | None, run: pd.Series | None) -> str:
    """A time's speedup over the paper's CPU baseline, and ours over our run of the same baseline (none between
    clocks not timed alike: the returned note says so)."""
    base = ours.paper_baseline(entry)
    if base is None:
        return ""
    row["paper_speedup"] = base.seconds / entry.seconds
    base_run, _ = ours.run(base, base.phase)
    base_value = ours.measure(base, base_run)[0] if base_run is not None else None
    if value is None or base_value is None or value <= 0:
        return ""
    if run is not None and not clocks_comparable(run.get("timing_mode", "isolated"),
                                                 base_run.get("timing_mode", "isolated")):
        return _apart(run, base_run)
    row["our_speedup"] = base_value * TIME_UNITS[base.unit] / (value * TIME_UNITS[entry.unit])
    row["speedup_ratio"] = row["our_speedup"] / row["paper_speedup"]
    return ""


def _apart(run: pd.Series, base: pd.Series) -> str:
    modes = [f"{r['variant']} ({timing_mode({'timing_mode': r.get('timing_mode')})})" for r in (run, base)]
    return (f"no speedup: {' and '.join(modes)} were not both timed alone (config key timing), so their clocks are "
            "not shown comparable")


# speedups between two of the paper's phases: their rows show both sides' absolute times per epoch
TIMED_BETWEEN = ("speedup", "time_reduction")


def _paper_epoch(entry: PaperValue, ours: Ours, phase: str) -> PaperValue | None:
    """The paper's time per epoch of `phase` in the entry's setting (its epoch_time in seconds, else its training
    time, divided by the epochs where printed) on the entry's hardware where the paper gives it per device."""
    for quantity in ("epoch_time", "train_time"):
        found = select(ours.values, entry.experiment, quantity, phase=phase, dataset=entry.dataset, unit="s")
        same = [v for v in found if v.hardware == entry.hardware] or list(found)
        if same and (quantity == "epoch_time" or same[0].epochs):
            return same[0]
    return None


def _epoch_times(entry: PaperValue, ours: Ours, sides) -> tuple[str | None, str]:
    """'paper: GPU 0.225 s on T4, CPU 29.86 s on ...; ours: gpu-naive 0.149 s on H100, ...' for `sides`, [(phase,
    our run or None)], the phase first and its baseline second; and a note comparing the two baselines."""
    paper, our, seconds = [], [], {}
    for k, (phase, run) in enumerate(sides):
        value = _paper_epoch(entry, ours, phase)
        paper_s = None if value is None else value.seconds / (1 if value.quantity == "epoch_time" else value.epochs)
        paper.append(f"{phase} " + ("-" if paper_s is None else f"{_number(paper_s)} s on {value.hardware}"))
        our_s, how = (None, "") if run is None else ours.epoch_seconds(run)
        if run is not None:
            our.append(f"{run['variant']} " + ("-" if our_s is None else f"{_number(our_s)} s on {run_device(run)}")
                       + (f" ({how})" if how and our_s is not None else ""))
        seconds[k] = (paper_s, our_s, phase, None if run is None else run["variant"])
    if not our and all(p is None for p, *_ in seconds.values()):
        return None, ""
    text = f"per epoch, paper: {', '.join(paper)}; ours: {', '.join(our) or '-'}"
    paper_s, our_s, phase, variant = seconds[len(sides) - 1]
    if paper_s is None or our_s is None or our_s <= 0:
        return text, ""
    factor = paper_s / our_s
    which = f"{format_ratio(factor)} faster" if factor >= 1 else f"{format_ratio(1 / factor)} slower"
    return text, (f"the baselines differ: the paper's {phase} took {_number(paper_s)} s an epoch, ours ({variant}) "
                  f"{_number(our_s)} s, {which}; the speedups divide by them")


# --------------------------------------------------------------------------------------------- output
NOTE = ("Paper: the value as printed (a range as low-high). Times: ratio is ours / paper on different machines; "
        "the speedups compare them: the paper's time over its own CPU baseline's beside ours over our run of the same "
        "baseline (speedup ratio: ours / the paper's). Accuracies: diff is ours minus the paper's in percentage "
        "points. '-': not in the paper, not run here, or no counterpart in gpunn (the note says which). Both "
        "devices are named: the paper's as it states them, ours from the runs' provenance.")
# The Markdown's columns (the CSV keeps COLUMNS): values with their unit, our variant with its device
_HEADERS = {"row": "Row", "column": "Column", "paper_text": "Paper", "ours": "Ours", "ratio": "Ours / paper",
            "diff_pp": "Diff (pp)", "paper_speedup": "Paper speedup", "our_speedup": "Our speedup",
            "speedup_ratio": "Speedup ratio", "epoch_times": "Times per epoch", "paper_device": "Paper's device",
            "variant": "Our run",
            "note": "Note"}
_OPTIONAL = ("diff_pp", "paper_speedup", "our_speedup", "speedup_ratio", "epoch_times")  # shown where a section has any


def _number(value) -> str:
    text = format_significant(value, 4)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _times(value) -> str:
    return format_ratio(value)


def _points(value) -> str:
    return f"{round(float(value), 2) + 0.0:+.2f}"  # + 0.0: a difference that rounds to zero is '+0.00', not '-0.00'


def _with_unit(text: str, unit) -> str:
    """'97.95' and '%' -> '97.95 %'; a speedup's 'x' goes without a space ('4.5x')."""
    if not isinstance(unit, str) or not unit or text == tables.MISSING:
        return text
    return f"{text}{unit}" if unit == "x" else f"{text} {unit}"


def _shown(part: pd.DataFrame) -> pd.DataFrame:
    """The Markdown cells of one paper table's rows: paper and ours with their unit, our run with its device."""
    def cell(value, fmt=str):
        return tables.MISSING if tables.is_missing(value) else fmt(value)

    def our_run(variant, device):
        return cell(variant) if tables.is_missing(device) or tables.is_missing(variant) else f"{variant} on {device}"

    shown = part.copy()
    shown["paper_text"] = [_with_unit(cell(t), u) for t, u in zip(part["paper_text"], part["unit"])]
    shown["ours"] = [_with_unit(cell(o, _number), u) for o, u in zip(part["ours"], part["unit"])]
    shown["variant"] = [our_run(v, d) for v, d in zip(part["variant"], part["our_device"])]
    return shown


_FORMATS = {"ratio": _times, "paper_speedup": _times, "our_speedup": _times,
            "speedup_ratio": _times, "diff_pp": _points}


def write(rows: list[dict], out_dir, title: str, note: str | None = None) -> pd.DataFrame:
    """paper_vs_ours.csv (every row, COLUMNS) and paper_vs_ours.md (`title`, the rules, one section per paper table
    in the paper's order), both written atomically."""
    if not rows:
        raise GpunnError(f"{out_dir}/paper_vs_ours.csv: no paper values to compare")
    frame = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], columns=list(COLUMNS))
    sections = []
    for table in dict.fromkeys(frame["table"]):
        part = frame[frame["table"] == table]
        shown = [c for c in _HEADERS if c not in _OPTIONAL or part[c].notna().any()]
        sections.append(tables.markdown_section(table, _shown(part)[shown].reset_index(drop=True), _FORMATS, _HEADERS,
                                                level=3))
    head = f"## {title}\n\n{NOTE}\n" + (f"\n{note.strip()}\n" if note else "")
    io.write_csv(out_dir / "paper_vs_ours.csv", frame)
    io.write_text(out_dir / "paper_vs_ours.md", "\n".join([head, *sections]))
    return frame


def simulated_line(rows: list[dict]) -> str | None:
    """The warning under the title where any of our numbers came from the simulator."""
    if any(r.get("simulator") for r in rows):
        return (f"Rows with device {titles.SIMULATOR_DEVICE} ran under numba's CUDA simulator on the CPU: their "
                "times and speedups are not meaningful; their losses and accuracies are.")
    return None


def report(rows: list[dict], out_dir, head: str, paper: str) -> str:
    """Write one experiment's paper_vs_ours files under `head` (its runs' description), the numbers of `paper` (its
    file name); returns the md title."""
    title = f"{head}: the paper's numbers (paper {paper.split('_')[0]}) beside ours"
    write(rows, out_dir, title, simulated_line(rows))
    return title


def rows_for(ours: Ours, keep: Callable[[PaperValue], bool] = lambda e: True) -> list[dict]:
    """compare() over the experiment's paper values (ours.values) that `keep` selects, in the paper's order."""
    return compare([e for e in ours.values if keep(e)], ours)


