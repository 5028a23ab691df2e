import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from gpunn.data.download import md5sum
from gpunn.data.idx import StoredGzipWriter, read_idx, write_idx
from gpunn.data.registry import get_dataset
from gpunn.errors import GpunnError

REAL = Path(__file__).resolve().parents[2] / "shared/data/real"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = struct.pack(">HBB", 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def assert_error(path, *fragments):
    with pytest.raises(GpunnError) as err:
        read_idx(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


# ---------------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("shape", [(7,), (5, 28, 28), (3, 4), (2, 3, 4, 5), (0,), (0, 28, 28)])
def test_write_read_roundtrip(tmp_path, shape):
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, shape, dtype=np.uint8)
    path = tmp_path / "a-idx-ubyte.gz"
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.uint8 and back.shape == shape
    np.testing.assert_array_equal(back, array)
    # a standard gzip reader agrees, and the header is what the format says
    assert gzip.decompress(path.read_bytes()) == idx_bytes(array)


def test_read_raw_and_other_types(tmp_path):
    labels = np.arange(10, dtype=np.uint8)
    (tmp_path / "raw").write_bytes(idx_bytes(labels))
    np.testing.assert_array_equal(read_idx(tmp_path / "raw"), labels)
    floats = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)
    (tmp_path / "f32").write_bytes(idx_bytes(floats, 0x0D))
    back = read_idx(tmp_path / "f32")
    assert back.dtype == np.float32 and back.dtype.isnative
    np.testing.assert_array_equal(back, floats)
    ints = np.array([-5, 70000, 3], dtype=np.int32)
    (tmp_path / "i32.gz").write_bytes(gzip.compress(idx_bytes(ints, 0x0C)))
    np.testing.assert_array_equal(read_idx(tmp_path / "i32.gz"), ints)


def test_write_is_deterministic_and_atomic(tmp_path):
    array = np.random.default_rng(1).integers(0, 256, (300, 28, 28), dtype=np.uint8)  # > one 64 KiB block
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_idx(tmp_path / "a" / "x.gz", array)
    write_idx(tmp_path / "b" / "x.gz", array)
    data = (tmp_path / "a" / "x.gz").read_bytes()
    assert data == (tmp_path / "b" / "x.gz").read_bytes()
    assert data[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0
    assert b"x\x00" in data[10:13]  # the name field is the file name without .gz
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.gz"]  # no temp files left
    with pytest.raises(TypeError):
        write_idx(tmp_path / "bad.gz", array.astype(np.int16))
    assert not (tmp_path / "bad.gz").exists()


@pytest.mark.parametrize("chunks", [[b""], [b"abc"], [b"x" * 65535], [b"x" * 65536], [b"y" * 100000, b"z" * 40000]])
def test_stored_gzip_writer(tmp_path, chunks):
    import io
    buf = io.BytesIO()
    with StoredGzipWriter(buf, "name") as gz:
        for chunk in chunks:
            gz.write(chunk)
    payload = b"".join(chunks)
    assert gzip.decompress(buf.getvalue()) == payload
    # the layout depends only on the content, not on how it was written
    other = io.BytesIO()
    with StoredGzipWriter(other, "name") as gz:
        for i in range(0, len(payload), 7777):
            gz.write(payload[i:i + 7777])
    assert other.getvalue() == buf.getvalue()


# ---------------------------------------------------------------------------------------- corrupt inputs

def test_missing_file(tmp_path):
    assert_error(tmp_path / "nope-idx1-ubyte.gz", "not found")


def test_truncated_labels(tmp_path):
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    full = idx_bytes(np.zeros(10000, dtype=np.uint8))
    path.write_bytes(gzip.compress(full[: 8 + 9000]))
    assert_error(path, "truncated IDX file", "header says 10000 items", "found 9000 bytes", "download again")


def test_truncated_images(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))[:-1]))
    assert_error(path, "truncated IDX file", "3x28x28")


