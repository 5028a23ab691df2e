# cpu-numpy's CNN epoch (6 400 random samples, batch 64) on 4, 8 and 14 pinned cores, twice each: speed and steadiness
export PYTHONPATH=$PWD/src
for round in 1 2; do
  for n in 14 8 4; do
    last=$((n - 1))
    OMP_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n MKL_NUM_THREADS=$n taskset -c 0-$last python -m gpunn.bench cnn \
        --variants cpu-numpy --samples 6400 --epochs 4 --out /tmp/t.csv > /tmp/t.log 2>&1
    echo "threads $n round $round: $(python -c "import csv; print([r['epoch_s'] for r in csv.DictReader(open('/tmp/t.csv')) if r['variant']=='cpu-numpy'])")"
  done
done
