#!/usr/bin/env bash
# Issue 26's closing measurements on a GPU machine, one call: bench mlp / cnn / autoencoder / gemm (PyTorch in the
# same runs), the step profiles of gpu-graph, and E1 / E4 on real MNIST with gpu-graph (trained twice).
#   bash docs/notes/issue-26/final-device.sh OUTDIR   (needs datasets/mnist/ and a GPU)
set -uo pipefail
o=${1:?usage: final-device.sh OUTDIR}
mkdir -p "$o"
step() { echo "== $*" >> "$o/log.txt"; timeout 240 "$@" >> "$o/log.txt" 2>&1 || echo "!! exit $? : $*" >> "$o/log.txt"; }
step python -m gpunn.bench mlp --batch 64 --epochs 3 --out "$o/mlp.csv"
step python -m gpunn.bench cnn --batch 64 --epochs 3 --out "$o/cnn.csv"
step python -m gpunn.bench autoencoder --variants gpu-graph,gpu-im2col --batch 64 --epochs 2 --out "$o/autoencoder.csv"
step python -m gpunn.bench cnn --profile --variants gpu-graph --batch 64 --repeats 20 --out "$o/cnn_step.csv"
step python -m gpunn.bench autoencoder --profile --variants gpu-graph --batch 64 --repeats 20 --out "$o/autoencoder_step.csv"
step python -m gpunn.bench gemm --out "$o/gemm.csv"
step bash docs/notes/issue-26/real-mnist.sh /tmp/real-mnist 16 gpu-graph
grep -v "^epoch\|^warm-up\|^testing" "$o/log.txt" | grep -v Warn > "$o/summary.txt"
