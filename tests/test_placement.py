"""gpunn.placement: GPU slots (simulated GPUs as slot ids), cores under timing: overlap, the overlap rule of the
`timing` resource, the per-resource timing locks, and config key gpus."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpunn import placement
from gpunn.config import detect_gpu_ids, gpu_slots, load_config
from gpunn.errors import GpunnError

SRC = str(Path(__file__).resolve().parents[1] / "src")

# the command a placed job runs: where it landed and when, as JSON lines on stdout
REPORT = ("import json, os, sys, time; print(json.dumps({{'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'), "
          "'slots': os.environ.get('GPUNN_GPU_SLOTS'), 'resource': os.environ.get('GPUNN_TIMING_RESOURCE'), "
          "'mode': os.environ.get('GPUNN_TIMING_MODE'), 'cores': sorted(os.sched_getaffinity(0)), "
          "'start': time.time()}}), flush=True); time.sleep({sleep}); print(json.dumps({{'end': time.time()}}))")


@pytest.fixture
def lock_env(tmp_path):
    """Lock files in a folder of this test's own (the slots of other tests and pipelines never interfere)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNN_", "SLURM_", "CUDA_VISIBLE"))}
    env.update(GPUNN_TIMING_LOCK=str(tmp_path / "gpunn-timing.lock"), PYTHONPATH=SRC)
    return env


