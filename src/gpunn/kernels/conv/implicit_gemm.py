"""Convolution version ``implicit_gemm``, every pass but the bias gradient: stride-1 convolutions as GEMMs of
``gpunn.kernels.gemm`` (``gemm_split_k`` on its operand mappings), the im2col matrix never materialised.

NCHW float32, weight w (Cout, Cin, k, k) (any strides), zero padding p >= 0, square kernels of any size k.
Activations, outputs and masks are C-contiguous device arrays (the mappings address them as flat buffers). Each
op is one GEMM run by any GEMM version (``version=``, one of ``GEMM_VERSIONS``; default ``default_version``):

* forward: out (N, Cout, OH, OW) = conv(x) (+ bias) (ReLU). M = N*OH*OW, N = Cout, K = Cin*k*k; A = im2col(x)
  (``im2col``), B[(ci, kh, kw), co] = w[co, ci, kh, kw] (``weight_t``), NCHW store (``nchw``); bias and ReLU in
  the epilogue.
* input gradient: dx = full correlation of dy with the spatially flipped kernel, channels swapped: A = im2col(dy)
  with padding k-1-p, B = w flipped (``weight_flip_t``), NCHW store; ``relu_mask`` (dx's shape) fuses the
  previous layer's ReLU backward (epilogue ``mask``).
* weight gradient: dw (Cout, Cin, k, k) = sum over (n, oh, ow) of dy[n, co, oh, ow] * x[n, ci, oh+kh-p, ow+kw-p];
  M = Cout, N = Cin*k*k, K = N*OH*OW; A = dy (``channels``), B = im2col(x) in the K-rows role (``im2col_k``),
  store into dw (``weight4``). Few output tiles and a huge K: K is split (``splits=``; None: about
  WGRAD_SPLIT_WAVES blocks per SM), partial tiles summed in a fixed order (deterministic, no atomics).

Forward and input gradient split K where the output tiles leave SMs idle (``gemm.underfilled_splits``). Every
conv operand is K-contiguous, so a thread's row of A and column of B are decomposed once before the K loop. PTX
facts and the measurements behind the split counts: NOTES.md.
"""

from __future__ import annotations

import numpy as np

from gpunn import device
from gpunn.nn import functional as F

from ..common import epilogue_args, shape
from ..gemm import (
    VERSIONS,
    auto_splits,
    conv_problem,
    gemm_split_k,
    multiprocessors,
    output_tiles,
    underfilled_splits,
)
from ..gemm.skinny import SK_KC, SK_N
from ..launch import Launch, LaunchGroup, check_device_array, flat

__all__ = [
    "GEMM_VERSIONS",
    "WGRAD_SPLIT_WAVES",
    "conv_backward_data_implicit_gemm",
    "conv_backward_weight_implicit_gemm",
    "conv_forward_implicit_gemm",
    "default_version",
    "forward_gemm",
]

GEMM_VERSIONS = tuple(v for v, spec in VERSIONS.items() if not spec.maps)  # those that run every mapping
WGRAD_SPLIT_WAVES = 4  # the weight gradient's automatic split count: blocks per SM


# ---------------------------------------------------------------------------------------------------------
# Checks


def _activation(op, name, x):
    """A C-contiguous float32 4-D device array (the mappings address it as a flat buffer)."""
    check_device_array(op, name, x, 4)
    if not x.is_c_contiguous():
        raise ValueError(f"{op}: {name} must be C-contiguous (NCHW), got a strided view of shape {shape(x)}")
    if x.size >= 2**31:
        raise ValueError(f"{op}: {name} has {x.size} elements; flat offsets must fit in 31 bits")
    return x


