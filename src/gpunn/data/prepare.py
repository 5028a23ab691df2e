"""Turn a dataset's raw files into one prepared .npz (uint8, NCHW) with the split the experiment needs.

Splits:
  * "standard": the official train / test sets;
  * "e2": E2's 37 800 / 4 200 protocol: a fixed-seed permutation of the *training* set, its first
    `e2_train` samples as train and the next `e2_test` as test (config keys splits.e2.train / .test).

The npz holds x_train, y_train, x_test, y_test (uint8), class_names (unicode array), dataset and split
(0-d unicode arrays); `load_prepared` reads it back into a `Prepared`.

`prepare_dataset` first checks the raw directory against the manifest.json the download wrote
(`gpunn.data.integrity.verify_raw`): a raw file changed after it was verified (a disk error, a hand edit,
a half-finished copy) would otherwise turn into a prepared dataset that quietly differs from the real one.
`load_raw` is the bare parser and checks no checksums.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpunn.errors import GpunnError
from gpunn.io import write_npz

from .cifar import read_cifar10_tar
from .idx import read_idx
from .integrity import verify_raw
from .registry import TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS, get_dataset

SPLITS = ("standard", "e2")
_E2_STREAM = 2  # keeps the e2 permutation apart from other uses of the same seed
_ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _check_pair(where: str, x: np.ndarray, y: np.ndarray, image_shape, num_classes: int, part: str) -> None:
    if x.dtype != np.uint8 or y.dtype != np.uint8:
        raise GpunnError(f"{where}: {part} images and labels must be uint8, got {x.dtype} and {y.dtype}")
    if y.ndim != 1:
        raise GpunnError(f"{where}: {part} labels must be one-dimensional, got shape {y.shape}")
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(image_shape):
        raise GpunnError(f"{where}: {part} images have shape {tuple(x.shape[1:])}, expected "
                         f"{tuple(image_shape)} (C, H, W)")
    if len(x) != len(y):
        raise GpunnError(f"{where}: {len(x)} {part} images but {len(y)} {part} labels")
    if len(y) == 0:
        raise GpunnError(f"{where}: the {part} set is empty")
    if int(y.max()) >= num_classes:
        raise GpunnError(f"{where}: {part} label {int(y.max())} is out of range for {num_classes} classes")


def load_raw(name: str, raw_dir: str | os.PathLike) -> dict:
    """Read the raw files of `name` from raw_dir: x_train, y_train, x_test, y_test (uint8, images NCHW) and
    class_names (list of str)."""
    spec = get_dataset(name)
    raw_dir = Path(raw_dir)
    c, h, w = spec.image_shape
    if spec.kind == "idx":
        arrays = {}
        for key, file_name in (("x_train", TRAIN_IMAGES), ("y_train", TRAIN_LABELS),
                               ("x_test", TEST_IMAGES), ("y_test", TEST_LABELS)):
            path = raw_dir / file_name
            array = read_idx(path)
            if key.startswith("x"):
                if array.ndim != 3 or array.shape[1:] != (h, w):
                    raise GpunnError(f"{path}: images of shape {array.shape[1:]} (IDX with {array.ndim} "
                                     f"dimensions), expected N x {h} x {w} for {name}")
                array = array.reshape(len(array), c, h, w)
            elif array.ndim != 1:
                raise GpunnError(f"{path}: labels must be a 1-dimensional IDX file, got {array.ndim} dimensions")
            if array.dtype != np.uint8:
                raise GpunnError(f"{path}: expected uint8 data (IDX type 0x08), got {array.dtype}")
            arrays[key] = array
        arrays["class_names"] = list(spec.class_names)
        where = {"train": raw_dir / TRAIN_LABELS, "test": raw_dir / TEST_LABELS}
    else:
        (archive,) = spec.files
        arrays = read_cifar10_tar(raw_dir / archive)
        where = {"train": raw_dir / archive, "test": raw_dir / archive}
    num_classes = len(arrays["class_names"])
    if num_classes != len(spec.class_names):
        raise GpunnError(f"{where['train']}: {num_classes} class names, {name} has {len(spec.class_names)}")
    _check_pair(where["train"], arrays["x_train"], arrays["y_train"], spec.image_shape, num_classes, "train")
    _check_pair(where["test"], arrays["x_test"], arrays["y_test"], spec.image_shape, num_classes, "test")
    return arrays


@dataclass(frozen=True, eq=False)
class Prepared:
    x_train: np.ndarray  # uint8 (N, C, H, W)
    y_train: np.ndarray  # uint8 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: tuple[str, ...]
    dataset: str
    split: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _split(raw: dict, split: str, e2_train: int, e2_test: int, seed: int, name: str):
    if split == "standard":
        return raw["x_train"], raw["y_train"], raw["x_test"], raw["y_test"]
    if split != "e2":
        raise GpunnError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    for key, value in (("splits.e2.train", e2_train), ("splits.e2.test", e2_test)):
        try:
            ok = not isinstance(value, bool) and int(value) == value and value > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise GpunnError(f"config key {key} must be a positive integer, got {value!r}")
    e2_train, e2_test = int(e2_train), int(e2_test)
    n = len(raw["y_train"])
    if e2_train + e2_test > n:
        raise GpunnError(
            f"split e2 needs splits.e2.train + splits.e2.test = {e2_train} + {e2_test} = {e2_train + e2_test} "
            f"samples but the {name} training set has only {n}; lower config keys splits.e2.train / "
            f"splits.e2.test"
        )
    order = np.random.default_rng([int(seed), _E2_STREAM]).permutation(n)
    train, test = order[:e2_train], order[e2_train:e2_train + e2_test]
    return raw["x_train"][train], raw["y_train"][train], raw["x_train"][test], raw["y_train"][test]


def prepare_dataset(
    name: str,
    raw_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    split: str = "standard",
    e2_train: int = 37800,
    e2_test: int = 4200,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Prepared:
    """Verify the raw files against raw_dir/manifest.json and the registry (`verify_raw`; a one-line
    GpunnError and no output if anything differs), read them, apply the split and write the prepared npz
    atomically; returns what was written."""
    start = time.perf_counter()
    verify_raw(name, raw_dir)
    raw = load_raw(name, raw_dir)
    x_train, y_train, x_test, y_test = _split(raw, split, e2_train, e2_test, seed, name)
    class_names = tuple(str(c) for c in raw["class_names"])
    write_npz(
        out_path,
        x_train=np.ascontiguousarray(x_train), y_train=np.ascontiguousarray(y_train),
        x_test=np.ascontiguousarray(x_test), y_test=np.ascontiguousarray(y_test),
        class_names=np.array(class_names, dtype=str),
        dataset=np.array(name, dtype=str), split=np.array(split, dtype=str),
    )
    log(f"{name} ({split}): {len(y_train)} train / {len(y_test)} test images {x_train.shape[1:]} "
        f"-> {out_path} in {time.perf_counter() - start:.1f} s")
    return Prepared(x_train, y_train, x_test, y_test, class_names, name, split)


def load_prepared(path: str | os.PathLike) -> Prepared:
    """Read a prepared npz written by prepare_dataset (GpunnError if it is missing or damaged)."""
    path = Path(path)
    redo = "delete it and run the prepare step again"
    if not path.is_file():
        raise GpunnError(f"{path}: prepared dataset not found; run the prepare step first")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in _ARRAY_KEYS + ("class_names", "dataset", "split") if k not in npz.files]
            if missing:
                raise GpunnError(f"{path}: prepared dataset lacks {', '.join(missing)}; {redo}")
            arrays = {k: npz[k] for k in _ARRAY_KEYS}
            class_names = tuple(str(c) for c in npz["class_names"].reshape(-1))
            dataset = str(npz["dataset"])
            split = str(npz["split"])
    except GpunnError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise GpunnError(f"{path}: corrupt prepared dataset ({str(exc) or type(exc).__name__}); {redo}") from None
    x_train, y_train, x_test, y_test = (arrays[k] for k in _ARRAY_KEYS)
    if x_train.ndim != 4 or x_test.ndim != 4 or x_train.shape[1:] != x_test.shape[1:]:
        raise GpunnError(f"{path}: images must be (N, C, H, W) with equal train/test shapes, got "
                         f"{x_train.shape} and {x_test.shape}; {redo}")
    _check_pair(path, x_train, y_train, x_train.shape[1:], len(class_names), "train")
    _check_pair(path, x_test, y_test, x_train.shape[1:], len(class_names), "test")
    return Prepared(x_train, y_train, x_test, y_test, class_names, dataset, split)
