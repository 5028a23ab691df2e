"""The report's entry page: index.md beside the experiments' report folders (report/<machine>/index.md), its
summary table as index.csv, and index.rst, the same page as the front page of `snakemake --report`.

It opens with one "paper vs ours" table across the experiments: each experiment's headline numbers (HEADLINES:
its accuracies and its speedup, as the paper states them) beside ours, taken from the experiment's
paper_vs_ours.csv, with both devices named. An experiment that did not run (disabled in the config) is one row
saying so, and a headline whose run did not happen (no GPU, a variant not configured) keeps the reason that
paper_vs_ours gives, so that a missing number is never mistaken for a failure. A headline from a diverged run
names its variant '(diverged)', and every diverged run of the reports' tables is listed under the table
(gpunn.report.divergence). Then, per experiment, links to
its tables and figures (PNG and PDF) with the figures' captions (gpunn.report.captions), and last the device,
driver, package versions and commits that produced the numbers (each report's provenance.json,
gpunn.report.sources).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gpunn import experiments, io
from gpunn.errors import GpunnError
from gpunn.report import divergence, job_times, sources
from gpunn.report.paper_vs_ours import ACCURACY_QUANTITIES, TIME_QUANTITIES, row_key
from gpunn.report.papers import PaperValue
from gpunn.report.tables import format_ratio, format_significant

SETTING_ENDS = (", per ", ", timed on", " — ")  # where a summary title's setting ends and its timing note begins


def run_setting(report_root, experiment: str) -> str | None:
    """What the run of `experiment` trained, from the title of its summary.md ('MLP 64-16-10 on digits8 (64 train /
    360 test), batch 16, 1 epoch'): the entry page heads each experiment with it, the paper's setting beside it."""
    path = Path(report_root) / experiment / "summary.md"
    try:
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    except OSError:
        return None
    prefix = f"## {experiment.upper()}: "
    if not first.startswith(prefix):
        return None
    text = first[len(prefix):]
    cut = min((i for i in (text.find(end) for end in SETTING_ENDS) if i > 0), default=len(text))
    return text[:cut].strip() or None


# tables of a report folder, in the order the page lists them (others follow by name)
TABLE_ORDER = ("summary.md", "paper_vs_ours.md", "paper_table.md", "blocks.md", "gap.md", "step_profile.md", "jobs.md")


INDEX_COLUMNS = ("experiment", "paper_no", "headline", "paper", "ours", "comparison", "paper_device", "variant",
                 "our_device", "simulator", "note")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _number(value) -> str:
    return "-" if _missing(value) else format_significant(float(value))


def _ratio(value) -> str:
    return "-" if _missing(value) else format_ratio(value)


NOT_PAPER_SETTING = "- (not the paper's setting)"
NO_BASELINE = "- (a time on other hardware, and no baseline of the paper's to make it a speedup)"


def _comparison(entry: PaperValue, row: pd.Series) -> str:
    """How ours compares: accuracies by their difference in points where our run had the paper's setting (else
    NOT_PAPER_SETTING: the note says how ours differs), a time only by the two speedups over each side's own CPU
    (else NO_BASELINE: an absolute time on other hardware is not compared), a paper speedup by ours over it; a range
    by where ours falls (paper_vs_ours's note)."""
    if _missing(row.get("ours")):
        return "-"
    if entry.quantity in ACCURACY_QUANTITIES and not _missing(row.get("diff_pp")):
        if not _missing(row.get("our_setting")):
            return NOT_PAPER_SETTING
        return f"{round(float(row['diff_pp']), 2) + 0.0:+.2f} pp"  # + 0.0: no '-0.00' for a rounding residue
    if not _missing(row.get("paper_speedup")) and not _missing(row.get("our_speedup")):
        return (f"speedup over own CPU: paper {_ratio(row['paper_speedup'])}, "
                f"ours {_ratio(row['our_speedup'])}")
    if entry.quantity in TIME_QUANTITIES:
        return NO_BASELINE
    if not _missing(row.get("ratio")):
        return f"ours / paper {_ratio(row['ratio'])}"
    return "-"


def _with_unit(text: str, unit: str) -> str:
    """'132.7x', '97.93 %', '46 s', and a fraction bare ('0.776042')."""
    return {"x": f"{text}x", "fraction": text}.get(unit, f"{text} {unit}")


def _paper_text(entry: PaperValue) -> str:
    return _with_unit(entry.text + (f"-{entry.upper_text}" if entry.upper_text is not None else ""), entry.unit)


def _ours_text(entry: PaperValue, row: pd.Series) -> str:
    """Ours in the paper's unit; an accuracy to as many decimals as the paper prints."""
    if _missing(row.get("ours")):
        return "-"
    if entry.quantity in ACCURACY_QUANTITIES:
        return _with_unit(f"{float(row['ours']):.{entry.decimals}f}", entry.unit)
    return _with_unit(_number(row["ours"]), entry.unit)


def _paper_rows(report_root: Path, experiment: str) -> pd.DataFrame:
    path = report_root / experiment / "paper_vs_ours.csv"
    try:
        # the key columns as text: '1.00' must not become 1.0
        return pd.read_csv(path, dtype={c: str for c in ("table", "row", "column", "quantity", "unit", "paper_text")})
    except FileNotFoundError:
        raise GpunnError(f"{path}: missing; build {experiment.upper()}'s report first "
                         f"(snakemake report_{experiment})") from None
    except pd.errors.EmptyDataError:
        raise GpunnError(f"{path}: empty; delete it and rerun report_{experiment}") from None


def headline_rows(report_root, ran: list[str], not_run: dict[str, str]) -> list[dict]:
    """The summary table: each headline of an experiment that ran, from its paper_vs_ours.csv; one row per
    experiment that did not (with the reason in `not_run`)."""
    report_root = Path(report_root)
    rows = []
    for found in experiments.ALL:
        experiment, paper_no = found.name, found.paper.split("_")[0]
        if experiment not in ran:
            reason = not_run.get(experiment, "not run in this configuration")
            rows.append({"experiment": experiment.upper(), "paper_no": paper_no, "headline": "-", "paper": "-",
                         "ours": "-", "comparison": "-", "note": f"not run: {reason}"})
            continue
        if not found.headlines:  # an experiment without a paper's number to show (docs/development.md: How to extend)
            continue
        table = _paper_rows(report_root, experiment)
        for headline in found.headlines:
            entry = found.headline_value(headline)
            key = {k: v for k, v in row_key(entry).items() if headline.match is None or k in headline.match}
            match = table
            for column, value in key.items():
                match = match[match[column].astype(str) == str(value)]
            if len(match) > 1 and match["ours"].notna().any():
                match = match.sort_values("ours", ascending=False, na_position="last")
            if match.empty:
                raise GpunnError(f"{report_root / experiment / 'paper_vs_ours.csv'}: no row for the paper's "
                                 f"'{headline.label}' ({', '.join(map(str, key.values()))}); rerun report_{experiment}")
            row = match.iloc[0]
            rows.append({
                "experiment": experiment.upper(), "paper_no": paper_no, "headline": headline.label,
                "paper": _paper_text(entry), "ours": _ours_text(entry, row), "comparison": _comparison(entry, row),
                "paper_device": entry.hardware,
                "variant": "-" if _missing(row.get("variant")) else row["variant"],
                "our_device": "-" if _missing(row.get("our_device")) else row["our_device"],
                "simulator": bool(row.get("simulator")) if not _missing(row.get("simulator")) else False,
                # a speedup between two phases: both sides' times per epoch first (paper_vs_ours' epoch_times)
                "note": "; ".join(str(row[c]) for c in ("epoch_times", "note") if not _missing(row.get(c))),
            })
    return [{column: row.get(column, "-") for column in INDEX_COLUMNS} for row in rows]


def provenance_records(report_root, ran: list[str]) -> list[dict]:
    """The distinct provenance records of the experiments' reports, each with the experiments that used it."""
    return sources.merge(((experiment.upper(), record) for experiment in ran
                          for record in sources.read(Path(report_root) / experiment / sources.PROVENANCE)["sources"]),
                         label="experiments")


def _experiment_files(report_root: Path, experiment: str) -> tuple[list[str], list[str]]:
    folder = report_root / experiment
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    tables = [n for n in TABLE_ORDER if n in names] + [n for n in names if n.endswith(".md") and n not in TABLE_ORDER]
    found = experiments.get(experiment)
    order = list(found.captions)  # the report's own order
    figures = sorted((n for n in names if n.endswith(".png")), key=lambda n: (order.index(found.caption_key(n)), n))
    return tables, figures


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_cell(row.get(key, "")) for key, _ in columns) + " |" for row in rows]
    return "\n".join(lines)


