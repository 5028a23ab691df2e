#!/bin/bash
# Issue 42, stop 54, second call: the probe of the autoencoder's small convolutions (conv5's phase forward, conv1's
# weight + bias gradient candidates, its forward tunings), the MLP epochs with the tensor-core split-K rule, and the AE epochs with the
# phase forward and weight gradient, each beside PyTorch in its four settings; GPU tests of the new kernels.   $1: output folder
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
python docs/notes/issue-42/ae_small_convs_probe.py "$out" > "$out/ae_small_convs_probe.log" 2>&1
python -m gpunn.bench mlp --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/mlp.csv" > "$out/bench-mlp.log" 2>&1
python -m gpunn.bench mlp --variants gpu-tf32,gpu-bf16 --profile --repeats 10 --out "$out/mlp_step.csv" \
  > "$out/mlp_step.log" 2>&1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/autoencoder.csv" \
  > "$out/bench-autoencoder.log" 2>&1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-bf16 --profile --repeats 10 --out "$out/ae_step.csv" \
  > "$out/ae_step.log" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_conv_up_phase.py tests/test_kernels_conv_up.py tests/test_kernels_wgrad_bias.py \
  > "$out/test-gpu.log" 2>&1
echo DONE
