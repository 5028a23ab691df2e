"""Winograd F(2x2, 3x3) fused with ReLU and the 2x2 max pool (kernels/conv/winograd_pool.py) against float64
references (conv + bias + ReLU + pool, the conv backward passes on the gradient expanded through the route) and the
routes of the pooled family.

Under the simulator the shapes are tiny (batch 2-3, 5 -> 6 channels, 6x8 maps and an odd 7x9: the conv output's
last row / column belongs to no window); outputs poisoned with NaN. The simulated cost is the batched GEMM's (16
positions x splits blocks), so each case runs few passes. The ``gpu``-marked tests run the autoencoder's conv2.
"""

import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels.conv import pooled as P
from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.conv import winograd_pool as WP
from gpunn.kernels.gemm.mappings import ROUTE_NONE

TOL = 1e-5
BF16_BOUND = 8 * 2.0**-8  # test_kernels_conv_winograd's TENSOR_BOUND["tensor_bf16"]
SHAPES = {"even": (2, 5, 6, 6, 8), "odd": (3, 5, 6, 7, 9)}  # N, Cin, Cout, H, W


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, dtype=np.float32))


def _route_out(shape):
    return cuda.to_device(np.full(shape, -1, dtype=np.int8))


def _rel_err(got, ref):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _pooled_dims(shape, p):
    n, _, cout, h, wd = shape
    oh, ow = h + 2 * p - 2, wd + 2 * p - 2
    return (n, cout, oh, ow), (n, cout, oh // 2, ow // 2)


def _forward(x, w, b, p, relu=True, version=None, storage="fp32", v=None):
    n, cout = x.shape[0], w.shape[0]
    _, pshape = _pooled_dims((n, x.shape[1], cout, *x.shape[2:]), p)
    out, route = _nan(pshape), _route_out(pshape)
    WP.conv_forward_pool_winograd(cuda.to_device(x), cuda.to_device(w), None if b is None else cuda.to_device(b),
                                  out, route, p, relu=relu, version=version, v=v, storage=storage)
    return out.copy_to_host(), route.copy_to_host()


@pytest.mark.parametrize("name, p, bias, relu", [("odd", 1, True, True), ("even", 1, False, True),
                                                 ("odd", 0, True, False)])
def test_forward_pool(name, p, bias, relu):
    """The pooled map within TOL of float64 conv + bias + ReLU + pool, the route equal to the reference's and to the
    implicit-GEMM pooled kernel's on the same inputs (random: no ties; ROUTE_NONE where the ReLU passed nothing)."""
    shape = SHAPES[name]
    n, cin, cout, h, wd = shape
    rng = _rng("wpool-fwd", name, p, bias, relu)
    x, w = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, 3, 3)
    b = _rand(rng, cout) if bias else None
    got, route = _forward(x, w, b, p, relu=relu)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, w, b, p, relu=relu)
    assert _rel_err(got, ref) <= TOL
    assert np.array_equal(route, ref_route)
    if relu:
        assert (route == ROUTE_NONE).any() and (route != ROUTE_NONE).any()
    _, pshape = _pooled_dims(shape, p)
    out_ig, route_ig = _nan(pshape), _route_out(pshape)
    P.conv_forward_pool_implicit_gemm(cuda.to_device(x), cuda.to_device(w), None if b is None else cuda.to_device(b),
                                      out_ig, route_ig, p, relu=relu)
    assert np.array_equal(route, route_ig.copy_to_host())


def test_forward_pool_ties():
    """Four equal values a window (w = 0): the first position wins with a positive bias; a negative bias leaves
    pooled 0 and ROUTE_NONE everywhere."""
    n, cin, cout, h, wd = SHAPES["even"]
    x = _rand(_rng("wpool-ties"), n, cin, h, wd)
    w = np.zeros((cout, cin, 3, 3), np.float32)
    b = np.linspace(-1.0, 1.0, cout).astype(np.float32)  # three channels negative, three positive
    got, route = _forward(x, w, b, 1)
    live = b > 0
    assert np.array_equal(got, np.broadcast_to(np.maximum(b, 0)[None, :, None, None], got.shape))
    assert (route[:, live] == 0).all() and (route[:, ~live] == ROUTE_NONE).all()


def _grad_case(key, shape, p):
    """x, w, dpool, route (the float64 reference forward's on x, w, a bias: random, with ROUTE_NONE windows) and the
    conv output's gradient expanded through the route."""
    n, cin, cout, h, wd = shape
    rng = _rng(*key)
    x, w, b = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, 3, 3), _rand(rng, cout)
    conv_shape, pshape = _pooled_dims(shape, p)
    _, route = P.conv_relu_pool_forward_ref(x, w, b, p)
    dpool = _rand(rng, *pshape)
    return x, w, dpool, route, P.pooled_grad_ref(dpool, route, conv_shape)


