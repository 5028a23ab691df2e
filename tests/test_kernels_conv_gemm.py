"""Implicit-im2col convolutions (kernels/conv/implicit_gemm.py) against the float64 NumPy references.

Under the CUDA simulator the shapes are tiny and odd (batch 3, 3 -> 5 channels, 7x9 images, not multiples
of any tile); outputs are poisoned with NaN so unwritten elements fail, and every test draws fresh random
inputs (no zeros) from its own seed. The 128x128-tile version is slow in the simulator: it runs a few cases
only. The ``gpu``-marked test repeats the checks at real sizes on a GPU. Under the simulator the weight gradient
splits K in ``gemm.SIMULATOR_SPLITS`` by default; the split-K tests pin 1, 2 and 3 splits.
"""

import os
import zlib

import numpy as np
import pytest
from numba import config, cuda

from gpunn.kernels import gemm as G
from gpunn.kernels.conv import implicit_gemm as C
from gpunn.kernels.conv import reference as R
from gpunn.kernels.gemm import split_k
from gpunn.kernels.gemm.skinny import SK_KC
from gpunn.kernels.launch import Launch, LaunchGroup

# The mappings compute window origins above or left of the image as oh - pad mod 2^32 (uint32 wrap,
# rejected by one unsigned compare); the simulator runs that arithmetic on NumPy scalars, which warn.

TOL = 1e-5
SHAPE = (2, 3, 5, 5, 7)  # N, Cin, Cout, H, W
SMALL = (2, 3, 4, 4, 5)  # the extra cases (kernel sizes, views, the 128x128 tiles)
N, CIN, COUT, H, W = SHAPE
FAST = ["naive", "tiled16", "regblock"]  # every version but the 128x128 tiles, which are slow here


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5  # never zeros
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


def _rounded(version, *arrays):
    """The arrays as `version` multiplies them: rounded to TF32 or BF16 for a tensor-core version (the float64
    references are then those of the rounded inputs), as they are for the others."""
    inputs = G.VERSIONS[version or "regblock"].inputs
    return tuple(G.round_inputs(x, inputs) for x in arrays)


def _wgrad_tolerance(version, k):
    """The weight gradient's limit on a GPU, K = N x OH x OW deep: 2e-5 for the FP32 versions; for the tensor-core
    ones the bench's sqrt(K) limit (gpunn.bench.gemm.gemm_tolerance, 7.1e-5 at K = 8192): their float32
    accumulation inside the MMA is not IEEE round-to-nearest, and its error grows faster with K (tensor_tf32 measured
    2.27e-5 at K = 8192 on an H200, over the FP32 limit)."""
    if G.VERSIONS[version].inputs == "fp32":
        return 2 * TOL
    from gpunn.bench.gemm import gemm_tolerance

    return gemm_tolerance(k)


def _out_hw(p, k, h=H, w=W):
    return h + 2 * p - k + 1, w + 2 * p - k + 1


def _forward(version, p, k=3, bias=True, relu=True, shape=SHAPE, splits=None):
    n, cin, cout, h, wd = shape
    rng = _rng("fwd", version, p, k, bias, relu, shape, splits)
    oh, ow = _out_hw(p, k, h, wd)
    x, w = _rand(rng, n, cin, h, wd), _rand(rng, cout, cin, k, k)
    b = _rand(rng, cout) if bias else None
    out = _nan((n, cout, oh, ow))
    launch = C.conv_forward_implicit_gemm(cuda.to_device(x), cuda.to_device(w),
                                          None if b is None else cuda.to_device(b), out, p, relu=relu,
                                          version=version, splits=splits)
    assert isinstance(launch, Launch if splits in (None, 1) else LaunchGroup)
    return _rel_err(out.copy_to_host(), R.conv_forward_ref(*_rounded(version, x, w), b, p, relu))


