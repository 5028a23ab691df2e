"""GEMM kernels against the float64 NumPy reference.

Under the CUDA simulator (CPU-only machines, see conftest.py) the shapes are tiny and deliberately not
multiples of the tiles; outputs are poisoned with NaN so unwritten elements fail, and every test draws
fresh random inputs from its own seed. The ``gpu``-marked tests repeat the checks at real sizes on a GPU
(``pytest -m gpu``).
"""

import os
import zlib

import numpy as np
import pytest
from numba import config, cuda

from gpunn.kernels import gemm as G
from gpunn.kernels.launch import Launch, LaunchGroup

TOL = 1e-5
TRANS = [(False, False), (False, True), (True, False), (True, True)]
TRANS_IDS = ["NN", "NT", "TN", "TT"]
# One (M, N, K) per transpose combination: odd, not multiples of any tile, K = 1 included.
SMALL = {(False, False): (13, 7, 11), (False, True): (5, 19, 9), (True, False): (9, 3, 12),
         (True, True): (7, 10, 1)}


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _stored(rng, m, n, k, trans_a, trans_b):
    """Host operands in their stored layouts."""
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    return a, b


def _epilogue_args(rng, m, n, epilogue):
    """Host (bias, relu, mask) for an epilogue name; the mask looks like a ReLU output (half zeros)."""
    bias = rng.standard_normal(n).astype(np.float32) if epilogue in ("bias", "bias_relu") else None
    relu = epilogue in ("relu", "bias_relu")
    mask = np.maximum(rng.standard_normal((m, n)), 0).astype(np.float32) if epilogue == "mask" else None
    return bias, relu, mask


def _dev_or_none(x):
    return None if x is None else cuda.to_device(x)


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan, dtype=np.float32))


def _rel_err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _ref(version, *args, **kw):
    """The float64 reference of a version: its inputs rounded as it rounds them (TF32, BF16) first."""
    return G.gemm_reference(*args, inputs=G.VERSIONS[version].inputs, **kw)


def _run(version, m, n, k, trans_a, trans_b, epilogue, key=(), **kw):
    """Launch one version on fresh random inputs; return the relative max error vs the reference."""
    rng = _rng(version, m, n, k, trans_a, trans_b, epilogue, *key)
    a, b = _stored(rng, m, n, k, trans_a, trans_b)
    bias, relu, mask = _epilogue_args(rng, m, n, epilogue)
    out = _nan((m, n))
    launch = G.gemm(cuda.to_device(a), cuda.to_device(b), out, version=version, trans_a=trans_a,
                    trans_b=trans_b, bias=_dev_or_none(bias), relu=relu, relu_mask=_dev_or_none(mask), **kw)
    assert isinstance(launch, Launch)
    got = out.copy_to_host()
    assert np.isfinite(got).all(), f"{version}: unwritten (NaN) outputs"
    return _rel_err(got, _ref(version, a, b, trans_a, trans_b, bias, relu, mask))


# --------------------------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("epilogue", G.EPILOGUES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_every_version_transpose_epilogue(version, trans_a, trans_b, epilogue):
    m, n, k = SMALL[trans_a, trans_b]
    assert _run(version, m, n, k, trans_a, trans_b, epilogue) < TOL


@pytest.mark.parametrize("version,trans_a,trans_b,m,n,k", [
    ("tiled16", False, False, 17, 19, 23),     # 2x2 blocks, 2 K steps
    ("tiled16", True, True, 17, 19, 23),
    ("regblock", False, False, 66, 5, 9),      # 2 blocks of the 64x64 tile along M, 2 K steps
    ("regblock", True, True, 5, 65, 9),        # 2 blocks along N
    ("regblock128", False, False, 130, 5, 17),  # 2 blocks of the 128x128 tile along M, 3 K steps
    ("regblock128", True, True, 3, 131, 10),    # 2 blocks along N
    ("coalesced128", False, False, 130, 5, 17),  # its whole-line loads (dense A, dense B) across tiles
    ("coalesced128", True, True, 3, 131, 10),    # (transposed A, transposed B)
    ("tensor_tf32", False, False, 130, 5, 40),  # 2 blocks along M, 2 K steps of 32 (the second partly empty)
    ("tensor_bf16", True, True, 3, 131, 40),    # 2 blocks along N
    ("wgmma_tf32", True, False, 130, 5, 40),    # 2 blocks along M; A through the outer path
    ("wgmma_bf16", False, True, 3, 131, 40),    # 2 blocks along N; both operands through the K-row path
])
def test_gemm_across_tiles(version, trans_a, trans_b, m, n, k):
    assert _run(version, m, n, k, trans_a, trans_b, "bias_relu") < TOL


