#!/bin/bash
# Issue 42, the next session's first call (written at stop 55; docs/notes/issue-42-progress.md, "Next device
# session"): the probes behind the next rule changes (the branches' where present), the autoencoder's epochs with
# the Winograd bias option off and on, gpu-bf16's step profile, then the whole GPU suite with its durations.
# $1: output folder
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
git log --oneline -1
python docs/notes/issue-42/s56_probe.py "$out" > "$out/s56_probe.log" 2>&1
# the branches' probes and GPU tests, where the tree has them (branch issue-42-measure: main +
# issue-42-conv5-tensor + issue-42-direct + issue-42-winograd-pool): the autoencoder's last conv on the narrow
# tensor tile, the direct wgmma GEMMs, conv2's Winograd passes with the pool inside
for probe in conv5_tensor_probe winograd_pool_probe direct_probe; do
  if [ -f docs/notes/issue-42/$probe.py ]; then
    python docs/notes/issue-42/$probe.py "$out" > "$out/$probe.log" 2>&1
  fi
done
tests=$(ls tests/test_kernels_gemm_direct.py tests/test_kernels_conv_phase_tensor.py \
  tests/test_kernels_conv_winograd_pool.py 2>/dev/null)
if [ -n "$tests" ]; then
  python -m pytest -m gpu -q -p no:cacheprovider $tests > "$out/test-gpu-branches.log" 2>&1
fi
for bias in off on; do
  python - "$out" "$bias" > "$out/bench-autoencoder-winograd-bias-$bias.log" 2>&1 <<'PY'
import runpy, sys
from gpunn.backends.gpu import policy
policy.AUTO_WINOGRAD_BIAS = sys.argv[2] == "on"
sys.argv = ["gpunn.bench", "autoencoder", "--batch", "64", "--variants", "gpu-graph,gpu-bf16", "--torch-settings",
            "bf16", "--out", f"{sys.argv[1]}/autoencoder-winograd-bias-{sys.argv[2]}.csv"]
runpy.run_module("gpunn.bench", run_name="__main__")
PY
done
python -m gpunn.bench autoencoder --batch 64 --variants gpu-bf16 --torch-settings bf16 --profile \
  --out "$out/ae_step.csv" > "$out/ae_step.log" 2>&1
echo DONE-FIRST
timeout 1000 python -m pytest -m gpu -q -p no:cacheprovider --durations=40 tests > "$out/test-gpu-all.log" 2>&1
echo DONE
