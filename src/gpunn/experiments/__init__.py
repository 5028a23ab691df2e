"""The experiments, one module each (e1 ... e6), as one registry: ALL in order, `get(name)`, and the papers'
values of them all. Adding an experiment: a module with its EXPERIMENT, added to ALL, its block in the config
schema and in config/config.yaml (README: How to extend)."""

from __future__ import annotations

from gpunn.errors import GpunnError
from gpunn.experiments import e1, e2, e3, e4, e5, e6
from gpunn.experiments.base import Experiment, Headline
from gpunn.report.papers import PaperValue, select, select_one

ALL: tuple[Experiment, ...] = tuple(module.EXPERIMENT for module in (e1, e2, e3, e4, e5, e6))
NAMES: tuple[str, ...] = tuple(experiment.name for experiment in ALL)
BY_NAME = {experiment.name: experiment for experiment in ALL}
PAPER_VALUES: tuple[PaperValue, ...] = tuple(value for experiment in ALL for value in experiment.paper_values)

__all__ = ["ALL", "BY_NAME", "NAMES", "PAPER_VALUES", "Experiment", "Headline", "get", "paper_value",
           "paper_values"]


def get(name: str) -> Experiment:
    """The experiment named `name`; a GpunnError naming the known ones."""
    if name not in BY_NAME:
        raise GpunnError(f"unknown experiment '{name}': choose one of {', '.join(NAMES)}")
    return BY_NAME[name]


def paper_values(experiment: str | None = None, quantity: str | None = None, **fields) -> tuple[PaperValue, ...]:
    """The papers' values of `experiment` (None: all) measuring `quantity` (None: any) with `fields`."""
    return select(PAPER_VALUES, experiment, quantity, **fields)


def paper_value(experiment: str, quantity: str, **fields) -> PaperValue:
    return select_one(PAPER_VALUES, experiment, quantity, **fields)
