"""Diverged and at-chance runs in the reports. A run whose loss diverged (gpunn.epochs.DivergenceRule) is only
written when its experiment keeps diverged runs (keep_diverged); every report then marks it `diverged`: a
`diverged` column in the summary tables, '(diverged)' after its name in figure legends and in paper_vs_ours
(with a note), and a list on the entry page. A classifier that ends at chance, test accuracy below
CHANCE_FACTOR / classes (15 % for 10 classes; paper 001's failed block 1024 sits at 10 %), is flagged `at_chance`
in its summary row, diverged or not.

    run_fields(summary)         diverged, diverged_epoch, diverged_reason, at_chance of a run's metrics.json
    flags(values)               a boolean column as read back from a CSV
    diverged_in(frame, key)     the values of `key` over a table's diverged rows (figures mark them)
    marked(label, run)          'gpu-naive (diverged)' where the run diverged
    legend(frame, key)          {label: marked label} of the diverged rows, for a figure's legend
    summary_note(frame)         what the flags mean, under a summary table that has any
    paper_note(runs)            the note of a paper_vs_ours row whose runs include a diverged one
    index_lines(report_root, experiments, links)   the entry page's list of diverged runs
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gpunn.epochs import DIVERGENCE_FACTOR
from gpunn.nn.models import MODELS

CHANCE_FACTOR = 1.5  # test accuracy below CHANCE_FACTOR / classes: at chance
DIVERGED = "diverged"
# the columns that tell one run of a summary table from another, as the entry page names a diverged run
RUN_KEYS = ("variant", "reduction", "dataset", "hidden", "widths", "batch", "block")
FLAGGED_TABLES = ("summary.csv", "blocks.csv")  # the report tables with a row per run


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def run_fields(summary: dict) -> dict:
    """From a run's metrics.json: whether it diverged (false for runs recorded before the rule), the first
    diverged epoch and the rule's reason, and whether it ended at chance (None for the autoencoder)."""
    classes, accuracy = summary.get("num_classes"), summary.get("final_test_accuracy")
    model = MODELS.get(summary.get("spec", {}).get("model"))
    classifier = (model is None or model.classifier) and bool(classes)
    at_chance = None
    if classifier and not _missing(accuracy):
        at_chance = bool(float(accuracy) < CHANCE_FACTOR / int(classes))
    return {"diverged": bool(summary.get("diverged", False)), "diverged_epoch": summary.get("diverged_epoch"),
            "diverged_reason": summary.get("diverged_reason"), "at_chance": at_chance}


def flags(values) -> list[bool]:
    """A boolean column, also as read back from a CSV (True / 'True' / 1); missing values are false."""
    return [str(v).strip().lower() in ("true", "1") for v in values]


def diverged_in(frame: pd.DataFrame, key: str = "variant") -> set[str]:
    """The values of `key` (as text) over the rows of `frame` that diverged; none without a `diverged` column."""
    if DIVERGED not in frame or key not in frame:
        return set()
    return {str(v) for v, flag in zip(frame[key], flags(frame[DIVERGED])) if flag}


def marked(label: str, run) -> str:
    """`label` followed by '(diverged)' where `run` (a row or a dict with a `diverged` flag) diverged."""
    return f"{label} ({DIVERGED})" if flags([run.get(DIVERGED, False)])[0] else str(label)


def legend(frame: pd.DataFrame, key: str = "variant") -> dict[str, str]:
    """{label: 'label (diverged)'} for the values of `key` whose runs diverged: a figure's legend texts."""
    return {label: f"{label} ({DIVERGED})" for label in sorted(diverged_in(frame, key))}


def summary_note(frame: pd.DataFrame) -> str | None:
    """What `diverged` and `at_chance` mean, under a summary table where any run has either; None otherwise."""
    diverged = any(flags(frame[DIVERGED])) if DIVERGED in frame else False
    at_chance = any(flags(frame["at_chance"])) if "at_chance" in frame else False
    if not (diverged or at_chance):
        return None
    return (f"diverged: the run's loss stopped being finite or rose over {DIVERGENCE_FACTOR:g}x its first epoch's "
            "(gpunn.epochs) and the run was kept (keep_diverged): its numbers are not results. at_chance: test "
            f"accuracy below {CHANCE_FACTOR:g} / classes.")


def paper_note(runs) -> str:
    """The note of a paper_vs_ours row when any of its runs diverged ('' otherwise)."""
    epochs = [run.get("diverged_epoch") for run in runs if flags([run.get(DIVERGED, False)])[0]]
    if not epochs:
        return ""
    at = ", ".join(f"epoch {int(e)}" for e in epochs if not _missing(e))
    return f"our run diverged{f' at {at}' if at else ''} (kept by keep_diverged): not a result"


def index_lines(report_root, experiments, links: bool = True) -> list[str]:
    """One line per diverged run in the experiments' report tables (FLAGGED_TABLES): 'E4: gpu-naive, dataset
    mnist, block 1024 (e4/blocks.md)', the table as a Markdown link with `links`."""
    lines = []
    for experiment in experiments:
        for name in FLAGGED_TABLES:
            path = Path(report_root) / experiment / name
            if not path.is_file():
                continue
            table = pd.read_csv(path)
            if DIVERGED not in table:
                continue
            for _, row in table[flags(table[DIVERGED])].iterrows():
                keys = [f"{row[k]}" if k == "variant" else f"{k} {row[k]}" for k in RUN_KEYS
                        if k in table and not _missing(row[k]) and not (k == "block" and row[k] == 0)]
                table_md = f"{experiment}/{name[:-4]}.md"
                where = f"[{table_md}]({table_md})" if links else table_md
                lines.append(f"{experiment.upper()}: {', '.join(keys)} ({where})")
    return lines
