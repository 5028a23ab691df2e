#!/bin/bash
# Issue 42, the next session's first call (written at stop 56; docs/notes/issue-42-progress.md, "Next device
# session"): the three models beside PyTorch in its four settings (the autoencoder twice, for its spread), the GEMM
# bench's K-major case with the direct versions, the CNN tensor pooled probe where the tree has it, then the whole GPU
# suite. Run from a copy under /tmp in the background; $1: output folder.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
for run in 1 2; do
  python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/autoencoder-$run.csv" > "$out/bench-autoencoder-$run.log" 2>&1
done
for model in mlp cnn; do
  python -m gpunn.bench $model --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/$model.csv" > "$out/bench-$model.log" 2>&1
done
python - "$out" > "$out/bench-gemm-k-major.log" 2>&1 <<'PY'
import sys
from gpunn import bench
cases = [c for c in bench.GEMM_CASES if c.case == "square_4096_bt"]
frame = bench.bench_frame(bench.benchmark(bench.gemm_problems(cases), [], repeats=20))
frame.to_csv(f"{sys.argv[1]}/gemm-k-major.csv", index=False)
print(frame[["case", "version", "ms", "gflops", "ref_name", "ref_ms", "pct_of_ref"]].to_string())
PY
if [ -f docs/notes/issue-42/cnn_tensor_pool_probe.py ]; then
  python docs/notes/issue-42/cnn_tensor_pool_probe.py "$out" > "$out/cnn_tensor_pool_probe.log" 2>&1
fi
echo DONE-FIRST
timeout 1000 python -m pytest -m gpu -q -p no:cacheprovider --durations=40 tests > "$out/test-gpu-all.log" 2>&1
echo DONE