@pytest.mark.parametrize("name, p, bias", [("odd", 1, True), ("even", 2, False)])
def test_backward_weight_pool(name, p, bias):
    """dw (and db) within TOL of float64's conv backward on the expanded dy; the odd case takes V kept by the
    pooled forward (``winograd_wgrad``'s tests show the bias leaves dw's bits alone)."""
    shape = SHAPES[name]
    n, cin, cout, h, wd = shape
    x, w, dpool, route, dy = _grad_case(("wpool-wgrad", name, p), shape, p)
    args = (cuda.to_device(x), cuda.to_device(dpool), cuda.to_device(route))
    v = None
    if name == "odd":  # the forward's transformed x, as the engine would keep it
        v = cuda.to_device(np.full(WG.input_transform_size(x.shape, p, pool=True), np.nan, np.float32))
        _forward(x, w, None, p, v=v)
    dw = _nan((cout, cin, 3, 3))
    if bias:
        db = _nan(cout)
        WP.conv_backward_weight_bias_pool_winograd(*args, dw, db, p, splits=1, v=v)
        assert _rel_err(db.copy_to_host(), R.conv_bias_grad_ref(dy)) <= TOL
    else:
        WP.conv_backward_weight_pool_winograd(*args, dw, p, splits=2, v=v)
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, 3, p)) <= TOL


@pytest.mark.parametrize("name, p, mask", [("odd", 1, True), ("even", 0, False)])
def test_backward_data_pool(name, p, mask):
    """dx within TOL of float64's conv input gradient of the expanded dy, zero where the ReLU mask is."""
    shape = SHAPES[name]
    n, cin, cout, h, wd = shape
    x, w, dpool, route, dy = _grad_case(("wpool-dgrad", name, p), shape, p)
    relu_mask = np.maximum(x, 0) if mask else None
    dx = _nan((n, cin, h, wd))
    WP.conv_backward_data_pool_winograd(cuda.to_device(dpool), cuda.to_device(route), cuda.to_device(w), dx, p,
                                        relu_mask=None if relu_mask is None else cuda.to_device(relu_mask))
    got = dx.copy_to_host()
    if mask:
        assert np.all(got[relu_mask <= 0] == 0), "the ReLU mask must zero dx"
    assert _rel_err(got, R.conv_backward_data_ref(dy, w, x.shape, p, relu_mask)) <= TOL


def test_forward_pool_bf16_storage():
    """tensor_bf16 with BF16 storage: the pooled map within the BF16 bound of float64; the route ROUTE_NONE exactly
    where the pooled value is 0, and elsewhere the float64 conv at the routed position within the bound of the
    pooled value (a near tie may pick the other element)."""
    n, cin, cout, h, wd = SHAPES["even"]
    rng = _rng("wpool-bf16")
    x, w, b = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, 3, 3), _rand(rng, cout)
    got, route = _forward(x, w, b, 1, version="tensor_bf16", storage="bf16")
    ref, _ = P.conv_relu_pool_forward_ref(x, w, b, 1)
    assert _rel_err(got, ref) <= BF16_BOUND
    assert np.array_equal(route == ROUTE_NONE, got == 0)
    conv = R.conv_forward_ref(x, w, b, 1, True)
    nn, cc, ph, pw = np.nonzero(route != ROUTE_NONE)
    r = route[nn, cc, ph, pw].astype(int)
    at_route = conv[nn, cc, 2 * ph + r // 2, 2 * pw + r % 2]
    assert np.abs(at_route - got[nn, cc, ph, pw]).max() <= BF16_BOUND * np.abs(ref).max()


# ---------------------------------------------------------------------------------------------------------
# the autoencoder's conv2 on a GPU: 64 x (256 -> 128) on 16x16, padding 1


AE_SHAPE = (64, 256, 128, 16, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("version, storage, bound", [(None, "fp32", 1e-4), ("tensor_bf16", "bf16", BF16_BOUND)])
def test_ae_conv2_pool_gpu(version, storage, bound):
    """The three passes at the AE's conv2 against float64 (the route against the reference's where the FP32
    forward runs: ties and near ties are unlikely at this size but possible, so at most 1e-4 of them may differ)."""
    n, cin, cout, h, wd = AE_SHAPE
    x, w, dpool, route, dy = _grad_case(("wpool-ae",), AE_SHAPE, 1)
    b = _rand(_rng("wpool-ae-b"), cout)
    got, got_route = _forward(x, w, b, 1, version=version, storage=storage)
    ref, ref_route = P.conv_relu_pool_forward_ref(x, w, b, 1)
    assert _rel_err(got, ref) <= bound
    if storage == "fp32":
        assert np.mean(got_route != ref_route) <= 1e-4
    args = (cuda.to_device(x), cuda.to_device(dpool), cuda.to_device(route))
    dw, db, dx = _nan((cout, cin, 3, 3)), _nan(cout), _nan((n, cin, h, wd))
    WP.conv_backward_weight_bias_pool_winograd(*args, dw, db, 1, version=version, storage=storage)
    WP.conv_backward_data_pool_winograd(args[1], args[2], cuda.to_device(w), dx, 1, version=version, storage=storage)
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, 3, 1)) <= bound
    assert _rel_err(db.copy_to_host(), R.conv_bias_grad_ref(dy)) <= 1e-5
    assert _rel_err(dx.copy_to_host(), R.conv_backward_data_ref(dy, w, x.shape, 1)) <= bound
