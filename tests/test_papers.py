"""The papers' numbers (gpunn.report.papers) against the seed files themselves: every entry's text stands where
its anchor says, every table entry in its cell (row and column as printed); a handful of headline numbers typed
here a second time; the entries well formed; the report's seed constants taken from them."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from gpunn import experiments
from gpunn.backends.registry import VARIANTS
from gpunn.errors import GpunnError
from gpunn.experiments import PAPER_VALUES, e3, e4, e5, paper_value, paper_values
from gpunn.report import papers
from gpunn.report.papers import QUANTITIES, UNITS
from gpunn.svm import METHODS as SVM_METHODS

PAPERS = {e.name: e.paper for e in experiments.ALL}  # experiment -> its paper's file

# ../shared/seeds beside the checkout, as the real datasets in ../shared/data/real (tests/test_data_real.py): a
# checkout without it (a CI clone elsewhere) skips these tests with that reason instead of passing them
SEED_DIR = Path(__file__).resolve().parents[2] / "shared" / "seeds"
needs_seeds = pytest.mark.skipif(not SEED_DIR.is_dir(), reason=f"the seed papers are not here ({SEED_DIR} is absent)")
WINDOW = 2500  # characters after an anchor (before a caption) within which a running-text value must stand
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")  # 29,678.00 / 0.924141 / 8 (of '8*')


def _printed_in(printed: str, text: str) -> bool:
    """`printed` stands in `text` as a whole number ('0.1' is not in '0.12'); other notations ('1e-4') as text."""
    if NUMBER.fullmatch(printed):
        return printed in NUMBER.findall(text)
    return printed in text


def _seed_text(seed: str) -> str:
    return (SEED_DIR / seed).read_text(encoding="utf-8")


def _anchor_span(text: str, anchor) -> tuple[int, int]:
    """Start and end of the last anchor string, each found after the one before."""
    start = end = 0
    for part in anchor:
        start = text.find(part, end)
        assert start >= 0, f"anchor {part!r} not found after {anchor[:anchor.index(part)]}"
        end = start + len(part)
    return start, end


def _table_lines(text: str, entry) -> list[str]:
    """The tab-separated lines of the table the entry's anchor names: after it, or right above a caption."""
    start, end = _anchor_span(text, entry.anchor)
    if entry.caption_below:
        lines = text[:start].splitlines()[::-1]
    else:
        lines = text[end:].splitlines()[1:]
    table = []
    for line in lines:
        if "\t" in line:
            if table and line.startswith("Batch size"):  # paper 002: the next table's title row
                break
            table.append(line)
        elif line.strip() and table:
            break  # the first text line after the table ends it (blank lines may split a table)
    return table[::-1] if entry.caption_below else table


def _cell(text: str, entry) -> str:
    lines = [[cell.strip() for cell in line.split("\t")] for line in _table_lines(text, entry)]
    header = next(cells for cells in lines if entry.column in cells)
    rows = [cells for cells in lines if cells[0] == entry.row]
    if entry.workers is not None:  # paper 001's Tables 1-2 repeat a device per DataLoader setting
        rows = [r for r in rows if r[header.index("Num workers")].rstrip("*") == str(entry.workers)
                and r[header.index("Pin memory")] == {None: "-", True: "True", False: "False"}[entry.pin_memory]]
    assert len(rows) == 1, f"{entry.source}: {len(rows)} rows labelled {entry.row!r}"
    return rows[0][header.index(entry.column)]


@needs_seeds
@pytest.mark.parametrize("seed", sorted(set(PAPERS.values())))
def test_every_value_stands_in_its_seed_where_its_entry_says(seed):
    text = _seed_text(seed)
    entries = [e for e in PAPER_VALUES if e.paper == seed]
    assert len(entries) >= 2
    cells = 0
    for entry in entries:
        start, end = _anchor_span(text, entry.anchor)
        near = text[max(0, start - WINDOW):start] if entry.caption_below else text[end:end + WINDOW]
        for printed in filter(None, (entry.text, entry.upper_text)):
            assert _printed_in(printed, near), f"{entry.source}: {printed!r} not within {WINDOW} characters"
        if entry.row is not None and entry.column is not None:
            cell = _cell(text, entry)
            assert _printed_in(entry.text, cell), f"{entry.source}, {entry.row} / {entry.column}: {cell!r}"
            cells += 1
    if seed != e3.PAPER:  # the plan has no tables
        assert cells >= 3


@needs_seeds
def test_seed_003_plans_its_batch_sizes():
    section = _seed_text(e3.PAPER).split("Benchmarking Plan", 1)[1]
    assert f"Batch sizes: {', '.join(map(str, e3.E3_PLAN_BATCHES))}." in section


