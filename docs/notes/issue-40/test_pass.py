"""Issue 40: where the per-epoch test pass of a GPU run goes (gpunn.train: gpunn.evaluate.predict over the test set
in batches of EVAL_BATCH, outputs copied to the host, then test_metrics on the host). Random data of the run's
shapes; medians of REPEATS passes after a warm-up. Parts, each timed alone over all batches: upload (host float32
batch to the predictor's input), forward (the launches, synchronised), download (outputs to the host), and the
host's loss (test_metrics).

    python test_pass.py OUT_DIR [VARIANT,...]
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

from gpunn.backends.registry import make_backend
from gpunn.evaluate import EVAL_BATCH, predict, test_metrics
from gpunn.nn.models import build_model
from gpunn.rundata import images_to_float

REPEATS = 5
MODELS = {"autoencoder": ((3, 32, 32), 0.002), "cnn": ((1, 28, 28), 0.01)}


def median_s(fn) -> float:
    fn()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(model_name: str, variant: str, shape, lr: float, x: np.ndarray, labels: np.ndarray) -> dict:
    backend = make_backend(variant, build_model(model_name), model_name, lr)
    predict(backend, x[:EVAL_BATCH])
    x_dev, out_dev, launches = backend._predictors[(EVAL_BATCH, shape, None)]
    batches = [x[s:s + EVAL_BATCH] for s in range(0, len(x), EVAL_BATCH)]

    def forward():
        for _ in batches:
            for launch in launches:
                launch()

    outputs = predict(backend, x)
    return {"model": model_name, "variant": variant,
            "pass_s": median_s(lambda: predict(backend, x)),
            "upload_s": median_s(lambda: [x_dev.copy_to_device(b.reshape(x_dev.shape)) for b in batches]),
            "forward_s": median_s(forward),
            "download_s": median_s(lambda: [out_dev.copy_to_host() for _ in batches]),
            "host_loss_s": median_s(lambda: test_metrics(model_name, outputs, x, labels))}


def main(out: str, variants: str = "gpu-graph,gpu-im2col") -> None:
    rows = []
    rng = np.random.default_rng(0)
    for model_name, (shape, lr) in MODELS.items():
        images = rng.integers(0, 256, (10000, *shape), dtype=np.uint8)
        labels = rng.integers(0, 10, 10000)
        x = images_to_float(images)
        for variant in variants.split(","):
            if model_name == "cnn" and variant == "gpu-tiled":
                continue
            rows.append(measure(model_name, variant, shape, lr, x, labels))
            print(json.dumps(rows[-1]), flush=True)
    import pandas as pd

    Path(out).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(Path(out) / "test_pass.csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
