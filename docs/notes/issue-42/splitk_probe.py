"""Issue 42 probe (device): the MLP's fc1 forward (64 x 256 over K = 784, bias and ReLU) on the tensor-core GEMM
versions with explicit split-K counts, beside the float32 versions; CUDA events, median of 50 (bench.core).

    python docs/notes/issue-42/splitk_probe.py OUT"""
import functools
import sys

from gpunn.bench import gemm as BG
from gpunn.bench.core import bench_frame, benchmark
from gpunn.kernels import gemm as G

out = sys.argv[1]
case = next(c for c in BG.GEMM_CASES if c.case == "mlp_fc1_forward")
problem = BG.gemm_problems([case])[0]
versions = {"regblock": G.DENSE_LAUNCHERS["regblock"], "coalesced128": G.DENSE_LAUNCHERS["coalesced128"]}
for name in ("tensor_tf32", "tensor_bf16", "wgmma_bf16"):
    for splits in (1, 2, 4, 7, 13):
        versions[f"{name}+s{splits}"] = functools.partial(G.DENSE_LAUNCHERS[name], splits=splits)
problem.versions = versions
rows = benchmark([problem], [], repeats=50)
frame = bench_frame(rows)
frame.to_csv(f"{out}/splitk_probe.csv", index=False)
print(frame.to_string())
