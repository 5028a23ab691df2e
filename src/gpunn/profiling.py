"""The step profile of the pipeline (rule step_profile, `gpunn profile`): each launch of one training step of a GPU
variant (gpunn.timing.step_profile) at an experiment's model widths, batch and sample shape (its dataset's), one
CSV row per launch. Timed on a GPU, under the machine-wide timing lock; under numba's CUDA simulator, whose host
clock says nothing about a kernel's GPU time, the launch list alone (ms and the step's times empty)."""

from __future__ import annotations

from gpunn import device, io
from gpunn.backends.registry import check_variant
from gpunn.data.registry import get_dataset
from gpunn.errors import GpunnError
from gpunn.nn.models import build_model, model_spec
from gpunn.runspec import model_sizes


def profile_sizes(model: str, dataset: str, widths) -> dict:
    """build_model sizes of `model` at `widths` on `dataset`'s samples (its shape and classes), checked: a wrong
    number of widths or a size the model refuses is one GpunnError line."""
    widths = tuple(int(w) for w in widths)
    count = model_spec(model).width_count
    if len(widths) != count:
        raise GpunnError(f"{model} takes {count} width(s) (mlp: hidden; cnn, autoencoder: the two "
                         f"convolutions' channels), got {','.join(map(str, widths))}")
    spec = get_dataset(dataset)
    sizes = model_sizes(model, widths, spec.image_shape, spec.num_classes, dataset)
    try:
        build_model(model, **sizes)
    except ValueError as exc:
        raise GpunnError(str(exc)) from None
    return sizes


def write_step_profile(model: str, variants, dataset: str, widths, batch: int, out, repeats: int = 50, seed: int = 0,
                       log=print):
    """Profile one step of each of `variants` (GPU variants of `model`) and write the rows to `out` (CSV); timed
    unless the simulator stands in for the GPU. Returns the frame written."""
    from gpunn.timing import step_profile
    from gpunn.timing_lock import timing_lock

    for variant in variants:
        if not check_variant(variant, model).gpu:
            raise GpunnError(f"{variant} trains on the CPU: a step profile times GPU launches; name a GPU variant")
    sizes = profile_sizes(model, dataset, widths)
    device.require_gpu("gpunn profile (each launch of a GPU training step)")
    timed = not device.simulator_enabled()
    if not timed:
        log("under numba's CUDA simulator: the step's launches are listed without times")
    with timing_lock(f"gpunn profile {model} {','.join(variants)}", log, skip=not timed):
        frame = step_profile(model, list(variants), batch=batch, repeats=repeats, seed=seed, log=log, timed=timed,
                             **sizes)
    io.write_csv(out, frame)
    return frame
