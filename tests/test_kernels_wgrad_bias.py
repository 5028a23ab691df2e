"""Weight and bias gradients in one pass (kernels/conv/wgrad_bias.py, wgrad_direct.py) against the float64
references, and the engine's bias gradient "made by the weight-gradient pass" (policy.BIAS_WITH_WEIGHT) against
cpu-numpy.

Tiny odd shapes under the simulator (odd batch, channels, maps; padding 0 and 1), NaN-poisoned dw and db, fresh
random inputs per test; several split counts, so that the lane sum's fixed tree sees lanes with 0, 1 and more
splits. The ``gpu``-marked test repeats the checks at the CNN's shapes with the automatic split counts."""

import dataclasses
import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.backends.gpu.engine import _launches
from gpunn.backends.gpu.layers import ConvPoolStage
from gpunn.backends.gpu.policy import (
    BIAS_WITH_WEIGHT,
    POLICIES,
    WGRAD_WITH_BIAS,
    conv_version,
    pool_bias_with_weight,
)
from gpunn.kernels import conv
from gpunn.kernels.conv import pooled as P
from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import wgrad_bias as WB
from gpunn.kernels.conv import wgrad_direct as WD
from gpunn.nn import build_model
from gpunn.seeding import batch_order

TOL = 1e-5
CASES = [  # N, Cin, Cout, H, W, k, padding
    (3, 3, 5, 9, 10, 3, 0),  # conv output 7x8: an odd row the pool drops
    (3, 2, 5, 9, 9, 3, 1),  # 9x9
    (5, 1, 3, 7, 8, 3, 0),  # one input channel (the CNN's conv1)
]


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


def _pooled_inputs(case, seed):
    n, cin, cout, h, w, k, p = case
    rng = _rng(case, seed)
    x, wt, b = _rand(rng, n, cin, h, w), _rand(rng, cout, cin, k, k), _rand(rng, cout)
    oh, ow = h + 2 * p - k + 1, w + 2 * p - k + 1
    _, route = P.conv_relu_pool_forward_ref(x, wt, b, p)
    dpool = _rand(rng, *route.shape)
    dy = P.pooled_grad_ref(dpool, route, (n, cout, oh, ow))
    assert (route == P.ROUTE_NONE).any() and (route != P.ROUTE_NONE).any()
    return x, dpool, route, dy, wt.shape


def _pool_pass(x, dpool, route, w_shape, p, launcher=WB.conv_backward_weight_bias_pool, **kw):
    dw, db = _nan(w_shape), _nan(w_shape[0])
    group = launcher(cuda.to_device(x), cuda.to_device(dpool), cuda.to_device(route), dw, db, p, **kw)
    assert len(group.launches) == 2
    return dw.copy_to_host(), db.copy_to_host()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version,splits", [(None, 1), ("deep32x32", 3), ("narrow", 2), ("regblock", 5),
                                            ("deep32x32", 40)])
