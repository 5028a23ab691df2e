#!/bin/bash
# Issue 43, stop 61's second device script: the solver's GPU tests, then E6 at full size through Snakemake with
# gpu-smo and exact side by side (config/gpu_offline.yaml: synthetic CIFAR-10 in the real format and size), then
# the probe (both selections, the mirrored kernel); $1: output folder. Run from a copy under /tmp, PYTHONPATH set.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider tests/test_smo.py tests/test_kernels_smo.py \
  tests/test_kernels_gemm_rbf.py > "$out/test-gpu.log" 2>&1
echo TESTS-END $?
timeout 900 snakemake e6 --cores 16 --scheduler greedy --configfile config/gpu_offline.yaml \
  --config "experiments={e6: {method: [gpu-smo, exact]}}" > "$out/snakemake.log" 2>&1
echo SNAKE-END $?
mkdir -p "$out/e6"
cp -r results/report/*/e6 "$out/e6/report" 2>/dev/null
(cd results && find svm logs/svm logs/features logs/train benchmarks -type f \
  \( -name '*.json' -o -name '*.csv' -o -name '*.log' -o -name '*.tsv' \) | tar cf - -T - | tar xf - -C "$out/e6")
timeout 420 python docs/notes/issue-43/smo_probe.py "$out/probe" 50000 5000 > "$out/probe.log" 2>&1
echo DONE