def _backward_data(version, p, k=3, mask=True, shape=SHAPE, splits=None):
    n, cin, cout, h, wd = shape
    rng = _rng("bwd-data", version, p, k, mask, shape, splits)
    oh, ow = _out_hw(p, k, h, wd)
    dy, w = _rand(rng, n, cout, oh, ow), _rand(rng, cout, cin, k, k)
    m = _mask(rng, n, cin, h, wd) if mask else None
    dx = _nan((n, cin, h, wd))
    C.conv_backward_data_implicit_gemm(cuda.to_device(dy), cuda.to_device(w), dx, p,
                                       relu_mask=None if m is None else cuda.to_device(m), version=version,
                                       splits=splits)
    return _rel_err(dx.copy_to_host(), R.conv_backward_data_ref(*_rounded(version, dy, w), (n, cin, h, wd), p, m))


def _backward_weight(version, p, k=3, shape=SHAPE, splits=None):
    n, cin, cout, h, wd = shape
    rng = _rng("bwd-weight", version, p, k, shape)
    oh, ow = _out_hw(p, k, h, wd)
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, oh, ow)
    dw = _nan((cout, cin, k, k))
    launch = C.conv_backward_weight_implicit_gemm(cuda.to_device(x), cuda.to_device(dy), dw, p, version=version,
                                                  splits=splits)
    if splits is None and config.ENABLE_CUDASIM:  # the automatic count there: SIMULATOR_SPLITS, K permitting
        used, _ = G.split_k_chunks(n * oh * ow, G.SIMULATOR_SPLITS, G.VERSIONS[version or "regblock"].k_step)
        assert _splits_of(launch) == used
    return _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(*_rounded(version, x, dy), k, p))


def _splits_of(launch):
    """The split count of a bound backward-weight launch: 1 for the single launch."""
    if isinstance(launch, Launch):
        assert len(launch.grid) == 2
        return 1
    assert isinstance(launch, LaunchGroup) and len(launch.launches) == 2
    return launch.launches[0].grid[2]


# --------------------------------------------------------------------------------------------- correctness
# Every version with padding 1 (the border windows), and padding 0 once per op (the simulator's budget); the
# tensor-core versions once per format and MMA (their tiles and loads: tests/test_kernels_gemm.py).
CASES = [("naive", 1), ("tiled16", 1), ("regblock", 1), ("regblock", 0), ("tensor_tf32", 1), ("wgmma_bf16", 1)]
CASE_IDS = [f"{v}-p{p}" for v, p in CASES]


@pytest.mark.parametrize("version,p", CASES, ids=CASE_IDS)
def test_forward(version, p):
    # p = 0: bias only; p = 1: bias + ReLU (both epilogues of the forward pass)
    assert _forward(version, p, relu=bool(p)) < TOL


@pytest.mark.parametrize("version,p", CASES, ids=CASE_IDS)
def test_backward_data(version, p):
    # p = 1 with the fused ReLU-backward mask, p = 0 without
    assert _backward_data(version, p, mask=bool(p)) < TOL


@pytest.mark.parametrize("version,p", CASES, ids=CASE_IDS)
def test_backward_weight(version, p):
    assert _backward_weight(version, p) < TOL


@pytest.mark.parametrize("version", ["regblock128", "coalesced128"])
def test_128x128_tiles_all_three_ops(version):
    """coalesced128: its whole-line weight loads in the forward (weight_t), regblock128's loads elsewhere."""
    assert _forward(version, 1, shape=SMALL) < TOL
    assert _backward_data(version, 1, shape=SMALL) < TOL
    assert _backward_weight(version, 1, shape=SMALL) < TOL


@pytest.mark.parametrize("k,p,version", [(1, 0, "tiled16"), (5, 2, "regblock")])
def test_other_kernel_sizes(k, p, version):
    assert _forward(version, p, k=k, bias=False, relu=False, shape=SMALL) < TOL
    assert _backward_data(version, p, k=k, shape=SMALL) < TOL
    assert _backward_weight(version, p, k=k, shape=SMALL) < TOL


def test_padding_wider_than_the_kernel():
    """p > k - 1: the backward-data GEMM reads dy with a negative padding k - 1 - p."""
    assert _backward_data("regblock", 1, k=1, shape=SMALL) < TOL
    assert _backward_data("tiled16", 3, k=3, shape=SMALL) < TOL