@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_batch_of_one(version):
    assert _run(version, 1, 10, 12, False, True, "bias_relu") < TOL


def test_naive_block_sizes():
    assert _run("naive", 9, 11, 5, False, False, "bias_relu", block=(8, 4)) < TOL
    assert _run("naive", 9, 11, 5, True, False, "none", block=(32, 1)) < TOL


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False)], ids=["NT", "TN"])
@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_strided_views(version, trans_a, trans_b):
    """a: columns of a wider array (a (B, 785) batch's first 784 columns); b: a reshaped slice of a flat
    parameter buffer; out: an interior window of a larger buffer, whose other elements must stay NaN."""
    m, n, k = 6, 5, 7
    rng = _rng("strided", version, trans_a, trans_b)
    a, b = _stored(rng, m, n, k, trans_a, trans_b)
    bias = rng.standard_normal(n).astype(np.float32)
    a_big = rng.standard_normal((a.shape[0], a.shape[1] + 1)).astype(np.float32)
    a_big[:, : a.shape[1]] = a
    a_dev = cuda.to_device(a_big)[:, : a.shape[1]]
    flat = rng.standard_normal(b.size + 9).astype(np.float32)
    flat[4 : 4 + b.size] = b.ravel()
    b_dev = cuda.to_device(flat)[4 : 4 + b.size].reshape(b.shape)
    out_big = _nan((m + 3, n + 2))
    out = out_big[1 : 1 + m, 2:]
    G.gemm(a_dev, b_dev, out, version=version, trans_a=trans_a, trans_b=trans_b,
           bias=cuda.to_device(bias), relu=True)
    got_big = out_big.copy_to_host()
    got = got_big[1 : 1 + m, 2:]
    assert np.isfinite(got).all(), "unwritten outputs in the view"
    outside = np.ones(got_big.shape, dtype=bool)
    outside[1 : 1 + m, 2:] = False
    assert np.isnan(got_big[outside]).all(), "wrote outside the output view"
    assert _rel_err(got, _ref(version, a, b, trans_a, trans_b, bias, True)) < TOL


@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_bound_launch_reads_live_arrays(version):
    """launch=False only binds; each call recomputes from the arrays' current contents."""
    m, n, k = 5, 6, 9
    rng = _rng("bound", version)
    a, b = _stored(rng, m, n, k, False, True)
    h = np.maximum(rng.standard_normal((m, n)), 0).astype(np.float32)
    a_dev, b_dev, h_dev, out = cuda.to_device(a), cuda.to_device(b), cuda.to_device(h), _nan((m, n))
    launch = G.gemm(a_dev, b_dev, out, version=version, trans_b=True, relu_mask=h_dev, launch=False)
    assert isinstance(launch, Launch) and "mask" in launch.name
    assert np.isnan(out.copy_to_host()).all(), "launch=False must not launch"
    for _ in range(2):
        launch()
        assert _rel_err(out.copy_to_host(), _ref(version, a, b, trans_b=True, relu_mask=h)) < TOL
        a, b = _stored(rng, m, n, k, False, True)
        h = np.maximum(rng.standard_normal((m, n)), 0).astype(np.float32)
        a_dev.copy_to_device(a)
        b_dev.copy_to_device(b)
        h_dev.copy_to_device(h)


