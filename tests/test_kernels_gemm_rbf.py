"""The float64 RBF GEMM (gpunn.kernels.gemm.rbf) against scikit-learn's rbf_kernel and the float64 reference.

Under the CUDA simulator the shapes are tiny and not multiples of any tile (each simulated thread is a Python
thread: a 64x64 tile of the register-blocked version is 256 of them); outputs and norms are poisoned with NaN
so unwritten elements fail, and every test draws fresh random inputs from its own seed. The ``gpu``-marked
test repeats the checks at E6's width on a GPU (``pytest -m gpu``).
"""

import zlib

import numpy as np
import pytest
from numba import cuda
from sklearn.metrics.pairwise import rbf_kernel

from gpunn.kernels.gemm import rbf as R
from gpunn.kernels.launch import Launch

TOL = 1e-6  # E6's requirement; float64 accumulation lands near 1e-15
# (M, N, K): odd, not multiples of any tile, K above and below the tiles' K steps, one tile boundary each way
SHAPES = [(5, 7, 1), (65, 3, 17), (3, 66, 17)]
SMALL_NAIVE_BLOCK = (8, 4)  # few threads per launch under the simulator


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _nan(shape):
    return cuda.to_device(np.full(shape, np.nan))


def _rel_err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _gpu_rbf(a, b, gamma, version, symmetric=False, out_dtype=np.float64, **kw):
    """The kernel of host a vs b on the device, every output and norm poisoned with NaN first."""
    da = cuda.to_device(a)
    db = da if symmetric else cuda.to_device(b)
    a_sq, b_sq = _nan(a.shape[0]), _nan(b.shape[0])
    R.row_sq_norms(da, a_sq)
    R.row_sq_norms(db, b_sq)
    out = cuda.to_device(np.full((a.shape[0], b.shape[0]), np.nan, dtype=out_dtype))
    if version == "naive":
        kw.setdefault("block", SMALL_NAIVE_BLOCK)
    launch = R.rbf_gemm(da, db, out, a_sq, b_sq, gamma, version=version, **kw)
    assert isinstance(launch, Launch)
    got = out.copy_to_host()
    assert np.isfinite(got).all(), f"{version}: unwritten (NaN) outputs"
    return got


def _features(rng, m, k):
    """Standardised-looking features and the 'scale' gamma of such features (1 / (K var))."""
    return rng.standard_normal((m, k)), 1.0 / k


@pytest.mark.parametrize("symmetric", [False, True], ids=["a_vs_b", "a_vs_a"])
@pytest.mark.parametrize("version", list(R.VERSIONS))
def test_every_version_equals_sklearn_rbf_kernel(version, symmetric):
    rng = _rng(version, symmetric)
    a, gamma = _features(rng, 37, 19)
    b = a if symmetric else rng.standard_normal((23, 19))
    got = _gpu_rbf(a, b, gamma, version, symmetric)
    ref = rbf_kernel(a, b, gamma=gamma)  # float64, what SVC(kernel="rbf") evaluates
    assert _rel_err(got, ref) < TOL
    np.testing.assert_allclose(got, ref, rtol=TOL, atol=0)  # element by element too: small values included
    assert _rel_err(got, R.rbf_reference(a, b, gamma)) < 1e-13
    if symmetric:
        np.testing.assert_allclose(np.diag(got), 1.0, rtol=1e-14)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_register_blocked_version_at_tile_edges(m, n, k):
    rng = _rng("edges", m, n, k)
    a, gamma = _features(rng, m, k)
    b = rng.standard_normal((n, k)) + 0.3
    got = _gpu_rbf(a, b, gamma * 0.7, R.DEFAULT_VERSION)
    assert _rel_err(got, R.rbf_reference(a, b, gamma * 0.7)) < 1e-13


@pytest.mark.parametrize("version", list(R.VERSIONS))
def test_float32_output_is_the_float64_kernel_rounded_once(version):
    """out float32 (the GPU SVM's resident kernel): the float64 sums and epilogue, rounded to float32 at the store,
    so every element equals the float64 reference's float32 rounding but where the two float64 values straddle a
    rounding boundary (one float32 unit)."""
    rng = _rng("f32", version)
    a, gamma = _features(rng, 21, 13)
    b = rng.standard_normal((11, 13))
    got = _gpu_rbf(a, b, gamma, version, out_dtype=np.float32)
    assert got.dtype == np.float32
    ref = R.rbf_reference(a, b, gamma)
    assert np.abs(got.astype(np.float64) - ref).max() <= np.spacing(np.float32(1.0)) / 2 * 1.0001
    assert np.mean(got == ref.astype(np.float32)) > 0.95


def test_far_apart_rows_give_zero_and_rounding_never_exceeds_one():
    """Distances are clamped at 0 (a rounding-negative distance must not give a value above 1), and very
    distant rows underflow to exactly 0 as in scikit-learn."""
    rng = _rng("clamp")
    a = rng.standard_normal((9, 5)) * 1e3
    b = np.vstack([a[:4], a[:2] + 1e6])  # identical rows (distance 0 up to rounding) and far ones
    got = _gpu_rbf(a, b, 0.5, R.DEFAULT_VERSION)
    assert got.max() <= 1.0 and np.all(got[:, 4:] == 0.0)
    np.testing.assert_allclose(got, rbf_kernel(a, b, gamma=0.5), rtol=TOL, atol=1e-300)


