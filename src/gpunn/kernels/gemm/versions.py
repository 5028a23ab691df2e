"""The GEMM versions, one ``GemmVersion`` record each in ``VERSIONS``, and ``gemm_mapped``: one version's single
launch on a problem description and operand mappings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpunn import device

from ..common import cdiv
from ..launch import Launch, bind
from . import direct, direct_tma, direct_ws, naive, regblock, regblock128, skinny, tensor, tiled16, warpgroup
from .deep import TILES as DEEP_TILES
from .operand_tiles import FORMATS
from .problem import GemmProblem

__all__ = ["VERSIONS", "GemmVersion", "gemm_mapped", "lookup", "output_tiles"]


@dataclass(frozen=True)
class GemmVersion:
    """One GEMM version: its kernel factory ``kernel(a_map, b_map, store, ksize, epilogue, split_k=False)``, its
    launch configuration ``config(op, block, M, N, kernel) -> (grid, block)``, its default block, the K of one
    step of its K loop (split-K chunks are multiples of it), the (rows, columns) of C one block computes and the
    format its inputs are rounded to before they are multiplied (``fp32``: not rounded; ``tf32``, ``bf16``: the
    tensor-core versions, float32 accumulation) and the compute capabilities it runs on (`devices`, empty: every
    one; `min_cc`: that capability or newer, the tensor cores' TF32 and BF16 MMAs from 8.0), the bytes of dynamic
    shared memory a block (`shared`) and, for a version that takes only some operand mappings (`maps`: (A's, B's);
    empty: every one), those (``direct_*``, ``ws_*``, ``tma_*``: K-major flat operands, tma_*'s as their tensor
    maps; no dense launcher, conv leaves them out)."""

    name: str
    kernel: Callable
    config: Callable
    block: object
    k_step: int
    tile: tuple
    inputs: str = "fp32"
    devices: tuple = ()
    min_cc: tuple = ()
    shared: int = 0
    maps: tuple = ()

    @property
    def op(self) -> str:
        """The launch name's prefix."""
        return f"gemm_{self.name}"

    def tiles(self, m: int, n: int) -> int:
        """Blocks of a default-block launch over an M x N output: its output tiles."""
        return cdiv(m, self.tile[0]) * cdiv(n, self.tile[1])


VERSIONS = {v.name: v for v in (
    GemmVersion("naive", naive.kernel, naive.config, (16, 16), 1, (16, 16)),
    GemmVersion("tiled16", tiled16.kernel, tiled16.config, (tiled16.TILE, tiled16.TILE), tiled16.TILE,
                (tiled16.TILE, tiled16.TILE)),
    GemmVersion("regblock", regblock.kernel, regblock.config, regblock.THREADS, regblock.BK,
                (regblock.BM, regblock.BN)),
    GemmVersion("regblock128", regblock128.kernel, regblock128.config, regblock128.THREADS, regblock128.BK,
                (regblock128.BM, regblock128.BN)),
    GemmVersion("coalesced128", regblock128.kernel_coalesced, regblock128.config, regblock128.THREADS,
                regblock128.BK, (regblock128.BM, regblock128.BN)),
    GemmVersion("skinny", skinny.kernel, skinny.config, skinny.SK_THREADS, skinny.SK_KC,
                (skinny.SK_THREADS, skinny.SK_N)),
    *(GemmVersion(d.name, d.kernel, d.config, d.threads, d.bk, (d.bm, d.bn)) for d in DEEP_TILES),
    *(GemmVersion(f"tensor_{fmt}", tensor.kernel(fmt), tensor.config, tensor.THREADS, tensor.BK,
                  (tensor.BM, tensor.BN), fmt, min_cc=device.TENSOR_CORE_MIN_CC) for fmt in FORMATS),
    *(GemmVersion(f"wgmma_{fmt}", warpgroup.kernel(fmt), warpgroup.config, warpgroup.THREADS, warpgroup.BK,
                  (warpgroup.BM, warpgroup.BN), fmt, warpgroup.DEVICES) for fmt in FORMATS),
    GemmVersion("direct_tf32", direct.kernel("tf32"), direct.config, direct.THREADS, 32, (direct.BM, direct.BN),
                "tf32_trunc", direct.DEVICES, shared=direct.shared_bytes(), maps=(direct.A_MAP, direct.B_MAP)),
    GemmVersion("direct_bf16", direct.kernel("bf16"), direct.config, direct.THREADS, 64, (direct.BM, direct.BN),
                "bf16", direct.DEVICES, shared=direct.shared_bytes(), maps=(direct.A_MAP, direct.B_MAP)),
    *(GemmVersion(f"ws_{fmt}", direct_ws.kernel(fmt), direct_ws.config, direct_ws.THREADS, k_step,
                  (direct_ws.BM, direct_ws.BN), inputs, direct_ws.DEVICES, shared=direct_ws.shared_bytes(),
                  maps=(direct_ws.A_MAP, direct_ws.B_MAP)) for fmt, k_step, inputs in (("tf32", 32, "tf32_trunc"),
                                                                                       ("bf16", 64, "bf16"))),
    *(GemmVersion(f"tma_{fmt}", direct_tma.kernel(fmt), direct_tma.config, direct_tma.THREADS, k_step,
                  (direct_tma.BM, direct_tma.BN), inputs, direct_tma.DEVICES, shared=direct_tma.shared_bytes(),
                  maps=(direct_tma.A_MAP, direct_tma.B_MAP)) for fmt, k_step, inputs in (("tf32", 32, "tf32_trunc"),
                                                                                         ("bf16", 64, "bf16"))),
)}


def lookup(version: str, op: str = "gemm", choices=VERSIONS) -> GemmVersion:
    """The record of a version among `choices`; ValueError naming them otherwise."""
    if version not in choices:
        raise ValueError(f"{op}: unknown version {version!r}; choose from {sorted(choices)}")
    return VERSIONS[version]


def check_device(spec: GemmVersion, op: str) -> None:
    """ValueError naming the version and the device when the version cannot run on this GPU (the simulator runs
    every version)."""
    if not (spec.devices or spec.min_cc) or device.simulator_enabled():
        return
    from numba import cuda

    cc = tuple(cuda.get_current_device().compute_capability)
    if spec.min_cc and cc < tuple(spec.min_cc):
        raise ValueError(f"{op}: version {spec.name!r} needs a GPU of compute capability {spec.min_cc[0]}."
                         f"{spec.min_cc[1]} or newer for its tensor-core MMAs (this one is {cc[0]}.{cc[1]}); choose "
                         f"a float32 version, e.g. 'regblock'")
    if spec.devices and cc not in spec.devices:
        wanted = " or ".join(f"{major}.{minor}" for major, minor in spec.devices)
        raise ValueError(f"{op}: version {spec.name!r} needs a GPU of compute capability {wanted} (this one is "
                         f"{cc[0]}.{cc[1]}); choose another version, e.g. 'tensor_{spec.inputs[:4]}'")


def output_tiles(version: str, m: int, n: int) -> int:
    """Blocks of a (default-block) launch of `version` over an M x N output: its output tiles."""
    return VERSIONS[version].tiles(m, n)


def gemm_mapped(version, problem: GemmProblem, a, b, out, aux, epilogue="none", *, a_map="dense",
                b_map="dense", store="dense", ksize=1, block=None, stream=0, launch=True, op=None,
                name=None) -> Launch:
    """One GEMM version on a problem description and operand mappings (the lower-level entry).

    The caller has checked the arrays against the mappings (shapes, dtypes, flat views where a mapping
    indexes a flat buffer); ``aux`` is the bias (``bias``, ``bias_relu``), the mask (``mask``, indexed like
    the store) or any float32 device array (the other epilogues)."""
    spec = lookup(version)
    op = op or spec.op
    check_device(spec, op)
    kernel = spec.kernel(a_map, b_map, store, int(ksize), epilogue)
    grid, block = spec.config(op, spec.block if block is None else block, problem.m, problem.n, kernel)
    name = name or f"{op}[{a_map},{b_map}->{store},k{ksize},{epilogue}]"
    return bind(kernel, grid, block, (a, b, out, aux, problem.dims), stream, launch, name, spec.shared)
