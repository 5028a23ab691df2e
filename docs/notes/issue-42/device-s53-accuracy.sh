#!/bin/bash
# Issue 42, stop 53: deliverable 5's accuracy through Snakemake on the real datasets (datasets/<name>/*.gz, one
# per call: the transfer limit), in a copy under /tmp that survives between the calls of one lease.
#   $1: results folder to write logs to; $2: e4's dataset (mnist or fashion_mnist); $3: "e1" to run E1 as well
out=$1; mkdir -p "$out"
exec > "$out/run-$2.log" 2>&1
set -x
variants="[cpu-numpy, gpu-graph, gpu-tf32, gpu-bf16]"
targets="e4"; [ "$3" = e1 ] && targets="e1 e4"
time snakemake --cores 16 --scheduler greedy --configfile=config/gpu_offline.yaml $targets --config \
  "experiments={e1: {variants: $variants, spread_runs: 1}, e4: {datasets: [$2], variants: $variants, block_variants: [], spread_runs: 1}}"
for e in e1 e4; do cp results/report/*/$e/summary.csv "$out/summary-$e-$2.csv" 2>/dev/null; done
echo DONE-$2
