#!/bin/bash
# Issue 42, TMA as the ws GEMM's producer (tma_tf32 / tma_bf16, branch s57-gemm-tma): its GPU tests, then
# ws_probe.py at 4096^3: tma at 128x256 (3 and 4 stages, with and without setmaxnreg; persistent) and 128x128 beside
# ws, direct and cuBLAS, then at 257 x 129 x 296 as a check. Timeouts: a wrong expect_tx count or mbarrier parity hangs a
# kernel instead of failing it. Run from the repository root (a copy); $1: output folder.
out=$1; mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}  # this tree's gpunn
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_gemm_tma.py \
  > "$out/test-gpu-tma.log" 2>&1
echo "tests rc=$?"
runs=tma:tf32:4:256:r,tma:tf32:3:256:r,tma:tf32:4:256:n,tma:tf32:6:128:r
runs=$runs,tma:bf16:4:256:r,tma:bf16:3:256:r,tma:bf16:4:256:n,tma:bf16:6:128:r,tma:tf32:4:256:r:p,tma:bf16:4:256:r:p
runs=$runs,ws:tf32:4:256:r,ws:bf16:4:256:r,direct:tf32:7,direct:bf16:3
timeout 300 python docs/notes/issue-42/ws_probe.py "$out" "$runs" square_4096,odd_check_tma > "$out/tma_probe.log" 2>&1
echo "probe rc=$?"
