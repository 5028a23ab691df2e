import dataclasses
import re

import pytest

from gpunn.data import registry
from gpunn.data.integrity import content_md5sum, md5sum
from gpunn.data.offline import write_offline_dataset
from gpunn.data.registry import DATASETS, DatasetSpec, get_dataset
from gpunn.errors import GpunnError

MD5 = re.compile(r"^[0-9a-f]{32}$")


def test_known_datasets():
    assert set(DATASETS) == {
        "mnist", "fashion_mnist", "cifar10",
        "synthetic_mnist", "synthetic_mnist_small", "synthetic_cifar10", "synthetic_cifar10_small",
        "digits8", "digits28", "digits8_mini",
    }
    for name, spec in DATASETS.items():
        assert isinstance(spec, DatasetSpec) and spec.name == name
        assert spec.kind in ("idx", "cifar10")
        assert all(MD5.match(md5) for md5 in spec.files.values()), name
        assert set(spec.content_md5) == set(spec.files), name  # every file says what is known
        assert all(md5 is None or MD5.match(md5) for md5 in spec.content_md5.values()), name
        assert all(spec.content_md5_of(f) == spec.content_md5[f] for f in spec.files)
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


def test_real_content_checksums():
    """The md5s of the decompressed files (ANCHORS.md section 4); CIFAR-10's is not known."""
    assert get_dataset("mnist").content_md5 == {
        "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
    }
    assert get_dataset("fashion_mnist").content_md5 == {
        "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
    }
    assert get_dataset("cifar10").content_md5 == {"cifar-10-binary.tar.gz": None}
    assert get_dataset("cifar10").content_md5_of("cifar-10-binary.tar.gz") is None
    # every offline file has both checksums
    for spec in DATASETS.values():
        if spec.offline:
            assert all(spec.content_md5[f] for f in spec.files), spec.name


@pytest.mark.parametrize("name", ["synthetic_mnist_small", "synthetic_cifar10_small", "digits8", "digits28"])
def test_generated_files_match_both_checksums(tmp_path, name):
    """The registry's content md5s of the offline datasets are those of their generators' output (the
    full-size synthetic_mnist / synthetic_cifar10 were computed the same way, once; too slow to repeat
    here)."""
    spec = get_dataset(name)
    write_offline_dataset(name, tmp_path, log=lambda _: None)  # raises if an archive md5 differs
    for file_name in spec.files:
        assert md5sum(tmp_path / file_name) == spec.files[file_name], file_name
        assert content_md5sum(tmp_path / file_name) == spec.content_md5[file_name], file_name


def test_content_md5_only_for_the_files_of_the_dataset():
    with pytest.raises(ValueError, match="content md5"):
        DatasetSpec(name="x", kind="idx", files={"a": "0" * 32}, urls=(), image_shape=(1, 2, 2),
                    class_names=("a", "b"), offline=True, description="x", content_md5={"b": "1" * 32})


def test_offline_checksums_are_distinct():
    seen = {}
    for spec in DATASETS.values():
        for file_name, md5 in [*spec.files.items(), *spec.content_md5.items()]:
            if md5 is not None:
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
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"


def test_split_sizes_are_the_recipes_and_the_descriptions():
    """SPLIT_SIZES (the report's notes on synthetic data state them) agree with what the offline recipes generate and
    with each dataset's description; a synthetic dataset imitates the real one of its name."""
    from gpunn.data.offline import OFFLINE_RECIPES
    from gpunn.data.registry import SPLIT_SIZES, imitated
    for name, (n_train, n_test) in SPLIT_SIZES.items():
        assert f"{n_train} train / {n_test} test" in get_dataset(name).description, name
        if name.startswith("synthetic_"):
            assert OFFLINE_RECIPES[name][1][:2] == (n_train, n_test), name
            assert imitated(name) in SPLIT_SIZES
    assert imitated("synthetic_mnist_small") == "mnist" and imitated("synthetic_cifar10") == "cifar10"
    assert imitated("digits8") is None and imitated("mnist") is None
