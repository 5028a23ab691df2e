"""Bound kernel launches: a kernel with its grid, block and arguments fixed once, launched by a call.

Training steps launch the same kernels on the same device buffers thousands of times. Checking shapes,
computing grids and configuring the launch once, instead of at every step, keeps the per-launch host
cost down to numba's own dispatch; the list of bound launches of a step is also what a CUDA graph
captures (``launch.on(graph_builder)``).
"""

from __future__ import annotations

from gpunn import device


class Launch:
    """``kernel[grid, block, stream](*args)``, configured once; ``launch()`` runs it again."""

    __slots__ = ("kernel", "grid", "block", "args", "stream", "name", "_configured")

    def __init__(self, kernel, grid, block, args, stream=0, name: str = ""):
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.args = tuple(args)
        self.stream = stream
        self.name = name or getattr(kernel, "__name__", "kernel")
        # The simulator's kernel object keeps a single mutable configuration, so it is configured anew at
        # every call there; on a GPU the configured launch object is reusable.
        self._configured = None if device.simulator_enabled() else kernel[grid, block, stream]

    def __call__(self) -> None:
        if self._configured is None:
            self.kernel[self.grid, self.block, self.stream](*self.args)
        else:
            self._configured(*self.args)

    def on(self, stream) -> None:
        """Launch on another stream (or a graph builder, to capture it)."""
        self.kernel[self.grid, self.block, stream](*self.args)

    def __repr__(self) -> str:
        return f"Launch({self.name}, grid={self.grid}, block={self.block})"


class LaunchGroup:
    """Several bound launches run in order as one (e.g. zeroing a buffer, then accumulating into it)."""

    __slots__ = ("launches",)

    def __init__(self, launches):
        self.launches = tuple(launches)

    def __call__(self) -> None:
        for launch in self.launches:
            launch()

    def on(self, stream) -> None:
        for launch in self.launches:
            launch.on(stream)

    def __repr__(self) -> str:
        return f"LaunchGroup({', '.join(map(repr, self.launches))})"


def bind(kernel, grid, block, args, stream=0, launch: bool = True, name: str = "") -> Launch:
    """A bound launch of `kernel`; launched once now unless `launch` is False."""
    bound = Launch(kernel, grid, block, args, stream, name)
    if launch:
        bound()
    return bound
