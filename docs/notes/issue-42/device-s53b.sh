#!/bin/bash
# Issue 42, stop 53, second call: the variants under the TENSOR_MIN_SIDE rule (Winograd on the tensor cores, the
# fusions kept for the small products): epochs beside gpu-graph and PyTorch, the AE's per-launch profile, GPU tests.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
git log --oneline -1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/autoencoder.csv" > "$out/bench-autoencoder.log" 2>&1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 --profile --repeats 10 --out "$out/ae_step.csv" > "$out/ae_step.log" 2>&1
for m in mlp cnn; do
  python -m gpunn.bench $m --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/$m.csv" > "$out/bench-$m.log" 2>&1
done
python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_precision.py tests/test_kernels_conv_winograd.py -k "tensor or precision or variant or shapes" > "$out/test-precision.log" 2>&1
echo DONE
