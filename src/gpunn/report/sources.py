"""Where a report's numbers came from: the provenance records (gpunn.provenance) of the files it was built from
(each run's and the SVM's metrics.json, the provenance columns of the E3 timing, block-sweep and step profile
CSVs), merged into the distinct combinations of device, driver, package versions and commit, each with what used it.

Every experiment's report writes them as provenance.json (write); the entry page (gpunn.report.index) reads them
back (read) to state once which device, driver, versions and commit produced the whole report. Inputs recorded
before a field existed give None for it (runs from before provenance: device 'unknown').
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gpunn import io
from gpunn.errors import GpunnError

# the fields that tell two sources apart (hostname and thread counts are left out: they do not change numbers)
RECORD_KEYS = ("device", "driver", "simulator", "cpu", "python", "numpy", "numba", "numba_cuda", "snakemake",
               "commit")
# the run's placement (gpunn.provenance): carried, never telling two sources apart; merged records list each one's
# distinct values (run_values), which the entry page's machine line reads
RUN_KEYS = ("machine_cores", "gpu_slots", "timing_mode")
UNKNOWN = "unknown"
PROVENANCE = "provenance.json"  # in every report folder


def _record(provenance: dict | None) -> dict:
    provenance = provenance or {}
    record = {key: provenance.get(key) for key in RECORD_KEYS}
    record["device"] = record["device"] or UNKNOWN
    record["simulator"] = bool(record["simulator"])
    return {**record, **{key: provenance.get(key) for key in RUN_KEYS}}


def run_values(record: dict, key: str) -> list:
    """The values of a RUN_KEYS `key` in a record: [] where it has none (a record from before it), several in a
    merged one."""
    value = record.get(key)
    return [v for v in (value if isinstance(value, list) else [value])
            if v is not None and not (isinstance(v, float) and v != v)]


def read_json(path) -> dict:
    """A result's JSON file, or one GpunnError line naming it and the step to rerun."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise GpunnError(f"{path}: missing; run the step that makes it first") from None
    except json.JSONDecodeError as exc:
        raise GpunnError(f"{path}: not valid JSON ({exc}); delete it and rerun its step") from None


def _from_runs(run_dirs: Iterable) -> list[tuple[str, dict]]:
    found = []
    for run_dir in run_dirs:
        metrics = read_json(Path(run_dir) / "metrics.json")
        variant = (metrics.get("spec") or {}).get("variant", Path(run_dir).parent.name)
        found.append((str(variant), _record(metrics.get("provenance"))))
    return found


def _from_svm(svm_dirs: Iterable) -> list[tuple[str, dict]]:
    found = []
    for svm_dir in svm_dirs:
        metrics = read_json(Path(svm_dir) / "metrics.json")
        found.append((f"svm {metrics.get('method', '?')}", _record(metrics.get("provenance"))))
    return found


def _from_csvs(paths: Iterable, what: str) -> list[tuple[str, dict]]:
    """One source per distinct provenance of a CSV's rows, named after the file ('e3 timing gpu-fused')."""
    found = []
    for path in map(Path, paths):
        try:
            frame = pd.read_csv(path)
        except (FileNotFoundError, pd.errors.EmptyDataError) as exc:
            raise GpunnError(f"{path}: cannot be read ({exc}); rerun the step that makes it") from None
        columns = [key for key in (*RECORD_KEYS, *RUN_KEYS) if key in frame.columns]
        for values in frame[columns].drop_duplicates().astype(object).to_dict("records"):
            values = {k: (None if isinstance(v, float) and v != v else v) for k, v in values.items()}  # NaN -> None
            found.append((f"{what} {path.stem}", _record(values)))
    return found


def merge(labelled: Iterable[tuple[str, dict]], label: str = "used_by") -> list[dict]:
    """The distinct records (by RECORD_KEYS) of (what, record) pairs, in the order first met, each with `label`:
    the sorted names of what carried it, and `count`: how many pairs did; each RUN_KEYS key the list of its values."""
    merged: dict[tuple, dict] = {}
    for what, record in labelled:
        key = tuple(str(record.get(k)) for k in RECORD_KEYS)
        entry = merged.setdefault(key, {**{k: record.get(k) for k in RECORD_KEYS}, **{k: [] for k in RUN_KEYS},
                                        label: set(), "count": 0})
        for run_key in RUN_KEYS:
            entry[run_key] += [v for v in run_values(record, run_key) if v not in entry[run_key]]
        entry[label].add(what)
        entry["count"] += 1
    return [{**entry, label: sorted(entry[label])} for entry in merged.values()]


def collect(runs=(), svm=(), timings=(), blocks=(), profiles=()) -> list[dict]:
    """The distinct provenance records of a report's inputs, each with `used_by` (the variants, SVM methods or
    timing files that carry it) and `count` (how many inputs)."""
    return merge(_from_runs(runs) + _from_svm(svm) + _from_csvs(timings, "e3 timing") + _from_csvs(blocks, "e3 sweep")
                 + _from_csvs(profiles, "step profile"))


def write(path, experiment: str, records: list[dict]) -> None:
    io.write_text(path, json.dumps({"experiment": experiment, "sources": records}, indent=2) + "\n")


def read(path) -> dict:
    """A report's provenance.json: {'experiment': ..., 'sources': [record, ...]}."""
    data = read_json(Path(path))
    if not isinstance(data.get("sources"), list):
        raise GpunnError(f"{path}: has no 'sources' list; rerun the report step that makes it")
    return data
