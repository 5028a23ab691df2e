"""The on-disk kernel cache (gpunn.kernel_cache, gpunn.kernels.jit): where it lives, what invalidates it, that a
kernel's compile options name its entry, and (-m gpu) that a second process loads every kernel the first compiled,
each factory specialisation its own."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from gpunn import kernel_cache
from gpunn.kernels.jit import DEVICE_ONLY, jit, options_tag

SRC = Path(__file__).resolve().parents[1] / "src"


def test_the_folder_follows_the_variable_and_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel_cache.VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.root() == tmp_path / "xdg" / "gpunn" / "kernels"
    monkeypatch.setenv(kernel_cache.VARIABLE, str(tmp_path / "mine"))
    assert kernel_cache.root() == tmp_path / "mine"
    assert kernel_cache.folder() == tmp_path / "mine" / kernel_cache.source_state()
    for off in ("off", "OFF", "0", "no"):
        monkeypatch.setenv(kernel_cache.VARIABLE, off)
        assert kernel_cache.root() is None and kernel_cache.folder() is None


def test_any_edit_to_the_package_changes_the_source_state(monkeypatch, tmp_path):
    package = tmp_path / "pkg"
    (package / "kernels").mkdir(parents=True)
    (package / "kernels" / "a.py").write_text("X = 1\n")
    (package / "b.py").write_text("Y = 2\n")
    monkeypatch.setattr(kernel_cache, "PACKAGE", package)
    first = kernel_cache.source_state()
    assert len(first) == 16 and kernel_cache.source_state() == first
    (package / "kernels" / "a.py").write_text("X = 3\n")  # a constant a kernel reads from another module
    second = kernel_cache.source_state()
    (package / "kernels" / "a.py").rename(package / "kernels" / "c.py")  # the same bytes, another module
    third = kernel_cache.source_state()
    assert len({first, second, third}) == 3


def test_prune_keeps_the_most_recently_used_states(tmp_path):
    now = time.time()
    for age, name in enumerate("abcdef"):
        state = tmp_path / (name * 16)
        state.mkdir()
        os.utime(state, (now - 100 * age, now - 100 * age))
    (tmp_path / "notes").mkdir()  # not a state folder: left alone
    removed = kernel_cache.prune(tmp_path, keep=4)
    assert sorted(p.name[0] for p in removed) == ["e", "f"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a" * 16, "b" * 16, "c" * 16, "d" * 16, "notes"]


def test_the_kernels_package_is_byte_compiled_unless_python_writes_no_bytecode(monkeypatch, tmp_path):
    """A kernel's key pickles the functions its factory closed over, and that pickle differs between code compiled
    from source and code loaded from a .pyc: gpunn.kernels writes its .pyc files before its modules load."""
    (tmp_path / "kernels").mkdir()
    source = tmp_path / "kernels" / "op.py"
    source.write_text("def f():\n    return 'a string'\n")
    monkeypatch.setattr(kernel_cache, "PACKAGE", tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    kernel_cache.byte_compile_kernels()
    assert not (tmp_path / "kernels" / "__pycache__").exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    kernel_cache.byte_compile_kernels()
    assert [p.name.split(".")[0] for p in (tmp_path / "kernels" / "__pycache__").iterdir()] == ["op"]


def test_cli_shows_and_clears_the_cache(tmp_path):
    env = {**os.environ, kernel_cache.VARIABLE: str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    state = tmp_path / "cache" / "0123456789abcdef"
    state.mkdir(parents=True)
    (state / "k.nbi").write_bytes(b"x" * 2048)

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "gpunn", "kernel-cache", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = cli()
    assert f"kernel cache: {tmp_path / 'cache'}" in shown and "0123456789abcdef: 1 files" in shown
    assert "kernel cache: removed" in cli("--clear") and not (tmp_path / "cache").exists()
    env[kernel_cache.VARIABLE] = "off"
    assert "kernel cache: off" in cli()


def test_compile_options_name_the_cache_entry():
    """numba keys an entry on bytecode and closure, not on options: the options go into the kernel's name (its
    cache file), so one function jitted with two launch bounds gets two entries."""
    assert options_tag({"launch_bounds": (256, 2)}) == "launch_bounds_256_2"
    assert options_tag({"max_registers": 64, "launch_bounds": 128}) == "launch_bounds_128__max_registers_64"

    def make(bound):
        def scale(x, out):
            i = cuda.grid(1)
            if i < x.shape[0]:
                out[i] = 2.0 * x[i]

        return jit(scale, launch_bounds=bound)

    names = {make(bound).py_func.__qualname__ for bound in (128, 256)}
    assert len(names) == 2 and all(name.endswith(("launch_bounds_128", "launch_bounds_256")) for name in names)
    assert set(DEVICE_ONLY) == {"launch_bounds", "max_registers"}


def test_device_only_options_are_dropped_under_the_simulator():
    @jit(launch_bounds=64, max_registers=32)
    def double(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = 2.0 * x[i]

    x = np.arange(5, dtype=np.float32)
    out = cuda.to_device(np.full(5, np.nan, np.float32))
    double[1, 8](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), 2 * x)


# one process's kernels: a factory closing over a scale, jitted with two launch bounds, and a library kernel with a
# factory flag (the pool's atomic backward, masked or not); prints each result's error and the cache counts
_PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    from numba import cuda
    from gpunn.kernels import pool
    from gpunn.kernels.jit import cache_counts, jit

    def make(scale, bound):
        def scaled(x, out):
            i = cuda.grid(1)
            if i < x.shape[0]:
                out[i] = scale * x[i]
        return jit(scaled, launch_bounds=bound)

    errors = {}
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    for scale, bound in ((2.0, 128), (3.0, 128), (2.0, 256)):
        out = cuda.to_device(np.full_like(x, np.nan))
        make(scale, bound)[8, bound](cuda.to_device(x), out)
        errors[f"{scale}@{bound}"] = float(np.max(np.abs(out.copy_to_host() - scale * x.astype(np.float64))))
    rng = np.random.default_rng(1)
    x4 = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    y, argmax = pool.maxpool2x2_forward_ref(x4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    mask = rng.standard_normal(x4.shape).astype(np.float32)
    for masked in (False, True):
        dx = cuda.to_device(np.full(x4.shape, np.nan, np.float32))
        pool.maxpool2x2_backward_atomic(cuda.to_device(dy), cuda.to_device(argmax), dx,
                                        relu_mask=cuda.to_device(mask) if masked else None)
        ref = pool.maxpool2x2_backward_ref(dy, argmax, x4.shape, relu_mask=mask if masked else None)
        errors[f"pool masked={masked}"] = float(np.max(np.abs(dx.copy_to_host() - ref)))
    print(json.dumps({"errors": errors, **cache_counts()}))
""")


