"""Training variants: the registry from variant name to backend and the facts the workflow, the config
validation and the CLI read (which models it trains, whether it uses the GPU, whether numba's CUDA simulator
can run it, how many CPU threads it uses). Every backend implements gpunn.backends.base.Backend and sees the
same init and batch order (gpunn.seeding).

    cpu-numpy   NumPy float32 reference: gpunn.nn layers, one flat parameter buffer, SGD (all models)
    cpu-serial  plain loops under numba @njit on one thread, like the papers' serial C++ (MLP only)
    gpu-naive      numba.cuda, E1's and paper 001's naive design: batch copied every step, one kernel per op, one
                   thread per output element (gpunn.backends.gpu) (MLP, CNN, autoencoder)
    gpu-tiled      the same with shared-memory tiled GEMMs forward and backward; the autoencoder's convolutions
                   with shared-memory tiles and block-reduction weight gradients (MLP, autoencoder)
    gpu-optimized  paper 001's optimized CNN: conv+ReLU fused, shared-memory tiles, tiled FC GEMM, warp-shuffle
                   weight gradients, pinned triple-buffered batch copies on a stream, one SGD launch (CNN)
    gpu-fused      training set resident on the GPU, batches gathered there, fused epilogues, 8 launches a step (MLP)
    gpu-im2col     the convolutions as implicit-im2col GEMMs, data resident, deterministic reductions (CNN, autoencoder)
    gpu-graph      the fastest of these with each epoch's steps captured in one CUDA graph and replayed (real GPU
                   only) (MLP, CNN, autoencoder)
    gpu-tf32       gpu-graph on the tensor cores: each product that fills their tiles multiplies inputs rounded to
    gpu-bf16       TF32 (or BF16) with float32 accumulation; smaller products, weights and loss in float32; the MLP's
                   step per layer (real GPU of compute capability 8.0 or newer) (MLP, CNN, autoencoder)

The GPU variants are one engine (gpunn.backends.gpu.engine) run under different policies
(gpunn.backends.gpu.policy): a variant is data, not code. Every variant takes a run's loss reduction
(RunSpec.reduction: the gradient of the batch mean or sum; the sum for the classifiers only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gpunn.errors import GpunnError
from gpunn.nn.functional import DEFAULT_REDUCTION
from gpunn.nn.models import MODELS

from .gpu.policy import POLICIES, POLICY_MODELS  # plain data: importing it loads no numba


class Variant(NamedTuple):
    factory: Callable         # (model, model_name, lr, block, reduction) -> Backend
    models: tuple[str, ...]   # models it can train
    gpu: bool                 # runs on the CUDA device (needs a GPU or numba's simulator)
    simulator: bool = True    # can run under numba's CUDA simulator (gpu-graph captures CUDA graphs, which it lacks)
    single_thread: bool = False  # one CPU thread by design (the serial baseline): its jobs get one core
    blocks: bool = False      # takes a run's block size (threads per block of its kernels; RunSpec.block)
    # two runs of one spec give the same bits (the CPU ones, the GPU policies without float atomics: Policy.
    # deterministic); the others' runs differ in their sums' order, so a report measures their run-to-run spread
    deterministic: bool = True


def _cpu_numpy(model, model_name: str, lr: float, block: int = 0, reduction: str = DEFAULT_REDUCTION):
    from .cpu_numpy import CpuNumpyBackend

    return CpuNumpyBackend(model, model_name, lr, reduction)


def _cpu_serial(model, model_name: str, lr: float, block: int = 0, reduction: str = DEFAULT_REDUCTION):
    from .cpu_serial import CpuSerialBackend

    return CpuSerialBackend(model, model_name, lr, reduction)


def _gpu(name: str) -> Callable:
    def factory(model, model_name: str, lr: float, block: int = 0, reduction: str = DEFAULT_REDUCTION):
        from .gpu.engine import GpuEngine  # imports numba.cuda: only when a GPU variant is asked for

        return GpuEngine(model, model_name, lr, POLICIES[name].with_block(block), reduction)

    return factory


GPU_VARIANTS = tuple(POLICIES)  # gpu-naive, gpu-tiled, gpu-optimized, gpu-fused, gpu-im2col, gpu-graph, gpu-tf32, ...
GPU_MLP_VARIANTS = tuple(name for name in GPU_VARIANTS if "mlp" in POLICY_MODELS[name])
VARIANTS: dict[str, Variant] = {
    "cpu-numpy": Variant(_cpu_numpy, tuple(MODELS), gpu=False),
    "cpu-serial": Variant(_cpu_serial, ("mlp",), gpu=False, single_thread=True),
    **{name: Variant(_gpu(name), POLICY_MODELS[name], gpu=True, simulator=POLICIES[name].simulator,
                     blocks=POLICIES[name].blocks, deterministic=POLICIES[name].deterministic)
       for name in GPU_VARIANTS},
}


def check_variant(variant: str, model_name: str | None = None) -> Variant:
    """The registry entry of `variant`; a one-line GpunnError when the name is unknown or the variant cannot
    train `model_name` (when given)."""
    if variant not in VARIANTS:
        raise GpunnError(f"unknown variant '{variant}': choose one of {', '.join(VARIANTS)}")
    entry = VARIANTS[variant]
    if model_name is not None and model_name not in entry.models:
        raise GpunnError(f"variant {variant} supports {', '.join(entry.models)}, not {model_name}")
    return entry


def variants_for(model_name: str, simulator: bool = False, gpu: bool | None = None) -> list[str]:
    """The variants that train `model_name`, in registry order: with `simulator`, only those numba's CUDA simulator
    can run (every CPU variant can); with `gpu` True or False, only the GPU or only the CPU ones."""
    return [name for name, entry in VARIANTS.items() if model_name in entry.models
            and (entry.simulator or not simulator) and (gpu is None or entry.gpu == gpu)]


def fastest_gpu_variant(model_name: str, simulator: bool) -> str | None:
    """What the Python API's device "cuda" trains `model_name` with (ModelSpec.cuda_variants): the fastest GPU variant
    on a real GPU, or under the simulator (no CUDA graphs: the eager policy gpu-graph replays); None for no model."""
    spec = MODELS.get(model_name)
    return None if spec is None else spec.cuda_variants[1 if simulator else 0]


def check_block_setting(variant: str, block: int) -> None:
    """A one-line GpunnError when a run asks `variant` for a block size it does not take."""
    if block and not check_variant(variant).blocks:
        takes = ", ".join(name for name, entry in VARIANTS.items() if entry.blocks)
        raise GpunnError(f"variant {variant} takes no block size (got _t{block}): its kernels run fixed blocks; "
                         f"the variants that take one are {takes}")


def make_backend(variant: str, model, model_name: str, lr: float, block: int = 0,
                 reduction: str = DEFAULT_REDUCTION):
    """The backend of `variant` for `model`; `block` (threads per block, 0: defaults) for the variants that take one;
    `reduction`: the loss gradient is the batch mean ("mean") or sum ("sum", classifiers only)."""
    entry = check_variant(variant, model_name)
    check_block_setting(variant, block)
    return entry.factory(model, model_name, lr, block, reduction)  # each backend checks the reduction


def takes_block(variant: str) -> bool:
    """Whether a run of `variant` may set its block size (RunSpec.block)."""
    return check_variant(variant).blocks


def is_deterministic(variant: str) -> bool:
    """Whether two runs of `variant` with one spec give the same bits (GpunnError for an unknown name)."""
    return check_variant(variant).deterministic


def uses_gpu(variant: str) -> bool:
    """Whether `variant` trains on the CUDA device (GpunnError for an unknown name)."""
    return check_variant(variant).gpu


def supported_models(variant: str) -> tuple[str, ...]:
    return check_variant(variant).models


def runs_on_simulator(variant: str) -> bool:
    """Whether a variant can run where numba's CUDA simulator stands in for the GPU."""
    return check_variant(variant).simulator


def cpu_threads(variant: str, available: int) -> int:
    """CPU threads a job of `variant` should get out of `available` (config key `threads`)."""
    return 1 if check_variant(variant).single_thread else int(available)
