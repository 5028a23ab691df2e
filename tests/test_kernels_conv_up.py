"""Convolutions on a 2x nearest-upsampled input read through the upsample (kernels/conv/upsampled.py, the mappings
of kernels/gemm/mappings_up.py) against float64 references composed of the plain conv and upsample references.

Under the simulator the shapes are tiny and odd (batch 3, 3 -> 5 channels, 5x7 maps before the upsample), kernel
sizes 3 and 1 with paddings 0, 1 (and 2 > k - 1); outputs poisoned with NaN, fresh random inputs per test. The
``gpu``-marked test runs the autoencoder decoder's shapes on a real GPU, every GEMM version. The phase weight
gradient (kernels/conv/phase_up.py) on the same tiny shapes with small blocks and channel groups.
"""

import os
import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import conv as C
from gpunn.kernels import pool
from gpunn.kernels.conv import phase_up as PH
from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import upsampled as U
from gpunn.kernels.launch import Launch, LaunchGroup

TOL = 1e-5
SHAPE = (3, 3, 5, 5, 7)  # N, Cin, Cout, H, W (before the upsample: 10x14 after it)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return a


def _mask(rng, *shape):
    """Looks like a ReLU output: about half zeros."""
    return np.maximum(rng.standard_normal(shape), 0).astype(np.float32)


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, dtype=np.float32))


def _rel_err(got, ref):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _out_hw(h, w, k, p):
    """The conv's output size on the upsampled (2h, 2w) input."""
    return 2 * h + 2 * p - k + 1, 2 * w + 2 * p - k + 1


def _forward(version, k, p, shape=SHAPE, bias=True, relu=True, splits=None):
    n, cin, cout, h, wd = shape
    rng = _rng("fwd-up", version, k, p, shape, bias, relu, splits)
    x, w = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, k, k)
    b = _rand(rng, cout) if bias else None
    out = _nan((n, cout, *_out_hw(h, wd, k, p)))
    launch = U.conv_forward_implicit_gemm_up(cuda.to_device(x), cuda.to_device(w),
                                             None if b is None else cuda.to_device(b), out, p, relu=relu,
                                             version=version, splits=splits)
    # splits=None: the automatic count, one launch or a group depending on the device and shape
    assert isinstance(launch, (Launch, LaunchGroup) if splits is None else Launch if splits == 1 else LaunchGroup)
    return _rel_err(out.copy_to_host(), U.conv_forward_up_ref(x, w, b, p, relu))


def _backward_data(version, k, p, shape=SHAPE, mask=True, splits=None):
    n, cin, cout, h, wd = shape
    rng = _rng("bwd-data-up", version, k, p, shape, mask, splits)
    dy, w = _rand(rng, n, cout, *_out_hw(h, wd, k, p)), _rand(rng, cout, cin, k, k)
    relu_mask = _mask(rng, n, cin, h, wd) if mask else None
    dx = _nan((n, cin, h, wd))
    U.conv_backward_data_implicit_gemm_up(cuda.to_device(dy), cuda.to_device(w), dx, p,
                                          relu_mask=None if relu_mask is None else cuda.to_device(relu_mask),
                                          version=version, splits=splits)
    got = dx.copy_to_host()
    if mask:
        assert np.all(got[relu_mask <= 0] == 0.0)
    return _rel_err(got, U.conv_backward_data_up_ref(dy, w, (n, cin, h, wd), p, relu_mask))


def _backward_weight(version, k, p, shape=SHAPE, splits=None, staged=False, phase=None):
    """phase: (block, group) of the phase version, {} for its defaults."""
    n, cin, cout, h, wd = shape
    rng = _rng("bwd-weight-up", version, k, p, shape, splits, staged, phase)
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, *_out_hw(h, wd, k, p))
    dw = _nan((cout, cin, k, k))
    if phase is not None:
        group = PH.conv_backward_weight_phase_up(cuda.to_device(x), cuda.to_device(dy), dw, p, splits=splits,
                                                 **dict(zip(("block", "group"), phase)))
        assert isinstance(group, LaunchGroup)
    elif staged:
        U.conv_backward_weight_staged_up(cuda.to_device(x), cuda.to_device(dy), dw, p, block=32, splits=splits)
    else:
        U.conv_backward_weight_implicit_gemm_up(cuda.to_device(x), cuda.to_device(dy), dw, p, version=version,
                                                splits=splits)
    return _rel_err(dw.copy_to_host(), U.conv_backward_weight_up_ref(x, dy, k, p))


