"""Provenance records: their keys, the device naming, the commit of the checkout, the thread counts, and
that asking for them without a GPU never touches numba.cuda; and E3's timer (gpunn.batch_timing), whose rows
carry them: its throughput, forward / backward split and latency columns."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from numba import config

from gpunn import provenance
from gpunn.backends.registry import GPU_MLP_VARIANTS, uses_gpu
from gpunn.errors import GpunnError


def test_cpu_record_has_exactly_the_documented_keys():
    prov = provenance.collect(uses_gpu=False)
    assert tuple(prov) == provenance.PROVENANCE_KEYS
    assert prov["device"] == "cpu" and prov["simulator"] is False and prov["driver"] is None
    assert prov["numpy"] == metadata.version("numpy") and prov["numba"] == metadata.version("numba")
    assert prov["numba_threads"] == config.NUMBA_NUM_THREADS
    assert prov["hostname"] and isinstance(prov["cpu"], str)
    assert prov["commit"] == "unknown" or len(prov["commit"].split("-")[0]) == 40
    assert json.loads(json.dumps(prov)) == prov
    assert tuple(provenance.columns(prov)) == provenance.CSV_COLUMNS
    assert provenance.columns(prov)["device"] == "cpu"


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="names the simulator only under it")
def test_gpu_work_under_the_simulator_says_so():
    prov = provenance.collect(uses_gpu=True)
    assert prov["device"] == "cuda-simulator" and prov["simulator"] is True
    assert prov["driver"] is None  # the simulator has no driver to name


def test_driver_version_reads_the_kernel_module_line(tmp_path, monkeypatch):
    """The NVIDIA kernel module's version comes from its /proc line; with no such file and no CUDA driver, None."""
    version_file = tmp_path / "version"
    version_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Jun 3 2025\n"
                            "GCC version:  gcc version 12.2.0\n")
    monkeypatch.setattr(provenance, "_simulator_enabled", lambda: False)
    monkeypatch.setattr(provenance, "NVIDIA_DRIVER_FILE", str(version_file))
    provenance.driver_version.cache_clear()
    try:
        assert provenance.driver_version().startswith("NVIDIA 580.159.04")
        monkeypatch.setattr(provenance, "NVIDIA_DRIVER_FILE", str(tmp_path / "absent"))
        provenance.driver_version.cache_clear()
        found = provenance.driver_version()
        assert found is None or found.startswith("CUDA ")  # only a real CUDA driver could answer here
    finally:
        provenance.driver_version.cache_clear()


