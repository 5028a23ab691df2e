import gzip
import hashlib
import json
import os

import pytest

from gpunn.data import registry
from gpunn.data.download import fetch_dataset, md5sum, source_bases
from gpunn.data.registry import DatasetSpec
from gpunn.errors import GpunnError

FILES = {"a.bin": b"first file\n" * 1000, "b.bin": b"\x00\x01second" * 50}
# the content of two gzip files, and the bytes of the "published" .gz files (one gzip encoding of them)
CONTENT = {"a.gz": bytes(range(256)) * 400, "b.gz": b"labels " * 300}
PUBLISHED = {n: gzip.compress(d, compresslevel=9, mtime=0) for n, d in CONTENT.items()}
# the same content re-compressed (another level and header time): other .gz bytes, same decompressed bytes
RECOMPRESSED = {n: gzip.compress(d, compresslevel=1, mtime=1234567) for n, d in CONTENT.items()}


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def tiny(monkeypatch):
    """A registered two-file dataset 'tiny' whose own URLs are none (only mirrors are tried)."""
    def register(urls=()):
        spec = DatasetSpec(
            name="tiny", kind="idx", files={n: md5(d) for n, d in FILES.items()}, urls=tuple(urls),
            image_shape=(1, 2, 2), class_names=tuple("0123456789"), offline=False, description="test",
        )
        monkeypatch.setitem(registry.DATASETS, "tiny", spec)
        return spec
    return register


@pytest.fixture
def tinygz(monkeypatch):
    """A registered dataset 'tinygz' of two gzip files with archive md5s (of PUBLISHED) and content md5s
    (of CONTENT); content=False registers no content md5s (only the archive md5 is accepted)."""
    def register(content=True):
        spec = DatasetSpec(
            name="tinygz", kind="idx", files={n: md5(d) for n, d in PUBLISHED.items()}, urls=(),
            image_shape=(1, 2, 2), class_names=tuple("0123456789"), offline=False, description="test",
            content_md5={n: md5(d) for n, d in CONTENT.items()} if content else {},
        )
        monkeypatch.setitem(registry.DATASETS, "tinygz", spec)
        return spec
    return register


def put(directory, files=FILES):
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


class Log(list):
    def __call__(self, line):
        assert isinstance(line, str)
        self.append(line)


def test_md5sum(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3_000_000)
    assert md5sum(path) == md5(b"x" * 3_000_000)


def test_local_mirror_through_file_urls(tmp_path, tiny):
    tiny()
    mirror = put(tmp_path / "mirror")
    dest = tmp_path / "dest"
    log = Log()
    result = fetch_dataset("tiny", dest, mirrors=[mirror], log=log)
    assert result == {n: md5(d) for n, d in FILES.items()}
    assert listing(dest) == ["a.bin", "b.bin", "manifest.json"]
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["dataset"] == "tiny" and manifest["version"] == 2
    assert manifest["files"] == result  # the version-1 table, still there for older readers
    assert any("file://" in line for line in log)
    assert sum("ok (archive md5 matches the published file;" in line for line in log) == 2


def test_manifest_records_md5_check_size_and_mtime(tmp_path, tiny):
    tiny()
    dest = tmp_path / "dest"
    fetch_dataset("tiny", dest, mirrors=[put(tmp_path / "mirror")], log=Log())
    checks = json.loads((dest / "manifest.json").read_text())["checks"]
    assert set(checks) == set(FILES)
    for name, data in FILES.items():
        stat = os.stat(dest / name)
        assert checks[name] == {"md5": md5(data), "check": "archive", "size": len(data),
                                "mtime_ns": stat.st_mtime_ns}


def test_mirror_subdirectory_named_after_the_dataset(tmp_path, tiny):
    tiny()
    put(tmp_path / "mirror" / "tiny")
    log = Log()
    fetch_dataset("tiny", tmp_path / "dest", mirrors=[str(tmp_path / "mirror")], log=log)
    assert listing(tmp_path / "dest") == ["a.bin", "b.bin", "manifest.json"]
    # the flat layout, tried first, holds nothing: probed quietly, no "failed" line before the success
    assert not any("failed" in line for line in log) and sum("<-" in line for line in log) == 2


def test_url_mirror_and_registry_urls(tmp_path, tiny):
    put(tmp_path / "web")
    tiny(urls=[(tmp_path / "web").as_uri()])  # no trailing slash: it is added
    fetch_dataset("tiny", tmp_path / "d1", log=Log())  # from the registry URL alone
    assert listing(tmp_path / "d1") == ["a.bin", "b.bin", "manifest.json"]
    tiny()
    fetch_dataset("tiny", tmp_path / "d2", mirrors=[(tmp_path / "web").as_uri() + "/"], log=Log())
    assert listing(tmp_path / "d2") == ["a.bin", "b.bin", "manifest.json"]


