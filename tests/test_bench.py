"""gpunn.bench and `gpunn sweep-blocks`: validation before timing, the first mismatch stops everything, one CSV
row per configuration, atomic outputs, one-line errors.

Under the CUDA simulator (tiny shapes, few blocks) timings are host-clock times and meaningless: they are only
checked to be finite and positive. `gpu`-marked tests need a real GPU (CUDA events, the torch comparison).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from numba import config, cuda

from gpunn import bench, cli, flops, provenance
from gpunn.backends.gpu.policy import POLICIES
from gpunn.backends.registry import VARIANTS
from gpunn.bench import gemm as BG
from gpunn.bench.__main__ import main as bench_main
from gpunn.bench.gemm import SPLIT_K_VERSIONS
from gpunn.errors import GpunnError
from gpunn.kernels import elementwise, gemm
from gpunn.nn import build_model

ON_GPU = not config.ENABLE_CUDASIM


def _positive_finite(values) -> bool:
    values = np.asarray(values, np.float64)
    return bool(np.all(np.isfinite(values)) and np.all(values > 0))


# --------------------------------------------------------------------------------------------- validation
# conv and pool validate every version through this same path in test_kernels_conv / test_kernels_pool, gemm in
# test_bench_gemm_quick_end_to_end (every version on every quick case, through the command line)
@pytest.mark.parametrize("op", [op for op in bench.OPS if op not in ("conv", "pool", "gemm")])
def test_every_op_validates_on_quick_shapes(op, capsys):
    problems = bench.op_problems(op, quick=True)
    configurations = bench.validate(problems, bench.QUICK_BLOCKS)
    assert "all results match" in capsys.readouterr().out
    assert len(configurations) == len(problems) * len(bench.QUICK_BLOCKS)


def _negated_relu_forward(x, out, block=256, stream=0, launch=True):
    """Wrong on purpose: relu(-x)."""
    negated = cuda.to_device(-x.copy_to_host())
    return elementwise.OPS["relu_forward"](negated, out, block=block, stream=stream, launch=launch)


def _unwritten_relu_forward(x, out, block=256, stream=0, launch=True):
    """Wrong on purpose: never writes `out`."""
    return lambda: None


@pytest.mark.parametrize("broken, detail", [(_negated_relu_forward, "max relative error"),
                                            (_unwritten_relu_forward, "111 NaN")])
def test_a_wrong_kernel_stops_validation_naming_op_version_and_block(monkeypatch, broken, detail):
    monkeypatch.setattr(elementwise, "relu_forward", broken)
    problems = bench.op_problems("elementwise", quick=True)
    with pytest.raises(bench.BenchMismatch) as info:
        bench.validate(problems, [32, 64])
    message = str(info.value)
    assert "elementwise/relu_forward block 32 on quick 3x37" in message
    assert "output 'out'" in message and detail in message and "first: [0, " in message
    assert "\n" not in message


def test_a_new_gemm_version_is_picked_up_and_validated(monkeypatch):
    naive = gemm.DENSE_LAUNCHERS["naive"]

    def relu_forgotten(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None,
                       block=(16, 16), stream=0, launch=True):
        return naive(a, b, out, trans_a=trans_a, trans_b=trans_b, bias=bias, relu=False, block=block,
                     stream=stream, launch=launch)

    monkeypatch.setitem(gemm.DENSE_LAUNCHERS, "relu_forgotten", relu_forgotten)
    (problem,) = bench.gemm_problems(bench.QUICK_GEMM_CASES[:1])
    assert set(problem.versions) == set(gemm.DENSE_LAUNCHERS)
    problem.versions = {"relu_forgotten": relu_forgotten}  # only the new one: the others are tested above
    with pytest.raises(bench.BenchMismatch, match=r"gemm/relu_forgotten block 16x16 on quick_bias_relu 19x13x11"):
        bench.validate([problem], [])


def test_a_launch_failing_on_the_device_stops_validation_naming_the_version(monkeypatch):
    """A launch the device rejects (an illegal address loses the context) stops the bench with one line naming the
    op, version, block and case, not the driver's bare traceback."""
    from numba.cuda.cudadrv.driver import CudaAPIError

    def faulting(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, relu_mask=None, block=(16, 16),
                 stream=0, launch=True):
        def run():
            raise CudaAPIError(700, "Call to cuStreamSynchronize results in CUDA_ERROR_ILLEGAL_ADDRESS")
        return type("Faulting", (), {"block": block, "__call__": lambda self: run()})()

    (problem,) = bench.gemm_problems(bench.QUICK_GEMM_CASES[:1])
    problem.versions = {"faulting": faulting}
    with pytest.raises(GpunnError) as info:
        bench.validate([problem], [])
    message = str(info.value)
    assert message.startswith("gemm/faulting block 16x16 on quick_bias_relu") and "ILLEGAL_ADDRESS" in message
    assert "\n" not in message