def test_reference_matches_numpy():
    rng = _rng("reference")
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal((5, 4))
    bias = rng.standard_normal(5)
    mask = np.maximum(rng.standard_normal((3, 5)), 0)
    np.testing.assert_allclose(G.gemm_reference(a, b, trans_b=True), a @ b.T)
    np.testing.assert_allclose(
        G.gemm_reference(a.T, b, trans_a=True, trans_b=True, bias=bias, relu=True),
        np.maximum(a @ b.T + bias, 0),
    )
    np.testing.assert_allclose(G.gemm_reference(a, b, trans_b=True, relu_mask=mask),
                               np.where(mask > 0, a @ b.T, 0))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for inputs in ("tf32", "bf16"):  # the tensor-core versions' reference: A and B rounded first, then float64
        rounded = G.round_inputs(a32, inputs).astype(np.float64) @ G.round_inputs(b32, inputs).astype(np.float64).T
        np.testing.assert_array_equal(G.gemm_reference(a32, b32, trans_b=True, inputs=inputs), rounded)
        assert not np.array_equal(rounded, a32.astype(np.float64) @ b32.astype(np.float64).T)
    with pytest.raises(ValueError, match=r"unknown input format 'fp16'"):
        G.gemm_reference(a32, b32, trans_b=True, inputs="fp16")


# --------------------------------------------------------------------------------------------- split-K (dense)
# 5 x 3 outputs: one output tile for every version; K = 301 = 18 * 16 + 13 (141 = 17 * 8 + 5 for the register-
# blocked versions, slow under the simulator): the last chunk ends inside a K step.
@pytest.mark.parametrize("version,trans_a,trans_b,epilogue,splits,k,kw", [
    ("naive", False, False, "bias", 3, 301, {"block": (4, 2)}),
    ("tiled16", True, False, "bias_relu", 2, 301, {}),
    ("tiled16", False, False, "none", 5, 301, {}),
    ("regblock", False, True, "mask", 3, 141, {}),
    ("regblock128", True, True, "relu", None, 141, {}),  # automatic: SIMULATOR_SPLITS under the simulator
    ("tensor_bf16", True, False, "mask", 2, 75, {}),  # chunks of 64 and 11 (K steps of 32)
], ids=["naive-NN-bias-3", "tiled16-TN-bias_relu-2", "tiled16-NN-none-5", "regblock-NT-mask-3",
        "regblock128-TT-relu-auto", "tensor_bf16-TN-mask-2"])
def test_dense_split_k_matches_the_single_launch(version, trans_a, trans_b, epilogue, splits, k, kw):
    """Split K through the dense launchers: the epilogue (bias, ReLU, mask) applied by the fixed-order sum; the
    result within float32 tolerance of the float64 reference and of the single launch."""
    m, n = 5, 3
    rng = _rng("split", version, trans_a, trans_b, epilogue)
    a, b = _stored(rng, m, n, k, trans_a, trans_b)
    bias, relu, mask = _epilogue_args(rng, m, n, epilogue)
    args = dict(trans_a=trans_a, trans_b=trans_b, bias=_dev_or_none(bias), relu=relu, relu_mask=_dev_or_none(mask),
                **kw)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    outs = {}
    for s in (1, splits):
        outs[s] = _nan((m, n))
        launch = G.DENSE_LAUNCHERS[version](d_a, d_b, outs[s], splits=s, **args)
        assert isinstance(launch, Launch if s == 1 else LaunchGroup)
    used = G.SIMULATOR_SPLITS if splits is None else splits
    assert f"[split {used} x " in launch.launches[0].name and f"[sum {used}]" in launch.launches[1].name
    ref = _ref(version, a, b, trans_a, trans_b, bias, relu, mask)
    single, split = outs[1].copy_to_host(), outs[splits].copy_to_host()
    assert np.isfinite(split).all(), "unwritten (NaN) outputs"
    assert _rel_err(split, ref) < TOL and _rel_err(single, ref) < TOL
    assert _rel_err(split, single) < TOL
    if mask is not None:
        assert np.all(split[mask <= 0] == 0.0)