def test_source_order(tmp_path, tiny):
    spec = tiny(urls=["https://example.org/data"])
    bases = source_bases(spec, [tmp_path / "m", "http://mirror.example/x/"])
    assert bases == [
        (tmp_path / "m").as_uri() + "/",
        (tmp_path / "m" / "tiny").as_uri() + "/",
        "http://mirror.example/x/",
        "https://example.org/data/",
    ]


def test_cached_files_are_not_fetched_again(tmp_path, tiny):
    tiny()
    mirror = put(tmp_path / "mirror")
    dest = tmp_path / "dest"
    fetch_dataset("tiny", dest, mirrors=[mirror], log=Log())
    for path in mirror.iterdir():
        path.unlink()
    mirror.rmdir()
    (dest / "manifest.json").unlink()
    log = Log()
    fetch_dataset("tiny", dest, mirrors=[mirror], log=log)
    assert sum("ok (archive md5 matches the published file; cached)" in line for line in log) == 2
    assert not any("<-" in line for line in log)
    assert (dest / "manifest.json").is_file()


def test_wrong_checksum_falls_back_to_next_mirror(tmp_path, tiny):
    tiny()
    bad = put(tmp_path / "bad", {"a.bin": b"tampered", "b.bin": FILES["b.bin"]})
    good = put(tmp_path / "good")
    log = Log()
    fetch_dataset("tiny", tmp_path / "dest", mirrors=[bad, good], log=log)
    assert (tmp_path / "dest" / "a.bin").read_bytes() == FILES["a.bin"]
    assert any("checksum mismatch" in line for line in log)
    assert listing(tmp_path / "dest") == ["a.bin", "b.bin", "manifest.json"]


def test_existing_file_with_wrong_checksum_is_replaced(tmp_path, tiny):
    tiny()
    dest = put(tmp_path / "dest", {"a.bin": b"stale"})
    fetch_dataset("tiny", dest, mirrors=[put(tmp_path / "mirror")], log=Log())
    assert (dest / "a.bin").read_bytes() == FILES["a.bin"]


def test_all_sources_fail(tmp_path, tiny):
    tiny(urls=[(tmp_path / "gone").as_uri()])
    bad = put(tmp_path / "bad", {"a.bin": b"tampered"})
    dest = tmp_path / "dest"
    with pytest.raises(GpunnError) as err:
        fetch_dataset("tiny", dest, mirrors=[bad, tmp_path / "missing"], timeout=5, log=Log())
    msg = str(err.value)
    assert "\n" not in msg
    assert "a.bin" in msg and md5(FILES["a.bin"]) in msg
    assert (bad / "a.bin").as_uri() in msg and "checksum mismatch" in msg
    assert (tmp_path / "missing" / "a.bin").as_uri() in msg
    assert (tmp_path / "missing" / "tiny" / "a.bin").as_uri() in msg
    assert (tmp_path / "gone" / "a.bin").as_uri() in msg
    assert "No such file" in msg
    assert str(dest) in msg and "--mirror" in msg and "data.mirror_dir" in msg
    assert listing(dest) == []  # no partial or temporary file, no manifest


def test_offline_dataset_without_mirror_says_how_to_generate(tmp_path):
    with pytest.raises(GpunnError) as err:
        fetch_dataset("digits8", tmp_path / "dest", log=Log())
    msg = str(err.value)
    assert "no sources" in msg and "write_offline_dataset" in msg
    assert listing(tmp_path / "dest") == []


def test_unknown_dataset(tmp_path):
    with pytest.raises(GpunnError, match="unknown dataset"):
        fetch_dataset("nope", tmp_path, log=Log())


# ---------------------------------------------------------------------------------------- content md5s

def test_recompressed_copy_is_accepted_by_its_content_md5(tmp_path, tinygz):
    tinygz()
    mirror = put(tmp_path / "mirror", {"a.gz": RECOMPRESSED["a.gz"], "b.gz": PUBLISHED["b.gz"]})
    dest = tmp_path / "dest"
    log = Log()
    result = fetch_dataset("tinygz", dest, mirrors=[mirror], log=log)
    assert (dest / "a.gz").read_bytes() == RECOMPRESSED["a.gz"]  # stored as fetched, not re-encoded
    assert result == {"a.gz": md5(RECOMPRESSED["a.gz"]), "b.gz": md5(PUBLISHED["b.gz"])}
    line_a = next(line for line in log if line.startswith("tinygz: a.gz ok"))
    line_b = next(line for line in log if line.startswith("tinygz: b.gz ok"))
    assert "ok (content md5 matches: re-compressed copy of the published data;" in line_a
    assert "ok (archive md5 matches the published file;" in line_b
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["files"] == result
    assert manifest["checks"]["a.gz"]["check"] == "content"
    assert manifest["checks"]["a.gz"]["content_md5"] == md5(CONTENT["a.gz"])
    assert manifest["checks"]["a.gz"]["md5"] == md5(RECOMPRESSED["a.gz"])
    assert manifest["checks"]["a.gz"]["size"] == len(RECOMPRESSED["a.gz"])
    assert manifest["checks"]["b.gz"]["check"] == "archive" and "content_md5" not in manifest["checks"]["b.gz"]


