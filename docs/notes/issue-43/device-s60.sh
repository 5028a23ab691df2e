#!/bin/bash
# Issue 43, stop 60's and stop 61's first device call: the solver's probe at E6's shape (smo_probe.py), then the
# GPU tests of the solver's files; $1: output folder. Run from a copy under /tmp with PYTHONPATH set, in the background.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
timeout 420 python docs/notes/issue-43/smo_probe.py "$out" 50000 5000 > "$out/probe.log" 2>&1
echo PROBE-END $?
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_smo.py tests/test_kernels_smo.py \
  tests/test_kernels_gemm_rbf.py > "$out/test-gpu.log" 2>&1
echo DONE