def test_truncated_header(tmp_path):
    path = tmp_path / "h"
    path.write_bytes(struct.pack(">HBB", 0, 8, 3) + struct.pack(">I", 60000))
    assert_error(path, "truncated", "3 dimensions")
    path.write_bytes(b"\x00\x00")
    assert_error(path, "truncated")
    path.write_bytes(b"")
    assert_error(path, "truncated")


def test_trailing_bytes(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.arange(5, dtype=np.uint8)) + b"\x00\x01"))
    assert_error(path, "2 trailing bytes")


def test_wrong_magic(tmp_path):
    path = tmp_path / "labels.gz"
    data = bytearray(idx_bytes(np.arange(5, dtype=np.uint8)))
    data[0] = 0x12
    path.write_bytes(gzip.compress(bytes(data)))
    assert_error(path, "bad magic number 0x12000801")
    data[0] = 0
    data[2] = 0x07  # unknown type code
    path.write_bytes(gzip.compress(bytes(data)))
    assert_error(path, "bad magic number 0x00000701")
    path.write_bytes(b"<html>404 not found</html>")  # an error page saved under the file's name
    assert_error(path, "not an IDX file")


def test_wrong_dims(tmp_path):
    path = tmp_path / "zero-dims"
    path.write_bytes(struct.pack(">HBB", 0, 8, 0) + b"\x01\x02")
    assert_error(path, "0 dimensions")
    # a label file whose header says 2 dimensions reads as 2-D, with the size check on the product
    path = tmp_path / "two-dims"
    path.write_bytes(struct.pack(">HBBII", 0, 8, 2, 4, 5) + bytes(19))
    assert_error(path, "4x5 = 20 items", "found 19 bytes")


def test_corrupt_gzip(tmp_path):
    good = gzip.compress(idx_bytes(np.random.default_rng(0).integers(0, 256, (50, 28, 28), dtype=np.uint8)))
    path = tmp_path / "cut.gz"
    path.write_bytes(good[: len(good) // 2])
    assert_error(path, "corrupt gzip stream")
    flipped = bytearray(good)
    for i in range(200, 260):
        flipped[i] ^= 0x5A
    path = tmp_path / "flipped.gz"
    path.write_bytes(bytes(flipped))
    assert_error(path, "corrupt gzip stream")
    crc = bytearray(good)
    crc[-6] ^= 0xFF  # damage the CRC in the trailer
    path = tmp_path / "crc.gz"
    path.write_bytes(bytes(crc))
    assert_error(path, "corrupt gzip stream")


# ---------------------------------------------------------------------------------------- genuine files

@needs_real
@pytest.mark.parametrize("dataset, fname, counts", [
    ("mnist", "mnist-t10k-labels-idx1-ubyte.gz", [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]),
    ("fashion_mnist", "fashion-t10k-labels-idx1-ubyte.gz", [1000] * 10),
])
def test_real_test_labels(dataset, fname, counts):
    labels = read_idx(REAL / fname)
    assert labels.dtype == np.uint8 and labels.shape == (10000,)
    assert np.bincount(labels, minlength=10).tolist() == counts
    assert md5sum(REAL / fname) == get_dataset(dataset).files["t10k-labels-idx1-ubyte.gz"]


@needs_real
@pytest.mark.parametrize("dataset, fname", [
    ("mnist", "mnist-train-labels-idx1-ubyte.gz"),
    ("fashion_mnist", "fashion-train-labels-idx1-ubyte.gz"),
])
def test_real_train_labels(dataset, fname):
    labels = read_idx(REAL / fname)
    assert labels.shape == (60000,) and int(labels.max()) == 9
    assert md5sum(REAL / fname) == get_dataset(dataset).files["train-labels-idx1-ubyte.gz"]
    assert md5sum(REAL / fname) == hashlib.md5((REAL / fname).read_bytes()).hexdigest()


@needs_real
def test_real_labels_truncated_copy(tmp_path):
    raw = gzip.decompress((REAL / "mnist-t10k-labels-idx1-ubyte.gz").read_bytes())
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(raw[: 8 + 9000]))
    msg = assert_error(path, "header says 10000 items, found 9000 bytes")
    assert "delete it and run the download again" in msg