# --------------------------------------------------------------------------------------------- references
def test_references_compose_the_plain_ones():
    """The up references equal the plain references on an explicitly upsampled input, and the backward-data
    reference is the plain one at the upsampled size followed by the 2x2 block sums: checked against direct sums
    of the definition at one point each."""
    rng = _rng("refs")
    n, cin, cout, h, wd, k, p = 2, 2, 3, 3, 4, 3, 1
    x, w = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, k, k)
    u = np.repeat(np.repeat(x.astype(np.float64), 2, axis=2), 2, axis=3)
    assert np.array_equal(pool.upsample2x_forward_ref(x), u)
    y = U.conv_forward_up_ref(x, w, None, p)
    up = np.pad(u, ((0, 0), (0, 0), (p, p), (p, p)))
    assert y[1, 2, 3, 5] == pytest.approx(float(np.sum(up[1, :, 3:3 + k, 5:5 + k] * w[2])), rel=1e-12)
    dy = _rand(rng, n, cout, *_out_hw(h, wd, k, p))
    dx = U.conv_backward_data_up_ref(dy, w, x.shape, p)
    # dx[n, c, i, j] = d/dx of sum(dy * conv(up(x))): finite difference of the (linear) map, exact in float64
    e = np.zeros_like(x, dtype=np.float64)
    e[1, 1, 2, 3] = 1.0
    assert dx[1, 1, 2, 3] == pytest.approx(float(np.sum(dy * U.conv_forward_up_ref(e, w, None, p))), rel=1e-12)
    dw = U.conv_backward_weight_up_ref(x, dy, k, p)
    assert np.allclose(dw, R.conv_backward_weight_ref(u, dy, k, p), rtol=1e-12)


# --------------------------------------------------------------------------------------------- correctness
CASES = [("regblock", 3, 1), ("regblock", 3, 0), ("tiled16", 1, 0), ("tiled16", 1, 1), ("naive", 3, 2)]
IDS = [f"{v}-k{k}-p{p}" for v, k, p in CASES]


@pytest.mark.parametrize("version,k,p", CASES, ids=IDS)
def test_forward(version, k, p):
    assert _forward(version, k, p, relu=bool(p % 2)) < TOL


@pytest.mark.parametrize("version,k,p", CASES, ids=IDS)
def test_backward_data(version, k, p):
    """The stride-2 GEMM with the summed kernel, the ReLU mask fused at padding 1; p = 2 > k - 1: the GEMM's
    padding k - 1 - p is negative."""
    assert _backward_data(version, k, p, mask=p == 1) < TOL


@pytest.mark.parametrize("version,k,p", CASES, ids=IDS)
def test_backward_weight(version, k, p):
    assert _backward_weight(version, k, p, splits=2 if version == "regblock" else 1) < TOL


def test_skinny_all_three_ops():
    """N <= 4: the skinny version (the decoder's last conv, 256 -> 3 on the upsampled map); 5 -> 3 channels and
    back (the backward-data GEMM's N = Cin = 3), split K in the forward."""
    shape = (3, 5, 3, 5, 7)
    assert _forward("skinny", 3, 1, shape=shape, splits=2) < TOL
    assert _backward_data("skinny", 3, 1, shape=(3, 3, 5, 5, 7)) < TOL
    assert _backward_weight("skinny", 3, 1, shape=(3, 3, 2, 5, 7), splits=1) < TOL


@pytest.mark.parametrize("version", ["regblock128", "coalesced128"])
def test_128x128_tiles_all_three_ops(version):
    shape = (2, 3, 5, 3, 5)
    assert _forward(version, 3, 1, shape=shape) < TOL
    assert _backward_data(version, 3, 1, shape=shape) < TOL
    assert _backward_weight(version, 3, 1, shape=shape, splits=1) < TOL


@pytest.mark.parametrize("cin,cout,p", [(5, 2, 1), (2, 3, 0)])
def test_staged_weight_gradient(cin, cout, p):
    """The staged version staging the upsampled planes from x: a narrow output (5 -> 2) and a narrow input."""
    assert _backward_weight(None, 3, p, shape=(3, cin, cout, 5, 7), splits=2, staged=True) < TOL


# N, Cin, Cout, H, W; (block, group); splits: Cin 5 not a multiple of the group (a last group of 1 or 2 channels);
# lanes (block // group) above H (idle threads) and below it (threads walking two rows)
PHASE_CASES = [((3, 5, 3, 3, 5), (8, 2), 2), ((3, 5, 1, 3, 5), (4, 2), 1), ((4, 5, 4, 2, 3), (6, 3), 3),
               ((2, 2, 2, 4, 1), (2, 1), None)]


