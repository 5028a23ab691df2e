"""The engine's CUDA graphs (gpunn.backends.gpu.graphs): an epoch captured as the step loop runs it, the clock's
marks between each step's forward and backward; one graph per distinct launch list or step-program list. Under the
simulator (no graphs) the capture order and the caching run on stand-ins; on a GPU the epoch graph trains the same
bits as the step loop's graphs and its clock splits the epoch."""

import dataclasses

import numpy as np
import pytest

from gpunn.backends.gpu import graphs as G
from gpunn.backends.gpu.policy import POLICIES


class Launch:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def on(self, builder):
        assert builder.building
        self.log.append(self.name)


class Builder:
    def __init__(self, log):
        self.log, self.building, self.stream, self.handle = log, False, self, 0

    def begin_building(self):
        self.building = True
        return self

    def end_building(self):
        self.building = False
        return self

    def complete(self):
        self.log.append("complete")
        return Graph(self.log)


class Graph:
    handle = 0

    def __init__(self, log):
        self.log, self.launches = log, 0

    def launch(self, stream):
        self.launches += 1


class Stream:
    def __init__(self, log):
        self.log, self.handle = log, 0

    def create_graph_builder(self):
        return Builder(self.log)


class Clock:
    def __init__(self, log, direct=True):
        self.log, self.direct, self.count = log, direct, 0

    def resize(self, count):
        self.count = max(self.count, count)

    def capture_marks(self, stream_handle):
        if not self.direct:
            return None

        def mark(i):
            assert i < self.count
            self.log.append(f"mark{i}")
        return mark


def program(log, step, forward=2, backward=1):
    return type("Program", (), {"forward": [Launch(log, f"s{step}f{j}") for j in range(forward)],
                                "backward": [Launch(log, f"s{step}b{j}") for j in range(backward)]})()


def test_the_epoch_graph_captures_the_step_loop_in_order_once():
    log = []
    graphs = G.Graphs(Stream(log))
    full, last = program(log, 0), program(log, 1, forward=1, backward=2)
    programs = [full, full, last]
    clock = Clock(log)
    call = graphs.epoch(programs, clock)
    assert clock.count == 7
    assert log == ["mark0", "s0f0", "s0f1", "mark1", "s0b0", "mark2", "s0f0", "s0f1", "mark3", "s0b0", "mark4",
                   "s1f0", "mark5", "s1b0", "s1b1", "mark6", "complete"]
    assert graphs.epoch(programs, clock) is call and len(log) == 17  # captured once per list of step programs
    graph = graphs._epochs[tuple(map(id, programs))][0]
    call()
    call()
    assert graph.launches == 2
    assert graphs.epoch([full, last], clock) is not call  # another epoch size: its own graph


def test_a_launch_list_is_one_graph_replayed():
    log = []
    graphs = G.Graphs(Stream(log))
    step = program(log, 0)
    graphs.launch(step.forward)
    graphs.launch(step.forward)
    graphs.launch(step.backward)
    assert log == ["s0f0", "s0f1", "complete", "s0b0", "complete"]
    assert graphs._steps[id(step.forward)][0].launches == 2


def test_no_epoch_graph_where_the_clock_cannot_mark_inside_it():
    log = []
    graphs = G.Graphs(Stream(log))
    assert graphs.epoch([program(log, 0)], Clock(log, direct=False)) is None
    assert log == []


def test_the_graph_variants_run_whole_epochs_as_one_graph():
    for name in ("gpu-graph", "gpu-tf32", "gpu-bf16"):
        assert POLICIES[name].graphs and POLICIES[name].graph_epoch
    assert not any(p.graph_epoch for p in POLICIES.values() if not p.graphs)


def _trained(model_name, policy, epochs=2, n=200, batch=64):
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.nn import build_model
    from gpunn.seeding import batch_order
    from gpunn.timing import EPOCH_MODELS, random_training_data

    spec = EPOCH_MODELS[model_name]
    model = build_model(model_name, seed=3, **spec.sizes)
    x, y = random_training_data(n, 0, model.input_shape, spec.sizes.get("classes", 1))
    engine = GpuEngine(model, model_name, spec.lr, policy)
    engine.load_train_data(x, y)
    engine.prepare_epoch(batch)
    epochs_read = []
    for e in range(epochs):
        r = engine.train_epoch(batch_order(3, e, n), batch)
        epochs_read.append((r.loss, r.steps, r.forward_s, r.backward_s))  # the split read before the next epoch
    return epochs_read, engine.parameters()


@pytest.mark.gpu
@pytest.mark.parametrize("model_name, variant", [("mlp", "gpu-graph"), ("mlp", "gpu-bf16"), ("cnn", "gpu-tf32"),
                                                 ("autoencoder", "gpu-bf16")])
def test_gpu_epoch_graph_trains_the_step_loops_bits(model_name, variant):
    """The epoch graph (200 samples at batch 64: three full steps and a short one) against the same policy's two
    graphs a step: the same losses and parameters bit for bit; its clock's forward and backward positive."""
    policy = POLICIES[variant]
    looped, params_looped = _trained(model_name, dataclasses.replace(policy, graph_epoch=False))
    whole, params_whole = _trained(model_name, policy)
    assert [loss for loss, *_ in whole] == [loss for loss, *_ in looped]
    np.testing.assert_array_equal(params_whole, params_looped)
    for _, steps, forward_s, backward_s in whole:
        assert steps == 4 and forward_s > 0 and backward_s > 0


def test_a_device_epochs_split_is_read_when_asked_and_only_before_the_next_epoch():
    """The resident epoch's forward / backward sums come from its clock after the epoch returns (the caller's timed
    region ends with the work and the losses); once the next epoch has re-marked the clock, reading them raises."""
    from gpunn.backends.base import DeferredSplitEpoch
    from gpunn.backends.gpu.engine import GpuEngine
    from gpunn.nn import build_model
    from gpunn.seeding import batch_order

    sizes = {"in_features": 6, "hidden": 5, "classes": 3}
    engine = GpuEngine(build_model("mlp", seed=1, **sizes), "mlp", 0.1, POLICIES["gpu-fused"])
    rng = np.random.default_rng(0)
    engine.load_train_data(rng.random((10, 6), dtype=np.float32), rng.integers(0, 3, 10))
    first = engine.train_epoch(batch_order(0, 0, 10), 4)
    assert isinstance(first, DeferredSplitEpoch) and first.steps == 3 and np.isfinite(first.loss)
    assert first.forward_s > 0 and first.backward_s > 0
    second = engine.train_epoch(batch_order(0, 1, 10), 4)
    assert first.forward_s > 0  # read before: kept
    engine.train_epoch(batch_order(0, 2, 10), 4)
    with pytest.raises(RuntimeError, match="split read after the next epoch ran"):
        _ = second.forward_s
