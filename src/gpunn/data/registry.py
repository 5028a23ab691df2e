"""The datasets gpunn knows: file names, md5 checksums, download mirrors, image shapes and class names.

Every file has two checksums. The archive md5 (`DatasetSpec.files`) is the md5 of the file exactly as
published. The content md5 (`DatasetSpec.content_md5`) is the md5 of its decompressed bytes (the gunzipped
IDX file, or the gunzipped tar stream of a CIFAR archive): mirrors and rebuilt copies often re-compress the
same data with another gzip level, header time or file name, which changes the archive md5 but no pixel,
so a file is genuine if either matches (see `gpunn.data.integrity`). A content md5 of None means it is not
known; then only the archive md5 is accepted.

Real datasets (MNIST, Fashion-MNIST, CIFAR-10) are downloaded and checked against the published md5s.
Offline datasets are written locally by `gpunn.data.offline` in exactly the same file formats; both of
their md5 values below were computed once from the (byte-for-byte deterministic) generators, so a
regenerated file that no longer matches means the generator changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunn.errors import GpunnError

# The four MNIST-format files (identical names for MNIST, Fashion-MNIST and the offline IDX datasets).
TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
TEST_IMAGES = "t10k-images-idx3-ubyte.gz"
TEST_LABELS = "t10k-labels-idx1-ubyte.gz"
IDX_FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

# The single CIFAR-10 binary archive (real and offline CIFAR-like datasets).
CIFAR_ARCHIVE = "cifar-10-binary.tar.gz"

KINDS = ("idx", "cifar10")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    kind: str  # "idx" or "cifar10"
    files: dict[str, str]  # file name -> md5 (hex)
    urls: tuple[str, ...]  # base URLs, tried in order; a file's URL is base + file name
    image_shape: tuple[int, int, int]  # (C, H, W)
    class_names: tuple[str, ...]
    offline: bool  # generated locally by gpunn, not downloaded
    description: str
    # file name -> md5 of the decompressed bytes; None or absent: unknown (only the archive md5 is accepted)
    content_md5: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"dataset {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        unknown = set(self.content_md5) - set(self.files)
        if unknown:
            raise ValueError(f"dataset {self.name}: content md5 for files it does not have: {sorted(unknown)}")

    def content_md5_of(self, file_name: str) -> str | None:
        """The md5 of the decompressed bytes of file_name, or None where it is not known."""
        return self.content_md5.get(file_name)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


DIGIT_NAMES = tuple(str(d) for d in range(10))
FASHION_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
CIFAR10_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
# The CIFAR-like synthetic classes are textured shapes (see gpunn.data.synthetic); they are named for
# what they show, not after the CIFAR-10 objects, so that confusion matrices stay honest.
SYNTHETIC_CIFAR_NAMES = (
    "disc", "square", "triangle", "ring", "cross",
    "striped_disc", "striped_square", "striped_triangle", "striped_ring", "striped_cross",
)


def _idx_files(train_images, train_labels, test_images, test_labels) -> dict[str, str]:
    return {
        TRAIN_IMAGES: train_images,
        TRAIN_LABELS: train_labels,
        TEST_IMAGES: test_images,
        TEST_LABELS: test_labels,
    }


_SPECS = (
    DatasetSpec(
        name="mnist",
        kind="idx",
        files=_idx_files(
            "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3",
            "ec29112dd5afa0611ce80d1b7f02629c",
        ),
        content_md5=_idx_files(
            "6bbc9ace898e44ae57da46a324031adb",
            "a25bea736e30d166cdddb491f175f624",
            "2646ac647ad5339dbf082846283269ea",
            "27ae3e4e09519cfbb04c329615203637",
        ),
        urls=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        image_shape=(1, 28, 28),
        class_names=DIGIT_NAMES,
        offline=False,
        description="MNIST handwritten digits, 60000 train / 10000 test, 28x28 grey",
    ),
    DatasetSpec(
        name="fashion_mnist",
        kind="idx",
        files=_idx_files(
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "25c81989df183df01b3e8a0aad5dffbe",
            "bef4ecab320f06d8554ea6380940ec79",
            "bb300cfdad3c16e7a12a480ee83cd310",
        ),
        content_md5=_idx_files(
            "f4a8712d7a061bf5bd6d2ca38dc4d50a",
            "9018921c3c673c538a1fc5bad174d6f9",
            "8181f5470baa50b63fa0f6fddb340f0a",
            "15d484375f8d13e6eb1aabb0c3f46965",
        ),
        urls=(
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ),
        image_shape=(1, 28, 28),
        class_names=FASHION_NAMES,
        offline=False,
        description="Fashion-MNIST clothing images, 60000 train / 10000 test, 28x28 grey",
    ),
    DatasetSpec(
        name="cifar10",
        kind="cifar10",
        files={CIFAR_ARCHIVE: "c32a1d4ab5d03f1284b67883e8d87530"},
        # the md5 of the decompressed tar stream of the published archive is not known to us (no
        # trusted copy to compute it from): only the published archive itself is accepted
        content_md5={CIFAR_ARCHIVE: None},
        urls=("https://www.cs.toronto.edu/~kriz/",),
        image_shape=(3, 32, 32),
        class_names=CIFAR10_NAMES,
        offline=False,
        description="CIFAR-10 binary version, 50000 train / 10000 test, 3x32x32 colour",
    ),
    DatasetSpec(
        name="synthetic_mnist",
        kind="idx",
        files=_idx_files(
            "f6a5bcfb08a8c7f20902cdc91a3da6e4",
            "7b8d0da78e8ac0681db4eb32c40ca809",
            "4d987f2cb7474ac8742c19d34ea5f7c0",
            "aed7d99ca630a6bce5cfda655495e3fc",
        ),
        content_md5=_idx_files(
            "3426bdf2e2a543494e4bf72bccd7b1f0",
            "8d4ee5a6d24b1dae73ceb73daae1ad95",
            "b2aeb02dd3dd0f53b28f4a881c167b4b",
            "a7652e19d7fe7a50b1320f9935106171",
        ),
        urls=(),
        image_shape=(1, 28, 28),
        class_names=DIGIT_NAMES,
        offline=True,
        description="offline MNIST-like stroke digits with MNIST's shapes, 60000 train / 10000 test, "
                    "28x28 grey (GPU benchmarks without a download)",
    ),
    DatasetSpec(
        name="synthetic_mnist_small",
        kind="idx",
        files=_idx_files(
            "7c6e82579b072def0cfefe5dc9dae3df",
            "991f18e49b9b9e6b8a525815e78358a7",
            "517870712edc120a04778b98283a5dc9",
            "c3a182560971347226cd24d938a145bc",
        ),
        content_md5=_idx_files(
            "1872ed59ff0476064ea39e73598251fc",
            "96633b774e147fe08f1b6675b2c5420e",
            "da7e952cfc6434945ab52822e391f2b2",
            "50fb2d6afba911698a93e99dc75cff29",
        ),
        urls=(),
        image_shape=(1, 28, 28),
        class_names=DIGIT_NAMES,
        offline=True,
        description="offline MNIST-like stroke digits, 5000 train / 1000 test, 28x28 grey",
    ),
    DatasetSpec(
        name="synthetic_cifar10",
        kind="cifar10",
        files={CIFAR_ARCHIVE: "47fe8dd52c0c9dcdffc96c32755f65e6"},
        content_md5={CIFAR_ARCHIVE: "da2295dcac4ca394a1f6ad4a05515ce0"},
        urls=(),
        image_shape=(3, 32, 32),
        class_names=SYNTHETIC_CIFAR_NAMES,
        offline=True,
        description="offline CIFAR-like textured shapes with CIFAR-10's shapes, 50000 train / 10000 test, "
                    "3x32x32 colour",
    ),
    DatasetSpec(
        name="synthetic_cifar10_small",
        kind="cifar10",
        files={CIFAR_ARCHIVE: "0accd4c7bedb8db114713a08480c7065"},
        content_md5={CIFAR_ARCHIVE: "12ad3acc037ae0e747f1c75bb348c0f1"},
        urls=(),
        image_shape=(3, 32, 32),
        class_names=SYNTHETIC_CIFAR_NAMES,
        offline=True,
        description="offline CIFAR-like textured shapes, 2000 train / 500 test, 3x32x32 colour",
    ),
    DatasetSpec(
        name="digits8",
        kind="idx",
        files=_idx_files(
            "9575dd6e1e7edc1c314fb30c7d7dd7b2",
            "d8adf9e9d312a353c81a7531e6549a8c",
            "869fbe3a4af88908d223d98dfda296be",
            "0ad7afe43b15b0fa1d802638d3479e18",
        ),
        content_md5=_idx_files(
            "ff6cef495730f7e7f5b5165dd7393d4b",
            "f345115cb92857a170d3c61c6cb53d11",
            "f1b7265d5afc47d6d4fabd38588d4efa",
            "53b13aca79ed76eda5e4adc36d4e43e2",
        ),
        urls=(),
        image_shape=(1, 8, 8),
        class_names=DIGIT_NAMES,
        offline=True,
        description="scikit-learn's real handwritten digits (load_digits), 1437 train / 360 test, "
                    "8x8 grey rescaled to 0..255",
    ),
    DatasetSpec(
        name="digits28",
        kind="idx",
        files=_idx_files(
            "d6d9c836ed3b452b01d632759aa5bc2b",
            "d8adf9e9d312a353c81a7531e6549a8c",
            "ae54db7403f08aae09c5c91093166a88",
            "0ad7afe43b15b0fa1d802638d3479e18",
        ),
        content_md5=_idx_files(
            "8a3c0abb3a13062c4677f3a30a6ab7bb",
            "f345115cb92857a170d3c61c6cb53d11",
            "4a1571ecc8d4ee2f0f306a546fa29d6e",
            "53b13aca79ed76eda5e4adc36d4e43e2",
        ),
        urls=(),
        image_shape=(1, 28, 28),
        class_names=DIGIT_NAMES,
        offline=True,
        description="scikit-learn's real handwritten digits (load_digits) resized to 28x28 (bilinear), "
                    "1437 train / 360 test",
    ),
    DatasetSpec(
        name="digits8_mini",
        kind="idx",
        files=_idx_files(
            "ed03e0b89c64c26805dbb5289366b3c7",
            "c8957eaba14d0399989cf09832276616",
            "6957104d1295a9a6dd1fa9f2edd6b71a",
            "696e8edd4d9923fed8a29e044579705a",
        ),
        content_md5=_idx_files(
            "cdd903ebf60130c2de99c8583ee35b9f",
            "7db4628997c4f74926b6a7b09e1fa935",
            "c5ce17a0c346692df474e3ba595f5578",
            "b43785bb02e59b748e0207d797bad457",
        ),
        urls=(),
        image_shape=(1, 8, 8),
        class_names=DIGIT_NAMES,
        offline=True,
        description="the first 160 train / 40 test images of digits8 (real digits, 8x8): the conv models' GPU "
                    "variants under the CUDA simulator",
    ),
)

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in _SPECS}


# (train, test) images of the real datasets the synthetic ones imitate, and of the synthetic ones (their recipes in
# gpunn.data.offline generate these counts; tests/test_data_registry.py holds the two and the descriptions together)
SPLIT_SIZES = {
    "mnist": (60000, 10000), "fashion_mnist": (60000, 10000), "cifar10": (50000, 10000),
    "synthetic_mnist": (60000, 10000), "synthetic_mnist_small": (5000, 1000),
    "synthetic_cifar10": (50000, 10000), "synthetic_cifar10_small": (2000, 500),
}


def imitated(name: str) -> str | None:
    """The real dataset a synthetic one imitates in format ('synthetic_mnist_small' -> 'mnist'); None otherwise."""
    if not name.startswith("synthetic_"):
        return None
    real = name[len("synthetic_"):].removesuffix("_small")
    return real if real in DATASETS else None


def get_dataset(name: str) -> DatasetSpec:
    """The spec of a known dataset; an unknown name is a GpunnError listing the known ones."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise GpunnError(
            f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}"
        ) from None
