#!/usr/bin/env bash
# Issue 27: does timing: overlap's placement (a GPU job on one core, OMP 1; a CPU baseline on cores 0-13) change E1's
# host-heavy variants? E1's gpu-tiled MLP and cpu-numpy MLP, each unplaced (as under isolated: 14 threads, any core),
# placed alone, and placed side by side. One call; seconds per epoch into OUT/host.txt.
#   bash docs/notes/issue-27/host.sh OUT
set -euo pipefail
out=${1:?OUT}
snakemake --cores "$(nproc)" --scheduler greedy results/data/prepared/mnist/standard.npz \
    --configfile config/gpu_offline.yaml > "$out/data.log" 2>&1
data=results/data/prepared/mnist/standard.npz
gpu=mnist/standard/mlp/gpu-tiled/w256_b64_lr0.01_e5_s0
cpu=mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e5_s0
threads() { for v in OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS; do echo "$v=$1"; done; }
epoch() { python -c "import json,sys; m=json.load(open(sys.argv[1]+'/metrics.json')); print(sys.argv[2], round(m['mean_epoch_time_s'],4), m['provenance']['cores'])" "$1" "$2" | tee -a "$out/host.txt"; }
place_gpu="python -m gpunn.placement --threads 1 --timed gpu --timing overlap --gpu --slots 0 --"
place_cpu="python -m gpunn.placement --threads 14 --timed cpu --timing overlap --"
for r in 1 2; do
  env $(threads 14) python -m gpunn train $gpu --data $data --out /tmp/h/g1 > /dev/null; epoch /tmp/h/g1 "gpu-tiled unplaced, 14 threads"
  env $(threads 1) $place_gpu python -m gpunn train $gpu --data $data --out /tmp/h/g2 > /dev/null; epoch /tmp/h/g2 "gpu-tiled placed, 1 core"
  env $(threads 14) python -m gpunn train $cpu --data $data --out /tmp/h/c1 > /dev/null; epoch /tmp/h/c1 "cpu-numpy unplaced, 14 threads"
  env $(threads 14) $place_cpu python -m gpunn train $cpu --data $data --out /tmp/h/c2 > /dev/null; epoch /tmp/h/c2 "cpu-numpy placed, cores 0-13"
  env $(threads 14) $place_cpu python -m gpunn train $cpu --data $data --out /tmp/h/c3 > /dev/null &
  env $(threads 1) $place_gpu python -m gpunn train $gpu --data $data --out /tmp/h/g3 > /dev/null; wait
  epoch /tmp/h/g3 "gpu-tiled placed, beside cpu-numpy"; epoch /tmp/h/c3 "cpu-numpy placed, beside gpu-tiled"
done
