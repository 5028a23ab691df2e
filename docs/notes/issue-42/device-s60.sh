#!/bin/bash
# Issue 42, stop 60's call: stop 59's script again (its outputs were lost with that session's machine), the GPU
# suite now holding the memory measure's test; from a copy
# under /tmp in the background; $1: output folder. Timed part, one job at a time: the MLP beside PyTorch in its four
# settings, twice (its ratio nearest the target), the GEMM bench's K-major case (tma_* on temporaries: stop 58's
# crash).
# Then untimed, side by side: the whole GPU suite in four shards, and the accuracy runs through Snakemake still owed
# (E4 on real Fashion-MNIST once datasets/fashion_mnist is there, E5's 20 epochs) in a copy of their own. Stop 58 ran
# the AE and CNN benches and E1 / E4 on MNIST (docs/notes/issue-42/h200-s58).
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
stamp() { echo "=== $(date +%T) $*"; }
nvidia-smi -L
git log --oneline -1
stamp benches
for run in 1 2; do  # twice: the MLP's ratio is the nearest its target, and its run-to-run spread is the largest
  python -m gpunn.bench mlp --batch 64 --variants gpu-graph,gpu-tf32,gpu-bf16 \
    --out "$out/mlp-$run.csv" > "$out/bench-mlp-$run.log" 2>&1
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

# ---- untimed: accuracy through Snakemake in copies of their own (E5 and E4 Fashion side by side: stop 59's first
# machines were lost before this point, so the lease is shorter), the GPU suite beside them
rm -rf /tmp/acc /tmp/acc4 && cp -a . /tmp/acc && cp -a . /tmp/acc4 && mkdir -p "$out/accuracy"
src=$PWD  # datasets/fashion_mnist arrives here with the call after the first: copied over once it is complete
(cd /tmp/acc && export PYTHONPATH=/tmp/acc/src &&
 grep -v '^  e5:' config/gpu_offline.yaml > /tmp/e5-offline.yaml &&
 snakemake --cores 8 --scheduler greedy --configfile=/tmp/e5-offline.yaml e5 --config \
   "experiments={e5: {dataset: synthetic_cifar10, variants: [gpu-graph, gpu-tf32, gpu-bf16]}}" \
   > "$out/accuracy/e5.log" 2>&1 && cp -r results/report/*/e5 "$out/accuracy/e5-report"; echo E5-END) \
  > "$out/accuracy-e5.log" 2>&1 &
acc=$!
(cd /tmp/acc4 && export PYTHONPATH=/tmp/acc4/src &&
 for i in $(seq 120); do [ -f "$src/datasets/fashion_mnist/train-images-idx3-ubyte.gz" ] && break; sleep 5; done
 sleep 5 && mkdir -p datasets && cp -r "$src/datasets/fashion_mnist" datasets/ &&
 bash docs/notes/issue-42/device-s53-accuracy.sh "$out/accuracy" fashion_mnist; echo ACC-END) \
  > "$out/accuracy.log" 2>&1 &
acc4=$!
bash docs/notes/issue-42/gpu-suite-shards.sh "$out"
stamp DONE-TESTS
tail -n 3 "$out"/test-gpu*.log
wait $acc $acc4
stamp DONE
echo DONE