@pytest.mark.parametrize("shape,phase,splits", PHASE_CASES, ids=[f"cout{c[0][2]}-s{c[2]}" for c in PHASE_CASES])
def test_phase_weight_gradient(shape, phase, splits):
    """The phase decomposition on the small grid, every dw element written (poisoned with NaN before)."""
    assert _backward_weight(None, 3, 1, shape=shape, splits=splits, phase=phase) < TOL


def test_phase_weight_gradient_reruns_bit_for_bit():
    n, cin, cout, h, wd = 5, 3, 2, 3, 4
    rng = _rng("phase-det")
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, 2 * h, 2 * wd)
    dw = _nan((cout, cin, 3, 3))
    group = PH.conv_backward_weight_phase_up(cuda.to_device(x), cuda.to_device(dy), dw, 1, block=4, group=2,
                                             splits=3, launch=False)
    group()
    first = dw.copy_to_host()
    assert _rel_err(first, U.conv_backward_weight_up_ref(x, dy, 3, 1)) < TOL
    dw.copy_to_device(np.full(first.shape, np.nan, np.float32))
    group()
    assert dw.copy_to_host().tobytes() == first.tobytes()


def test_phase_fits_and_refusals():
    """phase_fits takes the upsampled (conv input) size, as the other UP_VERSIONS' applies= callbacks."""
    assert PH.phase_fits(256, 3, 3, 1, 32, 32)
    assert not PH.phase_fits(256, 5, 3, 1, 32, 32)  # Cout > 4
    assert not PH.phase_fits(256, 3, 5, 2, 32, 32)
    assert not PH.phase_fits(256, 3, 3, 0, 32, 32)
    assert not PH.phase_fits(256, 3, 3, 1, 31, 32)  # not an upsampled size
    assert not PH.phase_fits(256, 3, 3, 1, 512, 512)  # the group's planes exceed shared memory
    assert C.UP_VERSIONS["backward_weight"]["phase"].launcher is PH.conv_backward_weight_phase_up
    x = cuda.to_device(np.zeros((2, 3, 4, 5), np.float32))
    launch = PH.conv_backward_weight_phase_up
    for dy_c, w_shape, p, match in ((2, (2, 3, 5, 5), 2, "needs k = 3, padding 1"),
                                    (2, (2, 3, 1, 1), 0, "needs k = 3, padding 1"),
                                    (5, (5, 3, 3, 3), 1, "at most 4 output channels")):
        size = _out_hw(4, 5, w_shape[2], p)
        with pytest.raises(ValueError, match=match):
            launch(x, _nan((2, dy_c, *size)), _nan(w_shape), p)
    dy, dw = _nan((2, 2, 8, 10)), _nan((2, 3, 3, 3))
    with pytest.raises(ValueError, match="group must be a positive int dividing block"):
        launch(x, dy, dw, 1, block=8, group=3)
    with pytest.raises(ValueError, match="exceed shared memory"):
        launch(cuda.to_device(np.zeros((1, 1, 60, 60), np.float32)), _nan((1, 2, 120, 120)), _nan((2, 1, 3, 3)), 1,
               block=64, group=4)
    with pytest.raises(ValueError, match="dy must be"):
        launch(x, _nan((2, 2, 4, 5)), dw, 1)


def test_default_versions_and_split_sums_are_deterministic():
    """version None (default_version); a 3-way split-K backward-data group replayed gives the same bits."""
    assert _forward(None, 3, 1) < TOL
    n, cin, cout, h, wd = SHAPE
    rng = _rng("det")
    dy, w = _rand(rng, n, cout, *_out_hw(h, wd, 3, 1)), _rand(rng, cout, cin, 3, 3)
    dx = _nan((n, cin, h, wd))
    group = U.conv_backward_data_implicit_gemm_up(cuda.to_device(dy), cuda.to_device(w), dx, 1, version="regblock",
                                                  splits=3, launch=False)
    assert isinstance(group, LaunchGroup)
    group()
    first = dx.copy_to_host()
    assert _rel_err(first, U.conv_backward_data_up_ref(dy, w, (n, cin, h, wd), 1)) < TOL
    group()
    assert dx.copy_to_host().tobytes() == first.tobytes()


def test_version_tables():
    assert set(C.UP_VERSIONS) == {"forward", "backward_data", "backward_weight"}
    assert C.upsampled_version("forward", "tiled").launcher is U.conv_forward_implicit_gemm_up
    assert C.upsampled_version("backward_data", "implicit_gemm").launcher is U.conv_backward_data_implicit_gemm_up
    assert C.upsampled_version("backward_weight", "staged").launcher is U.conv_backward_weight_staged_up
    assert C.upsampled_version("backward_weight", "deterministic").launcher is U.conv_backward_weight_implicit_gemm_up
    assert C.upsampled_version("bias_grad", "split") is C.VERSIONS["bias_grad"]["split"]