def test_fixed_block_gemm_versions_skip_other_sizes():
    (problem,) = bench.gemm_problems(bench.QUICK_GEMM_CASES[1:2])  # quick_transposed: the dense launchers only
    configurations = bench.validate([problem], [32, 256])
    blocks = {(c.version, bench.block_dims(c.block)) for c in configurations}
    # naive takes the sizes (32 x threads/32); versions with a fixed block run it once, under its own name
    assert {("naive", "16x16"), ("naive", "32x1"), ("naive", "32x8"), ("tiled16", "16x16")} <= blocks
    assert len(blocks) == len(configurations) == 3 + (len(gemm.DENSE_LAUNCHERS) - 1)


def test_direct_versions_take_k_major_operands_only():
    """The direct wgmma versions run where A is (M, K) and B stored (N, K) (trans_b alone), BF16 from its bits;
    a case's `versions` restricts it; elsewhere a direct launcher refuses in one line."""
    k_major = next(c for c in bench.GEMM_CASES if c.case == "square_4096_bt")
    k_major_only = {"direct_tf32", "direct_bf16", "ws_tf32", "ws_bf16", "tma_tf32", "tma_bf16"}
    assert k_major_only <= set(bench.gemm_problems([k_major])[0].versions)
    assert set(bench.gemm_problems([k_major])[0].versions) == set(k_major.versions)
    for case in bench.GEMM_CASES:
        if case.trans_a or not case.trans_b:
            assert not k_major_only & set(bench.gemm_problems([case])[0].versions), case.case
    a, b, out = (cuda.to_device(np.ones(shape, np.float32)) for shape in ((4, 8), (8, 4), (4, 4)))
    with pytest.raises(ValueError, match="K-major operands only"):
        BG.DIRECT_LAUNCHERS["direct_tf32"](a, b, out, launch=False)
    with pytest.raises(ValueError, match="K-major operands only"):
        BG.DIRECT_LAUNCHERS["ws_bf16"](a, b, out, launch=False)
    # a K-major case lists the launchers that take its K: the MLP's dx = dy W^T (K = 10) no TMA version (its rows
    # are not a multiple of 16 bytes), the direct and ws ones in both formats (K even)
    fc2 = next(c for c in bench.GEMM_CASES if c.case == "mlp_fc2_grad_x")
    assert fc2.k == 10 and k_major_only & set(bench.gemm_problems([fc2])[0].versions) == k_major_only - {
        "tma_tf32", "tma_bf16"}
    assert [BG.direct_takes(name, k) for name, k in (("tma_tf32", 12), ("tma_bf16", 12), ("direct_bf16", 7),
                                                     ("ws_tf32", 7), ("tma_bf16", 16))] == [True, False, False,
                                                                                             True, True]


def test_gemm_tolerance_grows_with_k():
    assert bench.gemm_tolerance(11) == bench.TOLERANCE
    assert bench.gemm_tolerance(4096) == pytest.approx(5e-5)
    assert bench.gemm_tolerance(16384) == pytest.approx(1e-4)


# --------------------------------------------------------------------------------------------- timing and CSV
def test_benchmark_rows_one_per_configuration(capsys):
    problems = bench.op_problems("reduce", quick=True)
    frame = bench.bench_frame(bench.benchmark(problems, [32, 64], repeats=2))
    out = capsys.readouterr().out
    assert list(frame.columns) == bench.BENCH_COLUMNS
    assert len(frame) == len(problems) * 2
    assert set(zip(frame["version"], frame["block"])) == {(v, b) for v in ("colsum_atomic", "colsum_tree")
                                                         for b in (32, 64)}
    assert _positive_finite(frame["ms"]) and _positive_finite(frame["gbps"])
    assert frame["gflops"].isna().all() and (frame["rows"] == 3).all() and (frame["cols"] == 37).all()
    assert (frame["repeats"] == 2).all()
    assert (frame["device"] == provenance.gpu_name()).all() and (frame["simulator"] == (not ON_GPU)).all()
    assert frame["commit"].notna().all() and frame["numba_threads"].notna().all()
    # validation comes first, then one line per configuration
    lines = out.splitlines()
    assert lines[0].startswith("all results match") and len(lines) == 1 + len(frame)


