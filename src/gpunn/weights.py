"""A run's model: new (initialised from its spec's seed) or trained (read back from the run directory).

    weights.npz    the flat parameter buffer (float32), its layout (names, offsets, shapes), the run spec
                   (RunSpec.to_dict as JSON), the image shape and the number of classes
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpunn import io
from gpunn.errors import GpunnError
from gpunn.nn import build_model
from gpunn.rundata import RunData
from gpunn.runspec import RunSpec


def new_model(spec: RunSpec, image_shape, num_classes: int):
    return build_model(spec.model, seed=spec.seed, **spec.model_sizes(image_shape, num_classes))


def save_weights(path, spec: RunSpec, model, flat: np.ndarray, data: RunData) -> None:
    names, offsets, shapes = zip(*model.layout())
    io.write_npz(
        path,
        flat=np.asarray(flat, dtype=np.float32),
        names=np.array(names),
        offsets=np.array(offsets, dtype=np.int64),
        shapes=np.array(json.dumps([list(s) for s in shapes])),
        spec=np.array(json.dumps(spec.to_dict())),
        image_shape=np.array(data.image_shape, dtype=np.int64),
        num_classes=np.array(data.num_classes),
    )


def load_trained(run_dir):
    """(spec, cpu-numpy model holding the trained weights) from a run directory."""
    path = Path(run_dir) / "weights.npz"
    if not path.is_file():
        raise GpunnError(f"{path}: no trained weights; run the training step for this run first")
    try:
        with np.load(path, allow_pickle=False) as saved:
            spec = RunSpec.from_dict(json.loads(str(saved["spec"])))
            model = new_model(spec, tuple(int(v) for v in saved["image_shape"]), int(saved["num_classes"]))
            flat = saved["flat"]
    except (OSError, ValueError, KeyError) as exc:
        raise GpunnError(f"{path}: unreadable weights file ({exc}); delete it and train again") from None
    if flat.shape != model.flat.shape:
        raise GpunnError(f"{path}: holds {flat.size} parameters, the model needs {model.flat.size}; train again")
    model.load_flat(flat)
    return spec, model
