# Does job start-up beside a 14-thread cpu-numpy CNN slow it? alone / start-ups on cores 14-15 / start-ups anywhere
pkill -f "gpunn.bench" ; pkill -f chain.sh; sleep 1
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=14 OPENBLAS_NUM_THREADS=14 MKL_NUM_THREADS=14
storm() { while true; do $1 python -c "import numpy, pandas, numba.cuda" ; done; }
bench() { taskset -c 0-13 python -m gpunn.bench cnn --variants cpu-numpy --samples 6400 --epochs 4 --out /tmp/b.csv > /tmp/b.log 2>&1; python -c "import csv; print([r[\"epoch_s\"] for r in csv.DictReader(open(\"/tmp/b.csv\")) if r[\"variant\"]==\"cpu-numpy\"])" || tail -3 /tmp/b.log; }
for round in 1 2; do
  echo "== alone $round"; bench
  echo "== storm on 14-15 $round"; storm "taskset -c 14,15" & pid=$!; sleep 1; bench; kill $pid; pkill -f "import numpy, pandas"; sleep 1
  echo "== storm anywhere $round"; storm "" & pid=$!; sleep 1; bench; kill $pid; pkill -f "import numpy, pandas"; sleep 1
done
