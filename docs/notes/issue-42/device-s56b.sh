#!/bin/bash
# Issue 42, stop 56's second call (about 4 minutes of device time left): the autoencoder's epoch with this stop's
# rules (Winograd bias on, conv5's input gradient on the tensor cores, conv1's tunings, the Winograd pool stage, the
# parallel Winograd finish) beside PyTorch's bf16 graph, the finish kernel's probe, then the GPU tests of the
# touched kernels while time lasts. $1: output folder (written as each step ends).
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
python -m gpunn.bench autoencoder --batch 64 --variants gpu-bf16 --torch-settings bf16 \
  --out "$out/autoencoder.csv" > "$out/bench-autoencoder.log" 2>&1
if [ -f docs/notes/issue-42/finish_probe.py ]; then
  timeout 60 python docs/notes/issue-42/finish_probe.py "$out" > "$out/finish_probe.log" 2>&1
fi
python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_precision.py -k "autoencoder and bf16" \
  > "$out/test-gpu-precision.log" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_conv_winograd_pool.py tests/test_kernels_wgrad_bias.py \
  tests/test_kernels_conv_pool_direct.py tests/test_kernels_conv_winograd.py > "$out/test-gpu-kernels.log" 2>&1
echo DONE
