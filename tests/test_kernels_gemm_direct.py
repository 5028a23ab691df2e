"""direct_tf32 / direct_bf16 (gpunn.kernels.gemm.direct: wgmma fed straight by cp.async, C = A B^T of K-major
operands) against the float64 product of their inputs as the tensor core reads them (TF32 truncated; BF16 bits
widened). Under the simulator small odd shapes reach each copy path (16-byte chunks, 4-byte tails, zero fill past
M, N and K) and the ring's wrap-around (more K steps than stages); outputs are poisoned with NaN first. The
``gpu``-marked tests repeat them at real sizes on a Hopper GPU (``pytest -m gpu``)."""

import functools
import os
import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import gemm as G
from gpunn.kernels.gemm import direct
from kmajor_gemm import launch_error

TOL = 1e-5
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _run(fmt, m, n, k, epilogue="none", stages=direct.STAGES, key=()):
    """One launch on fresh inputs: max|out - ref| / max|ref| (ref: float64 of the inputs as the MMA reads them)."""
    return launch_error(f"direct_{fmt}", functools.partial(G.gemm_direct, fmt, stages=stages), m, n, k, epilogue,
                        (fmt, m, n, k, epilogue, stages, *key))


# (fmt, M, N, K, epilogue, stages): TF32 steps are 32 K, BF16 64; every shape 2 blocks along M or N
CASES = [
    ("tf32", 130, 7, 75, "bias_relu", 3),   # K % 4 != 0: 4-byte copies everywhere, zero past K and M
    ("tf32", 3, 131, 164, "mask", 3),       # 16-byte copies, the last step 1 chunk of K; 6 steps round 3 stages
    ("tf32", 129, 5, 300, "none", direct.STAGES),  # the default ring: 10 steps round 7 stages
    ("bf16", 130, 6, 78, "relu", 3),        # K % 8 != 0: pairs by 4-byte copies
    ("bf16", 5, 130, 200, "bias", 3),       # 16-byte copies, a tail step of 8 K; 4 steps round 3 stages
    ("bf16", 129, 3, 520, "none", direct.STAGES),  # 9 steps round 7 stages, K % 8 == 0
]


@pytest.mark.parametrize("fmt,m,n,k,epilogue,stages", CASES)
def test_direct_against_float64(fmt, m, n, k, epilogue, stages):
    assert _run(fmt, m, n, k, epilogue, stages) < TOL


def test_direct_tf32_truncates():
    """The tensor core reads the 19 high bits of the float32 given: 1 + 2**-11 + 2**-12 is 1, not 1 + 2**-10."""
    k = 8
    a = np.full((3, k), np.float32(1 + 2**-11 + 2**-12))
    b = np.ones((5, k), np.float32)
    out = cuda.to_device(np.full((3, 5), np.nan, np.float32))
    G.gemm_direct("tf32", cuda.to_device(a), cuda.to_device(b), out, stages=3)
    np.testing.assert_array_equal(out.copy_to_host(), np.full((3, 5), k, np.float32))
    np.testing.assert_array_equal(G.gemm_reference(a, b, trans_b=True, inputs="tf32_trunc"), np.full((3, 5), k))


def test_reference_input_formats():
    x = np.array([[1 + 2**-11 + 2**-12, -(1 + 2**-10 + 2**-11), np.inf]], np.float32)
    np.testing.assert_array_equal(G.round_inputs(x, "tf32_trunc"), [[1.0, -(1 + 2**-10), np.inf]])
    bits = np.array([0x3F80, 0xC040, 0x0001], np.uint16)  # 1, -3, the smallest subnormal
    np.testing.assert_array_equal(G.round_inputs(bits, "bf16"), np.array([1.0, -3.0, 2.0**-133], np.float32))
    with pytest.raises(ValueError, match="a uint16 array holds BF16 bits"):
        G.round_inputs(bits, "tf32")


def test_direct_refuses_what_it_cannot_read():
    a32, b32 = cuda.to_device(np.zeros((4, 8), np.float32)), cuda.to_device(np.zeros((5, 8), np.float32))
    a16, b16 = (cuda.to_device(np.zeros((4, 7), np.uint16)), cuda.to_device(np.zeros((5, 7), np.uint16)))
    out = cuda.to_device(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="K must be even"):
        G.gemm_direct("bf16", a16, b16, out)
    with pytest.raises(ValueError, match="dtype|uint16"):
        G.gemm_direct("bf16", a32, b32, out)
    wide = cuda.to_device(np.zeros((4, 16), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        G.gemm_direct("tf32", wide[:, :8], b32, out)
    with pytest.raises(ValueError, match="3 stages or more"):
        G.gemm_direct("tf32", a32, b32, out, stages=2)
    with pytest.raises(ValueError, match="K-major flat operands only"):
        direct.kernel("tf32")("dense", "dense", "dense", 1, "none")
    assert "direct_tf32" not in G.DENSE_LAUNCHERS and "direct_tf32" not in __import__(
        "gpunn.kernels.conv.implicit_gemm", fromlist=["GEMM_VERSIONS"]).GEMM_VERSIONS


def test_shared_memory_fits_a_block():
    """227 KB of dynamic shared memory a block on an H100 / H200; 3 stages leave room for two blocks an SM."""
    assert G.VERSIONS["direct_tf32"].shared == direct.shared_bytes() <= 227 * 1024
    assert 2 * (direct.shared_bytes(3) + 1024) <= 228 * 1024


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_direct_gpu_sizes(fmt):
    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("wgmma: compute capability 9.0 only")
    k = 301 if fmt == "tf32" else 302  # BF16: K even
    for stages in (3, direct.STAGES):
        for epilogue in G.EPILOGUES:
            err = _run(fmt, 257, 129, k, epilogue, stages, key=("gpu",))
            assert err < TOL, (fmt, stages, epilogue, err)
        err = _run(fmt, 1024, 1024, 1024, "bias_relu", stages, key=("gpu",))
        assert err < TOL, (fmt, stages, err)
    err = _run(fmt, 257, 129, 304 if fmt == "tf32" else 320, "none", key=("gpu", "vec"))  # 16-byte copies only
    assert err < TOL, (fmt, err)
