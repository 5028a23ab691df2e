"""Implicit-im2col convolution (conv v3): stride-1 convolutions as GEMMs of ``gemm.py``, the im2col matrix
never materialised.

NCHW float32, weight w (Cout, Cin, k, k) (any strides: a reshaped view of a flat parameter buffer, a slice),
zero padding p >= 0, square kernels of any size k. Activations, outputs and masks are C-contiguous device
arrays (the mappings address them as flat buffers with uint32 offsets). Each op is one GEMM whose operands
are the compile-time mappings of ``gemm`` (``A_MAPS``, ``B_MAPS``, ``STORES``), run by any GEMM version
(``version=``, one of ``GEMM_VERSIONS``; default ``default_version(M, N, K)``: ``skinny`` for N <= 4, e.g. the
forward of a convolution to 3 channels and the input gradient of one on a 1- or 3-channel image, and for
N <= 16 where K fits one 32-wide chunk, e.g. the forward of a 1->16 first layer):

* ``conv_forward_v3``: out (N, Cout, OH, OW) = conv(x) (+ bias) (ReLU). M = N*OH*OW, N = Cout,
  K = Cin*k*k; A = im2col(x) (``im2col``), B[(ci, kh, kw), co] = w[co, ci, kh, kw] (``weight_t``), NCHW
  store (``nchw``); bias and ReLU in the epilogue.
* ``conv_backward_data_v3``: dx (N, Cin, H, W) = full correlation of dy with the spatially flipped kernel,
  channels swapped: A = im2col(dy) with padding k-1-p, B[(co, kh, kw), ci] = w[co, ci, k-1-kh, k-1-kw]
  (``weight_flip_t``), NCHW store; ``relu_mask`` (dx's shape) fuses the previous layer's ReLU backward
  (dx = 0 where mask <= 0; epilogue ``mask``).
* ``conv_backward_weight_v3``: dw (Cout, Cin, k, k) = sum over (n, oh, ow) of dy[n, co, oh, ow] *
  x[n, ci, oh+kh-p, ow+kw-p]; M = Cout, N = Cin*k*k, K = N*OH*OW; A[co, (n, oh, ow)] = dy (``channels``),
  B = im2col(x) in the K-rows role (``im2col_k``), store into dw (``weight4``). dw is overwritten.
  M and N are small (Cout; 9 .. 2304) and K huge (16 384 .. 65 536 at batch 64): a handful of output tiles,
  so K is split (``gemm.gemm_split_k``, ``splits=``): chunks of K on grid z write partial (Cout, Cin*k*k)
  tiles into a scratch buffer held by the bound launch, a second launch sums them in a fixed order into dw
  (deterministic, no atomics). ``splits=None`` fills about 2 blocks per SM with >= 256 pixels per split
  (``gemm.auto_splits``; ``gemm.SIMULATOR_SPLITS`` under the simulator); ``splits=1`` is the single launch.

Index work, hoisted where the tiling allows (see gemm.py): every conv operand is K-contiguous, so a
thread's row of A and column of B are fixed through the K loop and decomposed once before it: a pixel
index (n, oh, ow) by two multiply-high divisions (magic numbers computed on the host, ``conv_problem``), a
patch index (c, kh, kw) by divisions by the compile-time k*k and k. Inside the K loop each loaded element
decomposes its K index: a patch index in forward / backward data (constant divisors), a pixel index in
backward weight (two multiply-highs each).

PTX / ptxas facts, k = 3 (NVVM + ptxas 13.0, compile_ptx(cc=(9, 0)) without a GPU, as in gemm.py's table;
per K step = static K loop + 3 more trips of the inner loop): every kernel 0 spills, 0 ld/st.local, 0
div/rem instructions, and the inner loop is the dense GEMM's (v4 141 instructions per 2 k: 128 fma, 8
ld.shared.v4; v3 41: 32 fma, 4 ld.shared.v4).

  kernel                          regs    per K step            extra index work in the K loop
  v4 forward (w C / 'A' layout)   123/128 759 / 755, 67% fma    the patch (c, kh, kw) of the 4 K indices A and
                                                                B share, by multiply-high (12 mul.wide.u32 +
                                                                shr); 8 (12) mul.lo.s64: w's runtime strides
  v4 backward data (mask)         123     780, 66% fma          the same, flipped kernel
  v4 backward weight              123     791, 65% fma          the pixel (n, oh, ow) of the 4 shared K indices:
                                                                8 mul.wide.u32 multiply-highs, 5 mul.lo.s64
  v3 forward / bwd data / bwd w   55/55/40 261-280, 46-49% fma  (dense v3: 207-212, 60-62%)

Split-K backward weight (the split kernels; see gemm.py's split-K section): v4 127 registers, K loop 371
static instructions (368 single), 8 mul.lo.s64 (5); v3 55 registers (40), 159 (157); inner loops unchanged.

``OPS`` names the three ops; ``conv_*_reference`` are the float64 NumPy references
(``gpunn.nn.functional.conv2d_forward`` / ``conv2d_backward`` in float64).
"""

