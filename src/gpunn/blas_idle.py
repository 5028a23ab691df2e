"""OpenBLAS's idle threads in gpunn's processes: asleep right after a GEMM instead of spinning.

OpenBLAS keeps its threads spinning for about 2^28 cycles (0.1 s, longer than a training step) after each GEMM, on
the cores where gpunn.nn.sample_threads' pool then runs the batch's copies and elementwise passes. gpunn's command
lines (``python -m gpunn``, ``python -m gpunn.bench``) set OPENBLAS_THREAD_TIMEOUT=4 (sleep after 2^4 cycles) before
NumPy loads OpenBLAS, unless it is set already; the bits of every result are the same either way. An API session
keeps its own setting (NumPy is loaded before gpunn there).
"""

from __future__ import annotations

import os

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
SLEEP_AFTER = "4"  # log2 of the cycles an idle OpenBLAS thread spins (OpenBLAS accepts 4-30)


def sleep_when_idle(environ=None) -> str:
    """Set VARIABLE to SLEEP_AFTER unless it is set; the value in force (read by OpenBLAS when NumPy loads it)."""
    environ = os.environ if environ is None else environ
    return environ.setdefault(VARIABLE, SLEEP_AFTER)