def test_errors():
    x = cuda.to_device(np.zeros((2, 3, 4, 5), np.float32))
    w = cuda.to_device(np.zeros((4, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match="out must have shape"):  # the plain conv's output size (4x5, not 8x10)
        U.conv_forward_implicit_gemm_up(x, w, None, _nan((2, 4, 4, 5)), 1)
    with pytest.raises(ValueError, match="dy must have shape"):
        U.conv_backward_data_implicit_gemm_up(_nan((2, 4, 4, 5)), w, _nan((2, 3, 4, 5)), 1)
    with pytest.raises(ValueError, match="channels differ"):
        U.conv_backward_weight_implicit_gemm_up(cuda.to_device(np.zeros((2, 2, 4, 5), np.float32)),
                                                _nan((2, 4, 8, 10)), _nan((4, 3, 3, 3)), 1)
    with pytest.raises(ValueError, match="narrow side"):
        U.conv_backward_weight_staged_up(cuda.to_device(np.zeros((2, 5, 4, 5), np.float32)), _nan((2, 8, 8, 10)),
                                         _nan((8, 5, 3, 3)), 1)


# --------------------------------------------------------------------------------------------- real GPU
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


# the tensor-core versions (gpu-tf32 / gpu-bf16) read through the upsample as every version does: within 8 units of
# their format's rounding of the exact result (as tests/test_gpu_precision.py's bound) and above TOL (it rounded)
TENSOR_BOUND = {"tensor_tf32": 8 * 2.0**-11, "tensor_bf16": 8 * 2.0**-8}


@pytest.mark.parametrize("op, version", [("forward", "tensor_bf16"), ("backward_data", "tensor_tf32"),
                                         ("backward_weight", "tensor_bf16")])
def test_tensor_core_versions(op, version):
    run = {"forward": _forward, "backward_data": _backward_data, "backward_weight": _backward_weight}[op]
    assert TOL < run(version, 3, 1) < TENSOR_BOUND[version]


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("version", ["tensor_tf32", "tensor_bf16"])
def test_gpu_decoder_shapes_on_the_tensor_cores(version):
    """The decoder's 128 -> 256 conv on its upsampled 8x8 map at batch 8, and an odd case, each pass."""
    for n, cin, cout, h, wd in ((8, 128, 256, 8, 8), (5, 33, 65, 7, 9)):
        for run in (_forward, _backward_data, _backward_weight):
            assert TOL < run(version, 3, 1, shape=(n, cin, cout, h, wd)) < TENSOR_BOUND[version]


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("version", [None, "regblock", "skinny"])
def test_gpu_decoder_shapes(version):
    """The autoencoder decoder's convolutions on upsampled maps at batch 8 (128 -> 256 on 8x8 -> 16x16, 256 -> 3
    on 16x16 -> 32x32) and an odd case, automatic split counts; the staged weight gradient of the 256 -> 3 conv."""
    for n, cin, cout, h, wd, k, p in ((8, 128, 256, 8, 8, 3, 1), (8, 256, 3, 16, 16, 3, 1),
                                      (5, 17, 33, 7, 9, 3, 1), (4, 16, 8, 6, 5, 1, 0)):
        assert _forward(version, k, p, shape=(n, cin, cout, h, wd)) < TOL
        assert _backward_data(version, k, p, shape=(n, cin, cout, h, wd)) < TOL
        assert _backward_weight(version, k, p, shape=(n, cin, cout, h, wd)) < 2 * TOL
    assert _backward_weight(None, 3, 1, shape=(8, 256, 3, 16, 16), staged=True) < 2 * TOL


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
def test_gpu_phase_weight_gradient_decoder_shape():
    """The phase weight gradient of the decoder's last conv (Upsample(2), 256 -> 3 at 16x16 -> 32x32) at batch 64,
    its default block, group and split count, and odd cases (Cin not a multiple of the group, Cout 1 and 4)."""
    assert _backward_weight(None, 3, 1, shape=(64, 256, 3, 16, 16), phase={}) < 2 * TOL
    for shape, phase in (((5, 37, 1, 7, 9), {}), ((9, 20, 4, 16, 16), (128, 8)), ((3, 16, 3, 16, 16), (64, 4))):
        assert _backward_weight(None, 3, 1, shape=shape, phase=phase) < 2 * TOL
