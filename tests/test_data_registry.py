import re

import pytest

from gpunn.data import registry
from gpunn.data.registry import DATASETS, DatasetSpec, get_dataset
from gpunn.errors import GpunnError

MD5 = re.compile(r"^[0-9a-f]{32}$")


def test_known_datasets():
    assert set(DATASETS) == {
        "mnist", "fashion_mnist", "cifar10",
        "synthetic_mnist", "synthetic_mnist_small", "synthetic_cifar10", "synthetic_cifar10_small",
        "digits8", "digits28",
    }
    for name, spec in DATASETS.items():
        assert isinstance(spec, DatasetSpec) and spec.name == name
        assert spec.kind in ("idx", "cifar10")
        assert all(MD5.match(md5) for md5 in spec.files.values()), name
        assert len(spec.class_names) == 10
        assert spec.description
        if spec.kind == "idx":
            assert tuple(spec.files) == registry.IDX_FILES
        else:
            assert tuple(spec.files) == (registry.CIFAR_ARCHIVE,)
            assert spec.image_shape == (3, 32, 32)
        if spec.offline:
            assert spec.urls == ()
        else:
            assert spec.urls and all(u.endswith("/") for u in spec.urls)


def test_real_checksums_and_shapes():
    mnist = get_dataset("mnist")
    assert mnist.files["train-images-idx3-ubyte.gz"] == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert mnist.files["t10k-labels-idx1-ubyte.gz"] == "ec29112dd5afa0611ce80d1b7f02629c"
    assert get_dataset("fashion_mnist").files["train-labels-idx1-ubyte.gz"] == "25c81989df183df01b3e8a0aad5dffbe"
    assert get_dataset("cifar10").files == {"cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"}
    assert mnist.image_shape == (1, 28, 28)
    assert get_dataset("digits8").image_shape == (1, 8, 8)
    assert get_dataset("digits28").image_shape == (1, 28, 28)
    assert get_dataset("synthetic_mnist").image_shape == (1, 28, 28)
    assert get_dataset("cifar10").class_names[0] == "airplane"


def test_offline_checksums_are_distinct():
    seen = {}
    for spec in DATASETS.values():
        for file_name, md5 in spec.files.items():
            seen.setdefault(md5, set()).add((spec.name, file_name))
    # only the digits label files are shared (digits8 and digits28 use the same split)
    shared = [v for v in seen.values() if len(v) > 1]
    assert all({name for name, _ in v} == {"digits8", "digits28"} for v in shared)


def test_unknown_dataset_lists_known_names():
    with pytest.raises(GpunnError) as err:
        get_dataset("mnsit")
    msg = str(err.value)
    assert "mnsit" in msg and "mnist" in msg and "synthetic_cifar10_small" in msg
    assert "\n" not in msg


def test_spec_is_frozen():
    spec = get_dataset("mnist")
    with pytest.raises(Exception):
        spec.name = "other"