SUMMARY_COLUMNS = [("experiment", "Experiment"), ("paper_no", "Paper no."), ("headline", "Headline"),
                   ("paper", "Paper"), ("ours", "Ours"), ("comparison", "Ours vs paper"),
                   ("paper_device", "Paper's device"),
                   ("variant", "Our variant"), ("our_device", "Our device"), ("note", "Note")]
PROVENANCE_COLUMNS = [("device", "Device"), ("driver", "Driver"), ("simulator", "Simulator"), ("cpu", "CPU"),
                      ("python", "Python"), ("numpy", "NumPy"), ("numba", "numba"), ("numba_cuda", "numba-cuda"),
                      ("snakemake", "Snakemake"), ("commit", "Commit"), ("experiments", "Experiments")]


def _provenance_cells(records: list[dict]) -> list[dict]:
    return [{**r, "experiments": ", ".join(r["experiments"]),
             **{k: ("-" if _missing(r.get(k)) else r[k]) for k in sources.RECORD_KEYS}} for r in records]


def _devices_line(records: list[dict]) -> str:
    devices = list(dict.fromkeys(str(r["device"]) for r in records))
    commits = list(dict.fromkeys(str(r.get("commit")) for r in records))
    return (f"Numbers from {', '.join(devices) or 'no runs'}; code at commit{'s' if len(commits) > 1 else ''} "
            f"{', '.join(commits) or '-'} (details under Provenance).")