def test_cpu_record_never_imports_numba_cuda():
    code = ("import sys\nfrom gpunn import provenance\nassert 'numba.cuda' not in sys.modules\n"
            "provenance.collect(uses_gpu=False)\nprint('numba.cuda' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_commit_of_a_checkout_clean_dirty_and_untracked(tmp_path):
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance.git_commit(package) == head
    (package / "notes.txt").write_text("untracked\n")
    assert provenance.git_commit(package) == head  # untracked files do not change the code that ran
    (package / "__init__.py").write_text("x = 2\n")
    assert provenance.git_commit(package) == head + "-dirty"
    # a directory that git does not track (an installed package inside some checkout) is not that commit
    (repo / "venv").mkdir()
    assert provenance.git_commit(repo / "venv") == "unknown"


def test_commit_unknown_outside_git_or_without_git(tmp_path, monkeypatch):
    assert provenance.git_commit(tmp_path) == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable
    assert provenance.git_commit(os.path.dirname(provenance.__file__)) == "unknown"


def test_blas_threads_without_threadpoolctl(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # makes the import fail
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert provenance.blas_threads() == 3
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert provenance.blas_threads() == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert provenance.blas_threads() is None


def test_blas_threads_from_threadpoolctl():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    pools = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    if not pools:
        pytest.skip("no BLAS loaded that threadpoolctl can see")
    assert provenance.blas_threads() in {p["num_threads"] for p in pools}


def test_uses_gpu_comes_from_the_registry():
    assert not uses_gpu("cpu-numpy") and not uses_gpu("cpu-serial")
    assert all(uses_gpu(v) for v in GPU_MLP_VARIANTS)
    with pytest.raises(GpunnError, match="unknown variant 'gpu-fast'"):
        uses_gpu("gpu-fast")


def test_time_batches_rows_carry_their_variants_provenance(tmp_path):
    import pandas as pd

    from gpunn import cli
    from gpunn.batch_timing import BATCH_TIMING_COLUMNS

    out = tmp_path / "timing.csv"
    assert cli.main(["time-batches", "--variants", "cpu-numpy", "gpu-naive", "--batches", "2", "--hidden", "4",
                     "--features", "8", "--steps", "2", "--repeats", "1", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == BATCH_TIMING_COLUMNS
    assert tuple(BATCH_TIMING_COLUMNS[-len(provenance.CSV_COLUMNS):]) == provenance.CSV_COLUMNS
    assert frame["steps"].tolist() == [2, 2] and frame["repeats"].tolist() == [1, 1]
    assert frame["clock"].tolist() == ["host", "host" if config.ENABLE_CUDASIM else "cuda events"]
    cpu, gpu = (frame[frame["variant"] == v].iloc[0] for v in ("cpu-numpy", "gpu-naive"))
    assert cpu["device"] == "cpu" and not cpu["simulator"]
    assert gpu["device"] == provenance.gpu_name() and bool(gpu["simulator"]) == bool(config.ENABLE_CUDASIM)
    assert cpu["numpy"] == metadata.version("numpy") and cpu["commit"] == gpu["commit"]


def test_commit_named_by_the_environment_wins(monkeypatch):
    code = "from gpunn import provenance\nprint(provenance.collect(uses_gpu=False)['commit'])"
    env = {**os.environ, provenance.COMMIT_VARIABLE: "0123abc-exported"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0123abc-exported"


# ------------------------------------------------------------------------------------ E3's timer (batch_timing)
def test_e3_three_timers_give_their_columns():
    """Real variants (the CPU reference, a GPU one with resident data; the test above runs a per-step copy) on a
    tiny MLP: every measure positive and finite, samples/s from the throughput step, the split inside the epoch's
    wall time, the clock named per variant."""
    import numpy as np

    from gpunn.batch_timing import BATCH_TIMING_COLUMNS, time_batches

    lines = []
    frame = time_batches(["cpu-numpy", "gpu-fused"], [2], hidden=4, in_features=6, steps=2, repeats=1,
                         timed_epochs=2, log=lines.append)
    assert list(frame.columns) == BATCH_TIMING_COLUMNS and len(frame) == 2 and len(lines) == 2
    measured = frame[["throughput_step_ms", "throughput_samples_per_s", "forward_ms", "backward_ms", "latency_ms"]]
    assert np.isfinite(measured.to_numpy(float)).all() and (measured > 0).all().all()
    assert np.allclose(frame["throughput_samples_per_s"], 1e3 * frame["batch"] / frame["throughput_step_ms"])
    # two timed epochs: the medians are means, and each epoch's phases ran inside its wall time
    assert (frame["forward_ms"] + frame["backward_ms"] <= frame["throughput_step_ms"] * (1 + 1e-9)).all()
    assert (frame[["steps", "timed_epochs", "repeats", "hidden", "features"]].to_numpy() == [2, 2, 1, 4, 6]).all()
    clocks = dict(zip(frame["variant"], frame["clock"]))
    gpu_clock = "host" if config.ENABLE_CUDASIM else "cuda events"
    assert clocks == {"cpu-numpy": "host", "gpu-fused": gpu_clock}


class _FakeClock:
    """time.perf_counter for gpunn.batch_timing: moves only when the stub backend says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _StubBackend:
    """Records what the timer asks of a backend; epoch e (0: the untimed one) takes 10 e ms per step of wall time
    (the untimed one 1 s), 1 e ms forward and 2 e ms backward; each train_step 3 ms (the untimed first 1 s)."""

    name = "stub"

    def __init__(self, clock, loss=0.5):
        self.clock, self.loss, self.calls, self.epochs = clock, loss, [], 0

    def load_train_data(self, x, y):
        self.calls.append(("load", x.shape, y.shape))

    def warm_up(self, batch_sizes):
        self.calls.append(("warm_up", set(batch_sizes)))

    def prepare_epoch(self, batch):
        self.calls.append(("prepare", batch))

    def train_epoch(self, order, batch, progress=None):
        from gpunn.backends.base import EpochResult

        steps, e = len(order) // batch, self.epochs
        self.calls.append(("epoch", sorted(order.tolist()) == list(range(len(order))), batch))
        self.clock.now += steps * (1.0 if e == 0 else 0.010 * e)
        self.epochs += 1
        return EpochResult(self.loss, 0.001 * e * steps, 0.002 * e * steps, steps)

    def train_step(self, xb, target):
        self.calls.append(("step", xb.shape, target.shape))
        self.clock.now += 1.0 if self.calls[-2][0] != "step" else 0.003


def test_e3_timer_runs_the_variants_own_data_path(monkeypatch):
    """load_train_data with batch x steps samples, warm_up of the batch, an untimed epoch then `epochs` timed ones
    in permuted orders (median of their wall time, forward and backward per step), then synchronous steps."""
    from gpunn import batch_timing

    clock = _FakeClock()
    stubs = []
    monkeypatch.setattr(batch_timing, "time", clock)
    monkeypatch.setattr(batch_timing, "make_backend", lambda *a, **k: stubs.append(_StubBackend(clock)) or stubs[-1])
    frame = batch_timing.time_batches(["cpu-numpy"], [4], hidden=3, in_features=5, steps=6, repeats=5,
                                      timed_epochs=3, log=lambda line: None)
    (row,) = frame.to_dict("records")
    assert row["throughput_step_ms"] == pytest.approx(20.0)  # the median of 10, 20, 30 ms: not the untimed 1 s
    assert row["throughput_samples_per_s"] == pytest.approx(4 / 0.020)
    assert (row["forward_ms"], row["backward_ms"]) == (pytest.approx(2.0), pytest.approx(4.0))
    assert row["latency_ms"] == pytest.approx(3.0) and row["clock"] == "host"
    (stub,) = stubs
    assert stub.calls[:3] == [("load", (24, 5), (24,)), ("warm_up", {4}), ("prepare", 4)]
    assert stub.calls[3:7] == [("epoch", True, 4)] * 4
    assert stub.calls[7:] == [("step", (4, 5), (4,))] * 6  # one untimed, five timed


def test_e3_epochs_hold_at_most_samples_in_whole_batches(monkeypatch):
    """samples caps an epoch's samples (E1's 60 000: 938 steps up to batch 64, 117 at 512); the rows say how many
    steps each batch size ran, and its backend was loaded with that many batches."""
    from gpunn import batch_timing

    assert [batch_timing.epoch_steps(b, 938, 60000) for b in (1, 8, 32, 64, 128, 512)] == [938] * 3 + [937, 468, 117]
    assert batch_timing.epoch_steps(64, 938) == 938 and batch_timing.epoch_steps(100000, 938, 60000) == 1
    clock = _FakeClock()
    stubs = []
    monkeypatch.setattr(batch_timing, "time", clock)
    monkeypatch.setattr(batch_timing, "make_backend", lambda *a, **k: stubs.append(_StubBackend(clock)) or stubs[-1])
    frame = batch_timing.time_batches(["cpu-numpy"], [2, 4, 8], hidden=3, in_features=5, steps=6, samples=20,
                                      repeats=1, timed_epochs=1, log=lambda line: None)
    assert frame["steps"].tolist() == [6, 5, 2]
    assert [stub.calls[0][1] for stub in stubs] == [(12, 5), (20, 5), (16, 5)]
    with pytest.raises(GpunnError, match="samples >= 0"):
        batch_timing.time_batches(["cpu-numpy"], [2], steps=3, samples=-1, log=lambda line: None)


def test_e3_timer_refuses_a_diverged_epoch(monkeypatch):
    from gpunn import batch_timing

    clock = _FakeClock()
    monkeypatch.setattr(batch_timing, "time", clock)
    monkeypatch.setattr(batch_timing, "make_backend", lambda *a, **k: _StubBackend(clock, loss=float("nan")))
    with pytest.raises(GpunnError, match=r"stub: E3 epoch 1 at batch 2 ran 3 of 3 steps to loss nan; a diverged"):
        batch_timing.time_batches(["cpu-numpy"], [2], hidden=3, in_features=5, steps=3, log=lambda line: None)


def test_blas_idle_sleeps_for_the_convolutional_models_unless_the_user_set_a_value():
    from gpunn import blas_idle

    environ = {}
    cnn = ["train", "mnist/standard/cnn/cpu-numpy/w16-32_b64_lr0.01_e5_s0", "--data", "x.npz"]
    assert blas_idle.sleep_when_idle(cnn, environ) == "4" and environ == {"OPENBLAS_THREAD_TIMEOUT": "4"}
    environ = {"OPENBLAS_THREAD_TIMEOUT": "28"}
    assert blas_idle.sleep_when_idle(cnn, environ) == "28" and environ == {"OPENBLAS_THREAD_TIMEOUT": "28"}
    for argv in (["autoencoder", "--variants", "cpu-numpy"], ["features", "--run", "runs/m/c/standard/autoencoder/x"]):
        assert blas_idle.sleep_when_idle(argv, {}) == "4"
    for argv in (["train", "mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0"], ["mlp"], ["download", "mnist"],
                 ["train", "mnist/standard/mlp/cpu-numpy/w256_b64_lr0.01_e10_s0", "--out", "results/cnnlike/x"]):
        environ = {}
        assert blas_idle.sleep_when_idle(argv, environ) is None and environ == {}
