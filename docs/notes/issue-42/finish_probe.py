"""Issue 42 probe (device): the Winograd weight gradient's finishing launch (winograd_wgrad._finish_kernel: a block
of 16 elements (ci, co) x 16 positions, each thread's split sum into shared memory, then 144 threads make the 16
elements' dw) against the kernel it replaced (a thread per element looping over 16 positions x splits, kept here),
at the autoencoder's three Winograd weight gradients (64 images: conv2 256 -> 128 on 16x16, conv3 128 -> 128 on
8x8, conv4 128 -> 256 on up(8x8)), plain and with the bias gradient, float32 (the finishing launch is the same for
BF16 storage): each finishing launch alone and the whole group with either, CUDA events
(bench.core.median_launch_ms, median of 50); dw and db checked bit for bit against the old kernel's.

    python docs/notes/issue-42/finish_probe.py OUT [small]
    (small: a smoke run under the simulator, NUMBA_ENABLE_CUDASIM=1: 1 image, channels / 16)"""
import functools
import sys

import numpy as np
from numba import cuda, float32, uint32
from probe_kit import Probe, nan

from gpunn.kernels.conv import winograd as WG
from gpunn.kernels.conv import winograd_wgrad as WW
from gpunn.kernels.jit import jit
from gpunn.kernels.launch import LaunchGroup

out_dir = sys.argv[1]
SMALL = sys.argv[2:] == ["small"]
N, REPS, C = (1, 1, 16) if SMALL else (64, 50, 1)
probe = Probe(REPS)
timed, rand = probe.timed, probe.rand
_U0, _U1, _HALF, _F0, POSITIONS = WW._U0, WW._U1, WG._HALF, WG._F0, WG.POSITIONS


@functools.cache
def _old_finish_kernel(bias=False):
    """The finishing kernel before the rewrite (main at 47e5564), verbatim."""

    @jit
    def wgrad_finish(partials, dw, db_partials, db, cin, cout, splits, chunks):
        u = cuda.local.array(POSITIONS, float32)
        t3 = cuda.local.array(12, float32)
        cc = uint32(cin * cout)
        pos_stride = uint32(splits * cc)
        first = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        e = first
        while e < cc:
            ci = uint32(e // cout)
            co = uint32(e - ci * cout)
            for pos in range(POSITIONS):
                u[pos] = partials[uint32(uint32(pos) * pos_stride + e)]
            idx = e
            s = _U1
            while s < splits:
                idx = uint32(idx + cc)
                for pos in range(POSITIONS):
                    u[pos] += partials[uint32(uint32(pos) * pos_stride + idx)]
                s = uint32(s + _U1)
            for j in range(4):
                u0, u1, u2, u3 = u[j], u[4 + j], u[8 + j], u[12 + j]
                t3[j] = u0 + _HALF * (u1 + u2)
                t3[4 + j] = _HALF * (u1 - u2)
                t3[8 + j] = _HALF * (u1 + u2) + u3
            for i in range(3):
                a0, a1, a2, a3 = t3[4 * i], t3[4 * i + 1], t3[4 * i + 2], t3[4 * i + 3]
                dw[co, ci, i, 0] = a0 + _HALF * (a1 + a2)
                dw[co, ci, i, 1] = _HALF * (a1 - a2)
                dw[co, ci, i, 2] = _HALF * (a1 + a2) + a3
            e = uint32(e + stride)
        if bias:
            c = first
            while c < cout:
                acc = _F0
                b = _U0
                while b < chunks:
                    acc += db_partials[uint32(c * chunks + b)]
                    b = uint32(b + _U1)
                db[c] = acc
                c = uint32(c + stride)

    return wgrad_finish


for name, (cin, cout, h), up in (("conv2", (256 // C, 128 // C, 16), False), ("conv3", (128 // C, 128 // C, 8), False),
                                 ("conv4", (128 // C, 256 // C, 8), True)):
    oh = 2 * h if up else h
    x, dy = cuda.to_device(rand(N, cin, h, h)), cuda.to_device(rand(N, cout, oh, oh))
    for bias in (False, True):
        dw_new, db_new, dw_old, db_old = nan(cout, cin, 3, 3), nan(cout), nan(cout, cin, 3, 3), nan(cout)
        if bias:
            launcher = WW.conv_backward_weight_bias_winograd_up if up else WW.conv_backward_weight_bias_winograd
            new = launcher(x, dy, dw_new, db_new, 1, launch=False)
        else:
            launcher = WW.conv_backward_weight_winograd_up if up else WW.conv_backward_weight_winograd
            new = launcher(x, dy, dw_new, 1, launch=False)
        finish_new = new.launches[-1]
        args = list(finish_new.args)
        args[1] = dw_old
        if bias:
            args[3] = db_old
        finish_old = WG._bind(_old_finish_kernel(bias), cin * cout, args, 0, finish_new.name + " (old)")
        old = LaunchGroup([*new.launches[:-1], finish_old])
        label = f"{name} {cin}->{cout}{' up' if up else ''}{' + bias' if bias else ''}"
        print(f"{label}: {finish_new.name}; blocks new {finish_new.grid} x {finish_new.block}, "
              f"old {finish_old.grid} x {finish_old.block}")
        timed(f"{label} finish old", finish_old)
        timed(f"{label} finish new", finish_new)
        timed(f"{label} whole group, old finish", old)
        timed(f"{label} whole group, new finish", new)
        new()
        old()
        got, want = dw_new.copy_to_host(), dw_old.copy_to_host()
        line = f"   dw bit for bit: {np.array_equal(got, want)}, finite {np.isfinite(got).all()}"
        if bias:
            line += f"; db bit for bit: {np.array_equal(db_new.copy_to_host(), db_old.copy_to_host())}"
        print(line, flush=True)

probe.write_csv(f"{out_dir}/finish_probe.csv")
