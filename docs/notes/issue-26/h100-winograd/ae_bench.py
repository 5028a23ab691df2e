"""`python -m gpunn.bench ...` with policy.AUTO_WINOGRAD_STEPS set first (gpu-graph's "auto" Winograd rule per pass):
    PYTHONPATH=src python ae_bench.py forward,backward_data,backward_weight[,noshare] autoencoder --variants ...
("none": the rule off, every pass as before this branch; "noshare": layers.SHARE_WINOGRAD_INPUT off)."""
import runpy
import sys

from gpunn.backends.gpu import layers, policy

words = sys.argv[1].split(",")
policy.AUTO_WINOGRAD_STEPS = tuple(s for s in words if s not in ("", "none", "noshare"))
layers.SHARE_WINOGRAD_INPUT = "noshare" not in words
print("AUTO_WINOGRAD_STEPS =", policy.AUTO_WINOGRAD_STEPS, "SHARE_WINOGRAD_INPUT =", layers.SHARE_WINOGRAD_INPUT,
      flush=True)
sys.argv = ["gpunn.bench", *sys.argv[2:]]
runpy.run_module("gpunn.bench", run_name="__main__", alter_sys=True)
