"""The README's Results section, generated from a published entry page (docs/results/<machine>/, gpunn.publish): the
device, driver, package versions and commit, what each experiment ran on, every headline row with the paper beside
ours, and the wall times. It sits between two marker lines, which name the folder it came from, so that
`gpunn publish --readme README.md` refreshes it and a test can check that it still matches that folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

from gpunn import experiments, io
from gpunn.errors import GpunnError
from gpunn.report import index

BEGIN = "<!-- gpunn publish: begin {folder} (generated from {folder}/index.md by gpunn publish; do not edit) -->"
END = "<!-- gpunn publish: end -->"
BEGIN_PATTERN = re.compile(r"<!-- gpunn publish: begin (\S+) .*?-->")
HEADLINE_COLUMNS = [c for c in index.SUMMARY_COLUMNS if c[0] != "paper_no"]


def _ran(folder: Path) -> list[str]:
    return [e for e in experiments.NAMES if (folder / e / "provenance.json").is_file()]


def _provenance_line(records: list[dict]) -> str:
    gpus = [r for r in records if r.get("driver")]
    cpus = list(dict.fromkeys(str(r["cpu"]) for r in records if r.get("cpu")))
    devices = list(dict.fromkeys(f"{r['device']} ({r['driver']})" for r in gpus)) or ["no GPU"]
    commits = list(dict.fromkeys(str(r.get("commit")) for r in records))
    versions = list(dict.fromkeys(f"numba-cuda {r.get('numba_cuda')}, numpy {r.get('numpy')}" for r in gpus or records))
    return (f"GPU: {', '.join(devices)}; CPU baselines on {', '.join(cpus) or '-'}; {'; '.join(versions)}; code at "
            f"commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}.")


def section(folder, readme_dir=".") -> str:
    """The Results section's generated text for the published entry page in `folder`, its links relative to
    `readme_dir` (the README's folder)."""
    folder = Path(folder)
    page = folder / "index.md"
    if not page.is_file():
        raise GpunnError(f"{page}: missing; publish a results tree there first (gpunn publish --to {folder})")
    link = Path(os.path.relpath(folder, readme_dir)).as_posix()
    ran = _ran(folder)
    records = index.provenance_records(folder, ran)
    rows = pd.read_csv(folder / "index.csv", dtype=str, keep_default_na=False).to_dict("records")
    lines = [BEGIN.format(folder=link), "",
             f"From [`{link}/index.md`]({link}/index.md), which links every table and figure: one results tree with "
             f"{len(ran)} of the {len(experiments.NAMES)} experiments. {_provenance_line(records)}", ""]
    for experiment in experiments.NAMES:
        if experiment in ran:
            setting = index.run_setting(folder, experiment) or experiments.get(experiment).title
            lines.append(f"- {experiment.upper()}: {setting} ([summary]({link}/{experiment}/summary.md))")
        else:
            lines.append(f"- {experiment.upper()}: not run")
    notes = _notes(page)
    lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    lines += [index._md_table(rows, HEADLINE_COLUMNS), ""]
    for experiment, name, heading, paragraph in index.quoted_paragraphs(folder, ran):
        lines += [f"**{experiment.upper()}'s {heading}** ([{name}]({link}/{experiment}/{name})): {paragraph}", ""]
    lines += [line.replace("## How long it took", "**How long it took.**")
              for line in index.wall_time_section(folder, ran, records=records)]
    lines.append(END)
    return "\n".join(lines)


def _notes(page: Path) -> list[str]:
    """The notes under the entry page's summary table (config facts: synthetic data, the simulator...)."""
    text = page.read_text(encoding="utf-8")
    block = text.split("## Paper vs ours", 1)[-1].split("\n## ", 1)[0]
    return [line[2:] for line in block.splitlines() if line.startswith("- ")]


def _span(text: str, path) -> tuple[int, int, str]:
    match = BEGIN_PATTERN.search(text)
    end = text.find(END)
    if not match or end < match.start():
        raise GpunnError(f"{path}: no generated Results section (a line '<!-- gpunn publish: begin <folder> ... -->' "
                         f"and a later '{END}'); add the two lines where it belongs")
    return match.start(), end + len(END), match.group(1)


def current(readme_path) -> tuple[str, str]:
    """(the README's generated section as it stands, the folder it names)."""
    text = Path(readme_path).read_text(encoding="utf-8")
    start, end, folder = _span(text, readme_path)
    return text[start:end], folder


def write(readme_path, folder) -> None:
    """Replace the README's generated section by the one of the entry page in `folder`."""
    readme_path = Path(readme_path)
    text = readme_path.read_text(encoding="utf-8")
    start, end, _ = _span(text, readme_path)
    io.write_text(readme_path, text[:start] + section(folder, readme_path.parent) + text[end:])
