"""Training backends: the contract (base), the registry of variants (registry), the CPU backends and the GPU
engine (gpu/). See gpunn.backends.registry for the list of variants."""

from .base import Backend, EpochResult, StepTimes
from .registry import (
    VARIANTS,
    Variant,
    check_variant,
    cpu_threads,
    make_backend,
    runs_on_simulator,
    supported_models,
    uses_gpu,
)

__all__ = [
    "Backend",
    "EpochResult",
    "StepTimes",
    "VARIANTS",
    "Variant",
    "check_variant",
    "cpu_threads",
    "make_backend",
    "runs_on_simulator",
    "supported_models",
    "uses_gpu",
]
