"""The Python API (gpunn.api.Trainer): cpu and cuda give the same results for one seed, the clear errors,
and docs/api.md's GPU example, run. Under the simulator the GPU trainings are tiny (a CNN on 8x8 images with
channels (2, 3), a few samples): about 30 s for the file on 2 cores."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpunn.api import Trainer
from gpunn.backends.registry import fastest_gpu_variant
from gpunn.device import simulator_enabled
from gpunn.errors import GpunnError
from gpunn.nn import Linear, ReLU, Sequential, autoencoder, build_model, cnn, mlp

from snakemake_helpers import doc_python_blocks

REPO = Path(__file__).resolve().parents[1]
TINY_CNN = {"in_channels": 1, "image_size": 8, "channels": (2, 3), "classes": 4}


def tiny_digits(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), rng.integers(0, 4, n)


def test_cpu_and_cuda_give_the_same_results():
    """One seed, one epoch of 4 uint8 images in batches of 3 (a partial last batch of 1): the same losses, weights,
    test loss and accuracy on both devices, and each model's flat buffer holds its trained weights."""
    x, y = tiny_digits(4)
    results = {}
    for device in ("cpu", "cuda"):
        model = cnn(seed=3, **TINY_CNN)
        initial = model.flat.copy()
        trainer = Trainer(model, device, lr=0.1)
        history = trainer.fit(x, y, epochs=1, batch=3, seed=5)
        assert [row["epoch"] for row in history] == [1] and history[0]["seconds"] > 0
        assert trainer.parameters() is model.flat and not np.array_equal(model.flat, initial)
        results[device] = (trainer, history[0]["train_loss"], model.flat.copy(), trainer.evaluate(x, y))
    cpu, cpu_loss, cpu_flat, cpu_eval = results["cpu"]
    gpu, gpu_loss, gpu_flat, gpu_eval = results["cuda"]
    assert (cpu.variant, gpu.variant) == ("cpu-numpy", fastest_gpu_variant("cnn", simulator_enabled()))
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    assert np.max(np.abs(gpu_flat - cpu_flat)) / np.max(np.abs(cpu_flat)) < 1e-4
    assert gpu_eval["loss"] == pytest.approx(cpu_eval["loss"], rel=1e-5)
    assert gpu_eval["accuracy"] == cpu_eval["accuracy"]


def test_fit_continues_the_epochs_and_floats_equal_uint8():
    """Two fit(epochs=1) calls train on the batches of one fit(epochs=2); float images in [0, 1] are the uint8 ones
    scaled as the pipeline scales them; an MLP takes images of any shape of its input size."""
    x, y = tiny_digits(9)
    once = Trainer(mlp(in_features=64, hidden=5, classes=4, seed=2), "cpu", lr=0.1)
    history = once.fit(x, y, epochs=2, batch=4, seed=7)
    twice = Trainer(mlp(in_features=64, hidden=5, classes=4, seed=2), "cpu", lr=0.1)
    floats = x.reshape(9, 64).astype(np.float32) / np.float32(255)
    steps = twice.fit(floats, y, epochs=1, batch=4, seed=7) + twice.fit(x, y, epochs=1, batch=4, seed=7)
    assert [row["epoch"] for row in steps] == [1, 2] and twice.epochs_done == 2
    assert [row["train_loss"] for row in steps] == [row["train_loss"] for row in history]
    assert np.array_equal(twice.parameters(), once.parameters())
    assert np.array_equal(twice.predict(floats), once.predict(x))
    assert "mlp on cpu: cpu-numpy" in repr(twice)


def test_autoencoder_trains_on_its_input():
    x = tiny_digits(5)[0][:, :4, :4]
    trainer = Trainer(autoencoder(in_channels=1, image_size=4, channels=(2, 2), seed=1), "cpu", lr=0.5)
    history = trainer.fit(x, epochs=3, batch=2)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    result = trainer.evaluate(x)
    assert result["loss"] > 0 and np.isnan(result["accuracy"])
    assert trainer.predict(x).shape == (5, 1, 4, 4)


@pytest.mark.parametrize(("build", "kwargs", "message"), [
    (lambda: cnn(**TINY_CNN), {"device": "gpu"}, r"device 'gpu' is not known: choose one of cpu, cuda"),
    (lambda: cnn(**TINY_CNN), {"variant": "gpu-fast"}, r"variant 'gpu-fast' does not train the cnn on cuda.*"
                                                       r"choose one of gpu-naive, gpu-optimized, gpu-im2col"),
    (lambda: cnn(**TINY_CNN), {"variant": "gpu-fused"}, r"variant 'gpu-fused' does not train the cnn"),
    (lambda: cnn(**TINY_CNN), {"variant": "cpu-numpy"}, r"variant 'cpu-numpy' does not train the cnn on cuda"),
    (lambda: cnn(**TINY_CNN), {"device": "cpu", "variant": "cpu-serial"},
     r"variant 'cpu-serial' does not train the cnn on cpu: choose one of cpu-numpy$"),
    (lambda: autoencoder(in_channels=1, image_size=4, channels=(2, 2)), {"variant": "gpu-optimized"},
     r"variant 'gpu-optimized' does not train the autoencoder on cuda.*choose one of gpu-naive, gpu-tiled, "
     r"gpu-im2col"),
    (lambda: Sequential([Linear(4, 3), ReLU()]), {}, r"not built by gpunn.nn.mlp, cnn, autoencoder or build_model"),
    (lambda: cnn(dtype=np.float64, **TINY_CNN), {}, r"the GPU variants train float32 models, this cnn is float64"),
])
def test_device_and_variant_errors(build, kwargs, message):
    with pytest.raises(GpunnError, match=message):
        Trainer(build(), **kwargs)


