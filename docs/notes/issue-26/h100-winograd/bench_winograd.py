"""Winograd F(2x2, 3x3) (conv.winograd) against the implicit GEMM and cuDNN at the autoencoder's 3x3 layers, batch 64,
in one process: every pass summed over its launches (transforms included) and each launch alone, medians of CUDA-event
timed launches after warm-up (gpunn.bench.core.median_launch_ms), the relative error against float64 (torch on the
GPU). Usage: PYTHONPATH=src python bench_winograd.py OUT.csv"""
import sys

import numpy as np
import torch
from numba import cuda

from gpunn.bench.core import median_launch_ms, numba_clock, torch_clock
from gpunn.kernels.conv import implicit_gemm as IG
from gpunn.kernels.conv import upsampled as IGU
from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.launch import LaunchGroup

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
REPEATS = 30
BATCH = 64
rows = []


def record(op, case, version, piece, ms, flops, err):
    rows.append((op, case, version, piece, ms, flops / ms / 1e9, err))
    print(f"{op:6s} {case:14s} {version:14s} {piece:40s} {ms:8.4f} ms {flops / ms / 1e9:7.2f} TFLOP/s(direct) "
          f"err {err:.2e}", flush=True)


def rel_err(got, ref):
    ref = ref.cpu().numpy()
    return float(np.abs(got.copy_to_host().astype(np.float64) - ref).max() / np.abs(ref).max())


def ms_of(launch):
    return median_launch_ms(launch, REPEATS, numba_clock(0)).ms


def main():
    F = torch.nn.functional
    for cin, cout, hw, up in ((256, 128, 16, False), (128, 256, 16, False), (128, 128, 8, False),
                              (128, 256, 16, True)):
        g = torch.Generator(device="cuda").manual_seed(1)
        xs = hw // 2 if up else hw  # the map the conv's launchers take (before the upsample)
        x = torch.randn((BATCH, cin, xs, xs), device="cuda", generator=g)
        w = torch.randn((cout, cin, 3, 3), device="cuda", generator=g) / 30
        b = torch.randn((cout,), device="cuda", generator=g)
        dy = torch.randn((BATCH, cout, hw, hw), device="cuda", generator=g)
        mask = torch.relu(torch.randn((BATCH, cin, xs, xs), device="cuda", generator=g))
        x64, w64, dy64 = x.double(), w.double(), dy.double()
        u64 = F.interpolate(x64, scale_factor=2, mode="nearest") if up else x64
        dgrad = torch.nn.grad.conv2d_input(u64.shape, w64, dy64, padding=1)
        if up:
            dgrad = F.avg_pool2d(dgrad, 2) * 4
        refs = {"fwd": torch.relu(F.conv2d(u64, w64, b.double(), padding=1)),
                "dgrad": dgrad * (mask > 0),
                "wgrad": torch.nn.grad.conv2d_weight(u64, w.shape, dy64, padding=1)}
        flops = 2 * BATCH * hw * hw * cout * cin * 9
        dx_, dw_, db_, dy_, dm_ = (cuda.as_cuda_array(t) for t in (x, w, b, dy, mask))
        tag = f"{cin}->{cout}@{'up' if up else ''}{hw}"
        mods = (("implicit_gemm", IGU, "implicit_gemm_up"), ("winograd", WG, "winograd_up")) if up else (
            ("implicit_gemm", IG, "implicit_gemm"), ("winograd", WG, "winograd"))
        for name, mod, sfx in mods:
            for op in ("fwd", "dgrad", "wgrad"):
                out = cuda.to_device(np.full(tuple(refs[op].shape), np.nan, np.float32))
                if op == "fwd":
                    launch = getattr(mod, f"conv_forward_{sfx}")(dx_, dw_, db_, out, 1, relu=True, launch=False)
                elif op == "dgrad":
                    launch = getattr(mod, f"conv_backward_data_{sfx}")(dy_, dw_, out, 1, relu_mask=dm_,
                                                                       launch=False)
                else:
                    launch = getattr(mod, f"conv_backward_weight_{sfx}")(dx_, dy_, out, 1, launch=False)
                launch()
                cuda.synchronize()
                err = rel_err(out, refs[op])
                record(op, tag, name, "total", ms_of(launch), flops, err)
                if isinstance(launch, LaunchGroup):
                    for piece in launch.launches:
                        record(op, tag, name, piece.name.split("[", 1)[-1][:40], ms_of(piece), flops, err)
        if up:
            continue  # cuDNN: the plain 128->256 case stands for it
        runs = {"fwd": lambda: torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1)),
                "dgrad": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, padding=1),
                "wgrad": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=1)}
        for op, run in runs.items():
            ms = median_launch_ms(run, REPEATS, torch_clock(torch)).ms
            ref = refs[op] if op != "dgrad" else torch.nn.grad.conv2d_input(x.shape, w64, dy64, padding=1)
            record(op, tag, "cuDNN", "total", ms, flops, float((run().double() - ref).abs().max() / ref.abs().max()))


def extras():
    """The weight gradient's split counts, and its group reading the forward's kept V (no input transform)."""
    for cin, cout, hw, counts in ((256, 128, 16, (4, 8, 9, 16)), (128, 128, 8, (4, 8, 16)),
                                  (128, 256, 16, (4, 8, 9, 16))):
        g = torch.Generator(device="cuda").manual_seed(2)
        x = torch.randn((BATCH, cin, hw, hw), device="cuda", generator=g)
        dy = torch.randn((BATCH, cout, hw, hw), device="cuda", generator=g)
        ref = torch.nn.grad.conv2d_weight(x.double(), (cout, cin, 3, 3), dy.double(), padding=1)
        flops = 2 * BATCH * hw * hw * cout * cin * 9
        tag = f"{cin}->{cout}@{hw}"
        dx_, dy_ = cuda.as_cuda_array(x), cuda.as_cuda_array(dy)
        for splits in (None, *counts):
            out = cuda.to_device(np.full((cout, cin, 3, 3), np.nan, np.float32))
            launch = WG.conv_backward_weight_winograd(dx_, dy_, out, 1, splits=splits, launch=False)
            launch()
            cuda.synchronize()
            record("wgrad", tag, "winograd", f"splits {splits}: {launch.launches[-1].name.split('[')[-1]}",
                   ms_of(launch), flops, rel_err(out, ref))
        v = cuda.device_array(WG.input_transform_size(tuple(x.shape), 1), np.float32)
        w = cuda.as_cuda_array(torch.randn((cout, cin, 3, 3), device="cuda", generator=g))
        WG.conv_forward_winograd(dx_, w, None, cuda.device_array((BATCH, cout, hw, hw), np.float32), 1, v=v)
        out = cuda.to_device(np.full((cout, cin, 3, 3), np.nan, np.float32))
        launch = WG.conv_backward_weight_winograd(dx_, dy_, out, 1, v=v, launch=False)
        launch()
        cuda.synchronize()
        record("wgrad", tag, "winograd", "shared V (no input transform)", ms_of(launch), flops, rel_err(out, ref))


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    try:
        main()
        extras()
    finally:
        with open(sys.argv[1], "w") as f:
            f.write("op,case,version,piece,ms,tflops_direct,rel_err\n")
            for r in rows:
                f.write(",".join(str(v) for v in r) + "\n")
