"""The experiments, one module each (e1, e2, ... in this package, each with its EXPERIMENT), as one registry: ALL in
the modules' numeric order, `get(name)`, and the papers' values of them all. Adding an experiment: a module eN.py
here, its block in the config schema and in config/config.yaml (docs/development.md: How to extend); the registry
finds it."""

from __future__ import annotations

import importlib
import pkgutil
import re

from gpunn.errors import GpunnError
from gpunn.experiments.base import Experiment, Headline
from gpunn.report.papers import PaperValue, select, select_one


def _modules() -> list[str]:
    """The experiment modules of this package, e1, e2, ..., in numeric order (e10 after e9)."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"e\d+", m.name)]
    return sorted(names, key=lambda name: int(name[1:]))


ALL: tuple[Experiment, ...] = tuple(importlib.import_module(f"{__name__}.{name}").EXPERIMENT for name in _modules())
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
