#!/bin/bash
# Issue 42, the warp-specialized GEMM (ws_tf32 / ws_bf16, branch s57-gemm-ws): its GPU tests (beside direct's), then
# ws_probe.py at 4096^3 beside direct_* and cuBLAS. Timeouts: a wrong mbarrier parity hangs a kernel instead of
# failing it. Run from the repository root (a copy); $1: output folder.
out=$1; mkdir -p "$out"
exec > "$out/run.log" 2>&1
set -x
nvidia-smi -L
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_gemm_ws.py \
  tests/test_kernels_gemm_direct.py > "$out/test-gpu-ws.log" 2>&1
echo "tests rc=$?"
timeout 400 python docs/notes/issue-42/ws_probe.py "$out" > "$out/ws_probe.log" 2>&1
echo "probe rc=$?"
