"""E4's CNN on the GPU engine: every CNN variant against cpu-numpy from the same init and batch order.

Under the simulator (tiny shapes: 8x8 images, channels (2, 3), 4 classes): one-batch gradients within 1e-5 of
cpu-numpy's at an odd batch, and a short epoch (7 samples in batches of 2: a partial last batch, and four steps,
so the pipelined copy of gpu-optimized reuses its first slot) ending within 1e-4 in parameters. gpu-graph needs a
real GPU: its eager twin (the same policy without graphs) runs here. On a real GPU (-m gpu): the real shapes
(28x28, channels 16 and 32, batch 64), every block size of E4's study, and gpu-graph itself.
"""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu.engine import _launches
from gpunn.backends.gpu.policy import AUTO_WINOGRAD_STEPS, POLICIES, conv_version
from gpunn.backends.registry import VARIANTS, make_backend, takes_block
from gpunn.errors import GpunnError
from gpunn.nn import build_model
from gpunn.runspec import RunSpec, parse_run_path
from gpunn.seeding import batch_order

TINY = {"in_channels": 1, "image_size": 8, "channels": (2, 3), "classes": 4}
REAL = {"in_channels": 1, "image_size": 28, "channels": (16, 32), "classes": 10}
CNN_VARIANTS = ("gpu-naive", "gpu-optimized", "gpu-im2col", "gpu-graph")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out))
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def pair(variant, sizes=TINY, lr=0.1, seed=3, block=0, policy=None):
    """cpu-numpy and a GPU backend (a registry variant, or an explicit policy) from the same init."""
    from gpunn.backends.cpu_numpy import CpuNumpyBackend
    from gpunn.backends.gpu.engine import GpuEngine

    ref = CpuNumpyBackend(build_model("cnn", seed=seed, **sizes), "cnn", lr)
    if policy is not None:
        return ref, GpuEngine(build_model("cnn", seed=seed, **sizes), "cnn", lr, policy)
    return ref, make_backend(variant, build_model("cnn", seed=seed, **sizes), "cnn", lr, block=block)


def images(n, sizes=TINY, seed=1):
    rng = np.random.default_rng(seed)
    side = sizes["image_size"]
    return rng.random((n, 1, side, side), dtype=np.float32), rng.integers(0, sizes["classes"], n)


def eager_graph_policy():
    """gpu-graph's step without the capture: what the simulator can run of it."""
    return dataclasses.replace(POLICIES["gpu-graph"], name="gpu-graph-eager", graphs=False)


# ---- the registry and the policies


def test_cnn_variants_are_registered_with_their_facts():
    cnn = [name for name, entry in VARIANTS.items() if entry.gpu and "cnn" in entry.models]
    assert cnn == ["gpu-naive", "gpu-optimized", "gpu-im2col", "gpu-graph", "gpu-tf32", "gpu-bf16"]
    assert [name for name in cnn if takes_block(name)] == ["gpu-naive", "gpu-optimized"]
    assert [name for name in cnn if not VARIANTS[name].simulator] == ["gpu-graph", "gpu-tf32", "gpu-bf16"]
    naive, optimized, im2col = POLICIES["gpu-naive"], POLICIES["gpu-optimized"], POLICIES["gpu-im2col"]
    assert naive.sgd == "per_layer" and not naive.fuse and naive.copy == "sync" and naive.pool_backward == "atomic"
    # paper 001's ConvLayerBackward: a layer's weight and bias gradients in one naive launch
    assert naive.conv == {"forward": "naive", "backward_data": "naive", "backward_weight": "naive",
                          "bias_grad": "with_weight"} and naive.gemm == "naive"
    # the paper's optimized list, each item a field
    assert optimized.fuse and optimized.gemm == "tiled16" and optimized.copy == "pipelined" and optimized.sgd == "flat"
    assert optimized.conv["forward"] == "tiled" and optimized.conv["backward_weight"] == "shuffle"
    assert im2col.resident and set(im2col.conv[s] for s in ("forward", "backward_data", "backward_weight")) == {
        "implicit_gemm"}


def test_simulator_runs_the_shuffle_reduction_as_its_shared_memory_twin():
    optimized = POLICIES["gpu-optimized"]
    assert optimized.for_simulator().conv["backward_weight"] == "block"
    assert optimized.for_simulator().conv["forward"] == "tiled"
    # every thread-count kernel at the simulator's small block, unless the run set one
    assert POLICIES["gpu-im2col"].for_simulator().block == 32
    assert POLICIES["gpu-im2col"].for_simulator().conv == POLICIES["gpu-im2col"].conv
    assert POLICIES["gpu-naive"].with_block(64).for_simulator().block == 64