@pytest.mark.gpu
def test_a_second_process_loads_every_kernel_and_each_specialisation_stays_its_own(tmp_path):
    script = tmp_path / "process.py"
    script.write_text(_PROCESS)
    env = {**os.environ, kernel_cache.VARIABLE: str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)

    def process():
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = process(), process()
    for run in (first, second):
        assert all(error <= 1e-6 for error in run["errors"].values()), run["errors"]
    assert first["compiled"] >= 6 and first["loaded"] == 0
    assert second == {**first, "compiled": 0, "loaded": first["compiled"]}
    names = [p.name for p in (tmp_path / "cache").rglob("*.nbi")]
    assert any("launch_bounds_128" in n for n in names) and any("launch_bounds_256" in n for n in names)


_SERIAL = textwrap.dedent("""
    import json
    import numpy as np
    from gpunn.nn import mlp
    from gpunn.nn.serial import SerialMLP, _backward_and_step, _forward

    model = mlp(12, 7, 3, seed=1)
    serial = SerialMLP(model.flat.copy(), 12, 7, 3)
    x = np.random.default_rng(0).random((5, 12), dtype=np.float32)
    logits = serial.forward(x).tolist()
    serial.backward_and_step(np.array([0, 1, 2, 0, 1]), 0.1)
    hits = [sum(f.stats.cache_hits.values()) for f in (_forward, _backward_and_step)]
    print(json.dumps({"logits": logits, "flat": serial.flat.tolist(), "hits": hits}))
""")


def test_cpu_serial_functions_are_kept_in_the_cache_too(tmp_path):
    """cpu-serial's numba functions (about 1.3 s of compiling per job) load from the same folder in a second
    process, with the same results."""
    script = tmp_path / "serial.py"
    script.write_text(_SERIAL)
    env = {**os.environ, kernel_cache.VARIABLE: str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}

    def process():
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = process(), process()
    assert first["hits"] == [0, 0] and second["hits"] == [1, 1]
    assert second["logits"] == first["logits"] and second["flat"] == first["flat"]
    env[kernel_cache.VARIABLE] = "off"
    assert process()["hits"] == [0, 0]