def test_dense_split_k_default_and_errors():
    a, b = _dev(3, 40), _dev(40, 2)
    assert isinstance(G.gemm_tiled16(a, b, _dev(3, 2), launch=False), Launch)  # splits=1: the single launch
    assert isinstance(G.gemm_tiled16(a, b, _dev(3, 2), splits=np.int64(1), launch=False), Launch)
    for bad in (0, True, 2.0, 70000):
        with pytest.raises(ValueError, match=r"gemm_tiled16: splits must be None or an int in \[1, 65535\]"):
            G.gemm_tiled16(a, b, _dev(3, 2), splits=bad, launch=False)
    # more splits than K steps: fewer chunks (split_k_chunks), none empty
    group = G.gemm_regblock(a, b, _dev(3, 2), splits=9, launch=False)
    assert "[split 5 x 8]" in group.launches[0].name


def test_gemm_splits_rule():
    """policy.gemm_splits: split (None, the automatic count) only an "auto" policy's GEMM whose output tiles fill
    at most a quarter of the SMs over K >= 1024; the H100 shapes of the CNN and the MLP (batch 64)."""
    from gpunn.backends.gpu.policy import POLICIES, gemm_splits, gemm_version

    auto = POLICIES["gpu-im2col"]
    assert auto.gemm == "auto"

    def rule(rows, cols, k, sms=132, policy=auto):
        return gemm_splits(policy, G.output_tiles(gemm_version(policy, rows, cols), rows, cols), k, sms)

    assert rule(64, 10, 4608) is None  # CNN FC forward: 4 tiles of 16x16, each over all of K
    assert rule(64, 4608, 10) == 1 and rule(4608, 10, 64) == 1  # its input and weight gradients
    assert rule(64, 256, 785) == 1  # MLP fc1 (64 tiles: half the SMs), K short
    assert rule(64, 10, 257) == 1  # MLP fc2: few tiles, but K is one chunk's worth
    assert rule(785, 256, 64) == 1 and rule(64, 256, 10) == 1  # MLP backward
    assert rule(64, 10, 4608, sms=1) == 1  # the simulator's 1 SM: nothing splits
    assert rule(64, 10, 4608, policy=POLICIES["gpu-optimized"]) == 1  # a fixed GEMM version: never
    # what the automatic count makes of the FC forward on an H100: 18 chunks of 256, 72 blocks
    assert G.auto_splits(4608, G.output_tiles("tiled16", 64, 10), 132) == 18
    assert G.split_k_chunks(4608, 18, G.VERSIONS["tiled16"].k_step) == (18, 256)
    # a tensor-core variant's products (128x128 tiles): the MLP's fc1 forward in chunks of 64 (13), at most one per
    # SM; its weight gradient (14 tiles over K = 64) whole; few SMs or many tiles: whole
    for fmt in ("tf32", "bf16"):
        tensor = POLICIES[f"gpu-{fmt}"]

        def tensor_rule(rows, cols, k, sms=132, tensor=tensor):
            version = gemm_version(tensor, rows, cols, k)
            return gemm_splits(tensor, G.output_tiles(version, rows, cols), k, sms, version)

        assert gemm_version(tensor, 64, 256, 785) == f"tensor_{fmt}"
        assert tensor_rule(64, 256, 785) == 13 and tensor_rule(64, 256, 785, sms=20) == 10
        assert tensor_rule(785, 256, 64) == 1
        assert tensor_rule(64, 256, 785, sms=4) == 1 and tensor_rule(1024, 1024, 785) == 1


