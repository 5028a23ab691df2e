"""CIFAR-10 binary archives (cifar-10-binary.tar.gz): a safe reader and a deterministic writer.

The archive holds `cifar-10-batches-bin/data_batch_{1..5}.bin`, `test_batch.bin` and `batches.meta.txt`.
Each .bin is a sequence of 3073-byte records: one label byte, then 1024 red, 1024 green and 1024 blue
bytes (row-major 32x32). The reader streams the archive with `tarfile`, looks only at regular members with
exactly the expected names (anything else, e.g. a path-traversal name, is ignored), never extracts to disk
and never unpickles anything.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from pathlib import Path

import numpy as np

from gpunn.errors import GpunnError
from gpunn.io import atomic_path

from .idx import GZIP_MAGIC, StoredGzipWriter

PREFIX = "cifar-10-batches-bin/"
TRAIN_MEMBERS = tuple(f"{PREFIX}data_batch_{i}.bin" for i in range(1, 6))
TEST_MEMBER = f"{PREFIX}test_batch.bin"
META_MEMBER = f"{PREFIX}batches.meta.txt"
EXPECTED_MEMBERS = TRAIN_MEMBERS + (TEST_MEMBER, META_MEMBER)

IMAGE_SHAPE = (3, 32, 32)
RECORD_BYTES = 1 + 3 * 32 * 32  # 3073
NUM_CLASSES = 10

_REDOWNLOAD = "delete it and run the download again"
_CHUNK = 1 << 20


def _parse_batch(archive: Path, member: str, blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    if len(blob) == 0:
        raise GpunnError(f"{archive}: member {member} is empty; {_REDOWNLOAD}")
    n, rest = divmod(len(blob), RECORD_BYTES)
    if rest:
        raise GpunnError(
            f"{archive}: member {member} is truncated: {len(blob)} bytes is {n} whole {RECORD_BYTES}-byte "
            f"records plus {rest} bytes of a cut record; {_REDOWNLOAD}"
        )
    records = np.frombuffer(blob, dtype=np.uint8).reshape(n, RECORD_BYTES)
    labels = records[:, 0].copy()
    if labels.max() >= NUM_CLASSES:
        bad = int(np.argmax(labels >= NUM_CLASSES))
        raise GpunnError(
            f"{archive}: member {member} record {bad} has label {int(labels[bad])}, labels must be "
            f"< {NUM_CLASSES}; {_REDOWNLOAD}"
        )
    images = records[:, 1:].reshape((n,) + IMAGE_SHAPE).copy()
    return images, labels


def _parse_meta(archive: Path, blob: bytes) -> list[str]:
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise GpunnError(f"{archive}: member {META_MEMBER} is not UTF-8 text; {_REDOWNLOAD}") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if len(names) != NUM_CLASSES:
        raise GpunnError(
            f"{archive}: member {META_MEMBER} lists {len(names)} class names, expected {NUM_CLASSES}; "
            f"{_REDOWNLOAD}"
        )
    return names


def read_cifar10_tar(path: str | os.PathLike) -> dict:
    """Read a CIFAR-10 binary archive: x_train/x_test uint8 (N, 3, 32, 32), y_train/y_test uint8, class_names."""
    path = Path(path)
    if not path.is_file():
        raise GpunnError(f"{path}: file not found; download or generate the dataset first")
    blobs: dict[str, bytes] = {}
    current = None
    try:
        with open(path, "rb") as fh:
            compressed = fh.read(2) == GZIP_MAGIC
        # gzip.GzipFile checks the CRC and length in the trailer once read to the end (tarfile's own
        # gzip stream does not); stored-block archives have no other integrity check
        with (gzip.GzipFile(path, "rb") if compressed else open(path, "rb")) as stream:
            # "r|": a forward-only stream, no seeking
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if member.name not in EXPECTED_MEMBERS:
                        continue  # unexpected names (including '../' or absolute paths) are never looked at
                    if not member.isreg():
                        raise GpunnError(f"{path}: member {member.name} is not a regular file; {_REDOWNLOAD}")
                    if member.name in blobs:
                        raise GpunnError(f"{path}: member {member.name} appears twice; {_REDOWNLOAD}")
                    current = member.name
                    blob = tar.extractfile(member).read()
                    if len(blob) != member.size:
                        raise GpunnError(f"{path}: member {member.name} is truncated; {_REDOWNLOAD}")
                    blobs[member.name] = blob
                    current = None
            while stream.read(_CHUNK):  # drain to the end so that the gzip trailer is checked
                pass
    except GpunnError:
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        where = f" (in member {current})" if current else ""
        reason = str(exc) or type(exc).__name__
        raise GpunnError(f"{path}: corrupt or truncated archive{where}: {reason}; {_REDOWNLOAD}") from None

    missing = [m for m in EXPECTED_MEMBERS if m not in blobs]
    if missing:
        raise GpunnError(f"{path}: archive lacks member(s) {', '.join(missing)}; {_REDOWNLOAD}")

    train = [_parse_batch(path, m, blobs.pop(m)) for m in TRAIN_MEMBERS]
    x_test, y_test = _parse_batch(path, TEST_MEMBER, blobs.pop(TEST_MEMBER))
    return {
        "x_train": np.concatenate([x for x, _ in train]),
        "y_train": np.concatenate([y for _, y in train]),
        "x_test": x_test,
        "y_test": y_test,
        "class_names": _parse_meta(path, blobs[META_MEMBER]),
    }


def _records(x: np.ndarray, y: np.ndarray) -> bytes:
    n = len(y)
    out = np.empty((n, RECORD_BYTES), dtype=np.uint8)
    out[:, 0] = y
    out[:, 1:] = x.reshape(n, -1)
    return out.tobytes()


def _tarinfo(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 0 if directory else size
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_cifar10_tar(path, x_train, y_train, x_test, y_test, class_names) -> None:
    """Write arrays as a CIFAR-10 binary tar.gz, atomically and byte-for-byte deterministically.

    The training set is split into 5 batches of nearly equal size (np.array_split order), as in CIFAR-10.
    """
    x_train = np.asarray(x_train)
    x_test = np.asarray(x_test)
    y_train = np.asarray(y_train)
    y_test = np.asarray(y_test)
    for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.dtype != np.uint8 or y.dtype != np.uint8:
            raise TypeError(f"write_cifar10_tar: {name} arrays must be uint8, got {x.dtype} / {y.dtype}")
        if x.ndim != 4 or x.shape[1:] != IMAGE_SHAPE or y.shape != (x.shape[0],):
            raise ValueError(f"write_cifar10_tar: {name} images must be (N, 3, 32, 32) with N labels, "
                             f"got {x.shape} and {y.shape}")
        if len(y) and int(y.max()) >= NUM_CLASSES:
            raise ValueError(f"write_cifar10_tar: {name} labels must be < {NUM_CLASSES}")
    if len(y_train) < len(TRAIN_MEMBERS) or len(y_test) < 1:
        raise ValueError("write_cifar10_tar: need at least 5 training and 1 test image")
    class_names = [str(c) for c in class_names]
    if len(class_names) != NUM_CLASSES or any("\n" in c or not c.strip() for c in class_names):
        raise ValueError(f"write_cifar10_tar: need {NUM_CLASSES} non-empty one-line class names")

    members = []
    for member, idx in zip(TRAIN_MEMBERS, np.array_split(np.arange(len(y_train)), len(TRAIN_MEMBERS))):
        members.append((member, _records(x_train[idx], y_train[idx])))
    members.append((TEST_MEMBER, _records(x_test, y_test)))
    members.append((META_MEMBER, ("\n".join(class_names) + "\n\n").encode("utf-8")))

    gz_name = Path(path).name
    gz_name = gz_name[:-3] if gz_name.endswith(".gz") else gz_name
    with (atomic_path(path) as tmp, open(tmp, "wb") as fh, StoredGzipWriter(fh, gz_name) as gz,
          tarfile.open(fileobj=gz, mode="w|", format=tarfile.USTAR_FORMAT) as tar):
        tar.addfile(_tarinfo(PREFIX, 0, directory=True))
        # the real archive lists the meta file first; keep that order
        for member, blob in [members[-1]] + members[:-1]:
            tar.addfile(_tarinfo(member, len(blob)), io.BytesIO(blob))