def _geometry(op, x_shape, w, padding, wname="w"):
    """(k, OH, OW) of a stride-1 convolution of an input of x_shape by w; ValueError naming the shapes."""
    check_device_array(op, wname, w, 4)
    cout, cin, kh, kw = shape(w)
    if kh != kw:
        raise ValueError(f"{op}: kernel must be square, {wname} has shape {shape(w)} (Cout, Cin, k, k)")
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"{op}: padding must be a non-negative int, got {padding!r}")
    n, c, h, wd = x_shape
    if c != cin:
        raise ValueError(f"{op}: channels differ: input {x_shape} (N, Cin, H, W) has {c}, {wname} {shape(w)} "
                         f"(Cout, Cin, k, k) has {cin}")
    oh, ow = F.conv2d_output_size(h, kh, int(padding)), F.conv2d_output_size(wd, kh, int(padding))
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: input {h}x{wd} with padding {padding} is smaller than the {kh}x{kh} kernel")
    return kh, oh, ow


def _expect(op, name, x, want):
    if shape(x) != tuple(want):
        raise ValueError(f"{op}: {name} must have shape {tuple(want)}, got {shape(x)}")


SKINNY_MAX_N_ONE_CHUNK = 4 * SK_N  # skinny also where K fits one chunk and N is at most this


def default_version(m: int, n: int, k: int) -> str:
    """The skinny version for N <= 4 (1-3 channels on the output side of the GEMM), and for N <= 16 where K
    fits one of its chunks (a first layer's forward: the tiles would be mostly K padding; timings: NOTES.md);
    else the 128x128 tiles where both GEMM sides fill them (coalesced128: regblock128's bits, its loads and warp
    layout faster at the autoencoder's shapes, NOTES.md), else the 64x64 ones (less work thrown away)."""
    if n <= SK_N or (k <= SK_KC and n <= SKINNY_MAX_N_ONE_CHUNK):
        return "skinny"
    return "coalesced128" if min(m, n) >= VERSIONS["coalesced128"].tile[0] else "regblock"


def _version(op, version, m, n, k):
    if version is None:
        return default_version(m, n, k)
    if version not in GEMM_VERSIONS:
        raise ValueError(f"{op}: unknown version {version!r}; choose from {GEMM_VERSIONS}")
    return version


# ---------------------------------------------------------------------------------------------------------
# Launchers


def _splits(op, splits, version, problem) -> int:
    """Split-K count of a forward / backward-data launch: as asked, or (None) enough to fill the GPU when the
    output tiles do not (``gemm.underfilled_splits``: small feature maps)."""
    return underfilled_splits(version, problem) if splits is None else splits


def conv_forward_implicit_gemm(x, w, bias, out, padding, relu=False, version=None, block=None, stream=0,
                               launch=True, splits=None) -> Launch | LaunchGroup:
    """out = conv(x, w) (+ bias) (ReLU): x (N, Cin, H, W), w (Cout, Cin, k, k), bias (Cout,) or None,
    out (N, Cout, OH, OW). ``splits``: split-K count (None: by shape, see ``_splits``); with more than one the
    bias and ReLU are applied by the fixed-order sum of the partials."""
    return forward_gemm("conv_forward_implicit_gemm", x, w, bias, out, padding, relu, version, block, stream,
                        launch, splits, "im2col", shape(x))


def forward_checks(op, x, w, bias, out, padding, seen_shape) -> tuple:
    """(k, OH, OW) of a conv forward reading x as an input of `seen_shape`, its arrays checked (one ValueError
    line naming the argument)."""
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, seen_shape, w, padding)
    _activation(op, "out", out)
    _expect(op, "out", out, (shape(x)[0], int(w.shape[0]), oh, ow))
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (int(w.shape[0]),))
    return k, oh, ow