def test_row_sq_norms_against_the_reference():
    rng = _rng("norms")
    x = rng.standard_normal((37, 19))
    out = _nan(37)
    R.row_sq_norms(cuda.to_device(x), out, threads=16)  # a grid of 3 blocks, the last one partly idle
    np.testing.assert_allclose(out.copy_to_host(), R.row_sq_norms_reference(x), rtol=1e-14)


def test_bad_operands_are_refused():
    a = cuda.to_device(np.zeros((4, 3)))
    b = cuda.to_device(np.zeros((5, 3)))
    out, a_sq, b_sq = cuda.to_device(np.zeros((4, 5))), cuda.to_device(np.zeros(4)), cuda.to_device(np.zeros(5))
    with pytest.raises(ValueError, match="float64"):
        R.rbf_gemm(cuda.to_device(np.zeros((4, 3), np.float32)), b, out, a_sq, b_sq, 1.0)
    with pytest.raises(ValueError, match="host NumPy array"):
        R.rbf_gemm(np.zeros((4, 3)), b, out, a_sq, b_sq, 1.0)
    with pytest.raises(ValueError, match="same number of columns"):
        R.rbf_gemm(a, cuda.to_device(np.zeros((5, 2))), out, a_sq, b_sq, 1.0)
    with pytest.raises(ValueError, match=r"out must be \(4, 5\)"):
        R.rbf_gemm(a, b, cuda.to_device(np.zeros((5, 4))), a_sq, b_sq, 1.0)
    with pytest.raises(ValueError, match="a_sq must be"):
        R.rbf_gemm(a, b, out, b_sq, b_sq, 1.0)
    with pytest.raises(ValueError, match="gamma"):
        R.rbf_gemm(a, b, out, a_sq, b_sq, 0.0)
    with pytest.raises(ValueError, match="unknown version"):
        R.rbf_gemm(a, b, out, a_sq, b_sq, 1.0, version="cublas")
    with pytest.raises(ValueError, match="block must be 256"):
        R.rbf_gemm(a, b, out, a_sq, b_sq, 1.0, version="regblock64", block=128)
    with pytest.raises(ValueError, match="block must be"):
        R.rbf_gemm(a, b, out, a_sq, b_sq, 1.0, version="naive", block=(0, 4))
    with pytest.raises(ValueError, match="out must be"):
        R.row_sq_norms(a, b_sq)


@pytest.mark.gpu
def test_e6_width_on_the_gpu():
    """Every version at E6's feature width, odd row counts, against scikit-learn's float64 kernel."""
    rng = _rng("gpu")
    a = rng.standard_normal((1031, 8192)).astype(np.float32).astype(np.float64)
    b = rng.standard_normal((517, 8192)).astype(np.float32).astype(np.float64)
    gamma = 1.0 / 8192
    ref = rbf_kernel(a, b, gamma=gamma)
    for version in R.VERSIONS:
        got = _gpu_rbf(a, b, gamma, version, block=(16, 16)) if version == "naive" else _gpu_rbf(a, b, gamma, version)
        assert _rel_err(got, ref) < TOL, version
        np.testing.assert_allclose(got, ref, rtol=TOL, atol=0)
    got = _gpu_rbf(a, a, gamma, R.DEFAULT_VERSION, symmetric=True)
    assert _rel_err(got, rbf_kernel(a, gamma=gamma)) < TOL


@pytest.mark.parametrize("n", [37, pytest.param(4099, marks=pytest.mark.gpu)])
def test_mirror_upper_completes_the_lower_triangle(n):
    """mirror_upper on an n x n float32 matrix (37: two tiles each way, the second partial; on a GPU 4 099) whose
    lower triangle is NaN: the reference's matrix, bit for bit, the diagonal and the upper triangle untouched."""
    upper = np.triu(_rng("mirror", n).random((n, n)).astype(np.float32))
    a = np.where(np.triu(np.ones((n, n), bool)), upper, np.nan).astype(np.float32)
    d = cuda.to_device(a)
    R.mirror_upper(d)
    got = d.copy_to_host()
    np.testing.assert_array_equal(got, R.mirror_upper_reference(a))
    np.testing.assert_array_equal(got, got.T)
    np.testing.assert_array_equal(np.triu(got), np.triu(a))


@pytest.mark.parametrize("n, d, rows", [(23, 7, 10), pytest.param(5003, 515, 2048, marks=pytest.mark.gpu)])
def test_float32_kernel_from_row_blocks_and_mirror_equals_the_whole(n, d, rows):
    """The GPU SVM's training kernel as it is made: row blocks of `rows` from the diagonal on, written into a strided
    view of the float32 matrix, then mirrored: equal to the float32 kernel computed whole."""
    rng = _rng("blocks", n)
    x, gamma = _features(rng, n, d)
    whole = _gpu_rbf(x, x, gamma, R.DEFAULT_VERSION, symmetric=True, out_dtype=np.float32)
    dx = cuda.to_device(x)
    sq = cuda.device_array(n)
    R.row_sq_norms(dx, sq)
    k = cuda.to_device(np.full((n, n), np.nan, dtype=np.float32))
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        R.rbf_gemm(dx[start:stop], dx[start:], k[start:stop, start:], sq[start:stop], sq[start:], gamma)
    R.mirror_upper(k)
    np.testing.assert_array_equal(k.copy_to_host(), whole)
