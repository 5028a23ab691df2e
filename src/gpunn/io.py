"""Atomic output writers: every file is written to a temporary sibling, then renamed into place, so an
interrupted job never leaves a partial output that Snakemake (or a user) could mistake for a result."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes owner-only files; give results the permissions any new file would get
        os.chmod(tmp_path, 0o666 & ~_UMASK)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _json_default(obj: Any):
    # numpy scalars and arrays (e.g. values from Snakemake Paramspace) are not JSON-serialisable as is
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def write_json(path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def write_csv(path, frame) -> None:
    """Write a pandas DataFrame as CSV without the index."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def write_rows_csv(path, columns, rows) -> None:
    """Write dict rows as CSV with a header of `columns`, as write_csv would write their DataFrame: floats in full
    precision, NaN and None as empty fields; without importing pandas."""
    def field(value):
        if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
            return ""
        return repr(float(value)) if isinstance(value, (float, np.floating)) else value

    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([field(row[c]) for c in columns] for row in rows)


def write_npy(path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, array)


def write_npz(path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
