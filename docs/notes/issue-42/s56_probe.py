"""Issue 42 probe (device), stop 55's options for the next rule changes, each candidate timed alone with CUDA
events (bench.core.median_launch_ms, median of 50) and checked against float64 or the candidate it replaces:
  the Winograd weight gradient that makes the bias gradient (winograd_wgrad, policy.AUTO_WINOGRAD_BIAS) against
  the plain one and the split bias launches, at the autoencoder's three Winograd convs, float32 (gpu-graph) and
  tensor_bf16 with BF16 buffers (gpu-bf16);
  conv5's input gradient (256 <- 3 on up(16x16): the summed stride-2 kernel, K = 48) on the tensor cores against
  today's coalesced128;
  the fused conv + ReLU + pool stage's direct forward (COT) and weight + bias pass (per, co_t) at the
  autoencoder's conv1 (3 -> 256) and the CNN's conv2 (16 -> 32, 26x26, no padding).

    python docs/notes/issue-42/s56_probe.py OUT [small]"""
import sys

import numpy as np
from numba import cuda
from probe_kit import Probe, nan, rel

from gpunn.kernels.conv import bias_grad as BG
from gpunn.kernels.conv import direct_pooled as D
from gpunn.kernels.conv import upsampled as U
from gpunn.kernels.conv import wgrad_direct as WD
from gpunn.kernels.conv import winograd_wgrad as WW

out_dir = sys.argv[1]
SMALL = sys.argv[2:] == ["small"]  # a smoke run under the simulator: 2 images, narrow channels
N, REPS = (2, 2) if SMALL else (64, 50)
probe = Probe(REPS)
timed, rand = probe.timed, probe.rand


# ---- the Winograd weight gradient with the bias gradient: conv2 256 -> 128 on 16x16, conv3 128 -> 128 on 8x8,
# conv4 128 -> 256 on up(8x8)
C = 8 if SMALL else 1
for name, (cin, cout, h), up in (("conv2", (256 // C, 128 // C, 16), False), ("conv3", (128 // C, 128 // C, 8), False),
                                 ("conv4", (128 // C, 256 // C, 8), True)):
    oh = 2 * h if up else h
    x, dy = cuda.to_device(rand(N, cin, h, h)), cuda.to_device(rand(N, cout, oh, oh))
    plain = WW.conv_backward_weight_winograd_up if up else WW.conv_backward_weight_winograd
    both = WW.conv_backward_weight_bias_winograd_up if up else WW.conv_backward_weight_bias_winograd
    for label, kw in (("fp32", {}), ("bf16", {"version": "tensor_bf16", "storage": "bf16"})):
        if SMALL and label == "bf16":
            kw = {**kw, "splits": 1}
        dw0, db0, dw1, db1 = nan(cout, cin, 3, 3), nan(cout), nan(cout, cin, 3, 3), nan(cout)
        g0 = plain(x, dy, dw0, 1, launch=False, **kw)
        b0 = BG.conv_bias_grad_split(dy, db0, launch=False)
        g1 = both(x, dy, dw1, db1, 1, launch=False, **kw)
        timed(f"{name} {label} weight gradient (plain)", g0)
        timed(f"{name} {label} bias gradient (split)", b0)
        timed(f"{name} {label} weight + bias gradient (winograd_wgrad with bias)", g1)
        same = np.array_equal(dw0.copy_to_host(), dw1.copy_to_host())
        print(f"   dw bit for bit: {same}; db vs split: {rel(db1.copy_to_host(), db0.copy_to_host())}")

# ---- conv5's input gradient: dy (N, 3, 32, 32), w (3, 256, 3, 3), dx (N, 256, 16, 16) with the ReLU mask
W5 = 16 if SMALL else 256
dy5, w5 = rand(N, 3, 32, 32), rand(3, W5, 3, 3, scale=0.05)
mask5 = rand(N, W5, 16, 16)
ref5 = U.conv_backward_data_up_ref(dy5, w5, (N, W5, 16, 16), 1, mask5)
d_dy5, d_w5, d_mask5 = cuda.to_device(dy5), cuda.to_device(w5), cuda.to_device(mask5)
for version in (None, "coalesced128", "tensor_tf32", "tensor_bf16"):
    dx5 = nan(N, W5, 16, 16)
    g = U.conv_backward_data_implicit_gemm_up(d_dy5, d_w5, dx5, 1, relu_mask=d_mask5, version=version, launch=False)
    timed(f"conv5 input gradient implicit_gemm_up version {version}", g)
    print("  ", rel(dx5.copy_to_host(), ref5))

# ---- the fused conv + ReLU + pool stage: the autoencoder's conv1 and the CNN's conv2
for name, (cin, cout, h, p) in (("ae conv1", (3, 256 // C, 32, 1)), ("cnn conv2", (16, 32, 26, 0))):
    oh = h + 2 * p - 2
    x, w, b = cuda.to_device(rand(N, cin, h, h)), cuda.to_device(rand(cout, cin, 3, 3, scale=0.2)), \
        cuda.to_device(rand(cout))
    pooled = cuda.device_array((N, cout, oh // 2, oh // 2), np.float32)
    route = cuda.device_array((N, cout, oh // 2, oh // 2), np.int8)
    D.conv_forward_pool_direct(x, w, b, pooled, route, p)
    want = pooled.copy_to_host()
    for tuning in ({}, {"cot": 16}, {"cot": 32}, {"cot": 4}):
        try:
            f = D.conv_forward_pool_direct(x, w, b, pooled, route, p, launch=False, **tuning)
        except ValueError as e:
            print(f"{name} forward {tuning} refused: {e}")
            continue
        timed(f"{name} forward {f.name} {tuning}", f)
        print(f"   same as the default's: {np.array_equal(pooled.copy_to_host(), want)}")
    dpool = cuda.to_device(rand(N, cout, oh // 2, oh // 2))
    dw, db = nan(cout, cin, 3, 3), nan(cout)
    WD.conv_backward_weight_bias_pool_direct(x, dpool, route, dw, db, p)
    want_w, want_b = dw.copy_to_host(), db.copy_to_host()
    for per, co_t in ((None, None), (4, None), (None, 2), (4, 2), (8, 2), (4, 1), (2, 2)):
        g = WD.conv_backward_weight_bias_pool_direct(x, dpool, route, dw, db, p, per=per, co_t=co_t, launch=False)
        timed(f"{name} weight + bias direct {g.launches[0].name} + sum", g)
        print(f"   vs the default's: dw {rel(dw.copy_to_host(), want_w)}, db {rel(db.copy_to_host(), want_b)}")

probe.write_csv(f"{out_dir}/s56_probe.csv")
