"""Publishing a reproduction: the reports of a results tree copied, without weights, features or PDFs, into a folder
of the repository (docs/results/<machine>/), the entry page built over that copy, and the README's Results section
written from it (gpunn.report.readme). With `rebuild`, every enabled experiment's report and the entry page are
first rebuilt from the tree's run folders, as the report jobs would: for a run split over several machines or
sittings, whose returned results trees were merged into one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from snakemake.utils import update_config

from gpunn.config import load_config, load_schema, read_config_file
from gpunn.errors import GpunnError
from gpunn.report import index, readme
from gpunn.report.build import make_report
from gpunn.targets import (
    EXPERIMENTS,
    INDEX_FILES,
    Layout,
    enabled_experiments,
    index_setting,
    job_benchmarks,
    report_inputs,
    report_options,
)

BASE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
PUBLISHED_SUFFIXES = (".md", ".csv", ".png")  # and each report's provenance.json, which the entry page reads
PROVENANCE = "provenance.json"


def load_files(paths, machine: str | None = None, results_dir: str | None = None) -> dict:
    """The validated config that `snakemake --configfile <paths>` runs: config/config.yaml extended by each file in
    turn; `machine` and `results_dir` as --config would set them (machine: the run's device, e.g.
    nvidia-h100-80gb-hbm3, when publishing on another machine)."""
    raw: dict = {}
    for path in [BASE_CONFIG, *paths]:
        update_config(raw, read_config_file(path))  # nested keys merged, as snakemake --configfile merges files
    if machine:
        raw["machine"] = machine
    if results_dir:
        raw["results_dir"] = results_dir
    return load_config(raw, load_schema(), log=lambda line: None)


def rebuild(config: dict, log: Callable[[str], None] = print) -> list[str]:
    """Every enabled experiment's report and the entry page, rebuilt from the results tree of `config` (its
    results_dir and machine), as the report jobs build them; the experiments rebuilt."""
    layout = Layout.of(config)
    ran = enabled_experiments(config)
    for experiment in ran:
        inputs = {**report_inputs(config, experiment), "jobs": job_benchmarks(config, experiment)}
        missing = [p for kind, paths in inputs.items() if kind != "jobs" for p in paths if not Path(p).exists()]
        if missing:
            raise GpunnError(f"{missing[0]}: missing ({len(missing)} input(s) of {experiment.upper()}'s report in "
                             "all); "
                             f"run or restore {experiment} first (snakemake {experiment})")
        make_report(experiment, layout.report_dir(experiment), **report_options(inputs))
        log(f"rebuilt {layout.report_dir(experiment)}")
    ran, not_run, notes = index_setting(config)
    index.write(layout.measured("report"), ran, not_run, notes=notes, machine=layout.machine)
    return ran


def _published_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and (p.suffix in PUBLISHED_SUFFIXES or p.name == PROVENANCE))


def copy_reports(report_root, to, ran) -> None:
    """The experiments' reports of `report_root` (report/<machine>/) into `to`, tables, PNG figures and provenance
    only; an earlier copy there is replaced. `to` must be new or an earlier copy (it holds index.md)."""
    report_root, to = Path(report_root), Path(to)
    if to.exists() and any(to.iterdir()) and not (to / INDEX_FILES[0]).is_file():
        raise GpunnError(f"{to}: not empty and not a published report (no {INDEX_FILES[0]}); choose a new folder")
    for experiment in ran:
        if not (report_root / experiment / PROVENANCE).is_file():
            raise GpunnError(f"{report_root / experiment}: no complete report; build it first (snakemake "
                             f"report_{experiment}, or gpunn publish --rebuild)")
    for experiment in EXPERIMENTS:
        shutil.rmtree(to / experiment, ignore_errors=True)
    for name in INDEX_FILES:
        (to / name).unlink(missing_ok=True)
    for experiment in ran:
        (to / experiment).mkdir(parents=True)
        for path in _published_files(report_root / experiment):
            shutil.copy2(path, to / experiment / path.name)


def publish(config: dict, to, readme_path=None, rebuild_reports: bool = False,
            log: Callable[[str], None] = print) -> Path:
    """Copy the reports of `config`'s results tree into `to`, build the entry page there, and write the README's
    Results section from it when `readme_path` is given; returns the entry page."""
    layout = Layout.of(config)
    if rebuild_reports:
        rebuild(config, log)
    ran, not_run, notes = index_setting(config)
    copy_reports(layout.measured("report"), to, ran)
    paths = index.write(to, ran, not_run, notes=notes, machine=layout.machine)
    log(f"published {len(ran)} experiment report(s) and {paths['index.md']}")
    if readme_path:
        readme.write(readme_path, to)
        log(f"wrote the Results section of {readme_path} from {paths['index.md']}")
    return paths["index.md"]