def test_binder_splits_only_where_the_rule_says(monkeypatch):
    """The engine's Binder.gemm passes splits=None where policy.gemm_splits says so (an H100's SM count faked;
    bound only, launch=False: the simulator's automatic count is SIMULATOR_SPLITS)."""
    from gpunn.backends.gpu.layers import Binder
    from gpunn.backends.gpu.policy import POLICIES

    monkeypatch.setattr(G, "multiprocessors", lambda: 132)
    auto = Binder(POLICIES["gpu-im2col"], None, None, 0.01)
    group = auto.gemm(_dev(64, 4608), _dev(4608, 10), _dev(64, 10), bias=_dev(10))
    assert isinstance(group, LaunchGroup) and f"[split {G.SIMULATOR_SPLITS} x " in group.launches[0].name
    assert isinstance(auto.gemm(_dev(64, 257), _dev(257, 10), _dev(64, 10)), Launch)  # MLP fc2
    assert isinstance(auto.gemm(_dev(64, 4608), _dev(64, 10), _dev(4608, 10), trans_a=True), Launch)  # K = 64
    fixed = Binder(POLICIES["gpu-optimized"], None, None, 0.01)
    assert isinstance(fixed.gemm(_dev(64, 4608), _dev(4608, 10), _dev(64, 10), bias=_dev(10)), Launch)
    tensor = Binder(POLICIES["gpu-bf16"], None, None, 0.01)  # the MLP's fc1 forward: its rule's 13 chunks of 64
    group = tensor.gemm(_dev(64, 785), _dev(785, 256), _dev(64, 256))
    assert isinstance(group, LaunchGroup) and "tensor_bf16" in group.launches[0].name
    assert "[split 13 x 64]" in group.launches[0].name


# --------------------------------------------------------------------------------------------- deep-K versions
# The deep-K tiles (gemm/deep.py) have no dense launcher: they run the dense mappings through gemm_mapped. Odd
# shapes across two tiles in each direction, K = 75 (BK 16 or 32: the last K step partly empty).
DEEP = [d.name for d in G.deep.TILES]


def _mapped(version, m, n, k, trans_a, trans_b, epilogue, splits=1, key=()):
    rng = _rng("deep", version, m, n, k, trans_a, trans_b, epilogue, splits, *key)
    a, b = _stored(rng, m, n, k, trans_a, trans_b)
    bias, relu, mask = _epilogue_args(rng, m, n, epilogue)
    aux = next((x for x in (bias, mask) if x is not None), np.zeros(1, np.float32))
    out = _nan((m, n))
    launch = G.gemm_split_k(version, G.GemmProblem(m, n, k), cuda.to_device(a), cuda.to_device(b), out,
                            cuda.to_device(aux), epilogue, a_map="dense_t" if trans_a else "dense",
                            b_map="dense_t" if trans_b else "dense", splits=splits)
    assert isinstance(launch, Launch if splits == 1 else LaunchGroup)
    got = out.copy_to_host()
    assert np.isfinite(got).all(), f"{version}: unwritten (NaN) outputs"
    return _rel_err(got, G.gemm_reference(a, b, trans_a, trans_b, bias, relu, mask))


@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
@pytest.mark.parametrize("version", DEEP)
def test_deep_versions_dense_mappings(version, trans_a, trans_b):
    """Two tiles one way, the second nearly empty: along M where A's load meets the edge (NN: A dense, TT: A
    transposed), along N where B's does (TN: B dense, NT: B transposed); each of the four operand loads meets its
    edge once per version at two blocks, not four."""
    spec = G.VERSIONS[version]
    along_m = trans_a == trans_b
    m, n = (spec.tile[0] + 3, 5) if along_m else (3, spec.tile[1] + 5)
    epilogue = G.EPILOGUES[TRANS.index((trans_a, trans_b)) % len(G.EPILOGUES)]
    assert _mapped(version, m, n, 75, trans_a, trans_b, epilogue) < TOL


@pytest.mark.parametrize("version,splits", [("deep128x32", 2), ("deep128x16", 3), ("deep32x32", 3)])
def test_deep_versions_split_k(version, splits):
    """Chunks of whole 32-deep K steps (K = 75: 2 or 3 chunks, the last one partial), the bias + ReLU and the
    mask epilogues applied by the sum."""
    assert _mapped(version, 7, 5, 75, False, True, "bias_relu", splits) < TOL
    assert _mapped(version, 7, 5, 75, True, False, "mask", splits) < TOL


def test_deep_tile_refuses_shapes_that_do_not_divide():
    with pytest.raises(ValueError, match="DeepTile bad: the tile 256x4, BK 32"):
        G.deep.DeepTile("bad", 256, 4, 32, 4)  # 64 threads cannot take one row of A each


