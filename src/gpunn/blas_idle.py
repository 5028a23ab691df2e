"""OpenBLAS's idle threads in gpunn's jobs of the convolutional models: asleep right after a GEMM, not spinning.

OpenBLAS keeps its threads spinning for about 2^28 cycles (0.1 s, longer than a training step) after each GEMM. A
CNN or autoencoder step runs gpunn.nn.sample_threads' passes (copies, im2col, elementwise work) between its GEMMs,
on the cores where those threads spin; an MLP step is GEMM after GEMM, where waking sleeping threads costs more than
their spinning. So gpunn's command lines (``python -m gpunn``, ``python -m gpunn.bench``) set
OPENBLAS_THREAD_TIMEOUT=4 (sleep after 2^4 cycles) before NumPy loads OpenBLAS when their arguments name a model
of SLEEPING_MODELS (a run path's model, the bench's op), unless it is set already. The bits of every result are the
same either way. An API session keeps its own setting (NumPy is loaded before gpunn there).
"""

from __future__ import annotations

import os
import re

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
SLEEP_AFTER = "4"  # log2 of the cycles an idle OpenBLAS thread spins (OpenBLAS accepts 4-30)
SLEEPING_MODELS = ("cnn", "autoencoder")  # models whose steps alternate GEMMs with sample-thread passes


def names_sleeping_model(argv) -> bool:
    """Whether a command line names a model of SLEEPING_MODELS: as a component of a path (a run path, an output
    folder) or of a comma list, or as a whole argument (the bench's op)."""
    return any(part in SLEEPING_MODELS for arg in argv for part in re.split(r"[/,=]", str(arg)))


def sleep_when_idle(argv, environ=None) -> str | None:
    """Set VARIABLE to SLEEP_AFTER for a command line that names_sleeping_model, unless it is set; the value in
    force (read by OpenBLAS when NumPy loads it), None: OpenBLAS's default."""
    environ = os.environ if environ is None else environ
    if names_sleeping_model(argv):
        environ.setdefault(VARIABLE, SLEEP_AFTER)
    return environ.get(VARIABLE)