def test_cached_recompressed_copy_is_kept(tmp_path, tinygz):
    tinygz()
    dest = put(tmp_path / "dest", RECOMPRESSED)
    log = Log()
    fetch_dataset("tinygz", dest, log=log)  # no source at all: both must be accepted in place
    assert sum("ok (content md5 matches: re-compressed copy of the published data; cached)" in line
               for line in log) == 2
    assert not any("<-" in line for line in log)
    assert {c["check"] for c in json.loads((dest / "manifest.json").read_text())["checks"].values()} == {"content"}


def test_valid_gzip_with_altered_content_is_rejected(tmp_path, tinygz):
    tinygz()
    altered = bytearray(CONTENT["a.gz"])
    altered[1000] ^= 0xFF
    bad = put(tmp_path / "bad", {"a.gz": gzip.compress(bytes(altered), mtime=0), "b.gz": PUBLISHED["b.gz"]})
    good = put(tmp_path / "good", RECOMPRESSED)
    log = Log()
    fetch_dataset("tinygz", tmp_path / "dest", mirrors=[bad, good], log=log)
    assert (tmp_path / "dest" / "a.gz").read_bytes() == RECOMPRESSED["a.gz"]
    failed = next(line for line in log if line.startswith("tinygz: a.gz failed"))
    assert "checksum mismatch" in failed and md5(bytes(altered)) in failed and md5(CONTENT["a.gz"]) in failed
    # and with no good source left: one line naming both accepted checksums
    with pytest.raises(GpunnError) as err:
        fetch_dataset("tinygz", tmp_path / "dest2", mirrors=[bad], log=Log())
    msg = str(err.value)
    assert "\n" not in msg and "a.gz" in msg
    assert f"md5 {md5(PUBLISHED['a.gz'])}, or content md5 {md5(CONTENT['a.gz'])}" in msg
    assert f"content md5 {md5(bytes(altered))}" in msg
    assert sorted(p.name for p in (tmp_path / "dest2").iterdir()) == []


def test_cached_file_with_altered_content_is_fetched_again(tmp_path, tinygz):
    tinygz()
    dest = put(tmp_path / "dest", {"a.gz": gzip.compress(b"something else", mtime=0)})
    log = Log()
    fetch_dataset("tinygz", dest, mirrors=[put(tmp_path / "mirror", PUBLISHED)], log=log)
    assert (dest / "a.gz").read_bytes() == PUBLISHED["a.gz"]
    assert any("a.gz exists but failed" in line and "content md5" in line for line in log)


def test_not_gzip_data_is_rejected_by_the_content_check(tmp_path, tinygz):
    tinygz()
    bad = put(tmp_path / "bad", {"a.gz": b"not gzip at all", "b.gz": PUBLISHED["b.gz"][:-5]})  # b: truncated
    with pytest.raises(GpunnError) as err:
        fetch_dataset("tinygz", tmp_path / "dest", mirrors=[bad], log=Log())
    assert "not valid gzip data" in str(err.value) and "a.gz" in str(err.value)
    log = Log()
    with pytest.raises(GpunnError):
        fetch_dataset("tinygz", tmp_path / "dest", mirrors=[put(tmp_path / "ok", {"a.gz": PUBLISHED["a.gz"]}), bad],
                      log=log)
    assert any(line.startswith("tinygz: b.gz failed") and "not valid gzip data" in line for line in log)


def test_without_content_md5_only_the_published_file_is_accepted(tmp_path, tinygz):
    tinygz(content=False)
    with pytest.raises(GpunnError) as err:
        fetch_dataset("tinygz", tmp_path / "dest", mirrors=[put(tmp_path / "m", RECOMPRESSED)], log=Log())
    msg = str(err.value)
    assert "checksum mismatch" in msg and "content md5" not in msg
    fetch_dataset("tinygz", tmp_path / "dest", mirrors=[put(tmp_path / "p", PUBLISHED)], log=Log())


def test_refetch_removes_the_old_manifest_first(tmp_path, tiny):
    tiny()
    mirror = put(tmp_path / "mirror")
    dest = tmp_path / "dest"
    fetch_dataset("tiny", dest, mirrors=[mirror], log=Log())
    (dest / "b.bin").write_bytes(b"damaged")
    (mirror / "b.bin").unlink()
    with pytest.raises(GpunnError):
        fetch_dataset("tiny", dest, mirrors=[mirror], log=Log())
    # the directory is incomplete now: no manifest may vouch for it
    assert listing(dest) == ["a.bin", "b.bin"]
