#!/usr/bin/env bash
# Issue 27 on a GPU machine without network: the full config with timed jobs overlapping, then gpunn overlap-check.
# Run from the repository root; every step but `stage` works in the copy /tmp/run (a carried folder is replaced by
# the next call's copy, so nothing long may run inside the checkout).
#   bash docs/notes/issue-27/device.sh stage DATASET..     copy this tree (first call) and datasets/DATASET into /tmp/run
#   bash docs/notes/issue-27/device.sh start [ARGS..]      in the background: the full run (ARGS go to snakemake),
#                                                          then overlap-check; logs in /tmp/run/*.log
#   bash docs/notes/issue-27/device.sh poll SECONDS        wait until the background work ends or SECONDS pass
#   bash docs/notes/issue-27/device.sh collect OUT         results without weights/arrays, logs: OUT/run.tar.gz
set -euo pipefail
RUN=/tmp/run
step=${1:?stage, start, poll or collect}
shift

case "$step" in
stage)
    if [ ! -d "$RUN/src" ]; then
        mkdir -p "$RUN"
        tar --exclude=./.whl --exclude=./datasets --exclude=./.git --exclude=./results --exclude=./.dev -cf - . |
            tar -xf - -C "$RUN"
    fi
    for dataset in "$@"; do
        mkdir -p "$RUN/datasets/$dataset"
        cp datasets/"$dataset"/* "$RUN/datasets/$dataset/"
    done
    ls "$RUN/datasets"/*
    nproc
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
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
python -m gpunn overlap-check --cpu mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e1_s0_n20000 \
    --cpu-data results/data/prepared/mnist/standard.npz \
    --gpu synthetic_cifar10/standard/autoencoder/gpu-graph/w256-128_b64_lr0.002_e8_s0 \
    --gpu-data results/data/prepared/synthetic_cifar10/standard.npz \
    --threads \${CHECK_THREADS:-14} --repeats 3 --out results/overlap > check.log 2>&1
echo \$? > check.rc
EOF
    GPUNN_COMMIT=${GPUNN_COMMIT:-unknown} setsid nohup bash chain.sh > chain.out 2>&1 < /dev/null &
    echo "started: $(date)"
    ;;
poll)
    cd "$RUN"
    deadline=$(( $(date +%s) + ${1:?seconds} ))
    while [ ! -f check.rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    date
    grep -E "steps \(|Error|error" full.log | tail -4 || true
    [ -f full.rc ] && echo "full run: exit $(cat full.rc), $(( $(cat full.end) - $(cat full.start) )) s"
    [ -f check.log ] && tail -3 check.log
    [ -f check.rc ] && echo "overlap-check: exit $(cat check.rc)"
    ;;
collect)
    out=${1:?OUT}
    cd "$RUN"
    tar --exclude='*.npz' --exclude='*.npy' --exclude='*.pdf' --exclude=results/data \
        -czf "$out/run.tar.gz" results full.log check.log full.start full.end full.rc chain.out \
        $( [ -f check.rc ] && echo check.rc ) 2>/dev/null || true
    ls -la "$out"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
