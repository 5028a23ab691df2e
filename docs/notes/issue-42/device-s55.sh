#!/bin/bash
# Issue 42, the next session's first call (written at stop 54; docs/notes/issue-42-progress.md, "Next device
# session"): the probes behind the next rule changes (the BF16 Winograd buffers' included), then the three models'
# epochs beside PyTorch in its four settings, then the GPU tests of this stop's kernels.   $1: output folder
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
git log --oneline -1
python docs/notes/issue-42/ae_small_convs_probe.py "$out" > "$out/ae_small_convs_probe.log" 2>&1
python docs/notes/issue-42/gemm_case_probe.py "$out" > "$out/gemm_case_probe.log" 2>&1
python docs/notes/issue-42/bf16_buffers_probe.py "$out" > "$out/bf16_buffers_probe.log" 2>&1
for m in mlp cnn; do
  python -m gpunn.bench $m --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/$m.csv" > "$out/bench-$m.log" 2>&1
done
python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 --out "$out/autoencoder.csv" \
  > "$out/bench-autoencoder.log" 2>&1
# the same epochs of gpu-bf16 with its Winograd buffers in BF16 (layers.WINOGRAD_BF16_STORAGE, off by default)
python - "$out" > "$out/bench-autoencoder-bf16-storage.log" 2>&1 <<'PY'
import runpy, sys
from gpunn.backends.gpu import layers
layers.WINOGRAD_BF16_STORAGE = True
sys.argv = ["gpunn.bench", "autoencoder", "--batch", "64", "--variants", "gpu-bf16", "--torch-settings", "bf16",
            "--out", f"{sys.argv[1]}/autoencoder-bf16-storage.csv"]
runpy.run_module("gpunn.bench", run_name="__main__")
PY
python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_precision.py tests/test_gpu_upsample_fusion.py \
  tests/test_kernels_wgrad_bias.py tests/test_kernels_conv_winograd.py tests/test_kernels_mma.py \
  > "$out/test-gpu.log" 2>&1
echo DONE-FIRST
# then the whole GPU suite (the issue's "pytest -m gpu passes on the GPU"), in what is left of the lease
timeout 900 python -m pytest -m gpu -q -p no:cacheprovider tests > "$out/test-gpu-all.log" 2>&1
echo DONE
