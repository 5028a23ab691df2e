#!/usr/bin/env bash
# One device call, from the carry folder with PYTHONPATH set: MODE kernels | final; results under $OUT.
mode=$1; budget=${2:-225}; steps=${3:-forward,backward_data,backward_weight}
d=/tmp/wino_out; mkdir -p $d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$d/device.txt" 2>&1
left() { echo $(( budget - SECONDS )); }
here=docs/notes/issue-26/h100-winograd
timeout 70 python $here/bench_winograd.py "$d/wino.csv" > "$d/wino.log" 2>&1
echo "bench rc $? at ${SECONDS}s" >> "$d/wino.log"
timeout 30 python -m pytest -q -m gpu tests/test_kernels_conv_winograd.py -p no:cacheprovider \
  -k "autoencoder_shapes and shape3 or upsampled_shapes and shape1" > "$d/gpu_tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s" >> "$d/gpu_tests.log"
if [ "$mode" = final ]; then runs="none $steps $steps,noshare"; else runs="$steps"; fi
n=$(echo $runs | wc -w)
for s in $runs; do
  tag=$(echo "$s" | tr ',' '_' | cut -c1-40)
  t=$(( $(left) / n )); n=$(( n - 1 ))
  [ "$t" -lt 30 ] && { echo "skipped $s: ${t}s left" >> "$d/ae.log"; continue; }
  timeout "$t" python $here/ae_bench.py "$s" autoencoder --variants gpu-graph --batch 64 --epochs 2 \
    --out "$d/ae_$tag.csv" >> "$d/ae.log" 2>&1
  echo "ae $s rc $? at ${SECONDS}s" >> "$d/ae.log"
done
tar czf "$OUT/results.tar.gz" -C $d . && cp $d/*.log "$OUT/" 2>/dev/null
grep -v "^wgrad.*splits\|^fwd\|^dgrad\|^wgrad" $d/wino.log | tail -5; grep "total\|splits\|shared" $d/wino.log
tail -3 $d/gpu_tests.log; grep -v "^device_in_use\|^torch_max\|^TFLOP" $d/ae.log
