#!/bin/bash
# Issue 42, stop 54, first call (background, from a full copy under /tmp): Fashion-MNIST accuracy through Snakemake
# (E4: cpu-numpy, gpu-graph, gpu-tf32, gpu-bf16), then E5's 20-epoch MSE (gpu-graph, gpu-tf32, gpu-bf16) on the
# synthetic CIFAR-10 of config/gpu_offline.yaml.   $1: folder for logs and summaries
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
bash docs/notes/issue-42/device-s53-accuracy.sh "$out" fashion_mnist
grep -v '^  e5:' config/gpu_offline.yaml > /tmp/e5-offline.yaml  # its e5 line times baselines this run leaves out
time snakemake --cores 16 --scheduler greedy --configfile=/tmp/e5-offline.yaml e5 --config \
  "experiments={e5: {dataset: synthetic_cifar10, variants: [gpu-graph, gpu-tf32, gpu-bf16]}}" \
  > "$out/e5.log" 2>&1
cp -r results/report/*/e5 "$out/e5-report" 2>/dev/null
find results -path '*e5*' -name '*.csv' | head -50 > "$out/e5-files.txt"
echo DONE-ALL