from __future__ import annotations

import numpy as np

from gpunn import device
from gpunn.nn import functional as F

from . import gemm as G
from .launch import Launch, LaunchGroup, flat

__all__ = [
    "GEMM_VERSIONS",
    "OPS",
    "conv_backward_data_reference",
    "conv_backward_data_v3",
    "conv_backward_weight_reference",
    "conv_backward_weight_v3",
    "conv_forward_reference",
    "conv_forward_v3",
    "default_version",
]

GEMM_VERSIONS = G.MAPPED_VERSIONS  # every GEMM version runs every mapping


# ---------------------------------------------------------------------------------------------------------
# CPU references (float64)


def conv_forward_reference(x, w, bias=None, padding=0, relu=False):
    """conv(x) (+ bias) (ReLU) in float64 (host arrays)."""
    w64 = np.asarray(w, np.float64)
    b64 = np.zeros(w64.shape[0]) if bias is None else np.asarray(bias, np.float64)
    y, _ = F.conv2d_forward(np.asarray(x, np.float64), w64, b64, padding)
    return np.maximum(y, 0.0) if relu else y


def conv_backward_data_reference(dy, w, x_shape, padding=0, relu_mask=None):
    """dL/dx of the convolution (dx = 0 where ``relu_mask`` <= 0) in float64; dx does not depend on x."""
    w64 = np.asarray(w, np.float64)
    _, cache = F.conv2d_forward(np.zeros(x_shape), w64, np.zeros(w64.shape[0]), padding)
    dx, _, _ = F.conv2d_backward(np.asarray(dy, np.float64), cache)
    return dx if relu_mask is None else np.where(np.asarray(relu_mask) > 0, dx, 0.0)


def conv_backward_weight_reference(x, dy, ksize, padding=0):
    """dL/dw of the convolution in float64; dw does not depend on w."""
    x64 = np.asarray(x, np.float64)
    cout = np.shape(dy)[1]
    w0 = np.zeros((cout, x64.shape[1], ksize, ksize))
    _, cache = F.conv2d_forward(x64, w0, np.zeros(cout), padding)
    _, dw, _ = F.conv2d_backward(np.asarray(dy, np.float64), cache)
    return dw


# ---------------------------------------------------------------------------------------------------------
# Checks


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _activation(op, name, x):
    """A C-contiguous float32 4-D device array (the mappings address it as a flat buffer)."""
    G.check_operand(op, name, x, 4)
    if not x.is_c_contiguous():
        raise ValueError(f"{op}: {name} must be C-contiguous (NCHW), got a strided view of shape {_shape(x)}")
    if x.size >= 2**31:
        raise ValueError(f"{op}: {name} has {x.size} elements; flat offsets must fit in 31 bits")
    return x


