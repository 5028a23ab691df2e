"""Is a dataset file genuine, and is a raw directory still what the download verified?

Two questions, answered at different costs:

* Genuine: a file matches the registry if its archive md5 (the md5 of the file as published) or its
  content md5 (the md5 of its decompressed bytes) matches; `identify` tells which. The content route
  accepts re-compressed copies of the published data (another gzip level, header time or file name) that
  hold exactly the same bytes; it costs one streaming decompression, so it is only tried when the
  archive md5 does not match.
* Unchanged: `fetch_dataset` (and `write_offline_dataset`) write `manifest.json` last, recording for every
  file the md5 of the file as stored, which check matched, its size and its mtime. Later steps compare the
  files with that record instead of decompressing again: `verify_raw` (used by `prepare_dataset`) hashes
  every file; `raw_status` (cheap enough for Snakemake's DAG build) hashes only files whose size or mtime
  moved.

manifest.json:

    {"dataset": NAME,
     "version": 2,
     "files":  {FILE: MD5},                     # md5 of the file as stored (the version-1 format)
     "checks": {FILE: {"md5": MD5,              # the same md5
                       "check": "archive" | "content",   # which registry checksum matched
                       "content_md5": MD5,      # only with check "content": the matched content md5
                       "size": BYTES,
                       "mtime_ns": NS}}}        # os.stat(FILE).st_mtime_ns when it was verified

Version-1 manifests ({"dataset", "files"} only, written by older gpunn) are still read: those files were
accepted by their archive md5, and without sizes and mtimes every check hashes the file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from pathlib import Path

from gpunn.errors import GpunnError
from gpunn.io import write_json

from .registry import DatasetSpec, get_dataset

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
CHECKS = ("archive", "content")
# what a log line says about an accepted file, by the check that accepted it
ACCEPTED_BECAUSE = {
    "archive": "archive md5 matches the published file",
    "content": "content md5 matches: re-compressed copy of the published data",
}
# raw_status values
OK, MISSING, CHANGED, UNVERIFIED = "ok", "missing", "changed", "unverified"
_CHUNK = 1 << 20
_GZIP_ERRORS = (OSError, EOFError, zlib.error)  # BadGzipFile is an OSError; EOFError: truncated stream


def md5sum(path: str | os.PathLike) -> str:
    """The md5 hex digest of a file, read in chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _gunzip_md5(path: str | os.PathLike) -> str:
    digest = hashlib.md5()
    with gzip.open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _not_gzip(exc: BaseException) -> str:
    return f"not valid gzip data ({str(exc) or type(exc).__name__})"


def content_md5sum(path: str | os.PathLike) -> str:
    """The md5 hex digest of the gunzipped bytes of a gzip file (every member, streamed in chunks, so
    memory stays flat for any size; gzip checks each member's CRC and length on the way).
    A missing file, or one that is not complete, valid gzip data, is a one-line GpunnError."""
    if not Path(path).is_file():
        raise GpunnError(f"{path}: not found")
    try:
        return _gunzip_md5(path)
    except _GZIP_ERRORS as exc:
        raise GpunnError(f"{path}: {_not_gzip(exc)}") from None


class ChecksumMismatch(Exception):
    """A file matches neither registry checksum; the message says what was expected and found."""


def identify(spec: DatasetSpec, file_name: str, path: str | os.PathLike, md5: str | None = None
             ) -> tuple[str, str | None]:
    """Which registry checksum the file at `path` (stored as spec's `file_name`) matches: ("archive", None)
    or ("content", its content md5). Raises ChecksumMismatch otherwise. `md5` is the file's md5 when the
    caller already has it (a download computes it while streaming); the file is decompressed only when
    the archive md5 does not match and the registry knows a content md5."""
    expected = spec.files[file_name]
    got = md5 if md5 is not None else md5sum(path)
    if got == expected:
        return "archive", None
    expected_content = spec.content_md5_of(file_name)
    found = f"checksum mismatch: md5 {got}, expected {expected}"
    if expected_content is None:
        raise ChecksumMismatch(found)
    try:
        got_content = _gunzip_md5(path)
    except _GZIP_ERRORS as exc:
        raise ChecksumMismatch(f"{found}; content md5 expected {expected_content}, but the file is "
                               f"{_not_gzip(exc)}") from None
    if got_content == expected_content:
        return "content", got_content
    raise ChecksumMismatch(f"{found}; content md5 {got_content}, expected {expected_content}")


