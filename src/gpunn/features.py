"""Encoder features of a trained autoencoder run, the SVM's inputs (E6): in the features directory
    {train,test}_features.npy   float32 (N, C*H*W), the flattened encoder outputs
    {train,test}_labels.npy     int64 (N,)

A run of a GPU variant is encoded on the GPU by its own engine (the encoder's forward launches, batch by batch:
GpuEngine.predict with the encoder's layers), after checking that a sample of images encodes as the CPU encoder
(the float32 NumPy layers) does (gpunn.evaluate.checked_gpu_forward); a CPU run is encoded by the NumPy layers.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from gpunn import io
from gpunn.backends.registry import uses_gpu
from gpunn.data.prepare import load_prepared
from gpunn.errors import GpunnError
from gpunn.evaluate import CHECK_IMAGES, checked_gpu_forward
from gpunn.nn.models import model_spec
from gpunn.rundata import images_to_float
from gpunn.seeding import batch_slices
from gpunn.weights import load_trained


def extract_features(run_dir, prepared_path, out_dir, train_limit: int = 0, batch: int = 256, log=print) -> dict:
    """Encoder outputs of a trained autoencoder, flattened to (N, C*H*W) float32 .npy, with labels, for
    the whole training split (or its first `train_limit` samples) and the whole test split: on the GPU for a
    run of a GPU variant, else on the CPU."""
    spec, model = load_trained(run_dir)
    if not model_spec(spec.model).encoder:
        raise GpunnError(f"features come from an autoencoder run, {run_dir} is a {spec.model}")
    prepared = load_prepared(prepared_path)
    encode = model.encode
    if uses_gpu(spec.variant):
        sample = images_to_float(prepared.x_train[:CHECK_IMAGES])
        encode = checked_gpu_forward(spec, model, sample, model.encode(sample), "encoder", "training",
                                     layers=model.n_encoder, log=log)
    out_dir = Path(out_dir)
    sizes = {}
    parts = (("train", prepared.x_train, prepared.y_train), ("test", prepared.x_test, prepared.y_test))
    for part, images, labels in parts:
        if part == "train" and train_limit:
            images, labels = images[:train_limit], labels[:train_limit]
        chunks, start, last_report = [], time.perf_counter(), time.perf_counter()
        for s, e in batch_slices(len(images), batch):
            chunks.append(encode(images_to_float(images[s:e])).reshape(e - s, -1))
            if time.perf_counter() - last_report >= 15.0:
                log(f"  {part} features {e}/{len(images)} ({time.perf_counter() - start:.1f} s)")
                last_report = time.perf_counter()
        features = np.concatenate(chunks).astype(np.float32, copy=False)
        io.write_npy(out_dir / f"{part}_features.npy", features)
        io.write_npy(out_dir / f"{part}_labels.npy", labels.astype(np.int64))
        sizes[part] = list(features.shape)
        log(f"features {part}: {features.shape[0]} x {features.shape[1]} ({time.perf_counter() - start:.1f} s)")
    return sizes
