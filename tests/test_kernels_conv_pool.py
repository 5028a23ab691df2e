"""Conv + ReLU + 2x2 max pool fused (kernels/conv/pooled.py) and the window GEMM versions (``narrow``, the deep-K
tiles of gemm/deep.py) against the float64 references composed from conv/reference.py and the pool references.

Tiny odd shapes under the simulator (batch 3, 3 -> 5 channels, maps whose conv output is odd in one direction
and even in the other), NaN-poisoned outputs, fresh random inputs per test. The ``gpu``-marked test repeats the
checks at the CNN's and the autoencoder's shapes on a GPU."""

import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import pool
from gpunn.kernels.conv import implicit_gemm as C
from gpunn.kernels.conv import pooled as P
from gpunn.kernels.conv import reference as R
from gpunn.kernels.gemm import conv_problem, gemm_mapped
from gpunn.kernels.gemm.mappings import ROUTE_NONE, WINDOW_VERSIONS

TOL = 1e-5
CASES = [  # N, Cin, Cout, H, W, k, padding: conv outputs 7x8, 9x9 (both odd), 10x10
    (3, 3, 5, 9, 10, 3, 0),
    (3, 2, 5, 9, 9, 3, 1),
    (2, 3, 3, 10, 10, 3, 1),
]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return a


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def _route_nan(shape):
    return cuda.to_device(np.full(shape, -7, np.int8))  # a value no route takes


def _rel_err(got, ref):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _problem(case, *seed):
    n, cin, cout, h, w, k, p = case
    rng = _rng(case, *seed)
    x, wt, b = _rand(rng, n, cin, h, w), _rand(rng, cout, cin, k, k), _rand(rng, cout)
    oh, ow = h + 2 * p - k + 1, w + 2 * p - k + 1
    return x, wt, b, (n, cout, oh, ow), (n, cout, oh // 2, ow // 2), rng


def _forward(x, wt, b, pooled_shape, p, relu=True, version=None):
    out, route = _nan(pooled_shape), _route_nan(pooled_shape)
    P.conv_forward_pool_implicit_gemm(cuda.to_device(x), cuda.to_device(wt), None if b is None else cuda.to_device(b),
                                      out, route, p, relu=relu, version=version)
    return out.copy_to_host(), route.copy_to_host()


def _check_route(route, ref_route, conv, tol):
    """Routes equal, except where the float32 conv made a near-tie go the other way."""
    bad = np.argwhere(route != ref_route)
    for idx in bad:
        n, c, i, j = idx
        win = conv[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel()
        a, r = int(route[tuple(idx)]), int(ref_route[tuple(idx)])
        assert a < 4 and r < 4 and abs(win[a] - win[r]) <= tol * np.abs(conv).max(), (idx, a, r, win)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("relu", [True, False])
def test_fused_forward_matches_conv_relu_pool(case, relu):
    x, wt, b, conv_shape, pooled_shape, _ = _problem(case, "fwd")
    p = case[-1]
    out, route = _forward(x, wt, b, pooled_shape, p, relu)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, wt, b, p, relu)
    assert _rel_err(out, ref) < TOL
    assert set(np.unique(route)) <= ({0, 1, 2, 3, ROUTE_NONE} if relu else {0, 1, 2, 3})
    _check_route(route, ref_route, R.conv_forward_ref(x, wt, b, p, relu), TOL)
    if relu:
        assert ((route == ROUTE_NONE) == (out <= 0)).all()


@pytest.mark.parametrize("version", WINDOW_VERSIONS)
def test_every_window_version_runs_the_fused_forward(version):
    case = CASES[1]  # conv output 9x9: the last row and column belong to no window
    x, wt, b, conv_shape, pooled_shape, _ = _problem(case, "window", version)
    p = case[-1]
    out, route = _forward(x, wt, b, pooled_shape, p, version=version)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, wt, b, p)
    assert _rel_err(out, ref) < TOL
    _check_route(route, ref_route, R.conv_forward_ref(x, wt, b, p, True), TOL)