# --------------------------------------------------------------------------------------------- errors
def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype=dtype))


@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_shape_and_dtype_errors(version):
    def call(a, b, out, **kw):
        return G.gemm(a, b, out, version=version, **kw)

    with pytest.raises(ValueError, match=r"inner dimensions"):
        call(_dev(3, 4), _dev(5, 6), _dev(3, 6))
    with pytest.raises(ValueError, match=r"inner dimensions"):  # trans_b makes B (6, 5)
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), trans_b=True)
    with pytest.raises(ValueError, match=r"out must be \(3, 6\)"):
        call(_dev(3, 4), _dev(4, 6), _dev(6, 3))
    with pytest.raises(ValueError, match=r"bias must be \(6,\)"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), bias=_dev(3))
    with pytest.raises(ValueError, match=r"bias must be 1-D"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), bias=_dev(1, 6))
    with pytest.raises(ValueError, match=r"relu_mask must have out's shape \(3, 6\)"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), relu_mask=_dev(6, 3))
    with pytest.raises(ValueError, match=r"relu_mask .*excludes bias and relu"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), relu_mask=_dev(3, 6), relu=True)
    with pytest.raises(ValueError, match=r"relu_mask .*excludes bias and relu"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), relu_mask=_dev(3, 6), bias=_dev(6))
    with pytest.raises(ValueError, match=r"a must be 2-D"):
        call(_dev(3, 4, 1), _dev(4, 6), _dev(3, 6))
    with pytest.raises(ValueError, match=r"a must be float32"):
        call(_dev(3, 4, dtype=np.float64), _dev(4, 6), _dev(3, 6))
    with pytest.raises(ValueError, match=r"out must be float32"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6, dtype=np.float16))
    with pytest.raises(ValueError, match=r"relu_mask must be float32"):
        call(_dev(3, 4), _dev(4, 6), _dev(3, 6), relu_mask=_dev(3, 6, dtype=np.int32))
    with pytest.raises(ValueError, match=r"b is a host NumPy array"):
        call(_dev(3, 4), np.zeros((4, 6), np.float32), _dev(3, 6))


@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
@pytest.mark.parametrize("m,n,k", [(0, 6, 4), (3, 0, 4), (3, 6, 0)])
def test_gemm_zero_sized(version, m, n, k):
    with pytest.raises(ValueError, match=r"zero-sized"):
        G.gemm(_dev(m, k), _dev(k, n), _dev(m, n), version=version)


def test_unknown_version_and_bad_blocks():
    with pytest.raises(ValueError, match=r"naive.*regblock.*regblock128.*tiled16"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="cublas")
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="tiled16", block=(8, 8))
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="regblock", block=128)
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="regblock128", block=(16, 8))
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="naive", block=(64, 32))
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), version="naive", block=256)


def test_gemm_mapped_entry_and_its_errors():
    """The lower-level entry runs the dense mappings like the launchers, and names what it refuses."""
    rng = _rng("mapped")
    a, b = _stored(rng, 9, 6, 5, True, False)
    out = _nan((9, 6))
    G.gemm_mapped("regblock", G.GemmProblem(9, 6, 5), cuda.to_device(a), cuda.to_device(b), out,
                  cuda.to_device(np.zeros(1, np.float32)), "relu", a_map="dense_t")
    assert _rel_err(out.copy_to_host(), G.gemm_reference(a, b, trans_a=True, relu=True)) < TOL
    args = (G.GemmProblem(2, 2, 2), _dev(2, 2), _dev(2, 2), _dev(2, 2), _dev(1))
    with pytest.raises(ValueError, match=r"unknown A mapping 'im2row'"):
        G.gemm_mapped("naive", *args, a_map="im2row")
    with pytest.raises(ValueError, match=r"unknown B mapping"):
        G.gemm_mapped("naive", *args, b_map="im2col")
    with pytest.raises(ValueError, match=r"unknown store"):
        G.gemm_mapped("naive", *args, store="nhwc")
    with pytest.raises(ValueError, match=r"unknown epilogue 'gelu'"):
        G.gemm_mapped("naive", *args, epilogue="gelu")
    with pytest.raises(ValueError, match=r"unknown version 'cublas'"):
        G.gemm_mapped("cublas", *args)
    with pytest.raises(ValueError, match=r"M, N, K = 0, 2, 2"):
        G.GemmProblem(0, 2, 2)
    assert G.GemmProblem(3, 4, 5, (7, -1)).dims == (3, 4, 5, 7, 2**32 - 1)  # geometry mod 2^32


