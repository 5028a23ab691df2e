"""Argument errors of `gpunn` and `python -m gpunn.bench`: one line on stderr, exit status 2, no usage block,
no traceback and no output file, with every number checked before any work."""

import os
import subprocess
import sys

import pytest

from gpunn import cli
from gpunn.bench.__main__ import main as bench_main


def _one_error_line(err: str, prefix: str = "gpunn: error: ") -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix) and "Traceback" not in err and "usage:" not in err
    return lines[0]


BAD_ARGUMENTS = [
    (["time-batches", "--variants", "cpu-numpy", "--batches", "0,8"], "time-batches", "--batches"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8,x"], "time-batches", "--batches"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--hidden", "0"], "time-batches", "--hidden"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--features", "-1"], "time-batches", "--features"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--repeats", "0"], "time-batches", "--repeats"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--steps", "0"], "time-batches", "--steps"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--timed-epochs", "0"], "time-batches",
     "--timed-epochs"),
    (["time-batches", "--variants", "cpu-numpy", "--batches", "8", "--seed", "-1"], "time-batches", "--seed"),
    (["train", "mnist/standard/mlp/cpu-numpy/w8_b4_lr0.1_e1_s0", "--data", "d.npz", "--progress-every", "-1"],
     "train", "--progress-every"),
    (["svm", "--features", "f", "--C", "-1"], "svm", "--C"),
    (["svm", "--features", "f", "--gamma", "abc"], "svm", "--gamma"),
    (["svm", "--features", "f", "--components", "0"], "svm", "--components"),
    (["svm", "--features", "f", "--train-subset", "-5"], "svm", "--train-subset"),
    (["svm", "--features", "f", "--test-subset", "-5"], "svm", "--test-subset"),
    (["svm", "--features", "f", "--train-subset", "most"], "svm", "--train-subset"),
    (["svm", "--features", "f", "--kernel-device", "tpu"], "svm", "--kernel-device"),
    (["features", "--run", "r", "--data", "d", "--train-limit", "-3"], "features", "--train-limit"),
    (["sweep-blocks", "--blocks", "32", "--shapes", "3x37", "--repeats", "0"], "sweep-blocks", "--repeats"),
    (["download", "mnist", "--timeout", "0"], "download", "--timeout"),
    (["prepare", "mnist", "--raw", "r", "--e2-train", "-1"], "prepare", "--e2-train"),
    (["train"], "train", "required"),
]


@pytest.mark.parametrize("argv, command, named", BAD_ARGUMENTS,
                         ids=[" ".join(a[:1] + a[-2:]) for a, _, _ in BAD_ARGUMENTS])
def test_bad_arguments_are_one_line_and_status_2(argv, command, named, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as caught:
        cli.main([*argv, "--out", str(out)] if argv != ["train"] else argv)
    assert caught.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert named in line and line.endswith(f"(see gpunn {command} --help)")
    assert not out.exists()


def test_missing_and_unknown_command(capsys):
    for argv in ([], ["nosuch"]):
        with pytest.raises(SystemExit) as caught:
            cli.main(argv)
        assert caught.value.code == 2
        assert _one_error_line(capsys.readouterr().err).endswith("(see gpunn --help)")


def test_unknown_variant_is_refused_before_any_timing(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert cli.main(["time-batches", "--variants", "cpu-numpy", "gpu-fast", "--batches", "8", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "unknown variant 'gpu-fast'" in _one_error_line(captured.err)
    assert "cpu-numpy batch" not in captured.out and not out.exists()


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="gpu-graph runs on a real GPU")
def test_time_batches_refuses_gpu_graph_under_the_simulator(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert cli.main(["time-batches", "--variants", "gpu-graph", "--batches", "2", "--out", str(out)]) == 2
    assert "gpu-graph captures CUDA graphs" in _one_error_line(capsys.readouterr().err) and not out.exists()


def test_time_batches_zero_batch_in_a_fresh_process(tmp_path):
    out = tmp_path / "t.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn", "time-batches", "--variants", "cpu-numpy", "--batches",
                           "0,8", "--out", str(out)], capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 2
    assert "--batches" in _one_error_line(done.stderr) and not out.exists()


@pytest.mark.parametrize("argv, named", [(["mlp", "--epochs", "0"], "--epochs"),
                                         (["sgd", "--repeats", "0"], "--repeats"),
                                         (["mlp", "--seed", "-2"], "--seed"), (["nosuch"], "invalid choice")])
def test_bench_arguments_are_one_line_and_status_2(argv, named, tmp_path, capsys):
    out = tmp_path / "b.csv"
    with pytest.raises(SystemExit) as caught:
        bench_main([*argv, "--out", str(out)])
    assert caught.value.code == 2
    line = _one_error_line(capsys.readouterr().err, "gpunn.bench: error: ")
    assert named in line and line.endswith("(see python -m gpunn.bench --help)") and not out.exists()
