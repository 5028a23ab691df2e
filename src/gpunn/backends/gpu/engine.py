"""The GPU training engine: one engine for every model of gpunn.nn, configured by a policy (policy.py).

Built from the model's layer list and flat parameter layout (the CPU reference's), it keeps the parameters and
their gradients in two flat device buffers, starts from the model's init and trains on the batches of the shared
order (gpunn.seeding), so it can be compared with cpu-numpy step by step.

For each batch shape it binds a step program once: the forward launches (the batch gather when the data is resident,
every stage's forward, the loss head writing per-sample losses and the output gradient: the model's, or the last
stage's when it fuses it, layers.Stage.loss_head) and the backward launches
(every stage's backward in reverse, one SGD launch that also advances the device-side step counter), or for a
resident MLP under Policy.step "persistent" its whole step in two launches (persistent.py). Steps replay the bound
launches (gpunn.kernels.launch) or, under a graph policy, two captured CUDA graphs (graphs.py), or a resident
epoch's steps all in one graph (Policy.graph_epoch); one event clock (gpunn.kernels.launch.Clock) times each step's
forward and backward. Resident epochs run with no host wait: the
per-sample losses accumulate in an epoch-long device buffer, read once at the end.

Per-step policies copy each batch from the host. `copy: sync` (gpu-naive, gpu-tiled) copies it before the step and
reads the step's losses back after it, as the papers' naive code does, through bound copies and launches only
(host_steps.py). `copy: pipelined` (gpu-optimized) gathers the next batches into pinned host buffers and copies each
on a copy stream of its own while the GPU computes the current step (pipelined.py). Its losses stay on the GPU like
the resident ones'.

Under numba's simulator the policy's conv versions that need warp shuffles run their shared-memory twin, and the
kernels that take a thread count run small blocks unless the run chose one (Policy.for_simulator).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gpunn.device import require_gpu, require_tensor_cores, simulator_enabled
from gpunn.errors import GpunnError
from gpunn.kernels import transfers
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.seeding import batch_slices

from ..base import Backend, DeferredSplitEpoch, EpochResult, StepTimes, check_reduction_setting
from . import host_steps, persistent, pipelined
from .graphs import Graphs
from .host_steps import single_launches as _launches
from .layers import HEADS, Act, Binder, LinearStage, plan
from .policy import Policy


@dataclasses.dataclass
class Program:
    """The bound launches of one training step at one batch shape, and the buffers they use."""

    forward: list
    backward: list
    x: Act | None     # the input batch (what the gather or the host copy fills; None: the persistent step's)
    labels: object    # (rows,) int32 labels (zeros for the autoencoder, whose target is x; None: as x)
    losses: object    # per-sample losses: (rows,), or the epoch-long buffer of resident epochs
    staging: tuple = ()  # resident policies stepping on host batches: (source, labels) the batch is copied into
    updates: int = 1     # the SGD launches ending `backward` (one per layer under `sgd: per_layer`)
    gradients: list | None = None  # what computes the flat gradient, no update (None: all but the SGD launches)



class GpuEngine(Backend):
    def __init__(self, model, model_name: str, lr: float, policy: Policy, reduction: str = DEFAULT_REDUCTION):
        check_reduction_setting(model_name, reduction)
        require_gpu(f"variant {policy.name}")
        if policy.precision != "fp32":
            require_tensor_cores(f"variant {policy.name}")
        if policy.graphs and simulator_enabled():
            from gpunn.nn.models import MODELS

            spec = MODELS.get(model_name)
            twin = spec.cuda_variants[1] if spec is not None else "gpu-fused"
            raise GpunnError(f"variant {policy.name} captures CUDA graphs, which numba's CUDA simulator lacks; "
                             f"under the simulator use {twin} (no graphs) for the {model_name}")
        super().__init__(model, model_name, lr)
        from numba import cuda

        from gpunn.kernels.launch import Clock

        if simulator_enabled():
            policy = policy.for_simulator()
        self.cuda = cuda
        self.name = policy.name
        self.policy = policy
        self.train_stages = plan(model.layers, policy, fold=True, loss=self.model_spec.loss)
        self.persistent = persistent.fits(self)  # resident steps in two launches (Policy.step, persistent.py)
        # predictions: the fused forward (epilogues, no ones columns) with the policy's kernel versions
        predict_policy = dataclasses.replace(policy, fuse=True)
        self.predict_stages = plan(model.layers, predict_policy, fold=False)
        if sum(stage.params for stage in self.train_stages) != model.flat.size:
            raise GpunnError(f"GPU engine: the stages of {model_name} cover "
                             f"{sum(s.params for s in self.train_stages)} parameters, the model has {model.flat.size}")
        self.head = HEADS[self.model_spec.loss]
        self.params = cuda.to_device(model.flat)
        self.grads = cuda.to_device(np.zeros_like(model.flat))
        # the loss head's gradient is of the batch mean or sum (`reduction`; the autoencoder's mse head: the mean only)
        self.binder = Binder(policy, self.params, self.grads, self.lr, reduction)
        self.predict_binder = Binder(predict_policy, self.params, self.grads, self.lr)
        self.counter = cuda.to_device(np.zeros(1, dtype=np.int32))  # the step of the resident epoch
        self.stream = 0  # where copies, launches and events go (a graph policy has its own stream)
        self.graphs = None  # a graph policy's captured graphs (graphs.Graphs)
        if policy.graphs:
            self.core_stream, self.stream = self._core_stream()
            self.graphs = Graphs(self.core_stream)
        self.step_clock = Clock(self.stream, 3)
        self.epoch_clock = Clock(self.stream, 1)
        self._step_programs: dict = {}
        self._epoch_programs: dict = {}
        self._predictors: dict = {}
        self._resident = None
        self._device_epochs = 0  # epochs run on the epoch clock (a split read later than the next one is refused)
        self._pipe = None  # pipelined epochs' buffers, streams and programs (pipelined.Pipeline)
        self._io = None  # host-batch steps' pinned buffers and bound copies (host_steps.host_io)
        self._sync_plan = None  # the bound calls of `copy: sync` epochs (host_steps.sync_plan)
        self._sync_stream = transfers.synchronizer(self.stream)  # waits for this stream's work, copies included
        self._step_wait = transfers.synchronizer(self.stream, spin=True)  # a host-batch step's wait for its losses

    def __repr__(self):
        return f"GpuEngine({self.name}: {' -> '.join(map(repr, self.train_stages))} -> {self.model_spec.loss})"

    # ---- program construction
    def _shapes(self, stages, sample_shape):
        shapes = [tuple(int(s) for s in sample_shape)]
        for stage in stages:
            shapes.append(stage.out_shape(shapes[-1]))
        first = 0  # leading views (Flatten): the input buffer is allocated in the shape after them
        while first < len(stages) and stages[first].view:
            first += 1
        return shapes, first

    def _act(self, rows: int, shape: tuple, folded_consumer: bool) -> Act:
        cuda = self.cuda
        if folded_consumer:  # [view | 1]: the consumer's GEMM reads the ones column as the bias input
            if len(shape) != 1:
                raise GpunnError(f"GPU engine: a folded bias needs a 2-D input, got {shape}")
            host = np.zeros((rows, shape[0] + 1), np.float32)
            host[:, -1] = 1.0
            full = cuda.to_device(host)
            return Act(full[:, :shape[0]], full)
        buf = cuda.device_array((rows, *shape), np.float32)
        return Act(buf, buf)

    def _forward_acts(self, stages, rows: int, sample_shape, binder):
        """(activations, forward launches, index of the first kernel stage, shapes) of the stages."""
        shapes, first = self._shapes(stages, sample_shape)
        acts: list = [None] * (len(stages) + 1)
        acts[first] = self._act(rows, shapes[first], first < len(stages) and stages[first].fold)
        launches = []
        for i in range(first, len(stages)):
            stage = stages[i]
            if stage.view:
                view = acts[i].view.reshape(rows, *shapes[i + 1])
                acts[i + 1] = Act(view, view)
            elif stage.in_place:
                acts[i + 1] = acts[i]
            else:
                consumer = stages[i + 1] if i + 1 < len(stages) else None
                acts[i + 1] = self._act(rows, shapes[i + 1], consumer is not None and consumer.fold)
            launches += stage.forward(binder, acts[i], acts[i + 1])
        return acts, launches, first, shapes

    def _program(self, rows: int, sample_shape, source=None, labels=None, order=None, counter=None, stride: int = 0,
                 losses=None) -> Program:
        """A step program on `rows` rows: gathered on the device from (source, labels, order, counter, stride)
        when `source` is given, else filled by a host copy."""
        from gpunn.kernels import elementwise

        cuda, stages, binder = self.cuda, self.train_stages, self.binder
        if losses is None:
            losses = cuda.device_array(rows, np.float32)
        if self.persistent and source is not None:  # the whole step in two launches (persistent.py)
            forward, backward, grads = persistent.launches(self, rows, source, labels, order, counter, stride, losses)
            return Program(forward, backward, None, None, losses, gradients=grads)
        acts, forward, first, shapes = self._forward_acts(stages, rows, sample_shape, binder)
        x = acts[first]
        y = cuda.to_device(np.zeros(rows, np.int32))
        if source is not None:
            x2d = x.view if len(x.view.shape) == 2 else x.view.reshape(rows, -1)
            forward.insert(0, elementwise.gather_rows(source, labels, order, counter, stride, x2d, y, launch=False,
                                                      **self.policy.kw()))
        out = acts[-1].view
        dacts: list = [None] * (len(stages) + 1)
        dacts[-1] = cuda.device_array(out.shape, np.float32)
        target = x.view.reshape(rows, -1) if self.target_is_input else None
        head = stages[-1].loss_head(acts[-2], self.head)  # the last stage's fused head, or the model's loss head
        forward += head(binder, out.reshape(rows, -1), y, target, dacts[-1].reshape(rows, -1), losses, counter, stride)
        backward = []
        for i in reversed(range(first, len(stages))):
            stage, dy = stages[i], dacts[i + 1]
            if stage.view:
                dacts[i] = dy.reshape(rows, *shapes[i])
                continue
            if stage.in_place:
                dacts[i] = dy
            elif i > first:
                dacts[i] = cuda.device_array((rows, *shapes[i]), np.float32)
            dx = dacts[i] if i > first else None
            mask = self._mask(stages, i, acts) if dx is not None else None
            backward += stage.backward(binder, acts[i], acts[i + 1], dy, dx, mask)
        updates = self._sgd(counter)
        return Program(forward, backward + updates, x, y, losses, updates=len(updates))

    def _sgd(self, counter) -> list:
        """The step's parameter update: one launch over the flat buffer, or one per layer's parameters (the last
        one advancing the step counter); each zeroes the gradients it used."""
        from gpunn.kernels import sgd

        kw = self.policy.kw()
        if self.policy.sgd == "flat":
            return [sgd.sgd_step(self.params, self.grads, self.lr, counter=counter, launch=False, **kw)]
        spans = [(stage.offset, stage.params) for stage in self.train_stages if stage.params]
        return [sgd.sgd_step(self.params[start:start + size], self.grads[start:start + size], self.lr,
                             counter=counter if i == len(spans) - 1 else None, launch=False, **kw)
                for i, (start, size) in enumerate(spans)]

    def _mask(self, stages, i: int, acts):
        """The ReLU mask of stage i's input gradient: its input, when the nearest kernel stage before it ends in a
        fused ReLU (that input is then the ReLU's output, > 0 exactly where the ReLU passed its gradient)."""
        j = i - 1
        while j >= 0 and stages[j].view:
            j -= 1
        return acts[i].view if j >= 0 and stages[j].relu else None

    def _step_program(self, rows: int, sample_shape) -> Program:
        key = (rows, tuple(sample_shape))
        if key not in self._step_programs:
            if self.policy.resident:
                # the resident program over a one-batch "dataset" the host batch is copied into (E3, tests)
                cuda = self.cuda
                features = math.prod(sample_shape)
                source = cuda.device_array((rows, features), np.float32)
                labels = cuda.device_array(rows, np.int32)
                order = cuda.to_device(np.arange(rows, dtype=np.int32))
                counter = cuda.to_device(np.zeros(1, dtype=np.int32))  # (step * rows) % rows = 0: this batch
                program = self._program(rows, sample_shape, source, labels, order, counter, rows)
                program.staging = (source, labels)
            else:
                program = self._program(rows, sample_shape)
            self._step_programs[key] = program
        return self._step_programs[key]

    # ---- execution
    def _execute(self, launches) -> None:
        if self.graphs is None:
            for launch in launches:
                launch()
            return
        self.graphs.launch(launches)

    def _epoch_graph(self, programs):
        """The launch call of the epoch graph of `programs` (Policy.graph_epoch), or None: the step loop."""
        if self.graphs is None or not self.policy.graph_epoch:
            return None
        return self.graphs.epoch(programs, self.epoch_clock)

    def _run_host_step(self, program: Program, rows: int) -> float:
        """One synchronous step on the batch in pinned slot 0: upload it, the forward and backward launches between
        three step-clock marks (GPU time of each phase, the copy outside), read the losses back, wait; returns the
        sum of the step's per-sample losses."""
        io = self._io
        upload_x, upload_y = host_steps.uploads(self, io, program, rows, 0)
        key = ("losses", id(program))
        if key not in io.copies:
            io.copies[key] = (transfers.BoundCopy(program.losses, io.losses[:rows], self.stream, upload=False),
                              program)
        download = io.copies[key][0]
        clock = self.step_clock
        upload_x()
        upload_y()
        clock.mark(0)
        self._execute(program.forward)
        clock.mark(1)
        self._execute(program.backward)
        clock.mark(2)
        download()
        self._step_wait()
        return float(np.sum(io.losses[:rows], dtype=np.float64))

    # ---- the backend contract
    def train_step(self, xb: np.ndarray, target) -> StepTimes:
        """One synchronous step on a host batch: copied in, its losses read back (the papers' naive step; E3's
        latency); its forward and backward times are GPU times from events around each phase."""
        rows = len(xb)
        program = self._step_program(rows, xb.shape[1:])
        self._stage(xb, target)
        total = self._run_host_step(program, rows)
        return StepTimes(total / rows, self.step_clock.seconds(0, 1), self.step_clock.seconds(1, 2))

    def _stage(self, xb: np.ndarray, target) -> None:
        """A host batch into pinned slot 0."""
        rows = len(xb)
        io = host_steps.host_io(self, rows, xb.shape[1:])
        io.x[0][:rows] = np.asarray(xb, np.float32).reshape(io.x[0][:rows].shape)
        io.y[0][:rows] = self._labels(target, rows)

    def gradients(self, xb: np.ndarray, target) -> np.ndarray:
        """The flat gradient of one batch, without updating the parameters (for tests)."""
        rows = len(xb)
        program = self._step_program(rows, xb.shape[1:])
        self._stage(xb, target)
        for upload in host_steps.uploads(self, self._io, program, rows, 0):
            upload()
        for launch in program.gradients or program.forward + program.backward[:-program.updates]:
            launch.on(self.stream)
        grads = self.grads.copy_to_host(stream=self.stream)
        self._sync_stream()
        self.grads.copy_to_device(np.zeros_like(grads), stream=self.stream)
        return grads

    def load_train_data(self, x: np.ndarray, y) -> None:
        """Host float32 images for the per-step policies (Backend's); the resident ones copy the training set to the
        GPU once, uint8 pixels as they come (a quarter of the bytes, no float copy on the host) and made float32
        there (elementwise.pixels_to_float: the same values)."""
        if not self.policy.resident:
            super().load_train_data(x, y)
            return
        x = np.asarray(x)
        self._train_x, self._train_y = x, None if y is None else np.asarray(y)  # its length and shape are read
        cuda = self.cuda
        n = len(x)
        labels = self._labels(y, n)
        self._resident = (
            self._resident_images(np.ascontiguousarray(x.reshape(n, -1))),
            cuda.to_device(labels),
            cuda.device_array(n, np.int32),   # the epoch's order, refreshed every epoch
            cuda.device_array(n, np.float32),  # per-sample losses of the epoch
        )
        self._sample_shape = tuple(x.shape[1:])
        self._epoch_programs = {}

    def _resident_images(self, flat: np.ndarray):
        """(N, F) float32 device images of host (N, F) uint8 pixels or float32 images."""
        if flat.dtype != np.uint8:
            return self.cuda.to_device(flat.astype(np.float32, copy=False))
        from gpunn.kernels import elementwise

        images = self.cuda.device_array(flat.shape, np.float32)
        elementwise.pixels_to_float(self.cuda.to_device(flat), images)
        self.cuda.synchronize()  # the default stream's launch done before the engine's stream reads the images
        return images

    def train_epoch(self, order: np.ndarray, batch: int, progress=None) -> EpochResult:
        if self.policy.resident:
            return self._resident_epoch(order, batch)
        if self.policy.copy == "pipelined":
            return pipelined.epoch(self, order, batch)
        return host_steps.sync_epoch(self, order, batch, progress)

    def _resident_epoch(self, order: np.ndarray, batch: int) -> EpochResult:
        if self._resident is None:
            raise RuntimeError(f"{self.name}: load_train_data() before train_epoch()")
        source, _, order_d, losses = self._resident
        programs = self._resident_programs(batch)
        order_d.copy_to_device(np.asarray(order, dtype=np.int32), stream=self.stream)
        return self._device_epoch(programs, losses, source.shape[0])

    def _resident_programs(self, batch: int) -> list:
        """The step program of each step of a resident epoch at `batch` (one per distinct step size)."""
        source, labels, order_d, losses = self._resident
        programs = []
        for s, e in batch_slices(source.shape[0], batch):
            key = (e - s, batch)  # the rows of this step, and the stride its batch position is counted in
            if key not in self._epoch_programs:
                self._epoch_programs[key] = self._program(e - s, self._sample_shape, source, labels, order_d,
                                                          self.counter, batch, losses)
            programs.append(self._epoch_programs[key])
        return programs

    def prepare_epoch(self, batch: int) -> None:
        """The epoch's step programs, bound copies and clock events (and a graph variant's graphs), made before
        the first epoch is timed: making them inside it doubled E1's first gpu-naive epoch on the H100 (0.30 s
        against 0.15 s, issue 22)."""
        x, _ = self._loaded()
        steps = len(batch_slices(len(x), batch))
        if self.policy.resident:
            programs = self._resident_programs(batch)
            self.epoch_clock.resize(2 * steps + 1)
            if self.graphs is not None and self._epoch_graph(programs) is None:
                for program in {id(p): p for p in programs}.values():
                    self.graphs.step(program.forward)
                    self.graphs.step(program.backward)
        elif self.policy.copy == "pipelined":
            pipelined.steps(self, x.shape[1:], batch)
            self.epoch_clock.resize(2 * steps + 1)
        else:
            host_steps.sync_plan(self, len(x), batch, x.shape[1:])
            self.epoch_clock.resize(3 * steps)

    def _device_epoch(self, programs, losses, n: int, before_step=None, after_step=None) -> EpochResult:
        """Run one epoch's step programs with no host wait (the callbacks queue a step's copies and events), then
        read the per-sample losses the steps wrote into `losses` (the epoch's only wait for the GPU)."""
        self.epoch_clock.resize(2 * len(programs) + 1)
        self.counter.copy_to_device(np.zeros(1, dtype=np.int32), stream=self.stream)
        clock = self.epoch_clock
        epoch = self._epoch_graph(programs) if before_step is None and after_step is None else None
        if epoch is not None:
            epoch()  # the loop below, captured (graphs.capture_epoch)
        else:
            clock.mark(0)
            for i, program in enumerate(programs):
                if before_step is not None:
                    before_step(i)
                self._execute(program.forward)
                clock.mark(2 * i + 1)
                self._execute(program.backward)
                clock.mark(2 * i + 2)
                if after_step is not None:
                    after_step(i)
        per_sample = losses.copy_to_host(stream=self.stream)
        self._sync_stream()
        steps = len(programs)
        self._device_epochs += 1
        serial = self._device_epochs

        def split() -> tuple[float, float]:  # read after the caller's clock (DeferredSplitEpoch)
            if serial != self._device_epochs:
                raise RuntimeError(f"{self.name}: an epoch's forward / backward split read after the next epoch ran")
            return (sum(clock.seconds(2 * i, 2 * i + 1) for i in range(steps)),
                    sum(clock.seconds(2 * i + 1, 2 * i + 2) for i in range(steps)))

        return DeferredSplitEpoch(float(np.sum(per_sample, dtype=np.float64)) / n, steps, split)

    def _side_stream(self):
        """A stream that never waits for the legacy default stream the step launches go to (cuda.core's
        streams are non-blocking); the simulator runs every copy synchronously anyway."""
        if simulator_enabled():
            return self.cuda.stream()
        self._side_core_stream, stream = self._core_stream()  # the cuda.core stream kept alive with the engine
        return stream

    def _core_stream(self):
        """(a new cuda.core stream on the current device, numba's handle on it): graph capture needs the former,
        numba's copies, launches and events the latter."""
        from cuda.core import Device

        dev = Device()
        dev.set_current()
        core = dev.create_stream()
        return core, self.cuda.external_stream(int(core.handle))

    def _labels(self, y, n: int) -> np.ndarray:
        """int32 labels of n samples: the classifier's, or zeros for the autoencoder (its target is its input)."""
        return np.zeros(n, np.int32) if self.target_is_input else np.asarray(y, dtype=np.int32)

    def predict(self, xb: np.ndarray, layers: int | None = None) -> np.ndarray:
        """The model's outputs for the batch xb, or with `layers` those of its first `layers` layers (the
        autoencoder's encoder: gpunn.features); the forward launches are bound once per batch shape."""
        rows = len(xb)
        key = (rows, tuple(xb.shape[1:]), layers)
        if key not in self._predictors:
            stages = self.predict_stages
            if layers is not None:  # the leading layers' stages: their offsets into the flat buffer are the same
                stages = plan(self.model.layers[:layers], self.predict_binder.policy, fold=False)
            acts, launches, first, _ = self._forward_acts(stages, rows, xb.shape[1:], self.predict_binder)
            self._predictors[key] = (acts[first].view, acts[-1].view, launches)
        x, out, launches = self._predictors[key]
        x.copy_to_device(np.ascontiguousarray(xb, dtype=np.float32).reshape(x.shape))
        for launch in launches:
            launch()
        return out.copy_to_host()

    def warm_up(self, batch_sizes) -> None:
        """Compile every kernel the steps at these batch sizes launch (numba compiles on first call), on random
        batches, then restore the parameters: no timed step pays for compilation. Under the simulator, which
        compiles nothing, the step programs are only built (their launch checks run). The sample shape is the
        loaded training set's (load_train_data first), else the model's first Linear input.

        A block size that this device or a compiled kernel cannot run (too many threads, or registers / shared
        memory for that many) stops here, before any training, with one GpunnError naming the kernel."""
        shape = self._sample_shape_for_warm_up()
        with self._block_errors():
            if simulator_enabled():
                for rows in sorted(set(batch_sizes)):
                    self._step_program(rows, shape)
                return
            saved = self.params.copy_to_host()
            rng = np.random.default_rng(0)
            for rows in sorted(set(batch_sizes)):
                xb = rng.random((rows, *shape), dtype=np.float32)
                self.train_step(xb, xb if self.target_is_input else rng.integers(0, 2, rows))
                self._check_compiled_blocks(self._step_program(rows, shape))
            self.params.copy_to_device(saved)

    def _block_errors(self):
        """Launch-configuration failures while building or first running the steps, as one GpunnError line."""
        import contextlib

        engine = self

        @contextlib.contextmanager
        def converted():
            try:
                yield
            except GpunnError:
                raise
            except Exception as exc:  # numba's launch errors, the launchers' ValueErrors, cuLaunchKernel failures
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if not any(word in text.lower() for word in ("block", "resources", "launch", "threads")):
                    raise
                setting = f"block size {engine.policy.block}" if engine.policy.block else "its default blocks"
                raise GpunnError(f"variant {engine.name} cannot run with {setting} here: {text}; choose a smaller "
                                 "block size (the run path's _t<threads>)") from None

        return converted()

    def _check_compiled_blocks(self, program) -> None:
        """Every launch's threads within its compiled kernel's limit (registers and shared memory can make that
        lower than the device's 1024): a kernel that would not launch, or would be starved, fails here."""
        from gpunn.device import check_block

        for launch in _launches(program.forward + program.backward):
            threads = int(np.prod(launch.block))
            try:
                check_block(launch.name, threads, launch.kernel)
            except ValueError as exc:
                raise GpunnError(f"variant {self.name}: {exc}; choose a smaller block size (the run path's "
                                 "_t<threads>)") from None

    def _sample_shape_for_warm_up(self) -> tuple:
        if self._train_x is not None:
            return tuple(self._train_x.shape[1:])
        for stage in self.train_stages:
            if isinstance(stage, LinearStage):
                return (stage.inputs,)
        raise GpunnError(f"{self.name}: load_train_data() before warm_up(): the input shape comes from the data")

    def parameters(self) -> np.ndarray:
        self.params.copy_to_host(self.model.flat)  # the host model holds the trained weights too
        return self.model.flat

