import gzip
import io
import tarfile

import numpy as np
import pytest

from gpunn.data.cifar import (
    EXPECTED_MEMBERS,
    META_MEMBER,
    RECORD_BYTES,
    TEST_MEMBER,
    TRAIN_MEMBERS,
    read_cifar10_tar,
    write_cifar10_tar,
)
from gpunn.errors import GpunnError

NAMES = [f"class{i}" for i in range(10)]


def make_arrays(n_train=23, n_test=7, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8),
        rng.integers(0, 10, n_train, dtype=np.uint8),
        rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8),
        rng.integers(0, 10, n_test, dtype=np.uint8),
    )


def records(x, y):
    return b"".join(bytes([int(label)]) + img.tobytes() for img, label in zip(x, y))


def build_tar(path, members, compress=True):
    """members: list of (name, bytes) or (name, TarInfo-modifier callable returning a TarInfo)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in members:
            if callable(content):
                tar.addfile(content(name))
            else:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def standard_members(x_train, y_train, x_test, y_test, names=NAMES):
    members = [(META_MEMBER, ("\n".join(names) + "\n").encode())]
    for member, idx in zip(TRAIN_MEMBERS, np.array_split(np.arange(len(y_train)), 5)):
        members.append((member, records(x_train[idx], y_train[idx])))
    members.append((TEST_MEMBER, records(x_test, y_test)))
    return members


def assert_error(path, *fragments):
    with pytest.raises(GpunnError) as err:
        read_cifar10_tar(path)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


def test_roundtrip(tmp_path):
    x_train, y_train, x_test, y_test = make_arrays()
    path = tmp_path / "cifar-10-binary.tar.gz"
    write_cifar10_tar(path, x_train, y_train, x_test, y_test, NAMES)
    data = read_cifar10_tar(path)
    np.testing.assert_array_equal(data["x_train"], x_train)
    np.testing.assert_array_equal(data["y_train"], y_train)
    np.testing.assert_array_equal(data["x_test"], x_test)
    np.testing.assert_array_equal(data["y_test"], y_test)
    assert data["class_names"] == NAMES
    assert data["x_train"].dtype == np.uint8 and data["x_train"].shape == (23, 3, 32, 32)
    with tarfile.open(path) as tar:
        sizes = {m.name: m.size for m in tar.getmembers() if m.isreg()}
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in tar.getmembers())
    assert set(sizes) == set(EXPECTED_MEMBERS)
    assert [sizes[m] // RECORD_BYTES for m in TRAIN_MEMBERS] == [5, 5, 5, 4, 4]
    assert sizes[TEST_MEMBER] == 7 * RECORD_BYTES


def test_write_is_deterministic(tmp_path):
    arrays = make_arrays()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_cifar10_tar(tmp_path / "a" / "c.tar.gz", *arrays, NAMES)
    write_cifar10_tar(tmp_path / "b" / "c.tar.gz", *arrays, NAMES)
    assert (tmp_path / "a" / "c.tar.gz").read_bytes() == (tmp_path / "b" / "c.tar.gz").read_bytes()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["c.tar.gz"]


def test_reads_a_plain_tar_and_any_member_order(tmp_path):
    arrays = make_arrays()
    members = standard_members(*arrays)[::-1]
    data = read_cifar10_tar(build_tar(tmp_path / "plain.tar", members, compress=False))
    np.testing.assert_array_equal(data["y_train"], arrays[1])
    np.testing.assert_array_equal(data["x_test"], arrays[2])


def test_meta_with_blank_lines(tmp_path):
    arrays = make_arrays()
    members = standard_members(*arrays)
    members[0] = (META_MEMBER, ("\n".join(NAMES) + "\n\n\n").encode())
    assert read_cifar10_tar(build_tar(tmp_path / "c.tar.gz", members))["class_names"] == NAMES
    members[0] = (META_MEMBER, b"a\nb\n")
    assert_error(build_tar(tmp_path / "d.tar.gz", members), META_MEMBER, "2 class names")


def test_missing_member(tmp_path):
    members = [m for m in standard_members(*make_arrays()) if m[0] != TRAIN_MEMBERS[2]]
    path = build_tar(tmp_path / "c.tar.gz", members)
    assert_error(path, "lacks member", TRAIN_MEMBERS[2])


def test_missing_file(tmp_path):
    assert_error(tmp_path / "none.tar.gz", "not found")


def test_truncated_record(tmp_path):
    members = standard_members(*make_arrays())
    name, blob = members[1]
    members[1] = (name, blob[:-100])
    path = build_tar(tmp_path / "c.tar.gz", members)
    assert_error(path, name, "truncated", f"{RECORD_BYTES - 100} bytes of a cut record")


def test_empty_batch(tmp_path):
    members = standard_members(*make_arrays())
    members[-1] = (TEST_MEMBER, b"")
    assert_error(build_tar(tmp_path / "c.tar.gz", members), TEST_MEMBER, "empty")


def test_label_out_of_range(tmp_path):
    x_train, y_train, x_test, y_test = make_arrays()
    members = standard_members(x_train, y_train, x_test, y_test)
    blob = bytearray(members[-1][1])
    blob[2 * RECORD_BYTES] = 10
    members[-1] = (TEST_MEMBER, bytes(blob))
    assert_error(build_tar(tmp_path / "c.tar.gz", members), TEST_MEMBER, "record 2 has label 10")


def test_truncated_archive(tmp_path):
    path = tmp_path / "c.tar.gz"
    write_cifar10_tar(path, *make_arrays(), NAMES)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    assert_error(path, "corrupt or truncated archive")


def test_damage_in_a_stored_archive_is_caught_by_the_crc(tmp_path):
    path = tmp_path / "c.tar.gz"
    write_cifar10_tar(path, *make_arrays(), NAMES)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a stored deflate block: only the gzip CRC can tell
    path.write_bytes(bytes(data))
    assert_error(path, "corrupt or truncated archive", "CRC")
    path.write_bytes(bytes(data[:-4]))  # the very end cut off
    assert_error(path, "corrupt or truncated archive")


def test_corrupt_gzip(tmp_path):
    path = build_tar(tmp_path / "c.tar.gz", standard_members(*make_arrays()))
    data = bytearray(path.read_bytes())
    for i in range(100, 400):
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))
    assert_error(path, "corrupt or truncated archive")
    path.write_bytes(b"this is not an archive at all" * 100)
    assert_error(path, "corrupt or truncated archive")


def test_path_traversal_members_are_ignored(tmp_path):
    arrays = make_arrays()
    evil = [("../../evil.bin", b"x" * 10), ("/tmp/evil_abs.bin", b"y"),
            ("cifar-10-batches-bin/../../evil2.bin", b"z")]
    members = standard_members(*arrays) + evil
    work = tmp_path / "work"
    work.mkdir()
    data = read_cifar10_tar(build_tar(work / "c.tar.gz", members))
    np.testing.assert_array_equal(data["y_test"], arrays[3])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["c.tar.gz", "work"]  # nothing extracted


def test_traversal_alias_of_an_expected_name_is_not_used(tmp_path):
    members = standard_members(*make_arrays())
    name, blob = members[1]
    members[1] = ("cifar-10-batches-bin/../cifar-10-batches-bin/" + name.split("/")[-1], blob)
    assert_error(build_tar(tmp_path / "c.tar.gz", members), "lacks member", name)


def test_non_regular_member_rejected(tmp_path):
    def symlink(name):
        info = tarfile.TarInfo(name)
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        return info

    members = standard_members(*make_arrays())
    members[2] = (members[2][0], symlink)
    assert_error(build_tar(tmp_path / "c.tar.gz", members), members[2][0], "not a regular file")


def test_duplicate_member_rejected(tmp_path):
    members = standard_members(*make_arrays())
    members.append(members[1])
    assert_error(build_tar(tmp_path / "c.tar.gz", members), members[1][0], "twice")


def test_writer_validates(tmp_path):
    x_train, y_train, x_test, y_test = make_arrays()
    with pytest.raises(ValueError):
        write_cifar10_tar(tmp_path / "c.tar.gz", x_train[:, :2], y_train, x_test, y_test, NAMES)
    with pytest.raises(ValueError):
        write_cifar10_tar(tmp_path / "c.tar.gz", x_train, y_train + 10, x_test, y_test, NAMES)
    with pytest.raises(ValueError):
        write_cifar10_tar(tmp_path / "c.tar.gz", x_train, y_train, x_test, y_test, NAMES[:9])
    with pytest.raises(TypeError):
        write_cifar10_tar(tmp_path / "c.tar.gz", x_train.astype(np.int32), y_train, x_test, y_test, NAMES)
    assert list(tmp_path.iterdir()) == []
