"""Winograd F(2x2, 3x3) convolutions (kernels/conv/winograd.py) and the batched GEMM under them (gemm/batched.py,
gemm/mappings_batched.py) against float64 references.

Under the simulator the shapes are tiny and odd (batch 3, 5 -> 6 channels, 7x9 maps: the last row and column of
tiles partial), paddings 1, 0 and 2; outputs poisoned with NaN, fresh random inputs per test; one case of each pass
(``repeat=True``) runs twice and compares the two bit for bit (every output has one writer and the split sum a fixed
order, so one case per pass shows it; a second run of every case doubled the file's time). With ``bf16=True`` the
two runs are the pass with float32 and with BF16 transform storage (``storage``), compared bit for bit. The
simulated cost is the batched GEMM's: 16 positions x splits blocks of 256 threads whatever the map size. The
``gpu``-marked tests run the autoencoder's shapes on a real GPU.
"""

import os
import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import conv as C
from gpunn.kernels import mma as M
from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import upsampled as UP
from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.conv import winograd_wgrad as WW
from gpunn.kernels.gemm import batched as B
from gpunn.kernels.launch import LaunchGroup, bind

TOL = 1e-5
SHAPE = (3, 5, 6, 7, 9)  # N, Cin, Cout, H, W


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return a


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, dtype=np.float32))


def _rel_err(got, ref):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _out_hw(h, wd, p, up):
    return (2 * h + 2 * p - 2, 2 * wd + 2 * p - 2) if up else (h + 2 * p - 2, wd + 2 * p - 2)


def _storages(repeat, bf16):
    """The transform storage of each run: float32 then BF16 (bit for bit the same result), or float32 once or
    twice."""
    return ("fp32", "bf16") if bf16 else ("fp32",) * (2 if repeat else 1)


def _forward(p, shape=SHAPE, bias=True, relu=True, version=None, w_view=False, up=False, repeat=False, bf16=False):
    n, cin, cout, h, wd = shape
    rng = _rng("wino-fwd", p, shape, bias, relu, version, w_view, up)
    x = _rand(rng, n, cin, h, wd)
    w = _rand(rng, cout, cin, 3, 3)
    b = _rand(rng, cout) if bias else None
    oh, ow = _out_hw(h, wd, p, up)
    launcher = WG.conv_forward_winograd_up if up else WG.conv_forward_winograd
    wd_dev = cuda.to_device(w)
    if w_view:  # a strided view of a flat parameter buffer, as the engine passes weights
        buf = cuda.to_device(np.concatenate([np.zeros(7, np.float32), w.ravel()]))
        wd_dev = buf[7:].reshape(w.shape)
    outs = []
    for storage in _storages(repeat, bf16):
        out = _nan((n, cout, oh, ow))
        launch = launcher(cuda.to_device(x), wd_dev, None if b is None else cuda.to_device(b), out, p, relu=relu,
                          version=version, storage=storage)
        assert isinstance(launch, LaunchGroup)
        outs.append(out.copy_to_host())
    assert np.array_equal(outs[0], outs[-1], equal_nan=True), f"two runs differ {_storages(repeat, bf16)}"
    return _rel_err(outs[0], (UP.conv_forward_up_ref if up else R.conv_forward_ref)(x, w, b, p, relu))


