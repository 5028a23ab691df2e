#!/usr/bin/env bash
# Issue 40's probes on a GPU machine, in the background in /tmp/p (a carried folder is replaced by the next call's
# copy): cpu_steps.py (cpu-numpy's step per code tree), startup_profile.py (a warm job's whole process),
# test_pass.py (the per-epoch test pass's parts), probe_cores.py (interrupts, core pairs).
#   bash docs/notes/issue-40/probes.sh start        copy this tree, .issue40/{old,head}/src, datasets/mnist; start
#   bash docs/notes/issue-40/probes.sh poll SECONDS wait until it ends or SECONDS pass
#   bash docs/notes/issue-40/probes.sh collect OUT  the CSVs, profiles and logs into OUT
# Set STEPS (default: cpu startup testpass cores; also: warm, the warm-server GPU tests and start-up) to choose,
# JOBS for startup_profile.py's jobs, TREES for cpu_steps.py's code trees (old, head: .issue40/<name>/src; any other
# name: this tree, e.g. new, new-nopool, new-t4) and MODELS for its models.
set -euo pipefail
P=/tmp/p
step=${1:?start, poll or collect}
shift
case "$step" in
start)
    mkdir -p "$P/new" "$P/datasets/mnist" "$P/out"
    tar --exclude=./.whl --exclude=./datasets --exclude=./.git --exclude=./results -cf - . | tar -xf - -C "$P/new"
    cp datasets/mnist/* "$P/datasets/mnist/"
    nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA" || true
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
    cat > "$P/chain.sh" <<EOF
set -u
cd $P/new
export PYTHONPATH=$P/new/src
N=$P/new/docs/notes/issue-40
python -m gpunn download mnist --dest $P/raw/mnist --mirror $P/datasets/mnist > ../data.log 2>&1
python -m gpunn prepare mnist --raw $P/raw/mnist --out $P/prep/mnist.npz >> ../data.log 2>&1
python -m gpunn make-offline synthetic_cifar10 --out $P/raw/synthetic_cifar10 >> ../data.log 2>&1
python -m gpunn prepare synthetic_cifar10 --raw $P/raw/synthetic_cifar10 --out $P/prep/synthetic_cifar10.npz >> ../data.log 2>&1
for s in \${STEPS:-cpu startup testpass cores}; do
  echo "\$(date +%T) \$s" >> ../steps.log
  case \$s in
  cpu) trees=""; for t in \${TREES:-old head new new-nopool}; do
         case \$t in old|head) trees="\$trees \$t=$P/new/.issue40/\$t/src" ;; *) trees="\$trees \$t=$P/new/src" ;; esac
       done
       python \$N/cpu_steps.py $P/out \${THREADS:-14} \$trees > ../cpu.log 2>&1 ;;
  startup) (cd \$N && python startup_profile.py $P/new/src $P/prep $P/out/startup \${JOBS:-e1/gpu-graph,e4/gpu-graph,e5/gpu-graph}) > ../startup.log 2>&1 ;;
  testpass) python \$N/test_pass.py $P/out gpu-graph,gpu-im2col,gpu-tiled > ../testpass.log 2>&1 ;;
  cores) python \$N/probe_cores.py $P/out 5 > ../cores.log 2>&1 ;;
  warm) GPUNN_KERNEL_CACHE=$P/testcache python -m pytest -m gpu -q -p no:cacheprovider tests/test_warm.py \
          tests/test_device.py > ../warm.log 2>&1
        (cd \$N && python startup_profile.py $P/new/src $P/prep $P/out/startup \${JOBS:-e1/gpu-graph,e4/gpu-graph} \
          cold,warm,warm,served,served,served) >> ../warm.log 2>&1 ;;
  esac
done
echo "\$(date +%T) end" >> ../steps.log
touch ../done
EOF
    cd "$P" && env -u PYTHONDONTWRITEBYTECODE STEPS="${STEPS:-}" THREADS="${THREADS:-}" JOBS="${JOBS:-}" \
        TREES="${TREES:-}" MODELS="${MODELS:-}" setsid nohup bash chain.sh > chain.out 2>&1 < /dev/null &
    echo "started: $(date)"
    ;;
poll)
    cd "$P"
    deadline=$(( $(date +%s) + ${1:?seconds} ))
    while [ ! -f done ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    cat steps.log 2>/dev/null || true
    for f in cpu startup testpass cores warm; do [ -f $f.log ] && { echo "== $f"; tail -c 2500 $f.log; }; done
    [ -f done ] && echo DONE || true
    ;;
collect)
    out=${1:?OUT}
    mkdir -p "$out"
    cp "$P"/*.log "$out"/ 2>/dev/null || true
    cp "$P"/out/*.csv "$out"/ 2>/dev/null || true
    (cd "$P/out" && tar -czf "$out/startup.tgz" startup/*.txt startup/*.csv 2>/dev/null) || true
    ls -la "$out"
    ;;
esac
