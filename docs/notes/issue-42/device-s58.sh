#!/bin/bash
# Issue 42, the next session's first call (written at stop 57; docs/notes/issue-42-progress.md, "Next device
# session"), from a copy under /tmp in the background; $1: output folder. Timed part, one job at a time: the three
# models beside PyTorch in its four settings (the autoencoder twice, for its spread), the GEMM bench's K-major case.
# Then untimed, side by side: the whole GPU suite in four shards, and the accuracy runs through Snakemake (E1 / E4
# on real MNIST, E4 on real Fashion-MNIST once datasets/fashion_mnist is there, E5's 20 epochs) in a copy of their own.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
stamp() { echo "=== $(date +%T) $*"; }
nvidia-smi -L
git log --oneline -1
stamp benches
for run in 1 2; do
  python -m gpunn.bench autoencoder --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/autoencoder-$run.csv" > "$out/bench-autoencoder-$run.log" 2>&1
done
for model in mlp cnn; do
  python -m gpunn.bench $model --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/$model.csv" > "$out/bench-$model.log" 2>&1
done
stamp gemm
python - "$out" > "$out/bench-gemm-k-major.log" 2>&1 <<'PY'
import sys
from gpunn import bench
cases = [c for c in bench.GEMM_CASES if c.case == "square_4096_bt"]
frame = bench.bench_frame(bench.benchmark(bench.gemm_problems(cases), [], repeats=20))
frame.to_csv(f"{sys.argv[1]}/gemm-k-major.csv", index=False)
print(frame[["case", "version", "ms", "gflops", "ref_name", "ref_ms", "pct_of_ref"]].to_string())
PY
stamp DONE-TIMED
echo DONE-TIMED

# ---- untimed: accuracy through Snakemake in its own copy, the GPU suite in four shards
rm -rf /tmp/acc && cp -a . /tmp/acc
(cd /tmp/acc && export PYTHONPATH=/tmp/acc/src &&
 bash docs/notes/issue-42/device-s53-accuracy.sh "$out/accuracy" mnist e1 &&
 for i in $(seq 120); do [ -f datasets/fashion_mnist/train-images-idx3-ubyte.gz ] && break; sleep 5; done &&
 bash docs/notes/issue-42/device-s53-accuracy.sh "$out/accuracy" fashion_mnist &&
 grep -v '^  e5:' config/gpu_offline.yaml > /tmp/e5-offline.yaml &&
 snakemake --cores 16 --scheduler greedy --configfile=/tmp/e5-offline.yaml e5 --config \
   "experiments={e5: {dataset: synthetic_cifar10, variants: [gpu-graph, gpu-tf32, gpu-bf16]}}" \
   > "$out/accuracy/e5.log" 2>&1 && cp -r results/report/*/e5 "$out/accuracy/e5-report"; echo ACC-END) \
  > "$out/accuracy.log" 2>&1 &
acc=$!
A="tests/test_kernels_gemm.py tests/test_svm.py tests/test_kernels_pool.py tests/test_gpu_autoencoder.py"
B="tests/test_kernels_conv_gemm.py tests/test_kernels_gemm_direct.py tests/test_kernels_conv_winograd.py"
C="tests/test_bench.py tests/test_gpu_precision.py tests/test_kernels_conv_up.py"
ignore=$(for f in $A $B $C; do printf -- "--ignore=%s " "$f"; done)
pids=()
i=0
for shard in "$A" "$B" "$C" "tests $ignore"; do
  i=$((i + 1))
  timeout 1100 python -m pytest -m gpu -q -p no:cacheprovider --durations=15 $shard > "$out/test-gpu-$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
stamp DONE-TESTS
tail -n 3 "$out"/test-gpu-*.log
wait $acc
stamp DONE
echo DONE
