"""CUDA graphs of the engine's bound launches (graph policies, on a real GPU: the simulator has no graphs).

A launch list (a step's forward or backward) is captured once, on its first use, and replayed by one driver call
(cuGraphLaunch through ctypes, gpunn.kernels.libcuda). Under Policy.graph_epoch a resident epoch is one graph
(`epoch`): every step's forward and backward launches in the step loop's order, with the epoch clock's marks
between them as event nodes (Clock.capture_marks), so one call runs the epoch and the clock still times each step's
forward and backward. The steps of one size are the same launches (the device-side counter selects each step's
batch), so an epoch's graph serves every epoch of that batch size.
"""

from __future__ import annotations

from gpunn.kernels import libcuda


def capture_launches(builder, launches) -> None:
    """Capture `launches` in order on `builder` (a cuda.core graph builder)."""
    for launch in launches:
        launch.on(builder)


def capture_epoch(builder, programs, mark) -> None:
    """Capture an epoch of step `programs` on `builder` as the engine's step loop runs them: mark(0), then per step
    i its forward launches, mark(2 i + 1), its backward launches, mark(2 i + 2)."""
    mark(0)
    for i, program in enumerate(programs):
        capture_launches(builder, program.forward)
        mark(2 * i + 1)
        capture_launches(builder, program.backward)
        mark(2 * i + 2)


class Graphs:
    """The captured graphs of one engine, launched on its cuda.core stream; each kept with what it launches (its
    launch lists, whose buffers the graph reads)."""

    def __init__(self, core_stream):
        self.core_stream = core_stream
        self._steps: dict = {}   # id(launch list) -> (graph, launch list, its launch call)
        self._epochs: dict = {}  # ids of an epoch's step programs -> (graph, programs, its launch call)

    def launch(self, launches) -> None:
        """Run the graph of the launch list `launches` (captured now if it is new)."""
        self.step(launches)()

    def step(self, launches):
        """The launch call of the graph of `launches`, captured on its first use (nothing runs while capturing)."""
        entry = self._steps.get(id(launches))
        if entry is None:
            graph = self._capture(lambda builder: capture_launches(builder, launches))
            entry = self._steps[id(launches)] = (graph, launches, self._launcher(graph))
        return entry[2]

    def epoch(self, programs, clock):
        """The launch call of one epoch of step `programs` as one graph whose event nodes mark `clock` (marks 0 to
        2 len(programs)), captured on its first use; None where the clock's marks cannot be captured."""
        key = tuple(map(id, programs))
        entry = self._epochs.get(key)
        if entry is None:
            clock.resize(2 * len(programs) + 1)
            if clock.capture_marks(0) is None:
                return None

            def body(builder):
                capture_epoch(builder, programs, clock.capture_marks(_stream_handle(builder)))

            graph = self._capture(body)
            entry = self._epochs[key] = (graph, programs, self._launcher(graph))
        return entry[2]

    def _capture(self, body):
        builder = self.core_stream.create_graph_builder().begin_building()
        body(builder)
        return builder.end_building().complete()

    def _launcher(self, graph):
        if libcuda.library() is None:
            return lambda: graph.launch(self.core_stream)
        return libcuda.bound("cuGraphLaunch", int(graph.handle), _stream_handle(self.core_stream))


def _stream_handle(stream) -> int:
    """The driver handle of a cuda.core stream, or of the stream a graph builder captures."""
    return int(getattr(stream, "stream", stream).handle)
