#!/usr/bin/env bash
# Issue 27's overlap measurement on a GPU machine, in one call: the data it needs (MNIST from datasets/mnist, the
# synthetic CIFAR-10 generated), the machine's CPU topology, then gpunn overlap-check; its report into OUT.
#   [CPU_RUN=..] [GPU_RUN=..] bash docs/notes/issue-27/check.sh OUT [overlap-check options, e.g. --scenario gpu]
# (runs on MNIST and the synthetic CIFAR-10, e.g. CPU_RUN=mnist/e2/... needs the e2 split prepared: not here)
set -euo pipefail
out=${1:?OUT}
shift
lscpu -e > "$out/lscpu.txt" 2>&1 || true
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$out/gpus.txt"
snakemake --cores "$(nproc)" --scheduler greedy results/data/prepared/mnist/standard.npz \
    results/data/prepared/synthetic_cifar10/standard.npz --configfile config/gpu_offline.yaml > "$out/data.log" 2>&1
cpu=${CPU_RUN:-mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e1_s0_n20000}
gpu=${GPU_RUN:-synthetic_cifar10/standard/autoencoder/gpu-graph/w256-128_b64_lr0.002_e8_s0}
python -m gpunn overlap-check --cpu "$cpu" --cpu-data "results/data/prepared/${cpu%%/*}/standard.npz" \
    --gpu "$gpu" --gpu-data "results/data/prepared/${gpu%%/*}/standard.npz" \
    --threads 14 --repeats 3 --out "$out/overlap" "$@" 2>&1 | tee "$out/check.log"
rm -rf "$out/overlap/runs"
