"""The fused classifier head (gpunn.kernels.linear_head) against its float64 reference at odd shapes, outputs
poisoned with NaN; and in the engine (Policy.head "fused", layers.LinearHeadStage): the CNN under gpu-graph's
policy (graphs off: the simulator has none) against cpu-numpy and against the separate head stages, a short epoch
with a partial last batch, two runs giving the same bits. Real-GPU tests (-m gpu) run the CNN's shapes."""

import dataclasses

import numpy as np
import pytest
from numba import cuda

from gpunn.backends.gpu.engine import _launches
from gpunn.backends.gpu.layers import LinearHeadStage, LinearStage, plan
from gpunn.backends.gpu.policy import FUSED_HEAD_MAX_CLASSES, POLICIES, Policy, head_fused
from gpunn.kernels import linear_head
from gpunn.kernels.linear_head import head_backward, head_forward, head_ref
from gpunn.nn import build_model
from gpunn.seeding import batch_order

CNN = {"in_channels": 1, "image_size": 9, "channels": (2, 3), "classes": 7}


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def problem(rows, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w = (rng.standard_normal((features, classes)) / np.sqrt(features)).astype(np.float32)
    b = rng.standard_normal(classes).astype(np.float32)
    labels = rng.integers(0, classes, rows).astype(np.int32)
    mask = rng.standard_normal((rows, features)).astype(np.float32)
    return x, w, b, labels, mask


# ---- kernels


@pytest.mark.parametrize(("rows", "features", "classes", "block", "backward_block"),
                         [(11, 67, 7, 16, 32), (7, 67, 7, 8, 64), (70, 45, 3, 32, 32), (70, 31, 2, 16, 64)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_head_matches_the_reference(rows, features, classes, block, backward_block, reduction):
    x, w, b, labels, mask = problem(rows, features, classes)
    logits, dlogits, losses = poisoned((rows, classes)), poisoned((rows, classes)), poisoned(rows)
    head_forward(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), cuda.to_device(labels), logits, dlogits,
                 losses, block=block, reduction=reduction)
    dx, dw, db = poisoned((rows, features)), poisoned((features, classes)), poisoned(classes)
    head_backward(cuda.to_device(x), dlogits, cuda.to_device(w), dx, dw, db, relu_mask=cuda.to_device(mask),
                  block=backward_block)  # 70 rows: several row tiles; 67 features: a partial last block
    ref = head_ref(x, w, b, labels, reduction, relu_mask=mask)
    for name, out, expected in zip(("logits", "dlogits", "losses", "dx", "dw", "db"),
                                   (logits, dlogits, losses, dx, dw, db), ref):
        assert rel_err(out.copy_to_host(), expected) < 1e-5, name
    assert np.any(dx.copy_to_host() == 0) and np.any(dx.copy_to_host() != 0)  # the mask zeroed some, not all


@pytest.mark.parametrize(("rows", "features", "splits"), [(11, 67, 3), (7, 13, 13), (17, 67, 2)])
def test_split_forward_matches_the_reference_and_repeats_its_bits(rows, features, splits):
    """K ranges with a shorter last one (67 in 3 and 2), and as many ranges as features (one each: 13, not 67, as
    the grid is splits x row tiles of 256 threads; the kernel's code is the same at any K); rows below and above one
    block's SPLIT_ROWS."""
    classes = 7
    x, w, b, labels, _ = problem(rows, features, classes, seed=rows)
    outs = poisoned((rows, classes)), poisoned((rows, classes)), poisoned(rows)
    launch = head_forward(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), cuda.to_device(labels), *outs,
                          splits=splits, reduction="sum", launch=False)
    launch()
    first = [a.copy_to_host() for a in outs]
    launch()  # the arrival counts were zeroed by the first launch's last blocks
    for name, out, before, expected in zip(("logits", "dlogits", "losses"), outs, first,
                                           head_ref(x, w, b, labels, "sum")):
        assert rel_err(out.copy_to_host(), expected) < 1e-5, name
        assert np.array_equal(out.copy_to_host(), before), name


def test_head_writes_the_epoch_buffer_at_the_steps_position_and_backward_without_dx():
    rows, features, classes, stride = 7, 30, 5, 9
    x, w, b, labels, _ = problem(rows, features, classes, seed=4)
    xd, wd = cuda.to_device(x), cuda.to_device(w)
    losses = poisoned(4 * stride)
    counter = cuda.to_device(np.array([5], np.int32))  # step 5: rows from (5 * 9) % 36 = 9
    dlogits = poisoned((rows, classes))
    head_forward(xd, wd, cuda.to_device(b), cuda.to_device(labels), poisoned((rows, classes)), dlogits, losses,
                 block=8, counter=counter, stride=stride)
    _, ref_dl, ref_losses, _, ref_dw, ref_db = head_ref(x, w, b, labels)
    got = losses.copy_to_host()
    assert rel_err(got[9:9 + rows], ref_losses) < 1e-5
    assert np.isnan(np.delete(got, np.arange(9, 9 + rows))).all()  # nothing else written
    dw, db = poisoned((features, classes)), poisoned(classes)
    head_backward(xd, dlogits, wd, None, dw, db, block=32)
    assert rel_err(dw.copy_to_host(), ref_dw) < 1e-5 and rel_err(db.copy_to_host(), ref_db) < 1e-5


def test_head_refuses_bad_arguments_with_one_clear_error():
    x, w, b, labels, _ = problem(3, 5, 4)
    d = cuda.to_device
    with pytest.raises(ValueError, match="head_forward: classes must be in"):
        head_forward(d(x), d(np.zeros((5, 40), np.float32)), d(np.zeros(40, np.float32)), d(labels),
                     poisoned((3, 40)), poisoned((3, 40)), poisoned(3), launch=False)
    with pytest.raises(ValueError, match="head_forward: block x classes must be at most 8192"):
        head_forward(d(x), d(np.zeros((5, 16), np.float32)), d(np.zeros(16, np.float32)), d(labels),
                     poisoned((3, 16)), poisoned((3, 16)), poisoned(3), block=1024, launch=False)
    with pytest.raises(ValueError, match=r"head_forward: splits must be an int in \[1, in_features = 5\]"):
        head_forward(d(x), d(w), d(b), d(labels), poisoned((3, 4)), poisoned((3, 4)), poisoned(3), splits=6,
                     launch=False)
    with pytest.raises(ValueError, match="head_forward: shapes do not fit"):
        head_forward(d(x), d(w), d(b), d(labels), poisoned((3, 4)), poisoned((2, 4)), poisoned(3), launch=False)
    with pytest.raises(ValueError, match="head_backward: block must be at least the class count"):
        head_backward(d(x), poisoned((3, 4)), d(w), None, poisoned((5, 4)), poisoned(4), block=2, launch=False)
    with pytest.raises(ValueError, match="head_backward: block must be a multiple of 32"):
        head_backward(d(x), poisoned((3, 4)), d(w), None, poisoned((5, 4)), poisoned(4), block=48, launch=False)
    with pytest.raises(ValueError, match="head_backward: relu_mask is the ReLU backward of dx"):
        head_backward(d(x), poisoned((3, 4)), d(w), None, poisoned((5, 4)), poisoned(4), relu_mask=d(x), launch=False)
    assert linear_head.MAX_CLASSES == FUSED_HEAD_MAX_CLASSES


# ---- the engine


def graph_policy(head):
    return dataclasses.replace(POLICIES["gpu-graph"], name=f"gpu-graph-eager-head-{head}", graphs=False, head=head)


def engine(head, seed=3, lr=0.1):
    from gpunn.backends.gpu.engine import GpuEngine

    return GpuEngine(build_model("cnn", seed=seed, **CNN), "cnn", lr, graph_policy(head))


def cpu(seed=3, lr=0.1):
    from gpunn.backends.cpu_numpy import CpuNumpyBackend

    return CpuNumpyBackend(build_model("cnn", seed=seed, **CNN), "cnn", lr)


def images(n, seed=1):
    rng = np.random.default_rng(seed)
    side = CNN["image_size"]
    return rng.random((n, 1, side, side), dtype=np.float32), rng.integers(0, CNN["classes"], n)


def test_plan_fuses_the_head_where_the_policy_says():
    cnn = build_model("cnn", seed=0, in_channels=1, image_size=28, channels=(16, 32), classes=10).layers
    stages = plan(cnn, POLICIES["gpu-graph"], fold=True, loss="softmax_ce")
    assert isinstance(stages[-1], LinearHeadStage) and not stages[-1].fold
    assert repr(stages[-1]) == "Linear(4608, 10) + softmax_ce"
    for kwargs in ({"fold": False, "loss": "softmax_ce"}, {"fold": True}, {"fold": True, "loss": "mse"}):
        assert not any(isinstance(s, LinearHeadStage) for s in plan(cnn, POLICIES["gpu-graph"], **kwargs)), kwargs
    for name in ("gpu-im2col", "gpu-fused", "gpu-optimized", "gpu-naive"):
        last = plan(cnn, POLICIES[name], fold=True, loss="softmax_ce")[-1]
        assert type(last) is LinearStage, name
    assert not head_fused(POLICIES["gpu-graph"], "softmax_ce", FUSED_HEAD_MAX_CLASSES + 1)
    mlp = build_model("mlp", in_features=13, hidden=7, classes=5).layers
    stages = plan(mlp, graph_policy("fused"), fold=True, loss="softmax_ce")
    assert stages[1].fold and stages[1].relu and isinstance(stages[2], LinearHeadStage)
    with pytest.raises(ValueError, match="head must be one of"):
        Policy("bad", gemm="auto", fuse=True, resident=True, head="sometimes")


def test_fused_head_gradients_match_cpu_and_the_separate_head():
    x, y = images(3)
    ref = cpu().gradients(x, y)
    fused, separate = engine("fused"), engine("layers")
    assert isinstance(fused.train_stages[-1], LinearHeadStage)
    assert type(separate.train_stages[-1]) is LinearStage
    got = fused.gradients(x, y)
    assert np.abs(ref).max() > 0
    assert rel_err(got, ref) < 1e-5
    assert rel_err(got, separate.gradients(x, y)) < 1e-5
    assert rel_err(fused.predict(x), cpu().predict(x)) < 1e-5


def test_fused_head_short_epoch_matches_cpu_and_repeats_bit_for_bit():
    x, y = images(7)
    order = batch_order(5, 0, len(x))
    ref = cpu(lr=0.2)
    ref.load_train_data(x, y)
    ref_result = ref.train_epoch(order, 2)
    runs = []
    for _ in range(2):
        gpu = engine("fused", lr=0.2)
        gpu.load_train_data(x, y)
        gpu.warm_up({2, 1})
        result = gpu.train_epoch(order, 2)
        assert result.steps == ref_result.steps == 4  # the last batch of 1 row
        assert result.loss == pytest.approx(ref_result.loss, rel=1e-5)
        runs.append(gpu.parameters().copy())
    assert rel_err(runs[0], ref.parameters()) < 1e-4
    assert np.array_equal(runs[0], runs[1])


def test_fused_head_is_two_launches_of_the_step():
    gpu = engine("fused")
    x, y = images(5)
    gpu.load_train_data(x, y)
    program = gpu._resident_programs(5)[0]
    forward, backward = ([launch.name for launch in _launches(part)] for part in (program.forward, program.backward))
    assert forward[-1] == "head_forward" and backward[0] == "head_backward"  # the first launch of the backward
    names = forward + backward
    assert names.count("head_forward") == names.count("head_backward") == 1
    assert "softmax_ce_grad" not in names and not any(name.startswith(("gemm", "colsum")) for name in names), names


# ---- real GPU: the CNN's shapes


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 17])
@pytest.mark.parametrize("splits", [1, 16])
def test_head_at_the_cnn_shapes_on_the_gpu(rows, splits):
    x, w, b, labels, mask = problem(rows, 4608, 10, seed=2)
    logits, dlogits, losses = poisoned((rows, 10)), poisoned((rows, 10)), poisoned(rows)
    forward = head_forward(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), cuda.to_device(labels), logits,
                           dlogits, losses, splits=splits)
    first = dlogits.copy_to_host()
    forward()  # again: the same bits (the split version's arrival counts reset)
    assert np.array_equal(dlogits.copy_to_host(), first)
    dx, dw, db = poisoned((rows, 4608)), poisoned((4608, 10)), poisoned(10)
    head_backward(cuda.to_device(x), dlogits, cuda.to_device(w), dx, dw, db, relu_mask=cuda.to_device(mask))
    for out, expected in zip((logits, dlogits, losses, dx, dw, db), head_ref(x, w, b, labels, relu_mask=mask)):
        assert rel_err(out.copy_to_host(), expected) < 1e-5


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_head_after_a_relu_masks_its_input_gradient(reduction):
    """The MLP through the layer stages (Policy.step "layers") with the fused head: fc1 folded, its ReLU the head's
    relu_mask; one-batch gradients at an odd batch against cpu-numpy, in both loss reductions."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine

    sizes = {"in_features": 13, "hidden": 9, "classes": 5}
    policy = dataclasses.replace(graph_policy("fused"), step="layers")
    gpu = GpuEngine(build_model("mlp", seed=2, **sizes), "mlp", 0.1, policy, reduction)
    ref = CpuNumpyBackend(build_model("mlp", seed=2, **sizes), "mlp", 0.1, reduction)
    assert not gpu.persistent and isinstance(gpu.train_stages[-1], LinearHeadStage)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((11, 13)).astype(np.float32), rng.integers(0, 5, 11)
    expected = ref.gradients(x, y)
    got = gpu.gradients(x, y)
    assert rel_err(got, expected) < 1e-5
    h = gpu.predict(x, layers=3)  # Flatten, Linear, ReLU: the mask; without it dW1 would not match
    assert (h == 0).any() and (h > 0).any()
