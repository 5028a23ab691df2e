"""The arrays one run trains and tests on: its prepared split with the run's training subset applied, and
the one pixel normalisation every backend, the evaluation and the feature extraction use. Below training,
evaluation and weight I/O, which all read a run's data through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpunn.data.prepare import Prepared
from gpunn.errors import GpunnError
from gpunn.runspec import RunSpec


def images_to_float(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 in [0, 1]; every backend normalises with exactly this expression. Images that are
    floating point already (the Python API's float input, in [0, 1]) come back as float32, not rescaled."""
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32, copy=False)
    return images.astype(np.float32) / np.float32(255.0)


@dataclass
class RunData:
    """The arrays one run trains and tests on (the training subset already applied)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, int, int]
    num_classes: int
    class_names: list[str]


def run_data(spec: RunSpec, prepared: Prepared) -> RunData:
    if prepared.dataset != spec.dataset or prepared.split != spec.split:
        raise GpunnError(
            f"prepared data is {prepared.dataset}/{prepared.split} but the run asks for {spec.dataset}/{spec.split}"
        )
    n_train = len(prepared.x_train)
    if spec.subset > n_train:
        raise GpunnError(f"subset of {spec.subset} training samples asked, {spec.dataset}/{spec.split} has {n_train}")
    keep = spec.subset or n_train
    return RunData(
        x_train=prepared.x_train[:keep],
        y_train=prepared.y_train[:keep].astype(np.int64),
        x_test=prepared.x_test,
        y_test=prepared.y_test.astype(np.int64),
        image_shape=tuple(prepared.image_shape),
        num_classes=int(prepared.num_classes),
        class_names=[str(c) for c in prepared.class_names],
    )
