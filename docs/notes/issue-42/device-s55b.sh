#!/bin/bash
# Issue 42, stop 55's second call: the BF16 Winograd buffers read as BF16 pairs (the batched GEMM's _bf16x2
# mappings): the six passes both ways (bf16_buffers_probe.py), gpu-bf16's epochs with the storage off and on beside
# PyTorch's bf16 graph, then the GPU tests of the change and of the two bench tests fixed this stop.   $1: output
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
git log --oneline -1
python docs/notes/issue-42/bf16_buffers_probe.py "$out" > "$out/bf16_buffers_probe.log" 2>&1
for storage in off on; do
  python - "$out" "$storage" > "$out/bench-autoencoder-bf16-storage-$storage.log" 2>&1 <<'PY'
import runpy, sys
from gpunn.backends.gpu import layers
layers.WINOGRAD_BF16_STORAGE = sys.argv[2] == "on"
sys.argv = ["gpunn.bench", "autoencoder", "--batch", "64", "--variants", "gpu-bf16", "--torch-settings", "bf16",
            "--out", f"{sys.argv[1]}/autoencoder-bf16-storage-{sys.argv[2]}.csv"]
runpy.run_module("gpunn.bench", run_name="__main__")
PY
done
echo DONE-BENCH
python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_conv_winograd.py tests/test_gpu_precision.py \
  "tests/test_bench.py::test_gpu_gemm_against_torch" "tests/test_bench.py::test_gpu_bench_autoencoder_rows_and_memory" \
  > "$out/test-gpu.log" 2>&1
echo DONE