def _start(env, *options, sleep=1.0):
    return subprocess.Popen([sys.executable, "-m", "gpunn.placement", *options, "--", sys.executable, "-c",
                             REPORT.format(sleep=sleep)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    return {**lines[0], **lines[1], "stderr": err}


def test_two_gpu_jobs_at_once_land_on_different_slots_and_a_third_waits_for_one(lock_env):
    first = _start(lock_env, "--gpu", "--slots", "0,1", "--timed", "gpu", sleep=2.0)
    second = _start(lock_env, "--gpu", "--slots", "0,1", "--timed", "gpu", sleep=2.0)
    time.sleep(0.8)  # both have their slot before the third asks
    third = _start(lock_env, "--gpu", "--slots", "0,1", "--timed", "none", sleep=0.1)
    a, b, c = (_finish(p) for p in (first, second, third))
    assert {a["gpu"], b["gpu"]} == {"0", "1"}
    assert a["slots"] == b["slots"] == "2"
    assert c["start"] >= min(a["end"], b["end"])  # it shared no GPU: it waited for one to be free
    assert "placement: waiting for 1 free GPU of 0,1 (0 of 2 free now; held by pid " in c["stderr"]
    # the waiting line names the holders: their pids (the command keeps the wrapper's) and commands
    for job in (first, second):
        assert f"pid {job.pid} ({sys.executable} -c import json" in c["stderr"]
    assert c["gpu"] in {"0", "1"}


def test_a_timed_gpu_job_shares_its_gpu_with_no_job_timed_or_not(lock_env):
    timed = _start(lock_env, "--gpu", "--slots", "7", "--timed", "gpu", sleep=1.5)
    time.sleep(0.6)
    untimed = _start(lock_env, "--gpu", "--slots", "7", "--timed", "none", sleep=0.1)
    t, u = _finish(timed), _finish(untimed)
    assert t["gpu"] == u["gpu"] == "7"
    assert u["start"] >= t["end"]


def test_overlap_gives_a_cpu_timed_and_a_gpu_job_disjoint_cores(lock_env):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    cpu = _start(lock_env, "--threads", str(len(cores) - 1), "--timed", "cpu", "--timing", "overlap", sleep=1.5)
    gpu = _start(lock_env, "--threads", "1", "--gpu", "--slots", "0", "--timed", "gpu", "--timing", "overlap",
                 sleep=1.5)
    a, b = _finish(cpu), _finish(gpu)
    assert a["cores"] == cores[:-1] and b["cores"] == cores[-1:]  # CPU baseline from below, GPU host from above
    assert a["start"] < b["end"] and b["start"] < a["end"]  # they overlapped
    assert (a["resource"], b["resource"]) == ("cpu", "gpu0")
    assert a["mode"] == b["mode"] == "overlap"


def test_cpu_lanes_let_cpu_timed_jobs_run_at_once_each_timed_against_its_own_lane(lock_env):
    """--lanes 2 (config key cpu_lanes): two CPU-timed jobs at once on cores of their own, timed against cpu0 and
    cpu1; a third waits for a lane; a GPU-timed job takes no lane."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    lanes = ("--threads", "1", "--timed", "cpu", "--timing", "overlap", "--lanes", "2")
    first, second = _start(lock_env, *lanes, sleep=1.5), _start(lock_env, *lanes, sleep=1.5)
    time.sleep(0.8)
    third = _start(lock_env, *lanes, sleep=0.1)
    a, b, c = (_finish(p) for p in (first, second, third))
    assert {a["resource"], b["resource"]} == {"cpu0", "cpu1"} and not set(a["cores"]) & set(b["cores"])
    assert a["start"] < b["end"] and b["start"] < a["end"]  # side by side
    assert c["start"] >= min(a["end"], b["end"]) and "placement: waiting for 1 free CPU lane of 2" in c["stderr"]
    gpu = _finish(_start(lock_env, "--gpu", "--slots", "0", "--timed", "gpu", "--timing", "overlap", "--lanes", "2",
                         sleep=0.0))
    assert gpu["resource"] == "gpu0"
    assert placement.prefix(14, False, True, "overlap", [], lanes=2).endswith("--timing overlap --lanes 2 -- ")
    assert "--lanes" not in placement.prefix(1, True, True, "overlap", ["0"], lanes=2)  # GPU-timed: no lane
    assert "--lanes" not in placement.prefix(14, False, True, "isolated", [], lanes=2)
    assert "--lanes" not in placement.prefix(14, False, True, "overlap", [])  # one lane: the command as before


def test_a_job_waits_until_its_cores_are_free_all_at_once(lock_env):
    cores = sorted(os.sched_getaffinity(0))
    holder = _start(lock_env, "--threads", str(len(cores)), "--timed", "cpu", "--timing", "overlap", sleep=1.5)
    time.sleep(0.6)
    waiter = _start(lock_env, "--threads", "1", "--timing", "overlap", sleep=0.1)
    h, w = _finish(holder), _finish(waiter)
    assert h["cores"] == cores
    assert w["start"] >= h["end"]
    assert "placement: waiting for 1 free cores" in w["stderr"]


def test_a_symlink_planted_at_a_slot_lock_is_refused_in_one_line(lock_env, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "gpunn-gpu-0.lock").symlink_to(victim)
    proc = _start(lock_env, "--gpu", "--slots", "0", sleep=0.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == ""
    assert err == (f"gpunn: error: the lock file {tmp_path / 'gpunn-gpu-0.lock'} is a symbolic link (to {victim}): "
                   "gpunn writes into its lock files and refuses one that could lead its writes elsewhere; remove it "
                   f"if it is yours (ls -l {tmp_path / 'gpunn-gpu-0.lock'}), or set GPUNN_TIMING_LOCK to a file in a "
                   "folder of your own\n")
    assert victim.read_text() == "precious\n"


def test_isolated_binds_no_cores_and_names_no_resource(lock_env):
    job = _finish(_start(lock_env, "--threads", "1", "--timed", "cpu", sleep=0.0))
    assert job["cores"] == sorted(os.sched_getaffinity(0))
    assert job["resource"] is None and job["mode"] == "isolated" and job["gpu"] is None


def test_under_slurm_the_cluster_has_placed_the_job(lock_env):
    env = {**lock_env, "SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "3"}
    job = _finish(_start(env, "--threads", "1", "--gpu", "--slots", "0,1", "--timed", "gpu", "--timing", "overlap",
                         sleep=0.0))
    assert job["gpu"] == "3" and job["resource"] is None and job["mode"] == "overlap"


def test_bad_commands_get_one_line(lock_env):
    out = subprocess.run([sys.executable, "-m", "gpunn.placement", "--threads", "1"], env=lock_env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip() == "gpunn.placement: no command given after --"
    out = subprocess.run([sys.executable, "-m", "gpunn.placement", "--", "no-such-program-gpunn"], env=lock_env,
                         capture_output=True, text=True)
    assert out.returncode == 127 and "cannot run no-such-program-gpunn" in out.stderr


@pytest.mark.parametrize("timing,timed,gpu,simulator,expected", [
    ("isolated", True, 0, False, 1), ("isolated", True, 1, False, 1),  # one timed job at a time
    ("overlap", True, 0, False, 1), ("overlap", True, 1, False, 0),  # CPU-timed ones one at a time, GPU per slot
    ("overlap", False, 0, False, 0), ("isolated", False, 1, False, 0),  # untimed jobs take none
    ("isolated", True, 1, True, 0), ("isolated", True, 0, True, 1),  # simulated GPU times measure nothing
    ("overlap", "both", 1, False, 1), ("isolated", "both", 1, False, 1),  # the SVM: GPU kernel, CPU solver
])
def test_the_overlap_rule_of_the_timing_resource(timing, timed, gpu, simulator, expected):
    assert placement.resources(timing, timed, gpu, simulator) == {"timing": expected}


def test_the_prefix_names_slots_only_for_gpu_jobs():
    assert placement.prefix(4, False, True, "overlap", ["0", "1"]) == (
        "python -m gpunn.placement --threads 4 --timed cpu --timing overlap -- ")
    assert placement.prefix(1, True, True, "isolated", ["0", "1"]).endswith("--timed gpu --timing isolated --gpu "
                                                                            "--slots 0,1 -- ")
    assert "--gpu" not in placement.prefix(1, True, False, "isolated", [])
    assert "--timed both" in placement.prefix(4, True, "both", "overlap", ["0"])
    assert "--timed cpu" in placement.prefix(4, False, "both", "overlap", ["0"])  # the SVM on the CPU


def test_a_borrowing_job_is_given_a_free_gpu_unheld_and_holds_it_only_inside_borrowed_gpu(lock_env, monkeypatch):
    """--borrow (the SVM): the job gets the first free GPU (CUDA_VISIBLE_DEVICES) without its lock, so another GPU
    job may take that GPU at once; its timed resource under overlap is its CPU lane alone; borrowed_gpu then takes the
    GPU's lock, waiting (one line) while another job holds it, and release() gives it back."""
    holder = _start(lock_env, "--gpu", "--slots", "0,1", "--timed", "gpu", sleep=2.0)  # holds GPU 0
    time.sleep(0.8)
    borrower = _finish(_start(lock_env, "--gpu", "--borrow", "--slots", "0,1", "--timed", "both", "--timing",
                              "overlap", "--threads", "1", sleep=0.1))
    assert borrower["gpu"] == "1" and borrower["resource"] == "cpu"  # the free one; no gpu<id> timing resource
    assert borrower["start"] < _finish(holder)["end"]  # it did not wait for a GPU
    assert placement.prefix(4, True, "both", "overlap", ["0", "1"], borrow=True).endswith(
        "--timed both --timing overlap --gpu --borrow --slots 0,1 -- ")

    monkeypatch.setenv("GPUNN_TIMING_LOCK", lock_env["GPUNN_TIMING_LOCK"])
    environ = {"GPUNN_GPU_SLOT": "3", "GPUNN_GPU_BORROWED": "1"}
    job = _start(lock_env, "--gpu", "--slots", "3", "--timed", "gpu", sleep=1.5)
    time.sleep(0.8)
    lines, start = [], time.time()
    with placement.borrowed_gpu(lines.append, environ) as gpu:
        waited = time.time() - start
        assert gpu.slot == "3" and placement._try_lock(os.path.join(placement.lock_dir(), "gpunn-gpu-3.lock")) is None
        gpu.release()
        fd = placement._try_lock(os.path.join(placement.lock_dir(), "gpunn-gpu-3.lock"))
        assert fd is not None  # given back inside the block
        os.close(fd)
    assert waited > 0.3 and len(lines) == 1
    assert re.fullmatch(rf"placement: waiting for 1 free GPU of 3 \(0 of 1 free now; held by pid {job.pid} "
                        rf"\({re.escape(sys.executable)} -c import json, .*\.\.\., since \d\d:\d\d:\d\d\)\)",
                        lines[0]), lines
    _finish(job)
    for unborrowed in ({"GPUNN_GPU_SLOT": "3"}, {}):  # placement holds the job's GPU, or no wrapper ran
        with placement.borrowed_gpu(lines.append, unborrowed) as gpu:
            assert gpu is None


def test_describe_cores():
    assert placement.describe_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert placement.describe_cores([3]) == "3" and placement.describe_cores([]) == ""


def _config(**raw):
    return load_config(raw, gpu_name=lambda: None, log=lambda line: None)


def test_gpus_auto_is_every_gpu_found_and_n_the_first_n():
    found = lambda: ["0", "1", "2"]  # noqa: E731
    assert gpu_slots(_config(), found) == ["0", "1", "2"]
    assert gpu_slots(_config(gpus=2), found) == ["0", "1"]
    assert gpu_slots(_config(gpus="2"), lambda: []) == ["0", "1"]  # none found: trusted as given
    with pytest.raises(GpunnError, match="config key gpus: 4 GPUs asked for, 3 found"):
        gpu_slots(_config(gpus=4), found)
    assert gpu_slots(_config(gpu={"enabled": False}), found) == []


def test_simulated_gpus_are_slots_given_by_the_setting():
    simulator = {"enabled": True, "simulator": True}
    assert gpu_slots({"gpus": "auto", "gpu": simulator}, lambda: ["0"]) == []
    assert gpu_slots({"gpus": 3, "gpu": simulator}, lambda: []) == ["0", "1", "2"]


def test_cuda_visible_devices_decides_which_gpus_are_found(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert detect_gpu_ids() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert detect_gpu_ids() == []


def test_bad_timing_and_gpus_settings_get_one_line():
    with pytest.raises(GpunnError, match="config key timing: 'both' is not one of"):
        _config(timing="both")
    with pytest.raises(GpunnError, match="config key gpus: 0 is less than the minimum of 1"):
        _config(gpus=0)


# 'end' is read while the lock is still held: read after the release, another holder may already have started
# (a flaky failure by 41 us, seen once)
HOLD = ("import json, sys, time; from gpunn.timing_lock import timing_lock\n"
        "with timing_lock('test', log=lambda line: print(line, file=sys.stderr)) as lock:\n"
        "    print(json.dumps({'start': time.time(), 'waited': lock.waited_s}), flush=True); time.sleep(1.2)\n"
        "    end = time.time()\n"
        "print(json.dumps({'end': end}))")


def _hold(env, resource):
    env = {**env, **({"GPUNN_TIMING_RESOURCE": resource} if resource else {})}
    return subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _held(proc):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    first, last = (json.loads(line) for line in out.splitlines())
    return {**first, **last}


def test_timed_jobs_of_two_resources_overlap_of_one_resource_do_not_and_a_bench_waits_for_both(lock_env):
    cpu, gpu = _hold(lock_env, "cpu"), _hold(lock_env, "gpu0")
    time.sleep(0.5)
    second_gpu, bench = _hold(lock_env, "gpu0"), _hold(lock_env, "")
    a, b, c, d = (_held(p) for p in (cpu, gpu, second_gpu, bench))
    assert a["start"] < b["end"] and b["start"] < a["end"]  # CPU-timed beside GPU-timed
    assert c["start"] >= b["end"]  # one GPU: one timed job at a time
    assert d["start"] >= max(a["end"], b["end"])  # the machine-wide lock, exclusive: after every shared holder


def test_compare_says_whether_the_change_is_within_the_alone_repeats_spread():
    import pandas as pd

    from gpunn.overlap_check import compare

    rows = [("cpu beside gpu", r, "cpu", t, s) for r, t, s in
            [(1, False, 10.0), (2, False, 10.4), (3, False, 10.2), (1, True, 10.3), (2, True, 10.1), (3, True, 10.5)]]
    rows += [("cpu beside gpu", r, "gpu on 0", t, s) for r, t, s in
             [(1, False, 2.0), (2, False, 2.02), (3, False, 2.01), (1, True, 2.3), (2, True, 2.2), (3, True, 2.25)]]
    frame = pd.DataFrame(rows, columns=["scenario", "repeat", "job", "together", "seconds"])
    table = compare(frame).set_index("job")
    assert table.loc["cpu", "noise"] == pytest.approx(0.4 / 10.2)
    assert table.loc["cpu", "change"] == pytest.approx(10.3 / 10.2 - 1)
    assert table.loc["cpu", "verdict"] == "within noise"
    assert table.loc["gpu on 0", "change"] == pytest.approx(2.25 / 2.01 - 1)
    assert table.loc["gpu on 0", "verdict"] == "outside noise"


def test_overlap_check_times_the_same_runs_alone_and_together(lock_env, tmp_path):
    env = {**lock_env, "NUMBA_ENABLE_CUDASIM": "1"}
    gpunn = [sys.executable, "-m", "gpunn"]
    subprocess.run([*gpunn, "make-offline", "digits8_mini", "--out", str(tmp_path / "raw")], env=env, check=True,
                   capture_output=True)
    data = str(tmp_path / "d8.npz")
    subprocess.run([*gpunn, "prepare", "digits8_mini", "--raw", str(tmp_path / "raw"), "--out", data], env=env,
                   check=True, capture_output=True)

    def overlap_check(out: str, *options: str):
        runs = ["--cpu", "digits8_mini/standard/mlp/cpu-numpy/w8_b8_lr0.3_e1_s0_n16", "--cpu-data", data,
                "--gpu", "digits8_mini/standard/mlp/gpu-fused/w8_b8_lr0.3_e1_s0_n8", "--gpu-data", data]
        done = subprocess.run([*gpunn, "overlap-check", *runs, "--threads", "1", "--repeats", "2", *options,
                               "--out", str(tmp_path / out)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    overlap_check("check", "--gpus", "1")
    import pandas as pd

    frame = pd.read_csv(tmp_path / "check/overlap.csv", dtype={"gpu": str})
    assert len(frame) == 2 * 4  # per repeat: each job alone, then both together
    assert set(frame["job"]) == {"cpu", "gpu on 0"} and (frame["seconds"] > 0).all()
    assert set(frame.loc[frame["job"] == "gpu on 0", "gpu"]) == {"0"}
    report = (tmp_path / "check/overlap.md").read_text()
    assert "| cpu beside gpu | cpu |" in report
    assert "Final train loss the same in every run of a job (alone, together, on either GPU): gpu yes; cpu yes." \
        in report  # deterministic variants, bit for bit wherever and beside whatever they ran
    assert not list((tmp_path / "check/runs").rglob("weights.npz"))
    overlap_check("placed", "--gpus", "1", "--scenario", "placement")
    frame = pd.read_csv(tmp_path / "placed/overlap.csv", dtype={"gpu": str, "cores": str})
    assert set(frame["scenario"]) == {"placed against unplaced"} and len(frame) == 2 * 4
    placed, unplaced = frame[frame["together"]], frame[~frame["together"]]
    assert set(placed.loc[placed["job"] == "gpu on 0", "gpu"]) == {"0"}  # placed: its slot, recorded
    assert unplaced["gpu"].isna().all()  # unplaced: no slot taken (CUDA_VISIBLE_DEVICES alone)
    everything = placement.describe_cores(os.sched_getaffinity(0))
    assert set(unplaced["cores"]) == {everything} and set(placed.loc[placed["job"] == "cpu", "cores"]) == {
        placement.describe_cores(sorted(os.sched_getaffinity(0))[:1])}
    # an overlap suspect: the timed CPU run beside an untimed run on the cores it leaves (no GPU needed)
    overlap_check("untimed", "--gpus", "0", "--scenario", "untimed")
    frame = pd.read_csv(tmp_path / "untimed/overlap.csv", dtype={"gpu": str, "cores": str})
    assert set(frame["scenario"]) == {"cpu beside untimed cpu"} and len(frame) == 2 * 4
    cores = sorted(os.sched_getaffinity(0))
    assert set(frame.loc[frame["job"] == "cpu", "cores"]) == {placement.describe_cores(cores[:1])}
    assert set(frame.loc[frame["job"] == "untimed neighbour", "cores"]) == {
        placement.describe_cores(cores[1:] or cores)}  # from the highest core down, every one the CPU run leaves
    assert "| cpu beside untimed cpu | cpu |" in (tmp_path / "untimed/overlap.md").read_text()