def test_graph_policy_picks_each_conv_pass_by_shape():
    graph = POLICIES["gpu-graph"]
    # the CNN: tiles for the small channel counts, the GEMM for conv2's weight gradient
    assert conv_version(graph, "forward", 1, 16, 3) == "tiled"
    assert conv_version(graph, "backward_data", 16, 32, 3) == "tiled"
    assert conv_version(graph, "backward_weight", 1, 16, 3) == "deterministic"
    assert conv_version(graph, "backward_weight", 16, 32, 3) == "implicit_gemm"
    # the autoencoder's wide layers and its 3-channel output (the skinny GEMM)
    assert conv_version(graph, "forward", 256, 128, 3) == "implicit_gemm"
    assert conv_version(graph, "forward", 256, 3, 3) == "implicit_gemm"
    assert conv_version(graph, "backward_data", 3, 256, 3) == "implicit_gemm"
    assert conv_version(graph, "backward_weight", 256, 3, 3) == "deterministic"
    # ... and with the input's size: the staged weight gradient for a narrow output from a wide input (a narrow
    # input measured slower than the GEMM)
    assert conv_version(graph, "backward_weight", 256, 3, 3, 1, (32, 32)) == "staged"
    assert conv_version(graph, "backward_weight", 3, 256, 3, 1, (32, 32)) == "implicit_gemm"
    assert conv_version(graph, "backward_weight", 1, 16, 3, 0, (28, 28)) == "deterministic"  # not wide: as before
    assert conv_version(graph, "backward_weight", 256, 3, 3, 1, (512, 512)) == "deterministic"  # planes too large
    assert conv_version(POLICIES["gpu-im2col"], "forward", 1, 16, 3) == "implicit_gemm"
    # Winograd F(2x2, 3x3) for the wide 3x3 padding-1 layers, on the passes of AUTO_WINOGRAD_STEPS
    for step in ("forward", "backward_data", "backward_weight"):
        want = "winograd" if step in AUTO_WINOGRAD_STEPS else "implicit_gemm"
        assert conv_version(graph, step, 256, 128, 3, 1, (16, 16)) == want
        assert conv_version(graph, step, 128, 128, 3, 1, (8, 8)) == want
        assert conv_version(graph, step, 256, 3, 3, 1, (32, 32)) != "winograd"  # too few channels
        assert conv_version(graph, step, 256, 128, 3, 0) != "winograd"  # padding 0: not measured
        assert conv_version(POLICIES["gpu-im2col"], step, 256, 128, 3, 1) == "implicit_gemm"


# ---- run settings: the block size


def test_block_size_is_a_field_of_the_run_path():
    spec = parse_run_path("mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0_t1024")
    assert spec.block == 1024 and spec.subset == 0
    assert spec.path.endswith("_t1024") and parse_run_path(spec.path) == spec
    assert parse_run_path("mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0_n500_t128").block == 128
    assert RunSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(GpunnError, match="block size 48 .* is not one of 32, 64"):
        parse_run_path("mnist/standard/cnn/gpu-naive/w16-32_b64_lr0.01_e5_s0_t48")


def test_variants_with_fixed_blocks_refuse_a_block_size():
    with pytest.raises(GpunnError, match="variant gpu-im2col takes no block size .*gpu-naive, gpu-optimized"):
        make_backend("gpu-im2col", build_model("cnn", **TINY), "cnn", 0.1, block=256)
    with pytest.raises(GpunnError, match="variant cpu-numpy takes no block size"):
        make_backend("cpu-numpy", build_model("cnn", **TINY), "cnn", 0.1, block=256)


def test_the_run_block_reaches_every_thread_count_kernel():
    _, naive = pair("gpu-naive", block=64)
    program = naive._step_program(3, (1, 8, 8))
    blocks = {launch.name: int(np.prod(launch.block)) for launch in _launches(program.forward + program.backward)}
    softmax = [name for name in blocks if "softmax" in name]
    assert softmax and all(blocks[name] == POLICIES["gpu-naive"].ce_block for name in softmax)  # a warp per row
    assert {threads for name, threads in blocks.items() if name not in softmax} == {64}
    assert program.updates == 3  # conv1, conv2, fc: one SGD launch each
    _, default = pair("gpu-naive")
    assert {int(np.prod(launch.block)) for launch in _launches(default._step_program(3, (1, 8, 8)).backward)} != {64}


