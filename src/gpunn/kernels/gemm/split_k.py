"""Split-K: a GEMM with few output tiles and a long K (the conv weight gradient: M = Cout, N = Cin*k*k,
K = N*OH*OW) divides K into ``splits`` chunks along grid z.

Block (x, y, z) runs its version's own kernel on chunk z (``mappings.k_range_fn``) and stores its tile of partial
sums into slice z of a (splits, M, N) scratch buffer (store ``partial``, epilogue none); a second launch sums the
slices in the fixed order z = 0, 1, ... and applies the real epilogue and store. No atomics: the result is
bit-identical run to run (for a given split count). The sum kernel issues SUM_UNROLL independent loads per step
(the additions stay in order). Napkin math, PTX facts and the measurements behind the split rules: NOTES.md.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from gpunn import device

from ..common import cdiv
from ..jit import jit
from ..launch import Launch, LaunchGroup, bind, grid_for
from .mappings import U1, finish_fn, store_fns
from .problem import D_M, D_N, U32_LIMIT, GemmProblem
from .skinny import SK_KC
from .versions import gemm_mapped, lookup, output_tiles

__all__ = ["MAX_SPLITS", "SIMULATOR_SPLITS", "auto_splits", "gemm_split_k", "multiprocessors", "split_k_chunks",
           "underfilled_splits"]

SPLIT_WAVES = 2  # automatic split count: about this many blocks per SM ...
SPLIT_MIN_K = 256  # ... but at least this many K indices per split (partial traffic and the sum's cost)
SKINNY_BLOCKS_PER_SM = 48  # the skinny version's split target (underfilled_splits)
ONE_WAVE_SPLITS = 2  # underfilled_splits where the tiles fill between half the SMs and one wave
SIMULATOR_SPLITS = 2  # automatic split count under the simulator (tests use tiny K; SM counts mean nothing)
MAX_SPLITS = 65535  # grid z limit
SPLIT_SUM_THREADS = 128
SUM_UNROLL = 4
_SUM_UNROLL = np.uint32(SUM_UNROLL)


@functools.cache
def _split_sum_kernel(store, ksize, epilogue):
    out_row = store_fns(store, ksize)[0]
    finish = finish_fn(store, ksize, epilogue)

    @jit
    def gemm_split_sum(partials, c, aux, dims, splits):
        # One thread per element e = (i, j) of C, grid-stride; consecutive threads read consecutive partials.
        vals = cuda.local.array(SUM_UNROLL, float32)
        m = dims[D_M]
        n = dims[D_N]
        mn = uint32(m * n)
        step = uint32(mn * _SUM_UNROLL)
        e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while e < mn:
            i = uint32(e // n)
            j = uint32(e - i * n)
            acc = partials[e]
            idx = uint32(e + mn)
            z = U1
            while uint32(z + _SUM_UNROLL) <= splits:
                for u in range(SUM_UNROLL):  # the loads first (in flight together), then the sums in order
                    vals[u] = partials[uint32(idx + uint32(u) * mn)]
                for u in range(SUM_UNROLL):
                    acc += vals[u]
                idx = uint32(idx + step)
                z = uint32(z + _SUM_UNROLL)
            while z < splits:
                acc += partials[idx]
                idx = uint32(idx + mn)
                z = uint32(z + U1)
            finish(c, aux, dims, out_row(dims, i), j, acc)
            e = uint32(e + stride)

    return gemm_split_sum


def split_k_chunks(k: int, splits: int, k_step: int) -> tuple[int, int]:
    """(splits used, k_len): chunks of ceil(K / splits) K indices rounded up to a multiple of the K step, so
    that no block's tile reaches into the next chunk; ceil(K / k_len) of them, every one non-empty (fewer
    than asked where the rounding covers K sooner, e.g. K = 16, 3 splits, step 8: 2 chunks of 8)."""
    k_len = cdiv(cdiv(k, splits), k_step) * k_step
    return cdiv(k, k_len), k_len


def auto_splits(k: int, tiles: int, multiprocessors: int, waves: int = SPLIT_WAVES,
                min_k: int = SPLIT_MIN_K) -> int:
    """Enough splits for about ``waves`` blocks per SM over ``tiles`` output tiles, but at least ``min_k``
    K indices per split (and at least one split)."""
    return max(1, min(cdiv(waves * multiprocessors, tiles), k // min_k))


def underfilled_splits(version: str, problem: GemmProblem) -> int:
    """The split count for a GEMM whose output tiles may not fill the GPU (e.g. a convolution on 8x8 maps):
    ``auto_splits`` when the tiles fill at most half the SMs; ONE_WAVE_SPLITS when they fill between half the SMs
    and one wave (K permitting); else 1. The skinny version's blocks are small (128 threads, one stream of loads
    each), so it splits until about SKINNY_BLOCKS_PER_SM blocks per SM, in chunks of at least one K step. 1 under
    the simulator (its tests ask for splits explicitly). The H100 timings behind these rules: NOTES.md."""
    if device.simulator_enabled():
        return 1
    tiles = output_tiles(version, problem.m, problem.n)
    sms = multiprocessors()
    if version == "skinny":  # as many chunks as K has K steps, at most
        return max(1, min(cdiv(SKINNY_BLOCKS_PER_SM * sms, tiles), cdiv(problem.k, SK_KC)))
    if 2 * tiles <= sms:
        return auto_splits(problem.k, tiles, sms)
    if tiles <= sms:  # one block per SM at most: two splits give each SM a second block
        return max(1, min(ONE_WAVE_SPLITS, problem.k // SPLIT_MIN_K))
    return 1


@functools.cache
def multiprocessors() -> int:
    """This device's SM count, asked once (1 under the simulator): what the split rules divide."""
    return int(device.device_info()["multiprocessors"])


