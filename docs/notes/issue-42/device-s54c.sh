#!/bin/bash
# Issue 42, stop 54, third call (the session's last device time): the probe of the AE's small convolutions again (the
# phase forward with its summed taps made once and its staging unrolled; conv1's weight + bias gradient by the
# direct pass in output-channel groups), then the AE epochs with both beside PyTorch's bf16 setting (its fastest in
# both earlier calls of this stop), one step's profile, and the GPU tests of the phase kernels.   $1: output folder
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
python docs/notes/issue-42/ae_small_convs_probe.py "$out" > "$out/ae_small_convs_probe.log" 2>&1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 --torch-settings bf16 \
  --out "$out/autoencoder.csv" > "$out/bench-autoencoder.log" 2>&1
python -m gpunn.bench autoencoder --batch 64 --variants gpu-bf16 --profile --repeats 5 --out "$out/ae_step.csv" \
  > "$out/ae_step.log" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_conv_up_phase.py tests/test_kernels_wgrad_bias.py \
  > "$out/test-gpu.log" 2>&1
echo DONE
