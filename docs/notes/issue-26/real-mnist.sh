#!/usr/bin/env bash
# E1 (MLP) and E4 (CNN) on real MNIST: cpu-numpy and gpu-graph from the same init and batch order, the test
# accuracy of each, and gpu-graph trained twice to check that its weights are bit-identical (issue 26,
# deliverable 3). Needs the real MNIST files in datasets/mnist/ and a GPU.
#   bash docs/notes/issue-26/real-mnist.sh OUTDIR [threads] [variants]
# variants: default "cpu-numpy gpu-graph"; "gpu-graph" alone reruns the GPU side against an earlier cpu-numpy result
set -euo pipefail
out=${1:?usage: real-mnist.sh OUTDIR [threads] [variants]}
threads=${2:-16}
variants=${3:-cpu-numpy gpu-graph}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
mkdir -p "$out"
python -m gpunn download mnist --dest "$out/raw" --mirror datasets/mnist
python -m gpunn prepare mnist --raw "$out/raw" --out "$out/train.npz" --split standard
runs=""
for model in "mlp/VARIANT/w256_b64_lr0.01_e10_s0" "cnn/VARIANT/w16-32_b64_lr0.01_e5_s0"; do
  for variant in $variants; do runs="$runs mnist/standard/${model/VARIANT/$variant}"; done
done
for run in $runs; do
  python -m gpunn train "$run" --data "$out/train.npz" --out "$out/runs/$run"
  python -m gpunn evaluate --run "$out/runs/$run" --data "$out/train.npz" --out "$out/runs/$run/eval"
  case $run in *gpu-graph*)
    python -m gpunn train "$run" --data "$out/train.npz" --out "$out/again/$run" ;;
  esac
done
python - "$out" $runs <<'PY'
import json, sys, pathlib
import numpy as np
out = pathlib.Path(sys.argv[1])
print("| run | test accuracy | test loss | weights identical on a second run |\n|---|---:|---:|---|")
for run in sys.argv[2:]:
    ev = json.loads((out / "runs" / run / "eval" / "eval.json").read_text())
    again = out / "again" / run / "weights.npz"
    same = "-"
    if again.exists():
        a, b = (np.load(d / run / "weights.npz") for d in (out / "runs", out / "again"))
        same = "yes" if sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a) else "NO"
    print(f"| {run} | {100 * ev['test_accuracy']:.2f} % | {ev['test_loss']:.4f} | {same} |")
PY
