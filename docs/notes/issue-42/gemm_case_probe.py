"""Issue 42 probe (device): one of bench gemm's cases (default the MLP's fc1 weight gradient, 784 x 256 over K = 64,
A^T) on the given GEMM versions, each validated against float64 (in its input format) and timed with CUDA events
(median of 50, bench.core), beside cuBLAS in the same format.

    python docs/notes/issue-42/gemm_case_probe.py OUT [CASE [VERSION,...]]"""
import sys

from gpunn.bench import gemm as BG
from gpunn.bench.core import bench_frame, benchmark
from gpunn.kernels import gemm as G

out = sys.argv[1]
name = sys.argv[2] if len(sys.argv) > 2 else "mlp_fc1_grad_w"
versions = (sys.argv[3].split(",") if len(sys.argv) > 3 else
            ["tiled16", "regblock", "regblock128", "coalesced128", "tensor_tf32", "tensor_bf16"])
problem = BG.gemm_problems([next(c for c in BG.GEMM_CASES + BG.QUICK_GEMM_CASES if c.case == name)])[0]
problem.versions = {v: G.DENSE_LAUNCHERS[v] for v in versions}
frame = bench_frame(benchmark([problem], [], repeats=50))
frame.to_csv(f"{out}/gemm_case_{name}.csv", index=False)
print(frame[["version", "ms", "gflops", "ref_name", "ref_ms"]].to_string())
