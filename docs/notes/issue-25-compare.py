"""Issue 25's behaviour check: two smoke runs' results trees (before and after the refactor) hold the same
numbers. Compares every run's weights and per-epoch losses and accuracies, every evaluation's predictions and
samples, the encoder features, the SVM's accuracies and predictions-derived tables, and every report CSV's
columns that are not times, devices or file paths. Times differ run to run and are left out.

    python docs/notes/issue-25-compare.py BEFORE/results/smoke AFTER/results/smoke

Run both with the same --cores: cpu-numpy's BLAS uses the job's threads, and another thread count rounds its sums
differently.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

TIMED = ("_s", "_ms", "_us", "per_s", "speedup", "time", "device", "clock", "simulator", "cpu", "driver", "path",
         "csv", "gb_per_s", "share", "overhead", "memory", "mib", "incremental", "rss", "wall", "commit", "threads",
         "best_block", "block_")
TIME_QUANTITIES = ("time", "speedup", "reduction")  # paper_vs_ours rows (and entry-page headlines) of timings
SKIPPED_FILES = ("jobs.csv",)  # each job's wall time
SKIP_JSON = ("provenance", "time", "_s", "seconds", "created", "commit", "host", "versions", "path", "memory")


def untimed(columns):
    return [c for c in columns if c != "ms" and not any(t in c.lower() for t in TIMED)]


def equal(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))


def untimed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """A paper_vs_ours or index table without its rows of times and speedups (ours differs run to run)."""
    for column in ("quantity", "headline"):
        if column in frame:
            keep = ~frame[column].astype(str).str.contains("|".join(TIME_QUANTITIES))
            frame = frame[keep].reset_index(drop=True)
    return frame


def json_numbers(value, prefix=""):
    if isinstance(value, dict):
        for key, sub in value.items():
            if not any(s in key.lower() for s in SKIP_JSON):
                yield from json_numbers(sub, f"{prefix}.{key}")
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from json_numbers(sub, f"{prefix}[{i}]")
    else:
        yield prefix, value


def compare(before: Path, after: Path) -> list[str]:
    problems, counts = [], {}
    for old in sorted(before.rglob("*")):
        rel = old.relative_to(before)
        new = after / rel
        if not old.is_file() or rel.parts[0] in ("logs", "benchmarks", "offline", "data"):
            continue
        kind = old.suffix
        if not new.is_file():
            if kind in (".npy", ".npz", ".json", ".csv"):
                problems.append(f"{rel}: missing after")
            continue
        counts[kind] = counts.get(kind, 0) + 1
        if kind == ".npy":
            if not np.array_equal(np.load(old), np.load(new)):
                problems.append(f"{rel}: arrays differ")
        elif kind == ".npz":
            a, b = np.load(old), np.load(new)
            for key in a.files:
                if key not in b.files or not np.array_equal(a[key], b[key]):
                    problems.append(f"{rel}: {key} differs")
        elif kind == ".json" and rel.parts[0] != "report":
            a, b = (dict(json_numbers(json.loads(p.read_text()))) for p in (old, new))
            for key, value in a.items():
                if not equal(b.get(key), value):
                    problems.append(f"{rel}: {key} {value!r} -> {b.get(key)!r}")
        elif kind == ".csv" and old.name not in SKIPPED_FILES:
            a, b = untimed_rows(pd.read_csv(old)), untimed_rows(pd.read_csv(new))
            shared = [c for c in untimed(a.columns) if c in b.columns]
            gone = [c for c in untimed(a.columns) if c not in b.columns]
            if gone:
                problems.append(f"{rel}: columns gone {gone}")
            if len(a) != len(b):
                problems.append(f"{rel}: {len(a)} rows -> {len(b)}")
                continue
            for column in shared:
                x, y = a[column], b[column]
                same = x.equals(y) or (pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y)
                                       and np.allclose(x, y, rtol=0, atol=0, equal_nan=True))
                if not same:
                    problems.append(f"{rel}: column {column} differs: {list(x)[:3]} -> {list(y)[:3]}")
    print("compared:", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return problems


if __name__ == "__main__":
    found = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    print("\n".join(found) if found else "identical (every compared number and array)")
