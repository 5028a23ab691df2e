"""Issue 42 probe (device): the tensor-core GEMM versions beside coalesced128 and cuBLAS in the same format, on the
bench's GEMM cases, plus each kernel's registers and local memory.

    python docs/notes/issue-42/tensor_gemm_probe.py OUT [VERSION,...]"""
import sys

from gpunn.bench import gemm as BG
from gpunn.bench.core import bench_frame, benchmark
from gpunn.kernels import gemm as G

out = sys.argv[1]
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["coalesced128", "tensor_tf32", "tensor_bf16"]
cases = [c for c in BG.GEMM_CASES if c.case in ("square_4096", "odd_validation", "ae_conv2_forward",
                                                  "ae_conv4_forward", "ae_conv4_grad_x", "ae_conv2_grad_w")]
problems = BG.gemm_problems(cases)
for p in problems:
    p.versions = {k: v for k, v in p.versions.items() if k.split("+")[0] in names}
rows = benchmark(problems, [], repeats=20)
bench_frame(rows).to_csv(f"{out}/tensor_gemm.csv", index=False)
for name in names:
    for maps in (("dense", "dense"), ("dense_t", "dense"), ("dense", "dense_t")):
        k = G.VERSIONS[name].kernel(maps[0], maps[1], "dense", 1, "none")
        if k.signatures:
            print(name, maps, "regs", k.get_regs_per_thread(), "local", k.get_local_mem_per_thread(),
                  "shared", k.get_shared_mem_per_block())
