"""The model records (gpunn.nn.models.MODELS): each builds the network its fields describe, and what the run
grammar, the backends and the API read from them agrees with the model and the variants."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpunn.backends.base import check_reduction_setting
from gpunn.backends.gpu.layers import HEADS
from gpunn.backends.registry import fastest_gpu_variant, variants_for
from gpunn.errors import GpunnError
from gpunn.nn import MODELS, Autoencoder, ModelSpec, model_spec
from gpunn.nn.functional import DEFAULT_REDUCTION, REDUCTIONS
from gpunn.runspec import WILDCARD_CONSTRAINTS, RunSpec, model_sizes

SRC = Path(__file__).resolve().parents[1] / "src"


def _conv(cin, cout):
    return cin * cout * 9 + cout


# (widths, image shape (C, H, W), classes) -> (expected sizes, expected parameter count, output shape of one sample)
CASES = {
    "mlp": ((32,), (1, 8, 8), 10,
            {"in_features": 64, "hidden": 32, "classes": 10}, 64 * 32 + 32 + 32 * 10 + 10, (10,)),
    "cnn": ((3, 5), (1, 8, 8), 10,  # 8 -> 6 -> 4, pooled to 2
            {"in_channels": 1, "image_size": 8, "channels": (3, 5), "classes": 10},
            _conv(1, 3) + _conv(3, 5) + 5 * 2 * 2 * 10 + 10, (10,)),
    "autoencoder": ((4, 3), (3, 8, 8), 10,
                    {"in_channels": 3, "image_size": 8, "channels": (4, 3)},
                    _conv(3, 4) + _conv(4, 3) + _conv(3, 3) + _conv(3, 4) + _conv(4, 3), (3, 8, 8)),
}


def test_the_registry_is_the_three_models_in_order():
    assert list(MODELS) == ["mlp", "cnn", "autoencoder"]
    assert all(isinstance(spec, ModelSpec) and spec.name == name for name, spec in MODELS.items())
    assert WILDCARD_CONSTRAINTS["model"] == "mlp|cnn|autoencoder"
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODELS["mlp"].width_count = 2


@pytest.mark.parametrize("name", list(CASES))
def test_each_builder_gives_the_network_its_sizes_describe(name):
    widths, image_shape, classes, sizes, params, out_shape = CASES[name]
    spec = model_spec(name)
    assert len(widths) == spec.width_count
    assert spec.sizes(widths, image_shape, classes) == sizes
    assert model_sizes(name, widths, image_shape, classes) == sizes
    model = spec.builder(**sizes, seed=0)
    assert model.name == name and model.num_parameters == params
    assert model.input_shape == (image_shape if spec.square_images else (int(np.prod(image_shape)),))
    assert model.forward(np.zeros((2, *image_shape), np.float32)).shape == (2, *out_shape)
    assert isinstance(model, Autoencoder) == spec.encoder
    assert spec.classifier == (getattr(model.layers[-1], "out_features", None) == classes)
    # a run of the model at these widths is a valid RunSpec; one width more is refused
    RunSpec("digits8", "standard", name, "cpu-numpy", widths, 4, 0.1, 1, 0)
    with pytest.raises(GpunnError, match=f"takes {spec.width_count} width"):
        RunSpec("digits8", "standard", name, "cpu-numpy", (*widths, 7), 4, 0.1, 1, 0)


@pytest.mark.parametrize("name", list(MODELS))
def test_loss_reductions_and_api_variants_agree_with_the_engine_and_the_registry(name):
    spec = model_spec(name)
    assert spec.loss in HEADS
    assert spec.classifier == (spec.loss == "softmax_ce")
    assert DEFAULT_REDUCTION in spec.reductions and set(spec.reductions) <= set(REDUCTIONS)
    real, simulated = spec.cuda_variants
    assert real in variants_for(name, gpu=True) and simulated in variants_for(name, simulator=True, gpu=True)
    assert (fastest_gpu_variant(name, False), fastest_gpu_variant(name, True)) == (real, simulated)
    for reduction in REDUCTIONS:
        if reduction in spec.reductions:
            check_reduction_setting(name, reduction)
        else:
            with pytest.raises(GpunnError, match=r"for the classifiers \(mlp, cnn\)"):
                check_reduction_setting(name, reduction)


def test_the_autoencoder_needs_square_images_a_multiple_of_four_wide():
    assert [spec.side_multiple for spec in MODELS.values()] == [1, 1, 4]
    with pytest.raises(GpunnError, match="cnn needs square images, dataset x has 8x6"):
        model_sizes("cnn", (3, 5), (1, 8, 6), 10, "x")
    assert model_sizes("mlp", (4,), (1, 8, 6), 10) == {"in_features": 48, "hidden": 4, "classes": 10}


def test_an_unknown_model_is_one_line_naming_the_known_ones():
    with pytest.raises(GpunnError) as error:
        model_spec("resnet")
    assert str(error.value) == "unknown model 'resnet': choose one of mlp, cnn, autoencoder"
    with pytest.raises(GpunnError, match="^unknown model 'resnet': choose one of mlp, cnn, autoencoder$"):
        RunSpec("digits8", "standard", "resnet", "cpu-numpy", (4,), 4, 0.1, 1, 0)
    assert fastest_gpu_variant("resnet", False) is None


def test_the_records_load_neither_numba_nor_matplotlib():
    code = ("import sys\nimport gpunn.nn.models\n"
            "print(sorted(m for m in ('matplotlib', 'numba', 'numba.cuda') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
