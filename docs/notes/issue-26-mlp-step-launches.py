"""Issue 26: each launch of the MLP's persistent step timed alone (median_launch_ms, GPU events, queued behind a
hold) on E1's shapes, for several split counts and block sizes, beside empty kernels (the per-launch floor).

    python docs/notes/issue-26-mlp-step-launches.py
"""

import numpy as np
from numba import cuda

from gpunn.bench.core import median_launch_ms, numba_clock
from gpunn.device import describe_device
from gpunn.kernels import mlp_step as m

print(describe_device())
clock = numba_clock(0)
rng = np.random.default_rng(0)
n = 60000
src = cuda.to_device(rng.random((n, 784), dtype=np.float32))
lab = cuda.to_device(rng.integers(0, 10, n).astype(np.int32))
order = cuda.to_device(rng.permutation(n).astype(np.int32))
cnt = cuda.to_device(np.zeros(1, np.int32))
w1 = cuda.to_device((rng.standard_normal((785, 256)) * 0.03).astype(np.float32))
w2 = cuda.to_device((rng.standard_normal((257, 10)) * 0.06).astype(np.float32))
losses = cuda.device_array(n, np.float32)


@cuda.jit
def empty1(a):
    pass


@cuda.jit
def empty12(a, b, c, d, e, f, g, h, i, j, k, m12):
    pass


def ms(launch):
    return median_launch_ms(launch, 50, clock).ms * 1e3


print(f"empty kernel, 1 array arg, grid 200x256: {ms(lambda: empty1[200, 256](src)):.1f} us")
print(f"empty kernel, 12 array args, grid 200x256: {ms(lambda: empty12[200, 256](*([src] * 12))):.1f} us")
for block in (256, 128, 512):
    for target in (None, 132, 66):
        splits = m.fc1_splits(64, 784, 256, block, target)
        b = m.step_buffers(64, 784, 256, 10, splits=splits, block=block)
        pers = m.step_forward(src, lab, order, cnt, 64, w1, w2, losses, b, block=block, launch=False)
        a_launch, b_launch = m.step_forward(src, lab, order, cnt, 64, w1, w2, losses, b, version="phased",
                                            block=block, launch=False).launches
        back = m.step_backward(src, w1, w2, b, 0.01, cnt, block=block, launch=False)
        print(f"block {block} splits {splits}: persistent forward (grid {pers.grid}) {ms(pers):.1f} us, phase A "
              f"(grid {a_launch.grid}) {ms(a_launch):.1f} us, phase B (grid {b_launch.grid}) {ms(b_launch):.1f} us, "
              f"backward (grid {back.grid}) {ms(back):.1f} us")
for k in list(m._forward_kernels(256, 10)) + [m._backward_kernel(256, True)]:
    for ov in k.overloads.values():
        print(k.py_func.__name__, "regs", ov.regs_per_thread, "local bytes", ov.local_mem_per_thread,
              "shared bytes", ov.shared_mem_per_block)