def _simulated_line(rows: list[dict]) -> str | None:
    if any(r.get("simulator") is True for r in rows):
        return ("Rows whose device is cuda-simulator ran under numba's CUDA simulator on the CPU: their times and "
                "speedups are not meaningful; their accuracies and losses are.")
    return None


def markdown(report_root, ran, not_run, rows, records, notes=(), machine: str = "") -> str:
    """index.md: `rows` from headline_rows, `records` from provenance_records."""
    report_root = Path(report_root)
    parts = [f"# gpunn report{f' ({machine})' if machine else ''}: the papers' numbers beside ours", "",
             _devices_line(records), ""]
    parts += ["## Paper vs ours", "",
              "Each experiment's headline numbers as its paper prints them, beside ours from the same setting where we "
              "ran it. Accuracies compare by their difference in points, only where our run had the paper's "
              "setting (otherwise '- (not the paper's setting)', and the note says how ours differs: a smoke run's "
              "tiny dataset or single epoch is no reproduction); times only through speedups over each side's own "
              "CPU baseline (a T4 is not an H100), so a time without a baseline of the paper's is shown, not "
              "compared; a paper's speedup against ours over our own runs. "
              "'-' with a note: not run here, and why (never a failure). Every number of every paper: each "
              "experiment's paper_vs_ours.md.", "", _md_table(rows, SUMMARY_COLUMNS), ""]
    extra = [line for line in (*notes, _simulated_line(rows)) if line]
    if extra:
        parts += [f"- {line}" for line in extra] + [""]
    diverged = divergence.index_lines(report_root, ran)
    if diverged:
        parts += ["## Diverged runs", "", "These runs diverged (a loss not finite, or an epoch's train loss over "
                  f"{divergence.DIVERGENCE_FACTOR:g}x the first's) and were kept by keep_diverged: their numbers, "
                  "marked diverged wherever they appear, are not results.", ""] + [f"- {line}" for line in diverged]
        parts.append("")
    for experiment, name, heading, paragraph in quoted_paragraphs(report_root, ran):
        parts += [f"## {experiment.upper()}'s {heading}", "", paragraph, "",
                  f"Details: [{experiment}/{name}]({experiment}/{name}).", ""]
    parts += wall_time_section(report_root, ran, records=records)
    parts += ["## Experiments", ""]
    for found in experiments.ALL:
        experiment, paper_no = found.name, found.paper.split("_")[0]
        ours = run_setting(report_root, experiment) if experiment in ran else None
        heading = f"{ours} (paper {paper_no}: {found.title})" if ours else f"{found.title} (paper {paper_no})"
        parts += [f"### {experiment.upper()}: {heading}", ""]
        if experiment not in ran:
            parts += [f"Not run: {not_run.get(experiment, 'not run in this configuration')}.", ""]
            continue
        tables, figures = _experiment_files(report_root, experiment)
        parts += ["Tables: " + ", ".join(f"[{n[:-3]}]({experiment}/{n})" for n in tables) + ".", ""]
        for name in figures:
            pdf = name[:-4] + ".pdf"
            pdf_link = f" ([PDF]({experiment}/{pdf}))" if (report_root / experiment / pdf).is_file() else ""
            parts.append(f"- [{name}]({experiment}/{name}){pdf_link}: {found.caption(name).text()}")
        parts.append("")
    parts += ["## Provenance", "",
              "Every device, driver, package version and commit the reports' inputs were produced with (from each "
              "run's metrics.json and the timing CSVs; '-dirty': uncommitted changes; driver '-': not a GPU run).",
              "", _md_table(_provenance_cells(records), PROVENANCE_COLUMNS), ""]
    return "\n".join(parts)