def _backward_data(p, shape=SHAPE, mask=True, version=None, up=False, repeat=False, bf16=False):
    n, cin, cout, h, wd = shape
    rng = _rng("wino-bwd-data", p, shape, mask, version, up)
    oh, ow = _out_hw(h, wd, p, up)
    launcher = WG.conv_backward_data_winograd_up if up else WG.conv_backward_data_winograd
    dy, w = _rand(rng, n, cout, oh, ow), _rand(rng, cout, cin, 3, 3)
    relu_mask = np.maximum(rng.standard_normal((n, cin, h, wd)), 0).astype(np.float32) if mask else None
    outs = []
    for storage in _storages(repeat, bf16):
        dx = _nan((n, cin, h, wd))
        launcher(cuda.to_device(dy), cuda.to_device(w), dx, p,
                 relu_mask=None if relu_mask is None else cuda.to_device(relu_mask), version=version, storage=storage)
        outs.append(dx.copy_to_host())
    assert np.array_equal(outs[0], outs[-1], equal_nan=True), f"two runs differ {_storages(repeat, bf16)}"
    got = outs[0]
    if mask:
        assert np.all(got[relu_mask <= 0] == 0), "the ReLU mask must zero dx"
    ref = UP.conv_backward_data_up_ref if up else R.conv_backward_data_ref
    return _rel_err(got, ref(dy, w, (n, cin, h, wd), p, relu_mask))


def _backward_weight(p, shape=SHAPE, splits=None, version=None, up=False, repeat=False, bf16=False, bias=False,
                     plain=False):
    """The weight gradient's error; with `bias`, by the launcher that makes the bias gradient too: its db within TOL
    of the float64 sum (and the same bits in every run), with `plain` its dw bit for bit the plain launcher's."""
    n, cin, cout, h, wd = shape
    rng = _rng("wino-bwd-weight", p, shape, splits, version, up)
    oh, ow = _out_hw(h, wd, p, up)
    launcher = WW.conv_backward_weight_winograd_up if up else WW.conv_backward_weight_winograd
    with_bias = WW.conv_backward_weight_bias_winograd_up if up else WW.conv_backward_weight_bias_winograd
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, oh, ow)
    outs, biases = [], []
    for storage in _storages(repeat, bf16):
        dw = _nan((cout, cin, 3, 3))
        args = (cuda.to_device(x), cuda.to_device(dy), dw)
        kw = {"splits": splits, "version": version, "storage": storage}
        if bias:
            db = _nan(cout)
            with_bias(*args, db, p, **kw)
            biases.append(db.copy_to_host())
            if plain:
                own = _nan((cout, cin, 3, 3))
                launcher(args[0], args[1], own, p, **kw)
                assert np.array_equal(dw.copy_to_host(), own.copy_to_host()), "the bias changed dw"
        else:
            launcher(*args, p, **kw)
        outs.append(dw.copy_to_host())
    assert np.array_equal(outs[0], outs[-1], equal_nan=True), f"two runs differ {_storages(repeat, bf16)}"
    if bias:
        assert np.array_equal(biases[0], biases[-1]), "two runs' db differ"
        assert _rel_err(biases[0], R.conv_bias_grad_ref(dy)) <= TOL
    return _rel_err(outs[0], (UP.conv_backward_weight_up_ref if up else R.conv_backward_weight_ref)(x, dy, 3, p))


@pytest.mark.parametrize("p", [1, 0, 2])
def test_forward(p):
    assert _forward(p, repeat=p == 1) <= TOL


def test_forward_no_bias_no_relu_weight_view():
    assert _forward(1, bias=False, relu=False, w_view=True) <= TOL


@pytest.mark.parametrize("p", [1, 0, 2])
def test_backward_data(p):
    assert _backward_data(p, repeat=p == 1) <= TOL


def test_backward_data_no_mask():
    assert _backward_data(1, mask=False) <= TOL


@pytest.mark.parametrize("p, splits", [(1, 1), (1, 5), (0, 2), (2, None)])
def test_backward_weight(p, splits):
    """Split counts 1, 5 (60 tile products in chunks of 16: 4 used), 2 and the simulator's automatic 2 sum the same
    products in different groupings: each within TOL of the float64 reference."""
    assert _backward_weight(p, splits=splits, repeat=splits == 5) <= TOL


def test_backward_weight_with_bias():
    """The bias gradient summed by the dy transform's blocks (60 tiles in chunks of 32 threads, the second partly
    empty) and added in the finishing launch; dw the plain launcher's bits."""
    assert _backward_weight(1, splits=2, bias=True, plain=True) <= TOL


