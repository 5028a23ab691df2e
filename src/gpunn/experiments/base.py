"""An experiment as one record (`Experiment`): what it trains for a config, what its report writes, and the
papers' numbers it compares with. Each gpunn.experiments.eN module builds one; gpunn.experiments is their
registry, which the workflow's targets, the config checks, the report and its entry page iterate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunn.report.captions import Caption, caption_key
from gpunn.report.papers import PaperValue, select, select_one
from gpunn.runspec import RunSpec


@dataclass(frozen=True)
class Headline:
    """One number of a paper on the entry page: `select` picks its PaperValue among the experiment's."""

    experiment: str
    label: str
    quantity: str
    select: dict = field(default_factory=dict)
    # paper_vs_ours.csv columns that find its row (None: all of paper_vs_ours.row_key); where several rows match
    # (E3: one per GPU variant and large batch) the one with the largest value of ours stands for it
    match: tuple[str, ...] | None = None


def as_list(value) -> list:
    """A config value that is one item or a list of them, as a list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def no_runs(config: dict) -> list[RunSpec]:
    return []


def with_repeats(specs: list[RunSpec], runs: int) -> list[RunSpec]:
    """`specs`, then `runs` - 1 more runs (RunSpec.repeat 1, 2, ...) of each spec whose variant is not deterministic:
    the same spec, init and batch order, differing only in the order of the variant's float atomics. Reports read
    them only for the run-to-run spread (gpunn.report.spread); every table shows the specs' own runs."""
    from dataclasses import replace

    from gpunn.backends.registry import is_deterministic

    return list(specs) + [replace(spec, repeat=k) for k in range(1, runs)
                          for spec in specs if not is_deterministic(spec.variant)]


def first_run_per_dataset(runs: list[RunSpec]) -> list[RunSpec]:
    """The first of `runs` on each dataset: the run of the first listed variant, the reference, whose evaluation a
    report shows (its sample figure)."""
    shown: dict[str, RunSpec] = {}
    for spec in runs:
        shown.setdefault(spec.dataset, spec)
    return list(shown.values())


@dataclass(frozen=True)
class Experiment:
    """One experiment: its plan (runs, report files and inputs for a config) and its report (tables, figures,
    captions, headline rows, the paper's values). Functions take the validated config (gpunn.config)."""

    name: str                                        # e1 ... : the target rule, the config block, the report folder
    title: str                                       # on the entry page
    description: str                                 # one line: what `snakemake <name>` builds
    model: str | None                                # the model it trains (None: it trains none of its own)
    paper: str                                       # the paper's file name under ../shared/seeds
    runs: Callable[[dict], list[RunSpec]]            # its training runs
    tables: Callable[[dict], list[str]]              # its report's tables (each .csv and .md), by name
    figures: Callable[[dict], list[str]]             # its report's figures (each .png and .pdf), PNG names
    report: Callable[..., dict[str, str]]            # writes them (gpunn.report.build.make_report calls it)
    captions: Mapping[str, Caption]                  # figure PNG name (or 'prefix_*.png') -> caption
    headlines: tuple[Headline, ...]                  # its rows of the entry page's table
    paper_values: tuple[PaperValue, ...]             # the paper's numbers it compares with
    files: Callable[[dict], list[str]] = lambda config: []  # other report files (E1's gap.md)
    # report files whose first paragraph the entry page quotes, each with its heading: (("gap.md", "accuracy gap"),)
    quoted: tuple[tuple[str, str], ...] = ()
    # report inputs by kind (runs, evals, timings, blocks, svm, profiles) for a config and a targets.Layout; None:
    # its runs' metrics, the evaluations of shown_runs and the step profiles
    inputs: Callable[[dict, Any], dict[str, list[str]]] | None = None
    shown_runs: Callable[[dict], list[RunSpec]] = no_runs   # runs whose evaluation the report shows
    profiled: bool = False                           # its GPU variants' training steps are profiled
    check: Callable[[dict], None] | None = None      # config checks of its own block (GpunnError)
    # with gpu.enabled false (after its GPU variants are dropped): drops the GPU-only settings of its block, returns
    # what that changes, one sentence each
    without_gpu: Callable[[dict], list[str]] | None = None

    def values(self, quantity: str | None = None, **fields) -> tuple[PaperValue, ...]:
        """Its paper values measuring `quantity` (None: any) with `fields` (gpunn.report.papers.select)."""
        return select(self.paper_values, self.name, quantity, **fields)

    def value(self, quantity: str, **fields) -> PaperValue:
        return select_one(self.paper_values, self.name, quantity, **fields)

    def headline_value(self, headline: Headline) -> PaperValue:
        return self.value(headline.quantity, **headline.select)

    def caption_key(self, figure: str) -> str:
        """The CAPTIONS key of a figure (PNG name); GpunnError when it has no caption."""
        return caption_key(self.captions, self.name, figure)

    def caption(self, figure: str) -> Caption:
        return self.captions[self.caption_key(figure)]