def test_bench_gemm_quick_end_to_end(tmp_path):
    out = tmp_path / "gemm.csv"
    run = subprocess.run([sys.executable, "-m", "gpunn.bench", "gemm", "--quick", "--blocks", "32", "--repeats", "1",
                          "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    first_timing = next(i for i, line in enumerate(lines) if " ms " in line)
    assert any(line.startswith("all results match") for line in lines[:first_timing])
    if not ON_GPU:
        assert "timings below are host-clock times and meaningless" in run.stdout
    frame = pd.read_csv(out)
    assert list(frame.columns) == bench.BENCH_COLUMNS
    assert len(frame) == sum(1 for line in lines if " ms " in line)
    assert not frame.duplicated(["case", "version", "block_dims"]).any()
    split = {f"{v}+splitk" for v in SPLIT_K_VERSIONS}  # the register-blocked versions split on quick_split_k
    direct = {"direct_tf32", "direct_bf16"}  # K-major operands only: quick_k_major
    assert set(frame["version"]) == set(gemm.DENSE_LAUNCHERS) | split | direct
    assert set(frame["case"]) == {case.case for case in bench.QUICK_GEMM_CASES}
    for case, versions in frame.groupby("case")["version"]:  # every dense version validated and timed on each case
        if case != "quick_k_major":
            assert set(versions) & direct == set() and set(gemm.DENSE_LAUNCHERS) <= set(versions), case
    assert set(frame.loc[frame["case"] == "quick_split_k", "version"]) == set(gemm.DENSE_LAUNCHERS) | split
    assert set(frame.loc[frame["case"] == "quick_k_major", "version"]) == {"tensor_bf16"} | direct
    assert _positive_finite(frame["ms"]) and _positive_finite(frame["gflops"])
    row = frame[frame["case"] == "quick_bias_relu"].iloc[0]
    assert row["gflops"] == pytest.approx(2 * 19 * 13 * 11 / row["ms"] / 1e6)


def test_bench_rejects_bad_blocks_in_one_line(capsys):
    assert bench_main(["sgd", "--quick", "--blocks", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpunn.bench: error: --blocks") and "\n" not in err


# --------------------------------------------------------------------------------------------- sweep-blocks
def test_sweep_blocks_cli_writes_one_csv_atomically(tmp_path, capsys):
    out = tmp_path / "e3" / "blocks.csv"
    assert cli.main(["sweep-blocks", "--blocks", "32", "--shapes", "3x37,2x5", "--repeats", "1",
                     "--out", str(out)]) == 0
    assert [p.name for p in out.parent.iterdir()] == ["blocks.csv"]  # no temporary left behind
    frame = pd.read_csv(out)
    assert list(frame.columns) == bench.SWEEP_COLUMNS
    kernels = {"bias_add", "relu_forward", "relu_backward", "bias_relu", "softmax_rows", "softmax_ce_grad",
               "loss_mean", "colsum_atomic", "colsum_tree", "sgd_step"}
    assert set(frame["op"]) == kernels and len(frame) == 2 * len(kernels)
    assert set(zip(frame["rows"], frame["cols"])) == {(3, 37), (2, 5)}
    assert (frame["block"] == 32).all() and (frame["repeats"] == 1).all()
    assert _positive_finite(frame["ms"]) and _positive_finite(frame["gb_per_s"])
    loss_mean = frame[frame["op"] == "loss_mean"]
    assert list(loss_mean["n_elements"]) == [3, 2]  # the batch's losses, one per row
    # the device by name, as in every timing CSV ("cuda-simulator" under the simulator), with the provenance
    assert set(frame["device"]) == {provenance.gpu_name()} and set(frame["simulator"]) == {not ON_GPU}
    assert frame["numpy"].notna().all() and frame["commit"].notna().all()
    assert "all results match" in capsys.readouterr().out


@pytest.mark.parametrize("blocks", ["2048", "0", "48", "32,x"])
def test_sweep_blocks_rejects_bad_blocks(tmp_path, capsys, blocks):
    out = tmp_path / "blocks.csv"
    assert cli.main(["sweep-blocks", "--blocks", blocks, "--shapes", "3x37", "--repeats", "1",
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpunn: error: --blocks") and "\n" not in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("shapes", ["3x", "0x5", "3*5", ""])
def test_sweep_blocks_rejects_bad_shapes(tmp_path, capsys, shapes):
    assert cli.main(["sweep-blocks", "--blocks", "32", "--shapes", shapes, "--out", str(tmp_path / "b.csv")]) == 2
    assert capsys.readouterr().err.strip().startswith("gpunn: error: --shapes")


def test_a_mismatch_in_the_sweep_leaves_the_previous_csv(tmp_path, monkeypatch, capsys):
    out = tmp_path / "blocks.csv"
    out.write_text("previous\n")
    monkeypatch.setattr(elementwise, "relu_forward", _negated_relu_forward)
    assert cli.main(["sweep-blocks", "--blocks", "32", "--shapes", "3x37", "--repeats", "1",
                     "--out", str(out)]) == 2
    assert "relu_forward block 32" in capsys.readouterr().err
    assert out.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["blocks.csv"]


def test_block_sweep_rejects_zero_repeats():
    with pytest.raises(GpunnError, match="repeats must be at least 1"):
        bench.block_sweep([32], 3, 37, 0)


# --------------------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a real GPU, not the CUDA simulator")
def test_gpu_timings_come_from_cuda_events():
    stream = cuda.stream()
    assert not bench.numba_clock(stream).host_clock
    problems = {p.case: p for p in bench.op_problems("elementwise") if p.versions.keys() == {"relu_forward"}}
    large, small = bench.validate([problems["large_odd"]], [256]) + bench.validate([problems["mlp_hidden"]], [256])
    timing = bench.time_configuration(large, 10, stream)
    # 8191 x 4099 floats read and written: well above launch overhead, well below a second on any GPU
    assert 0.005 < timing.ms < 1000 and timing.repeats == 10
    assert timing.queued and timing.host_ms > 0
    # 64 x 256 floats: far shorter than the host's launch cost, so only the hold keeps the GPU fed
    timing = bench.time_configuration(small, 20, stream)
    assert timing.queued and 0 < timing.ms < 1000


def test_simulated_timings_are_host_times():
    stream = cuda.stream()
    (config,) = bench.validate([bench.op_problems("elementwise", quick=True)[0]], [32])
    timing = bench.time_configuration(config, 2, stream)
    if ON_GPU:
        assert timing.queued
    else:
        assert timing.queued is None and timing.ms == timing.host_ms > 0


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a real GPU, not the CUDA simulator")
def test_gpu_gemm_against_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    cases = [c for c in bench.GEMM_CASES if c.case in ("square_4096", "mlp_fc1_forward", "odd_validation")]
    frame = bench.bench_frame(bench.benchmark(bench.gemm_problems(cases), [], repeats=5))
    assert _positive_finite(frame["ms"]) and _positive_finite(frame["ref_ms"]) and _positive_finite(frame["pct_of_ref"])
    assert not torch.backends.cuda.matmul.allow_tf32
    square = frame[frame["case"] == "square_4096"]
    # each version against cuBLAS in its own input format: FP32 with TF32 off, the tensor-core versions' in theirs
    formats = square["version"].map(lambda v: gemm.VERSIONS[v].inputs)
    want = formats.map(lambda fmt: "torch.matmul" + ("" if fmt == "fp32" else f" ({fmt})"))
    assert (square["ref_name"] == want).all() and set(formats) >= {"fp32"}
    assert math.isclose(square["gflops"].iloc[0], 2 * 4096**3 / square["ms"].iloc[0] / 1e6)


def test_bench_mlp_writes_epoch_times(tmp_path):
    """The epoch benchmark end to end on a CPU variant (GPU variants at 784 inputs are too slow simulated)."""
    out = tmp_path / "mlp.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "mlp", "--variants", "cpu-numpy,cpu-serial",
                           "--samples", "50", "--batch", "16", "--hidden", "8", "--epochs", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    frame = frame[~frame["variant"].str.startswith("torch-")]  # PyTorch's rows, where a GPU has torch
    assert list(frame["variant"]) == ["cpu-numpy", "cpu-serial"] and (frame["model"] == "mlp").all()
    assert (frame["sizes"] == "in_features=784 hidden=8 classes=10").all()
    assert (frame["device"] == "cpu").all() and not frame["simulator"].any()
    assert list(frame.columns[-len(provenance.CSV_COLUMNS):]) == list(provenance.CSV_COLUMNS)
    assert (frame["epoch_s"] > 0).all() and (frame["samples_per_s"] > 0).all()
    bad = subprocess.run([sys.executable, "-m", "gpunn.bench", "mlp", "--variants", "gpu-fast", "--samples", "8",
                          "--out", str(tmp_path / "bad.csv")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown variant 'gpu-fast'" in bad.stderr
    assert not (tmp_path / "bad.csv").exists()


def test_bench_cnn_times_the_variants_that_train_it(tmp_path):
    """`bench cnn` times CNN epochs of the variants asked for; a variant that cannot train the CNN is one clear
    line and no output file."""
    out = tmp_path / "cnn.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "cnn", "--variants", "cpu-numpy", "--samples", "40",
                           "--batch", "16", "--epochs", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    frame = frame[~frame["variant"].str.startswith("torch-")]  # PyTorch's rows, where a GPU has torch
    assert list(frame["variant"]) == ["cpu-numpy"] and (frame["model"] == "cnn").all()
    assert (frame["sizes"] == "in_channels=1 image_size=28 classes=10").all() and (frame["epoch_s"] > 0).all()
    bad = subprocess.run([sys.executable, "-m", "gpunn.bench", "cnn", "--variants", "cpu-serial", "--samples", "8",
                          "--out", str(tmp_path / "bad.csv")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "variant cpu-serial supports mlp, not cnn" in bad.stderr
    assert not (tmp_path / "bad.csv").exists()


@pytest.mark.parametrize("model_name,sizes,sample", [
    ("mlp", {"in_features": 13, "hidden": 7, "classes": 3}, (13,)),
    ("cnn", {"in_channels": 2, "image_size": 9, "channels": (3, 5), "classes": 4}, (2, 9, 9)),
    ("autoencoder", {"in_channels": 3, "image_size": 8, "channels": (5, 4)}, (3, 8, 8)),
])
def test_torch_mirror_computes_the_same_function(model_name, sizes, sample):
    """The PyTorch reference of the epoch benchmark starts from gpunn's weights: same outputs on odd shapes."""
    torch = pytest.importorskip("torch")
    from gpunn.nn import build_model
    from gpunn.timing import torch_mirror

    model = build_model(model_name, **sizes, seed=3)
    x = np.random.default_rng(1).random((5, *sample), dtype=np.float32) + 0.1
    expected = model.forward(x)
    with torch.no_grad():
        got = torch_mirror(model, torch)(torch.from_numpy(x)).numpy()
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-5


def test_step_profile_times_every_launch_of_the_step():
    """bench <model> --profile: one row per launch of the step, in order, shares summing to one (tiny MLP under
    the simulator, whose host-clock times say nothing about speed)."""
    from gpunn.timing import step_profile

    frame = step_profile("mlp", ["gpu-fused", "gpu-graph"], batch=4, repeats=1, log=lambda line: None, steps=2,
                         in_features=6, hidden=5)
    for _, rows in frame.groupby("variant"):
        assert list(rows["order"]) == list(range(len(rows)))
        assert rows["share"].sum() == pytest.approx(1.0)
        assert (rows["ms"] > 0).all()
        # the step-level columns: one value per variant, the overhead their difference, 2 steps timed
        assert rows[["step_wall_ms", "step_gpu_ms", "kernel_ms", "step_kernels_ms",
                     "host_overhead_us"]].nunique().max() == 1
        first = rows.iloc[0]
        assert first["kernel_ms"] == pytest.approx(rows["ms"].sum())
        assert first["step_kernels_ms"] > 0  # the whole step timed as one
        assert first["host_overhead_us"] == pytest.approx(1e3 * (first["step_wall_ms"] - first["step_kernels_ms"]))
        assert first["step_wall_ms"] > 0 and first["wall_steps"] == 2
        phases = list(rows["phase"])
        if rows["variant"].iloc[0] == "gpu-fused":  # gather, two GEMMs, softmax-CE; three GEMMs, SGD
            assert phases.count("forward") == 4 and phases.count("backward") == 4
            assert rows["launch"].iloc[-1] == "sgd_step"
        else:  # gpu-graph's persistent step (eager): one cooperative forward, one backward applying the update
            assert list(rows["launch"]) == ["mlp_persistent_forward", "mlp_backward_sgd"]
            assert phases == ["forward", "backward"]


# --------------------------------------------------------------------------------------------- bench autoencoder
AE_TINY = ["--channels", "4,3", "--image-size", "8"]  # the simulator runs the full width at about a step a day


def test_bench_autoencoder_times_each_batch_size(tmp_path):
    """`bench autoencoder`: one row per variant and batch size; --max-steps times part of a longer epoch and marks
    the row extrapolated (CSV column and a '*' in the printed table); the GPU variant and cpu-numpy see the same
    init, data and batch order, so their epoch losses agree."""
    out = tmp_path / "autoencoder.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "autoencoder", "--variants", "gpu-naive,cpu-numpy",
                           "--samples", "4", "--batch", "2,1", "--max-steps", "2", "--epochs", "2", *AE_TINY,
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns[:18]) == ["model", "variant", "sizes", "n", "batch", "epoch_s", "extrapolated",
                                        "timed_samples", "samples_per_s", "ratio_to_torch_eager", "epoch_tflop",
                                        "tflops", "fp32_peak_pct", "fp32_peak_tflops", "epochs", "epoch_loss",
                                        "gpu_mem_mib", "gpu_mem_measure"]
    frame = frame[~frame["variant"].str.startswith("torch-")]  # PyTorch's rows, where a GPU has torch
    assert list(zip(frame["variant"], frame["batch"])) == [("gpu-naive", 2), ("cpu-numpy", 2), ("gpu-naive", 1),
                                                          ("cpu-numpy", 1)]
    assert (frame["model"] == "autoencoder").all() and (frame["n"] == 4).all() and (frame["epochs"] == 2).all()
    assert (frame["sizes"] == "in_channels=3 image_size=8 channels=4x3").all()
    # batch 2: 2 steps, the whole epoch; batch 1: 4 steps, the first 2 timed and scaled
    assert list(frame["extrapolated"]) == [False, False, True, True]
    assert list(frame["timed_samples"]) == [4, 4, 2, 2]
    assert _positive_finite(frame["epoch_s"]) and np.allclose(frame["samples_per_s"], 4 / frame["epoch_s"])
    for _, rows in frame.groupby("batch"):
        assert rows["epoch_loss"].iloc[0] == pytest.approx(rows["epoch_loss"].iloc[1], rel=1e-5)
    assert frame["gpu_mem_mib"].isna().all()  # CPU rows, and the simulator has no device memory
    assert list(frame["device"]) == [provenance.gpu_name(), "cpu"] * 2
    assert "* extrapolated: at batch 1, 2 of 4 samples timed per epoch" in done.stdout
    table = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["gpu-naive"], ["cpu-numpy"])]
    assert [row[2].endswith("*") for row in table] == [False, False, True, True]


def test_time_epochs_scales_partial_epochs_and_ratios_per_batch(monkeypatch):
    """The arithmetic of the epoch table on fixed epoch times: median after the first epoch, scaled by steps when
    --max-steps cut the epoch, ratios to PyTorch eager of the same batch size."""
    from types import SimpleNamespace

    from gpunn import timing

    seen = []

    def fake_gpunn(variant, model_name, sizes, x, y, batch, lr, epochs, seed=0):
        seen.append((variant, batch, len(x), lr))
        return timing.EpochTiming([99.0, 2.0, 4.0], 0.5, float("nan"), "")

    def fake_torch(model, x, y, batch, lr, epochs, seed=0, graph=False, setting="fp32"):
        seconds = {"fp32": 6.0, "default": 5.0, "tf32": 4.0, "bf16": 1.5}[setting] / (6.0 if graph else 1.0)
        return timing.EpochTiming([99.0, seconds, seconds], float("nan"), 12.0, "torch_max_allocated")

    monkeypatch.setattr(timing, "gpunn_epoch_seconds", fake_gpunn)
    monkeypatch.setattr(timing, "torch_epoch_seconds", fake_torch)
    monkeypatch.setattr(timing, "_torch_on_gpu", lambda wanted, log: SimpleNamespace(
        cuda=SimpleNamespace(empty_cache=lambda: None)))
    lines = []
    frame = timing.time_epochs("autoencoder", ["gpu-im2col"], n=10, batch=[5, 1], epochs=3, max_steps=4,
                               log=lines.append, channels=(4, 3), image_size=8)
    assert seen == [("gpu-im2col", 5, 10, 0.002), ("gpu-im2col", 1, 4, 0.002)]  # E5's learning rate by default
    by = {(row.variant, row.batch): row for row in frame.itertuples()}
    assert by["gpu-im2col", 5].epoch_s == 3.0 and not by["gpu-im2col", 5].extrapolated
    assert by["gpu-im2col", 1].epoch_s == 3.0 * 10 / 4 and by["gpu-im2col", 1].timed_samples == 4
    assert by["torch-eager", 1].epoch_s == 6.0 * 10 / 4 and by["torch-eager", 1].extrapolated
    assert by["gpu-im2col", 5].ratio_to_torch_eager == pytest.approx(0.5)
    assert by["gpu-im2col", 1].ratio_to_torch_eager == pytest.approx(0.5)
    assert by["torch-cuda-graph", 5].ratio_to_torch_eager == pytest.approx(1 / 6)
    # PyTorch in all four settings, eager and graph; the fastest (bf16 as a graph, 0.25 s) named and divided by
    assert {row.variant for row in frame.itertuples() if row.batch == 5} == {
        "gpu-im2col", "torch-eager", "torch-cuda-graph", "torch-eager-default", "torch-cuda-graph-default",
        "torch-eager-tf32", "torch-cuda-graph-tf32", "torch-eager-bf16", "torch-cuda-graph-bf16"}
    assert (frame["torch_fastest"] == "torch-cuda-graph-bf16").all()
    assert by["gpu-im2col", 5].ratio_to_torch_fastest == pytest.approx(3.0 / 0.25)
    assert by["torch-cuda-graph-bf16", 1].ratio_to_torch_fastest == 1.0
    assert any("x fastest: over torch-cuda-graph-bf16, PyTorch's fastest row at batch 5" in line for line in lines)
    # each row's number format, whose peak its "% peak" is of (the autoencoder has convolutions: default is TF32)
    assert by["gpu-im2col", 5].peak_format == "fp32" and by["torch-eager", 5].peak_format == "fp32"
    assert by["torch-cuda-graph-default", 5].peak_format == "tf32" and by["torch-eager-bf16", 1].peak_format == "bf16"
    assert timing.row_format("torch-eager-default", convolutional=False) == "fp32"  # the MLP: matmuls stay FP32
    assert [timing.row_format(v, True) for v in ("gpu-graph", "gpu-tf32", "gpu-bf16")] == ["fp32", "tf32", "bf16"]
    assert by["torch-eager", 1].samples_per_s == pytest.approx(10 / 15)
    assert by["torch-eager", 1].gpu_mem_mib == 12.0
    assert any("torch_max_allocated: torch.cuda.max_memory_allocated" in line for line in lines)
    # the arithmetic: the model's training FLOPs x n per epoch, over each row's epoch time
    tflop = flops.training_flops(build_model("autoencoder", channels=(4, 3), image_size=8)) * 10 / 1e12
    assert (frame["epoch_tflop"] == tflop).all()
    assert by["gpu-im2col", 5].tflops == pytest.approx(tflop / 3.0)
    assert frame["fp32_peak_pct"].isna().all() == (not ON_GPU)  # no FP32 peak under the simulator
    assert any("\nTFLOP/s: " in line and "gpunn.flops" in line for line in lines)  # under the printed table


def test_bench_autoencoder_default_variants_are_the_gpu_ones():
    from gpunn.backends.registry import variants_for
    from gpunn.bench.__main__ import build_parser, epoch_variants

    variants = epoch_variants(build_parser().parse_args(["autoencoder"]))
    assert variants == variants_for("autoencoder", simulator=not ON_GPU, gpu=True)
    assert "cpu-numpy" not in variants and {"gpu-naive", "gpu-tiled", "gpu-im2col"} <= set(variants)
    assert ("gpu-graph" in variants) == ON_GPU
    assert "cpu-numpy" in epoch_variants(build_parser().parse_args(["cnn"]))  # minutes per epoch there: kept


@pytest.mark.parametrize("argv, message", [
    (["--channels", "4"], "channels must have two entries"),
    (["--image-size", "10"], "image_size must be a positive multiple of 4"),
    (["--hidden", "8"], "--hidden sets the MLP's width"),
])
def test_bench_autoencoder_rejects_bad_sizes_in_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "ae.csv"
    assert bench_main(["autoencoder", "--variants", "cpu-numpy", "--samples", "4", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpunn.bench: error:") and message in err and "\n" not in err
    assert not out.exists()


@pytest.mark.skipif(ON_GPU, reason="the simulator's refusal")
def test_bench_autoencoder_refuses_gpu_graph_under_the_simulator(tmp_path, capsys):
    out = tmp_path / "ae.csv"
    assert bench_main(["autoencoder", "--variants", "gpu-graph", "--samples", "4", *AE_TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "gpu-graph captures CUDA graphs, which numba's CUDA simulator lacks" in err and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("model_name,sizes,sample", [
    ("mlp", {"in_features": 13, "hidden": 7, "classes": 3}, (13,)),
    ("cnn", {"in_channels": 2, "image_size": 9, "channels": (3, 5), "classes": 4}, (2, 9, 9)),
    ("autoencoder", {}, (3, 32, 32)),  # the full-width network the benchmark times
])
def test_torch_trainer_takes_cpu_numpys_step(model_name, sizes, sample):
    """The PyTorch reference starts from gpunn's weights and takes the same SGD step: same loss (the autoencoder's
    MSE a mean over every element, cross-entropy a mean over the batch) and the same parameter update."""
    torch = pytest.importorskip("torch")
    from gpunn.backends.registry import make_backend
    from gpunn.nn import build_model
    from gpunn.timing import torch_flat_parameters, torch_trainer

    lr = 0.01
    model = build_model(model_name, **sizes, seed=3)
    start = model.flat.copy()
    net, step = torch_trainer(model, torch, lr)
    assert np.array_equal(torch_flat_parameters(net, torch), start)
    rng = np.random.default_rng(1)
    x = rng.random((4, *sample), dtype=np.float32)
    target = x if model_name == "autoencoder" else rng.integers(0, sizes["classes"], 4)
    torch_target = torch.from_numpy(x) if model_name == "autoencoder" else torch.from_numpy(target.astype(np.int64))
    torch_loss = float(step(torch.from_numpy(x), torch_target).detach())
    backend = make_backend("cpu-numpy", model, model_name, lr)
    ours = backend.train_step(x, target).loss
    assert torch_loss == pytest.approx(ours, rel=1e-5)
    ours_update = (start - backend.parameters()) / lr
    torch_update = (start - torch_flat_parameters(net, torch)) / lr
    assert np.abs(torch_update - ours_update).max() <= 1e-4 * np.abs(ours_update).max()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a real GPU, not the CUDA simulator")
def test_gpu_bench_autoencoder_rows_and_memory(tmp_path):
    """On a GPU: every GPU variant (gpu-graph included) and, where torch has CUDA, both PyTorch rows at both batch
    sizes of the full-width network, with a device-memory figure each (timings are not checked)."""
    out = tmp_path / "autoencoder.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "autoencoder", "--samples", "256", "--max-steps",
                           "16", "--epochs", "2", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    gpu = frame[frame["variant"].str.startswith("gpu-")]
    trains = {name for name, entry in VARIANTS.items() if entry.gpu and "autoencoder" in entry.models}
    assert set(gpu["variant"]) == trains >= {"gpu-naive", "gpu-tiled", "gpu-im2col", "gpu-graph", "gpu-bf16"}
    assert set(frame["batch"]) == {64, 1} and list(frame["extrapolated"]) == list(frame["batch"] == 1)
    assert (gpu["gpu_mem_measure"] == "own_buffers_peak").all() and (gpu["gpu_mem_mib"] > 0).all()
    torch_rows = frame[frame["variant"].str.startswith("torch-")]
    if len(torch_rows):  # 2 batch sizes x 4 settings x eager and graph
        assert len(torch_rows) == 16 and (torch_rows["gpu_mem_mib"] > 0).all()
        assert (frame.loc[frame["variant"] == "torch-eager", "ratio_to_torch_eager"] == 1).all()
    # every GPU variant's loss after the same epochs from the same start agrees with the others': the FP32 ones
    # within 1e-3, the tensor-core ones (inputs rounded to TF32 / BF16) within 8 units of their format of gpu-graph's
    for _, rows in gpu.groupby("batch"):
        precision = rows["variant"].map(lambda v: POLICIES[v].precision)
        fp32 = rows[precision == "fp32"]
        assert fp32["epoch_loss"].max() == pytest.approx(fp32["epoch_loss"].min(), rel=1e-3)
        reference = rows.loc[rows["variant"] == "gpu-graph", "epoch_loss"].iloc[0]
        for fmt, loss in zip(precision[precision != "fp32"], rows.loc[precision != "fp32", "epoch_loss"]):
            assert loss == pytest.approx(reference, rel=8 * {"tf32": 2.0**-11, "bf16": 2.0**-8}[fmt])


def test_bench_torch_settings_option(capsys):
    from gpunn.bench.__main__ import build_parser

    parser = build_parser()
    assert parser.parse_args(["cnn"]).torch_settings == ("fp32", "default", "tf32", "bf16")
    assert parser.parse_args(["cnn", "--torch-settings", "bf16, fp32"]).torch_settings == ("bf16", "fp32")
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["cnn", "--torch-settings", "fp32,fp16"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown setting(s) fp16; choose from fp32, default, tf32, bf16" in err[0]


def test_bench_mma_refuses_the_simulator_in_one_line(tmp_path):
    """`bench mma` times the tensor cores: under the simulator it stops with one line and exit 2, writing nothing."""
    if ON_GPU:
        pytest.skip("a GPU is here: the GPU test runs it")
    out = tmp_path / "never.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "mma", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == ("gpunn.bench: error: bench mma times the tensor cores: it needs a real GPU, not "
                                   "numba's CUDA simulator")
    assert not out.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a real GPU, not the CUDA simulator")
def test_gpu_bench_mma_rows(tmp_path):
    """On a GPU: our intrinsics' TF32 and BF16 rows (no local memory in their PTX), and cuBLAS's where torch is."""
    out = tmp_path / "mma.csv"
    done = subprocess.run([sys.executable, "-m", "gpunn.bench", "mma", "--repeats", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    ours = frame[frame["route"].str.startswith("numba")]
    assert list(ours["format"]) == ["tf32", "bf16"] and (ours["tflops"] > 0).all()
    assert not ours["local_memory"].astype(bool).any()
