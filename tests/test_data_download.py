import hashlib
import json

import pytest

from gpunn.data import registry
from gpunn.data.download import fetch_dataset, md5sum, source_bases
from gpunn.data.registry import DatasetSpec
from gpunn.errors import GpunnError

FILES = {"a.bin": b"first file\n" * 1000, "b.bin": b"\x00\x01second" * 50}


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
    assert json.loads((dest / "manifest.json").read_text()) == {"dataset": "tiny", "files": result}
    assert any("file://" in line for line in log)


def test_mirror_subdirectory_named_after_the_dataset(tmp_path, tiny):
    tiny()
    put(tmp_path / "mirror" / "tiny")
    fetch_dataset("tiny", tmp_path / "dest", mirrors=[str(tmp_path / "mirror")], log=Log())
    assert listing(tmp_path / "dest") == ["a.bin", "b.bin", "manifest.json"]


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
    assert sum("ok (cached)" in line for line in log) == 2
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
