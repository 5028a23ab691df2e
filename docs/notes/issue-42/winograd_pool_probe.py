"""Issue 42 probe (device): the autoencoder's conv2 (64 x 256 -> 128 on 16x16, padding 1, ReLU, MaxPool2d(2)) with
the pool inside the Winograd transforms (conv.winograd_pool) against today's path, each launch timed alone with
CUDA events (bench.core.median_launch_ms, median of 50), in FP32 (the batched GEMM's default, coalesced128) and
tensor_bf16 with BF16 transform storage:
  forward: conv_forward_winograd (bias + ReLU, the full map) + maxpool2x2_forward_v1, against
  conv_forward_pool_winograd (pooled map + route);
  backward: maxpool2x2_backward_gather (ReLU mask: the conv output) + conv_backward_data_winograd +
  conv_backward_weight_bias_winograd, against conv_backward_data_pool_winograd +
  conv_backward_weight_bias_pool_winograd.
Checks: the two paths against each other (pooled, routes where live, dx, dw, db), and in `small` mode against
float64 too.

    python docs/notes/issue-42/winograd_pool_probe.py OUT [small]"""
import sys

import numpy as np
from numba import cuda

from gpunn.bench.core import median_launch_ms, numba_clock
from gpunn.kernels import pool as PL
from gpunn.kernels.conv import pooled as P
from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.conv import winograd_pool as WP
from gpunn.kernels.conv import winograd_wgrad as WW
from gpunn.kernels.gemm.mappings import ROUTE_NONE

out_dir = sys.argv[1]
SMALL = sys.argv[2:] == ["small"]  # a smoke run under the simulator: 2 images, channels / 8
N, REPS, C = (2, 2, 8) if SMALL else (64, 50, 1)
CIN, COUT, H, PAD = 256 // C, 128 // C, 16, 1
rng = np.random.default_rng(0)
timings = []


def timed(name, launch):
    ms = median_launch_ms(launch, REPS, numba_clock(0)).ms
    timings.append((name, ms))
    print(f"{name:78s} {ms:8.4f} ms", flush=True)
    return ms


def rand(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def nan(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def rel(got, ref):
    return f"rel err {np.abs(got - ref).max() / np.abs(ref).max():.2e} finite {np.isfinite(got).all()}"


PH = H // 2
x_h, w_h, b_h = rand(N, CIN, H, H), rand(COUT, CIN, 3, 3, scale=0.05), rand(COUT, scale=0.1)
dpool_h, xmask_h = rand(N, COUT, PH, PH), np.maximum(rand(N, CIN, H, H), 0)
x, w, b, dpool, xmask = (cuda.to_device(a) for a in (x_h, w_h, b_h, dpool_h, xmask_h))
for label, kw in (("fp32", {}), ("bf16", {"version": "tensor_bf16", "storage": "bf16"})):
    wkw = {**kw, "splits": 1} if SMALL else kw
    # today: the full map, the separate pool, its gather, the two Winograd backward passes
    y, pooled0, arg0 = nan(N, COUT, H, H), nan(N, COUT, PH, PH), cuda.device_array((N, COUT, PH, PH), np.int8)
    dy, dx0, dw0, db0 = nan(N, COUT, H, H), nan(N, CIN, H, H), nan(COUT, CIN, 3, 3), nan(COUT)
    f0 = WG.conv_forward_winograd(x, w, b, y, PAD, relu=True, launch=False, **kw)
    p0 = PL.maxpool2x2_forward_v1(y, pooled0, arg0, launch=False)
    g0 = PL.maxpool2x2_backward_gather(dpool, arg0, dy, relu_mask=y, launch=False)
    d0 = WG.conv_backward_data_winograd(dy, w, dx0, PAD, relu_mask=xmask, launch=False, **kw)
    k0 = WW.conv_backward_weight_bias_winograd(x, dy, dw0, db0, PAD, launch=False, **wkw)
    # fused
    pooled1, route1 = nan(N, COUT, PH, PH), cuda.device_array((N, COUT, PH, PH), np.int8)
    dx1, dw1, db1 = nan(N, CIN, H, H), nan(COUT, CIN, 3, 3), nan(COUT)
    f1 = WP.conv_forward_pool_winograd(x, w, b, pooled1, route1, PAD, launch=False, **kw)
    d1 = WP.conv_backward_data_pool_winograd(dpool, route1, w, dx1, PAD, relu_mask=xmask, launch=False, **kw)
    k1 = WP.conv_backward_weight_bias_pool_winograd(x, dpool, route1, dw1, db1, PAD, launch=False, **wkw)
    fwd0 = timed(f"conv2 {label} today: winograd forward", f0) + timed(f"conv2 {label} today: maxpool2x2_forward_v1",
                                                                      p0)
    fwd1 = timed(f"conv2 {label} fused: conv_forward_pool_winograd", f1)
    bwd0 = (timed(f"conv2 {label} today: maxpool2x2_backward_gather", g0)
            + timed(f"conv2 {label} today: winograd input gradient", d0)
            + timed(f"conv2 {label} today: winograd weight + bias gradient", k0))
    bwd1 = (timed(f"conv2 {label} fused: conv_backward_data_pool_winograd", d1)
            + timed(f"conv2 {label} fused: conv_backward_weight_bias_pool_winograd", k1))
    timings += [(f"conv2 {label} today forward sum", fwd0), (f"conv2 {label} fused forward", fwd1),
                (f"conv2 {label} today backward sum", bwd0), (f"conv2 {label} fused backward sum", bwd1)]
    print(f"   {label}: forward {fwd0:.4f} -> {fwd1:.4f} ms, backward {bwd0:.4f} -> {bwd1:.4f} ms")
    # checks: the last timed runs left every output written (the fused backward read route1 of the fused forward)
    got_p, want_p = pooled1.copy_to_host(), pooled0.copy_to_host()
    r1, a0 = route1.copy_to_host(), arg0.copy_to_host()
    live = r1 != ROUTE_NONE
    print(f"   pooled vs today's: {rel(got_p, want_p)}; live routes equal to the argmax: "
          f"{np.mean(r1[live] == a0[live]):.6f}; ROUTE_NONE exactly where pooled is 0: "
          f"{np.array_equal(~live, want_p == 0)}")
    if np.array_equal(np.where(live, r1, 0), np.where(live, a0, 0)):  # the same routing: the backward comparable
        print(f"   dx {rel(dx1.copy_to_host(), dx0.copy_to_host())}, dw {rel(dw1.copy_to_host(), dw0.copy_to_host())},"
              f" db {rel(db1.copy_to_host(), db0.copy_to_host())} (fused vs today)")
    else:
        print("   routes differ (near ties): backward not compared with today's")
    if SMALL:
        ref_p, ref_r = P.conv_relu_pool_forward_ref(x_h, w_h, b_h, PAD)
        dy_ref = P.pooled_grad_ref(dpool_h, r1, (N, COUT, H, H))
        print(f"   float64: pooled {rel(got_p, ref_p)}, routes equal {np.array_equal(r1, ref_r)}, dx "
              f"{rel(dx1.copy_to_host(), R.conv_backward_data_ref(dy_ref, w_h, x_h.shape, PAD, xmask_h))}, dw "
              f"{rel(dw1.copy_to_host(), R.conv_backward_weight_ref(x_h, dy_ref, 3, PAD))}, db "
              f"{rel(db1.copy_to_host(), R.conv_bias_grad_ref(dy_ref))}")

with open(f"{out_dir}/winograd_pool_probe.csv", "w") as f:
    f.write("launch,ms\n" + "".join(f"\"{n}\",{ms:.5f}\n" for n, ms in timings))
