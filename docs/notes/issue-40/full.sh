#!/usr/bin/env bash
# Issue 40 on a GPU machine without network: the full config (config/gpu_offline.yaml) in the background in /tmp/run
# (a carried folder is replaced by the next call's copy). Run from the repository root.
#   bash docs/notes/issue-40/full.sh stage DATASET..   copy this tree (first call) and datasets/DATASET into /tmp/run
#   bash docs/notes/issue-40/full.sh start [ARGS..]    snakemake in the background (ARGS go to it, e.g. --config
#                                                      timing=overlap threads=14); its log: /tmp/run/full.log; then
#                                                      gpunn overlap-verdict into results/overlap-verdict (VERDICT=0: not)
#   bash docs/notes/issue-40/full.sh poll SECONDS      wait until it ends or SECONDS pass; prints its progress
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
    cat > chain.sh <<EOF
set -u
export PYTHONPATH=$RUN/src
date +%s > full.start
snakemake --cores \$(nproc) --scheduler greedy --keep-going --configfile config/gpu_offline.yaml $* > full.log 2>&1
echo \$? > full.rc
date +%s > full.end
if [ "\${VERDICT:-1}" = 1 ]; then
    python -m gpunn overlap-verdict --results results > verdict.log 2>&1
    # the reports again, now with the verdict as an input (only they rerun)
    snakemake --cores \$(nproc) --scheduler greedy --configfile config/gpu_offline.yaml $* > reports.log 2>&1
fi
python docs/notes/issue-40/startup_table.py results > startup_table.md 2>&1
python docs/notes/issue-40/weight_hashes.py hash results weight_hashes.csv > /dev/null 2>&1
EOF
    # a user's Python writes .pyc files (the lent machine sets PYTHONDONTWRITEBYTECODE)
    env -u PYTHONDONTWRITEBYTECODE GPUNN_COMMIT="${GPUNN_COMMIT:-unknown}" VERDICT="${VERDICT:-1}" setsid nohup bash chain.sh > chain.out 2>&1 \
        < /dev/null &
    echo "started: $(date)"
    ;;
poll)
    cd "$RUN"
    deadline=$(( $(date +%s) + ${1:?seconds} ))
    while [ ! -f startup_table.md ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    date
    echo "$(( $(date +%s) - $(cat full.start) )) s since the start"
    grep -E "steps \(|[Ee]rror" full.log | tail -4 || true
    [ -f full.rc ] && echo "full run: exit $(cat full.rc), $(( $(cat full.end) - $(cat full.start) )) s"
    [ -f startup_table.md ] && head -40 startup_table.md
    ;;
collect)
    out=${1:?OUT}
    cd "$RUN"
    tar --exclude='*.npz' --exclude='*.npy' --exclude=results/data --exclude=results/offline \
        -czf "$out/run.tar.gz" results full.log full.start full.end full.rc chain.out startup_table.md weight_hashes.csv \
        verdict.log reports.log \
        2>/dev/null || true
    ls -la "$out"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
