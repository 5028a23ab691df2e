"""The MLP's persistent training step (gpunn.kernels.mlp_step) against its float64 reference.

Under the simulator at odd sizes: 67 inputs (three K chunks: split-K over 3 ranges), 37 hidden units (two column
tiles), 7 classes, an epoch of 29 samples in batches of 11 (two row tiles at the simulator's 32-thread blocks)
whose last batch has 7 rows; every output buffer poisoned before the launch. The simulator has no inter-block
synchronisation: there the persistent (cooperative) version runs ONE block (grid.sync() is the block's
syncthreads, max_cooperative_grid_blocks is 1) while the phased version runs its full multi-block grids on the same
device code, and both give the same bits. The real multi-block cooperative launch, and its capture into a CUDA
graph, are tested on the GPU (-m gpu)."""

import numpy as np
import pytest
from numba import cuda

from gpunn.device import simulator_enabled
from gpunn.kernels import mlp_step

SIM = simulator_enabled()
SIZES = (67, 37, 7)  # in_features, hidden, classes
N, STRIDE = 29, 11   # an epoch of 29 samples in batches of 11: steps of 11, 11, 7
BLOCK = 32 if SIM else mlp_step.BLOCK


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def problem(sizes=SIZES, n=N, seed=0):
    """Host data: source (n, in), labels, an epoch order, W1b (in + 1, hidden), W2b (hidden + 1, classes)."""
    features, hidden, classes = sizes
    rng = np.random.default_rng(seed)
    source = rng.random((n, features), dtype=np.float32)
    labels = rng.integers(0, classes, n).astype(np.int32)
    order = rng.permutation(n).astype(np.int32)
    w1 = (rng.standard_normal((features + 1, hidden)) / np.sqrt(features)).astype(np.float32)
    w2 = (rng.standard_normal((hidden + 1, classes)) / np.sqrt(hidden)).astype(np.float32)
    return source, labels, order, w1, w2


def poison(buffers):
    for buf in buffers:
        host = np.full(buf.shape, -7 if buf.dtype == np.int32 else np.nan, dtype=buf.dtype)
        buf.copy_to_device(host)


def run_step(step, version="persistent", reduction="mean", update=True, sizes=SIZES, n=N, stride=STRIDE, lr=0.5,
             splits=None, block=BLOCK, seed=0):
    """Step `step` of an epoch on the device: returns (host data, device outputs as host arrays, rows)."""
    source, labels, order, w1, w2 = problem(sizes, n, seed)
    first = step * stride
    rows = min(stride, n - first)
    d = {name: cuda.to_device(a) for name, a in
         (("source", source), ("labels", labels), ("order", order), ("w1", w1), ("w2", w2))}
    counter = cuda.to_device(np.array([step], np.int32))
    losses = cuda.to_device(np.full(n, np.nan, np.float32))
    buffers = mlp_step.step_buffers(rows, sizes[0], sizes[1], sizes[2], splits=splits, block=block)
    poison(buffers)
    mlp_step.step_forward(d["source"], d["labels"], d["order"], counter, stride, d["w1"], d["w2"], losses, buffers,
                          reduction=reduction, version=version, block=block)
    grads = None
    if not update:
        grads = (cuda.to_device(np.full_like(w1, np.nan)), cuda.to_device(np.full_like(w2, np.nan)))
    mlp_step.step_backward(d["source"], d["w1"], d["w2"], buffers, lr, counter, grads=grads, block=block)
    out = {name: getattr(buffers, name).copy_to_host() for name in ("h", "dlogits", "dh", "idx")}
    out.update(losses=losses.copy_to_host(), counter=int(counter.copy_to_host()[0]), w1=d["w1"].copy_to_host(),
               w2=d["w2"].copy_to_host(), splits=int(buffers.part.shape[0]))
    if grads is not None:
        out.update(g1=grads[0].copy_to_host(), g2=grads[1].copy_to_host())
    picked = order[first:first + rows]
    ref = mlp_step.step_ref(source[picked], labels[picked], w1, w2, lr, reduction)
    return (source, labels, order, w1, w2), out, ref, rows


