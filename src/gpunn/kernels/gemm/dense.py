"""The dense launchers: ``C = op(A) @ op(B)`` with an epilogue on 2-D float32 device arrays, one launcher per
version that has one (``skinny`` runs mapped problems only), and the dispatcher ``gemm(..., version=...)``.

Every launcher is ``gemm_<version>(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False,
relu_mask=None, block=<its default>, stream=0, launch=True, splits=1) -> Launch``: it checks the operands, binds
the launch and, unless ``launch=False``, runs it once. ``splits`` other than 1 (None: automatic; an int: that
many) runs split-K and returns a ``LaunchGroup``, the epilogue applied by the fixed-order sum launch.
``gemm_direct(fmt, a, b, out, ...)``: ``a @ b.T`` by ``direct_<fmt>`` (K-major operands only; not in
``DENSE_LAUNCHERS``); ``gemm_ws(fmt, a, b, out, ...)`` the same by ``ws_<fmt>``, ``gemm_tma`` by ``tma_<fmt>``.
"""

from __future__ import annotations

import numpy as np

from ..common import epilogue_args
from ..launch import Launch, LaunchGroup, bind
from . import direct, direct_tma, direct_ws
from .problem import GemmProblem, gemm_shapes
from .split_k import gemm_split_k, multiprocessors
from .versions import VERSIONS, check_device, gemm_mapped, lookup

__all__ = ["DENSE_LAUNCHERS", "gemm", "gemm_coalesced128", "gemm_direct", "gemm_ws", "gemm_naive", "gemm_regblock",
           "gemm_regblock128", "gemm_tensor_bf16", "gemm_tensor_tf32", "gemm_tiled16", "gemm_tma", "gemm_wgmma_bf16",
           "gemm_wgmma_tf32"]


FLAT_VERSIONS = frozenset({"coalesced128"})  # versions that read K-contiguous operands flat (32-bit offsets)
FLAT_MAX = 2**32  # elements a flat operand may have (its offsets are uint32)


def _operand(version, x, trans, k_contiguous):
    """(mapping, array) of a dense operand: passed flat to the versions of FLAT_VERSIONS where K is its contiguous
    axis (A not transposed, B transposed) and it is C-contiguous (``dense_flat``, ``dense_t_flat``: 32-bit element
    offsets instead of 64-bit strided addresses; in coalesced128's SASS 606 instead of 626 instructions per K step
    at NN, NOTES.md), else as it is."""
    name = "dense_t" if trans else "dense"
    if version in FLAT_VERSIONS and k_contiguous and x.is_c_contiguous() and x.size < FLAT_MAX:
        return f"{name}_flat", x.reshape(x.size)
    return name, x


def _dense(version, a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits):
    """One launch (``splits=1``, the default: no split kernel is even compiled), or split-K through
    ``gemm_split_k`` (``splits=None``: its automatic count; an int: that many, K permitting)."""
    op = VERSIONS[version].op
    m, n, k = gemm_shapes(a, b, out, trans_a, trans_b, bias, relu_mask, op)
    epilogue, aux = epilogue_args(op, bias, relu, relu_mask)
    a_map, a = _operand(version, a, trans_a, not trans_a)
    b_map, b = _operand(version, b, trans_b, trans_b)
    kw = dict(a_map=a_map, b_map=b_map, block=block, stream=stream, launch=launch, op=op,
              name=f"{op}[{'T' if trans_a else 'N'}{'T' if trans_b else 'N'},{epilogue}]")
    if isinstance(splits, (int, np.integer)) and not isinstance(splits, bool) and splits == 1:
        return gemm_mapped(version, GemmProblem(m, n, k), a, b, out, aux, epilogue, **kw)
    return gemm_split_k(version, GemmProblem(m, n, k), a, b, out, aux, epilogue, splits=splits, **kw)


