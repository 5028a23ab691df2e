"""Conv + ReLU + 2x2 max pool, version ``direct`` (kernels/conv/direct_pooled.py): the fused forward and the pooled
input gradient against the float64 references of kernels/conv/pooled.py, at odd shapes under the simulator (odd
batch, conv outputs odd in one or both directions so the pool drops a row / column, channel counts that fill no
channel group or chunk, several quad tiles per image), NaN-poisoned outputs; the ``gpu``-marked test repeats the
checks at the CNN's conv2 shape and compares with the GEMM versions."""

import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels.conv import direct_pooled as D
from gpunn.kernels.conv import pooled as P
from gpunn.kernels.conv import reference as R
from gpunn.kernels.gemm.mappings import ROUTE_NONE

TOL = 1e-5
CASES = [  # N, Cin, Cout, H, W, k, padding, tuning: conv outputs 7x8, 9x9, 15x13 (2-3 quad tiles of 32 threads)
    (3, 3, 5, 9, 10, 3, 0, {}),
    (3, 10, 11, 9, 9, 3, 1, {"cic": 4}),
    (1, 2, 3, 17, 15, 3, 1, {"threads": 32}),
    (3, 2, 9, 11, 9, 5, 2, {"cot": 4, "su": 3}),
]


def test_a_wide_first_layer_takes_more_output_channels_a_thread():
    """COT_WIDE output channels a thread for a wide output from a shallow source (the autoencoder's 3 -> 256),
    COT or fewer otherwise (the CNN's 16 -> 32); the launch names the count."""
    assert D._plan(3, 256, 16, 16, 3, 1)[3] == D.COT_WIDE > D.COT
    assert D._plan(16, 32, 12, 12, 3, 0)[3] == D.COT and D._plan(3, 5, 4, 4, 3, 0)[3] == 8
    assert D._plan(64, 256, 16, 16, 3, 1)[3] == D.COT  # a deep source: K = 576
    n, cin, cout, h, w, k, p = 1, 1, D.WIDE_MIN_OUT, 4, 4, 3, 1
    x, wt, b, _, pooled_shape, _ = _problem((n, cin, cout, h, w, k, p, {}), "wide")
    out, route = _nan(pooled_shape), cuda.to_device(np.zeros(pooled_shape, np.int8))
    launch = D.conv_forward_pool_direct(cuda.to_device(x), cuda.to_device(wt), cuda.to_device(b), out, route, p)
    assert f"cot{D.COT_WIDE}," in launch.name
    want = P.conv_relu_pool_forward_ref(x, wt, b, p)[0]
    assert _rel_err(out.copy_to_host(), want) < TOL


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return a


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def _rel_err(got, ref):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _problem(case, *seed):
    n, cin, cout, h, w, k, p, _ = case
    rng = _rng(case[:7], *seed)
    x, wt, b = _rand(rng, n, cin, h, w), _rand(rng, cout, cin, k, k), _rand(rng, cout)
    oh, ow = h + 2 * p - k + 1, w + 2 * p - k + 1
    return x, wt, b, (n, cout, oh, ow), (n, cout, oh // 2, ow // 2), rng


def _forward(x, wt, b, pooled_shape, p, relu=True, **tuning):
    out, route = _nan(pooled_shape), cuda.to_device(np.full(pooled_shape, -7, np.int8))
    D.conv_forward_pool_direct(cuda.to_device(x), cuda.to_device(wt), None if b is None else cuda.to_device(b), out,
                               route, p, relu=relu, **tuning)
    return out.copy_to_host(), route.copy_to_host()


def _check_route(route, ref_route, conv):
    """Routes equal, except where the float32 conv made a near-tie go the other way."""
    for idx in np.argwhere(route != ref_route):
        n, c, i, j = idx
        win = conv[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel()
        a, r = int(route[tuple(idx)]), int(ref_route[tuple(idx)])
        assert a < 4 and r < 4 and abs(win[a] - win[r]) <= TOL * np.abs(conv).max(), (idx, a, r, win)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("relu,bias", [(True, True), (False, False)])
def test_direct_forward_matches_conv_relu_pool(case, relu, bias):
    x, wt, b, _, pooled_shape, _ = _problem(case, "fwd")
    b = b if bias else None
    p = case[6]
    out, route = _forward(x, wt, b, pooled_shape, p, relu, **case[7])
    ref, ref_route = P.conv_relu_pool_forward_ref(x, wt, b, p, relu)
    assert _rel_err(out, ref) < TOL
    assert set(np.unique(route)) <= ({0, 1, 2, 3, ROUTE_NONE} if relu else {0, 1, 2, 3})
    _check_route(route, ref_route, R.conv_forward_ref(x, wt, b, p, relu))
    if relu:
        assert (route == ROUTE_NONE).any() and ((route == ROUTE_NONE) == (out <= 0)).all()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("masked", [True, False])
def test_direct_input_gradient_from_the_pooled_gradient(case, masked):
    x, wt, b, conv_shape, pooled_shape, rng = _problem(case, "dgrad")
    p = case[6]
    _, route = P.conv_relu_pool_forward_ref(x, wt, b, p)
    dpool = _rand(rng, *pooled_shape)
    dy = P.pooled_grad_ref(dpool, route, conv_shape)
    assert (route == ROUTE_NONE).any() and (route != ROUTE_NONE).any()
    mask = np.maximum(rng.standard_normal(x.shape), 0).astype(np.float32) if masked else None
    dx = _nan(x.shape)
    D.conv_backward_data_pool_direct(cuda.to_device(dpool), cuda.to_device(route), cuda.to_device(wt), dx, p,
                                     relu_mask=None if mask is None else cuda.to_device(mask), **case[7])
    got = dx.copy_to_host()
    ref = R.conv_backward_data_ref(dy, wt, x.shape, p, mask)
    assert _rel_err(got, ref) < TOL
    if masked:
        assert (got[mask <= 0] == 0).all()


def test_direct_passes_repeat_bit_for_bit():
    case = CASES[1]
    x, wt, b, conv_shape, pooled_shape, rng = _problem(case, "bits")
    p = case[6]
    runs = []
    for _ in range(2):
        out, route = _forward(x, wt, b, pooled_shape, p, **case[7])
        dx = _nan(x.shape)
        dpool = _rand(_rng("bits-dpool"), *pooled_shape)
        D.conv_backward_data_pool_direct(cuda.to_device(dpool), cuda.to_device(route), cuda.to_device(wt), dx, p,
                                         **case[7])
        runs.append((out, route, dx.copy_to_host()))
    assert all(np.array_equal(a, c) for a, c in zip(*runs))


def test_limits_and_bad_arguments():
    assert D.direct_fits(16, 32, 3, 0, 28 - 2, 28 - 2)  # the CNN's conv2
    assert not D.direct_fits(16, 32, 4, 0, 26, 26)  # even k
    assert not D.direct_fits(16, 32, 9, 4, 26, 26)  # k > MAX_K
    assert not D.direct_fits(16, 32, 3, 2, 26, 26)  # padding > k // 2
    assert not D.direct_fits(16, 32, 3, 0, 26, 4000)  # a band wider than shared memory
    x, wt, b = cuda.to_device(np.zeros((1, 2, 9, 9), np.float32)), _nan((3, 2, 3, 3)), _nan(3)
    out, route = _nan((1, 3, 2, 2)), cuda.to_device(np.zeros((1, 3, 2, 2), np.int8))
    out5, route5 = _nan((1, 3, 5, 5)), cuda.to_device(np.zeros((1, 3, 5, 5), np.int8))
    with pytest.raises(ValueError, match="padding 2 must be between 0 and k // 2"):
        D.conv_forward_pool_direct(x, wt, b, out5, route5, 2)
    with pytest.raises(ValueError, match="out"):
        D.conv_forward_pool_direct(x, wt, b, out, route, 0)  # 7x7 conv -> 3x3 pooled, not 2x2
    dx = _nan((1, 2, 9, 9))
    with pytest.raises(ValueError, match="dpool"):
        D.conv_backward_data_pool_direct(out, route, wt, dx, 0)


@pytest.mark.gpu
def test_cnn_conv2_shape_matches_the_gemm_versions():
    """The CNN's conv2 at batch 64 (16 -> 32, 26x26, k3 p0): both direct passes agree with the references and with
    the GEMM versions (to rounding)."""
    case = (64, 16, 32, 26, 26, 3, 0, {})
    x, wt, b, conv_shape, pooled_shape, rng = _problem(case, "gpu")
    out, route = _forward(x, wt, b, pooled_shape, 0)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, wt, b, 0)
    assert _rel_err(out, ref) < TOL
    _check_route(route, ref_route, R.conv_forward_ref(x, wt, b, 0, True))
    dpool = _rand(rng, *pooled_shape)
    mask = np.maximum(rng.standard_normal(x.shape), 0).astype(np.float32)
    args = [cuda.to_device(a) for a in (dpool, route, wt)]
    dx, dx_gemm = _nan(x.shape), _nan(x.shape)
    D.conv_backward_data_pool_direct(*args, dx, 0, relu_mask=cuda.to_device(mask))
    P.conv_backward_data_pool_implicit_gemm(*args, dx_gemm, 0, relu_mask=cuda.to_device(mask))
    ref = R.conv_backward_data_ref(P.pooled_grad_ref(dpool, route, conv_shape), wt, x.shape, 0, mask)
    assert _rel_err(dx.copy_to_host(), ref) < TOL
    assert _rel_err(dx_gemm.copy_to_host(), ref) < TOL
