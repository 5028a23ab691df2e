"""Seeds for initialisation and batch order, in a form any backend can consume.

One integer seed fixes everything random in a training run:
  * `init_rng(seed)` draws the parameters (He init), in layer order, into the model's flat buffer;
  * `batch_order(seed, epoch, n)` is the int32 permutation of the n training samples for that epoch.
A GPU variant copies the same permutation to the device and gathers batches from it, so it sees exactly
the batches `cpu-numpy` sees and the two can be compared step by step.
"""

from __future__ import annotations

import numpy as np

# Separate streams so that changing the number of epochs never changes the init and vice versa.
_INIT_STREAM = 0
_ORDER_STREAM = 1


def init_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), _INIT_STREAM])


def batch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of `epoch` (0-based): a permutation of range(n) as int32."""
    if n <= 0:
        raise ValueError(f"batch_order needs at least one sample, got n={n}")
    rng = np.random.default_rng([int(seed), _ORDER_STREAM, int(epoch)])
    return rng.permutation(n).astype(np.int32)


def batch_slices(n: int, batch_size: int):
    """(start, stop) of each batch over n samples; the last batch is partial when batch_size does not divide n."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    return [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