# --------------------------------------------------------------------------------------------- real GPU
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_gpu_sizes(version):
    for trans_a, trans_b in TRANS:
        for epilogue in G.EPILOGUES:
            err = _run(version, 257, 129, 301, trans_a, trans_b, epilogue, key=("gpu",))
            assert err < TOL, (version, trans_a, trans_b, epilogue, err)
    for trans_a, trans_b in [(False, False), (True, True)]:
        err = _run(version, 1024, 1024, 1024, trans_a, trans_b, "bias_relu", key=("gpu",))
        assert err < TOL, (version, trans_a, trans_b, err)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("version", list(G.DENSE_LAUNCHERS))
def test_gemm_gpu_strided_mlp_shapes(version):
    """The MLP's views at real size: X = batch[:, :784] of a (64, 785) array, W1 (784, 256) in a flat
    buffer; dH = dZ @ W2^T masked by H."""
    rng = _rng("gpu-mlp", version)
    batch = rng.standard_normal((64, 785)).astype(np.float32)
    params = rng.standard_normal(784 * 256 + 256 * 10 + 7).astype(np.float32)
    x = cuda.to_device(batch)[:, :784]
    w1 = cuda.to_device(params)[:784 * 256].reshape(784, 256)
    w2 = cuda.to_device(params)[784 * 256 : 784 * 256 + 2560].reshape(256, 10)
    h = cuda.device_array((64, 256), np.float32)
    G.gemm(x, w1, h, version=version, relu=True)
    h_ref = _ref(version, batch[:, :784], params[:784 * 256].reshape(784, 256), relu=True)
    assert _rel_err(h.copy_to_host(), h_ref) < TOL
    dz = rng.standard_normal((64, 10)).astype(np.float32)
    dh = _nan((64, 256))
    G.gemm(cuda.to_device(dz), w2, dh, version=version, trans_b=True, relu_mask=h)
    ref = _ref(version, dz, params[784 * 256 : 784 * 256 + 2560].reshape(256, 10), trans_b=True,
               relu_mask=h.copy_to_host())
    assert _rel_err(dh.copy_to_host(), ref) < TOL


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
def test_dense_split_k_gpu_cnn_fc_forward():
    """The CNN's FC forward, 64 x 10 over K = 4608 with its bias, split with the device's automatic count: the
    same as one launch within float32 tolerance, bit-identical run to run."""
    rng = _rng("gpu-split-fc")
    x, w = rng.standard_normal((64, 4608)).astype(np.float32), rng.standard_normal((4608, 10)).astype(np.float32)
    bias = rng.standard_normal(10).astype(np.float32)
    d_x, d_w, d_bias = cuda.to_device(x), cuda.to_device(w), cuda.to_device(bias)
    for version in G.DENSE_LAUNCHERS:
        ref = _ref(version, x, w, bias=bias)
        outs = []
        for splits in (1, None, None):
            out = _nan((64, 10))
            G.DENSE_LAUNCHERS[version](d_x, d_w, out, bias=d_bias, splits=splits)
            outs.append(out.copy_to_host())
        np.testing.assert_array_equal(outs[1], outs[2])
        assert _rel_err(outs[1], ref) < 1e-4 and _rel_err(outs[1], outs[0]) < 1e-4, version  # K = 4608


