"""Checks of config values against the registries, each a GpunnError of one line naming the config key: a known
dataset (gpunn.data.registry) that the model can take, known variants (gpunn.backends.registry) that train the
model and, under the simulator, can run there. Used by gpunn.config and by the experiments' own checks."""

from __future__ import annotations

from gpunn.backends import registry as variants
from gpunn.data.registry import DATASETS
from gpunn.errors import GpunnError
from gpunn.nn.models import model_spec

SIMULATOR_MACHINE = "cudasim"  # config key machine under gpu.simulator
CPU_MACHINE = "cpu"  # config key machine without a GPU (none found, or gpu.enabled: false)


def gpu_machine(config: dict) -> bool:
    """Whether this config's jobs run on a real GPU machine: GPU jobs on, and its resolved `machine` neither the CPU
    nor the simulator."""
    return bool(config["gpu"]["enabled"]) and config["machine"] not in (CPU_MACHINE, SIMULATOR_MACHINE)


def choice_error(key: str, value, choices, why: str = "") -> GpunnError:
    return GpunnError(f"config key {key} = {value!r}{why}; choose one of {', '.join(map(str, choices))}")


def check_dataset(key: str, name, model: str | None = None) -> None:
    if name not in DATASETS:
        raise choice_error(key, name, DATASETS, " is not a known dataset")
    side = model_spec(model).side_multiple if model is not None else 1
    if side > 1:
        _, height, width = DATASETS[name].image_shape
        if height != width or height % side:
            fits = [n for n, s in DATASETS.items()
                    if s.image_shape[1] == s.image_shape[2] and s.image_shape[1] % side == 0]
            raise choice_error(key, name, fits, f" has {height}x{width} images; the {model} needs square "
                                                f"images with a side divisible by {side}")


def check_variants(key: str, names, model: str, simulator: bool) -> None:
    if len(set(names)) != len(names):
        raise GpunnError(f"config key {key} lists a variant twice: {list(names)}")
    for name in names:
        if name not in variants.VARIANTS:
            raise choice_error(key, name, variants.VARIANTS, " is not a known variant")
        if model not in variants.supported_models(name):
            raise choice_error(key, name, variants.variants_for(model), f" does not train the {model}")
        if simulator and not variants.runs_on_simulator(name):
            raise choice_error(key, name, variants.variants_for(model, simulator=True),
                                " cannot run under the CUDA simulator (gpu.simulator: true)")
