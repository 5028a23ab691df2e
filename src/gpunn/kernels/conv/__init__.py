"""Stride-1 2-D convolution kernels (cross-correlation, as PyTorch), NCHW float32: forward, input gradient
(backward_data), weight gradient (backward_weight) and bias gradient (bias_grad).

Layouts (those of ``gpunn.nn.functional``): x (N, Cin, H, W), w (Cout, Cin, k, k), y and dy (N, Cout, OH, OW)
with OH = H + 2p - k + 1. Arrays are numba device arrays (w may be a strided view of a flat parameter buffer).
Every launcher is ``conv_<pass>_<version>(...)``, takes ``block``/``stream``/``launch`` and returns a bound
``Launch`` or ``LaunchGroup``, run once unless ``launch=False``. ``VERSIONS[pass][version]`` is a
``ConvVersion`` record; ``runnable_versions`` filters them for the simulator and a layer's shape.

Versions (the papers' naive and optimized CUDA kernels, papers 001 and 004, and ours), a module each:

    naive          every pass: one thread per output element (dx gathered, no atomics; dw one per weight, db one
                   per channel, both in one launch as ``with_bias``)
    tiled          forward / input gradient: output tile x COG channels per block, input tile + halo and
                   weights in shared memory; bias + ReLU or the ReLU mask fused
    block          weight gradient: block per (co, ci) slice and batch split, shared-memory tree, atomics across
                   splits; bias gradient: block per channel, tree (deterministic)
    shuffle        weight gradient as block, reduced by warp shuffles then shared memory (real GPU only)
    deterministic  weight gradient as block, the splits' partial sums added in a fixed order: bit-identical
    staged         weight gradient of a layer with a narrow side (<= 4 channels): padded input planes staged in
                   shared memory, narrow*k*k sums per thread, partials added in a fixed order
    implicit_gemm  forward, input and weight gradient as implicit-im2col GEMMs of ``gpunn.kernels.gemm``
    winograd       forward, input and weight gradient of 3x3 kernels by Winograd's F(2x2, 3x3): elementwise
                   tile transforms around one batched GEMM of the 16 positions (``gemm.batched``)
    split          bias gradient: (Cout, S) blocks over batch splits, partials added in a fixed order
    atomic         weight and bias gradients: one thread per output-gradient element (n, co, oy, ox) adding its
                   products into the zeroed dw (and db) with atomics; with the bias, both in one scatter pass

A weight-gradient version may also make the bias gradient in the same launches (``ConvVersion.with_bias``, a
launcher taking db after dw): ``naive`` does (Cout more threads in its launch), ``deterministic`` (``wgrad_bias``:
dy's sum beside the k*k products), ``atomic`` (``wgrad_atomic``: each thread's dy added into db beside its
products) and ``winograd`` (``winograd_wgrad``: its dy transform's blocks sum dy, plain and upsampled). A layer
whose bias gradient is "made by the weight-gradient pass" (gpunn.backends.gpu.policy.
BIAS_WITH_WEIGHT) calls it instead of the two launchers. The fused conv + ReLU + pool stage's versions of that
pass are ``POOL_WGRAD_BIAS``: "gemm" (its weight-gradient GEMM with a ones column, ``wgrad_bias``) and "direct"
(``wgrad_direct``).

Convolutions on a 2x nearest-upsampled input read through the upsample (``upsampled``): ``UP_VERSIONS[pass]``
holds their ``ConvVersion`` records (forward and backward_data ``implicit_gemm`` and ``winograd``, backward_weight
``implicit_gemm``, ``staged`` and ``winograd``; forward and backward_weight ``phase``: 3x3, padding-1 passes of few
output channels on the small grid of x by the upsample's phase decomposition, ``phase_up``), launchers
``conv_<pass>_<version>_up`` taking the map before the upsample; ``upsampled_version`` gives a plain version's
twin. A table of its own: their inputs differ from ``VERSIONS``' (x, not up(x)).

The float64 NumPy references are ``conv_forward_ref``, ``conv_backward_data_ref``, ``conv_backward_weight_ref``
and ``conv_bias_grad_ref``. Index arithmetic is uint32 (see ``gpunn.kernels.gemm.mappings``). History (PTX
facts, measurements): NOTES.md next to this file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpunn import device

from .bias_grad import (
    SIMULATOR_BIAS_SPLITS,
    bias_grad_splits,
    conv_bias_grad_block,
    conv_bias_grad_split,
)
from .checks import SMEM_LIMIT, WARP, conv_output_size
from .implicit_gemm import (
    conv_backward_data_implicit_gemm,
    conv_backward_weight_implicit_gemm,
    conv_forward_implicit_gemm,
)
from .naive import (
    conv_backward_data_naive,
    conv_backward_weight_bias_naive,
    conv_backward_weight_naive,
    conv_bias_grad_naive,
    conv_forward_naive,
)
from .phase_up import conv_backward_weight_phase_up, conv_forward_phase_up, phase_fits, phase_forward_fits
from .reference import (
    conv_backward_data_ref,
    conv_backward_weight_ref,
    conv_bias_grad_ref,
    conv_forward_ref,
)
from .staged import conv_backward_weight_staged, staged_fits
from .tiled import (
    CI_CHUNK,
    COG,
    channel_group,
    conv_backward_data_tiled,
    conv_forward_tiled,
    fitted_threads,
    tile_shape,
)
from .upsampled import (
    conv_backward_data_implicit_gemm_up,
    conv_backward_data_up_ref,
    conv_backward_weight_implicit_gemm_up,
    conv_backward_weight_staged_up,
    conv_backward_weight_up_ref,
    conv_forward_implicit_gemm_up,
    conv_forward_up_ref,
    upsampled_shape,
)
from .weight_grad import (
    conv_backward_weight_block,
    conv_backward_weight_deterministic,
    conv_backward_weight_shuffle,
    weight_grad_splits,
)
from .wgrad_atomic import conv_backward_weight_atomic, conv_backward_weight_bias_atomic, conv_bias_grad_atomic
from .wgrad_bias import conv_backward_weight_bias_deterministic, conv_backward_weight_bias_pool
from .wgrad_direct import conv_backward_weight_bias_pool_direct, direct_layout
from .winograd import (
    conv_backward_data_winograd,
    conv_backward_data_winograd_up,
    conv_forward_winograd,
    conv_forward_winograd_up,
    winograd_fits,
)
from .winograd_wgrad import (
    conv_backward_weight_bias_winograd,
    conv_backward_weight_bias_winograd_up,
    conv_backward_weight_winograd,
    conv_backward_weight_winograd_up,
)

__all__ = [
    "CI_CHUNK",
    "COG",
    "PASSES",
    "POOL_WGRAD_BIAS",
    "SIMULATOR_BIAS_SPLITS",
    "SMEM_LIMIT",
    "UP_VERSIONS",
    "VERSIONS",
    "WARP",
    "ConvVersion",
    "bias_grad_splits",
    "channel_group",
    "conv_backward_data_implicit_gemm",
    "conv_backward_data_naive",
    "conv_backward_data_ref",
    "conv_backward_data_tiled",
    "conv_backward_data_implicit_gemm_up",
    "conv_backward_data_up_ref",
    "conv_backward_weight_implicit_gemm_up",
    "conv_backward_weight_staged_up",
    "conv_backward_weight_up_ref",
    "conv_forward_implicit_gemm_up",
    "conv_forward_phase_up",
    "conv_forward_up_ref",
    "conv_backward_weight_atomic",
    "conv_backward_weight_bias_atomic",
    "conv_backward_weight_bias_deterministic",
    "conv_backward_weight_bias_naive",
    "conv_backward_weight_bias_pool",
    "conv_backward_weight_bias_pool_direct",
    "conv_backward_weight_block",
    "conv_backward_weight_deterministic",
    "conv_backward_weight_implicit_gemm",
    "conv_backward_weight_naive",
    "conv_backward_weight_phase_up",
    "conv_backward_weight_ref",
    "conv_backward_weight_shuffle",
    "conv_backward_weight_staged",
    "conv_bias_grad_atomic",
    "conv_bias_grad_block",
    "conv_bias_grad_naive",
    "conv_bias_grad_ref",
    "conv_bias_grad_split",
    "conv_forward_implicit_gemm",
    "conv_forward_naive",
    "conv_forward_winograd",
    "conv_backward_data_winograd",
    "conv_backward_data_winograd_up",
    "conv_backward_weight_bias_winograd",
    "conv_backward_weight_bias_winograd_up",
    "conv_backward_weight_winograd",
    "conv_backward_weight_winograd_up",
    "conv_forward_winograd_up",
    "winograd_fits",
    "conv_forward_ref",
    "conv_forward_tiled",
    "conv_launcher",
    "conv_output_size",
    "direct_layout",
    "fitted_threads",
    "phase_fits",
    "runnable_versions",
    "phase_forward_fits",
    "staged_fits",
    "tile_shape",
    "upsampled_shape",
    "upsampled_version",
    "weight_grad_splits",
]

PASSES = ("forward", "backward_data", "backward_weight", "bias_grad")


def _every_layer(*layer) -> bool:
    return True


@dataclass(frozen=True)
class ConvVersion:
    """One version of one pass: its launcher; whether it needs a real GPU (warp shuffles: not under the
    simulator); which layers (cin, cout, k, padding, height, width) it handles; whether it takes a run's thread
    count (the implicit-GEMM versions run their GEMM version's fixed block); for a weight gradient, the launcher
    that makes the bias gradient too (dw, then db; None: this version makes dw only)."""

    name: str
    launcher: Callable
    needs_gpu: bool = False
    applies: Callable = _every_layer
    takes_threads: bool = True
    with_bias: Callable | None = None


def _table(*versions: ConvVersion) -> dict:
    return {v.name: v for v in versions}


VERSIONS = {
    "forward": _table(
        ConvVersion("naive", conv_forward_naive),
        ConvVersion("tiled", conv_forward_tiled),
        ConvVersion("implicit_gemm", conv_forward_implicit_gemm, takes_threads=False),
        ConvVersion("winograd", conv_forward_winograd, applies=winograd_fits, takes_threads=False),
    ),
    "backward_data": _table(
        ConvVersion("naive", conv_backward_data_naive),
        ConvVersion("tiled", conv_backward_data_tiled),
        ConvVersion("implicit_gemm", conv_backward_data_implicit_gemm, takes_threads=False),
        ConvVersion("winograd", conv_backward_data_winograd, applies=winograd_fits, takes_threads=False),
    ),
    "backward_weight": _table(
        ConvVersion("naive", conv_backward_weight_naive, with_bias=conv_backward_weight_bias_naive),
        ConvVersion("block", conv_backward_weight_block),
        ConvVersion("shuffle", conv_backward_weight_shuffle, needs_gpu=True),
        ConvVersion("deterministic", conv_backward_weight_deterministic,
                    with_bias=conv_backward_weight_bias_deterministic),
        ConvVersion("implicit_gemm", conv_backward_weight_implicit_gemm, takes_threads=False),
        ConvVersion("staged", conv_backward_weight_staged, applies=staged_fits),
        ConvVersion("winograd", conv_backward_weight_winograd, applies=winograd_fits, takes_threads=False,
                    with_bias=conv_backward_weight_bias_winograd),
        ConvVersion("atomic", conv_backward_weight_atomic, with_bias=conv_backward_weight_bias_atomic),
    ),
    "bias_grad": _table(
        ConvVersion("naive", conv_bias_grad_naive),
        ConvVersion("block", conv_bias_grad_block),
        ConvVersion("split", conv_bias_grad_split),
        ConvVersion("atomic", conv_bias_grad_atomic),
    ),
}


# the fused conv + ReLU + pool stage's weight + bias gradient pass (launchers taking x, dpool, route, dw, db, padding)
POOL_WGRAD_BIAS = {"gemm": conv_backward_weight_bias_pool, "direct": conv_backward_weight_bias_pool_direct}


# versions of the passes of a conv whose input is a 2x upsample (the launchers take the map before it)
UP_VERSIONS = {
    "forward": _table(
        ConvVersion("implicit_gemm", conv_forward_implicit_gemm_up, takes_threads=False),
        ConvVersion("winograd", conv_forward_winograd_up, applies=winograd_fits, takes_threads=False),
        ConvVersion("phase", conv_forward_phase_up, applies=phase_forward_fits, takes_threads=False),
    ),
    "backward_data": _table(
        ConvVersion("implicit_gemm", conv_backward_data_implicit_gemm_up, takes_threads=False),
        ConvVersion("winograd", conv_backward_data_winograd_up, applies=winograd_fits, takes_threads=False),
    ),
    "backward_weight": _table(
        ConvVersion("implicit_gemm", conv_backward_weight_implicit_gemm_up, takes_threads=False),
        ConvVersion("staged", conv_backward_weight_staged_up, applies=staged_fits),
        ConvVersion("winograd", conv_backward_weight_winograd_up, applies=winograd_fits, takes_threads=False,
                    with_bias=conv_backward_weight_bias_winograd_up),
        ConvVersion("phase", conv_backward_weight_phase_up, applies=phase_fits, takes_threads=False),
    ),
}
UP_DEFAULT = "implicit_gemm"  # the twin of a plain version that has none of its own


def upsampled_version(pass_name: str, version: str) -> ConvVersion:
    """The record of a pass on an upsampled input standing in for plain `version`: its twin of the same name in
    UP_VERSIONS, else UP_DEFAULT's (naive, tiled and the block reductions have no twin); the bias gradient
    (which reads dy only) keeps its plain version."""
    if pass_name not in UP_VERSIONS:
        return VERSIONS[pass_name][version]
    table = UP_VERSIONS[pass_name]
    return table.get(version, table[UP_DEFAULT])


def runnable_versions(pass_name: str, layer: tuple | None = None) -> dict:
    """name -> launcher of the versions of a pass that can run here (all on a GPU; not those needing one under
    the simulator) and, given a `layer` (cin, cout, k, padding, height, width), that handle it."""
    simulator = device.simulator_enabled()
    return {name: v.launcher for name, v in VERSIONS[pass_name].items()
            if not (simulator and v.needs_gpu) and (layer is None or v.applies(*layer))}


def conv_launcher(pass_name: str, version: str):
    """The launcher of one version of one pass; ValueError naming the choices otherwise."""
    if pass_name not in VERSIONS:
        raise ValueError(f"conv: unknown pass {pass_name!r}; choose from {list(VERSIONS)}")
    if version not in VERSIONS[pass_name]:
        raise ValueError(f"conv: unknown {pass_name} version {version!r}; choose from {list(VERSIONS[pass_name])}")
    return VERSIONS[pass_name][version].launcher