def _geometry(op, x_shape, w, padding, wname="w"):
    """(k, OH, OW) of a stride-1 convolution of an input of x_shape by w; ValueError naming the shapes."""
    G.check_operand(op, wname, w, 4)
    cout, cin, kh, kw = _shape(w)
    if kh != kw:
        raise ValueError(f"{op}: kernel must be square, {wname} has shape {_shape(w)} (Cout, Cin, k, k)")
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"{op}: padding must be a non-negative int, got {padding!r}")
    n, c, h, wd = x_shape
    if c != cin:
        raise ValueError(f"{op}: channels differ: input {x_shape} (N, Cin, H, W) has {c}, {wname} {_shape(w)} "
                         f"(Cout, Cin, k, k) has {cin}")
    oh, ow = F.conv2d_output_size(h, kh, int(padding)), F.conv2d_output_size(wd, kh, int(padding))
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: input {h}x{wd} with padding {padding} is smaller than the {kh}x{kh} kernel")
    return kh, oh, ow


def _expect(op, name, x, shape):
    if _shape(x) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {_shape(x)}")


SKINNY_MAX_N_ONE_CHUNK = 4 * G.SK_N  # skinny also where K fits one chunk and N is at most this (see below)


def default_version(m: int, n: int, k: int) -> str:
    """The skinny version for N <= 4 (1-3 channels on the output side of the GEMM), and for N <= 16 where K
    fits one of its chunks (a first layer's forward: the tiles would be mostly K padding; H100, 1->16 at
    28x28, batch 64, K = 9: skinny 0.0092 ms, 64x64 tiles 0.0139, 128x128 0.0186, direct v1 0.0142); else
    the 128x128 tiles where both GEMM sides fill them, else the 64x64 ones (less work thrown away)."""
    if n <= G.SK_N or (k <= G.SK_KC and n <= SKINNY_MAX_N_ONE_CHUNK):
        return "skinny"
    return "regblock128" if min(m, n) >= G.BM4 else "regblock"


def _version(op, version, m, n, k):
    if version is None:
        return default_version(m, n, k)
    if version not in GEMM_VERSIONS:
        raise ValueError(f"{op}: unknown version {version!r}; choose from {GEMM_VERSIONS}")
    return version


# ---------------------------------------------------------------------------------------------------------
# Launchers


def _splits(op, splits, variant, problem) -> int:
    """Split-K count of a forward / backward-data launch: as asked, or (None) enough to fill the GPU when the
    output tiles do not (``gemm.underfilled_splits``: small feature maps)."""
    return G.underfilled_splits(variant, problem) if splits is None else splits


