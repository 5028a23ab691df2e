"""scikit-learn's real handwritten digits (`load_digits`, 1797 images of 8x8, values 0..16) as an offline
dataset: rescaled to 0..255 uint8, optionally resized to 28x28, split 1437 train / 360 test by a
fixed-seed shuffle; `digits_mini_arrays` keeps the first MINI_TRAIN / MINI_TEST of that split at 8x8 (for the
GPU variants of the conv models under numba's CUDA simulator, where every test image costs seconds).

The resize is bilinear (pixel centres aligned, edges clamped) and computed in exact integer arithmetic:
every output pixel is an integer combination of the 0..16 inputs over a fixed denominator, rounded half
up, so the bytes never depend on floating-point details.
"""

from __future__ import annotations

import numpy as np

from gpunn.errors import GpunnError

N_TRAIN = 1437
N_TEST = 360
SPLIT_SEED = 20240  # fixed: the digits split must never change
SIZES = (8, 28)
MINI_TRAIN = 160
MINI_TEST = 40
_MAX_IN = 16  # load_digits values are integers 0..16


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images)
    target = np.asarray(bunch.target)
    ints = np.rint(images).astype(np.int64)
    if images.shape != (N_TRAIN + N_TEST, 8, 8) or not np.array_equal(ints, images) \
            or ints.min() < 0 or ints.max() > _MAX_IN:
        raise GpunnError("sklearn.datasets.load_digits returned unexpected data (expected 1797 8x8 images "
                         "with integer values 0..16); check the scikit-learn installation")
    return ints, target.astype(np.uint8)


def _linear_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Integer 2-tap interpolation weights with pixel centres aligned (align_corners=False), clamped.

    Source position of output pixel j: (j + 0.5) * n_in / n_out - 0.5 = (2 j n_in + n_in - n_out) / (2 n_out),
    so all weights are exact multiples of 1 / (2 n_out). Returns (i0, w0, w1, denominator)."""
    den = 2 * n_out
    num = 2 * np.arange(n_out, dtype=np.int64) * n_in + n_in - n_out  # source position * den
    num = np.clip(num, 0, (n_in - 1) * den)
    i0 = np.minimum(num // den, n_in - 2)
    w1 = num - i0 * den
    w0 = den - w1
    return i0, w0, w1, den


def resize_bilinear_int(images: np.ndarray, size: int, max_in: int = _MAX_IN) -> np.ndarray:
    """Resize integer images (N, h, w) with values 0..max_in to (N, size, size) uint8 in 0..255, exactly."""
    images = np.asarray(images, dtype=np.int64)
    _, h, w = images.shape
    iy, wy0, wy1, dy = _linear_weights(h, size)
    ix, wx0, wx1, dx = _linear_weights(w, size)
    rows = images[:, iy, :] * wy0[None, :, None] + images[:, iy + 1, :] * wy1[None, :, None]  # (N, size, w)
    full = rows[:, :, ix] * wx0 + rows[:, :, ix + 1] * wx1  # (N, size, size), scaled by dy * dx
    den = dy * dx * max_in
    # round(full * 255 / den) with halves rounded up, in integers
    out = (2 * full * 255 + den) // (2 * den)
    return out.astype(np.uint8)


def rescale_int(images: np.ndarray, max_in: int = _MAX_IN) -> np.ndarray:
    """0..max_in integers to 0..255 uint8, rounded half up, exactly."""
    images = np.asarray(images, dtype=np.int64)
    return ((2 * images * 255 + max_in) // (2 * max_in)).astype(np.uint8)


def digits_arrays(size: int):
    """(x_train, y_train, x_test, y_test) of sklearn's digits at 8x8 or 28x28: uint8 images (N, size, size)."""
    if size not in SIZES:
        raise GpunnError(f"digits size must be one of {SIZES}, got {size!r}")
    images, labels = _load_digits()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    images, labels = images[order], labels[order]
    x = rescale_int(images) if size == 8 else resize_bilinear_int(images, size)
    return x[:N_TRAIN], labels[:N_TRAIN], x[N_TRAIN:], labels[N_TRAIN:]


def digits_mini_arrays():
    """The first MINI_TRAIN train and MINI_TEST test images (and labels) of the 8x8 digits split."""
    x_train, y_train, x_test, y_test = digits_arrays(8)
    return x_train[:MINI_TRAIN], y_train[:MINI_TRAIN], x_test[:MINI_TEST], y_test[:MINI_TEST]
