"""ws_tf32 / ws_bf16 (gpunn.kernels.gemm.direct_ws: a producer warpgroup's cp.async, two consumer warpgroups' wgmma,
mbarriers between them) against the float64 product of their inputs as the tensor core reads them, and the
mbarrier emulation (gpunn.kernels.mbarrier) they run on under the simulator. Small odd shapes reach each copy path
(16-byte chunks, 4-byte tails, zero fill past M, N and K), both tiles (128 x 256, 128 x 128) and the ring's wrap
(more K steps than stages, so every barrier goes round more than one phase); outputs are NaN-poisoned first. The
``gpu``-marked test repeats them at real sizes on a Hopper GPU (``pytest -m gpu``)."""

import functools
import os

import numpy as np
import pytest
from numba import cuda, uint32

from gpunn.kernels import gemm as G
from gpunn.kernels import mbarrier as MB
from gpunn.kernels.gemm import direct_ws
from kmajor_gemm import launch_error

TOL = 1e-5
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


def _run(fmt, m, n, k, epilogue="none", stages=direct_ws.STAGES, bn=direct_ws.BN, regs=direct_ws.REGS, key=()):
    """One launch on fresh inputs: max|out - ref| / max|ref| (ref: float64 of the inputs as the MMA reads them)."""
    return launch_error(f"ws_{fmt}", functools.partial(G.gemm_ws, fmt, stages=stages, bn=bn, regs=regs), m, n, k,
                        epilogue, (fmt, m, n, k, epilogue, stages, bn, *key))


# (fmt, M, N, K, epilogue, stages, bn): TF32 steps are 32 K, BF16 64; 1 or 2 blocks each (the simulator's cost)
CASES = [
    ("tf32", 130, 7, 75, "bias_relu", 2, 256),  # K % 4 != 0: 4-byte copies everywhere, zero past K and M
    ("tf32", 3, 260, 164, "mask", 2, 256),      # 16-byte copies, zero past N in the 256 tile; 6 steps round 2
    ("tf32", 5, 129, 300, "none", 4, 256),      # the default ring: 10 steps round 4 stages
    ("tf32", 5, 130, 200, "none", 3, 128),      # the 128 x 128 tile (m64n128): 7 steps round 3
    ("bf16", 130, 6, 78, "relu", 2, 256),       # K % 8 != 0: pairs by 4-byte copies
    ("bf16", 5, 257, 520, "bias", 3, 256),      # 16-byte copies, a tail step of 8 K; 9 steps round 3
    ("bf16", 129, 3, 302, "none", 4, 256),      # the default ring, 5 steps round 4
    ("bf16", 5, 130, 200, "none", 2, 128),      # the 128 x 128 tile: 4 steps round 2
]


@pytest.mark.parametrize("fmt,m,n,k,epilogue,stages,bn", CASES)
def test_ws_against_float64(fmt, m, n, k, epilogue, stages, bn):
    assert _run(fmt, m, n, k, epilogue, stages, bn) < TOL


def test_ws_without_register_reallocation():
    assert _run("tf32", 3, 9, 100, "none", 2, 256, regs=None) < TOL


def test_ws_refuses_what_it_cannot_read():
    a16, b16 = cuda.to_device(np.zeros((4, 7), np.uint16)), cuda.to_device(np.zeros((5, 7), np.uint16))
    a32, b32 = cuda.to_device(np.zeros((4, 8), np.float32)), cuda.to_device(np.zeros((5, 8), np.float32))
    out = cuda.to_device(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="K must be even"):
        G.gemm_ws("bf16", a16, b16, out)
    with pytest.raises(ValueError, match="2 stages or more"):
        G.gemm_ws("tf32", a32, b32, out, stages=5)
    with pytest.raises(ValueError, match="bn must be"):
        G.gemm_ws("tf32", a32, b32, out, bn=64)
    with pytest.raises(ValueError, match="K-major flat operands only"):
        direct_ws.kernel("tf32")("dense", "dense", "dense", 1, "none")
    assert "ws_tf32" not in G.DENSE_LAUNCHERS and "ws_tf32" not in __import__(
        "gpunn.kernels.conv.implicit_gemm", fromlist=["GEMM_VERSIONS"]).GEMM_VERSIONS
    assert G.VERSIONS["ws_tf32"].shared == direct_ws.shared_bytes() <= 227 * 1024
    assert direct_ws.shared_bytes(6, 128) <= 227 * 1024 < direct_ws.shared_bytes(5, 256)