def test_default_version_runs():
    assert C.default_version(4096, 256, 2304) == "coalesced128"
    assert C.default_version(4096, 5, 45) == "regblock"
    assert C.default_version(4096, 3, 2304) == "skinny"
    assert C.default_version(43264, 16, 9) == "skinny"  # 1->16: K = 9 fits one chunk
    assert C.default_version(65536, 256, 27) == "coalesced128"  # 3->256: K = 27, but N too wide
    assert C.default_version(4096, 16, 45) == "regblock"  # K over one chunk
    assert _forward(None, 1, shape=SMALL) < TOL  # M = 40, N = 4: the skinny version
    assert _forward(None, 1, shape=(2, 3, 5, 4, 5)) < TOL  # N = 5: the 64x64 tiles


@pytest.mark.parametrize("cin,cout", [(3, 1), (5, 3), (2, 6)])
def test_skinny_all_three_ops(cin, cout):
    """The skinny version (a thread per output row, 4 columns): N = Cout in the forward and Cin in the
    backward-data GEMM, 1, 3 and 6 (two column groups, the second partial); K = 9 Cin (27, 45: not a multiple
    of its 32-wide K chunk, and 18 < one chunk); M = 2*4*5 = 40 rows, a partial block."""
    shape = (2, cin, cout, 4, 5)
    assert _forward("skinny", 1, shape=shape) < TOL
    assert _backward_data("skinny", 1, shape=shape) < TOL
    assert _backward_data("skinny", 0, mask=False, shape=shape) < TOL
    assert _backward_weight("skinny", 1, shape=shape, splits=1) < TOL


def test_skinny_split_k():
    """Split K across grid z (chunks of whole 32-wide K steps): K = 45 in 2 chunks, K = 72 in 3."""
    assert _forward("skinny", 1, shape=(2, 5, 3, 4, 5), splits=2) < TOL
    assert _backward_data("skinny", 1, shape=(2, 3, 8, 4, 5), splits=3) < TOL


