"""GPU training variants of the MLP (in-hidden-classes, ReLU, softmax cross-entropy), built from the op
modules in gpunn.kernels. Every variant keeps the parameters in one flat device buffer laid out exactly like
the model's host buffer ([W1 (in, hidden), b1, W2 (hidden, classes), b2]), starts from the model's init and
trains on the batches the loop hands it (gpunn.seeding), so it can be compared with cpu-numpy step by step.

    gpu-naive  E1's design: the batch is copied to the GPU every step, one kernel per op (naive GEMMs, bias
               add, ReLU, softmax-CE gradient, atomicAdd column sums for the bias gradients, SGD); the step's
               loss is copied back every step
    gpu-tiled  the same with 16x16 shared-memory tiled GEMMs in the forward AND backward pass (E2 tiled only
               the forward pass)
    gpu-fused  fewest launches, nothing per step on the host: the training set lives on the GPU and each
               step gathers its batch there from the epoch's order and a device-side step counter; biases
               are folded into the GEMMs (a ones column after the inputs and after the hidden units, whose
               weights are the bias row stored right after W in the flat buffer), so the forward pass is two
               GEMMs (bias + ReLU in the first one's epilogue), the bias gradients come out of the weight-
               gradient GEMMs (deterministic, no atomics), the ReLU backward is the dH GEMM's epilogue and one
               SGD launch updates every parameter and advances the counter: 8 launches per step. Per-row
               losses accumulate in an epoch-long device buffer read once per epoch.

Each step's forward and backward times come from CUDA events (the host copy of the batch counts as forward
time for the variants that copy). `predict` runs the forward pass on the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from gpunn.device import require_gpu
from gpunn.seeding import batch_slices


@dataclass
class EpochResult:
    loss_sum: float    # sum of the per-sample losses over the epoch
    forward_s: float
    backward_s: float


@dataclass
class _Program:
    """The bound launches of one training step at one batch size, and the buffers they use."""

    forward: list
    backward: list
    x: object = None        # host-batch programs: the (B, in) input buffer the batch is copied into
    y: object = None        # ... and its (B,) int32 labels
    losses: object = None   # (B,) per-row losses (host-batch programs)


class _Clock:
    """Time marks on a stream: CUDA events on a GPU (no host wait when marking); under the simulator, whose
    events carry no time and whose launches run synchronously, the host clock."""

    def __init__(self, stream, count: int):
        from numba import cuda

        from gpunn.device import simulator_enabled

        self.stream = stream
        self.events = None if simulator_enabled() else [cuda.event() for _ in range(count)]
        self.times = [0.0] * count

    def mark(self, i: int) -> None:
        if self.events is None:
            self.times[i] = time.perf_counter()
        else:
            self.events[i].record(self.stream)

    def seconds(self, i: int, j: int) -> float:
        """Seconds from mark i to mark j (both done: the caller has waited for the stream)."""
        if self.events is None:
            return self.times[j] - self.times[i]
        return self.events[i].elapsed_time(self.events[j]) / 1e3


class _GpuMlp:
    """What all GPU MLP variants share: parameters and gradients on the device, their per-layer views,
    events, the step timing protocol, the GPU forward pass for predictions."""

    name = "gpu"
    gemm_variant = "naive"

    def __init__(self, model, model_name: str, lr: float):
        require_gpu(f"variant {self.name}")
        from numba import cuda

        self.cuda = cuda
        self.model = model
        self.lr = float(lr)
        layout = {name: (offset, tuple(shape)) for name, offset, shape in model.layout()}
        w1, b1, w2, b2 = sorted(layout.values())  # (offset, shape) of W1, b1, W2, b2 in buffer order
        self.in_features, self.hidden = w1[1]
        self.classes = w2[1][1]
        if b1[0] != w1[0] + self.in_features * self.hidden or b2[0] != w2[0] + self.hidden * self.classes:
            raise ValueError(f"{self.name}: expected each bias stored right after its weight, got layout {layout}")
        self.offsets = {"w1": w1[0], "b1": b1[0], "w2": w2[0], "b2": b2[0]}
        self.params = cuda.to_device(model.flat)
        self.grads = cuda.to_device(np.zeros_like(model.flat))
        self.stream = 0  # the stream copies, launches and events go to (gpu-graph has its own)
        self.clock = _Clock(self.stream, 3)
        self._programs: dict = {}
        self._predictors: dict = {}

    # ---- views of a flat buffer (parameters or gradients), in the model's layout
    def weight1(self, buf, with_bias: bool = False):
        rows = self.in_features + (1 if with_bias else 0)
        start = self.offsets["w1"]
        return buf[start:start + rows * self.hidden].reshape(rows, self.hidden)

    def bias1(self, buf):
        return buf[self.offsets["b1"]:self.offsets["b1"] + self.hidden]

    def weight2(self, buf, with_bias: bool = False):
        rows = self.hidden + (1 if with_bias else 0)
        start = self.offsets["w2"]
        return buf[start:start + rows * self.classes].reshape(rows, self.classes)

    def bias2(self, buf):
        return buf[self.offsets["b2"]:self.offsets["b2"] + self.classes]

    def gemm(self, *args, **kw):
        from gpunn.kernels import gemm

        return gemm.VERSIONS[self.gemm_variant](*args, launch=False, **kw)

    # ---- the backend API used by gpunn.train and gpunn.timing
    def _execute(self, launches) -> None:
        for launch in launches:
            launch()

    def _wait(self) -> None:
        """Block until the work queued on this backend's stream (copies to the host included) is done."""
        if self.stream:
            self.stream.synchronize()

    def _load_batch(self, rows: int, xb: np.ndarray, target: np.ndarray) -> _Program:
        if rows not in self._programs:
            self._programs[rows] = self._host_program(rows)
        program = self._programs[rows]
        program.x.copy_to_device(np.ascontiguousarray(xb.reshape(rows, -1), dtype=np.float32), stream=self.stream)
        program.y.copy_to_device(np.asarray(target, dtype=np.int32), stream=self.stream)
        return program

    def train_step(self, xb: np.ndarray, target: np.ndarray):
        from gpunn.variants import StepTimes

        clock = self.clock
        clock.mark(0)
        program = self._load_batch(len(xb), xb, target)
        self._execute(program.forward)
        clock.mark(1)
        self._execute(program.backward)
        clock.mark(2)
        losses = program.losses.copy_to_host(stream=self.stream)  # the step's loss, as E1 logs it
        self._wait()
        return StepTimes(float(np.mean(losses, dtype=np.float64)), clock.seconds(0, 1), clock.seconds(1, 2))

    def gradients(self, xb: np.ndarray, target: np.ndarray) -> np.ndarray:
        """The flat gradient of one batch, without updating the parameters (for tests)."""
        program = self._load_batch(len(xb), xb, target)
        for launch in program.forward + program.backward[:-1]:  # all but the SGD launch
            launch.on(self.stream)
        grads = self.grads.copy_to_host(stream=self.stream)
        self._wait()
        self.grads.copy_to_device(np.zeros_like(grads), stream=self.stream)
        return grads

    def predict(self, xb: np.ndarray) -> np.ndarray:
        rows = len(xb)
        if rows not in self._predictors:
            self._predictors[rows] = self._predictor(rows)
        x, z, launches = self._predictors[rows]
        x.copy_to_device(np.ascontiguousarray(xb.reshape(rows, -1), dtype=np.float32))
        for launch in launches:
            launch()
        return z.copy_to_host()

    def warm_up(self, batch_sizes) -> None:
        """Compile every kernel the steps at these batch sizes launch (numba compiles on first call), on random
        batches, then restore the parameters: no timed step pays for compilation. Nothing to compile under
        the simulator."""
        from gpunn.device import simulator_enabled

        if simulator_enabled():
            return
        saved = self.params.copy_to_host()
        rng = np.random.default_rng(0)
        for rows in sorted(set(batch_sizes)):
            self.train_step(rng.random((rows, self.in_features), dtype=np.float32),
                            rng.integers(0, self.classes, rows))
        self.params.copy_to_device(saved)

    def flat_params(self) -> np.ndarray:
        self.params.copy_to_host(self.model.flat)  # the host model holds the trained weights too
        return self.model.flat

    # ---- programs
    def _predictor(self, rows: int):
        cuda = self.cuda
        x = cuda.device_array((rows, self.in_features), np.float32)
        h = cuda.device_array((rows, self.hidden), np.float32)
        z = cuda.device_array((rows, self.classes), np.float32)
        launches = [
            self.gemm(x, self.weight1(self.params), h, bias=self.bias1(self.params), relu=True),
            self.gemm(h, self.weight2(self.params), z, bias=self.bias2(self.params)),
        ]
        return x, z, launches

    def _host_program(self, rows: int) -> _Program:
        """One kernel per op on a batch copied from the host (gpu-naive and gpu-tiled)."""
        from gpunn.kernels import elementwise, reduce, sgd, softmax

        cuda, p, g = self.cuda, self.params, self.grads
        x = cuda.device_array((rows, self.in_features), np.float32)
        y = cuda.device_array(rows, np.int32)
        h = cuda.device_array((rows, self.hidden), np.float32)
        z = cuda.device_array((rows, self.classes), np.float32)
        dz = cuda.device_array((rows, self.classes), np.float32)
        dh = cuda.device_array((rows, self.hidden), np.float32)
        losses = cuda.device_array(rows, np.float32)
        forward = [
            self.gemm(x, self.weight1(p), h),
            elementwise.bias_add(h, self.bias1(p), launch=False),
            elementwise.relu_forward(h, h, launch=False),
            self.gemm(h, self.weight2(p), z),
            elementwise.bias_add(z, self.bias2(p), launch=False),
            softmax.softmax_ce_grad(z, y, dz, losses, block=32, launch=False),
        ]
        backward = [
            self.gemm(h, dz, self.weight2(g), trans_a=True),
            reduce.colsum_atomic(dz, self.bias2(g), launch=False),
            self.gemm(dz, self.weight2(p), dh, trans_b=True),
            elementwise.relu_backward(h, dh, dh, launch=False),
            self.gemm(x, dh, self.weight1(g), trans_a=True),
            reduce.colsum_atomic(dh, self.bias1(g), launch=False),
            sgd.sgd_step(p, g, self.lr, launch=False),
        ]
        return _Program(forward, backward, x=x, y=y, losses=losses)