def forward_gemm(op, x, w, bias, out, padding, relu, version, block, stream, launch, splits, a_map,
                 seen_shape) -> Launch | LaunchGroup:
    """The forward GEMM of a conv whose input, of `seen_shape` (N, Cin, H', W'), is read from x through the A
    mapping `a_map` (``im2col``: x itself; ``im2col_up2``: its 2x upsample, ``conv.upsampled``)."""
    k, oh, ow = forward_checks(op, x, w, bias, out, padding, seen_shape)
    n, cin, h, wd = shape(x)
    cout = int(w.shape[0])
    epilogue, aux = epilogue_args(op, bias, relu, None)
    problem = conv_problem(n * oh * ow, cout, cin * k * k, (cin, h, wd), (oh, ow), padding, cout)
    version = _version(op, version, problem.m, problem.n, problem.k)
    return gemm_split_k(version, problem, flat(x), w, flat(out), aux, epilogue, a_map=a_map,
                        b_map="weight_t", store="nchw", ksize=k, splits=_splits(op, splits, version, problem),
                        block=block, stream=stream, launch=launch, op=op,
                        name=f"{op}[{version},k{k},p{padding},{epilogue}]")


def conv_backward_data_implicit_gemm(dy, w, dx, padding, relu_mask=None, version=None, block=None,
                                     stream=0, launch=True, splits=None) -> Launch | LaunchGroup:
    """dx = dL/dx of out = conv(x, w): dy (N, Cout, OH, OW), w (Cout, Cin, k, k), dx (N, Cin, H, W);
    dx = 0 where ``relu_mask`` (dx's shape) <= 0. ``splits`` as in ``conv_forward_implicit_gemm``."""
    op = "conv_backward_data_implicit_gemm"
    _activation(op, "dy", dy)
    _activation(op, "dx", dx)
    k, oh, ow = _geometry(op, shape(dx), w, padding)
    n, cin, h, wd = shape(dx)
    cout = int(w.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, shape(dx))
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    # dx[n, ci, h, w] = sum dy[n, co, h + kh - (k-1-p), w + kw - (k-1-p)] * w[co, ci, k-1-kh, k-1-kw]
    problem = conv_problem(n * h * wd, cin, cout * k * k, (cout, oh, ow), (h, wd), k - 1 - padding, cin)
    version = _version(op, version, problem.m, problem.n, problem.k)
    return gemm_split_k(version, problem, flat(dy), w, flat(dx), aux, epilogue, a_map="im2col",
                        b_map="weight_flip_t", store="nchw", ksize=k, splits=_splits(op, splits, version, problem),
                        block=block, stream=stream, launch=launch, op=op,
                        name=f"{op}[{version},k{k},p{padding},{epilogue}]")


def conv_backward_weight_implicit_gemm(x, dy, dw, padding, version=None, block=None, stream=0, launch=True,
                                       splits=None) -> Launch | LaunchGroup:
    """dw = dL/dw of out = conv(x, w) (overwritten): x (N, Cin, H, W), dy (N, Cout, OH, OW),
    dw (Cout, Cin, k, k) (any strides). Split-K over the pixels (``gemm.gemm_split_k``): ``splits=None``
    picks the count for this device, ``splits=1`` is the single launch; more return a ``LaunchGroup``
    (partial sums, then their fixed-order sum into dw) holding its scratch buffer."""
    op = "conv_backward_weight_implicit_gemm"
    _activation(op, "x", x)
    _activation(op, "dy", dy)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    n, cin, h, wd = shape(x)
    cout = int(dw.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    _, aux = epilogue_args(op, None, False, None)
    problem = conv_problem(cout, cin * k * k, n * oh * ow, (cin, h, wd), (oh, ow), padding, cout)
    version = _version(op, version, problem.m, problem.n, problem.k)
    if splits is None and not device.simulator_enabled():
        # few tiles and a long K: more splits than the dense default's 2 blocks per SM (measurements: NOTES.md)
        splits = auto_splits(problem.k, output_tiles(version, problem.m, problem.n), multiprocessors(),
                             waves=WGRAD_SPLIT_WAVES)
    return gemm_split_k(version, problem, flat(dy), flat(x), dw, aux, "none", a_map="channels",
                        b_map="im2col_k", store="weight4", ksize=k, splits=splits, block=block, stream=stream,
                        launch=launch, op=op, name=f"{op}[{version},k{k},p{padding}]")

