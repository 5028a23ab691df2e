import json
import shutil

import numpy as np
import pytest

from gpunn.data import registry
from gpunn.data.cifar import write_cifar10_tar
from gpunn.data.download import fetch_dataset, md5sum
from gpunn.data.idx import read_idx, write_idx
from gpunn.data.offline import write_offline_dataset
from gpunn.data.prepare import Prepared, load_prepared, load_raw, prepare_dataset
from gpunn.errors import GpunnError


def quiet(_line):
    pass


@pytest.fixture
def verified(monkeypatch):
    """Make a directory of hand-written raw files pass prepare's integrity check: register their md5s
    as dataset `name`'s archive md5s (for this test only) and let fetch_dataset accept them in place,
    which writes the manifest."""
    def register(directory, name="mnist"):
        spec = registry.get_dataset(name)
        files = {f: md5sum(directory / f) for f in spec.files}
        monkeypatch.setitem(registry.DATASETS, name,
                            registry.DatasetSpec(**{**spec.__dict__, "files": files, "content_md5": {}}))
        fetch_dataset(name, directory, log=quiet)
        return directory
    return register


@pytest.fixture(scope="module")
def digits8_offline(tmp_path_factory):
    """digits8 as written by its generator (a small real dataset, about a second to write)."""
    out = tmp_path_factory.mktemp("offline") / "digits8"
    write_offline_dataset("digits8", out, log=quiet)
    return out


def indexed_images(n, h=28, w=28):
    """Images whose first two pixels encode their index, so a split can be traced back."""
    x = np.zeros((n, h, w), dtype=np.uint8)
    x[:, 0, 0] = np.arange(n) // 256
    x[:, 0, 1] = np.arange(n) % 256
    return x


def image_ids(x):
    flat = x.reshape(len(x), -1)
    return flat[:, 0].astype(int) * 256 + flat[:, 1]


def write_mnist_like(directory, n_train=300, n_test=50, train_labels=None, test_images=None):
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte.gz", indexed_images(n_train))
    labels = (np.arange(n_train) % 10).astype(np.uint8) if train_labels is None else train_labels
    write_idx(directory / "train-labels-idx1-ubyte.gz", labels)
    write_idx(directory / "t10k-images-idx3-ubyte.gz", indexed_images(n_test) if test_images is None else test_images)
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", (np.arange(n_test) % 10).astype(np.uint8))
    return directory


def test_load_raw_idx(tmp_path):
    raw = load_raw("mnist", write_mnist_like(tmp_path))
    assert raw["x_train"].shape == (300, 1, 28, 28) and raw["x_test"].shape == (50, 1, 28, 28)
    assert raw["y_train"].dtype == np.uint8 and raw["class_names"][0] == "0"
    assert list(image_ids(raw["x_train"])) == list(range(300))


