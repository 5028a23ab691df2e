"""Where a training step's time goes (issue 22, deliverable 4): `gpunn profile` under the simulator (the launch list,
no times), the report's step_profile table and figure on hand-built timed and untimed profiles (top-3 order, the "other"
merge, the host-overhead segment), their place in the E1/E4/E5 reports and the workflow's plan (one GPU job per
model and GPU variant of E1, E4 and E5)."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from gpunn import device
from gpunn.cli import main as cli_main
from gpunn.config import load_config
from gpunn.errors import GpunnError
from gpunn.report import step_profile
from gpunn.report.build import make_report
from gpunn.targets import profiled_variants, report_inputs, report_outputs
from gpunn.timing import PROFILE_COLUMNS

from snakemake_helpers import run_snakemake
from test_report import _assert_written, _e1_results

H100 = {"device": "NVIDIA H100 80GB HBM3", "driver": "NVIDIA 580.159.04, CUDA 13.0", "simulator": False,
        "commit": "abc1234"}
SIMULATED = {"device": "cuda-simulator", "driver": None, "simulator": True, "commit": "abc1234"}
# (phase, launch, ms) of one CNN step per variant, and the host overhead in µs: every gemm launch alone is under 5 %
# of gpu-naive's kernel time but the op (gemm_naive) is over it; relu_forward and sgd_step are under 5 % in both
# variants
NAIVE = [("forward", "conv_forward_naive[k3,p0,bias]", 0.6), ("forward", "relu_forward", 0.02),
         ("forward", "gemm_naive[NN,none]", 0.3), ("backward", "gemm_naive[TN,none]", 0.25),
         ("backward", "conv_backward_weight_naive[k3,p0]", 6.0), ("backward", "conv_bias_grad_naive", 3.0),
         ("backward", "sgd_step", 0.03)]
OPTIMIZED = [("forward", "conv_forward_tiled[k3,p0,bias]", 0.2), ("forward", "relu_forward", 0.01),
             ("backward", "conv_backward_weight_shuffle[k3,p0]", 0.15), ("backward", "conv_bias_grad_block", 0.05),
             ("backward", "sgd_step", 0.01)]
HOST_US = {"gpu-naive": 250.0, "gpu-optimized": 80.0}  # others: 100
BACK_TO_BACK = 0.9  # the step's launches run back to back take this fraction of their times alone, summed


def _profile(path, variant, launches, timed=True, where=H100):
    """A step profile CSV as rule step_profile writes it (gpunn.timing.step_profile's columns); untimed: the
    simulator's, every time NaN."""
    kernel = sum(ms for _, _, ms in launches) if timed else math.nan
    step = BACK_TO_BACK * kernel
    wall = step + HOST_US.get(variant, 100.0) / 1000 if timed else math.nan
    rows = [{"model": "cnn", "variant": variant, "batch": 64, "order": i, "phase": phase, "launch": name,
             "grid": "(4, 8)", "block": "128", "ms": ms if timed else math.nan,
             "share": ms / kernel if timed else math.nan, "step_wall_ms": wall, "kernel_ms": kernel,
             "step_kernels_ms": step, "host_overhead_us": 1000 * (wall - step) if timed else math.nan, **where}
            for i, (phase, name, ms) in enumerate(launches)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _profiles(tmp_path, timed=True):
    where = H100 if timed else SIMULATED
    return [_profile(tmp_path / "profile" / "gpu-optimized.csv", "gpu-optimized", OPTIMIZED, timed, where),
            _profile(tmp_path / "profile" / "gpu-naive.csv", "gpu-naive", NAIVE, timed, where)]


def _drawn(monkeypatch):
    """Capture what step_profile.figure draws: {'title', 'ylabel', 'host': heights of the hatched segments}."""
    seen = {}
    save = step_profile.figures.save

    def capture(fig, out_png):
        ax = fig.axes[0]
        seen.update(title=fig._suptitle.get_text(), ylabel=ax.get_ylabel(),
                    host=[p.get_height() for p in ax.patches if p.get_hatch() == "//"])
        return save(fig, out_png)

    monkeypatch.setattr(step_profile.figures, "save", capture)
    return seen


# ------------------------------------------------------------------------------------------- the report's part
def test_timed_profile_top_three_other_merge_and_host_segment(tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch)
    written = step_profile.report("e4", _profiles(tmp_path), tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "step_profile.csv")
    assert list(table["variant"]) == ["gpu-naive"] * 3 + ["gpu-optimized"] * 3  # report order, not the inputs'
    assert list(table["launch"]) == ["conv_backward_weight_naive[k3,p0]", "conv_bias_grad_naive",
                                     "conv_forward_naive[k3,p0,bias]", "conv_forward_tiled[k3,p0,bias]",
                                     "conv_backward_weight_shuffle[k3,p0]", "conv_bias_grad_block"]
    assert list(table["ms"]) == [6.0, 3.0, 0.6, 0.2, 0.15, 0.05]
    naive = table[table["variant"] == "gpu-naive"]
    assert naive["kernel_ms"].tolist() == pytest.approx([10.2] * 3)
    assert naive["host_overhead_us"].tolist() == pytest.approx([250.0] * 3)
    assert naive["step_kernels_ms"].tolist() == pytest.approx([9.18] * 3)
    assert naive["step_wall_ms"].tolist() == pytest.approx([9.43] * 3)
    assert naive["share"].iloc[0] == pytest.approx(6.0 / 10.2)
    md = (tmp_path / "out" / "step_profile.md").read_text()
    assert md.startswith(f"## {written['step_profile.md']}\n")
    assert "three largest launches of one CNN training step" in md and "timed on NVIDIA H100 80GB HBM3" in md
    assert "58.8 %" in md and "host_overhead_us = 1000 x (step_wall_ms - step_kernels_ms)" in md
    ops = step_profile.op_table(step_profile.read_profiles(_profiles(tmp_path)))
    assert list(ops.index) == ["gpu-naive", "gpu-optimized"]
    # an op's time: its launches' share of the summed alone times, of the step's back-to-back kernel time
    assert ops.loc["gpu-naive", "gemm_naive"] == pytest.approx(0.55 * BACK_TO_BACK)  # its two launches, one op
    assert "relu_forward" not in ops and "sgd_step" not in ops
    assert ops[step_profile.OTHER].tolist() == pytest.approx([0.05 * BACK_TO_BACK, 0.02 * BACK_TO_BACK])
    assert list(ops.columns)[-2:] == [step_profile.OTHER, step_profile.HOST]
    assert ops.drop(columns=step_profile.HOST).sum(axis=1).tolist() == pytest.approx([9.18, 0.378])  # no time lost
    assert drawn["host"] == pytest.approx([0.25, 0.08])  # the host overhead segment of each bar, in ms
    assert drawn["ylabel"] == "time per training step (ms)" and step_profile.UNTIMED not in drawn["title"]
    assert (tmp_path / "out" / "step_profile.png").stat().st_size > 0
    assert (tmp_path / "out" / "step_profile.pdf").is_file()


def test_untimed_profile_lists_launches_and_shows_no_times(tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch)
    written = step_profile.report("e4", _profiles(tmp_path, timed=False), tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "step_profile.csv")
    assert not set(step_profile.TIME_COLUMNS) & set(table.columns)
    assert list(table["launch"]) == [name for _, name, _ in NAIVE] + [name for _, name, _ in OPTIMIZED]  # step order
    md = (tmp_path / "out" / "step_profile.md").read_text()
    assert step_profile.UNTIMED in written["step_profile.md"] and "without times" in md
    assert not re.search(r"\| *ms *\|", md) and "host_overhead" not in md
    assert step_profile.UNTIMED in drawn["title"] and drawn["ylabel"] == "launches per training step (count)"
    assert drawn["host"] == []  # no host overhead segment
    ops = step_profile.op_table(step_profile.read_profiles(_profiles(tmp_path, timed=False)))
    assert step_profile.HOST not in ops and ops.loc["gpu-naive", "gemm_naive"] == 2  # counts, not times


def test_bad_profiles_are_one_line(tmp_path):
    timed, untimed = _profiles(tmp_path / "a"), _profiles(tmp_path / "b", timed=False)
    with pytest.raises(GpunnError, match="mix timed launches with untimed ones"):
        step_profile.read_profiles([timed[0], untimed[1]])
    with pytest.raises(GpunnError, match="gpu-naive is profiled in more than one"):
        step_profile.read_profiles([timed[1], _profile(tmp_path / "c.csv", "gpu-naive", NAIVE)])
    pd.read_csv(timed[0]).drop(columns="host_overhead_us").to_csv(tmp_path / "old.csv", index=False)
    with pytest.raises(GpunnError, match="lacks column"):
        step_profile.read_profiles([tmp_path / "old.csv"])
    assert step_profile.report("e4", [], tmp_path / "none") == {}  # no GPU variant ran: nothing to write


def test_e1_report_with_profiles_writes_what_the_workflow_declares(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive", "gpu-fused"])
    profiles = [_profile(tmp_path / "profile" / "e1" / f"{variant}.csv", variant, launches)  # a CNN's launches will do
                for variant, launches in (("gpu-naive", NAIVE), ("gpu-fused", OPTIMIZED))]
    out = tmp_path / "report"
    written = make_report("e1", out, runs=runs, evals=evals, profiles=profiles)
    _assert_written(out, "e1", {"experiments": {"e1": {"variants": ["cpu-numpy", "gpu-naive", "gpu-fused"]}}},
                    profiled=True)
    assert {"step_profile.md", "step_profile.png"} <= set(written)
    used = {u for record in json.loads((out / "provenance.json").read_text())["sources"] for u in record["used_by"]}
    assert {"step profile gpu-naive", "step profile gpu-fused"} <= used


def test_cli_report_passes_profiles(tmp_path):
    runs, evals = _e1_results(tmp_path, ["cpu-numpy", "gpu-naive"])
    profile = _profile(tmp_path / "profile" / "gpu-naive.csv", "gpu-naive", NAIVE)
    assert cli_main(["report", "e1", "--out", str(tmp_path / "r"), "--runs", *map(str, runs),
                     "--evals", *map(str, evals), "--profiles", str(profile)]) == 0
    assert pd.read_csv(tmp_path / "r" / "step_profile.csv")["launch"].iloc[0] == "conv_backward_weight_naive[k3,p0]"


# ------------------------------------------------------------------------------------------- the job's part
@pytest.mark.skipif(not device.simulator_enabled(), reason="checks the simulator's untimed launch list")
def test_profile_cli_writes_the_launch_list_without_times_under_the_simulator(tmp_path, capsys):
    out = tmp_path / "e1" / "gpu-fused.csv"
    assert cli_main(["profile", "--model", "mlp", "--dataset", "digits8", "--batch", "4", "--widths", "5",
                     "--variants", "gpu-fused", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == PROFILE_COLUMNS
    assert list(frame["order"]) == list(range(len(frame))) and set(frame["variant"]) == {"gpu-fused"}
    assert list(frame["phase"]) == ["forward"] * 4 + ["backward"] * 4  # gather, 2 GEMMs, softmax-CE; 3 GEMMs, SGD
    assert frame["launch"].iloc[-1] == "sgd_step" and (frame["batch"] == 4).all() and frame["simulator"].all()
    assert frame[["ms", "share", "step_wall_ms", "kernel_ms", "host_overhead_us"]].isna().all().all()
    assert "listed without times" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--model", "mlp", "--variants", "cpu-numpy", "--widths", "5"], "cpu-numpy trains on the CPU"),
    (["--model", "mlp", "--variants", "gpu-fused", "--widths", "5,3"], "mlp takes 1 width(s)"),
    (["--model", "cnn", "--variants", "gpu-fused", "--widths", "2,4"], "gpu-fused supports mlp, not cnn"),
    (["--model", "mlp", "--variants", "gpu-fused", "--widths", "5", "--dataset", "nope"], "nope"),
])
def test_profile_cli_bad_input_is_one_line(tmp_path, capsys, args, message):
    argv = ["profile", "--dataset", "digits8", "--batch", "4", *args, "--out", str(tmp_path / "p.csv")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpunn: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "p.csv").exists()


# ------------------------------------------------------------------------------------------- the workflow's part
def _config(overrides=None):
    return load_config(overrides or {}, gpu_name=lambda: "NVIDIA H100", log=lambda line: None)


def test_profiles_are_report_inputs_and_outputs_of_e1_e4_e5():
    config = _config()
    tensor = ["gpu-tf32", "gpu-bf16"]
    for experiment, variants in {"e1": ["gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph", *tensor],
                                 "e4": ["gpu-naive", "gpu-optimized", "gpu-im2col", "gpu-graph", *tensor],
                                 "e5": ["gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph", *tensor]}.items():
        assert profiled_variants(config, experiment) == variants
        assert report_inputs(config, experiment)["profiles"] == [
            f"results/profile/nvidia-h100/{experiment}/{v}.csv" for v in variants]
        names = [p.rsplit("/", 1)[1] for p in report_outputs(config, experiment)]
        assert {"step_profile.csv", "step_profile.md", "step_profile.png", "step_profile.pdf"} <= set(names)
    for experiment in ("e2", "e3", "e6"):
        assert "profiles" not in report_inputs(config, experiment)
        assert not any("step_profile" in p for p in report_outputs(config, experiment))
    cpu = _config({"gpu": {"enabled": False}})  # no GPU variant: no profile, nor its table and figure
    assert "profiles" not in report_inputs(cpu, "e4")
    assert not any("step_profile" in p for p in report_outputs(cpu, "e4"))


def _jobs(text: str, rule: str) -> list[str]:
    """The dry-run blocks of every job of `rule` (from its `rule NAME:` line to its shell command)."""
    starts = [m.start() for m in re.finditer(rf"^rule {rule}:", text, flags=re.MULTILINE)]
    return [text[s:text.index("\n", text.index("Shell command:", s))] for s in starts]


def test_dry_run_plans_one_gpu_profile_job_per_model_and_gpu_variant(workflow_copy):
    out = run_snakemake(workflow_copy, "-n", "-p", "--cores", "4", "--config", "machine=gpu-box", "job_details=true")
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = _jobs(out.stdout + out.stderr, "step_profile")
    planned = sorted(re.search(r"wildcards: experiment=(\w+), variant=([\w-]+)", job).groups() for job in jobs)
    config = _config()
    assert planned == sorted((e, v) for e in ("e1", "e4", "e5") for v in profiled_variants(config, e))
    for job in jobs:
        assert re.search(r"resources: .*\bgpu=1\b", job) and re.search(r"\btiming=1\b", job)
        assert "NUMBA_ENABLE_CUDASIM" not in job
    e4 = next(job for job in jobs if "experiment=e4, variant=gpu-naive" in job)
    assert ("python -m gpunn profile --model cnn --dataset mnist --batch 64 --widths 16,32 --variants gpu-naive "
            "--out results/profile/gpu-box/e4/gpu-naive.csv") in e4
    e5 = next(job for job in jobs if "experiment=e5, variant=gpu-im2col" in job)
    assert "--model autoencoder --dataset cifar10 --batch 64 --widths 256,128" in e5
    report = _jobs(out.stdout + out.stderr, "report_e1")[0]
    assert "--profiles results/profile/gpu-box/e1/gpu-naive.csv" in report


def test_e4_naive_note_reads_the_step_profile_and_the_epochs(tmp_path):
    """E4's note on its naive: the share of gpu-naive's step in the conv weight and bias gradients from its step
    profile (6 + 3 of 10.2 ms here), the epochs against the paper's A40; under the simulator only the design."""
    from gpunn.experiments.e4 import NAIVE_DESIGN, naive_note

    main = pd.DataFrame([{"variant": v, "dataset": "mnist", "time_per_epoch_s": t, "device": "NVIDIA H200",
                          "simulator": False} for v, t in (("gpu-naive", 7.8), ("gpu-optimized", 0.55))])
    note = naive_note(main, _profiles(tmp_path))
    assert note.startswith(NAIVE_DESIGN + " In this run's step profile those launches (2, of (4, 8) blocks) take 88 % "
                           "of gpu-naive's 10.2 ms of kernel time a step")
    assert ("our naive/optimized ratio is 14.2x (7.8 s against 0.55 s an epoch on NVIDIA H200), the paper's 4.53x "
            "(NVIDIA A40: 4.69 s against 1.04 s): our optimized epoch is 1.9x shorter than the paper's, our naive one "
            "1.7x longer.") in note
    simulated = main.assign(simulator=True)
    assert naive_note(simulated, _profiles(tmp_path / "sim", timed=False)) == NAIVE_DESIGN
    assert naive_note(main[main["variant"] != "gpu-naive"]) is None
