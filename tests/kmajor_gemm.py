"""What the tests of the K-major tensor-core GEMMs (direct_*, ws_*, tma_*: C = A B^T, A (M, K), B stored (N, K))
share: operands in a format, and one launch's error on fresh inputs against the float64 product of the inputs as the
MMA reads them, its output NaN-poisoned first."""

import zlib

import numpy as np
from numba import cuda

from gpunn.kernels import gemm as G
from gpunn.kernels.mma import round_bf16


def operand(rng, rows, k, fmt):
    """A (rows, k) operand: float32 for TF32, the uint16 bits of BF16 values for BF16."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    return (round_bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16) if fmt == "bf16" else x


def launch_error(version, launch, m, n, k, epilogue, seed, unwritten="raise"):
    """max|out - ref| / max|ref| of `launch(a, b, out, bias=, relu=, relu_mask=)` for GEMM `version`
    ("<family>_<fmt>") on inputs drawn from `seed` (a tuple); outputs left NaN raise (or, `unwritten` "inf", give
    inf: a mutation test's failure)."""
    fmt = version.split("_")[1]
    rng = np.random.default_rng(zlib.crc32(repr(seed).encode()))
    a, b = operand(rng, m, k, fmt), operand(rng, n, k, fmt)
    bias = rng.standard_normal(n).astype(np.float32) if epilogue in ("bias", "bias_relu") else None
    relu = epilogue in ("relu", "bias_relu")
    mask = np.maximum(rng.standard_normal((m, n)), 0).astype(np.float32) if epilogue == "mask" else None
    out = cuda.to_device(np.full((m, n), np.nan, np.float32))
    launch(cuda.to_device(a), cuda.to_device(b), out, bias=None if bias is None else cuda.to_device(bias), relu=relu,
           relu_mask=None if mask is None else cuda.to_device(mask))
    got = out.copy_to_host()
    if not np.isfinite(got).all():
        if unwritten == "inf":
            return float("inf")
        raise AssertionError(f"{version}: unwritten (NaN) outputs")
    ref = G.gemm_reference(a, b, trans_b=True, bias=bias, relu=relu, relu_mask=mask, inputs=G.VERSIONS[version].inputs)
    return float(np.abs(got - ref).max() / np.abs(ref).max())