class GpuNaiveMlp(_GpuMlp):
    name = "gpu-naive"
    gemm_variant = "naive"


class GpuTiledMlp(_GpuMlp):
    name = "gpu-tiled"
    gemm_variant = "tiled16"


class GpuFusedMlp(_GpuMlp):
    """Device-resident data, folded biases, fused epilogues, 8 launches per step, no per-step host sync."""

    name = "gpu-fused"
    gemm_variant = "regblock"
    CE_BLOCK = 32  # one warp per row: the MLP has 10 classes

    def __init__(self, model, model_name: str, lr: float):
        super().__init__(model, model_name, lr)
        self.counter = self.cuda.to_device(np.zeros(1, dtype=np.int32))
        self.train_data = None
        self.epoch_clock = _Clock(self.stream, 1)

    def gemm(self, a, b, out, **kw):
        """regblock (64x64 tiles) when the output fills enough blocks, else the 16x16 tiles."""
        from gpunn.kernels import gemm

        rows, cols = out.shape
        variant = "regblock" if rows * cols >= 64 * 64 * 8 else "tiled16"
        return gemm.VERSIONS[variant](a, b, out, launch=False, **kw)

    def _resident_program(self, source, labels, order, counter, stride: int, rows: int, losses) -> _Program:
        """The 8 launches of one step on a `rows`-row batch gathered on the device."""
        from gpunn.kernels import elementwise, sgd, softmax

        cuda, p, g = self.cuda, self.params, self.grads
        ones_x = np.zeros((rows, self.in_features + 1), np.float32)
        ones_x[:, -1] = 1.0
        ones_h = np.zeros((rows, self.hidden + 1), np.float32)
        ones_h[:, -1] = 1.0
        xa = cuda.to_device(ones_x)  # [x | 1]: the gather fills the first in_features columns
        ha = cuda.to_device(ones_h)  # [relu(h) | 1]: the first GEMM fills the first hidden columns
        x = xa[:, :self.in_features]
        h = ha[:, :self.hidden]
        y = cuda.device_array(rows, np.int32)
        z = cuda.device_array((rows, self.classes), np.float32)
        dz = cuda.device_array((rows, self.classes), np.float32)
        dh = cuda.device_array((rows, self.hidden), np.float32)
        forward = [
            elementwise.gather_rows(source, labels, order, counter, stride, x, y, launch=False),
            self.gemm(xa, self.weight1(p, with_bias=True), h, relu=True),
            self.gemm(ha, self.weight2(p, with_bias=True), z),
            softmax.softmax_ce_grad(z, y, dz, losses, block=self.CE_BLOCK, counter=counter, stride=stride,
                                    launch=False),
        ]
        backward = [
            self.gemm(dz, self.weight2(p), dh, trans_b=True, relu_mask=h),  # before W2 is updated
            self.gemm(ha, dz, self.weight2(g, with_bias=True), trans_a=True),
            self.gemm(xa, dh, self.weight1(g, with_bias=True), trans_a=True),
            sgd.sgd_step(p, g, self.lr, counter=counter, launch=False),
        ]
        return _Program(forward, backward, losses=losses)

    def _host_program(self, rows: int) -> _Program:
        """The resident program over a one-batch 'dataset' the host batch is copied into (E3, tests)."""
        cuda = self.cuda
        x = cuda.device_array((rows, self.in_features), np.float32)
        y = cuda.device_array(rows, np.int32)
        order = cuda.to_device(np.arange(rows, dtype=np.int32))
        losses = cuda.device_array(rows, np.float32)
        counter = cuda.to_device(np.zeros(1, dtype=np.int32))  # (step * rows) % rows = 0: always this batch
        program = self._resident_program(x, y, order, counter, rows, rows, losses)
        program.x, program.y = x, y
        return program

    # ---- device-resident training (gpunn.train uses these when a backend has them)
    def load_train_data(self, x: np.ndarray, y: np.ndarray) -> None:
        """Copy the whole training set (float32 images, labels) to the GPU once."""
        cuda = self.cuda
        n = len(x)
        self.train_data = (
            cuda.to_device(np.ascontiguousarray(x.reshape(n, -1), dtype=np.float32)),
            cuda.to_device(np.asarray(y, dtype=np.int32)),
            cuda.device_array(n, np.int32),   # the epoch's order, refreshed every epoch
            cuda.device_array(n, np.float32),  # per-sample losses of the epoch
        )
        self._epoch_programs = {}

    def train_epoch(self, order: np.ndarray, batch: int) -> EpochResult:
        if self.train_data is None:
            raise RuntimeError(f"{self.name}: load_train_data() first")
        source, labels, order_d, losses = self.train_data
        n = source.shape[0]
        slices = batch_slices(n, batch)
        programs = []
        for s, e in slices:
            key = (e - s, batch)  # the rows of this step, and the stride its batch position is counted in
            if key not in self._epoch_programs:
                self._epoch_programs[key] = self._resident_program(source, labels, order_d, self.counter, batch,
                                                                   e - s, losses)
            programs.append(self._epoch_programs[key])
        if len(self.epoch_clock.times) != 2 * len(slices) + 1:
            self.epoch_clock = _Clock(self.stream, 2 * len(slices) + 1)
        order_d.copy_to_device(np.asarray(order, dtype=np.int32), stream=self.stream)
        self.counter.copy_to_device(np.zeros(1, dtype=np.int32), stream=self.stream)
        clock = self.epoch_clock
        clock.mark(0)
        for i, program in enumerate(programs):
            self._execute(program.forward)
            clock.mark(2 * i + 1)
            self._execute(program.backward)
            clock.mark(2 * i + 2)
        per_sample = losses.copy_to_host(stream=self.stream)
        self._wait()  # the epoch's only wait for the GPU
        forward_s = sum(clock.seconds(2 * i, 2 * i + 1) for i in range(len(slices)))
        backward_s = sum(clock.seconds(2 * i + 1, 2 * i + 2) for i in range(len(slices)))
        return EpochResult(float(np.sum(per_sample, dtype=np.float64)), forward_s, backward_s)