@cuda.jit
def _ring(smem_words, out, rounds, parity_flip):
    """Thread 0 produces ``rounds`` values into a 2-slot ring, thread 1 consumes them (full / empty barriers)."""
    smem = cuda.shared.array(0, uint32)
    t = cuda.threadIdx.x
    if t == 0:
        for i in range(2):
            MB.mbar_init(smem, np.uint32(4 + 2 * i), np.uint32(1))  # full[i]
            MB.mbar_init(smem, np.uint32(8 + 2 * i), np.uint32(1))  # empty[i]
    cuda.syncthreads()
    for r in range(rounds):
        slot, phase = r % 2, (r // 2) % 2
        if t == 0:
            MB.mbar_wait(smem, np.uint32(8 + 2 * slot), np.uint32(phase ^ 1))
            smem[slot] = r + 1
            MB.mbar_arrive(smem, np.uint32(4 + 2 * slot))
        else:
            MB.mbar_wait(smem, np.uint32(4 + 2 * slot), np.uint32(phase ^ parity_flip))
            out[r] = smem[slot]
            MB.mbar_arrive(smem, np.uint32(8 + 2 * slot))


def test_mbarrier_ring_and_parity():
    """A two-slot ring runs in order; the consumer's parity flipped reads slots before they are written."""
    out = np.zeros(7, np.int64)
    _ring[1, 2, 0, 48](12, out, 7, 0)
    np.testing.assert_array_equal(out, np.arange(1, 8))
    out[:] = 0
    with pytest.raises(RuntimeError):  # reads early, then arrives on an empty barrier with no arrival left
        _ring[1, 2, 0, 48](12, out, 7, 1)


@cuda.jit
def _deadlock(out):
    smem = cuda.shared.array(0, uint32)
    if cuda.threadIdx.x == 0:
        MB.mbar_init(smem, np.uint32(0), np.uint32(2))
    cuda.syncthreads()
    MB.mbar_arrive(smem, np.uint32(0))  # 1 thread of the 2 expected: phase 0 never completes
    MB.mbar_wait(smem, np.uint32(0), np.uint32(0))
    out[0] = 1


def test_mbarrier_wait_without_arrivals_is_a_deadlock(monkeypatch):
    monkeypatch.setattr(MB, "SPIN_LIMIT", 20)
    with pytest.raises(RuntimeError, match="deadlock"):
        _deadlock[1, 1, 0, 16](np.zeros(1))


@cuda.jit
def _tx(out):
    smem = cuda.shared.array(0, uint32)
    MB.mbar_init(smem, np.uint32(0), np.uint32(1))
    MB.mbar_arrive_expect_tx(smem, np.uint32(0), np.uint32(64))
    out[0] = smem[1] & 1  # still phase 0: 64 bytes expected
    MB.sim_complete_tx(smem, np.uint32(0), 64)
    out[1] = smem[1] & 1  # phase 0 complete
    MB.mbar_wait(smem, np.uint32(0), np.uint32(0))


@pytest.mark.skipif(_ON_GPU, reason="the transaction count's emulation (no bulk copy completes it on a GPU here)")
def test_mbarrier_transaction_bytes():
    out = np.full(2, -1)
    _tx[1, 1, 0, 16](out)
    np.testing.assert_array_equal(out, [0, 1])


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_ws_gpu_sizes(fmt):
    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("wgmma: compute capability 9.0 only")
    k = 301 if fmt == "tf32" else 302  # BF16: K even
    for stages, bn, regs in ((direct_ws.STAGES, 256, direct_ws.REGS), (3, 256, None), (6, 128, direct_ws.REGS)):
        for epilogue in G.EPILOGUES:
            err = _run(fmt, 257, 129, k, epilogue, stages, bn, regs, key=("gpu",))
            assert err < TOL, (fmt, stages, bn, regs, epilogue, err)
        err = _run(fmt, 1024, 1024, 1024, "bias_relu", stages, bn, regs, key=("gpu",))
        assert err < TOL, (fmt, stages, bn, regs, err)
    err = _run(fmt, 257, 300, 304 if fmt == "tf32" else 320, "none", key=("gpu", "vec"))  # 16-byte copies only
    assert err < TOL, (fmt, err)
