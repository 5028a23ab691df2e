"""A report figure's caption: what it shows and which figure (or table, or section) of its paper it mirrors.
Each experiment module holds its CAPTIONS (figure file name -> Caption); the entry page puts each under its
figure's link, and `python -m gpunn captions` writes them as the reStructuredText files of `snakemake --report`
(workflow/report/captions/; tests/test_captions.py checks that they are in sync). Where a paper has no figure of
its own, `mirrors` says what of the paper the figure draws instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpunn.errors import GpunnError


@dataclass(frozen=True)
class Caption:
    shows: str    # what the figure shows, in a sentence or two
    mirrors: str  # which paper figure, table or section it regenerates, and how it differs
    paper: str    # short: "paper 001 Figure 1", "paper 002 tables", for the report's label column

    def text(self) -> str:
        return f"{self.shows} Mirrors {self.mirrors}."


# E1's, E4's and E5's step_profile.png (gpunn.report.step_profile) show the same thing for their models
STEP_PROFILE_SHOWS = (
    "Where one training step of each GPU variant spends its time, at the experiment's sizes and batch: a bar per "
    "variant, its kernels' GPU time stacked by kernel (small ones merged into 'other'; each launch timed alone, "
    "queued behind a GPU sleep, the median of repeats) and the host overhead on top (the step's wall time as the "
    "training loop runs it minus the kernels' sum: host work, batch copies and synchronisations); beside it the "
    "same as shares of the step (a negative host overhead, drawn as none: the kernels ran back to back faster than "
    "their sum timed alone, each of which carries about 2 us of event overhead). Under the CUDA simulator: each "
    "kernel's launches counted, no times.")


def caption_key(captions: Mapping[str, Caption], experiment: str, figure: str) -> str:
    """The key of `captions` (an experiment's CAPTIONS) for a figure file name: the name, or its prefix + '_*.png'
    for figures named after a dataset ('samples_mnist.png'); a GpunnError naming the figure when it has none."""
    if figure in captions:
        return figure
    prefix = figure.split("_", 1)[0] + "_*.png"
    if "_" in figure and prefix in captions:
        return prefix
    raise GpunnError(f"no caption for {experiment} figure '{figure}': add one to CAPTIONS in "
                     f"gpunn.experiments.{experiment}")


def rst_name(experiment: str, key: str) -> str:
    """The caption file of a figure's caption key under workflow/report/captions/: 'e4_samples.rst' for
    'samples_*.png'."""
    return f"{experiment}_{key.replace('_*', '').removesuffix('.png')}.rst"


def rst_text(experiment: str, found: Caption) -> str:
    return (f"{found.shows}\n\n*Mirrors* {found.mirrors}.\n\nThe experiment's tables, and this figure as PDF, are "
            f"in its report folder, ``<results_dir>/report/<machine>/{experiment}/``; the entry page is "
            f"``index.md`` beside it.\n")


def write_rst(out_dir, captions_by_experiment: Mapping[str, Mapping[str, Caption]]) -> list[Path]:
    """Write every caption's reStructuredText file into `out_dir` (workflow/report/captions); returns them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for experiment, captions in captions_by_experiment.items():
        for key, found in captions.items():
            path = out_dir / rst_name(experiment, key)
            path.write_text(rst_text(experiment, found))
            written.append(path)
    return written