def expected_text(spec: DatasetSpec, file_name: str) -> str:
    """The checksums a file of spec may have, for messages: 'md5 A' or 'md5 A, or content md5 C'."""
    content = spec.content_md5_of(file_name)
    text = f"md5 {spec.files[file_name]}"
    return text + (f", or content md5 {content} after decompression" if content else "")


def file_record(path: str | os.PathLike, md5: str, check: str, content_md5: str | None = None) -> dict:
    """The manifest entry of a verified file: its md5 as stored, the check that accepted it, and the size
    and mtime_ns it has now (call this after the file is in its final place: a rename keeps the mtime)."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    stat = os.stat(path)
    record = {"md5": md5, "check": check}
    if check == "content":
        record["content_md5"] = content_md5
    record.update(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    return record


def write_manifest(directory: str | os.PathLike, name: str, records: dict[str, dict]) -> None:
    """Write directory/manifest.json (atomically) for dataset `name` from {file: file_record(...)}."""
    write_json(Path(directory) / MANIFEST, {
        "dataset": name,
        "version": MANIFEST_VERSION,
        "files": {file_name: record["md5"] for file_name, record in records.items()},
        "checks": records,
    })


def read_manifest(name: str, raw_dir: str | os.PathLike) -> dict[str, dict]:
    """The per-file records of raw_dir/manifest.json, as {file: {"md5", "check", "size", "mtime_ns", ...}}
    (size and mtime_ns are None for a version-1 manifest). A missing or unreadable manifest, or one
    written for another dataset, is a one-line GpunnError."""
    path = Path(raw_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise GpunnError(f"{path}: not found, so the raw files of {name} in {raw_dir} were never verified "
                         f"(the download step writes it last); {redo_hint(name, raw_dir)}") from None
    except (OSError, ValueError) as exc:
        raise GpunnError(f"{path}: unreadable ({str(exc) or type(exc).__name__}); "
                         f"{redo_hint(name, raw_dir)}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise GpunnError(f"{path}: not a gpunn manifest (no \"files\" table); {redo_hint(name, raw_dir)}")
    if manifest.get("dataset") != name:
        raise GpunnError(f"{path}: records dataset {manifest.get('dataset')!r}, not {name!r}; "
                         f"{redo_hint(name, raw_dir)}")
    checks = manifest.get("checks")
    if isinstance(checks, dict):
        return {f: dict(r) for f, r in checks.items() if isinstance(r, dict)}
    # version 1: the old download accepted a file only by its archive md5, and recorded nothing else
    return {f: {"md5": md5, "check": "archive", "size": None, "mtime_ns": None} for f, md5 in files.items()}


def redo_hint(name: str, raw_dir: str | os.PathLike) -> str:
    """What to do about a raw directory that failed a check."""
    if get_dataset(name).offline:
        return (f"re-run the pipeline (the download step re-fetches it) or `gpunn make-offline {name} --out "
                f"OFFLINE_DIR` then `gpunn download {name} --dest {raw_dir} --mirror OFFLINE_DIR`")
    return f"re-run the pipeline (the download step re-fetches it) or `gpunn download {name} --dest {raw_dir}`"


def _agrees_with_registry(spec: DatasetSpec, file_name: str, record: dict) -> bool:
    """Whether the check a manifest recorded still accepts the file under today's registry."""
    if record.get("check") == "archive":
        return record.get("md5") == spec.files[file_name]
    if record.get("check") == "content":
        expected = spec.content_md5_of(file_name)
        return expected is not None and record.get("content_md5") == expected
    return False


