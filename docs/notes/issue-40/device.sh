#!/usr/bin/env bash
# Issue 40 on a GPU machine without network: the start-up study (startup.py), then `pytest -m gpu`, in /tmp/s (a
# carried folder is replaced by the next call's copy, so nothing long runs inside the checkout).
#   bash docs/notes/issue-40/device.sh stage          copy this tree, .issue40/old/src (the code before) and datasets/mnist
#   bash docs/notes/issue-40/device.sh start          in the background: data, study, GPU tests; logs in /tmp/s/*.log
#                                                     (MODES=cold,warm: this tree only; TESTS=...: the GPU tests run;
#                                                     CPU=1: then cpu_check.py, the CPU baselines before/after)
#   bash docs/notes/issue-40/device.sh poll SECONDS   wait until it ends or SECONDS pass
#   bash docs/notes/issue-40/device.sh collect OUT    the study's CSV and the logs into OUT
set -euo pipefail
S=/tmp/s
step=${1:?stage, start, poll or collect}
shift

case "$step" in
stage)
    mkdir -p "$S/new" "$S/old" "$S/datasets/mnist"
    tar --exclude=./.whl --exclude=./datasets --exclude=./.git --exclude=./results --exclude=./.issue40 -cf - . |
        tar -xf - -C "$S/new"
    cp -r .issue40/old/src "$S/old/"
    cp datasets/mnist/* "$S/datasets/mnist/"
    nproc
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
    ;;
start)
    cd "$S"
    cat > chain.sh <<EOF
set -u
cd $S/new
export PYTHONPATH=$S/new/src
date +%s > ../data.start
python -m gpunn download mnist --dest $S/raw/mnist --mirror $S/datasets/mnist > ../data.log 2>&1
python -m gpunn prepare mnist --raw $S/raw/mnist --out $S/prep/mnist.npz >> ../data.log 2>&1
python -m gpunn make-offline synthetic_cifar10 --out $S/raw/synthetic_cifar10 >> ../data.log 2>&1
python -m gpunn prepare synthetic_cifar10 --raw $S/raw/synthetic_cifar10 --out $S/prep/synthetic_cifar10.npz >> ../data.log 2>&1
date +%s > ../study.start
python docs/notes/issue-40/startup.py $S/old/src $S/new/src $S/prep $S/out \${MODES:-before,cold,warm} > ../study.log 2>&1
echo \$? > ../study.rc
if [ -n "\${CPU:-}" ]; then
  python docs/notes/issue-40/cpu_check.py $S/old/src $S/new/src $S/prep $S/out \$(nproc) > ../cpu.log 2>&1
fi
GPUNN_KERNEL_CACHE=$S/testcache python -m pytest -m gpu -q -p no:cacheprovider \${TESTS:-tests} > ../gpu.log 2>&1
echo \$? > ../gpu.rc
EOF
    # a user's Python writes .pyc files; the lent machine sets PYTHONDONTWRITEBYTECODE, which recompiles gpunn's
    # modules in every job (about 0.3 s each)
    env -u PYTHONDONTWRITEBYTECODE MODES=${MODES:-} TESTS=${TESTS:-} CPU=${CPU:-} setsid nohup bash chain.sh > chain.out 2>&1 < /dev/null &
    echo "started: $(date)"
    ;;
poll)
    cd "$S"
    deadline=$(( $(date +%s) + ${1:?seconds} ))
    while [ ! -f gpu.rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    date
    tail -2 data.log 2>/dev/null || true
    [ -f study.log ] && tail -c 1500 study.log
    [ -f study.rc ] && echo "study: exit $(cat study.rc)"
    [ -f gpu.log ] && tail -3 gpu.log
    [ -f gpu.rc ] && echo "gpu tests: exit $(cat gpu.rc)"
    ;;
collect)
    out=${1:?OUT}
    mkdir -p "$out"
    cp "$S"/*.log "$out"/ 2>/dev/null || true
    cp "$S"/out/startup.csv "$S"/out/cpu_check.csv "$out"/ 2>/dev/null || true
    ls -la "$out"
    ;;
esac