WALL_TIME_COLUMNS = [("experiment", "Experiment"), ("jobs", "Jobs"), ("wall", "Wall time"),
                     ("job_sum", "Job time (sum)"), ("longest", "Longest jobs")]


def wall_time_section(report_root, ran, heading: str = "## How long it took",
                      records: list[dict] | None = None) -> list[str]:
    """The page's "How long it took" section as Markdown lines: "The run" (job_times.run_lines: wall time, machine
    from `records`, provenance_records by default, timing mode, longest jobs), then the wall-time table
    (job_times.summary_rows); none when no report has its jobs table."""
    rows = job_times.summary_rows(report_root, ran)
    if not rows:
        return []
    records = provenance_records(report_root, ran) if records is None else records
    return [heading, "", *job_times.run_lines(rows[-1], records), job_times.SUMMARY_TEXT, "",
            _md_table(rows, WALL_TIME_COLUMNS), ""]


def quoted_paragraphs(report_root, ran) -> list[tuple[str, str, str, str]]:
    """(experiment, file, heading, its first paragraph) of every file an experiment that ran has the entry page quote
    (Experiment.quoted: E1's gap.md), where its report wrote it."""
    found = []
    for experiment in (e for e in experiments.ALL if e.name in ran):
        for name, heading in experiment.quoted:
            path = Path(report_root) / experiment.name / name
            if path.is_file():
                found.append((experiment.name, name, heading, _first_paragraph(path.read_text())))
    return found


def _first_paragraph(text: str) -> str:
    """The first paragraph of a Markdown file that is not a heading or a table."""
    for block in text.split("\n\n"):
        block = block.strip()
        if block and not block.startswith(("#", "|")):
            return block
    return ""


def _rst_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    def cell(value) -> str:
        text = " ".join(str(value).split()) or "-"
        return text.replace("*", "\\*").replace("`", "'").replace("|", "/")

    lines = [".. list-table::", "   :header-rows: 1", ""]
    for values in [[t for _, t in columns]] + [[row.get(k, "") for k, _ in columns] for row in rows]:
        for j, value in enumerate(values):
            lines.append(f"   {'* -' if j == 0 else '  -'} {cell(value)}")
    return "\n".join(lines)


def rst(report_root, ran, rows, records, notes=(), machine: str = "") -> str:
    """The entry page for `snakemake --report`: the summary table and the provenance; the figures are in the
    report's categories (one per experiment), each with its caption."""
    report_root = Path(report_root)
    title = f"gpunn: the papers' numbers beside ours{f' ({machine})' if machine else ''}"
    parts = [title, "=" * len(title), "", _devices_line(records), "",
             "Each experiment's headline numbers as its paper prints them, beside ours. Every figure is in the "
             "experiment's category below, with a caption saying which paper figure it mirrors; every table is in "
             f"``report/{machine or '<machine>'}/<experiment>/`` (``index.md`` links them all).", "",
             _rst_table(rows, SUMMARY_COLUMNS), ""]
    parts += [f"* {line}" for line in (*notes, _simulated_line(rows)) if line]
    parts += [f"* Diverged, kept by keep_diverged, not results: {line}" for line in
              divergence.index_lines(report_root, ran, links=False)]
    for experiment, _, heading, paragraph in quoted_paragraphs(report_root, ran):
        parts += ["", f"{experiment.upper()}'s {heading}: " + " ".join(paragraph.split()).replace("`", "'")]
    parts += ["", "Provenance", "----------", "", _rst_table(_provenance_cells(records), PROVENANCE_COLUMNS), ""]
    # Snakemake renders this page as a Jinja template: nothing in it may read as a Jinja tag
    return "\n".join(parts).replace("{{", "{ {").replace("{%", "{ %")


def write(out_dir, ran, not_run=None, notes=(), machine: str = "") -> dict[str, Path]:
    """Write index.md, index.csv and index.rst into `out_dir` (report/<machine>/, holding the experiments'
    report folders); every file is written only after all three are built."""
    out_dir = Path(out_dir)
    not_run = dict(not_run or {})
    unknown = [e for e in [*ran, *not_run] if e not in experiments.BY_NAME]
    if unknown:
        raise GpunnError(f"index: unknown experiment(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(experiments.BY_NAME)}")
    rows = headline_rows(out_dir, ran, not_run)
    records = provenance_records(out_dir, ran)
    page = markdown(out_dir, ran, not_run, rows, records, notes, machine)
    front = rst(out_dir, ran, rows, records, notes, machine)
    table = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    paths = {name: out_dir / name for name in ("index.md", "index.csv", "index.rst")}
    io.write_text(paths["index.md"], page)
    io.write_csv(paths["index.csv"], table)
    io.write_text(paths["index.rst"], front)
    return paths