# headline numbers typed again from the seeds (../shared/ANCHORS.md, section 1 quotes most of them)
HEADLINES = [
    (("e1", "train_time"), dict(phase="CPU", unit="s"), "298.62"),
    (("e1", "train_time"), dict(phase="GPU", unit="ms"), "2247.11"),
    (("e1", "test_accuracy"), dict(phase="CPU"), "97.93"),
    (("e1", "test_accuracy"), dict(phase="GPU"), "93.86"),
    (("e1", "speedup"), dict(phase="GPU"), "132.7"),
    (("e1", "train_loss"), dict(phase="CPU", epoch=10), "0.0045"),
    (("e2", "train_time"), dict(phase="Serial", batch=64, hidden=256), "640.129"),
    (("e2", "train_time"), dict(phase="Naive", batch=128, hidden=32), "1.13883"),
    (("e2", "test_accuracy"), dict(phase="Optimization #1", batch=128, hidden=256), "0.316051"),
    (("e2", "forward_time"), dict(phase="Optimization #2", batch=32, hidden=32), "0.842789"),
    (("e3", "expected_speedup"), {}, "5"),
    (("e4", "train_time"), dict(phase="naive", dataset="mnist", row="A40"), "23.47"),
    (("e4", "train_time"), dict(phase="optimized", dataset="mnist", row="A40"), "5.18"),
    (("e4", "test_accuracy"), dict(phase="optimized", dataset="fashion_mnist", row="V100"), "87.53"),
    (("e4", "test_time"), dict(phase="naive", dataset="fashion_mnist", row="V100"), "0.12"),
    (("e4", "train_time"), dict(phase="PyTorch CPU", dataset="mnist", workers=4), "159.26"),
    (("e4", "train_loss"), dict(block=1024), "2.303"),
    (("e5", "epoch_time"), dict(source=e5.E5_EPOCH_TABLE, phase="GPU optimized v2"), "117.97"),
    (("e5", "speedup"), dict(source=e5.E5_EPOCH_TABLE, phase="GPU optimized v2", versus="CPU"), "251.57"),
    (("e5", "train_time"), dict(source=e5.E5_TOTAL_TABLE, phase="GPU naive"), "19,832.6"),
    (("e5", "gpu_memory"), dict(phase="GPU optimized v2"), "88"),
    (("e6", "test_accuracy"), {}, "67.56"),
    (("e6", "train_accuracy"), {}, "86.03"),
    (("e6", "fit_time"), {}, "46"),
]


@pytest.mark.parametrize("selection,fields,printed", HEADLINES)
def test_headline_numbers(selection, fields, printed):
    assert paper_value(*selection, **fields).text == printed


def test_entries_are_well_formed():
    assert Counter(e.experiment for e in PAPER_VALUES).keys() == set(PAPERS)
    for entry in PAPER_VALUES:
        where = f"{entry.paper} {entry.source} {entry.row} {entry.column} {entry.quantity}"
        assert PAPERS[entry.experiment] == entry.paper, where
        assert entry.quantity in QUANTITIES and entry.unit in UNITS, where
        assert entry.hardware.strip() and entry.source.strip() and entry.anchor, where
        assert entry.phase in entry.phases and (entry.versus is None or entry.versus in entry.phases), where
        if entry.quantity in ("speedup", "expected_speedup", "time_reduction", "memory_reduction", "accuracy_gap"):
            assert entry.versus is not None, where  # a comparison names what it compares with
        assert entry.value >= 0 and (entry.upper is None or entry.upper > entry.value), where
        assert (entry.row is None) == (entry.column is None), where
        assert entry.seconds is not None or entry.unit not in papers.TIME_UNITS, where
    for ours in (v for e in PAPER_VALUES for variants in e.phases.values() for v in variants):
        assert ours in VARIANTS or ours in SVM_METHODS  # E6: our SVM methods
    assert [e.decimals for e in paper_values("e1", "train_time", phase="CPU")] == [2, 2]  # 298617.53 ms, 298.62 s
    assert paper_value("e5", "train_time", source=e5.E5_TOTAL_TABLE, phase="CPU").value == 593560.0


@needs_seeds
def test_every_seed_file_exists():
    assert {SEED_DIR / seed for seed in PAPERS.values()} == set(SEED_DIR.glob("00*.txt"))


def test_queries_refuse_unknown_fields_and_ambiguity():
    assert len(paper_values("e2")) == 4 * 3 * 4 * 4 + 4  # four implementations x 3 batches x 4 rows x 4 hidden, + text
    assert paper_values("e4", "test_accuracy", row="V100", dataset="mnist", phase="naive")[0].text == "97.26"
    with pytest.raises(GpunnError, match="no field colour"):
        paper_values("e1", colour="red")
    with pytest.raises(GpunnError, match="2 values of e1 train_time"):
        paper_value("e1", "train_time", phase="CPU")


def test_report_constants_come_from_the_papers():
    epochs = paper_values("e5", "epoch_time", source=e5.E5_EPOCH_TABLE)
    assert {e.ours[0]: e.value for e in epochs} == e5.E5_PAPER_EPOCH_S
    assert e5.E5_PAPER_EPOCH_S == {"cpu-numpy": 29678.0, "gpu-naive": 991.63, "gpu-tiled": 517.18,
                                           "gpu-im2col": 117.97}
    assert [e5.E5_PHASES[e.ours[0]] for e in epochs] == [e.phase for e in epochs]
    assert list(e5.E5_PHASES) == ["cpu-numpy", "gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph", "gpu-tf32",
                                  "gpu-bf16"]
    table_3 = papers.column_labels(e4.PAPER_VALUES, "Table 3")
    assert [e4.E4_PAPER_HEADERS[c] for c in ("train_time_s", "test_time_s", "test_accuracy")] == list(table_3)
    assert table_3 == ("Training Time [s]", "Testing Time [s]", "Test Accuracy")
