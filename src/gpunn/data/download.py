"""Download a dataset's files with md5 verification, trying mirrors in order.

Sources for every file, in order: each `mirrors` entry (a local directory, looked up as `<dir>/<file>` and
`<dir>/<dataset>/<file>`, or a URL base), then the registry's URLs. A local directory is turned into a
`file://` URL so it goes through the same urllib code as a web mirror.

A file is accepted if its archive md5 (the published file's) or its content md5 (the md5 of the
decompressed bytes: a re-compressed copy of the same data) matches the registry; see
`gpunn.data.integrity`. A file already in place that is accepted is not fetched again. Downloads stream
into a temporary file next to the destination and are renamed into place only after they were accepted,
so no partial or unverified file is ever left behind. `manifest.json` (format in `gpunn.data.integrity`:
the stored md5, the check that matched, size and mtime of every file) is written last and marks a
complete, verified download; an existing one is removed before any file is fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from gpunn import __version__
from gpunn.errors import GpunnError
from gpunn.io import atomic_path

from .integrity import (  # noqa: F401  (MANIFEST and md5sum are imported from here by older code)
    ACCEPTED_BECAUSE,
    MANIFEST,
    ChecksumMismatch,
    expected_text,
    file_record,
    identify,
    md5sum,
    write_manifest,
)
from .registry import DatasetSpec, get_dataset

_CHUNK = 1 << 20
_USER_AGENT = f"gpunn/{__version__} (dataset download; python urllib)"


def _is_url(source: str) -> bool:
    scheme = urllib.parse.urlsplit(source).scheme
    return len(scheme) > 1 and "://" in source  # a one-letter scheme would be a Windows drive


def _with_slash(base: str) -> str:
    return base if base.endswith("/") else base + "/"


def source_bases(spec: DatasetSpec, mirrors: Iterable[str | os.PathLike] = ()) -> list[str]:
    """The URL bases tried for the dataset's files, in order (each file's URL is base + file name)."""
    bases: list[str] = []
    for mirror in mirrors:
        mirror = os.fspath(mirror)
        if not mirror:
            continue
        if _is_url(mirror):
            bases.append(_with_slash(mirror))
        else:
            root = Path(mirror).expanduser().resolve()
            bases.append(_with_slash(root.as_uri()))
            bases.append(_with_slash((root / spec.name).as_uri()))
    bases.extend(_with_slash(u) for u in spec.urls)
    seen = set()
    return [b for b in bases if not (b in seen or seen.add(b))]


def _absent_local(url: str) -> bool:
    """Whether `url` is a file: URL whose file does not exist (one of a local mirror's candidate layouts)."""
    parsed = urllib.parse.urlparse(url)
    return parsed.scheme == "file" and not Path(urllib.request.url2pathname(parsed.path)).is_file()


def _short_reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}".strip()
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return f"timed out after {timeout:g} s"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror
        return str(reason)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _download(url: str, dest: Path, spec: DatasetSpec, file_name: str, timeout: float,
              log: Callable[[str], None]) -> tuple[int, str, str, str | None]:
    """Stream url into dest (atomically) and accept it as `identify` does; returns (size, md5, check,
    content md5 or None). Raises ChecksumMismatch or the urllib/OS error on failure, leaving dest as it was."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    digest = hashlib.md5()
    size = 0
    with atomic_path(dest) as tmp:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(tmp, "wb") as out:
            total = response.headers.get("Content-Length") if response.headers else None
            total = int(total) if total and total.isdigit() else None
            next_report = 0.25
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if total and total > 8 * _CHUNK and size / total >= next_report and size < total:
                    log(f"    {dest.name}: {size / 1e6:.1f} / {total / 1e6:.1f} MB")
                    next_report += 0.25
        got = digest.hexdigest()
        # the md5 came with the stream; the temp file is decompressed only if the archive md5 differs
        check, content_md5 = identify(spec, file_name, tmp, md5=got)
    return size, got, check, content_md5


def fetch_dataset(
    name: str,
    dest_dir: str | os.PathLike,
    mirrors: Iterable[str | os.PathLike] = (),
    timeout: float = 30.0,
    log: Callable[[str], None] = print,
) -> dict[str, str]:
    """Make sure every file of dataset `name` is in dest_dir and accepted by the registry (archive or
    content md5), then write dest_dir/manifest.json; returns {file: md5 of the file as stored} (equal to
    the registry's archive md5 unless the file was accepted by its content md5)."""
    spec = get_dataset(name)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    bases = source_bases(spec, mirrors)
    records: dict[str, dict] = {}
    for file_name in spec.files:
        dest = dest_dir / file_name
        note = ""
        if dest.is_file():
            have = md5sum(dest)
            try:
                check, content_md5 = identify(spec, file_name, dest, md5=have)
            except ChecksumMismatch as exc:
                note = f" (the existing {dest} failed: {exc})"
                log(f"{name}: {file_name} exists but failed ({exc}); fetching it again")
            else:
                log(f"{name}: {file_name} ok ({ACCEPTED_BECAUSE[check]}; cached)")
                records[file_name] = file_record(dest, have, check, content_md5)
                continue
        # the directory is about to change: it is no longer the complete download a manifest vouches for
        (dest_dir / MANIFEST).unlink(missing_ok=True)
        tried: list[str] = []
        for base in bases:
            url = base + urllib.parse.quote(file_name)
            if _absent_local(url):  # a mirror layout that does not hold the file: probed quietly
                tried.append(f"{url} (No such file)")
                continue
            log(f"{name}: {file_name} <- {url}")
            try:
                size, got, check, content_md5 = _download(url, dest, spec, file_name, timeout, log)
            except ChecksumMismatch as exc:
                reason = str(exc)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                # URLError, HTTPError and timeouts are OSErrors; ValueError covers malformed URLs;
                # HTTPException covers connections cut mid-transfer (IncompleteRead)
                reason = _short_reason(exc, timeout)
            else:
                log(f"{name}: {file_name} ok ({ACCEPTED_BECAUSE[check]}; {size} bytes, md5 {got})")
                records[file_name] = file_record(dest, got, check, content_md5)
                break
            log(f"{name}: {file_name} failed: {reason}")
            tried.append(f"{url} ({reason})")
        else:
            tried_txt = "; ".join(tried) if tried else "no sources (no mirror given and no download URL)"
            offline_hint = (
                f"{name} is generated locally, not downloaded: write it with gpunn.data.offline."
                f"write_offline_dataset and give that directory as the mirror; "
                if spec.offline else ""
            )
            raise GpunnError(
                f"{name}: could not get {file_name} ({expected_text(spec, file_name)}){note}; "
                f"tried: {tried_txt}; "
                f"{offline_hint}put the files of {name} ({', '.join(spec.files)}) by hand into {dest_dir}, "
                f"or into a directory given with --mirror / config key data.mirror_dir"
            )
    write_manifest(dest_dir, name, records)
    return {file_name: record["md5"] for file_name, record in records.items()}