def test_a_block_the_device_cannot_run_stops_before_training(monkeypatch):
    from gpunn import device

    monkeypatch.setattr(device, "_device_thread_limit", lambda: 512)
    _, naive = pair("gpu-naive", block=1024)
    x, y = images(3)
    naive.load_train_data(x, y)
    with pytest.raises(GpunnError, match="variant gpu-naive cannot run with block size 1024 here: .*exceeds this "
                                         "device's limit of 512 .*choose a smaller block size"):
        naive.warm_up({2, 1})


# ---- numerics against cpu-numpy (simulator, tiny shapes)

SIMULATED = [("gpu-naive", 32), ("gpu-optimized", 0), ("gpu-im2col", 0), ("gpu-graph-eager", 0)]


def _backend(variant, block, lr=0.1):
    if variant == "gpu-graph-eager":
        return pair(None, lr=lr, policy=eager_graph_policy())
    return pair(variant, lr=lr, block=block)


@pytest.mark.parametrize(("variant", "block"), SIMULATED)
def test_one_batch_gradients_match_cpu(variant, block):
    ref, gpu = _backend(variant, block)
    x, y = images(3)
    expected = ref.gradients(x, y)
    assert np.abs(expected).max() > 0
    assert rel_err(gpu.gradients(x, y), expected) < 1e-5
    assert rel_err(gpu.predict(x), ref.predict(x)) < 1e-5


@pytest.mark.parametrize(("variant", "block"), SIMULATED[:3])
def test_short_epoch_matches_cpu(variant, block):
    ref, gpu = _backend(variant, block, lr=0.2)
    x, y = images(7)
    for backend in (ref, gpu):
        backend.load_train_data(x, y)
    gpu.warm_up({2, 1})
    order = batch_order(5, 0, len(x))
    ref_result, gpu_result = ref.train_epoch(order, 2), gpu.train_epoch(order, 2)
    assert gpu_result.steps == ref_result.steps == 4
    assert gpu_result.loss == pytest.approx(ref_result.loss, rel=1e-5)
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-4
    if variant == "gpu-optimized":  # three pinned slots, the fourth step back in the first
        pipe = gpu._pipe
        assert len(pipe.pinned_x) == 3 and sorted(pipe.programs) == [(1, 0), (2, 0), (2, 1), (2, 2)]
        inputs = {id(program.x.view) for program, _copies in pipe.programs.values()}
        assert len(inputs) == 4


# ---- real GPU: the real shapes, every block of the study, CUDA graphs


def _real_data(n, seed=7):
    return images(n, REAL, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", CNN_VARIANTS)
def test_gpu_variants_at_the_real_shapes_match_cpu(variant):
    x, y = _real_data(64 * 3 + 17)
    ref, gpu = pair(variant, REAL, lr=0.01)
    assert rel_err(gpu.gradients(x[:64], y[:64]), ref.gradients(x[:64], y[:64])) < 1e-4
    for backend in (ref, gpu):
        backend.load_train_data(x, y)
    gpu.warm_up({64, 17})
    for epoch in range(2):
        order = batch_order(0, epoch, len(x))
        ref_result, gpu_result = ref.train_epoch(order, 64), gpu.train_epoch(order, 64)
        assert gpu_result.loss == pytest.approx(ref_result.loss, rel=1e-4)
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["gpu-naive", "gpu-optimized"])
@pytest.mark.parametrize("block", [128, 256, 512, 1024])
def test_every_block_of_the_study_trains_like_cpu(variant, block):
    x, y = _real_data(64 * 2 + 5)
    ref, gpu = pair(variant, REAL, lr=0.01, block=block)
    for backend in (ref, gpu):
        backend.load_train_data(x, y)
    gpu.warm_up({64, 5})
    order = batch_order(0, 0, len(x))
    ref_result, gpu_result = ref.train_epoch(order, 64), gpu.train_epoch(order, 64)
    assert gpu_result.loss == pytest.approx(ref_result.loss, rel=1e-4)
    assert rel_err(gpu.parameters(), ref.parameters()) < 1e-4


@pytest.mark.gpu
def test_deterministic_variants_repeat_bit_for_bit():
    x, y = _real_data(64 * 2 + 9)
    for variant in ("gpu-im2col", "gpu-graph"):
        runs = []
        for _ in range(2):
            _, gpu = pair(variant, REAL, lr=0.01)
            gpu.load_train_data(x, y)
            gpu.train_epoch(batch_order(0, 0, len(x)), 64)
            runs.append(gpu.parameters().copy())
        assert np.array_equal(runs[0], runs[1]), variant