@pytest.mark.parametrize("version", mlp_step.VERSIONS)
@pytest.mark.parametrize("step, reduction", [(0, "mean"), (2, "mean"), (1, "sum")])
def test_step_matches_reference(version, step, reduction):
    """Forward buffers, the losses at the step's place in the epoch buffer, the updated parameters and the counter;
    step 2 is the last, partial batch (7 of 11 rows)."""
    (_, _, order, w1, w2), out, ref, rows = run_step(step, version, reduction, splits=3)
    assert out["splits"] == 3 and rows == (7 if step == 2 else 11)
    first = step * STRIDE
    np.testing.assert_array_equal(out["idx"], order[first:first + rows])
    for name in ("h", "dlogits", "dh"):
        assert rel_err(out[name], ref[name]) < 1e-5, name
    assert rel_err(out["losses"][first:first + rows], ref["losses"]) < 1e-5
    assert np.isnan(np.delete(out["losses"], np.arange(first, first + rows))).all()  # no other slot written
    assert out["counter"] == step + 1
    assert np.abs(ref["w1"] - w1).max() > 1e-4  # the step moved the parameters: the next checks are not vacuous
    assert rel_err(out["w1"], ref["w1"]) < 1e-5
    assert rel_err(out["w2"], ref["w2"]) < 1e-5
    assert rel_err(out["w1"] - w1, ref["w1"] - w1) < 1e-4  # the update itself, not only the unchanged bulk


@pytest.mark.parametrize("version", mlp_step.VERSIONS)
def test_gradients_form_updates_nothing(version):
    """grads=(g1, g2): the gradients of W1b and W2b (bias rows included), parameters and counter untouched."""
    (_, _, _, w1, w2), out, ref, _ = run_step(2, version, update=False, splits=2)
    assert rel_err(out["g1"], ref["g1"]) < 1e-5
    assert rel_err(out["g2"], ref["g2"]) < 1e-5
    assert np.abs(ref["g1"][-1]).max() > 0 and np.abs(ref["g2"][-1]).max() > 0  # the bias rows carry gradient
    np.testing.assert_array_equal(out["w1"], w1)
    np.testing.assert_array_equal(out["w2"], w2)
    assert out["counter"] == 2


def test_versions_and_runs_give_identical_bits():
    """Every output has one writer and a fixed summation order: the persistent version (one block under the
    simulator, a cooperative grid on a GPU), the phased version (its full grids) and a second run agree bitwise."""
    outs = [run_step(1, version, splits=3)[1] for version in ("persistent", "phased", "persistent")]
    for out in outs[1:]:
        for name in ("h", "dlogits", "dh", "losses", "w1", "w2"):
            np.testing.assert_array_equal(out[name], outs[0][name], err_msg=name)


def test_splits_and_batch_of_one():
    """One sample (rows 1, a last batch of 1) and the K range unsplit, then split as finely as it goes."""
    for splits in (1, 99):
        _, out, ref, rows = run_step(2, "phased", n=23, splits=splits)
        assert rows == 1 and out["splits"] == (1 if splits == 1 else 3)
        assert rel_err(out["w1"], ref["w1"]) < 1e-5 and rel_err(out["dh"], ref["dh"]) < 1e-5


def test_fc1_splits_fill_the_target():
    # 785 x 256 at batch 64 on 132 SMs (block 256: 64-row tiles): 8 tiles, 25 K chunks, 264 blocks wanted
    assert mlp_step.fc1_splits(64, 784, 256, 256, target=264) == 25
    assert mlp_step.fc1_splits(64, 784, 256, 256, target=132) == 13  # 2 chunks a range: 13 non-empty ranges
    assert mlp_step.fc1_splits(512, 784, 256, 256, target=132) == 2
    assert mlp_step.fc1_splits(5, 10, 3, 32, target=1) == 1


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(ValueError, match="classes must be in"):
        mlp_step.step_buffers(4, 5, 3, mlp_step.MAX_CLASSES + 1)
    source, labels, order, w1, w2 = (cuda.to_device(a) for a in problem())
    buffers = mlp_step.step_buffers(STRIDE, *SIZES, block=BLOCK)
    counter = cuda.to_device(np.zeros(1, np.int32))
    losses = cuda.device_array(N, np.float32)
    with pytest.raises(ValueError, match="block must be at least 32"):
        mlp_step.step_forward(source, labels, order, counter, STRIDE, w1, w2, losses, buffers, block=16)
    with pytest.raises(ValueError, match="version must be one of"):
        mlp_step.step_forward(source, labels, order, counter, STRIDE, w1, w2, losses, buffers, version="x")
    with pytest.raises(ValueError, match="stride"):
        mlp_step.step_forward(source, labels, order, counter, STRIDE - 1, w1, w2, losses, buffers, launch=False)
    with pytest.raises(ValueError, match="w2"):
        mlp_step.step_forward(source, labels, order, counter, STRIDE, w1, w1, losses, buffers, launch=False)
    with pytest.raises(ValueError, match="lr must be"):
        mlp_step.step_backward(source, w1, w2, buffers, 0.0, counter, launch=False)


