#!/usr/bin/env bash
# One device call (run from the carry folder, PYTHONPATH set): MODE kernels | ae. Writes into $OUT.
mode=$1; budget=${2:-225}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1
left() { echo $(( budget - SECONDS )); }
if [ "$mode" = kernels ]; then
  timeout 130 python docs/notes/issue-26/h100-winograd/bench_winograd.py "$OUT/wino.csv" > "$OUT/wino.log" 2>&1
  echo "bench rc $? at ${SECONDS}s" >> "$OUT/wino.log"
  timeout 40 python -m pytest -q -m gpu tests/test_kernels_conv_winograd.py -k "33" -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc $? at ${SECONDS}s" >> "$OUT/gpu_tests.log"
  if [ "$(left)" -gt 60 ]; then
    timeout "$(left)" python docs/notes/issue-26/h100-winograd/ae_bench.py "${3:-forward,backward_data,backward_weight}" \
      autoencoder --variants gpu-graph --batch 64 --epochs 2 --out "$OUT/ae_wino.csv" > "$OUT/ae_wino.log" 2>&1
    echo "ae rc $? at ${SECONDS}s" >> "$OUT/ae_wino.log"
  fi
else
  for steps in none "${3:-forward,backward_data,backward_weight}"; do
    tag=$( [ "$steps" = none ] && echo base || echo wino )
    timeout $(( $(left) / 2 + 5 )) python docs/notes/issue-26/h100-winograd/ae_bench.py "$steps" autoencoder \
      --variants gpu-graph --batch 64 --epochs 2 --out "$OUT/ae_$tag.csv" > "$OUT/ae_$tag.log" 2>&1
    echo "ae $steps rc $? at ${SECONDS}s" >> "$OUT/ae_$tag.log"
  done
fi
tail -n 80 "$OUT"/*.log
