#!/bin/bash
# Issue 42, stop 57's last call (the lease's last minutes), from the repository root; $1: output folder. Timed, one
# job at a time: the MLP and the CNN beside PyTorch in its four settings with the epoch graph (Policy.graph_epoch) and
# the CNN's conv2 on float32 kernels (policy.TENSOR_MIN_CHANNELS); the TMA GEMM probe where the tree has it. Then the
# GPU tests of this stop's changes side by side.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
stamp() { echo "=== $(date +%T) $*"; }
nvidia-smi -L
stamp benches
for model in mlp cnn; do
  python -m gpunn.bench $model --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/$model.csv" > "$out/bench-$model.log" 2>&1
done
if [ -f docs/notes/issue-42/device-tma.sh ]; then
  stamp tma
  timeout 330 bash docs/notes/issue-42/device-tma.sh "$out/tma"
fi
stamp tests
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_graphs.py \
  > "$out/test-gpu-graphs.log" 2>&1 &
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_precision.py -k "cnn or mlp" \
  > "$out/test-gpu-precision.log" 2>&1 &
wait
stamp DONE
tail -n 2 "$out"/test-gpu-*.log
echo DONE