class GpuGraphMlp(GpuFusedMlp):
    """gpu-fused with each step's launches captured once into two CUDA graphs (forward, backward) and
    replayed: one graph launch replaces four kernel launches. Captured arguments are frozen, which the fused
    step allows: its batch position is read from the device-side step counter. Needs a real GPU (the
    simulator has no graphs)."""

    name = "gpu-graph"

    def __init__(self, model, model_name: str, lr: float):
        from gpunn.device import simulator_enabled
        from gpunn.errors import GpunnError

        if simulator_enabled():
            raise GpunnError(f"variant {self.name} captures CUDA graphs, which numba's CUDA simulator lacks; "
                             "use gpu-fused (the same kernels, launched one by one) under the simulator")
        super().__init__(model, model_name, lr)
        from cuda.core import Device

        device = Device()
        device.set_current()
        self.core_stream = device.create_stream()
        self.stream = self.cuda.external_stream(int(self.core_stream.handle))
        self.clock = _Clock(self.stream, 3)
        self.epoch_clock = _Clock(self.stream, 1)
        self._graphs: dict = {}

    def _execute(self, launches) -> None:
        key = id(launches)
        graph = self._graphs.get(key)
        if graph is None:
            builder = self.core_stream.create_graph_builder().begin_building()
            for launch in launches:
                launch.on(builder)
            graph = builder.end_building().complete()
            self._graphs[key] = (graph, launches)  # keep the launch list (and its buffers) alive with the graph
        else:
            graph = graph[0]
        graph.launch(self.core_stream)
