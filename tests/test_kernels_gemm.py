"""GEMM kernels against the float64 NumPy reference.

Under the CUDA simulator (CPU-only machines, see conftest.py) the shapes are tiny and deliberately not
multiples of the tiles; outputs are poisoned with NaN so unwritten elements fail. The ``gpu``-marked test
repeats the check at real sizes on a GPU (``pytest -m gpu``).
"""

import os

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels import gemm as G

TOL = 1e-5
TRANS = [(False, False), (False, True), (True, False), (True, True)]


def _operands(rng, m, n, k, trans_a, trans_b):
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return a, b, bias


def _run(variant, m, n, k, trans_a, trans_b, epilogue, seed=0, **kw):
    """Launch one variant on fresh random inputs; return the relative max error vs the reference."""
    rng = np.random.default_rng(seed)
    a, b, bias = _operands(rng, m, n, k, trans_a, trans_b)
    out = cuda.to_device(np.full((m, n), np.nan, dtype=np.float32))
    G.gemm(
        cuda.to_device(a), cuda.to_device(b), out, variant=variant,
        trans_a=trans_a, trans_b=trans_b,
        bias=cuda.to_device(bias) if epilogue else None, relu=epilogue, **kw,
    )
    got = out.copy_to_host()
    ref = G.gemm_reference(a, b, trans_a, trans_b, bias if epilogue else None, epilogue)
    assert np.isfinite(got).all(), f"{variant}: unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias_relu"])
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("variant", list(G.VARIANTS))
def test_gemm_small_odd_shape(variant, trans_a, trans_b, epilogue):
    assert _run(variant, 5, 7, 9, trans_a, trans_b, epilogue) < TOL


@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias_relu"])
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("variant", ["tiled16", "regblock"])
def test_gemm_across_tiles(variant, trans_a, trans_b, epilogue):
    # 17x19 spans 2x2 blocks of tiled16; K=23 takes 2 (tiled16) or 3 (regblock, BK=8) K steps.
    assert _run(variant, 17, 19, 23, trans_a, trans_b, epilogue, seed=1) < TOL


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)], ids=["NN", "TT"])
def test_regblock_several_blocks(trans_a, trans_b):
    # 66x65 needs 2x2 blocks of the 64x64 register-blocked tile.
    assert _run("regblock", 66, 65, 9, trans_a, trans_b, True, seed=2) < TOL


@pytest.mark.parametrize("variant", list(G.VARIANTS))
def test_gemm_batch_of_one(variant):
    assert _run(variant, 1, 10, 12, False, True, True, seed=3) < TOL


def test_naive_block_sizes():
    assert _run("naive", 9, 11, 5, False, False, True, block=(8, 4)) < TOL
    assert _run("naive", 9, 11, 5, True, False, False, block=(32, 1)) < TOL


def test_bias_without_relu():
    rng = np.random.default_rng(4)
    a, b, bias = _operands(rng, 4, 6, 3, False, False)
    out = cuda.to_device(np.full((4, 6), np.nan, dtype=np.float32))
    G.gemm(cuda.to_device(a), cuda.to_device(b), out, bias=cuda.to_device(bias))
    ref = G.gemm_reference(a, b, bias=bias)
    assert (ref < 0).any()  # the ReLU would have changed something
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-5)


def test_reference_matches_numpy():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal((5, 4))
    bias = rng.standard_normal(5)
    np.testing.assert_allclose(G.gemm_reference(a, b, trans_b=True), a @ b.T)
    np.testing.assert_allclose(
        G.gemm_reference(a.T, b, trans_a=True, trans_b=True, bias=bias, relu=True),
        np.maximum(a @ b.T + bias, 0),
    )


def _dev(*shape):
    return cuda.to_device(np.zeros(shape, dtype=np.float32))


@pytest.mark.parametrize("variant", list(G.VARIANTS))
def test_gemm_shape_errors(variant):
    with pytest.raises(ValueError, match=r"inner dimensions"):
        G.gemm(_dev(3, 4), _dev(5, 6), _dev(3, 6), variant=variant)
    with pytest.raises(ValueError, match=r"inner dimensions"):  # trans_b makes B (6, 5)
        G.gemm(_dev(3, 4), _dev(4, 6), _dev(3, 6), variant=variant, trans_b=True)
    with pytest.raises(ValueError, match=r"out must be \(3, 6\)"):
        G.gemm(_dev(3, 4), _dev(4, 6), _dev(6, 3), variant=variant)
    with pytest.raises(ValueError, match=r"bias must be \(6,\)"):
        G.gemm(_dev(3, 4), _dev(4, 6), _dev(3, 6), variant=variant, bias=_dev(3))
    with pytest.raises(ValueError, match=r"2-D"):
        G.gemm(_dev(3, 4, 1), _dev(4, 6), _dev(3, 6), variant=variant)
    with pytest.raises(ValueError, match=r"float32"):
        G.gemm(cuda.to_device(np.zeros((3, 4))), _dev(4, 6), _dev(3, 6), variant=variant)


@pytest.mark.parametrize("variant", list(G.VARIANTS))
@pytest.mark.parametrize("m,n,k", [(0, 6, 4), (3, 0, 4), (3, 6, 0)])
def test_gemm_zero_sized(variant, m, n, k):
    with pytest.raises(ValueError, match=r"zero-sized"):
        G.gemm(_dev(m, k), _dev(k, n), _dev(m, n), variant=variant)


def test_unknown_variant_and_bad_blocks():
    with pytest.raises(ValueError, match=r"naive.*regblock.*tiled16"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), variant="cublas")
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), variant="tiled16", block=(8, 8))
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), variant="regblock", block=128)
    with pytest.raises(ValueError, match=r"block"):
        G.gemm(_dev(2, 2), _dev(2, 2), _dev(2, 2), variant="naive", block=(64, 32))


_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("variant", list(G.VARIANTS))
def test_gemm_gpu_sizes(variant):
    for trans_a, trans_b in TRANS:
        for epilogue in (False, True):
            err = _run(variant, 257, 129, 301, trans_a, trans_b, epilogue, seed=6)
            assert err < TOL, (variant, trans_a, trans_b, epilogue, err)
    for trans_a, trans_b in [(False, False), (True, True)]:
        err = _run(variant, 1024, 1024, 1024, trans_a, trans_b, True, seed=7)
        assert err < TOL, (variant, trans_a, trans_b, err)
