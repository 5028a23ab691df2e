"""Encoder features of a trained autoencoder run, the SVM's inputs (E6): in the features directory
    {train,test}_features.npy   float32 (N, C*H*W), the flattened encoder outputs
    {train,test}_labels.npy     int64 (N,)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from gpunn import io
from gpunn.data.prepare import load_prepared
from gpunn.errors import GpunnError
from gpunn.rundata import images_to_float
from gpunn.seeding import batch_slices
from gpunn.weights import load_trained


def extract_features(run_dir, prepared_path, out_dir, train_limit: int = 0, batch: int = 256, log=print) -> dict:
    """Encoder outputs of a trained autoencoder, flattened to (N, C*H*W) float32 .npy, with labels, for
    the whole training split (or its first `train_limit` samples) and the whole test split."""
    spec, model = load_trained(run_dir)
    if spec.model != "autoencoder":
        raise GpunnError(f"features come from an autoencoder run, {run_dir} is a {spec.model}")
    prepared = load_prepared(prepared_path)
    out_dir = Path(out_dir)
    sizes = {}
    for part, images, labels in (("train", prepared.x_train, prepared.y_train), ("test", prepared.x_test, prepared.y_test)):
        if part == "train" and train_limit:
            images, labels = images[:train_limit], labels[:train_limit]
        chunks, start, last_report = [], time.perf_counter(), time.perf_counter()
        for s, e in batch_slices(len(images), batch):
            chunks.append(model.encode(images_to_float(images[s:e])).reshape(e - s, -1))
            if time.perf_counter() - last_report >= 15.0:
                log(f"  {part} features {e}/{len(images)} ({time.perf_counter() - start:.1f} s)")
                last_report = time.perf_counter()
        features = np.concatenate(chunks).astype(np.float32, copy=False)
        io.write_npy(out_dir / f"{part}_features.npy", features)
        io.write_npy(out_dir / f"{part}_labels.npy", labels.astype(np.int64))
        sizes[part] = list(features.shape)
        log(f"features {part}: {features.shape[0]} x {features.shape[1]} ({time.perf_counter() - start:.1f} s)")
    return sizes