@pytest.mark.parametrize("version", ["narrow", P.FORWARD_VERSION])
def test_fused_forward_equals_the_unfused_kernels_bit_for_bit(version):
    """The same GEMM version computes the same conv values in either pixel order; pool them separately."""
    case = CASES[0]
    x, wt, b, conv_shape, pooled_shape, _ = _problem(case, "bits")
    p = case[-1]
    out, route = _forward(x, wt, b, pooled_shape, p, version=version)
    xd, wd, bd = cuda.to_device(x), cuda.to_device(wt), cuda.to_device(b)
    conv = _nan(conv_shape)
    C.conv_forward_implicit_gemm(xd, wd, bd, conv, p, relu=True, version=version, splits=1)
    pooled, argmax = _nan(pooled_shape), cuda.to_device(np.zeros(pooled_shape, np.int8))
    pool.maxpool2x2_forward_v1(conv, pooled, argmax)
    pooled, argmax = pooled.copy_to_host(), argmax.copy_to_host()
    assert np.array_equal(out, pooled)
    assert np.array_equal(route, np.where(pooled > 0, argmax, ROUTE_NONE))


def _backward_inputs(case, seed):
    x, wt, b, conv_shape, pooled_shape, rng = _problem(case, seed)
    _, route = P.conv_relu_pool_forward_ref(x, wt, b, case[-1])
    dpool = _rand(rng, *pooled_shape)
    dy = P.pooled_grad_ref(dpool, route, conv_shape)
    assert (dy != 0).any() and (route == ROUTE_NONE).any() and (route != ROUTE_NONE).any()
    return x, wt, dpool, route, dy, rng


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version,splits,masked", [(None, 1, True), ("regblock", 1, False), ("narrow", 2, False),
                                                   ("deep128x32", 1, True), ("deep128x16", 2, False),
                                                   ("deep32x32", 1, False)])
def test_input_gradient_from_the_pooled_gradient(case, version, splits, masked):
    x, wt, dpool, route, dy, rng = _backward_inputs(case, "dgrad")
    p = case[-1]
    mask = np.maximum(rng.standard_normal(x.shape), 0).astype(np.float32) if masked else None
    dx = _nan(x.shape)
    P.conv_backward_data_pool_implicit_gemm(cuda.to_device(dpool), cuda.to_device(route), cuda.to_device(wt), dx,
                                            p, relu_mask=None if mask is None else cuda.to_device(mask),
                                            version=version, splits=splits)
    ref = R.conv_backward_data_ref(dy, wt, x.shape, p, mask)
    assert _rel_err(dx.copy_to_host(), ref) < TOL


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version,splits", [(None, 1), ("narrow", 3), ("regblock", 2), ("deep32x32", 2),
                                            ("deep128x16", 3), ("deep128x32", 1)])
def test_weight_and_bias_gradients_from_the_pooled_gradient(case, version, splits):
    x, wt, dpool, route, dy, _ = _backward_inputs(case, "wgrad")
    p, k = case[-1], case[-2]
    dw = _nan(wt.shape)
    dpool_d, route_d = cuda.to_device(dpool), cuda.to_device(route)
    P.conv_backward_weight_pool_implicit_gemm(cuda.to_device(x), dpool_d, route_d, dw, p, version=version,
                                              splits=splits)
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    db = _nan(wt.shape[0])
    P.conv_bias_grad_pool(dpool_d, route_d, db, block=32, splits=splits)
    assert _rel_err(db.copy_to_host(), R.conv_bias_grad_ref(dy)) < TOL


