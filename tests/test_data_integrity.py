"""Checksums of dataset files and the manifest: content md5s, identify, raw_status's cheap and slow paths."""

import gzip
import hashlib
import json
import os
import shutil

import pytest

from gpunn.data import integrity, registry
from gpunn.data.download import fetch_dataset
from gpunn.data.integrity import (
    ChecksumMismatch,
    content_md5sum,
    identify,
    raw_status,
    read_manifest,
    verify_raw,
)
from gpunn.data.offline import write_offline_dataset
from gpunn.errors import GpunnError

NAME = "digits8"
IMAGES = "train-images-idx3-ubyte.gz"
LABELS = "t10k-labels-idx1-ubyte.gz"


def quiet(_line):
    pass


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    out = tmp_path_factory.mktemp("offline") / NAME
    write_offline_dataset(NAME, out, log=quiet)
    return out


@pytest.fixture
def raw(offline, tmp_path):
    """digits8 fetched (verified, manifest written) into a fresh raw directory."""
    fetch_dataset(NAME, tmp_path / "raw", mirrors=[offline], log=quiet)
    return tmp_path / "raw"


def all_ok():
    return {f: "ok" for f in registry.get_dataset(NAME).files}


def no_hashing(monkeypatch):
    def refuse(path):
        raise AssertionError(f"{path} was hashed")
    monkeypatch.setattr(integrity, "md5sum", refuse)


def test_content_md5sum_streams_every_member(tmp_path):
    path = tmp_path / "f.gz"
    path.write_bytes(gzip.compress(b"x" * 3_000_000) + gzip.compress(b"tail"))  # two gzip members
    assert content_md5sum(path) == md5(b"x" * 3_000_000 + b"tail")


@pytest.mark.parametrize("data, fragment", [
    (b"plain bytes", "not valid gzip data"),
    (gzip.compress(b"y" * 10000, mtime=0)[:-9], "not valid gzip data"),  # truncated inside the trailer
], ids=["plain bytes", "truncated gzip"])  # fixed ids: xdist workers must collect the same names
def test_content_md5sum_of_broken_gzip(tmp_path, data, fragment):
    path = tmp_path / "f.gz"
    path.write_bytes(data)
    with pytest.raises(GpunnError) as err:
        content_md5sum(path)
    assert str(path) in str(err.value) and fragment in str(err.value) and "\n" not in str(err.value)


def test_content_md5sum_of_a_corrupt_crc(tmp_path):
    data = bytearray(gzip.compress(b"z" * 1000, mtime=0))
    data[-8] ^= 0xFF  # the CRC32 in the trailer
    path = tmp_path / "f.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(GpunnError, match="not valid gzip data"):
        content_md5sum(path)


def test_identify(offline, tmp_path):
    spec = registry.get_dataset(NAME)
    assert identify(spec, IMAGES, offline / IMAGES) == ("archive", None)
    with gzip.open(offline / IMAGES, "rb") as fh:
        content = fh.read()
    other = tmp_path / IMAGES
    other.write_bytes(gzip.compress(content, compresslevel=6, mtime=99))
    assert identify(spec, IMAGES, other) == ("content", spec.content_md5[IMAGES])
    other.write_bytes(gzip.compress(content[:-1] + b"\x01", mtime=0))
    with pytest.raises(ChecksumMismatch) as err:
        identify(spec, IMAGES, other)
    assert spec.files[IMAGES] in str(err.value) and spec.content_md5[IMAGES] in str(err.value)


def test_raw_status_ok_without_reading_a_file(raw, monkeypatch):
    no_hashing(monkeypatch)
    assert raw_status(NAME, raw) == all_ok()


def test_raw_status_hashes_only_when_the_mtime_moved(raw, monkeypatch):
    path = raw / IMAGES
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # touched, bytes unchanged
    hashed = []
    real_md5sum = integrity.md5sum
    monkeypatch.setattr(integrity, "md5sum", lambda p: hashed.append(p.name) or real_md5sum(p))
    assert raw_status(NAME, raw) == all_ok()
    assert hashed == [IMAGES]