def test_strided_weight_views():
    """w: a (Cout, Cin, k, k) window of a larger weight (not contiguous); dw the same: its other elements
    must stay NaN."""
    k, p = 3, 1
    rng = _rng("strided")
    oh, ow = _out_hw(p, k)
    x, dy = _rand(rng, N, CIN, H, W), _rand(rng, N, COUT, oh, ow)
    w_big = _rand(rng, COUT + 1, CIN + 2, k, k)
    w = w_big[1:, 1 : 1 + CIN]
    w_dev = cuda.to_device(w_big)[1:, 1 : 1 + CIN]
    assert not w_dev.is_c_contiguous()
    out = _nan((N, COUT, oh, ow))
    C.conv_forward_implicit_gemm(cuda.to_device(x), w_dev, None, out, p, version="regblock")
    assert _rel_err(out.copy_to_host(), R.conv_forward_ref(x, w, None, p)) < TOL
    dx = _nan((N, CIN, H, W))
    C.conv_backward_data_implicit_gemm(cuda.to_device(dy), w_dev, dx, p, version="tiled16")
    assert _rel_err(dx.copy_to_host(), R.conv_backward_data_ref(dy, w, x.shape, p)) < TOL
    dw_big = _nan((COUT + 1, CIN + 2, k, k))
    C.conv_backward_weight_implicit_gemm(cuda.to_device(x), cuda.to_device(dy), dw_big[1:, 1 : 1 + CIN], p,
                                         version="regblock", splits=2)  # the fixed-order sum writes the view
    got_big = dw_big.copy_to_host()
    assert _rel_err(got_big[1:, 1 : 1 + CIN], R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    outside = np.ones(got_big.shape, dtype=bool)
    outside[1:, 1 : 1 + CIN] = False
    assert np.isnan(got_big[outside]).all(), "wrote outside the dw view"


def test_bound_launch_reads_live_arrays():
    k, p = 3, 1
    rng = _rng("bound")
    oh, ow = _out_hw(p, k)
    x, w, b = _rand(rng, N, CIN, H, W), _rand(rng, COUT, CIN, k, k), _rand(rng, COUT)
    x_dev, out = cuda.to_device(x), _nan((N, COUT, oh, ow))
    launch = C.conv_forward_implicit_gemm(x_dev, cuda.to_device(w), cuda.to_device(b), out, p, relu=True,
                                          version="tiled16", launch=False)
    assert np.isnan(out.copy_to_host()).all(), "launch=False must not launch"
    for _ in range(2):
        launch()
        assert _rel_err(out.copy_to_host(), R.conv_forward_ref(x, w, b, p, True)) < TOL
        x = _rand(rng, N, CIN, H, W)
        x_dev.copy_to_device(x)


# --------------------------------------------------------------------------------------------- split-K
# K = 2*3*7 = 42 pixels: 3 splits of 16, 16, 10 (the K step of the 64x64 tiles is 8): chunk boundaries fall
# inside an image and the last chunk ends inside a K step (zero-filled).
SPLIT_SHAPE = (2, 3, 5, 3, 7)


def test_backward_weight_single_launch():
    """splits=1: today's single launch writing dw directly (2 splits: the automatic count in the tests
    above and the strided view; 3: the test below)."""
    assert _backward_weight("regblock", 1, shape=SPLIT_SHAPE, splits=1) < TOL


def test_split_k_group_is_deterministic_and_replays():
    """3 splits bound once (launch=False): the sum is the partials added in the order z = 0, 1, 2 (float32,
    bit for bit), two runs give identical bits, and a replay after new inputs recomputes."""
    n, cin, cout, h, wd = SPLIT_SHAPE
    k, p = 3, 1
    rng = _rng("split-group")
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, h, wd)
    x_dev, dy_dev, dw = cuda.to_device(x), cuda.to_device(dy), _nan((cout, cin, k, k))
    group = C.conv_backward_weight_implicit_gemm(x_dev, dy_dev, dw, p, version="regblock", splits=3, launch=False)
    assert _splits_of(group) == 3
    assert np.isnan(dw.copy_to_host()).all(), "launch=False must not launch"
    partials = group.launches[0].args[2]
    results = []
    for _ in range(2):
        dw.copy_to_device(np.full(dw.shape, np.nan, np.float32))
        group()
        results.append(dw.copy_to_host())
        assert _rel_err(results[-1], R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert results[0].tobytes() == results[1].tobytes(), "two runs differ"
    parts = partials.copy_to_host().reshape(3, cout, cin * k * k)
    in_order = (parts[0] + parts[1]) + parts[2]  # float32, the fixed order
    assert in_order.reshape(dw.shape).tobytes() == results[0].tobytes()
    x, dy = _rand(rng, n, cin, h, wd), _rand(rng, n, cout, h, wd)
    x_dev.copy_to_device(x)
    dy_dev.copy_to_device(dy)
    dw.copy_to_device(np.full(dw.shape, np.nan, np.float32))
    group()
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, k, p)) < TOL


def test_split_k_counts():
    """The chunking and the automatic count (host arithmetic; the H100's 132 SMs, batch-64 shapes)."""
    assert G.split_k_chunks(42, 3, 8) == (3, 16)
    assert G.split_k_chunks(70, 3, 8) == (3, 24)
    assert G.split_k_chunks(16, 3, 8) == (2, 8)  # rounding to the K step covers K with fewer chunks
    assert G.split_k_chunks(5, 3, 16) == (1, 16)
    assert G.split_k_chunks(7, 3, 1) == (3, 3)
    for k, splits, step in ((43264, 169, 8), (65536, 66, 8), (16384, 15, 8), (1000, 7, 16), (999, 1000, 1)):
        used, k_len = G.split_k_chunks(k, splits, step)
        assert k_len % step == 0 and (used - 1) * k_len < k <= used * k_len and used <= splits
    # cnn_conv1 (16 x 9, K = 64*26*26): one tile; 2 waves want 264 splits, 256 K each allows 169
    assert G.auto_splits(64 * 26 * 26, tiles=1, multiprocessors=132) == 169
    # ae_enc1 (256 x 27, K = 64*32*32, 64x64 tiles): 4 tiles -> 66 splits
    assert G.auto_splits(64 * 32 * 32, tiles=4, multiprocessors=132) == 66
    # ae_enc2 (128 x 2304, K = 64*16*16, 128x128 tiles): 18 tiles -> 15 splits
    assert G.auto_splits(64 * 16 * 16, tiles=18, multiprocessors=132) == 15
    assert G.auto_splits(4096, tiles=1000, multiprocessors=132) == 1  # already 2 waves of tiles
    assert G.auto_splits(100, tiles=1, multiprocessors=132) == 1  # K too short to split


