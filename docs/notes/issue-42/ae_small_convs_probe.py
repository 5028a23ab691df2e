"""Issue 42 probe (device): the autoencoder's float32 first and last convolutions at batch 64, each candidate timed
alone with CUDA events (bench.core.median_launch_ms, median of 50) and checked against the float64 reference where
it is new (stop 54's figures were one event pair around each call: they include the host's gaps between a group's
launches, a few us each):
  conv5 forward, 256 -> 3 on up(16x16): the implicit GEMM on the upsampled map (today) against ``phase``;
  conv1 forward (3 -> 256 + ReLU + pool, direct_pooled) at several tunings;
  conv1 weight + bias gradient, 3 -> 256 + ReLU + pool on 32x32: the pooled GEMM and the bias launch (today)
  against the GEMM with a ones column (``conv_backward_weight_bias_pool``) at several versions and split counts,
  and the direct pass (``wgrad_direct``, in output-channel groups) at several band, split and co_t layouts.

    python docs/notes/issue-42/ae_small_convs_probe.py OUT"""
import sys

import numpy as np
from numba import cuda
from probe_kit import Probe

from gpunn.kernels.conv import direct_pooled as D
from gpunn.kernels.conv import phase_up as P
from gpunn.kernels.conv import pooled as PL
from gpunn.kernels.conv import upsampled as U
from gpunn.kernels.conv import wgrad_bias as WB

out_dir = sys.argv[1]
SMALL = sys.argv[2:] == ["small"]  # a smoke run of the script under the simulator: 2 images, 8 channels
N, WIDE, REPS = (2, 8, 2) if SMALL else (64, 256, 50)
probe = Probe(REPS, width=70)
timed, rng = probe.timed, probe.rng


def dev(*shape):
    return cuda.to_device(probe.rand(*shape))


# conv5 forward
x5 = rng.standard_normal((N, WIDE, 16, 16)).astype(np.float32)
w5 = (rng.standard_normal((3, WIDE, 3, 3)) * 0.05).astype(np.float32)
b5 = rng.standard_normal(3).astype(np.float32)
ref = U.conv_forward_up_ref(x5, w5, b5, 1)
dx5, dw5, db5 = cuda.to_device(x5), cuda.to_device(w5), cuda.to_device(b5)
for name, make in (("implicit_gemm_up (auto)", lambda o: U.conv_forward_implicit_gemm_up(dx5, dw5, db5, o, 1,
                                                                                         launch=False)),
                   ("phase", lambda o: P.conv_forward_phase_up(dx5, dw5, db5, o, 1, launch=False))):
    out = cuda.to_device(np.full((N, 3, 32, 32), np.nan, np.float32))
    launch = make(out)
    timed(f"conv5 forward {name}", launch)
    got = out.copy_to_host()
    print(f"   rel err {np.abs(got - ref).max() / np.abs(ref).max():.2e}  finite {np.isfinite(got).all()}")
k5 = P._forward_kernel(3, 16, P._fwd_chunk(WIDE, 3, 16), "bias")[0]
if not SMALL:  # (the simulator's kernels have no registers)
    print("phase kernel regs", k5.get_regs_per_thread(), "local", k5.get_local_mem_per_thread())

# conv1 weight + bias gradient (pooled)
x1 = dev(N, 3, 32, 32)
w1 = dev(WIDE, 3, 3, 3)
b1 = dev(WIDE)
pooled = cuda.device_array((N, WIDE, 16, 16), np.float32)
route = cuda.device_array((N, WIDE, 16, 16), np.int8)
D.conv_forward_pool_direct(x1, w1, b1, pooled, route, 1)
want_pooled = pooled.copy_to_host()
for tuning in ({}, {"cot": 16}, {"threads": 128}, {"cot": 4}):
    try:
        f = D.conv_forward_pool_direct(x1, w1, b1, pooled, route, 1, launch=False, **tuning)
    except ValueError as e:
        print(tuning, "refused:", e)
        continue
    timed(f"conv1 forward {f.name} {tuning}", f)
    print(f"   same as the default's: {np.array_equal(pooled.copy_to_host(), want_pooled)}")
dpool = dev(N, WIDE, 16, 16)
dw1 = cuda.device_array((WIDE, 3, 3, 3), np.float32)
db1 = cuda.device_array(WIDE, np.float32)
wg = PL.conv_backward_weight_pool_implicit_gemm(x1, dpool, route, dw1, 1, launch=False)
bg = PL.conv_bias_grad_pool(dpool, route, db1, launch=False)
timed(f"conv1 wgrad today: {wg.launches[0].name if hasattr(wg, 'launches') else wg.name}", wg)
timed("conv1 bias today: conv_bias_grad_pool", bg)
want_w, want_b = dw1.copy_to_host(), db1.copy_to_host()
for version in (None, "coalesced128"):
    for splits in (None, 256):
        try:
            g = WB.conv_backward_weight_bias_pool(x1, dpool, route, dw1, db1, 1, version=version, splits=splits,
                                                  launch=False)
        except ValueError as e:
            print(version, splits, "refused:", e)
            continue
        timed(f"conv1 wgrad+bias ones column: {g.launches[0].name}", g)
        gw, gb = dw1.copy_to_host(), db1.copy_to_host()
        print(f"   vs today's: dw {np.abs(gw - want_w).max() / np.abs(want_w).max():.2e}"
              f" db {np.abs(gb - want_b).max() / np.abs(want_b).max():.2e}")

from gpunn.kernels.conv import wgrad_direct as WD  # noqa: E402

for band_rows, per, co_t in ((None, None, None), (None, 2, None), (None, 4, None), (1, None, None),
                             (None, 4, 2), (None, 4, 8), (None, 2, 8)):
    g = WD.conv_backward_weight_bias_pool_direct(x1, dpool, route, dw1, db1, 1, rows=band_rows, per=per, co_t=co_t,
                                                 launch=False)
    timed(f"conv1 wgrad+bias direct: {g.launches[0].name} + sum", g)
    gw, gb = dw1.copy_to_host(), db1.copy_to_host()
    print(f"   vs today's: dw {np.abs(gw - want_w).max() / np.abs(want_w).max():.2e}"
          f" db {np.abs(gb - want_b).max() / np.abs(want_b).max():.2e}")

probe.write_csv(f"{out_dir}/ae_small_convs_probe.csv")