@pytest.mark.parametrize("p, bf16", [(0, False), (1, True)])
def test_backward_weight_with_bias_upsampled(p, bf16):
    """The upsampled twin (45 tiles: two chunks; with BF16 storage on one image, 15 tiles: one chunk, on the
    tensor_bf16 GEMM, the bias from dy in float32): dw and db within their bounds, BF16 storage's dw the float32
    storage's bits."""
    shape = UP_WGRAD_SHAPE if bf16 else UP_SHAPE
    version = "tensor_bf16" if bf16 else None
    err = _backward_weight(p, shape=shape, splits=1, version=version, up=True, bf16=bf16, bias=True)
    assert err <= (TENSOR_BOUND["tensor_bf16"] if bf16 else TOL)


def _finish_old_order(partials, cin, cout, splits, db_partials, chunks):
    """The finishing launch's result in float32, in the order of the kernel it replaced (a thread per element):
    dU[pos] = partials of split 0 + split 1 + ... in order; t3 = G^T dU per column j; row i of t3 G; db[c] = 0 +
    db_partials[c, 0] + ... in order."""
    half = np.float32(0.5)
    p = partials.reshape(WG.POSITIONS, splits, cin * cout)
    u = p[:, 0].copy()
    for s in range(1, splits):
        u = u + p[:, s]
    u = u.reshape(4, 4, -1)  # [r, j]
    t3 = np.empty((3, 4, cin * cout), np.float32)
    for j in range(4):
        u0, u1, u2, u3 = u[0, j], u[1, j], u[2, j], u[3, j]
        t3[0, j] = u0 + half * (u1 + u2)
        t3[1, j] = half * (u1 - u2)
        t3[2, j] = half * (u1 + u2) + u3
    dw = np.empty((3, 3, cin * cout), np.float32)
    for i in range(3):
        a0, a1, a2, a3 = t3[i]
        dw[i, 0] = a0 + half * (a1 + a2)
        dw[i, 1] = half * (a1 - a2)
        dw[i, 2] = half * (a1 + a2) + a3
    db = np.zeros(cout, np.float32)
    for b in range(chunks):
        db = db + db_partials.reshape(cout, chunks)[:, b]
    return dw.reshape(3, 3, cin, cout).transpose(3, 2, 0, 1), db


@pytest.mark.parametrize("cin, cout, splits, bias, one_block", [(3, 5, 1, False, False), (3, 5, 3, True, False),
                                                                (5, 7, 3, False, True), (5, 7, 10, True, False)])
def test_finish_same_bits_as_the_old_order(cin, cout, splits, bias, one_block):
    """The finishing launch (16 elements x 16 positions a block, the sums through shared memory) gives the bits of
    the old order (``_finish_old_order``) on partials of magnitudes 1e-3..1e3 (another order of the split sum
    changes bits): 15 and 35 elements (a partial block; 3 blocks, or 3 groups on one block by its grid-stride),
    splits 1, 3 and 10 (one and two groups of FINISH_LOADS loads), db from 3 chunks."""
    rng = _rng("finish", cin, cout, splits, bias, one_block)
    chunks = 3
    partials = (rng.standard_normal(WG.POSITIONS * splits * cin * cout)
                * 10.0 ** rng.uniform(-3, 3, WG.POSITIONS * splits * cin * cout)).astype(np.float32)
    db_partials = (rng.standard_normal(cout * chunks) * 10.0 ** rng.uniform(-3, 3, cout * chunks)).astype(np.float32)
    dw, db = _nan((cout, cin, 3, 3)), _nan(cout if bias else 1)
    args = (cuda.to_device(partials), dw, cuda.to_device(db_partials), db, *np.uint32([cin, cout, splits, chunks]))
    launch = WW._finish_launch(bias, args, 0, "finish")
    if one_block:
        launch = bind(WW._finish_kernel(bias), 1, WW.FINISH_THREADS, args, 0, False, "finish")
    launch()
    want_w, want_b = _finish_old_order(partials, cin, cout, splits, db_partials, chunks)
    got_w = dw.copy_to_host()
    assert np.isfinite(got_w).all(), "unwritten dw"
    assert np.array_equal(got_w, want_w)
    if bias:
        assert np.array_equal(db.copy_to_host(), want_b)


