"""Max-pool, upsample and MSE-head kernels (gpunn.kernels.pool, gpunn.kernels.mse) against their float64 NumPy
references, and the pool benchmark problems (gpunn.bench.pool) on their quick shapes.

Runs under the CUDA simulator (tiny shapes) or on a GPU. Float outputs are poisoned with NaN and int8 argmax
outputs with -1 before each launch, so an element a kernel forgets to write fails the comparison.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from numba import config, cuda

from gpunn import bench
from gpunn.bench import pool as bench_pool
from gpunn.kernels import mse, pool
from gpunn.kernels import softmax as sm
from gpunn.nn import functional as F

TOL = 1e-5

# odd H and W (a dropped last row and column), even ones, and the smallest window count
SHAPES = [(3, 5, 7, 9), (2, 3, 6, 8), (1, 2, 3, 2)]
BACKWARD = sorted(pool.OPS["maxpool2x2_backward"])


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "output has NaN/inf (an element was not written?)"
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def rand(rng, *shape, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    a[a == 0] = 0.5  # never zero: keeps the relu masks and the relative errors well defined
    return a


def poisoned(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def poisoned_argmax(*shape):
    return cuda.to_device(np.full(shape, -1, np.int8))


def pooled(shape):
    n, c, h, w = shape
    return n, c, h // 2, w // 2


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))  # fixed per test


def run_forward(x, block=32):
    out, argmax = poisoned(*pooled(x.shape)), poisoned_argmax(*pooled(x.shape))
    pool.maxpool2x2_forward_v1(cuda.to_device(x), out, argmax, block=block)
    return out.copy_to_host(), argmax.copy_to_host()


# --------------------------------------------------------------------------------------------- maxpool forward
@pytest.mark.parametrize("shape", SHAPES)
def test_maxpool_forward(rng, shape):
    x = rand(rng, *shape)
    out, argmax = run_forward(x)
    ref_out, ref_argmax = pool.maxpool2x2_forward_ref(x)
    assert rel_err(out, ref_out) < TOL
    np.testing.assert_array_equal(argmax, ref_argmax)
    np.testing.assert_array_equal(out, F.maxpool2x2_forward(x)[0])  # a max is exact: bitwise the CPU op's


def test_maxpool_forward_ties_keep_the_first_position(rng):
    """Values from a set of four give ties in most windows; some windows are all equal (position 0 wins) and
    some have the max twice at later positions (the earlier of the two wins)."""
    shape = (2, 3, 7, 9)
    x = rng.choice(np.array([-1.5, 0.5, 1.0, 2.0], np.float32), size=shape)
    x[0, 0, 0:2, 0:2] = 1.0  # all four equal
    x[0, 1, 2:4, 2:4] = [[0.5, 2.0], [2.0, -1.5]]  # positions 1 and 2 tie
    x[1, 2, 4:6, 6:8] = [[-1.5, 0.5], [2.0, 2.0]]  # positions 2 and 3 tie
    out, argmax = run_forward(x, block=16)
    ref_out, ref_argmax = pool.maxpool2x2_forward_ref(x)
    assert (argmax[0, 0, 0, 0], argmax[0, 1, 1, 1], argmax[1, 2, 2, 3]) == (0, 1, 2)
    values = x[:, :, :6, :8].reshape(2, 3, 3, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 3, 4, 4)
    assert (np.sort(values, axis=-1)[..., -1] == np.sort(values, axis=-1)[..., -2]).mean() > 0.3  # many ties
    np.testing.assert_array_equal(argmax, ref_argmax)
    np.testing.assert_array_equal(out, ref_out)


def test_maxpool_forward_propagates_nan(rng):
    x = rand(rng, 1, 2, 4, 4)
    x[0, 1, 3, 2] = np.nan  # window (1, 1) of channel 1, position 2*1 + 0
    out = poisoned(1, 2, 2, 2)
    argmax = poisoned_argmax(1, 2, 2, 2)
    pool.maxpool2x2_forward_v1(cuda.to_device(x), out, argmax, block=8)
    got = out.copy_to_host()
    assert np.isnan(got[0, 1, 1, 1]) and np.isfinite(np.delete(got.ravel(), 7)).all()
    assert argmax.copy_to_host()[0, 1, 1, 1] == 2


# --------------------------------------------------------------------------------------------- maxpool backward
@pytest.mark.parametrize("version", BACKWARD)
@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize("masked", [False, True])
def test_maxpool_backward(rng, version, shape, masked):
    x = rand(rng, *shape)
    dy = rand(rng, *pooled(shape))
    mask = rand(rng, *shape) if masked else None
    if masked:
        mask[0, 0, 0, :] = 0.0  # exactly zero: masked out, like relu_backward
    _, argmax = pool.maxpool2x2_forward_ref(x)
    dx = poisoned(*shape)
    launcher = pool.OPS["maxpool2x2_backward"][version]
    launcher(cuda.to_device(dy), cuda.to_device(argmax), dx, None if mask is None else cuda.to_device(mask),
             block=32)
    got = dx.copy_to_host()
    ref = pool.maxpool2x2_backward_ref(dy, argmax, shape, mask)
    assert rel_err(got, ref) < TOL
    np.testing.assert_array_equal(got, ref)  # routing copies values: exact
    if shape[2] % 2:  # the dropped odd row and column get exactly zero
        assert not got[:, :, -1, :].any() and not got[:, :, :, -1].any()
    if masked:
        assert not got[mask <= 0].any()
    else:
        assert rel_err(got, F.maxpool2x2_backward(dy, argmax, shape)) < TOL


def test_maxpool_backward_from_the_kernels_argmax_and_replayed(rng):
    """forward's device argmax feeds both backward versions; replaying the atomic group re-zeroes dx first
    (no accumulation from one launch to the next), and the two versions agree bitwise."""
    shape = (3, 5, 7, 9)
    x = rand(rng, *shape)
    dy = rand(rng, *pooled(shape))
    out, argmax = poisoned(*pooled(shape)), poisoned_argmax(*pooled(shape))
    pool.maxpool2x2_forward_v1(cuda.to_device(x), out, argmax, block=64)
    d_dy = cuda.to_device(dy)
    dx_atomic, dx_gather = poisoned(*shape), poisoned(*shape)
    group = pool.maxpool2x2_backward_atomic(d_dy, argmax, dx_atomic, block=64)
    assert len(group.launches) == 2
    group()
    pool.maxpool2x2_backward_gather(d_dy, argmax, dx_gather, block=64)
    _, ref_argmax = pool.maxpool2x2_forward_ref(x)
    ref = pool.maxpool2x2_backward_ref(dy, ref_argmax, shape)
    assert rel_err(dx_atomic.copy_to_host(), ref) < TOL
    np.testing.assert_array_equal(dx_atomic.copy_to_host(), dx_gather.copy_to_host())


# --------------------------------------------------------------------------------------------- upsample
@pytest.mark.parametrize("shape", [(3, 5, 3, 4), (2, 3, 4, 4)])
@pytest.mark.parametrize("masked", [False, True])
def test_upsample(rng, shape, masked):
    n, c, h, w = shape
    x = rand(rng, *shape)
    out = poisoned(n, c, 2 * h, 2 * w)
    pool.upsample2x_forward(cuda.to_device(x), out, block=32)
    np.testing.assert_array_equal(out.copy_to_host(), F.upsample2x_forward(x))
    assert rel_err(out.copy_to_host(), pool.upsample2x_forward_ref(x)) < TOL
    dy = rand(rng, n, c, 2 * h, 2 * w)
    mask = rand(rng, *shape) if masked else None
    dx = poisoned(*shape)
    pool.upsample2x_backward(cuda.to_device(dy), dx, None if mask is None else cuda.to_device(mask), block=32)
    got = dx.copy_to_host()
    assert rel_err(got, pool.upsample2x_backward_ref(dy, mask)) < TOL
    if masked:
        assert not got[mask <= 0].any()
    else:
        assert rel_err(got, F.upsample2x_backward(dy)) < TOL


# --------------------------------------------------------------------------------------------- pool errors
def test_pool_shape_errors():
    x = cuda.to_device(np.ones((2, 3, 5, 7), np.float32))
    out = cuda.to_device(np.ones((2, 3, 2, 3), np.float32))
    argmax = cuda.to_device(np.zeros((2, 3, 2, 3), np.int8))
    fwd = pool.maxpool2x2_forward_v1
    with pytest.raises(ValueError,
                       match=r"maxpool2x2_forward_v1: out \(2, 3, 3, 3\).*\(2, 3, 2, 3\) for x \(2, 3, 5, 7\)"):
        fwd(x, cuda.to_device(np.ones((2, 3, 3, 3), np.float32)), argmax)
    with pytest.raises(ValueError, match="argmax must be int8"):
        fwd(x, out, out)
    with pytest.raises(ValueError, match="host NumPy array"):
        fwd(np.ones((2, 3, 5, 7), np.float32), out, argmax)
    with pytest.raises(ValueError, match="H and W at least 2"):
        fwd(cuda.to_device(np.ones((2, 3, 1, 7), np.float32)), cuda.to_device(np.ones((2, 3, 1, 3), np.float32)),
            argmax)
    with pytest.raises(ValueError, match="x must be 4-D"):
        fwd(cuda.to_device(np.ones((6, 5, 7), np.float32)), out, argmax)
    with pytest.raises(ValueError, match="C-contiguous"):
        fwd(cuda.to_device(np.ones((2, 3, 5, 9), np.float32))[:, :, :, :7], out, argmax)
    with pytest.raises(ValueError, match="block"):
        fwd(x, out, argmax, block=0)
    for name, launcher in pool.OPS["maxpool2x2_backward"].items():
        op = f"maxpool2x2_backward_{name}"
        with pytest.raises(ValueError, match=rf"{op}: dy \(2, 3, 2, 2\) and argmax \(2, 3, 2, 3\) must both be"):
            launcher(cuda.to_device(np.ones((2, 3, 2, 2), np.float32)), argmax, x)
        with pytest.raises(ValueError, match=rf"{op}: relu_mask \(2, 3, 5, 6\) must have dx's shape \(2, 3, 5, 7\)"):
            launcher(out, argmax, x, cuda.to_device(np.ones((2, 3, 5, 6), np.float32)))
        with pytest.raises(ValueError, match=rf"{op}: dx must be float32"):
            launcher(out, argmax, cuda.to_device(np.ones((2, 3, 5, 7))))
    with pytest.raises(ValueError, match=r"upsample2x_forward: out \(2, 3, 10, 13\) must be \(2, 3, 10, 14\)"):
        pool.upsample2x_forward(x, cuda.to_device(np.ones((2, 3, 10, 13), np.float32)))
    with pytest.raises(ValueError, match=r"upsample2x_backward: dy \(2, 3, 5, 7\) must be \(2, 3, 4, 6\)"):
        pool.upsample2x_backward(x, out)
    with pytest.raises(ValueError, match="upsample2x_backward: relu_mask"):
        pool.upsample2x_backward(cuda.to_device(np.ones((2, 3, 4, 6), np.float32)), out, x)
    assert set(pool.OPS) == {"maxpool2x2_forward", "maxpool2x2_backward", "upsample2x_forward",
                             "upsample2x_backward"}
    assert set(pool.OPS["maxpool2x2_backward"]) == {"atomic", "gather"}


# --------------------------------------------------------------------------------------------- mse
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (4, 37)])
@pytest.mark.parametrize("block", [8, 64])
def test_mse_loss_grad(rng, shape, block):
    pred, target = rand(rng, *shape), rand(rng, *shape)
    dpred, losses = poisoned(*shape), poisoned(shape[0])
    mse.mse_loss_grad(cuda.to_device(pred), cuda.to_device(target), dpred, losses, block=block)
    ref_d, ref_l = mse.mse_loss_grad_ref(pred, target)
    assert rel_err(dpred.copy_to_host(), ref_d) < TOL
    assert rel_err(losses.copy_to_host(), ref_l) < TOL
    # the CPU model's loss head: the mean of the per-sample losses is its loss, dpred its gradient
    assert rel_err(dpred.copy_to_host(), F.mse_backward(pred, target)) < TOL
    assert rel_err([losses.copy_to_host().mean()], [F.mse_forward(pred, target)]) < TOL


def test_mse_target_is_the_input_and_dpred_overwrites_pred(rng):
    """The autoencoder's target is its own input batch (one device array, also read elsewhere), and the
    gradient may overwrite the prediction in place."""
    shape = (3, 3, 5, 7)
    images, pred = np.abs(rand(rng, *shape)), rand(rng, *shape)
    d_images, d_pred = cuda.to_device(images), cuda.to_device(pred)
    losses = poisoned(3)
    mse.mse_loss_grad(d_pred, d_images, d_pred, losses, block=16)
    ref_d, ref_l = mse.mse_loss_grad_ref(pred, images)
    assert rel_err(d_pred.copy_to_host(), ref_d) < TOL
    assert rel_err(losses.copy_to_host(), ref_l) < TOL
    np.testing.assert_array_equal(d_images.copy_to_host(), images)


def test_mse_writes_losses_at_the_counted_step(rng):
    """softmax_ce_grad's convention: row r of the batch at step s goes to losses[(s * stride) % N + r]; one
    bound launch serves every step as the device counter advances (the partial last batch included)."""
    rows, stride, n = 3, 4, 11
    shape = (rows, 2, 3, 5)
    pred, target = rand(rng, *shape), rand(rng, *shape)
    losses = cuda.to_device(np.full(n, np.nan, np.float32))
    counter = cuda.to_device(np.array([2], np.int32))  # the partial last batch: rows 8..10
    dpred = poisoned(*shape)
    launch = mse.mse_loss_grad(cuda.to_device(pred), cuda.to_device(target), dpred, losses, block=16,
                               counter=counter, stride=stride)
    ref_d, ref_l = mse.mse_loss_grad_ref(pred, target)
    out = losses.copy_to_host()
    assert rel_err(out[8:], ref_l) < TOL
    assert np.isnan(out[:8]).all()  # nothing else written
    assert rel_err(dpred.copy_to_host(), ref_d) < TOL
    counter.copy_to_device(np.array([1], np.int32))
    launch()
    out = losses.copy_to_host()
    assert rel_err(out[4:7], ref_l) < TOL and np.isnan(out[:4]).all() and np.isnan(out[7]).all()
    # the same losses averaged on the device, as for cross-entropy
    mean = poisoned(1)
    sm.loss_mean(cuda.to_device(out[8:].copy()), mean, block=4)
    assert rel_err(mean.copy_to_host(), [F.mse_forward(pred, target)]) < TOL


def test_mse_shape_errors():
    a = cuda.to_device(np.ones((3, 2, 5), np.float32))
    losses = cuda.to_device(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"mse_loss_grad: shapes do not fit pred \(3, 2, 5\), target \(3, 10\)"):
        mse.mse_loss_grad(a, cuda.to_device(np.ones((3, 10), np.float32)), a, losses)
    with pytest.raises(ValueError, match=r"losses \(4,\)"):
        mse.mse_loss_grad(a, a, a, cuda.to_device(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        mse.mse_loss_grad(losses, losses, losses, losses)
    with pytest.raises(ValueError, match="host NumPy array"):
        mse.mse_loss_grad(a, np.ones((3, 2, 5), np.float32), a, losses)
    with pytest.raises(ValueError, match="power of two"):
        mse.mse_loss_grad(a, a, a, losses, block=48)
    with pytest.raises(ValueError, match="C-contiguous"):
        b = cuda.to_device(np.ones((3, 2, 7), np.float32))[:, :, :5]
        mse.mse_loss_grad(b, b, b, losses)
    counter = cuda.to_device(np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="stride 2 must be the full batch size"):
        mse.mse_loss_grad(a, a, a, cuda.to_device(np.ones(9, np.float32)), counter=counter, stride=2)
    assert set(mse.OPS) == {"mse_loss_grad"}


# --------------------------------------------------------------------------------------------- bench
def test_bench_pool_quick_problems_validate_and_time(capsys):
    """Every version of every pool/upsample/MSE op validates on the quick shapes, then goes through the
    benchmark's timing path (the simulator's host clock)."""
    problems = bench_pool.pool_problems(quick=True)
    kernels = {version for p in problems for version in p.versions}
    assert {k.split("+")[0] for k in kernels} == {
        *(f"maxpool2x2_forward_{v}" for v in pool.OPS["maxpool2x2_forward"]),
        *(f"maxpool2x2_backward_{v}" for v in pool.OPS["maxpool2x2_backward"]),
        *(f"upsample2x_forward_{v}" for v in pool.OPS["upsample2x_forward"]),
        *(f"upsample2x_backward_{v}" for v in pool.OPS["upsample2x_backward"]),
        *mse.OPS,
    }
    configurations = bench.validate(problems, [32])
    assert len(configurations) == len(problems)
    assert "all results match" in capsys.readouterr().out
    rows = bench.benchmark(problems[:2], [32], repeats=1, compare_torch=False)
    frame = bench.bench_frame(rows)
    assert list(frame["version"]) == ["maxpool2x2_forward_v1", "maxpool2x2_backward_atomic"]
    assert (frame["ms"] > 0).all() and (frame["gbps"] > 0).all()
    assert list(frame["rows"]) == [3, 3] and list(frame["cols"]) == [5 * 7 * 9] * 2


def test_bench_pool_catches_an_unwritten_argmax(monkeypatch):
    """argmax is poisoned with -1: a forward that writes only the values fails validation."""

    def values_only(x, out, argmax, block=256, stream=0, launch=True):
        scratch = cuda.to_device(np.zeros(argmax.shape, np.int8))
        return pool.maxpool2x2_forward_v1(x, out, scratch, block=block, stream=stream, launch=launch)

    problem = bench_pool.pool_problems(quick=True)[0]
    problem.versions = {"values_only": values_only}
    with pytest.raises(bench.BenchMismatch, match="output 'argmax'"):
        bench.validate([problem], [32])


# --------------------------------------------------------------------------------------------- real GPU
@pytest.mark.gpu
@pytest.mark.skipif(bool(config.ENABLE_CUDASIM), reason="needs a real GPU, not the CUDA simulator")
def test_gpu_pool_problems_at_the_models_shapes():
    """Every pool/upsample/MSE version at the CNN and autoencoder shapes (batch 64; 17 M elements for the
    first AE pool, so the grid-stride loops wrap), at small and large blocks."""
    problems = bench_pool.pool_problems(quick=False)
    configurations = bench.validate(problems, [64, 1024])
    assert len(configurations) == 2 * len(problems)
