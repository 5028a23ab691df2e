"""GPU variants as data: which kernel version per layer type, which fusions, resident data or per-step copies,
CUDA graphs or not. The engine (gpunn.backends.gpu.engine) reads nothing else to decide how to train.

    gpu-naive  E1's design: batch copied to the GPU every step, one kernel per op (naive GEMMs, bias add,
               ReLU, softmax-CE gradient, atomicAdd column sums for bias gradients, SGD); the step's loss is
               copied back every step
    gpu-tiled  the same with 16x16 shared-memory tiled GEMMs in the forward AND backward pass
    gpu-fused  fewest launches, nothing per step on the host: the training set lives on the GPU and each step
               gathers its batch there from the epoch's order and a device-side step counter; a Linear layer fed
               by the gather or by another Linear folds its bias into the GEMM (a ones column after its input,
               the bias row stored right after W in the flat buffer: the bias gradient falls out of the weight-
               gradient GEMM, deterministic), ReLU is the producing GEMM's epilogue and its backward the mask
               epilogue of the next layer's input-gradient GEMM; one SGD launch updates every parameter and
               advances the counter (the MLP: 8 launches per step). Per-sample losses accumulate in an epoch-long
               device buffer read once per epoch.
    gpu-graph  gpu-fused with each step's forward and backward launches captured once into two CUDA graphs
               and replayed (real GPU only: the simulator has no graphs)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Policy:
    name: str
    gemm: str          # GEMM version (gpunn.kernels.gemm.VERSIONS) of dense layers, or "auto": regblock (64x64
                       # tiles) when the output fills at least AUTO_MIN_BLOCKS of its blocks, else tiled16
    fuse: bool         # bias + ReLU in epilogues, ReLU backward as a mask, folded biases, tree bias gradients
    resident: bool     # training set on the GPU, batch gathered there by a device-side step counter
    graphs: bool = False  # each step's launches captured in CUDA graphs (needs a real GPU)
    ce_block: int = 32    # threads per row of the softmax-CE head (a warp: the classifiers have 10 classes)
    # convolution version per pass (gpunn.kernels.conv.VERSIONS) and the max-pool backward (pool.OPS)
    conv: dict = field(default_factory=lambda: dict(DIRECT_CONV))
    pool_backward: str = "atomic"

    @property
    def simulator(self) -> bool:
        """Whether numba's CUDA simulator can run this policy (it has no CUDA graphs)."""
        return not self.graphs


DIRECT_CONV = {"forward": "naive", "backward_data": "naive", "backward_weight": "naive", "bias_grad": "naive"}
TILED_CONV = {"forward": "tiled", "backward_data": "tiled", "backward_weight": "block", "bias_grad": "block"}
# the fused policies' conv: every pass an implicit-im2col GEMM (bias + ReLU, and the ReLU mask, in its epilogue)
FUSED_CONV = {"forward": "implicit_gemm", "backward_data": "implicit_gemm", "backward_weight": "implicit_gemm",
              "bias_grad": "block"}
AUTO_MIN_BLOCKS = 8  # below this many 64x64 output tiles the 16x16 tiles keep more SMs busy

POLICIES = {
    "gpu-naive": Policy("gpu-naive", gemm="naive", fuse=False, resident=False),
    "gpu-tiled": Policy("gpu-tiled", gemm="tiled16", fuse=False, resident=False, conv=TILED_CONV),
    "gpu-fused": Policy("gpu-fused", gemm="auto", fuse=True, resident=True, conv=FUSED_CONV, pool_backward="gather"),
    "gpu-graph": Policy("gpu-graph", gemm="auto", fuse=True, resident=True, graphs=True, conv=FUSED_CONV,
                        pool_backward="gather"),
}


def gemm_version(policy: Policy, rows: int, cols: int) -> str:
    """The GEMM version a layer uses for an output of rows x cols under `policy`."""
    if policy.gemm != "auto":
        return policy.gemm
    return "regblock" if rows * cols >= 64 * 64 * AUTO_MIN_BLOCKS else "tiled16"
