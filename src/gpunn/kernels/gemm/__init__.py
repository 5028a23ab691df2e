"""GEMM kernels: ``C = op(A) @ op(B)`` followed by a fused epilogue, float32, with compile-time operand mappings.

Versions (``VERSIONS``, one ``GemmVersion`` record each; a module each, but ``deep``'s four tiles):

    naive        one thread per output element, block (bx, by) a parameter
    tiled16      16x16 shared-memory tiles, zero-filled edges, coalesced loads for every transpose
    regblock     64x64 block tile, BK 8, 4x4 outputs per thread in registers, 256 threads
    regblock128  128x128 block tile, BK 8, 8x8 outputs per thread, next tile loaded while this one multiplies
    coalesced128 regblock128 with whole cache lines per warp load request, warp tiles and the K step written
                 out (the same bits; the convolutions' 128x128 tile; 86 % of cuBLAS at 4096^3 on an H100)
    skinny       N <= 4: a thread per row of C with 4 columns in registers (mapped problems only)
    narrow       128x32 block tile, BK 8, 4x4 per thread, next step prefetched in registers, window store
    deep128x32, deep128x16, deep32x32   the same with deep K steps (BK 16 / 32) for shallow GEMMs
                 (``deep``: one DeepTile factory for these four; mapped problems only)
    tensor_tf32, tensor_bf16   tensor cores (mma.sync m16n8k8 / m16n8k16), 128x128 tile, inputs rounded to TF32 /
                 BF16 on their way to shared memory, float32 accumulation (``tensor``: one body for both)
    wgmma_tf32, wgmma_bf16   Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only) on swizzled shared tiles, the
                 same tile, loads and rounding (``warpgroup``)
    direct_tf32, direct_bf16   wgmma fed straight by cp.async into a ring of swizzled tiles, C = A B^T of K-major
                 operands only (float32 read as TF32 by truncation; uint16 BF16 bits): ``gemm_direct`` (``direct``)
    ws_tf32, ws_bf16   the same operands, warp-specialized: a producer warpgroup's cp.async, two consumer
                 warpgroups' wgmma m64n256 (128x256 tile), mbarriers instead of block barriers: ``gemm_ws``
                 (``direct_ws``)
    tma_tf32, tma_bf16   ws_* with TMA as the producer (one thread's bulk tensor copies, a tensor map an operand,
                 rows a multiple of 16 bytes): ``gemm_tma`` (``direct_tma``)

Operands are float32 numba device arrays, C-contiguous or strided views; transposed operands are read in place.
Epilogues (``EPILOGUES``): none, bias, bias_relu, relu, mask (C = acc where mask > 0: the ReLU backward).

* ``gemm(a, b, out, version=...)`` and ``gemm_<version>``: dense 2-D operands (``dense``).
* ``gemm_mapped(version, problem, ...)``: one version on a ``GemmProblem`` and operand mappings (``mappings``:
  im2col, weights, NCHW stores); the convolutions of ``gpunn.kernels.conv.implicit_gemm`` are built on it.
* ``gemm_direct(fmt, a, b_nk, out, ...)``: ``direct_<fmt>``, ``a @ b_nk.T``; ``gemm_ws``: ``ws_<fmt>``;
  ``gemm_tma``: ``tma_<fmt>``.
* ``gemm_split_k``: K split along grid z, partial tiles summed in a fixed order by a second launch (``split_k``).
* ``gemm_reference``: the float64 NumPy reference (``inputs=``: A and B rounded as a tensor-core version rounds
  them). ``rbf``: the float64 RBF member of the family (E6's SVM).

History (PTX facts, the measurements behind the split rules): NOTES.md next to this file.
"""

from ..common import EPILOGUES
from .dense import (
    DENSE_LAUNCHERS,
    gemm,
    gemm_coalesced128,
    gemm_direct,
    gemm_naive,
    gemm_regblock,
    gemm_regblock128,
    gemm_tensor_bf16,
    gemm_tensor_tf32,
    gemm_tiled16,
    gemm_tma,
    gemm_wgmma_bf16,
    gemm_wgmma_tf32,
    gemm_ws,
)
from .mappings import A_MAPS, B_MAPS, STORES
from .problem import (
    CONV_FIELDS,
    GemmProblem,
    conv_problem,
    fast_divmod_constants,
    gemm_shapes,
)
from .reference import INPUT_FORMATS, gemm_reference, round_inputs
from .split_k import (
    MAX_SPLITS,
    SIMULATOR_SPLITS,
    auto_splits,
    gemm_split_k,
    multiprocessors,
    split_k_chunks,
    underfilled_splits,
)
from .versions import VERSIONS, GemmVersion, gemm_mapped, lookup, output_tiles

__all__ = [
    "A_MAPS",
    "B_MAPS",
    "CONV_FIELDS",
    "DENSE_LAUNCHERS",
    "EPILOGUES",
    "MAX_SPLITS",
    "SIMULATOR_SPLITS",
    "STORES",
    "VERSIONS",
    "GemmProblem",
    "GemmVersion",
    "INPUT_FORMATS",
    "auto_splits",
    "conv_problem",
    "fast_divmod_constants",
    "gemm",
    "gemm_coalesced128",
    "gemm_direct",
    "gemm_mapped",
    "gemm_naive",
    "gemm_reference",
    "gemm_regblock",
    "gemm_regblock128",
    "gemm_shapes",
    "gemm_split_k",
    "gemm_tensor_bf16",
    "gemm_tensor_tf32",
    "gemm_tiled16",
    "gemm_wgmma_bf16",
    "gemm_wgmma_tf32",
    "gemm_tma",
    "gemm_ws",
    "lookup",
    "multiprocessors",
    "output_tiles",
    "round_inputs",
    "split_k_chunks",
    "underfilled_splits",
]
