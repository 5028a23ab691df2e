"""Device plumbing: clear errors without a GPU, block-size checks, the device description."""

import os
import subprocess
import sys

import pytest

from gpunn.device import check_block


def test_gpu_variant_without_gpu_names_the_simulator_route():
    # a fresh interpreter with the simulator off, as on a CPU-only machine outside the tests
    code = ("from gpunn.device import require_gpu\n"
            "from gpunn.errors import GpunnError\n"
            "from numba import cuda\n"
            "if cuda.is_available():\n    print('HAS-GPU')\n"
            "else:\n"
            "    try:\n        require_gpu('variant gpu-naive')\n"
            "    except GpunnError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "NUMBA_ENABLE_CUDASIM": "0",
                              "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    if out.stdout.strip() == "HAS-GPU":
        pytest.skip("a real GPU is present")
    assert "variant gpu-naive needs a CUDA GPU" in out.stdout and "NUMBA_ENABLE_CUDASIM=1" in out.stdout
    assert "`gpu.simulator: true`" in out.stdout


def test_api_cuda_without_gpu_ends_a_script_in_one_line_naming_cpu(tmp_path):
    """The `Trainer(model, "cuda")` of docs/api.md on a machine without a GPU: one stderr line that names device
    "cpu", exit status 1, no traceback (gpunn.errors.install_excepthook); GPUNN_TRACEBACK=1 brings the traceback
    back."""
    script = tmp_path / "train.py"
    script.write_text("from numba import cuda\n"
                      "if cuda.is_available():\n    print('HAS-GPU'); raise SystemExit(0)\n"
                      "from gpunn.api import Trainer\nfrom gpunn.nn import mlp\n"
                      "Trainer(mlp(in_features=4, hidden=3, classes=2, seed=0), 'cuda')\n")
    env = {"PATH": "/usr/bin:/bin", "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    if out.stdout.strip() == "HAS-GPU":
        pytest.skip("a real GPU is present")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('gpunn: error: device "cuda" needs a CUDA GPU')
    assert 'device "cpu"' in lines[0] and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**env, "GPUNN_TRACEBACK": "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "GpunnError" in out.stderr


def test_no_gpu_error_is_one_line_naming_the_config_key_and_the_variable(monkeypatch):
    from numba import cuda

    from gpunn.device import require_gpu
    from gpunn.errors import GpunnError

    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(GpunnError) as caught:
        require_gpu("variant gpu-fused")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("variant gpu-fused needs a CUDA GPU")
    assert "config key `gpu.simulator: true`" in message and "NUMBA_ENABLE_CUDASIM=1" in message


@pytest.mark.parametrize("threads, message", [(2048, "exceeds this device's limit of 1024"), (0, "positive"),
                                              (-32, "positive"), (12.5, "positive integer")])
def test_impossible_block_sizes_are_one_clear_error(threads, message):
    with pytest.raises(ValueError, match=message):
        check_block("relu_forward", threads)


def test_valid_block_sizes_pass():
    for threads in (32, 64, 128, 256, 512, 1024):
        assert check_block("relu_forward", threads) == threads


@pytest.mark.gpu
def test_real_device_description_and_kernel_limit():
    import numpy as np
    from numba import cuda

    from gpunn.device import describe_device, device_info

    info = device_info()
    assert not info["simulator"] and info["multiprocessors"] > 0 and info["max_threads_per_block"] >= 1024
    assert info["name"] in describe_device()

    @cuda.jit
    def scale(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] *= 2.0

    x = cuda.to_device(np.arange(8, dtype=np.float32))
    scale[1, 32](x)  # compile, so the kernel has a signature to query
    assert check_block("scale", 1024, kernel=scale) == 1024
    with pytest.raises(ValueError, match="exceeds"):
        check_block("scale", 2048, kernel=scale)


GPU_CONTEXT_SCRIPT = """
import numpy as np
from numba import cuda
from gpunn.device import open_cuda
from numba.cuda.descriptor import cuda_target

open_cuda()
assert cuda_target._targetctx is not None  # the target was set up on open_cuda's thread
from gpunn.kernels.elementwise import pixels_to_float
from gpunn.rundata import images_to_float

pixels = np.arange(300, dtype=np.int64).astype(np.uint8).reshape(3, 100)
out = cuda.to_device(np.full((3, 100), np.nan, dtype=np.float32))
pixels_to_float(cuda.to_device(pixels), out)
assert np.array_equal(out.copy_to_host(), images_to_float(pixels))
print("ok")
"""


@pytest.mark.gpu
def test_open_cuda_makes_the_context_beside_the_target_set_up():
    """open_cuda (the context made while a thread sets up numba's target) leaves the target set up and a context that
    a gpunn kernel loaded afterwards runs in, with the right results; in a fresh process, as a job starts."""
    done = subprocess.run([sys.executable, "-c", GPU_CONTEXT_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]



class _Buffer:
    def __init__(self, size):
        self.size = size


def test_memory_peak_counts_the_runs_own_buffers_at_their_largest(monkeypatch):
    """MemoryPeak's arithmetic on a stand-in allocation table: buffers that were there before it was made never count
    (nor does their freeing lower the figure), a new buffer at a reused address counts, and the peak is kept after
    frees."""
    from gpunn.device import MemoryPeak

    older, kept = _Buffer(1000), _Buffer(7)
    table = {1: older, 2: kept}
    monkeypatch.setattr(MemoryPeak, "_device_buffers", staticmethod(lambda: dict(table)))
    peak = MemoryPeak()
    peak.sample()
    assert peak.peak_bytes == 0
    del table[1]  # an earlier run's buffer goes while this one builds: no negative figure, no zero from it
    table[3], table[4] = _Buffer(300), _Buffer(50)
    peak.sample()
    assert peak.peak_bytes == 350
    del table[3]
    table[1] = _Buffer(20)  # the freed address reused by this run
    peak.sample()
    assert peak.peak_bytes == 350
    table[5] = _Buffer(400)
    peak.sample()
    assert peak.peak_bytes == 470


def test_memory_peak_is_none_without_an_allocation_table(monkeypatch):
    from gpunn.device import MemoryPeak

    monkeypatch.setattr(MemoryPeak, "_device_buffers", staticmethod(lambda: None))
    peak = MemoryPeak()
    peak.sample()
    assert peak.peak_bytes is None


MEMORY_PEAK_SCRIPT = """
import numpy as np
from numba import cuda
from gpunn.device import MemoryPeak, open_cuda

open_cuda()
earlier = cuda.device_array(1 << 22, dtype=np.float32)  # 16 MiB held before the measured part
hold = cuda.device_array((64, 1 << 12), dtype=np.float32)  # 1 MiB that stays
peak = MemoryPeak()
run = [cuda.device_array(1 << 18, dtype=np.float32) for _ in range(3)]  # 3 MiB of the run's own
mapped = cuda.mapped_array(1 << 20, dtype=np.float32)  # host memory: not counted
del earlier
peak.sample()
first = peak.peak_bytes
del run
peak.sample()
print(first, peak.peak_bytes)
"""


@pytest.mark.gpu
def test_memory_peak_on_the_device_counts_only_this_runs_buffers():
    """On a GPU, in a fresh process: the run's three 1 MiB buffers, not an earlier buffer freed meanwhile, not a
    mapped host buffer; the peak outlives the run's frees."""
    done = subprocess.run([sys.executable, "-c", MEMORY_PEAK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(3 << 20)] * 2
