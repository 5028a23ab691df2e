#!/usr/bin/env bash
# Issue 40 on a GPU machine without network: the full config (config/gpu_offline.yaml) in the background in /tmp/run
# (a carried folder is replaced by the next call's copy). Run from the repository root.
#   bash docs/notes/issue-40/full.sh stage DATASET..   copy this tree (first call) and datasets/DATASET into /tmp/run
#   bash docs/notes/issue-40/full.sh start [ARGS..]    snakemake in the background (ARGS go to it, e.g. --config
#                                                      cpu_lanes=2); its log: /tmp/run/full.log; then gpunn
#                                                      overlap-verdict into results/overlap-verdict (VERDICT=0: not),
#                                                      the reports again, gpunn publish into /tmp/run/docs/results,
#                                                      gpunn.bench of the three models and the agreement table (BENCH=0:
#                                                      not)
#   bash docs/notes/issue-40/full.sh poll SECONDS      wait until startup_table.md (UNTIL=FILE: that file) exists or
#                                                      SECONDS pass; prints its progress
#   bash docs/notes/issue-40/full.sh collect OUT       results without arrays, logs, start-up table and the trained
#                                                      weights' hashes (weight_hashes.py): OUT/run.tar.gz
# Set GPUNN_COMMIT to the commit the tree is at (provenance: the machine has no .git).
set -euo pipefail
RUN=/tmp/run
step=${1:?stage, start, poll or collect}
shift
case "$step" in
stage)
    bash docs/notes/issue-27/device.sh stage "$@"  # the same copy into /tmp/run
    ;;
start)
    cd "$RUN"
    # CONFIGS: the config files of the run and of its publication (e.g. add one that sets timing: overlap)
    CONFIGS=${CONFIGS:-config/gpu_offline.yaml}
    # OVERLAY: YAML text of one more config file, e.g. OVERLAY=$'timing: overlap\nthreads: 14\n'
    if [ -n "${OVERLAY:-}" ]; then
        printf '%s' "$OVERLAY" > overlay.yaml
        CONFIGS="$CONFIGS overlay.yaml"
    fi
    cat > chain.sh <<EOF
set -u
export PYTHONPATH=$RUN/src
date +%s > full.start
snakemake --cores \$(nproc) --scheduler greedy --keep-going --configfile $CONFIGS $* > full.log 2>&1
echo \$? > full.rc
date +%s > full.end
if [ "\${VERDICT:-1}" = 1 ]; then
    python -m gpunn overlap-verdict --results results > verdict.log 2>&1
    # the reports again, now with the verdict as an input (only they rerun)
    snakemake --cores \$(nproc) --scheduler greedy --configfile $CONFIGS $* > reports.log 2>&1
fi
python docs/notes/issue-40/startup_table.py results > startup_table.md 2>&1
python docs/notes/issue-40/weight_hashes.py hash results weight_hashes.csv > /dev/null 2>&1
# the publication, from this tree (kept or not after reading the verdict)
machine=\$(ls results/report | grep -v '^index' | head -1)
python -m gpunn publish --configfile $CONFIGS --to docs/results/\$machine --readme README.md \
    > publish.log 2>&1
echo \$? > publish.rc
# deliverable 6: gpunn.bench of the same code, each model alone (the CPU variants on the run's 14 cores)
if [ "\${BENCH:-1}" = 1 ]; then
    export OMP_NUM_THREADS=14 OPENBLAS_NUM_THREADS=14 MKL_NUM_THREADS=14
    taskset -c 0-13 python -m gpunn.bench mlp --out results/bench/mlp.csv > bench.log 2>&1
    python -m gpunn.bench cnn --variants gpu-naive,gpu-optimized,gpu-im2col,gpu-graph,gpu-tf32,gpu-bf16 \
        --out results/bench/cnn.csv >> bench.log 2>&1
    python -m gpunn.bench autoencoder --variants gpu-im2col,gpu-graph,gpu-tf32,gpu-bf16 --batch 64 \
        --out results/bench/autoencoder.csv >> bench.log 2>&1
    python docs/notes/issue-40/bench_agreement.py docs/results/\$machine results/bench/mlp.csv results/bench/cnn.csv \
        results/bench/autoencoder.csv --verdict results/overlap-verdict/\$machine/verdict.json > agreement.md 2>&1
fi
date +%s > chain.end
EOF
    # a user's Python writes .pyc files (the lent machine sets PYTHONDONTWRITEBYTECODE)
    env -u PYTHONDONTWRITEBYTECODE GPUNN_COMMIT="${GPUNN_COMMIT:-unknown}" VERDICT="${VERDICT:-1}" BENCH="${BENCH:-1}" setsid nohup bash chain.sh > chain.out 2>&1 \
        < /dev/null &
    echo "started: $(date)"
    ;;
poll)
    cd "$RUN"
    deadline=$(( $(date +%s) + ${1:?seconds} ))
    until [ -f "${UNTIL:-startup_table.md}" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 5; done
    date
    echo "$(( $(date +%s) - $(cat full.start) )) s since the start"
    grep -E "steps \(|[Ee]rror" full.log | tail -4 || true
    [ -f full.rc ] && echo "full run: exit $(cat full.rc), $(( $(cat full.end) - $(cat full.start) )) s"
    [ -f startup_table.md ] && head -40 startup_table.md
    [ -f publish.rc ] && echo "publish: exit $(cat publish.rc)" && tail -3 publish.log
    [ -f results/overlap-verdict/*/verdict.md ] && cat results/overlap-verdict/*/verdict.md | head -40
    [ -f agreement.md ] && cat agreement.md
    [ -f chain.end ] && echo "chain ended $(( $(cat chain.end) - $(cat full.start) )) s after the start"
    ;;
collect)
    out=${1:?OUT}
    cd "$RUN"
    tar --exclude='*.npz' --exclude='*.npy' --exclude=results/data --exclude=results/offline \
        -czf "$out/run.tar.gz" results full.log full.start full.end full.rc chain.out startup_table.md weight_hashes.csv \
        verdict.log reports.log publish.log publish.rc docs/results README.md bench.log agreement.md chain.end \
        2>/dev/null || true
    ls -la "$out"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
