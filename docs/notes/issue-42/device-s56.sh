#!/bin/bash
# Issue 42, the next session's first call (written at stop 55; docs/notes/issue-42-progress.md, "Next device
# session"): the probe behind the next rule changes, the autoencoder's epochs with the Winograd bias option off and
# on, gpu-bf16's step profile, then the whole GPU suite with its durations.   $1: output folder
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
git log --oneline -1
python docs/notes/issue-42/s56_probe.py "$out" > "$out/s56_probe.log" 2>&1
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
