"""Pipelined epochs (Policy.copy "pipelined": gpu-optimized): step i's batch is gathered on the host into pinned
buffer i % PIPELINE_DEPTH and copied on a copy stream of its own into that slot's device input, PIPELINE_DEPTH - 1
steps ahead of the compute; events order a slot's copy after the last step that read that slot, and the step after
its copy. The steps themselves are the engine's (GpuEngine._device_epoch, its losses kept on the GPU until the epoch
ends)."""

from __future__ import annotations

import dataclasses

import numpy as np

from gpunn.kernels import transfers
from gpunn.seeding import batch_slices

from ..base import EpochResult
from .policy import PIPELINE_DEPTH


@dataclasses.dataclass
class Pipeline:
    """What pipelined epochs reuse: PIPELINE_DEPTH pinned host buffers (images, labels), the copy stream, an event
    per slot marking its copy done and one marking its step done (bound: gpunn.kernels.transfers.BoundEvent), the
    epoch's loss buffer, and per (rows, slot) the program with its bound copies from that slot."""

    key: tuple
    pinned_x: list
    pinned_y: list
    copy_stream: object
    copied: list
    computed: list
    losses: object
    programs: dict


def epoch(engine, order: np.ndarray, batch: int) -> EpochResult:
    """One pipelined epoch of `engine`'s loaded training set in `order` at `batch`."""
    x, y = engine._loaded()
    n = len(x)
    slices = batch_slices(n, batch)
    pipe, programs, copies = steps(engine, x.shape[1:], batch)
    depth = len(pipe.pinned_x)
    order = np.asarray(order)
    labels = engine._labels(y, n)

    def copy_ahead(i: int) -> None:
        """Gather batch i into its pinned buffer and queue its copy on the copy stream."""
        slot = i % depth
        s, e = slices[i]
        rows = e - s
        pipe.copied[slot].synchronize()  # this pinned buffer's previous copy (depth steps ago) has left it
        np.take(x, order[s:e], axis=0, out=pipe.pinned_x[slot][:rows], mode="clip")  # (a permutation)
        np.take(labels, order[s:e], out=pipe.pinned_y[slot][:rows], mode="clip")
        pipe.computed[slot].wait()  # the copy stream waits for the step that last read this slot's input
        upload_x, upload_y = copies[i]
        upload_x()
        upload_y()
        pipe.copied[slot].record()

    for i in range(min(depth - 1, len(slices))):
        copy_ahead(i)

    def before_step(i: int) -> None:
        if i + depth - 1 < len(slices):
            copy_ahead(i + depth - 1)
        pipe.copied[i % depth].wait()  # the step waits for its batch's copy

    def after_step(i: int) -> None:
        pipe.computed[i % depth].record()

    return engine._device_epoch(programs, pipe.losses, n, before_step, after_step)


def steps(engine, sample_shape, batch: int):
    """(the pipeline, each step's program, each step's (images, labels) upload) of a pipelined epoch of `engine`'s
    loaded training set at `batch`."""
    n = len(engine._loaded()[0])
    pipe = pipeline(engine, n, batch, sample_shape)
    depth = len(pipe.pinned_x)
    programs, copies = [], []
    for i, (s, e) in enumerate(batch_slices(n, batch)):
        rows, slot = e - s, i % depth
        key = (rows, slot)
        if key not in pipe.programs:
            program = engine._program(rows, sample_shape, counter=engine.counter, stride=batch, losses=pipe.losses)
            pipe.programs[key] = (program, (
                transfers.BoundCopy(program.x.view, pipe.pinned_x[slot][:rows].reshape(program.x.view.shape),
                                    pipe.copy_stream),
                transfers.BoundCopy(program.labels, pipe.pinned_y[slot][:rows], pipe.copy_stream)))
        programs.append(pipe.programs[key][0])
        copies.append(pipe.programs[key][1])
    return pipe, programs, copies


def pipeline(engine, n: int, batch: int, sample_shape) -> Pipeline:
    """`engine`'s pinned host buffers, copy stream, events and per-slot programs of pipelined epochs (made once per
    training-set size and batch)."""
    key = (n, batch, tuple(sample_shape))
    if engine._pipe is None or engine._pipe.key != key:
        cuda = engine.cuda
        depth = PIPELINE_DEPTH
        copy_stream = engine._side_stream()
        engine._pipe = Pipeline(
            key=key,
            pinned_x=[cuda.pinned_array((batch, *sample_shape), np.float32) for _ in range(depth)],
            pinned_y=[cuda.pinned_array(batch, np.int32) for _ in range(depth)],
            copy_stream=copy_stream,
            # a slot's copy done (recorded on the copy stream, waited for by the step's stream and the host),
            # a slot's step done (recorded on the step's stream, waited for by the copy stream)
            copied=[transfers.BoundEvent(cuda.event(), copy_stream, engine.stream) for _ in range(depth)],
            computed=[transfers.BoundEvent(cuda.event(), engine.stream, copy_stream) for _ in range(depth)],
            losses=cuda.device_array(n, np.float32),
            programs={},
        )
    return engine._pipe
