"""Datasets: registry, md5-verified downloads, IDX / CIFAR-10 parsers, offline datasets, prepared caches.

Flow: `fetch_dataset` (real data, or an offline dataset written by `write_offline_dataset` and given as a
mirror) -> raw files + manifest.json -> `prepare_dataset` (checks them against the manifest first) -> one
npz -> `load_prepared` in training code. `raw_status` tells cheaply whether a raw directory is still intact.
"""

from .cifar import read_cifar10_tar, write_cifar10_tar
from .digits import digits_arrays
from .download import fetch_dataset
from .idx import read_idx, write_idx
from .integrity import content_md5sum, md5sum, raw_status, verify_raw
from .offline import write_offline_dataset
from .prepare import Prepared, load_prepared, load_raw, prepare_dataset
from .registry import DATASETS, DatasetSpec, get_dataset
from .synthetic import make_cifar_like, make_mnist_like

__all__ = [
    "DATASETS", "DatasetSpec", "get_dataset",
    "read_idx", "write_idx", "read_cifar10_tar", "write_cifar10_tar",
    "make_mnist_like", "make_cifar_like", "digits_arrays",
    "md5sum", "content_md5sum", "fetch_dataset", "raw_status", "verify_raw", "write_offline_dataset",
    "Prepared", "load_raw", "prepare_dataset", "load_prepared",
]