@pytest.mark.parametrize("pass_name", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("version", WINDOW_VERSIONS)
def test_window_versions_run_the_ordinary_conv_mappings(version, pass_name):
    n, cin, cout, h, w, k, p = 3, 3, 5, 7, 9, 3, 1
    rng = _rng(version, pass_name)
    x, wt, b = _rand(rng, n, cin, h, w), _rand(rng, cout, cin, k, k), _rand(rng, cout)
    dy = _rand(rng, n, cout, h, w)
    if pass_name == "forward":
        out = _nan((n, cout, h, w))
        C.conv_forward_implicit_gemm(cuda.to_device(x), cuda.to_device(wt), cuda.to_device(b), out, p, relu=True,
                                     version=version, splits=1)
        ref = R.conv_forward_ref(x, wt, b, p, relu=True)
    elif pass_name == "backward_data":
        out = _nan(x.shape)
        C.conv_backward_data_implicit_gemm(cuda.to_device(dy), cuda.to_device(wt), out, p, version=version,
                                           splits=1)
        ref = R.conv_backward_data_ref(dy, wt, x.shape, p)
    else:
        out = _nan(wt.shape)
        C.conv_backward_weight_implicit_gemm(cuda.to_device(x), cuda.to_device(dy), out, p, version=version,
                                             splits=2)
        ref = R.conv_backward_weight_ref(x, dy, k, p)
    assert _rel_err(out.copy_to_host(), ref) < TOL


def test_deterministic_backward():
    case = CASES[1]
    x, wt, dpool, route, _, _ = _backward_inputs(case, "bits")
    args = [cuda.to_device(a) for a in (x, dpool, route)]
    results = []
    for _ in range(2):
        dw, db = _nan(wt.shape), _nan(wt.shape[0])
        P.conv_backward_weight_pool_implicit_gemm(*args, dw, case[-1], splits=2)
        P.conv_bias_grad_pool(args[1], args[2], db, block=32)
        results.append((dw.copy_to_host(), db.copy_to_host()))
    assert all(np.array_equal(a, b) for a, b in zip(*results))


def test_bad_arguments_are_refused():
    n, cin, cout, h, w, k, p = CASES[0]
    x = cuda.to_device(np.zeros((n, cin, h, w), np.float32))
    wt = cuda.to_device(np.zeros((cout, cin, k, k), np.float32))
    pooled = (n, cout, 3, 4)
    with pytest.raises(ValueError, match="window epilogue"):
        P.conv_forward_pool_implicit_gemm(x, wt, None, _nan(pooled), _route_nan(pooled), p, version="regblock")
    with pytest.raises(ValueError, match="route must have shape"):
        P.conv_forward_pool_implicit_gemm(x, wt, None, _nan(pooled), _route_nan((n, cout, 3, 3)), p)
    with pytest.raises(ValueError, match="route"):
        P.conv_forward_pool_implicit_gemm(x, wt, None, _nan(pooled), _nan(pooled), p)
    with pytest.raises(ValueError, match="window epilogue"):  # the window store on a version without one
        problem = conv_problem(n * 12 * 4, cout, cin * k * k, (cin, h, w), (3, 4), p, cout)
        gemm_mapped("regblock", problem, x.reshape(x.size), wt, (_nan(36), _route_nan(36)), _nan(1), "relu",
                    a_map="im2col_window", b_map="weight_t", store="pool_nchw", ksize=k)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [(64, 16, 32, 26, 26, 3, 0), (16, 3, 256, 32, 32, 3, 1), (16, 256, 128, 16, 16, 3, 1),
                                  (5, 7, 33, 13, 11, 3, 1)])
def test_real_shapes_on_the_gpu(case):
    x, wt, b, conv_shape, pooled_shape, rng = _problem(case, "gpu")
    p, k = case[-1], case[-2]
    out, route = _forward(x, wt, b, pooled_shape, p)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, wt, b, p)
    assert _rel_err(out, ref) < 1e-4
    _check_route(route, ref_route, R.conv_forward_ref(x, wt, b, p, True), 1e-4)
    dpool = _rand(rng, *pooled_shape)
    dy = P.pooled_grad_ref(dpool, route, conv_shape)
    mask = np.maximum(rng.standard_normal(x.shape), 0).astype(np.float32)
    d = [cuda.to_device(a) for a in (dpool, route, wt, mask, x)]
    dx, dw, db = _nan(x.shape), _nan(wt.shape), _nan(wt.shape[0])
    P.conv_backward_data_pool_implicit_gemm(d[0], d[1], d[2], dx, p, relu_mask=d[3])
    P.conv_backward_weight_pool_implicit_gemm(d[4], d[0], d[1], dw, p)
    P.conv_bias_grad_pool(d[0], d[1], db)
    assert _rel_err(dx.copy_to_host(), R.conv_backward_data_ref(dy, wt, x.shape, p, mask)) < 1e-4
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, k, p)) < 1e-4
    assert _rel_err(db.copy_to_host(), R.conv_bias_grad_ref(dy)) < 1e-4