UP_SHAPE = (3, 5, 6, 3, 5)  # before the upsample: 6x10 after it


@pytest.mark.parametrize("p", [1, 0])
def test_upsampled_passes(p):
    """The passes of a conv on up(x): x read through the upsample, the input gradient's 2x2 sums in the output
    transform."""
    assert _forward(p, shape=UP_SHAPE, up=True) <= TOL
    assert _backward_data(p, shape=UP_SHAPE, up=True) <= TOL
    assert _backward_weight(p, shape=UP_SHAPE, splits=2, up=True, repeat=p == 1) <= TOL


@pytest.mark.parametrize("up", [False, True])
def test_weight_gradient_reads_the_forwards_input_transform(up):
    """The forward's kept V (``v``) serves the weight gradient: the same bits as transforming x again."""
    n, cin, cout, h, wd = UP_SHAPE if up else SHAPE
    rng = _rng("shared-v", up)
    x, w = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, 3, 3)
    oh, ow = _out_hw(h, wd, 1, up)
    dy = _rand(rng, n, cout, oh, ow)
    d_x, d_dy = cuda.to_device(x), cuda.to_device(dy)
    v = _nan(WG.input_transform_size(x.shape, 1, up))
    (WG.conv_forward_winograd_up if up else WG.conv_forward_winograd)(d_x, cuda.to_device(w), None,
                                                                     _nan((n, cout, oh, ow)), 1, v=v)
    wgrad = WW.conv_backward_weight_winograd_up if up else WW.conv_backward_weight_winograd
    shared, own = _nan((cout, cin, 3, 3)), _nan((cout, cin, 3, 3))
    group = wgrad(d_x, d_dy, shared, 1, splits=2, v=v)
    assert len(group.launches) == 3  # no input transform
    wgrad(d_x, d_dy, own, 1, splits=2)
    assert np.array_equal(shared.copy_to_host(), own.copy_to_host())
    assert np.isfinite(own.copy_to_host()).all()
    with pytest.raises(ValueError, match="input_transform_size"):
        wgrad(d_x, d_dy, own, 1, v=_nan(7))


def test_coalesced128_batched():
    """The 128x128 tiles through the batched mappings (its 8-K loads on batch_k / batch_t_k, one tile each)."""
    shape = (1, 3, 4, 5, 5)
    assert _forward(1, shape=shape, version="coalesced128") <= TOL
    assert _backward_weight(1, shape=shape, splits=2, version="coalesced128") <= TOL


def test_batched_gemm_every_mapping():
    """gemm_batched on each A/B mapping pair against per-batch float64 products, with a K split of 3."""
    rng = _rng("batched")
    z, m, n, k, splits = 3, 9, 7, 11, 3
    a_km, a_mk = _rand(rng, z, k, m), _rand(rng, z, m, k)
    b_kn, b_nk = _rand(rng, z, k, n), _rand(rng, z, n, k)
    used, k_len = B.batch_chunks(k, splits, 8)  # regblock's K step
    for a_map, a, a64 in (("batch_t", a_km, a_km.transpose(0, 2, 1)), ("batch_k", a_mk, a_mk)):
        for b_map, b, b64 in (("batch", b_kn, b_kn), ("batch_t_k", b_nk, b_nk.transpose(0, 2, 1))):
            out = _nan(z * used * m * n)
            B.gemm_batched("regblock", m, n, k, z, cuda.to_device(a.ravel()), cuda.to_device(b.ravel()), out,
                           a_map=a_map, b_map=b_map, store="partial", splits=splits)
            parts = out.copy_to_host().reshape(z, used, m, n).astype(np.float64)
            assert np.isfinite(parts).all()
            ref = np.einsum("zik,zkj->zij", a64.astype(np.float64), b64.astype(np.float64))
            assert _rel_err(parts.sum(axis=1), ref) <= TOL
            # chunk s holds exactly the products of K indices [s * k_len, (s + 1) * k_len)
            s_ref = np.einsum("zik,zkj->zij", a64[:, :, k_len:2 * k_len].astype(np.float64),
                              b64[:, k_len:2 * k_len].astype(np.float64))
            assert _rel_err(parts[:, 1], s_ref) <= TOL