@pytest.mark.skipif(not simulator_enabled(), reason="the simulator's refusal")
def test_gpu_graph_is_refused_under_the_simulator():
    with pytest.raises(GpunnError, match=r"variant 'gpu-graph' does not train the mlp on cuda under numba's CUDA "
                                         r"simulator: choose one of gpu-naive, gpu-tiled, gpu-fused$"):
        Trainer(mlp(in_features=4, hidden=3, classes=2), "cuda", variant="gpu-graph")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow on the way to the NaN is the point
def test_data_errors_are_one_clear_line():
    x, y = tiny_digits(5)
    trainer = Trainer(build_model("cnn", **TINY_CNN), "cpu")
    cases = [
        (lambda: trainer.fit(x), r"fit: the cnn is a classifier: pass labels y, class indices in \[0, 4\)"),
        (lambda: trainer.fit(x, y + 3), r"labels must be class indices in \[0, 4\), got \[3, 6\]"),
        (lambda: trainer.fit(x, y[:4]), r"expected 5 integer labels .* got int64 of shape \(4,\)"),
        (lambda: trainer.fit(x, y.astype(float)), r"expected 5 integer labels"),
        (lambda: trainer.fit(np.zeros((5, 9, 9), np.uint8), y),
         r"the cnn takes samples of shape \(1, 8, 8\) \(or \(8, 8\)\), got \(9, 9\)"),
        (lambda: trainer.evaluate(x.astype(np.float32), y), r"float images must be finite and in \[0, 1\], got "
                                                           r"values in \[.*\]; divide 0-255 pixels by 255"),
        (lambda: trainer.fit(np.where(x > 100, np.nan, x / 255.0), y),
         r"fit: float images must be finite and in \[0, 1\], got NaN in \d+ of 320 values; replace or drop"),
        (lambda: trainer.predict(np.full((2, 8, 8), -np.inf)), r"predict: .* got inf in 128 of 128 values"),
        (lambda: trainer.predict(x.astype(np.int64)), r"images must be uint8 pixels or floats in \[0, 1\], got int64"),
        (lambda: trainer.predict(x[:0]), r"expected a non-empty array of samples"),
        (lambda: trainer.fit(x, y, epochs=0), r"fit: epochs must be a positive integer, got 0"),
        (lambda: trainer.fit(x, y, batch=2.5), r"fit: batch must be a positive integer, got 2.5"),
        (lambda: Trainer(autoencoder(in_channels=1, image_size=4, channels=(2, 2)), "cpu").fit(x[:, :4, :4], y),
         r"the autoencoder's target is its input; pass no labels"),
        (lambda: Trainer(mlp(in_features=64, hidden=16, classes=4), "cpu", lr=1e30).fit(x, y, batch=1),
         r"training diverged: the mlp on cpu-numpy at learning rate 1e30: train loss is (nan|inf) at epoch 1 "
         r"batch \d; lower the learning rate"),
    ]
    for call, message in cases:
        with pytest.raises(GpunnError, match=message):
            call()


@pytest.mark.parametrize("lr", [-1, 0, float("nan"), float("inf"), "fast", None])
def test_a_bad_learning_rate_is_one_clear_line(lr):
    """lr is checked where the Trainer is built, like the other arguments, not deep inside the first step."""
    with pytest.raises(GpunnError, match=r"^lr must be a (finite )?number > 0, got ") as error:
        Trainer(mlp(in_features=4, hidden=3, classes=2), "cpu", lr=lr)
    assert "\n" not in str(error.value)


def test_the_api_loads_no_numba_for_the_cpu():
    """Importing gpunn.nn loads no numba, and neither does training on "cpu"."""
    code = ("import sys\nimport numpy as np\nfrom gpunn.nn import mlp\nassert 'numba' not in sys.modules\n"
            "from gpunn.api import Trainer\nt = Trainer(mlp(in_features=4, hidden=3, classes=2), 'cpu')\n"
            "t.fit(np.zeros((3, 4), np.float32), np.array([0, 1, 0]))\nprint('numba' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_readme_gpu_example_runs(monkeypatch, capsys):
    """The GPU example of docs/api.md as written, on 10 digits, 4 of them trained for one epoch by a (2, 3)-channel
    CNN (the simulator's budget): each shrinking substitution must find its text, so the test follows the page."""
    import sklearn.datasets
    from sklearn.utils import Bunch

    (code,) = [block for block in doc_python_blocks("docs/api.md") if 'Trainer(model, "cuda"' in block]
    for old, new in {"1500": "4", "channels=(16, 32)": "channels=(2, 3)", "epochs=10": "epochs=1"}.items():
        assert old in code, f"the docs/api.md example no longer contains {old!r}"
        code = code.replace(old, new)
    digits = sklearn.datasets.load_digits()
    monkeypatch.setattr(sklearn.datasets, "load_digits",
                        lambda: Bunch(images=digits.images[:10], target=digits.target[:10]))
    scope = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    printed = capsys.readouterr().out
    assert "epoch 1: train loss" in printed and "'accuracy'" in printed
    assert scope["trainer"].variant == fastest_gpu_variant("cnn", simulator_enabled())
    assert len(scope["history"]) == 1 and np.isfinite(scope["history"][0]["train_loss"])
    assert scope["weights"] is scope["model"].flat