def test_load_raw_cifar(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    y = (np.arange(20) % 10).astype(np.uint8)
    names = [f"c{i}" for i in range(10)]
    write_cifar10_tar(tmp_path / "cifar-10-binary.tar.gz", x, y, x[:5], y[:5], names)
    raw = load_raw("cifar10", tmp_path)
    assert raw["x_train"].shape == (20, 3, 32, 32) and raw["class_names"] == names
    np.testing.assert_array_equal(raw["x_train"], x)


def test_count_mismatch(tmp_path):
    write_mnist_like(tmp_path, train_labels=np.zeros(299, dtype=np.uint8))
    with pytest.raises(GpunnError) as err:
        load_raw("mnist", tmp_path)
    assert "300 train images but 299 train labels" in str(err.value)
    assert str(tmp_path / "train-labels-idx1-ubyte.gz") in str(err.value)


def test_wrong_image_shape(tmp_path):
    write_mnist_like(tmp_path, test_images=np.zeros((50, 8, 8), dtype=np.uint8))
    with pytest.raises(GpunnError) as err:
        load_raw("mnist", tmp_path)
    assert str(tmp_path / "t10k-images-idx3-ubyte.gz") in str(err.value) and "28" in str(err.value)


def test_labels_out_of_range(tmp_path):
    labels = np.zeros(300, dtype=np.uint8)
    labels[7] = 12
    write_mnist_like(tmp_path, train_labels=labels)
    with pytest.raises(GpunnError, match="label 12 is out of range"):
        load_raw("mnist", tmp_path)


def test_missing_file(tmp_path):
    write_mnist_like(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(GpunnError) as err:
        load_raw("mnist", tmp_path)
    assert str(tmp_path / "t10k-labels-idx1-ubyte.gz") in str(err.value)


def test_prepare_standard_and_load(tmp_path, verified):
    raw = verified(write_mnist_like(tmp_path / "raw"))
    out = tmp_path / "prepared" / "mnist-standard.npz"
    p = prepare_dataset("mnist", raw, out, log=quiet)
    assert isinstance(p, Prepared)
    with np.load(out, allow_pickle=False) as npz:
        assert set(npz.files) == {"x_train", "y_train", "x_test", "y_test", "class_names", "dataset", "split"}
        assert npz["x_train"].dtype == np.uint8 and npz["x_train"].shape == (300, 1, 28, 28)
        assert npz["class_names"].dtype.kind == "U" and npz["dataset"].shape == () and str(npz["split"]) == "standard"
    q = load_prepared(out)
    assert (q.dataset, q.split, q.image_shape, q.num_classes) == ("mnist", "standard", (1, 28, 28), 10)
    assert list(image_ids(q.x_train)) == list(range(300))
    np.testing.assert_array_equal(q.y_test, np.arange(50) % 10)
    assert [f.name for f in out.parent.iterdir()] == [out.name]  # nothing else (no temp files)


def test_prepare_e2(tmp_path, verified):
    raw = verified(write_mnist_like(tmp_path / "raw", n_train=300))
    p = prepare_dataset("mnist", raw, tmp_path / "e2.npz", split="e2", e2_train=200, e2_test=60, seed=5, log=quiet)
    train, test = image_ids(p.x_train), image_ids(p.x_test)
    assert len(train) == 200 and len(test) == 60 and len(set(train) | set(test)) == 260
    assert set(train).isdisjoint(test) and max(max(train), max(test)) < 300
    np.testing.assert_array_equal(p.y_train, train % 10)  # labels follow their images
    np.testing.assert_array_equal(p.y_test, test % 10)
    q = prepare_dataset("mnist", raw, tmp_path / "e2b.npz", split="e2", e2_train=200, e2_test=60, seed=5, log=quiet)
    np.testing.assert_array_equal(image_ids(q.x_train), train)
    assert load_prepared(tmp_path / "e2.npz").split == "e2"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"split": "e2", "e2_train": 250, "e2_test": 60}, "splits.e2.train"),
    ({"split": "e2", "e2_train": 0, "e2_test": 60}, "splits.e2.train"),
    ({"split": "e2", "e2_train": 10, "e2_test": "many"}, "splits.e2.test"),
    ({"split": "random"}, "unknown split"),
])
def test_bad_split_arguments(tmp_path, verified, kwargs, fragment):
    raw = verified(write_mnist_like(tmp_path / "raw"))
    with pytest.raises(GpunnError, match=fragment):
        prepare_dataset("mnist", raw, tmp_path / "x.npz", log=quiet, **kwargs)
    assert not (tmp_path / "x.npz").exists()


def test_load_prepared_errors(tmp_path, verified):
    with pytest.raises(GpunnError, match="not found"):
        load_prepared(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(GpunnError) as err:
        load_prepared(bad)
    assert str(bad) in str(err.value) and "corrupt" in str(err.value)
    partial = tmp_path / "partial.npz"
    np.savez(partial, x_train=np.zeros((2, 1, 2, 2), np.uint8))
    with pytest.raises(GpunnError, match="lacks y_train"):
        load_prepared(partial)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x_train=np.zeros((2, 1, 2, 2), np.uint8), y_train=np.zeros(3, np.uint8),
             x_test=np.zeros((1, 1, 2, 2), np.uint8), y_test=np.zeros(1, np.uint8),
             class_names=np.array(["a", "b"]), dataset=np.array("d"), split=np.array("standard"))
    with pytest.raises(GpunnError, match="2 train images but 3 train labels"):
        load_prepared(wrong)
    # a truncated file
    good = tmp_path / "good.npz"
    prepare_dataset("mnist", verified(write_mnist_like(tmp_path / "raw")), good, log=quiet)
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(GpunnError, match="corrupt"):
        load_prepared(good)