def test_batched_store_t():
    rng = _rng("batched-t")
    z, m, n, k = 2, 5, 3, 4
    a, b = _rand(rng, z, k, m), _rand(rng, z, k, n)
    out = _nan(z * n * m)
    B.gemm_batched("tiled16", m, n, k, z, cuda.to_device(a.ravel()), cuda.to_device(b.ravel()), out,
                   a_map="batch_t", b_map="batch", store="batch_t")
    ref = np.einsum("zki,zkj->zji", a.astype(np.float64), b.astype(np.float64))
    assert _rel_err(out.copy_to_host().reshape(z, n, m), ref) <= TOL


def test_bad_input():
    x, w = cuda.to_device(np.zeros((1, 2, 5, 5), np.float32)), cuda.to_device(np.zeros((2, 2, 5, 5), np.float32))
    with pytest.raises(ValueError, match="3x3 kernels"):
        WG.conv_forward_winograd(x, w, None, _nan((1, 2, 3, 3)), 1)
    w3 = cuda.to_device(np.zeros((2, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="batched GEMM version"):
        WG.conv_forward_winograd(x, w3, None, _nan((1, 2, 5, 5)), 1, version="skinny")
    with pytest.raises(ValueError, match="splits"):
        WW.conv_backward_weight_winograd(x, _nan((1, 2, 5, 5)), _nan((2, 2, 3, 3)), 1, splits=0)
    with pytest.raises(ValueError, match="cannot run batched"):
        B.gemm_batched("skinny", 2, 2, 2, 1, x, x, x, a_map="batch_t", b_map="batch", store="partial")


def test_registered():
    for step in ("forward", "backward_data", "backward_weight"):
        assert C.VERSIONS[step]["winograd"].applies(128, 128, 3, 1, 16, 16)
        assert not C.VERSIONS[step]["winograd"].applies(128, 128, 5, 2, 16, 16)
    assert "winograd" in C.runnable_versions("forward", (5, 6, 3, 1, 7, 9))
    for step in ("forward", "backward_data", "backward_weight"):
        assert C.upsampled_version(step, "winograd").launcher.__name__.endswith("_winograd_up")
    assert "winograd" not in C.runnable_versions("forward", (5, 6, 1, 0, 7, 9))


# the batched GEMM on the tensor cores (gpu-tf32 / gpu-bf16): the transforms stay float32, the transformed input
# and weights are rounded to the format as the GEMM loads them. Against the exact convolution the error is a few
# units u of the format's rounding (simulator, these shapes: TF32 0.8u-1.6u, BF16 0.8u-2.2u); the limit is 8u, as
# tests/test_gpu_precision.py's, and above FP32's TOL (the rounding happened).
TENSOR_BOUND = {"tensor_tf32": 8 * 2.0**-11, "tensor_bf16": 8 * 2.0**-8}


@pytest.mark.parametrize("pass_, version", [("forward", "tensor_tf32"), ("backward_data", "tensor_bf16"),
                                            ("backward_weight", "tensor_bf16"), ("up_forward", "tensor_bf16")])
def test_tensor_core_batched_gemm(pass_, version):
    run = {"forward": lambda: _forward(1, version=version),
           "backward_data": lambda: _backward_data(1, version=version),
           "backward_weight": lambda: _backward_weight(1, splits=2, version=version),
           "up_forward": lambda: _forward(1, shape=UP_SHAPE, up=True, version=version)}[pass_]
    assert TOL < run() < TENSOR_BOUND[version]


# BF16 transform storage (storage="bf16", tensor_bf16 only): the transforms round V and dM to BF16 as the GEMM's
# tile store would, the GEMM reads the bits back exactly, so each pass is bit for bit its float32-storage result
# (and so within TENSOR_BOUND of the exact convolution). Each case runs the pass twice (two batched GEMMs); the
# weight gradients on one image (20 and 15 tiles: one K step, partly zero-filled, one split).
WGRAD_SHAPE, UP_WGRAD_SHAPE = (1, *SHAPE[1:]), (1, *UP_SHAPE[1:])
BF16_PASSES = {"forward": lambda: _forward(1, version="tensor_bf16", bf16=True),
               "backward_data": lambda: _backward_data(1, version="tensor_bf16", bf16=True),
               "backward_weight": lambda: _backward_weight(1, shape=WGRAD_SHAPE, splits=1, version="tensor_bf16",
                                                           bf16=True),
               "up_forward": lambda: _forward(0, shape=UP_SHAPE, up=True, version="tensor_bf16", bf16=True),
               "up_backward_data": lambda: _backward_data(1, shape=UP_SHAPE, up=True, version="tensor_bf16",
                                                          bf16=True),
               "up_backward_weight": lambda: _backward_weight(1, shape=UP_WGRAD_SHAPE, splits=1, up=True,
                                                              version="tensor_bf16", bf16=True)}


@pytest.mark.parametrize("pass_", list(BF16_PASSES))
def test_bf16_storage_same_bits(pass_):
    assert TOL < BF16_PASSES[pass_]() < TENSOR_BOUND["tensor_bf16"]


def test_bf16_storage_transforms_round_as_the_gemm():
    """The transforms' BF16 bits are their float32 outputs rounded to nearest even (mma.round_bf16's rule), NaN
    kept a NaN; the scratch of the BF16 storage is BF16 NaN."""
    n, cin, cout, h, wd = SHAPE
    rng = _rng("bf16-transforms")
    x = _rand(rng, n, cin, h, wd)
    x[0, 0, 0, 0] = np.nan
    dy = _rand(rng, n, cout, h, wd)
    dy[0, 0, 0, 0] = np.nan
    unused = _nan(1)  # (the dy transform's bias partials: no bias here)
    for up, launch, src, c in (
            (False, lambda st, a, b, d: WG._input_kernel(False, st)[4, 32](a, b, d), x, cin),
            (True, lambda st, a, b, d: WG._input_kernel(True, st)[4, 32](a, b, d), x, cin),
            (False, lambda st, a, b, d: WW._dy_kernel(st)[4, 32](a, b, unused, d), dy, cout)):
        oh, ow = _out_hw(h, wd, 1, up)
        dims = WG._tdims(n, c, h, wd, oh, ow, 1)
        size = WG.POSITIONS * c * int(dims[WG._T])
        got = {}
        for storage in WG.STORAGES:
            buf = WG._scratch(size, storage)
            assert buf.dtype == WG.transform_dtype(storage)
            launch(storage, cuda.to_device(src.ravel()), buf, dims)
            got[storage] = buf.copy_to_host()
        assert np.isnan(got["fp32"]).any() and not np.isnan(got["fp32"]).all()
        assert np.array_equal(got["bf16"], M._bf16_bits(got["fp32"]))
    assert np.isnan(M.round_bf16(np.float32(np.nan)))


@pytest.mark.parametrize("m, n, k, splits", [(9, 7, 40, 1), (10, 8, 41, 1), (6, 4, 72, 2)])
def test_bf16_storage_batched_gemm_same_bits(m, n, k, splits):
    """gemm_batched on tensor_bf16 with uint16 (BF16 bits) operands: bit for bit the product of the float32 operands
    they were rounded from, every mapping, one operand of each storage too. The operands are read as BF16 pairs
    (the ``_bf16x2`` mappings) where pairs cannot straddle: along K where K is even (40, 72: a second, partly
    zero-filled K step; 72 in two chunks of 64, the second partly outside K), along M or N where that side is even
    (10 x 8, 6 x 4: a pair's both rows at once, tails of the tile zero); else element by element (9 x 7, K 41)."""
    rng = _rng(f"bf16-batched-{m}-{n}-{k}")
    z = 2
    a_km, a_mk, b_kn, b_nk = _rand(rng, z, k, m), _rand(rng, z, m, k), _rand(rng, z, k, n), _rand(rng, z, n, k)
    for a_map, a, b_map, b in (("batch_t", a_km, "batch_t_k", b_nk), ("batch_k", a_mk, "batch", b_kn)):
        outs = []
        for a_dev, b_dev in ((a.ravel(), b.ravel()), (M._bf16_bits(a.ravel()), M._bf16_bits(b.ravel())),
                             (M._bf16_bits(a.ravel()), b.ravel()), (a.ravel(), M._bf16_bits(b.ravel()))):
            out = _nan(z * splits * m * n)
            launch = B.gemm_batched("tensor_bf16", m, n, k, z, cuda.to_device(a_dev), cuda.to_device(b_dev), out,
                                    a_map=a_map, b_map=b_map, store="partial", splits=splits)
            outs.append(out.copy_to_host())
            for side, kind, dev, outer in (("a", a_map, a_dev, m), ("b", b_map, b_dev, n)):
                along = k if kind in ("batch_k", "batch_t_k") else outer
                paired = dev.dtype == np.uint16 and along % 2 == 0
                assert (f"{kind}_bf16x2" in launch.name) == paired, (launch.name, side)
        assert np.isfinite(outs[0]).all()
        assert all(np.array_equal(outs[0], o) for o in outs[1:]), (a_map, b_map)


def test_bf16_storage_shared_v():
    """A forward's BF16 V (uint16, ``transform_dtype``) serves the weight gradient of BF16 storage: the bits of the
    float32-storage weight gradient; a float32 v is refused there."""
    n, cin, cout, h, wd = WGRAD_SHAPE
    rng = _rng("bf16-shared-v")
    x, w, dy = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, 3, 3), _rand(rng, n, cout, h, wd)
    d_x, d_dy = cuda.to_device(x), cuda.to_device(dy)
    v = cuda.to_device(np.zeros(WG.input_transform_size(x.shape, 1), WG.transform_dtype("bf16")))
    fwd = WG.conv_forward_winograd(d_x, cuda.to_device(w), None, _nan((n, cout, h, wd)), 1, version="tensor_bf16",
                                   launch=False, v=v, storage="bf16")
    fwd.launches[1]()  # its input transform only (the GEMM's bits are the pass tests')
    shared, own = _nan((cout, cin, 3, 3)), _nan((cout, cin, 3, 3))
    group = WW.conv_backward_weight_winograd(d_x, d_dy, shared, 1, version="tensor_bf16", splits=1, v=v,
                                             storage="bf16")
    assert len(group.launches) == 3  # no input transform
    WW.conv_backward_weight_winograd(d_x, d_dy, own, 1, version="tensor_bf16", splits=1)
    assert np.isfinite(own.copy_to_host()).all()
    assert np.array_equal(shared.copy_to_host(), own.copy_to_host())
    with pytest.raises(ValueError, match="v must be uint16"):
        WW.conv_backward_weight_winograd(d_x, d_dy, own, 1, version="tensor_bf16", v=_nan(v.size), storage="bf16")


def test_bf16_storage_refused():
    x = cuda.to_device(np.zeros((1, 2, 5, 5), np.float32))
    w = cuda.to_device(np.zeros((2, 2, 3, 3), np.float32))
    for version in (None, "regblock", "tensor_tf32"):
        with pytest.raises(ValueError, match="storage 'bf16' needs version 'tensor_bf16'"):
            WG.conv_forward_winograd(x, w, None, _nan((1, 2, 5, 5)), 1, version=version, storage="bf16")
    with pytest.raises(ValueError, match="storage 'bf16' needs version 'tensor_bf16'"):
        WG.conv_backward_data_winograd_up(_nan((1, 2, 10, 10)), w, _nan((1, 2, 5, 5)), 1, storage="bf16")
    with pytest.raises(ValueError, match="unknown storage 'fp16'"):
        WW.conv_backward_weight_winograd(x, x, _nan((2, 2, 3, 3)), 1, version="tensor_bf16", storage="fp16")
    bits = cuda.to_device(np.zeros(8, np.uint16))
    with pytest.raises(ValueError, match="operand a holds BF16 bits"):
        B.gemm_batched("regblock", 2, 2, 2, 1, bits, x, x, a_map="batch_t", b_map="batch", store="partial")


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs a real GPU")
@pytest.mark.parametrize("version", ["tensor_tf32", "tensor_bf16"])
@pytest.mark.parametrize("shape, up", [((64, 256, 128, 16, 16), False), ((64, 128, 256, 8, 8), True),
                                       ((5, 33, 65, 7, 9), True)])
def test_gpu_tensor_core_shapes(shape, up, version):
    for run in (_forward, _backward_data, _backward_weight):
        assert TOL < run(1, shape=shape, up=up, version=version, repeat=True) < TENSOR_BOUND[version]


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs a real GPU")
@pytest.mark.parametrize("shape", [(64, 256, 128, 16, 16), (64, 128, 256, 16, 16), (64, 128, 128, 8, 8),
                                   (5, 33, 65, 15, 13)])
def test_gpu_autoencoder_shapes(shape):
    assert _forward(1, shape=shape, repeat=True) <= TOL
    assert _backward_data(1, shape=shape, repeat=True) <= TOL
    assert _backward_weight(1, shape=shape, repeat=True) <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs a real GPU")
@pytest.mark.parametrize("shape", [(64, 128, 256, 8, 8), (5, 33, 65, 7, 9)])
def test_gpu_upsampled_shapes(shape):
    assert _forward(1, shape=shape, up=True, repeat=True) <= TOL
    assert _backward_data(1, shape=shape, up=True, repeat=True) <= TOL
    assert _backward_weight(1, shape=shape, up=True, repeat=True) <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs a real GPU")
@pytest.mark.parametrize("shape, up", [((64, 256, 128, 16, 16), False), ((64, 128, 256, 8, 8), True),
                                       ((5, 33, 65, 7, 9), True)])
def test_gpu_bf16_storage_same_bits(shape, up):
    """The autoencoder's Winograd passes with BF16 transform storage: bit for bit their float32-storage results."""
    for run in (_forward, _backward_data, _backward_weight):
        assert TOL < run(1, shape=shape, up=up, version="tensor_bf16", bf16=True) < TENSOR_BOUND["tensor_bf16"]


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs a real GPU")
@pytest.mark.parametrize("shape, up, version", [((64, 256, 128, 16, 16), False, None),
                                                ((64, 128, 256, 8, 8), True, "tensor_bf16"),
                                                ((5, 33, 65, 7, 9), False, None)])
def test_gpu_backward_weight_with_bias(shape, up, version):
    """The weight gradient that makes the bias gradient too, at the autoencoder's shapes (256 threads a transform
    block: 16 chunks of conv2's 4096 tiles) and an odd one: dw the plain launcher's bits, db within TOL."""
    bound = TENSOR_BOUND[version] if version else TOL
    assert _backward_weight(1, shape=shape, up=up, version=version, repeat=True, bias=True, plain=True,
                            bf16=version is not None) <= bound
