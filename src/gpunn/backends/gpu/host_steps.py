"""The per-step variants' host path (`copy: sync`, the papers' naive design): every step copies its batch to the GPU
and reads its losses back, as E1's naive C++ does, through bound calls only (gpunn.kernels.transfers, .launch).

An epoch runs a plan made once per (training-set size, batch, sample shape): for each step its two bound uploads
(images, labels) from one of two pinned host buffers, its forward and backward launch calls, and its bound
download of the per-sample losses into that step's place in a pinned epoch-long buffer. While the GPU runs a step
the host gathers the next batch into the other pinned buffer and queues its upload behind the step's download (the
GPU copies it as soon as the step is done, before the host has woken), then waits for the step's losses, spinning
on an event recorded after their download: the losses are read back every step and the next step is launched only
once they are on the host, so the steps stay the papers' synchronous ones. Nothing is summed on the host per step: the
losses are added up once the epoch ends, when the first non-finite one (if any) names the batch where training
diverged. Measured on an H100 machine (issue 22): a driver call costs 2 us (an event record) to 7 us (a kernel
launch) there, so the MLP's 13-14 launches a step set the floor of these variants' step time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpunn.device import simulator_enabled
from gpunn.kernels import transfers
from gpunn.seeding import batch_slices

from ..base import EpochResult

PROGRESS_STEPS = 100  # the progress callback of a host-batch epoch is called every this many steps (and at the end)


@dataclasses.dataclass
class HostIO:
    """Two pinned batch buffers (images, labels) the host gathers into in turn, a pinned buffer a single step's
    losses are read back into (train_step), and bound copies between them and programs' device buffers."""

    capacity: int
    sample_shape: tuple
    x: list
    y: list
    losses: np.ndarray
    copies: dict = dataclasses.field(default_factory=dict)


def host_io(engine, rows: int, sample_shape) -> HostIO:
    """The engine's pinned buffers for host batches of up to `rows` rows of `sample_shape` (made again when
    larger or of another shape)."""
    shape = tuple(int(d) for d in sample_shape)
    io = engine._io
    if io is None or io.capacity < rows or io.sample_shape != shape:
        io = engine._io = HostIO(rows, shape, [transfers.host_buffer((rows, *shape), np.float32) for _ in range(2)],
                                 [transfers.host_buffer(rows, np.int32) for _ in range(2)],
                                 transfers.host_buffer(rows, np.float32))
    return io


def uploads(engine, io: HostIO, program, rows: int, slot: int):
    """(images, labels) uploads from `io`'s slot into `program`'s input (its staging buffers for a resident
    program stepping on host batches), bound once per (program, slot)."""
    key = (id(program), slot)
    if key not in io.copies:
        x, y = program.staging or (program.x.view, program.labels)
        io.copies[key] = (transfers.BoundCopy(x, io.x[slot][:rows].reshape(x.shape), engine.stream),
                          transfers.BoundCopy(y, io.y[slot][:rows], engine.stream), program)  # (program kept alive)
    return io.copies[key][:2]


def single_launches(items):
    """The single bound launches of a list of launches and launch groups, in order."""
    for item in items:
        if hasattr(item, "launches"):
            yield from single_launches(item.launches)
        else:
            yield item


def calls(launches) -> tuple:
    """The calls that run these bound launches: each launch's direct driver call once it has one."""
    return tuple(launch.call for launch in single_launches(launches))


@dataclasses.dataclass
class SyncPlan:
    key: tuple
    steps: list          # per step: (upload images, upload labels, forward calls, backward calls, download losses)
    losses: np.ndarray   # pinned (n,): the per-sample losses of the epoch, in batch order
    loaded: object       # a BoundEvent recorded after each step's download (its wait spins)


def sync_plan(engine, n: int, batch: int, sample_shape) -> SyncPlan:
    key = (n, batch, tuple(sample_shape))
    plan = engine._sync_plan
    if plan is not None and plan.key == key:
        return plan
    io = host_io(engine, min(batch, n), sample_shape)
    losses = transfers.host_buffer(n, np.float32)
    steps = []
    for i, (s, e) in enumerate(batch_slices(n, batch)):
        program = engine._step_program(e - s, sample_shape)
        upload_x, upload_y = uploads(engine, io, program, e - s, i % 2)
        download = transfers.BoundCopy(program.losses, losses[s:e], engine.stream, upload=False)
        steps.append((upload_x, upload_y, calls(program.forward), calls(program.backward), download))
    # the simulator's event takes no timing flag
    event = engine.cuda.event() if simulator_enabled() else engine.cuda.event(timing=False)
    loaded = transfers.BoundEvent(event, engine.stream, spin=True)
    engine._sync_plan = SyncPlan(key, steps, losses, loaded)
    return engine._sync_plan


def sync_epoch(engine, order: np.ndarray, batch: int, progress=None) -> EpochResult:
    """One epoch of host batches in `order`. Per step: forward and backward between three clock marks (GPU time of
    each phase, the copies outside), the losses read back; then, while the GPU runs the step, the next batch is
    gathered on the host and its upload queued behind this step's download, the previous step's phase times are
    read, and the host waits for this step's losses before it launches the next step."""
    x, y = engine._loaded()
    n = len(x)
    slices = batch_slices(n, batch)
    count = len(slices)
    plan = sync_plan(engine, n, batch, x.shape[1:])
    io = engine._io
    labels = engine._labels(y, n)
    order = np.asarray(order)
    clock = engine.epoch_clock
    clock.resize(3 * count)
    mark, seconds, record, wait = clock.mark, clock.seconds, plan.loaded.record, plan.loaded.synchronize
    phases = np.zeros((count, 2))  # per step: forward, backward GPU seconds

    def gather(i: int) -> None:
        s, e = slices[i]
        slot = i % 2
        np.take(x, order[s:e], axis=0, out=io.x[slot][:e - s], mode="clip")  # (a permutation: in range)
        np.take(labels, order[s:e], out=io.y[slot][:e - s], mode="clip")

    def read(i: int) -> None:  # step i's phase times (its marks are done)
        phases[i] = seconds(3 * i, 3 * i + 1), seconds(3 * i + 1, 3 * i + 2)

    gather(0)
    plan.steps[0][0]()
    plan.steps[0][1]()
    for i, (_, _, forward, backward, download) in enumerate(plan.steps):
        mark(3 * i)
        for call in forward:
            call()
        mark(3 * i + 1)
        for call in backward:
            call()
        mark(3 * i + 2)
        download()
        record()
        if i + 1 < count:
            gather(i + 1)  # on the host while the GPU runs step i; copied once step i is done
            upload_x, upload_y = plan.steps[i + 1][:2]
            upload_x()
            upload_y()
        if i:
            read(i - 1)
        wait()  # step i's losses are on the host
        if progress is not None and ((i + 1) % PROGRESS_STEPS == 0 or i + 1 == count):
            e = slices[i][1]
            progress(i + 1, count, float(np.sum(plan.losses[:e], dtype=np.float64)) / e)
    read(count - 1)
    forward_s, backward_s = (float(v) for v in phases.sum(axis=0))
    total = float(np.sum(plan.losses, dtype=np.float64))
    if np.isfinite(total):
        return EpochResult(total / n, forward_s, backward_s, count)
    first = int(np.argmax(~np.isfinite(plan.losses)))  # the first sample whose loss is not finite
    number = next(k for k, (s, e) in enumerate(slices, 1) if s <= first < e)
    s, e = slices[number - 1]
    return EpochResult(float(np.mean(plan.losses[s:e], dtype=np.float64)), forward_s, backward_s, count,
                       diverged_at=number)
