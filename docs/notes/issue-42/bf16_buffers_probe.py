"""Issue 42 probe (device): the autoencoder's Winograd passes on tensor_bf16 at batch 64 with the transform buffers
(V, dM) stored as float32 and as BF16 bits (``storage="bf16"``: half their bytes), each pass and each of its launches
timed alone with CUDA events (bench.core.median_launch_ms, median of 30), and the two storages' outputs compared
bit for bit (they must be equal) and against the float64 reference:
  conv2 256 -> 128 on 16x16 (forward + bias + ReLU, input gradient with the ReLU mask, weight gradient);
  conv4 128 -> 256 on the 2x upsample of 8x8 (the same three, the ``_up`` launchers).

    python docs/notes/issue-42/bf16_buffers_probe.py OUT          (a GPU)
    NUMBA_ENABLE_CUDASIM=1 python docs/notes/issue-42/bf16_buffers_probe.py OUT small   (a smoke run)"""
import sys

import numpy as np
from numba import cuda
from probe_kit import Probe, nan

from gpunn.kernels.conv import reference as R
from gpunn.kernels.conv import upsampled as UP
from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.conv import winograd_wgrad as WW

out_dir = sys.argv[1]
SMALL = sys.argv[2:] == ["small"]  # a smoke run under the simulator: 2 images, channels / 32, one timed call
N, WIDE, NARROW, REPS = (2, 8, 4, 1) if SMALL else (64, 256, 128, 30)
VERSION = "tensor_bf16"
probe = Probe(REPS)
timed, rand = probe.timed, probe.rand
mismatches = []


def run_pass(conv, name, make, out, ref):
    """Times `make(storage)` (a LaunchGroup, not launched) and its launches for both storages; compares the
    outputs."""
    got = {}
    for storage in WG.STORAGES:
        group = make(storage)
        timed(f"{conv} {name} {storage} (group)", group)
        for launch in group.launches:
            timed(f"{conv} {name} {storage}   {launch.name}", launch)
        got[storage] = out.copy_to_host()
    same = np.array_equal(got["fp32"], got["bf16"], equal_nan=True)
    err = float(np.abs(got["bf16"] - ref).max() / np.abs(ref).max())
    print(f"   {conv} {name}: bf16 storage bit-identical to fp32: {same}; rel err vs float64 {err:.2e}; finite "
          f"{np.isfinite(got['bf16']).all()}", flush=True)
    if not same:
        mismatches.append(f"{conv} {name}")


def conv_passes(conv, cin, cout, h, up):
    """The three passes of a 3x3 padding-1 conv cin -> cout on an h x h map (`up`: on its 2x upsample)."""
    oh = 2 * h if up else h
    x, w, b = rand(N, cin, h, h), rand(cout, cin, 3, 3, scale=0.05), rand(cout)
    dy, mask = rand(N, cout, oh, oh), np.maximum(rand(N, cin, h, h), 0)
    dx_, dw_, db_, ddy, dmask = (cuda.to_device(a) for a in (x, w, b, dy, mask))
    fwd = WG.conv_forward_winograd_up if up else WG.conv_forward_winograd
    bwd = WG.conv_backward_data_winograd_up if up else WG.conv_backward_data_winograd
    wgrad = WW.conv_backward_weight_winograd_up if up else WW.conv_backward_weight_winograd
    ref_f = (UP.conv_forward_up_ref if up else R.conv_forward_ref)(x, w, b, 1, True)
    ref_d = (UP.conv_backward_data_up_ref if up else R.conv_backward_data_ref)(dy, w, x.shape, 1, mask)
    ref_w = (UP.conv_backward_weight_up_ref if up else R.conv_backward_weight_ref)(x, dy, 3, 1)
    y, dxo, dwo = nan(N, cout, oh, oh), nan(N, cin, h, h), nan(cout, cin, 3, 3)
    run_pass(conv, "forward", lambda st: fwd(dx_, dw_, db_, y, 1, relu=True, version=VERSION, launch=False,
                                             storage=st), y, ref_f)
    run_pass(conv, "backward_data", lambda st: bwd(ddy, dw_, dxo, 1, relu_mask=dmask, version=VERSION,
                                                   launch=False, storage=st), dxo, ref_d)
    run_pass(conv, "backward_weight", lambda st: wgrad(dx_, ddy, dwo, 1, version=VERSION, launch=False,
                                                       storage=st), dwo, ref_w)


conv_passes("conv2", WIDE, NARROW, 16 if not SMALL else 4, False)
conv_passes("conv4", NARROW, WIDE, 8 if not SMALL else 2, True)

probe.write_csv(f"{out_dir}/bf16_buffers_probe.csv")
print("all bit-identical" if not mismatches else f"NOT bit-identical: {mismatches}")
sys.exit(1 if mismatches else 0)
