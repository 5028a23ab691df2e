#!/bin/bash
# The whole `pytest -m gpu` side by side; $1: folder for its logs. Run from the repository root with PYTHONPATH set.
# With pytest-xdist installed (its and execnet's wheels copied into .whl), 6 workers, one test file each at a time
# (test-gpu.log); else four fixed shards (test-gpu-1..4.log; stop 58: 5.7-10.6 minutes each beside the accuracy runs).
out=$1
if python -c "import xdist" 2>/dev/null; then
  timeout 1100 python -m pytest -m gpu -q -p no:cacheprovider --durations=25 -n 6 --dist loadfile tests \
    > "$out/test-gpu.log" 2>&1
  exit
fi
A="tests/test_kernels_gemm.py tests/test_svm.py tests/test_kernels_pool.py tests/test_gpu_autoencoder.py"
B="tests/test_kernels_conv_gemm.py tests/test_kernels_gemm_direct.py tests/test_kernels_conv_winograd.py"
C="tests/test_bench.py tests/test_gpu_precision.py tests/test_kernels_conv_up.py"
ignore=$(for f in $A $B $C; do printf -- "--ignore=%s " "$f"; done)
pids=()
i=0
for shard in "$A" "$B" "$C" "tests $ignore"; do
  i=$((i + 1))
  timeout 1100 python -m pytest -m gpu -q -p no:cacheprovider --durations=15 $shard > "$out/test-gpu-$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