@pytest.mark.gpu
@pytest.mark.skipif(bool(config.ENABLE_CUDASIM), reason="the direct launch path exists only on a real GPU")
def test_gpu_direct_launch_matches_the_ordinary_call():
    """After its first call a bound launch goes straight to the driver with prepared arguments: it must read
    the live buffers exactly as numba's ordinary call does."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((257, 301)).astype(np.float32), rng.standard_normal((301, 129)).astype(np.float32)
    bias = rng.standard_normal(129).astype(np.float32)
    d_a, d_b, d_bias = cuda.to_device(a), cuda.to_device(b), cuda.to_device(bias)
    out = cuda.to_device(np.full((257, 129), np.nan, np.float32))
    bound = G.gemm_regblock128(d_a, d_b, out, bias=d_bias, relu=True, launch=False)
    bound()
    first = out.copy_to_host()
    assert bound.direct
    assert bound.packed  # one cuLaunchKernel on the parameter block packed at the first call
    a2 = rng.standard_normal((257, 301)).astype(np.float32)
    d_a.copy_to_device(a2)
    out.copy_to_device(np.full((257, 129), np.nan, np.float32))
    bound()  # direct path, new contents of the same buffers
    cuda.synchronize()
    for got, a_used in ((first, a), (out.copy_to_host(), a2)):
        ref = G.gemm_reference(a_used, b, bias=bias, relu=True)
        assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-5
    ordinary = cuda.to_device(np.full((257, 129), np.nan, np.float32))
    G.gemm_regblock128(d_a, d_b, ordinary, bias=d_bias, relu=True)
    np.testing.assert_array_equal(ordinary.copy_to_host(), out.copy_to_host())


@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
def test_coalesced128_is_regblock128_bit_for_bit(trans_a, trans_b):
    """coalesced128 changes which thread loads which element and which thread owns which outputs, not a sum: its
    results are regblock128's bits (odd shapes over two tiles each way, three K steps and a partial one)."""
    m, n, k = 131, 133, 29
    rng = _rng("coalesced", trans_a, trans_b)
    a, b = _stored(rng, m, n, k, trans_a, trans_b)
    got = {}
    for version in ("regblock128", "coalesced128"):
        out = _nan((m, n))
        G.gemm(cuda.to_device(a), cuda.to_device(b), out, version=version, trans_a=trans_a, trans_b=trans_b)
        got[version] = out.copy_to_host()
    assert np.isfinite(got["coalesced128"]).all()
    assert np.array_equal(got["regblock128"], got["coalesced128"])
    assert _rel_err(got["coalesced128"], G.gemm_reference(a, b, trans_a, trans_b)) < TOL


def test_a_version_for_other_gpus_is_refused_with_one_line(monkeypatch):
    """wgmma exists on compute capability 9.0 only: elsewhere its versions say so before compiling anything."""
    from numba import cuda as numba_cuda

    from gpunn import device
    from gpunn.kernels.gemm import versions

    class Ampere:
        compute_capability = (8, 0)

    monkeypatch.setattr(device, "simulator_enabled", lambda: False)
    monkeypatch.setattr(numba_cuda, "get_current_device", lambda: Ampere)
    with pytest.raises(ValueError, match=r"gemm_wgmma_bf16: version 'wgmma_bf16' needs a GPU of compute capability "
                                         r"9.0 \(this one is 8.0\); choose another version, e.g. 'tensor_bf16'"):
        versions.check_device(G.VERSIONS["wgmma_bf16"], "gemm_wgmma_bf16")
    versions.check_device(G.VERSIONS["tensor_bf16"], "gemm_tensor_bf16")  # runs from 8.0 on

    class Turing:  # a T4, the papers' GPU: no TF32 or BF16 MMA
        compute_capability = (7, 5)

    monkeypatch.setattr(numba_cuda, "get_current_device", lambda: Turing)
    with pytest.raises(ValueError, match=r"gemm_tensor_tf32: version 'tensor_tf32' needs a GPU of compute capability "
                                         r"8.0 or newer for its tensor-core MMAs \(this one is 7.5\); choose a "
                                         r"float32 version, e.g. 'regblock'"):
        versions.check_device(G.VERSIONS["tensor_tf32"], "gemm_tensor_tf32")
    versions.check_device(G.VERSIONS["regblock"], "gemm_regblock")  # the float32 versions run everywhere