def gemm_naive(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
               block=VERSIONS["naive"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Naive GEMM; ``block`` is (bx, by), bx along the columns of C."""
    return _dense("naive", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_tiled16(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                 block=VERSIONS["tiled16"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Shared-memory tiled GEMM; the block is fixed to (16, 16)."""
    return _dense("tiled16", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_regblock(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                  block=VERSIONS["regblock"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Register-blocked GEMM (64x64 tile); the block is fixed to 256 threads."""
    return _dense("regblock", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_regblock128(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                     block=VERSIONS["regblock128"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Register-blocked GEMM (128x128 tile, 8x8 per thread); the block is fixed to 256 threads."""
    return _dense("regblock128", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch,
                  splits)


def gemm_coalesced128(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                      block=VERSIONS["coalesced128"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """regblock128's tile with whole-line tile loads and warp tiles (the same bits); the block is fixed to 256
    threads."""
    return _dense("coalesced128", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch,
                  splits)


def gemm_tensor_tf32(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                     block=VERSIONS["tensor_tf32"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Tensor-core GEMM, inputs rounded to TF32, float32 accumulation (128x128 tile); the block is fixed to 256
    threads."""
    return _dense("tensor_tf32", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch,
                  splits)


def gemm_tensor_bf16(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                     block=VERSIONS["tensor_bf16"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Tensor-core GEMM, inputs rounded to BF16, float32 accumulation (128x128 tile); the block is fixed to 256
    threads."""
    return _dense("tensor_bf16", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch,
                  splits)


def gemm_wgmma_tf32(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                    block=VERSIONS["wgmma_tf32"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Hopper warpgroup-MMA GEMM, inputs rounded to TF32, float32 accumulation (128x128 tile, compute capability
    9.0 only); the block is fixed to 256 threads."""
    return _dense("wgmma_tf32", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def gemm_wgmma_bf16(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                    block=VERSIONS["wgmma_bf16"].block, stream=0, launch=True, splits=1) -> Launch | LaunchGroup:
    """Hopper warpgroup-MMA GEMM, inputs rounded to BF16, float32 accumulation (128x128 tile, compute capability
    9.0 only); the block is fixed to 256 threads."""
    return _dense("wgmma_bf16", a, b, out, trans_a, trans_b, bias, relu, relu_mask, block, stream, launch, splits)


def _aligned(x) -> bool:
    interface = getattr(x, "__cuda_array_interface__", None)
    address = interface["data"][0] if interface else x._ary.__array_interface__["data"][0]  # (the simulator's)
    return address % 16 == 0


def gemm_direct(fmt, a, b, out, bias=None, relu=False, relu_mask=None, stream=0, launch=True,
                stages=direct.STAGES) -> Launch:
    """``out = a @ b.T`` (+ bias) (ReLU) or masked by ``relu_mask > 0`` by ``direct_<fmt>``: ``a`` (M, K), ``b`` (N,
    K), both C-contiguous, 16-byte aligned device arrays of ``direct.DTYPES[fmt]`` (float32; uint16 BF16 bits, K
    even); ``out`` float32 (M, N). ``stages`` other than direct.STAGES: an experiment's ring (its own kernel)."""
    m, n, k, op, epilogue, aux = _k_major_checks("direct", fmt, a, b, out, bias, relu, relu_mask)
    fn = direct.kernel(fmt, stages)(direct.A_MAP, direct.B_MAP, "dense", 1, epilogue)
    grid, block = direct.config(op, direct.THREADS, m, n, fn)
    return bind(fn, grid, block, (a.reshape(a.size), b.reshape(b.size), out, aux, GemmProblem(m, n, k).dims),
                stream, launch, f"{op}[NT,{epilogue}]", direct.shared_bytes(stages))


def gemm_ws(fmt, a, b, out, bias=None, relu=False, relu_mask=None, stream=0, launch=True,
            stages=direct_ws.STAGES, bn=direct_ws.BN, regs=direct_ws.REGS) -> Launch:
    """``out = a @ b.T`` (+ bias) (ReLU) or masked by ``relu_mask > 0`` by ``ws_<fmt>`` (warp-specialized): the
    operands as ``gemm_direct``'s. ``stages``, ``bn`` (128 or 256) and ``regs`` (setmaxnreg's (producer, consumer)
    registers, or None) other than the defaults: an experiment's kernel."""
    m, n, k, op, epilogue, aux = _k_major_checks("ws", fmt, a, b, out, bias, relu, relu_mask)
    fn = direct_ws.kernel(fmt, stages, bn, regs)(direct_ws.A_MAP, direct_ws.B_MAP, "dense", 1, epilogue)
    grid, block = direct_ws.config_fn(bn)(op, direct_ws.THREADS, m, n, fn)
    return bind(fn, grid, block, (a.reshape(a.size), b.reshape(b.size), out, aux, GemmProblem(m, n, k).dims),
                stream, launch, f"{op}[NT,{epilogue}]", direct_ws.shared_bytes(stages, bn))


def gemm_tma(fmt, a, b, out, bias=None, relu=False, relu_mask=None, stream=0, launch=True,
             stages=direct_tma.STAGES, bn=direct_tma.BN, regs=direct_tma.REGS, persistent=0) -> Launch:
    """``out = a @ b.T`` (+ bias) (ReLU) or masked by ``relu_mask > 0`` by ``tma_<fmt>`` (ws with TMA as the
    producer): the operands as ``gemm_ws``'s, their rows a multiple of 16 bytes (K % 4 == 0 TF32, K % 8 == 0 BF16:
    ValueError otherwise). The tensor maps are encoded here (cached on a GPU: gpunn.kernels.tma). ``persistent``: 0,
    a block a tile; n > 0, at most n blocks looping over the tiles; -1, one block an SM."""
    from ..tma import encode_2d

    m, n, k, op, epilogue, aux = _k_major_checks("tma", fmt, a, b, out, bias, relu, relu_mask)
    if (k * a.dtype.itemsize) % 16:
        raise ValueError(f"{op}: TMA reads rows of a multiple of 16 bytes: K a multiple of "
                         f"{16 // a.dtype.itemsize}, got {k} (use gemm_ws)")
    blocks = multiprocessors() if persistent == -1 else int(persistent)
    fn = direct_tma.kernel(fmt, stages, bn, regs, persistent=blocks > 0)(direct_tma.A_MAP, direct_tma.B_MAP, "dense",
                                                                         1, epilogue)
    grid, block = (direct_tma.persistent_config(blocks, m, n, bn) if blocks > 0 else
                   direct_tma.config_fn(bn)(op, direct_tma.THREADS, m, n, fn))
    maps = encode_2d(a, direct_tma.BM), encode_2d(b, bn)
    # The maps hold the operands' addresses only: the launch keeps a and b alive (a caller's temporaries, freed
    # and reused, would be read through them).
    return bind(fn, grid, block, (*maps, out, aux, GemmProblem(m, n, k).dims), stream, launch,
                f"{op}[NT,{epilogue}]", direct_tma.shared_bytes(stages, bn), keep=(a, b))


def _k_major_checks(family, fmt, a, b, out, bias, relu, relu_mask):
    """(m, n, k, op, epilogue, aux) of a K-major launch of ``<family>_<fmt>`` (direct, ws, tma); ValueError where the
    operands are not what it reads."""
    if fmt not in direct.DTYPES:
        raise ValueError(f"gemm_{family}: unknown format {fmt!r}; choose from {sorted(direct.DTYPES)}")
    spec = VERSIONS[f"{family}_{fmt}"]
    op = spec.op
    check_device(spec, op)
    m, n, k = gemm_shapes(a, b, out, False, True, bias, relu_mask, op, direct.DTYPES[fmt])
    for name, x in (("a", a), ("b", b)):
        if not (x.is_c_contiguous() and _aligned(x)) or x.size >= 2**32:
            raise ValueError(f"{op}: {name} must be C-contiguous, 16-byte aligned and under 2**32 elements")
    if fmt == "bf16" and k % 2:
        raise ValueError(f"{op}: K must be even (4-byte copies of BF16 pairs), got {k}")
    epilogue, aux = epilogue_args(op, bias, relu, relu_mask)
    return m, n, k, op, epilogue, aux


# The versions with a dense launcher (the benchmark times each; its block default is in its signature).
DENSE_LAUNCHERS = {"naive": gemm_naive, "tiled16": gemm_tiled16, "regblock": gemm_regblock,
                   "regblock128": gemm_regblock128, "coalesced128": gemm_coalesced128,
                   "tensor_tf32": gemm_tensor_tf32, "tensor_bf16": gemm_tensor_bf16,
                   "wgmma_tf32": gemm_wgmma_tf32, "wgmma_bf16": gemm_wgmma_bf16}


def gemm(a, b, out, version="tiled16", **kw) -> Launch | LaunchGroup:
    """``out = op(a) @ op(b)`` with an epilogue, by the named version; kw go to its launcher."""
    lookup(version, "gemm", DENSE_LAUNCHERS)  # ValueError naming the choices
    return DENSE_LAUNCHERS[version](a, b, out, **kw)
