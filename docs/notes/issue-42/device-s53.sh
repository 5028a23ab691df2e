#!/bin/bash
# Issue 42, session of 2026-12-02 (stop 53): epochs of gpu-tf32 / gpu-bf16 beside gpu-graph and PyTorch in its four
# settings, then the GPU tests left from stop 52. Runs in a copy under /tmp in the background; results in $1.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
for m in mlp cnn autoencoder; do
  python -m gpunn.bench $m --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/$m.csv" > "$out/bench-$m.log" 2>&1
done
python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_precision.py > "$out/test-precision.log" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_conv_gemm.py -k "tensor or wgmma" > "$out/test-conv.log" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/test_bench.py -k mma > "$out/test-mma.log" 2>&1
echo DONE
