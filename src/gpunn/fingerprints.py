"""Fingerprints of a job's outputs: each file's size and BLAKE2b hash, recorded when the job finishes in
`<log>.outputs.json` beside its log (`python -m gpunn.fingerprints LOG OUTPUT...`, run by the workflow's job shell
after the command succeeded). A file whose bytes still match its record was only touched, not edited
(gpunn.targets.edited_intermediates). Standard library only: planning the DAG reads these records."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

SUFFIX = ".outputs.json"
_CHUNK = 1 << 20


def record_path(log: str | Path) -> Path:
    """The record of the job that writes `log`: `<log>.outputs.json`."""
    return Path(f"{log}{SUFFIX}")


def fingerprint(path: str | Path) -> dict:
    """{"size": bytes, "blake2b": hex digest of the bytes} of one file."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return {"size": os.path.getsize(path), "blake2b": digest.hexdigest()}


def write_record(log: str | Path, outputs) -> Path:
    """Record the fingerprint of each existing file of `outputs` (keys: the paths as given, normalised) beside
    `log`, written whole or not at all. A missing output is left out (Snakemake reports it)."""
    record = record_path(log)
    prints = {os.path.normpath(p): fingerprint(p) for p in outputs if os.path.isfile(p)}
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, record)
    return record


def read_record(log: str | Path) -> dict[str, dict]:
    """The fingerprints recorded beside `log` by path, or {} without a readable record."""
    try:
        prints = json.loads(record_path(log).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return prints if isinstance(prints, dict) else {}


def matches(path: str | Path, recorded: dict | None) -> bool | None:
    """Whether the file at `path` has the recorded fingerprint (the size first, the hash only if it agrees);
    None when nothing was recorded."""
    if not isinstance(recorded, dict):
        return None
    if os.path.getsize(path) != recorded.get("size"):
        return False
    return fingerprint(path)["blake2b"] == recorded.get("blake2b")


def main(argv=None) -> int:
    """`python -m gpunn.fingerprints LOG OUTPUT...`: write LOG's record of the outputs."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m gpunn.fingerprints LOG OUTPUT...", file=sys.stderr)
        return 2
    write_record(args[0], args[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
