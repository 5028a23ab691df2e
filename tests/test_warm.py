"""gpunn.warm: jobs run in a fork of a warm server give what the same job run alone gives (outputs, bits, output
lines, exit status), report their own CPU time and memory, end with their client, and fall back to running alone."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpunn import warm
from gpunn.jobusage import PREFIX

RUN = "digits8_mini/standard/mlp/cpu-numpy/w8_b8_lr0.3_e2_s0_n16"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm-data")
    gpunn = [sys.executable, "-m", "gpunn"]
    subprocess.run([*gpunn, "make-offline", "digits8_mini", "--out", str(folder / "raw")], check=True,
                   capture_output=True)
    subprocess.run([*gpunn, "prepare", "digits8_mini", "--raw", str(folder / "raw"), "--out", str(folder / "d.npz")],
                   check=True, capture_output=True)
    return folder / "d.npz"


@pytest.fixture
def warm_env(tmp_path):
    """A private socket folder (TMPDIR) and servers that end 20 s after their last job; stopped at the end."""
    env = {**os.environ, "TMPDIR": str(tmp_path), warm.ENABLE_VARIABLE: "1", warm.IDLE_VARIABLE: "20"}
    env.pop("SLURM_JOB_ID", None)
    yield env
    subprocess.run([sys.executable, "-m", "gpunn.warm", "stop"], env=env, capture_output=True, timeout=30)


def _train(env, data, out, *extra):
    return subprocess.run([sys.executable, "-m", "gpunn", "train", RUN, "--data", str(data), "--out", str(out),
                           *extra], env=env, capture_output=True, text=True, timeout=300)


def _server_logs(tmp_path):
    return list((tmp_path / f"gpunn-warm-{os.getuid()}").glob("*.sock.log"))


def test_a_warm_job_gives_what_the_job_alone_gives(prepared, warm_env, tmp_path):
    alone = _train({k: v for k, v in warm_env.items() if k != warm.ENABLE_VARIABLE}, prepared, tmp_path / "alone")
    first = _train(warm_env, prepared, tmp_path / "first")  # starts the server
    second = _train(warm_env, prepared, tmp_path / "second")  # forked from the running one
    assert alone.returncode == first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert not _server_logs(tmp_path) or len(_server_logs(tmp_path)) == 1
    log = _server_logs(tmp_path)[0].read_text()
    assert log.count("serving") == 1  # one server, started once, served both
    weights = (tmp_path / "alone/weights.npz").read_bytes()
    assert (tmp_path / "first/weights.npz").read_bytes() == weights == (tmp_path / "second/weights.npz").read_bytes()

    def epochs(text):
        return [line.split(" (")[0] for line in text.splitlines() if line.startswith("epoch ")]

    assert epochs(second.stdout) == epochs(alone.stdout) and len(epochs(alone.stdout)) == 2
    usage = second.stderr.strip().splitlines()[-1]
    assert usage.startswith(PREFIX) and PREFIX not in alone.stderr
    fields = dict(word.split("=") for word in usage.split() if "=" in word)
    assert float(fields["cpu_time_s"]) > 0 and float(fields["max_rss_mb"]) > 10
    metrics = json.loads((tmp_path / "second/metrics.json").read_text())
    assert metrics["final_test_accuracy"] == json.loads((tmp_path / "alone/metrics.json").read_text())[
        "final_test_accuracy"]


def test_a_failing_warm_job_fails_with_its_own_line_and_status(prepared, warm_env, tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpunn", "train", "digits8_mini/standard/mlp/no-such-variant/"
                           "w8_b8_lr0.3_e1_s0", "--data", str(prepared), "--out", str(tmp_path / "bad")],
                          env=warm_env, capture_output=True, text=True, timeout=120)
    alone = subprocess.run(done.args, env={k: v for k, v in warm_env.items() if k != warm.ENABLE_VARIABLE},
                           capture_output=True, text=True, timeout=120)
    assert done.returncode == alone.returncode == 2
    assert done.stderr.splitlines()[0] == alone.stderr.splitlines()[0]
    assert done.stderr.splitlines()[0].startswith("gpunn: error:")
    assert not (tmp_path / "bad").exists()


def _started_job(tmp_path, out: str, timeout: float = 60) -> int:
    """The pid of the job the server started for the run writing to `out` (from the server's log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in _server_logs(tmp_path)[0].read_text().splitlines():
            if line.startswith("job ") and f"--out {tmp_path / out}" in line:
                return int(line.split()[1].rstrip(":"))
        time.sleep(0.1)
    raise AssertionError("the server never started the job")


def _gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(") ", 1)[1][0] == "Z":  # ended, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_warm_job_ends_with_its_client(prepared, warm_env, tmp_path, how):
    """SIGTERM to the client reaches the job (forwarded); a client killed outright leaves a job that ends by itself
    within a second or so (it watches its client), writing nothing."""
    long_run = RUN.replace("_e2_", "_e100000_")
    client = subprocess.Popen([sys.executable, "-m", "gpunn", "train", long_run, "--data", str(prepared), "--out",
                               str(tmp_path / "long")], env=warm_env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    for line in client.stdout:
        if line.startswith("epoch 1/"):
            break
    job = _started_job(tmp_path, "long")
    client.send_signal(getattr(signal, how))
    assert client.wait(timeout=60) != 0
    assert _gone(job), f"job {job} still runs after its client got {how}"
    assert not (tmp_path / "long/metrics.json").exists()


def test_no_server_means_the_job_runs_alone(prepared, warm_env, tmp_path):
    (tmp_path / f"gpunn-warm-{os.getuid()}").write_text("")  # a file where the socket folder goes: no server
    done = _train(warm_env, prepared, tmp_path / "alone")
    assert done.returncode == 0, done.stderr
    assert PREFIX not in done.stderr and (tmp_path / "alone/weights.npz").exists()


def test_the_server_key_follows_what_the_preloaded_modules_read():
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    key = warm.server_key(base)
    assert warm.server_key({**base, "CUDA_VISIBLE_DEVICES": "1", "GPUNN_GPU_SLOT": "1"}) == key  # read after fork
    for changed in ({"NUMBA_ENABLE_CUDASIM": "1"}, {"OMP_NUM_THREADS": "4"}, {"PYTHONPATH": "/x"},
                    {"GPUNN_KERNEL_CACHE": "off"}, {"HOME": "/home/other"}):
        assert warm.server_key({**base, **changed}) != key, changed
    assert warm.wanted(["train", "x"]) is (os.environ.get(warm.ENABLE_VARIABLE) == "1")
    assert not warm.wanted(["report", "x"]) and not warm.wanted([])


def test_an_idle_server_ends_by_itself(prepared, warm_env, tmp_path):
    env = {**warm_env, warm.IDLE_VARIABLE: "1"}
    assert _train(env, prepared, tmp_path / "one").returncode == 0
    sockets = lambda: list((tmp_path / f"gpunn-warm-{os.getuid()}").glob("*.sock"))  # noqa: E731
    deadline = time.monotonic() + 30
    while sockets() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sockets()


@pytest.mark.gpu
def test_a_warm_gpu_job_gives_what_the_gpu_job_alone_gives(prepared, warm_env, tmp_path):
    """On a real GPU: a deterministic GPU variant forked from the warm server (its own CUDA context, its kernels from
    the disk cache) writes the weights the same job writes alone, bit for bit; twice, the second from the running
    server."""
    env = {k: v for k, v in warm_env.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = RUN.replace("cpu-numpy", "gpu-graph")
    outs = []
    for name, enabled in (("alone", False), ("first", True), ("second", True)):
        job_env = env if enabled else {k: v for k, v in env.items() if k != warm.ENABLE_VARIABLE}
        done = subprocess.run([sys.executable, "-m", "gpunn", "train", run, "--data", str(prepared), "--out",
                               str(tmp_path / name)], env=job_env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (PREFIX in done.stderr) is enabled
        outs.append((tmp_path / name / "weights.npz").read_bytes())
    assert outs[0] == outs[1] == outs[2]