def test_pooled_weight_and_bias_gradients(case, version, splits):
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "pool")
    k, p = case[-2], case[-1]
    dw, db = _pool_pass(x, dpool, route, w_shape, p, version=version, splits=splits)
    assert _rel_err(dw, R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert _rel_err(db, R.conv_bias_grad_ref(dy)) < TOL


TWO_PASSES = (2, 45, 9, 8, 7, 3, 1)  # 3 x 45 items: two passes of the block's 128 threads (each restaging)


# every band and split layout on the three small cases; the two passes (3 x 45 channels: 10 s a layout under the
# simulator) in the default layout only, where it runs on the GPU
@pytest.mark.parametrize("case,rows,per", [pytest.param(case, rows, per, id=f"{rows}-{per}-case{i}")
                                           for i, case in enumerate(CASES)
                                           for rows, per in [(None, None), (1, 2), (2, 1), (3, 5)]]
                         + [pytest.param(TWO_PASSES, None, None, id="None-None-two-passes")])
def test_pooled_weight_and_bias_gradients_by_direct_convolution(case, rows, per):
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "direct")
    k, p = case[-2], case[-1]
    dw, db = _pool_pass(x, dpool, route, w_shape, p, WD.conv_backward_weight_bias_pool_direct, rows=rows, per=per)
    assert _rel_err(dw, R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert _rel_err(db, R.conv_bias_grad_ref(dy)) < TOL


@pytest.mark.parametrize("co_t", [1, 3, 8])
def test_direct_pass_with_other_channels_per_thread(co_t):
    """co_t output channels per thread (5 outputs: a partial last group each time), the same sums; out of range
    refused in one line."""
    n, cin, cout, h, w, k, p = case = CASES[1]
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "co_t")
    dw, db = _pool_pass(x, dpool, route, w_shape, p, WD.conv_backward_weight_bias_pool_direct, co_t=co_t)
    assert _rel_err(dw, R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert _rel_err(db, R.conv_bias_grad_ref(dy)) < TOL
    if co_t == 8:
        with pytest.raises(ValueError, match="co_t must be an int in"):
            _pool_pass(x, dpool, route, w_shape, p, WD.conv_backward_weight_bias_pool_direct, co_t=9)


def test_direct_pass_in_output_channel_groups(monkeypatch):
    """Output channels whose gradient band does not fit GRAD_SMEM go to blocks of their own (grid z): 9 channels in
    groups of 4, 4 and 1 (GRAD_SMEM shrunk to one group's band of a row), the same sums."""
    n, cin, cout, h, w, k, p = case = (2, 2, 9, 5, 6, 3, 1)
    monkeypatch.setattr(WD, "GRAD_SMEM", WD.CO_T * (w // 2))
    assert WD.direct_layout(cin, cout, h // 2, w // 2, k) == 1 and WD.cout_block(cout, h // 2, w // 2, 1) == WD.CO_T
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "groups")
    dw, db = _pool_pass(x, dpool, route, w_shape, p, WD.conv_backward_weight_bias_pool_direct)
    assert _rel_err(dw, R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert _rel_err(db, R.conv_bias_grad_ref(dy)) < TOL
    # the default channels per thread: CO_T_GROUPS where the channels take more than one block, else CO_T
    args = [cuda.to_device(a) for a in (x, dpool, route)] + [_nan(w_shape), _nan(w_shape[0]), p]
    name = WD.conv_backward_weight_bias_pool_direct(*args, launch=False).launches[0].name
    assert f"cot{WD.CO_T_GROUPS}]" in name and WD.CO_T_GROUPS != WD.CO_T, name
    monkeypatch.setattr(WD, "GRAD_SMEM", 2048)
    name = WD.conv_backward_weight_bias_pool_direct(*args, launch=False).launches[0].name
    assert f"cob{-(-cout // WD.CO_T) * WD.CO_T},cot{WD.CO_T}]" in name, name


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block,splits", [(32, 1), (64, 2), (32, 5)])
def test_block_reduction_weight_and_bias_gradients(case, block, splits):
    n, cin, cout, h, w, k, p = case
    rng = _rng(case, "block", block, splits)
    x = _rand(rng, n, cin, h, w)
    dy = _rand(rng, n, cout, h + 2 * p - k + 1, w + 2 * p - k + 1)
    dw, db = _nan((cout, cin, k, k)), _nan(cout)
    group = WB.conv_backward_weight_bias_deterministic(cuda.to_device(x), cuda.to_device(dy), dw, db, p, block=block,
                                                       splits=splits)
    assert len(group.launches) == 2
    assert _rel_err(dw.copy_to_host(), R.conv_backward_weight_ref(x, dy, k, p)) < TOL
    assert _rel_err(db.copy_to_host(), R.conv_bias_grad_ref(dy)) < TOL


def test_both_passes_repeat_bit_for_bit():
    case = CASES[1]
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "bits")
    runs = [_pool_pass(x, dpool, route, w_shape, case[-1], splits=3) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    runs = [_pool_pass(x, dpool, route, w_shape, case[-1], WD.conv_backward_weight_bias_pool_direct, rows=1)
            for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    results = []
    for _ in range(2):
        dw, db = _nan(w_shape), _nan(w_shape[0])
        WB.conv_backward_weight_bias_deterministic(cuda.to_device(x), cuda.to_device(dy.astype(np.float32)), dw, db,
                                                   case[-1], block=32, splits=3)
        results.append((dw.copy_to_host(), db.copy_to_host()))
    assert all(np.array_equal(a, b) for a, b in zip(*results))


def test_bad_arguments_are_refused():
    n, cin, cout, h, w, k, p = CASES[0]
    x = cuda.to_device(np.zeros((n, cin, h, w), np.float32))
    dy = cuda.to_device(np.zeros((n, cout, h - 2, w - 2), np.float32))
    dpool = cuda.to_device(np.zeros((n, cout, 3, 4), np.float32))
    route = cuda.to_device(np.zeros((n, cout, 3, 4), np.int8))
    dw = _nan((cout, cin, k, k))
    with pytest.raises(ValueError, match="db must have shape"):
        WB.conv_backward_weight_bias_pool(x, dpool, route, dw, _nan(cout + 1), p)
    with pytest.raises(ValueError, match="db"):
        WB.conv_backward_weight_bias_deterministic(x, dy, dw, _nan((cout, 1)), p)
    with pytest.raises(ValueError, match="splits"):
        WB.conv_backward_weight_bias_pool(x, dpool, route, dw, _nan(cout), p, splits=0)
    direct = WD.conv_backward_weight_bias_pool_direct
    with pytest.raises(ValueError, match="rows must be a positive int"):
        direct(x, dpool, route, dw, _nan(cout), p, rows=0)
    with pytest.raises(ValueError, match="db must have shape"):
        direct(x, dpool, route, dw, _nan(cout + 1), p)
    wide = cuda.to_device(np.zeros((n, 600, h, w), np.float32))  # 600 channels x a band of 6 x 10: too large
    with pytest.raises(ValueError, match="do not fit the 6144-float staged band"):
        direct(wide, dpool, route, _nan((cout, 600, k, k)), _nan(cout), p)


# ---- the engine: gpu-graph's CNN (its eager twin: the simulator has no graphs)

TINY = {"in_channels": 1, "image_size": 9, "channels": (3, 5), "classes": 4}


def _policy(bias_grad="auto"):
    graph = POLICIES["gpu-graph"]
    return dataclasses.replace(graph, name=f"gpu-graph-eager-{bias_grad}", graphs=False,
                               conv={**graph.conv, "bias_grad": bias_grad})


def _engine(policy, lr=0.2, seed=3):
    from gpunn.backends.gpu.engine import GpuEngine

    return GpuEngine(build_model("cnn", seed=seed, **TINY), "cnn", lr, policy)


def _cpu(lr=0.2, seed=3):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    return CpuNumpyBackend(build_model("cnn", seed=seed, **TINY), "cnn", lr)


def _data(n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 1, TINY["image_size"], TINY["image_size"]), dtype=np.float32)
    return x, rng.integers(0, TINY["classes"], n)


def test_the_policy_chooses_the_bias_with_the_weight_gradient():
    graph, im2col = POLICIES["gpu-graph"], POLICIES["gpu-im2col"]
    assert conv_version(graph, "bias_grad", 1, 16, 3, 0, (28, 28)) == BIAS_WITH_WEIGHT  # cnn conv1: deterministic
    assert conv_version(graph, "bias_grad", 256, 3, 3, 1, (32, 32)) == "split"  # staged makes no bias
    assert conv_version(graph, "bias_grad", 256, 3, 3, 1, (512, 512), up=True) == "split"  # upsampled twin
    assert conv_version(graph, "bias_grad", 128, 128, 3, 0, (8, 8)) == "split"  # implicit GEMM
    assert conv_version(graph, "bias_grad", 128, 128, 3, 1, (8, 8)) == BIAS_WITH_WEIGHT  # Winograd (its option on)
    assert conv_version(im2col, "bias_grad", 1, 16, 3, 0, (28, 28)) == "split"  # other variants: unchanged
    assert pool_bias_with_weight(graph, 16, 32, 3, (12, 12)) == "direct"  # cnn conv2
    assert pool_bias_with_weight(graph, 16, 32, 3) == "gemm"  # no pooled size given
    assert pool_bias_with_weight(graph, 600, 32, 3, (12, 12)) == "gemm"  # the band does not fit
    assert pool_bias_with_weight(graph, 3, 256, 3, (16, 16)) == "direct"  # ae conv1: in output-channel groups
    assert pool_bias_with_weight(graph, 3, 256, 3) is None  # ... its own bias launches where the size is unknown
    assert pool_bias_with_weight(graph, 600, 256, 3, (12, 12)) is None  # ... or the band does not fit
    assert pool_bias_with_weight(im2col, 16, 32, 3, (12, 12)) is None
    for name in WGRAD_WITH_BIAS:  # the policy's list is what the version table says
        assert conv.VERSIONS["backward_weight"][name].with_bias is not None
    # of the upsampled twins only Winograd's makes the bias, chosen where policy.AUTO_WINOGRAD_BIAS is on
    assert {n for n, v in conv.UP_VERSIONS["backward_weight"].items() if v.with_bias} == {"winograd"}
    assert conv.VERSIONS["backward_weight"]["winograd"].with_bias is not None


def test_the_winograd_bias_option(monkeypatch):
    """policy.AUTO_WINOGRAD_BIAS: off, a Winograd conv's bias gradient is the split reduction; on, made by its
    weight gradient, plain and upsampled; no other conv's choice moves."""
    from gpunn.backends.gpu import policy as P

    graph = POLICIES["gpu-graph"]
    cases = [((256, 128, 3, 1, (16, 16)), False), ((128, 256, 3, 1, (16, 16)), True),
             ((256, 3, 3, 1, (32, 32)), True), ((1, 16, 3, 0, (28, 28)), False)]
    monkeypatch.setattr(P, "AUTO_WINOGRAD_BIAS", False)
    before = [conv_version(graph, "bias_grad", *args, up=up) for args, up in cases]
    assert before == ["split", "split", "split", BIAS_WITH_WEIGHT]
    monkeypatch.setattr(P, "AUTO_WINOGRAD_BIAS", True)
    after = [conv_version(graph, "bias_grad", *args, up=up) for args, up in cases]
    assert after == [BIAS_WITH_WEIGHT, BIAS_WITH_WEIGHT, "split", BIAS_WITH_WEIGHT]


def _names(engine):
    program = engine._step_program(2, (1, TINY["image_size"], TINY["image_size"]))
    return [launch.name for launch in _launches(program.backward)]


def test_the_graph_step_has_no_bias_launches():
    names = _names(_engine(_policy()))
    assert not any("bias_grad" in name for name in names), names
    assert any(name.startswith("conv_backward_weight_bias_deterministic[") for name in names)
    assert any(name.startswith("conv_backward_weight_bias_pool_direct[") for name in names)
    split = _names(_engine(_policy("split")))
    assert sum("bias_grad" in name for name in split) == 4  # two launches per bias gradient ...
    assert len(names) < len(split)  # ... gone (conv1's weight gradient: 1 launch -> 2 under the simulator's 1 split)
    assert any(isinstance(s, ConvPoolStage) for s in _engine(_policy()).train_stages)


@pytest.mark.parametrize("pooled_pass", ["direct", "gemm"])
def test_gradients_match_cpu_and_the_separate_bias_launches(pooled_pass, monkeypatch):
    from gpunn.backends.gpu import policy

    monkeypatch.setattr(policy, "AUTO_POOL_WGRAD_BIAS", pooled_pass)
    x, y = _data(3)
    ref = _cpu().gradients(x, y)
    engine = _engine(_policy())
    assert any(f"conv_backward_weight_bias_pool{'_direct' if pooled_pass == 'direct' else ''}[" in name
               for name in _names(engine))
    got = engine.gradients(x, y)
    assert np.abs(ref).max() > 0
    assert _rel_err(got, ref) < 1e-5
    assert _rel_err(got, _engine(_policy("split")).gradients(x, y)) < 1e-5


def test_short_epoch_matches_cpu_and_repeats_bit_for_bit():
    x, y = _data(7)
    order = batch_order(5, 0, len(x))
    ref = _cpu()
    ref.load_train_data(x, y)
    ref_result = ref.train_epoch(order, 2)
    runs = []
    for _ in range(2):
        gpu = _engine(_policy())
        gpu.load_train_data(x, y)
        gpu.warm_up({2, 1})
        result = gpu.train_epoch(order, 2)
        assert result.steps == ref_result.steps == 4
        assert result.loss == pytest.approx(ref_result.loss, rel=1e-5)
        runs.append(gpu.parameters().copy())
    assert _rel_err(runs[0], ref.parameters()) < 1e-4
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.gpu
def test_cnn_shapes_on_the_gpu():
    case = (64, 16, 32, 26, 26, 3, 0)
    x, dpool, route, dy, w_shape = _pooled_inputs(case, "gpu")
    for launcher in (WB.conv_backward_weight_bias_pool, WD.conv_backward_weight_bias_pool_direct):
        dw, db = _pool_pass(x, dpool, route, w_shape, 0, launcher)
        assert _rel_err(dw, R.conv_backward_weight_ref(x, dy, 3, 0)) < 1e-4
        assert _rel_err(db, R.conv_bias_grad_ref(dy)) < 1e-4
        assert _pool_pass(x, dpool, route, w_shape, 0, launcher)[0].tobytes() == dw.tobytes()
    rng = _rng("gpu-conv1")
    x1, dy1 = _rand(rng, 64, 1, 28, 28), _rand(rng, 64, 16, 26, 26)
    dw1, db1 = _nan((16, 1, 3, 3)), _nan(16)
    WB.conv_backward_weight_bias_deterministic(cuda.to_device(x1), cuda.to_device(dy1), dw1, db1, 0)
    assert _rel_err(dw1.copy_to_host(), R.conv_backward_weight_ref(x1, dy1, 3, 0)) < 1e-4
    assert _rel_err(db1.copy_to_host(), R.conv_bias_grad_ref(dy1)) < 1e-4
