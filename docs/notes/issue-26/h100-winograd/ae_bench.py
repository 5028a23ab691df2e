"""`python -m gpunn.bench ...` with policy.AUTO_WINOGRAD_STEPS set first (gpu-graph's "auto" Winograd rule per pass):
    PYTHONPATH=src python ae_bench.py forward,backward_data,backward_weight autoencoder --variants gpu-graph ...
("none": the rule off, every pass as before this branch)."""
import runpy
import sys

from gpunn.backends.gpu import policy

policy.AUTO_WINOGRAD_STEPS = tuple(s for s in sys.argv[1].split(",") if s not in ("", "none"))
print("AUTO_WINOGRAD_STEPS =", policy.AUTO_WINOGRAD_STEPS, flush=True)
sys.argv = ["gpunn.bench", *sys.argv[2:]]
runpy.run_module("gpunn.bench", run_name="__main__", alter_sys=True)