def gemm_split_k(version, problem: GemmProblem, a, b, out, aux, epilogue="none", *, a_map="dense",
                 b_map="dense", store="dense", ksize=1, splits=None, block=None, stream=0, launch=True, op=None,
                 name=None) -> Launch | LaunchGroup:
    """``gemm_mapped`` with the K range split among ``splits`` blocks per output tile.

    ``splits=None``: ``auto_splits`` on this device (``SIMULATOR_SPLITS`` under the simulator). The count
    used is ``split_k_chunks``'s (it can be lower than asked). One split: ``gemm_mapped``'s single launch,
    no scratch. Otherwise a ``LaunchGroup`` of the split launch and the sum launch; the (splits, M, N)
    scratch buffer is allocated here, once, NaN-filled (a partial no block wrote would poison C)."""
    spec = lookup(version)
    op = op or spec.op
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, (int, np.integer))
                               or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f"{op}: splits must be None or an int in [1, {MAX_SPLITS}], got {splits!r}")
    m, n = problem.m, problem.n
    kernel = spec.kernel(a_map, b_map, "partial", int(ksize), "none", True)
    grid, threads = spec.config(op, spec.block if block is None else block, m, n, kernel)
    if splits is None:
        splits = (SIMULATOR_SPLITS if device.simulator_enabled()
                  else auto_splits(problem.k, int(np.prod(grid)), multiprocessors()))
    splits, k_len = split_k_chunks(problem.k, int(splits), spec.k_step)
    name = name or f"{op}[{a_map},{b_map}->{store},k{ksize},{epilogue}]"
    if splits == 1:
        return gemm_mapped(version, problem, a, b, out, aux, epilogue, a_map=a_map, b_map=b_map, store=store,
                           ksize=ksize, block=block, stream=stream, launch=launch, op=op, name=name)
    if splits * m * n >= U32_LIMIT:
        raise ValueError(f"{op}: {splits} partial ({m}, {n}) tiles exceed 2^31 elements; use fewer splits")
    sum_kernel = _split_sum_kernel(store, int(ksize), epilogue)
    device.check_block(op, SPLIT_SUM_THREADS, sum_kernel)
    partials = cuda.to_device(np.full(splits * m * n, np.nan, dtype=np.float32))
    group = LaunchGroup([
        bind(kernel, (*grid, splits), threads, (a, b, partials, aux, (*problem.dims, np.uint32(k_len))), stream,
             False, f"{name}[split {splits} x {k_len}]"),
        bind(sum_kernel, grid_for(m * n, SPLIT_SUM_THREADS), SPLIT_SUM_THREADS,
             (partials, out, aux, problem.dims, np.uint32(splits)), stream, False, f"{name}[sum {splits}]"),
    ])
    if launch:
        group()
    return group