def test_split_k_errors():
    x, dy, dw = _dev(2, 3, 7, 9), _dev(2, 5, 7, 9), _dev(5, 3, 3, 3)
    for bad in (0, -1, True, 2.0, "2", 65536):
        with pytest.raises(ValueError, match=r"conv_backward_weight_implicit_gemm: splits must be None or an int"):
            C.conv_backward_weight_implicit_gemm(x, dy, dw, 1, splits=bad)


def test_fast_divmod_constants():
    """x // d == (umulhi(x, mul) + x) >> shift for every x < 2^31 (checked at the edges and at random)."""
    rng = _rng("divmod")
    divisors = [*range(1, 300), 2**16 - 1, 2**16, 2**16 + 1, 12345, 3 * 2**20, 2**30 - 1, 2**30,
                2**31 - 1]
    xs = np.concatenate([np.arange(0, 1000), rng.integers(0, 2**31, 5000), [2**31 - 1, 2**31 - 2]])
    xs = xs.astype(np.uint64)
    for d in divisors:
        mul, shift = G.fast_divmod_constants(d)
        assert 0 < mul < 2**32
        edges = np.array([d - 1, d, d + 1, 2 * d - 1, 2 * d, (2**31 - 1) // d * d], dtype=np.uint64)
        x = np.concatenate([xs, edges[edges < 2**31]])
        q = (((x * np.uint64(mul)) >> np.uint64(32)) + x) >> np.uint64(shift)
        np.testing.assert_array_equal(q, x // np.uint64(d), err_msg=f"d = {d}")
    with pytest.raises(ValueError, match="divisor"):
        G.fast_divmod_constants(0)


def test_references_against_direct_sums():
    """The float64 references (through gpunn.nn.functional) against the defining sums, once."""
    rng = _rng("reference")
    k, p = 3, 1
    x, w, dy = rng.standard_normal((2, 2, 4, 5)), rng.standard_normal((3, 2, k, k)), None
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = _out_hw(p, k, 4, 5)
    y = np.zeros((2, 3, oh, ow))
    for kh in range(k):
        for kw in range(k):
            y += np.einsum("nchw,oc->nohw", xp[:, :, kh : kh + oh, kw : kw + ow], w[:, :, kh, kw])
    np.testing.assert_allclose(R.conv_forward_ref(x, w, None, p), y, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dw = np.zeros(w.shape)
    dxp = np.zeros(xp.shape)
    for kh in range(k):
        for kw in range(k):
            dw[:, :, kh, kw] = np.einsum("nohw,nchw->oc", dy, xp[:, :, kh : kh + oh, kw : kw + ow])
            dxp[:, :, kh : kh + oh, kw : kw + ow] += np.einsum("nohw,oc->nchw", dy, w[:, :, kh, kw])
    np.testing.assert_allclose(R.conv_backward_weight_ref(x, dy, k, p), dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(R.conv_backward_data_ref(dy, w, x.shape, p), dxp[:, :, p:-p, p:-p],
                               rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------- errors
def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.ones(shape, dtype=dtype))


def test_forward_errors():
    x, w, b = _dev(2, 3, 7, 9), _dev(5, 3, 3, 3), _dev(5)
    with pytest.raises(ValueError, match=r"channels differ.*\(2, 4, 7, 9\)"):
        C.conv_forward_implicit_gemm(_dev(2, 4, 7, 9), w, b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 5, 5, 7\), got \(2, 5, 7, 9\)"):
        C.conv_forward_implicit_gemm(x, w, b, _dev(2, 5, 7, 9), 0)
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        C.conv_forward_implicit_gemm(x, w, _dev(3), _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"kernel must be square"):
        C.conv_forward_implicit_gemm(x, _dev(5, 3, 3, 1), b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"padding must be a non-negative int"):
        C.conv_forward_implicit_gemm(x, w, b, _dev(2, 5, 7, 9), -1)
    with pytest.raises(ValueError, match=r"smaller than the 5x5 kernel"):
        C.conv_forward_implicit_gemm(_dev(2, 3, 3, 9), _dev(5, 3, 5, 5), b, _dev(2, 5, 1, 5), 0)
    with pytest.raises(ValueError, match=r"x must be 4-D"):
        C.conv_forward_implicit_gemm(_dev(2, 3, 63), w, b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"x must be float32"):
        C.conv_forward_implicit_gemm(_dev(2, 3, 7, 9, dtype=np.float64), w, b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"x is a host NumPy array"):
        C.conv_forward_implicit_gemm(np.ones((2, 3, 7, 9), np.float32), w, b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"x must be C-contiguous"):
        C.conv_forward_implicit_gemm(_dev(2, 3, 7, 10)[:, :, :, :9], w, b, _dev(2, 5, 7, 9), 1)
    with pytest.raises(ValueError, match=r"unknown version 'cublas'"):
        C.conv_forward_implicit_gemm(x, w, b, _dev(2, 5, 7, 9), 1, version="cublas")
    with pytest.raises(ValueError, match=r"block must be 256 threads"):
        C.conv_forward_implicit_gemm(x, w, b, _dev(2, 5, 7, 9), 1, version="regblock", block=128)


def test_backward_errors():
    x, w, dy = _dev(2, 3, 7, 9), _dev(5, 3, 3, 3), _dev(2, 5, 7, 9)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 5, 5, 7\), got \(2, 5, 7, 9\)"):
        C.conv_backward_data_implicit_gemm(dy, w, _dev(2, 3, 7, 9), 0)
    with pytest.raises(ValueError, match=r"channels differ"):
        C.conv_backward_data_implicit_gemm(dy, w, _dev(2, 4, 7, 9), 1)
    with pytest.raises(ValueError, match=r"relu_mask must have shape \(2, 3, 7, 9\)"):
        C.conv_backward_data_implicit_gemm(dy, w, _dev(2, 3, 7, 9), 1, relu_mask=_dev(2, 5, 7, 9))
    with pytest.raises(ValueError, match=r"dx must be C-contiguous"):
        C.conv_backward_data_implicit_gemm(dy, w, _dev(2, 3, 7, 10)[:, :, :, :9], 1)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 5, 7, 9\), got \(2, 4, 7, 9\)"):
        C.conv_backward_weight_implicit_gemm(x, _dev(2, 4, 7, 9), _dev(5, 3, 3, 3), 1)
    with pytest.raises(ValueError, match=r"channels differ.*dw \(5, 2, 3, 3\)"):
        C.conv_backward_weight_implicit_gemm(x, dy, _dev(5, 2, 3, 3), 1)
    with pytest.raises(ValueError, match=r"dw must be float32"):
        C.conv_backward_weight_implicit_gemm(x, dy, _dev(5, 3, 3, 3, dtype=np.float64), 1)


# --------------------------------------------------------------------------------------------- real GPU
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("version", list(C.GEMM_VERSIONS))
def test_gpu_sizes(version):
    """The autoencoder's shapes (CIFAR-10 32x32, 3 -> 64 channels) and a 5x5 case, batch 8."""
    rng = _rng("gpu", version)
    for n, cin, cout, h, w, k, p in ((8, 3, 64, 32, 32, 3, 1), (8, 64, 32, 16, 16, 3, 1),
                                     (4, 17, 33, 13, 11, 5, 2), (4, 16, 8, 12, 12, 3, 0)):
        oh, ow = h + 2 * p - k + 1, w + 2 * p - k + 1
        x, wt, b = _rand(rng, n, cin, h, w), _rand(rng, cout, cin, k, k), _rand(rng, cout)
        dy, mask = _rand(rng, n, cout, oh, ow), _mask(rng, n, cin, h, w)
        out = _nan((n, cout, oh, ow))
        C.conv_forward_implicit_gemm(cuda.to_device(x), cuda.to_device(wt), cuda.to_device(b), out, p, relu=True,
                                     version=version)
        rx, rw, rdy = _rounded(version, x, wt, dy)
        assert _rel_err(out.copy_to_host(), R.conv_forward_ref(rx, rw, b, p, True)) < TOL
        dx = _nan((n, cin, h, w))
        C.conv_backward_data_implicit_gemm(cuda.to_device(dy), cuda.to_device(wt), dx, p,
                                           relu_mask=cuda.to_device(mask), version=version)
        assert _rel_err(dx.copy_to_host(), R.conv_backward_data_ref(rdy, rw, x.shape, p, mask)) < TOL
        dw_ref = R.conv_backward_weight_ref(rx, rdy, k, p)
        for splits in (1, None):  # the single launch; the device's automatic split-K
            dw = _nan((cout, cin, k, k))
            launch = C.conv_backward_weight_implicit_gemm(cuda.to_device(x), cuda.to_device(dy), dw, p, version=version,
                                                          splits=splits)
            first = dw.copy_to_host()
            assert _rel_err(first, dw_ref) < _wgrad_tolerance(version, n * oh * ow)
            launch()
            assert dw.copy_to_host().tobytes() == first.tobytes(), "split-K must be deterministic"


# ------------------------------------------------------------------------- split-K forward and backward data
# Small feature maps leave most SMs idle, so on a GPU the forward and backward-data GEMMs split K there too
# (gemm.underfilled_splits); the epilogue (bias + ReLU, the ReLU mask) then runs in the fixed-order sum.
# K = Cin*9 = 27 (forward) and Cout*9 = 45 (backward data): 2 and 3 splits leave uneven last chunks.
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("version", ["naive", "regblock"])
def test_split_k_forward_and_backward_data(version, splits):
    assert _forward(version, 1, splits=splits) < TOL
    assert _forward(version, 0, bias=False, relu=False, splits=splits) < TOL
    assert _backward_data(version, 1, splits=splits) < TOL
    assert _backward_data(version, 0, mask=False, splits=splits) < TOL


def test_underfilled_splits_rule(monkeypatch):
    """Split outputs whose tiles fill at most half the SMs to about 2 blocks per SM, in two those that fill at most
    one wave, none beyond (the H100 measurements in gemm.underfilled_splits)."""
    monkeypatch.setattr(split_k.device, "simulator_enabled", lambda: False)
    monkeypatch.setattr(split_k, "multiprocessors", lambda: 132)
    # autoencoder 128->128 at 8x8, batch 64: 4096 x 128 output, 32 tiles of 128x128; K = 1152 -> 4 splits
    assert G.underfilled_splits("regblock128", G.GemmProblem(64 * 8 * 8, 128, 128 * 9)) == 4
    # 256->128 at 16x16 backward data: 16384 x 256, 256 tiles fill the SMs -> no split; its forward, 128
    # tiles (at most one block per SM) -> 2 splits (see the docstring)
    assert G.underfilled_splits("regblock128", G.GemmProblem(64 * 16 * 16, 256, 128 * 9)) == 1
    assert G.underfilled_splits("regblock128", G.GemmProblem(64 * 16 * 16, 128, 256 * 9)) == 2
    # the weight gradient of 256->128 at 16x16 (18 tiles, K = 16384) asks for 4 blocks per SM
    assert G.auto_splits(64 * 16 * 16, 18, 132, waves=C.WGRAD_SPLIT_WAVES) == 30
    # CNN conv1 forward: K = 9 leaves nothing to split
    assert G.underfilled_splits("regblock", G.GemmProblem(64 * 26 * 26, 16, 9)) == 1
    assert G.underfilled_splits("regblock", G.GemmProblem(64, 16, 9)) == 1
    # skinny: about SKINNY_BLOCKS_PER_SM blocks per SM, chunks of at least one K step. 256->3 at 32x32:
    # 512 row blocks, ceil(48 * 132 / 512) = 13 asked, K = 2304 in chunks of 192 -> 12 used
    ae_dec3 = G.GemmProblem(64 * 32 * 32, 3, 256 * 9)
    asked = G.underfilled_splits("skinny", ae_dec3)
    assert asked == 13 and G.split_k_chunks(ae_dec3.k, asked, SK_KC) == (12, 192)
    # the 1-channel input gradient of 1->16 at 28x28: K = 144 has 5 K steps of 32 -> 5 chunks
    cnn1 = G.GemmProblem(64 * 28 * 28, 1, 16 * 9)
    assert G.split_k_chunks(cnn1.k, G.underfilled_splits("skinny", cnn1), SK_KC) == (5, 32)