# --------------------------------------------------------------------------------------------- real GPU
REAL = (784, 256, 10)


@pytest.mark.gpu
@pytest.mark.parametrize("version", mlp_step.VERSIONS)
@pytest.mark.parametrize("step, reduction", [(0, "mean"), (2, "mean"), (1, "sum")])
def test_real_sizes_on_gpu(version, step, reduction):
    """E1's 784-256-10 at batch 64 over 150 samples (a last batch of 22), 256-thread blocks: the persistent version
    runs a multi-block cooperative grid."""
    _, out, ref, rows = run_step(step, version, reduction, sizes=REAL, n=150, stride=64, lr=0.05, block=256)
    for name in ("h", "dlogits", "dh"):
        assert rel_err(out[name], ref[name]) < 1e-5, name
    assert rel_err(out["losses"][step * 64:step * 64 + rows], ref["losses"]) < 1e-5
    assert rel_err(out["w1"], ref["w1"]) < 1e-5 and rel_err(out["w2"], ref["w2"]) < 1e-5
    assert out["counter"] == step + 1


@pytest.mark.gpu
def test_persistent_forward_is_a_multi_block_cooperative_launch():
    source, labels, order, w1, w2 = (cuda.to_device(a) for a in problem(REAL, 150))
    buffers = mlp_step.step_buffers(64, *REAL)
    forward = mlp_step.step_forward(source, labels, order, cuda.to_device(np.zeros(1, np.int32)), 64, w1, w2,
                                    cuda.device_array(150, np.float32), buffers, launch=False)
    assert forward.grid > 1 and buffers.part.shape[0] > 1
    assert forward.kernel.overloads  # compiled to learn its cooperative grid limit
    assert all(kernel.cooperative for kernel in forward.kernel.overloads.values())


@pytest.mark.gpu
@pytest.mark.parametrize("version", mlp_step.VERSIONS)
def test_captured_graph_replays_the_eager_steps(version):
    """Three steps of an epoch captured once into a CUDA graph (cuda.core, as the engine captures) and replayed
    give the bits of the same launches run eagerly."""
    from cuda.core import Device

    results = []
    for graph in (False, True):
        source, labels, order, w1, w2 = (cuda.to_device(a) for a in problem(REAL, 192))
        counter = cuda.to_device(np.zeros(1, np.int32))
        losses = cuda.to_device(np.full(192, np.nan, np.float32))
        buffers = mlp_step.step_buffers(64, *REAL)
        launches = [mlp_step.step_forward(source, labels, order, counter, 64, w1, w2, losses, buffers,
                                          version=version, launch=False),
                    mlp_step.step_backward(source, w1, w2, buffers, 0.05, counter, launch=False)]
        if graph:
            dev = Device()
            dev.set_current()
            stream = dev.create_stream()
            builder = stream.create_graph_builder().begin_building()
            for launch in launches:
                launch.on(builder)
            captured = builder.end_building().complete()
            for _ in range(3):
                captured.launch(stream)
            cuda.synchronize()  # the whole context: the cuda.core stream does not sync with the legacy one
        else:
            for _ in range(3):
                for launch in launches:
                    launch()
            cuda.synchronize()
        results.append((losses.copy_to_host(), w1.copy_to_host(), w2.copy_to_host(), counter.copy_to_host()))
    for eager, replayed in zip(*results):
        np.testing.assert_array_equal(replayed, eager)
    assert np.isfinite(results[1][0]).all() and results[1][3][0] == 3