def conv_forward_v3(x, w, bias, out, padding, relu=False, version=None, block=None, stream=0,
                    launch=True, splits=None) -> Launch | LaunchGroup:
    """out = conv(x, w) (+ bias) (ReLU): x (N, Cin, H, W), w (Cout, Cin, k, k), bias (Cout,) or None,
    out (N, Cout, OH, OW). ``splits``: split-K count (None: by shape, see ``_splits``); with more than one the
    bias and ReLU are applied by the fixed-order sum of the partials."""
    op = "conv_forward_v3"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, _shape(x), w, padding)
    n, cin, h, wd = _shape(x)
    cout = int(w.shape[0])
    _activation(op, "out", out)
    _expect(op, "out", out, (n, cout, oh, ow))
    if bias is not None:
        G.check_operand(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    epilogue, aux = G.epilogue_args(op, bias, relu, None)
    problem = G.conv_problem(n * oh * ow, cout, cin * k * k, (cin, h, wd), (oh, ow), padding, cout)
    variant = _version(op, version, problem.m, problem.n, problem.k)
    return G.gemm_split_k(variant, problem, flat(x), w, flat(out), aux, epilogue, a_map="im2col",
                          b_map="weight_t", store="nchw", ksize=k, splits=_splits(op, splits, variant, problem),
                          block=block, stream=stream, launch=launch, op=op,
                          name=f"{op}[{variant},k{k},p{padding},{epilogue}]")


def conv_backward_data_v3(dy, w, dx, padding, relu_mask=None, version=None, block=None, stream=0,
                          launch=True, splits=None) -> Launch | LaunchGroup:
    """dx = dL/dx of out = conv(x, w): dy (N, Cout, OH, OW), w (Cout, Cin, k, k), dx (N, Cin, H, W);
    dx = 0 where ``relu_mask`` (dx's shape) <= 0. ``splits`` as in ``conv_forward_v3``."""
    op = "conv_backward_data_v3"
    _activation(op, "dy", dy)
    _activation(op, "dx", dx)
    k, oh, ow = _geometry(op, _shape(dx), w, padding)
    n, cin, h, wd = _shape(dx)
    cout = int(w.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    if relu_mask is not None:
        _activation(op, "relu_mask", relu_mask)
        _expect(op, "relu_mask", relu_mask, _shape(dx))
    epilogue, aux = G.epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    # dx[n, ci, h, w] = sum dy[n, co, h + kh - (k-1-p), w + kw - (k-1-p)] * w[co, ci, k-1-kh, k-1-kw]
    problem = G.conv_problem(n * h * wd, cin, cout * k * k, (cout, oh, ow), (h, wd), k - 1 - padding, cin)
    variant = _version(op, version, problem.m, problem.n, problem.k)
    return G.gemm_split_k(variant, problem, flat(dy), w, flat(dx), aux, epilogue, a_map="im2col",
                          b_map="weight_flip_t", store="nchw", ksize=k, splits=_splits(op, splits, variant, problem),
                          block=block, stream=stream, launch=launch, op=op,
                          name=f"{op}[{variant},k{k},p{padding},{epilogue}]")


def conv_backward_weight_v3(x, dy, dw, padding, version=None, block=None, stream=0, launch=True,
                            splits=None) -> Launch | LaunchGroup:
    """dw = dL/dw of out = conv(x, w) (overwritten): x (N, Cin, H, W), dy (N, Cout, OH, OW),
    dw (Cout, Cin, k, k) (any strides). Split-K over the pixels (``gemm.gemm_split_k``): ``splits=None``
    picks the count for this device, ``splits=1`` is the single launch; more return a ``LaunchGroup``
    (partial sums, then their fixed-order sum into dw) holding its scratch buffer."""
    op = "conv_backward_weight_v3"
    _activation(op, "x", x)
    _activation(op, "dy", dy)
    k, oh, ow = _geometry(op, _shape(x), dw, padding, "dw")
    n, cin, h, wd = _shape(x)
    cout = int(dw.shape[0])
    _expect(op, "dy", dy, (n, cout, oh, ow))
    _, aux = G.epilogue_args(op, None, False, None)
    problem = G.conv_problem(cout, cin * k * k, n * oh * ow, (cin, h, wd), (oh, ow), padding, cout)
    variant = _version(op, version, problem.m, problem.n, problem.k)
    if splits is None and not device.simulator_enabled():
        # the weight gradient's output (Cout x Cin*k*k) has few tiles and a long K: more splits than the dense
        # default's 2 blocks per SM. H100, batch 64, medians of two runs that agreed to 1 %: 18 tiles of 128x128
        # over K = 16 384 (the autoencoder's 256 <-> 128 at 16x16): 15 splits (2 per SM) 0.469 ms, 20 0.465,
        # 22 (3 per SM) 0.430, 24 0.396, 28 0.349, 88 0.403, 132 0.429; 3 tiles of 64x64 over K = 36 864 (the
        # CNN's 16 -> 32 at 26x26): 88 splits (2 per SM) 0.063 ms, 132 (3 per SM) 0.057, 28 0.139
        splits = G.auto_splits(problem.k, G.output_tiles(variant, problem.m, problem.n), G.multiprocessors(),
                               waves=G.WGRAD_SPLIT_WAVES)
    return G.gemm_split_k(variant, problem, flat(dy), flat(x), dw, aux, "none", a_map="channels",
                          b_map="im2col_k", store="weight4", ksize=k, splits=splits, block=block, stream=stream,
                          launch=launch, op=op, name=f"{op}[{variant},k{k},p{padding}]")


OPS = {"forward": conv_forward_v3, "backward_data": conv_backward_data_v3,
       "backward_weight": conv_backward_weight_v3}