# ---------------------------------------------------------------------------------------- integrity

def fetched_digits8(digits8_offline, raw):
    fetch_dataset("digits8", raw, mirrors=[digits8_offline], log=quiet)
    return raw


def assert_rejected(raw, out, *fragments, name="digits8"):
    with pytest.raises(GpunnError) as err:
        prepare_dataset(name, raw, out, log=quiet)
    msg = str(err.value)
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    assert f"gpunn download {name} --dest {raw}" in msg and "re-run the pipeline" in msg
    assert not out.exists() and list(out.parent.glob("*.tmp")) == []  # no output, no partial file
    return msg


def test_prepare_accepts_the_verified_download(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    p = prepare_dataset("digits8", raw, tmp_path / "out" / "d.npz", log=quiet)
    assert p.x_train.shape == (1437, 1, 8, 8)


def test_prepare_rejects_a_valid_gzip_with_altered_pixels(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    path = raw / "train-images-idx3-ubyte.gz"
    recorded = md5sum(path)
    images = read_idx(path)
    images[0, 3, 3] ^= 0x40
    write_idx(path, images)  # a well-formed IDX gzip: only the checksums can tell
    read_idx(path)
    out = tmp_path / "out" / "d.npz"
    out.parent.mkdir()
    assert_rejected(raw, out, str(path), f"md5 {md5sum(path)}", f"recorded md5 {recorded}", "changed")


def test_prepare_rejects_a_missing_manifest(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    (raw / "manifest.json").unlink()
    out = tmp_path / "d.npz"
    assert_rejected(raw, out, str(raw / "manifest.json"), "not found", "never verified")


def test_prepare_rejects_a_missing_file(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    assert_rejected(raw, tmp_path / "d.npz", str(raw / "t10k-labels-idx1-ubyte.gz"), "missing",
                    registry.get_dataset("digits8").files["t10k-labels-idx1-ubyte.gz"])


def test_prepare_rejects_a_file_of_another_size(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    path = raw / "t10k-images-idx3-ubyte.gz"
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\0")
    assert_rejected(raw, tmp_path / "d.npz", str(path), f"{size + 1} bytes", f"recorded {size} bytes")


def test_prepare_rejects_a_manifest_of_another_dataset(tmp_path, digits8_offline):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    manifest = json.loads((raw / "manifest.json").read_text())
    manifest["dataset"] = "digits28"
    (raw / "manifest.json").write_text(json.dumps(manifest))
    assert_rejected(raw, tmp_path / "d.npz", "'digits28'", "not 'digits8'")


def test_prepare_rejects_a_record_the_registry_no_longer_accepts(tmp_path, digits8_offline, monkeypatch):
    raw = fetched_digits8(digits8_offline, tmp_path / "raw")
    spec = registry.get_dataset("digits8")
    files = {**spec.files, "train-labels-idx1-ubyte.gz": "0" * 32}
    monkeypatch.setitem(registry.DATASETS, "digits8", registry.DatasetSpec(**{**spec.__dict__, "files": files}))
    assert_rejected(raw, tmp_path / "d.npz", str(raw / "train-labels-idx1-ubyte.gz"), "0" * 32, "registry")


def test_prepare_reads_a_version_1_manifest(tmp_path, digits8_offline):
    """Raw directories downloaded by older gpunn ({"dataset", "files"} only) stay usable, and checked."""
    raw = tmp_path / "raw"
    shutil.copytree(digits8_offline, raw)
    files = registry.get_dataset("digits8").files
    (raw / "manifest.json").write_text(json.dumps({"dataset": "digits8", "files": files}))
    prepare_dataset("digits8", raw, tmp_path / "d.npz", log=quiet)
    labels = read_idx(raw / "train-labels-idx1-ubyte.gz")
    labels[0] = (labels[0] + 1) % 10
    write_idx(raw / "train-labels-idx1-ubyte.gz", labels)
    assert_rejected(raw, tmp_path / "d2.npz", "train-labels-idx1-ubyte.gz", files["train-labels-idx1-ubyte.gz"])