# --------------------------------------------------------------------------------------------- in the engine
ENGINE_SIZES = {"in_features": 37, "hidden": 23, "classes": 7}


def eager_engine(step="persistent", sizes=ENGINE_SIZES, model_name="mlp", lr=0.5, reduction="mean", seed=3):
    """gpu-graph's policy without the capture (the simulator has no graphs), its step `step`."""
    from dataclasses import replace

    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.backends.gpu.policy import POLICIES
    from gpunn.nn import build_model

    policy = replace(POLICIES["gpu-graph"], name=f"gpu-graph-{step}", graphs=False, step=step)
    return GpuEngine(build_model(model_name, seed=seed, **sizes), model_name, lr, policy, reduction)


def engine_data(n=13, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.random((n, ENGINE_SIZES["in_features"]), dtype=np.float32),
            rng.integers(0, ENGINE_SIZES["classes"], n))


@pytest.mark.parametrize("step", mlp_step.VERSIONS)
def test_engine_trains_like_cpu_numpy(step):
    """Two epochs of 13 samples in batches of 5 (a last batch of 3) through the engine's persistent program: the
    epoch losses and parameters of cpu-numpy (same init, same order), gradients() without an update, predictions."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.nn import build_model
    from gpunn.seeding import batch_order

    x, y = engine_data()
    gpu = eager_engine(step)
    ref = CpuNumpyBackend(build_model("mlp", seed=3, **ENGINE_SIZES), "mlp", 0.5)
    assert gpu.persistent
    program = gpu._step_program(5, (37,))
    assert len(program.forward) == (1 if step == "persistent" else 2) and len(program.backward) == 1
    assert program.updates == 1 and program.gradients[-1].name == "mlp_backward"
    init = gpu.parameters().copy()
    expected = ref.gradients(x[:5], y[:5])
    assert rel_err(gpu.gradients(x[:5], y[:5]), expected) < 1e-5
    np.testing.assert_array_equal(gpu.parameters(), init)  # gradients() updates nothing
    for backend in (gpu, ref):
        backend.load_train_data(x, y)
    for epoch in range(2):
        order = batch_order(3, epoch, len(x))
        assert gpu.train_epoch(order, 5).loss == pytest.approx(ref.train_epoch(order, 5).loss, rel=1e-5)
    assert rel_err(ref.parameters(), init) > 1e-3  # training moved the parameters: the next check is not vacuous
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-5
    assert rel_err(gpu.predict(x[:4]), ref.predict(x[:4])) < 1e-5


def test_engine_runs_give_identical_bits():
    """Two engines, the same epoch in the same order: the same losses and parameters, bit for bit (and the sum
    reduction through the same step)."""
    from gpunn.seeding import batch_order

    x, y = engine_data()
    results = []
    for _ in range(2):
        gpu = eager_engine(reduction="sum", lr=0.1)
        gpu.load_train_data(x, y)
        loss = gpu.train_epoch(batch_order(3, 0, len(x)), 5).loss
        results.append((loss, gpu.parameters().copy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_other_models_keep_the_layer_stages():
    """The persistent step covers Linear, ReLU, Linear + softmax-CE on resident data with few enough classes;
    anything else under the same policy is built from the layer stages."""
    from dataclasses import replace

    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.backends.gpu.policy import POLICIES
    from gpunn.nn import build_model

    assert eager_engine().persistent
    assert not eager_engine(model_name="cnn", sizes={"in_channels": 1, "image_size": 6, "channels": (2, 3),
                                                     "classes": 5}).persistent
    assert not eager_engine(sizes={**ENGINE_SIZES, "classes": mlp_step.MAX_CLASSES + 1}).persistent
    assert not eager_engine(step="layers").persistent
    host = replace(POLICIES["gpu-naive"], step="persistent")  # batches copied from the host: no device gather
    assert not GpuEngine(build_model("mlp", **ENGINE_SIZES), "mlp", 0.1, host).persistent
    with pytest.raises(ValueError, match="step must be one of"):
        replace(POLICIES["gpu-graph"], step="fused")