def raw_status(name: str, raw_dir: str | os.PathLike) -> dict[str, str]:
    """The state of every file of dataset `name` in raw_dir, as {file: status}, judged against
    raw_dir/manifest.json without decompressing anything:

      "ok"          the file is as the manifest recorded it, and the recorded check still satisfies the
                    registry;
      "missing"     the file is not there;
      "changed"     its size, or its md5, differs from the manifest's record;
      "unverified"  it is there but no usable manifest vouches for it (no manifest, unreadable, written for
                    another dataset, the file not listed, or its recorded checksum no longer what the
                    registry accepts).

    Anything but "ok" means: fetch again. Cheap enough to call at every Snakemake DAG build: a file whose
    size and mtime_ns equal the manifest's is taken as unchanged without reading it; only a file whose
    mtime moved (copied, touched) is hashed, and it is "ok" again if its md5 still matches. The shortcut
    trusts that nobody rewrote a file in place with the same size while restoring its mtime;
    `prepare_dataset` (through `verify_raw`) hashes every file regardless. Version-1 manifests record no
    size or mtime, so there every present file is hashed.
    """
    spec = get_dataset(name)
    raw_dir = Path(raw_dir)
    try:
        records = read_manifest(name, raw_dir)
    except GpunnError:
        records = {}
    status: dict[str, str] = {}
    for file_name in spec.files:
        path = raw_dir / file_name
        record = records.get(file_name)
        try:
            stat = path.stat()
        except FileNotFoundError:
            status[file_name] = MISSING
            continue
        if record is None or not _agrees_with_registry(spec, file_name, record):
            status[file_name] = UNVERIFIED
        elif record.get("size") is not None and stat.st_size != record["size"]:
            status[file_name] = CHANGED
        elif record.get("size") is not None and stat.st_mtime_ns == record.get("mtime_ns"):
            status[file_name] = OK
        else:
            status[file_name] = OK if md5sum(path) == record.get("md5") else CHANGED
    return status


def verify_raw(name: str, raw_dir: str | os.PathLike) -> None:
    """Check every file of dataset `name` in raw_dir before it is parsed: present, with the size and md5
    that manifest.json recorded when the download verified it, and that recorded check (archive or
    content md5) still what the registry accepts. Hashes every file (no mtime shortcut) but decompresses
    nothing: the manifest ties today's bytes to the download's verification. The first problem is a
    one-line GpunnError naming the file, what was expected, what was found and what to do."""
    spec = get_dataset(name)
    raw_dir = Path(raw_dir)
    records = read_manifest(name, raw_dir)
    redo = redo_hint(name, raw_dir)
    for file_name in spec.files:
        path = raw_dir / file_name
        record = records.get(file_name)
        if record is None:
            raise GpunnError(f"{raw_dir / MANIFEST}: does not list {file_name}, so {path} was never verified "
                             f"(expected {expected_text(spec, file_name)}); {redo}")
        if not _agrees_with_registry(spec, file_name, record):
            recorded = record.get("content_md5") if record.get("check") == "content" else record.get("md5")
            raise GpunnError(f"{path}: manifest.json recorded a {record.get('check')} md5 {recorded} but "
                             f"the registry expects {expected_text(spec, file_name)}; {redo}")
        if not path.is_file():
            raise GpunnError(f"{path}: missing (manifest.json lists it with md5 {record.get('md5')}); {redo}")
        size = path.stat().st_size
        if record.get("size") is not None and size != record["size"]:
            raise GpunnError(f"{path}: {size} bytes, but manifest.json recorded {record['size']} bytes "
                             f"(md5 {record.get('md5')}) when it was verified: the file changed since; {redo}")
        got = md5sum(path)
        if got != record.get("md5"):
            raise GpunnError(f"{path}: md5 {got}, but manifest.json recorded md5 {record.get('md5')} when "
                             f"it was verified: the file changed since; {redo}")