def test_raw_status_changed_missing_unverified(raw):
    data = bytearray((raw / IMAGES).read_bytes())
    data[100] ^= 1  # same size, other bytes, new mtime
    recorded_ns = (raw / IMAGES).stat().st_mtime_ns
    (raw / IMAGES).write_bytes(bytes(data))
    # the clock may not have ticked since the download on a coarse-timestamp file system: make sure it did
    os.utime(raw / IMAGES, ns=(recorded_ns, recorded_ns + 1_000_000_000))
    with open(raw / LABELS, "ab") as fh:  # another size
        fh.write(b"\0")
    (raw / "t10k-images-idx3-ubyte.gz").unlink()
    status = raw_status(NAME, raw)
    assert status == {IMAGES: "changed", "train-labels-idx1-ubyte.gz": "ok",
                      "t10k-images-idx3-ubyte.gz": "missing", LABELS: "changed"}
    (raw / "manifest.json").unlink()
    assert raw_status(NAME, raw) == {IMAGES: "unverified", "train-labels-idx1-ubyte.gz": "unverified",
                                     "t10k-images-idx3-ubyte.gz": "missing", LABELS: "unverified"}


def test_raw_status_unverified_manifests(raw, monkeypatch):
    manifest = json.loads((raw / "manifest.json").read_text())
    (raw / "manifest.json").write_text("{not json")
    assert set(raw_status(NAME, raw).values()) == {"unverified"}
    (raw / "manifest.json").write_text(json.dumps({**manifest, "dataset": "digits28"}))
    assert set(raw_status(NAME, raw).values()) == {"unverified"}
    del manifest["checks"][LABELS]
    (raw / "manifest.json").write_text(json.dumps(manifest))
    assert raw_status(NAME, raw)[LABELS] == "unverified"
    # a registry change that no longer accepts what the manifest recorded
    spec = registry.get_dataset(NAME)
    monkeypatch.setitem(registry.DATASETS, NAME, registry.DatasetSpec(
        **{**spec.__dict__, "files": {**spec.files, IMAGES: "0" * 32}}))
    assert raw_status(NAME, raw)[IMAGES] == "unverified"


def test_raw_status_of_a_version_1_manifest_hashes(offline, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(offline, raw)
    (raw / "manifest.json").write_text(json.dumps({"dataset": NAME, "files": registry.get_dataset(NAME).files}))
    assert raw_status(NAME, raw) == all_ok()
    assert read_manifest(NAME, raw)[IMAGES] == {"md5": registry.get_dataset(NAME).files[IMAGES],
                                                "check": "archive", "size": None, "mtime_ns": None}
    (raw / LABELS).write_bytes(gzip.compress(b"other", mtime=0))
    assert raw_status(NAME, raw)[LABELS] == "changed"


def test_content_record_is_checked_against_the_registry(offline, tmp_path, monkeypatch):
    """A file accepted by its content md5 stays valid while the registry's content md5 is unchanged."""
    mirror = tmp_path / "mirror"
    shutil.copytree(offline, mirror)
    with gzip.open(offline / IMAGES, "rb") as fh:
        (mirror / IMAGES).write_bytes(gzip.compress(fh.read(), mtime=7))
    raw = tmp_path / "raw"
    fetch_dataset(NAME, raw, mirrors=[mirror], log=quiet)
    assert read_manifest(NAME, raw)[IMAGES]["check"] == "content"
    assert raw_status(NAME, raw) == all_ok()
    verify_raw(NAME, raw)
    spec = registry.get_dataset(NAME)
    monkeypatch.setitem(registry.DATASETS, NAME, registry.DatasetSpec(
        **{**spec.__dict__, "content_md5": {**spec.content_md5, IMAGES: "1" * 32}}))
    assert raw_status(NAME, raw)[IMAGES] == "unverified"
    with pytest.raises(GpunnError) as err:
        verify_raw(NAME, raw)
    assert "content md5" in str(err.value) and "1" * 32 in str(err.value)


def test_offline_directory_is_a_valid_raw_directory(offline, monkeypatch):
    no_hashing(monkeypatch)
    assert raw_status(NAME, offline) == all_ok()
