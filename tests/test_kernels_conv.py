"""Direct convolution kernels (gpunn.kernels.conv) against their float64 NumPy references.

Under the CUDA simulator the shapes are tiny and odd (N=3, Cin=3, Cout=5, 7x9 images; blocks and tiles that do
not divide the output); outputs are poisoned with NaN so unwritten elements fail, every test draws fresh
random non-zero inputs from its own seed, and the error is max|out - ref| / max|ref| against float64. The
``gpu``-marked tests (``pytest -m gpu``) run the warp-shuffle weight gradient and every version at larger
shapes on a real GPU.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from numba import config, cuda

from gpunn import bench
from gpunn.bench import conv as bench_conv
from gpunn.kernels import conv as C
from gpunn.kernels.launch import Launch, LaunchGroup

TOL = 1e-5
ON_GPU = not config.ENABLE_CUDASIM
# the simulator test shape: nothing a multiple of a tile, a block or COG
N, CIN, COUT, H, W = 3, 3, 5, 7, 9
# weight-gradient v2 runs one block per (co, ci) slice and split: fewer channels keep the simulator fast
WG_CIN, WG_COUT = 2, 3
# The simulator runs each thread of a block as a Python thread: small blocks keep it fast (on a GPU the
# launchers' defaults are used)
SIM_BLOCK = 32 if config.ENABLE_CUDASIM else None


OWN_BLOCK = "own"  # the implicit-GEMM and Winograd versions run their GEMM version's fixed block: pass none


def _block(block):
    if block == OWN_BLOCK:
        return {}
    block = SIM_BLOCK if block is None else block
    return {} if block is None else {"block": block}


def _blocks(version, blocks):
    """The block sizes to try for a version: its own fixed one for implicit_gemm (test_kernels_conv_gemm) and
    winograd (test_kernels_conv_winograd)."""
    return (OWN_BLOCK,) if version in ("implicit_gemm", "winograd") else blocks


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rand(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5  # never zero: keeps the ReLU masks and the relative errors well defined
    return a


def poisoned(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "output has NaN (an element was not written?)"
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def out_hw(h, w, k, p):
    return h + 2 * p - k + 1, w + 2 * p - k + 1


def run_forward(version, n, cin, cout, h, w, k, p, bias=True, relu=False, block=None, key=()):
    rng = _rng("forward", version, n, cin, cout, h, w, k, p, bias, relu, block, *key)
    x, wt = rand(rng, n, cin, h, w), rand(rng, cout, cin, k, k)
    b = rand(rng, cout) if bias else None
    out = poisoned(n, cout, *out_hw(h, w, k, p))
    kw = _block(block)
    launch = C.VERSIONS["forward"][version].launcher(cuda.to_device(x), cuda.to_device(wt),
                                                     None if b is None else cuda.to_device(b), out, p, relu=relu, **kw)
    assert isinstance(launch, (Launch, LaunchGroup))
    return rel_err(out.copy_to_host(), C.conv_forward_ref(x, wt, b, p, relu))


def run_backward_data(version, n, cin, cout, h, w, k, p, mask=False, block=None, key=()):
    rng = _rng("backward_data", version, n, cin, cout, h, w, k, p, mask, block, *key)
    dy, wt = rand(rng, n, cout, *out_hw(h, w, k, p)), rand(rng, cout, cin, k, k)
    relu_mask = rand(rng, n, cin, h, w) if mask else None
    dx = poisoned(n, cin, h, w)
    kw = _block(block)
    d_mask = None if relu_mask is None else cuda.to_device(relu_mask)
    C.VERSIONS["backward_data"][version].launcher(cuda.to_device(dy), cuda.to_device(wt), dx, p, relu_mask=d_mask, **kw)
    got = dx.copy_to_host()
    if mask:
        assert np.all(got[relu_mask <= 0] == 0.0)
    return rel_err(got, C.conv_backward_data_ref(dy, wt, (n, cin, h, w), p, relu_mask))


def run_backward_weight(version, n, cin, cout, h, w, k, p, key=(), **kw):
    kw = {**_block(kw.pop("block", None)), **kw}
    rng = _rng("backward_weight", version, n, cin, cout, h, w, k, p, *key)
    x, dy = rand(rng, n, cin, h, w), rand(rng, n, cout, *out_hw(h, w, k, p))
    dw = poisoned(cout, cin, k, k)
    C.VERSIONS["backward_weight"][version].launcher(cuda.to_device(x), cuda.to_device(dy), dw, p, **kw)
    return rel_err(dw.copy_to_host(), C.conv_backward_weight_ref(x, dy, k, p))


# --------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("padding, bias, relu", [(0, True, True), (1, True, False), (1, False, True)])
@pytest.mark.parametrize("version", ["naive", "tiled"])
def test_forward(version, padding, bias, relu):
    assert run_forward(version, N, CIN, COUT, H, W, 3, padding, bias, relu) < TOL


@pytest.mark.parametrize("k, padding", [(1, 0), (5, 1), (3, 3)])
@pytest.mark.parametrize("version", ["naive", "tiled"])
def test_forward_kernel_sizes_and_wide_padding(version, k, padding):
    # k = 1 and 5; padding 3 > k - 1: outputs whose whole window lies in the padding (bias only)
    assert run_forward(version, 2, CIN, COUT, 6, 5, k, padding) < TOL


@pytest.mark.parametrize("version, block", [("naive", 48), ("tiled", 48), ("tiled", (4, 3))])
def test_forward_blocks_that_do_not_divide_the_output(version, block):
    # 48 threads: 1.5 warps; tiled 48 -> a 16x3 tile; (4, 3): tiles straddle every edge of the 7x9 output
    assert run_forward(version, N, CIN, COUT, H, W, 3, 1, relu=True, block=block) < TOL


def test_channel_group():
    assert [C.channel_group(c) for c in (1, 2, 3, 5, 8, 9, 300)] == [1, 2, 4, 8, 8, 8, 8]


@pytest.mark.parametrize("cin, cout", [(1, 5), (2, 1)])
def test_tiled_few_output_channels(cin, cout):
    """The tiled kernels' channel group shrinks to the output's channels: 1 (the input gradient of a
    1-channel image; a 1-channel forward) and 2, where the group of 8 would compute 7 or 6 channels for
    nothing."""
    assert run_forward("tiled", 2, cin, cout, H, W, 3, 1) < TOL
    assert run_backward_data("tiled", 2, cin, cout, H, W, 3, 1, True) < TOL


def test_tile_shape():
    assert C.tile_shape(256, 26) == (32, 8)
    assert C.tile_shape(256, 8) == (8, 32)
    assert C.tile_shape(48, 9) == (16, 3)  # the width divides the thread count
    assert C.tile_shape((4, 3), 9) == (4, 3)


# --------------------------------------------------------------------------------------------- backward-data
@pytest.mark.parametrize("padding, mask", [(0, False), (1, True), (0, True)])
@pytest.mark.parametrize("version", ["naive", "tiled"])
def test_backward_data(version, padding, mask):
    assert run_backward_data(version, N, CIN, COUT, H, W, 3, padding, mask) < TOL


@pytest.mark.parametrize("k, padding", [(1, 0), (5, 2), (3, 3)])
@pytest.mark.parametrize("version", ["naive", "tiled"])
def test_backward_data_kernel_sizes_and_wide_padding(version, k, padding):
    # padding 3 > k - 1: the tiled kernel's offset k - 1 - p is negative; (4, 3) tiles straddle the edges
    block = (4, 3) if version == "tiled" else None
    assert run_backward_data(version, 2, CIN, COUT, 6, 5, k, padding, mask=True, block=block) < TOL


# --------------------------------------------------------------------------------------------- backward-weight
@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("version", ["naive", "block", "deterministic", "atomic"])
def test_backward_weight(version, padding):
    # auto splits at these shapes: one per image, so block sums with atomics and deterministic in two passes
    assert run_backward_weight(version, 2, WG_CIN, WG_COUT, H, W, 3, padding) < TOL


@pytest.mark.parametrize("k, padding", [(1, 0), (5, 2)])
def test_backward_weight_kernel_sizes(k, padding):
    assert run_backward_weight("naive", 2, CIN, COUT, 6, 5, k, padding) < TOL
    assert run_backward_weight("block", 2, 1, 2, 6, 5, k, padding, splits=1) < TOL


@pytest.mark.parametrize("w", [3, 4, 11])
def test_naive_weight_gradient_rounds_of_four_columns(w):
    """naive's column loop in rounds of four plus a tail, its first and last columns clipped by the padding: rows
    with no round (3 columns inside the image), exactly one, and two with a tail; padding 3 > k - 1."""
    assert run_backward_weight("naive", 1, 2, 3, 4, w, 3, 3) < TOL


def run_backward_weight_bias(version, n, cin, cout, h, w, k, p, key=(), **kw):
    """A weight-gradient version's with_bias launcher (dw and db in one pass): the errors of dw and db."""
    kw = {**_block(kw.pop("block", None)), **kw}
    rng = _rng("backward_weight_bias", version, n, cin, cout, h, w, k, p, *key)
    x, dy = rand(rng, n, cin, h, w), rand(rng, n, cout, *out_hw(h, w, k, p))
    dw, db = poisoned(cout, cin, k, k), poisoned(cout)
    launch = C.VERSIONS["backward_weight"][version].with_bias(cuda.to_device(x), cuda.to_device(dy), dw, db, p, **kw)
    assert isinstance(launch, (Launch, LaunchGroup))
    return (rel_err(dw.copy_to_host(), C.conv_backward_weight_ref(x, dy, k, p)),
            rel_err(db.copy_to_host(), C.conv_bias_grad_ref(dy)))


@pytest.mark.parametrize("version", ["naive", "atomic"])
@pytest.mark.parametrize("k, padding, block", [(3, 1, None), (1, 0, 4), (5, 2, None)])
def test_weight_and_bias_gradient_in_one_launch_or_pass(version, k, padding, block):
    """naive: one thread per weight and one per channel in one launch; atomic (one thread per dy element): dw and db
    zeroed by its first launch, then both from one pass. 4 threads: the grid-stride loops wrap, the bias threads'
    indices among the weights'."""
    dw_err, db_err = run_backward_weight_bias(version, 2, WG_CIN, WG_COUT, 5, 6, k, padding, block=block)
    assert dw_err < TOL and db_err < TOL


def test_fitted_threads_shrink_the_tile_to_small_outputs():
    assert C.fitted_threads(26, 26) == C.fitted_threads(24, 24) == 256  # the CNN: 32 x 8 tiles as before
    assert C.fitted_threads(6, 6) == 64  # an 8x8 tile, not 256 threads for 36 outputs
    assert C.fitted_threads(8, 8) == 64 and C.fitted_threads(16, 16) == 256
    assert C.fitted_threads(1, 3) == C.WARP  # never below a warp
    assert C.tile_shape(C.fitted_threads(6, 6), 6) == (8, 8)


def test_weight_grad_splits():
    assert C.weight_grad_splits(64, 16) == (64, 1)  # CNN conv1: 16 slices -> one image per block
    assert C.weight_grad_splits(64, 512) == (2, 32)
    assert C.weight_grad_splits(64, 256 * 128) == (1, 64)
    assert C.weight_grad_splits(3, 6, splits=2) == (2, 2)  # whole images per split, none empty
    assert C.weight_grad_splits(5, 1, splits=4) == (3, 2)


def test_deterministic_weight_gradient_is_bit_identical_across_runs():
    rng = _rng("determinism")
    x, dy = rand(rng, 2, WG_CIN, H, W), rand(rng, 2, WG_COUT, H, W)
    results = []
    for _ in range(2):
        dw = poisoned(WG_COUT, WG_CIN, 3, 3)
        launch = C.conv_backward_weight_deterministic(cuda.to_device(x), cuda.to_device(dy), dw, 1, **_block(None),
                                                      splits=2)
        assert isinstance(launch, LaunchGroup)  # partial sums, then their fixed-order sum
        results.append(dw.copy_to_host())
    np.testing.assert_array_equal(results[0], results[1])
    assert rel_err(results[0], C.conv_backward_weight_ref(x, dy, 3, 1)) < TOL


def test_shuffle_weight_gradient_refuses_the_simulator():
    if ON_GPU:
        pytest.skip("simulator only")
    x, dy = cuda.to_device(np.ones((1, 1, 3, 3), np.float32)), cuda.to_device(np.ones((1, 1, 1, 1), np.float32))
    with pytest.raises(ValueError, match="conv_backward_weight_shuffle: warp shuffles need a real GPU"):
        C.conv_backward_weight_shuffle(x, dy, cuda.to_device(np.ones((1, 1, 3, 3), np.float32)), 0)
    assert "shuffle" not in C.runnable_versions("backward_weight")


# --------------------------------------------------------------------------------------------- bias gradient
@pytest.mark.parametrize("version, block", [("naive", 3), ("block", 32), ("split", 32), ("atomic", 48)])
def test_bias_grad(version, block):
    rng = _rng("bias_grad", version)
    dy = rand(rng, N, COUT, H, W)
    db = poisoned(COUT)
    C.VERSIONS["bias_grad"][version].launcher(cuda.to_device(dy), db, block=block)
    assert rel_err(db.copy_to_host(), C.conv_bias_grad_ref(dy)) < TOL


def run_split_bias_grad(shape, splits, block, dy_view=None, key=()):
    """v3 on dy of `shape` (or the given (host, device view) pair); returns (db, the launch, the error)."""
    if dy_view is None:
        dy = rand(_rng("split bias", shape, splits, block, *key), *shape)
        d_dy = cuda.to_device(dy)
    else:
        dy, d_dy = dy_view
    db = poisoned(shape[1])
    launch = C.conv_bias_grad_split(d_dy, db, block=block, splits=splits)
    got = db.copy_to_host()
    return got, launch, rel_err(got, C.conv_bias_grad_ref(dy))


@pytest.mark.parametrize("shape, splits, block, used", [
    ((3, 5, 7, 9), 1, 32, 1),     # one launch writing db
    ((3, 5, 7, 9), 2, 4, 2),      # 2 + 1 images; 4 threads: many unrolled groups of 4 loads, then the tail
    ((3, 5, 7, 9), 3, 16, 3),     # one image per split
    ((3, 5, 7, 9), None, 8, 2),   # the automatic count under the simulator: SIMULATOR_BIAS_SPLITS
    ((2, 3, 5, 5), 2, 32, 2),     # 32 threads > the 25-element plane: the stride carries whole images
    ((2, 3, 5, 5), 5, 64, 2),     # more splits asked than images: one per image
])
def test_split_bias_grad(shape, splits, block, used):
    got, launch, err = run_split_bias_grad(shape, splits, block)
    assert err < TOL
    assert isinstance(launch, Launch if used == 1 else LaunchGroup)
    assert f"[splits{used}]" in (launch if used == 1 else launch.launches[0]).name


def test_split_bias_grad_is_deterministic_and_replays():
    rng = _rng("split bias determinism")
    dy = rand(rng, 3, 5, 7, 9)
    d_dy = cuda.to_device(dy)
    db = poisoned(5)
    group = C.conv_bias_grad_split(d_dy, db, block=16, splits=3, launch=False)
    assert isinstance(group, LaunchGroup) and np.isnan(db.copy_to_host()).all()  # launch=False: nothing ran
    results = []
    for _ in range(2):
        db.copy_to_device(np.full(5, np.nan, np.float32))
        group()
        results.append(db.copy_to_host())
    np.testing.assert_array_equal(results[0], results[1])
    assert rel_err(results[0], C.conv_bias_grad_ref(dy)) < TOL
    d_dy.copy_to_device(-dy)  # a replay reads the arrays' current contents
    group()
    np.testing.assert_array_equal(db.copy_to_host(), -results[0])


def test_split_bias_grad_strided_views():
    """dy: channels 1..5 and every other column of a wider tensor; db: a slice of a larger (parameter-gradient
    like) buffer, whose other elements stay NaN."""
    rng = _rng("split bias strided")
    big = rand(rng, 3, 7, 5, 14)
    view = cuda.to_device(big)[:, 1:6, :, ::2]
    assert not view.is_c_contiguous()
    dy = big[:, 1:6, :, ::2]
    for splits in (1, 2):
        buf = poisoned(9)
        C.conv_bias_grad_split(view, buf[2:7], block=8, splits=splits)
        got = buf.copy_to_host()
        assert rel_err(got[2:7], C.conv_bias_grad_ref(dy)) < TOL, splits
        assert np.isnan(got[:2]).all() and np.isnan(got[7:]).all()  # nothing outside the view


def test_bias_grad_splits():
    assert C.bias_grad_splits(64, 16, multiprocessors=132) == (32, 2)  # CNN conv1: 512 blocks
    assert C.bias_grad_splits(64, 32, multiprocessors=132) == (16, 4)  # CNN conv2: 512 blocks
    assert C.bias_grad_splits(64, 256, multiprocessors=132) == (3, 22)  # AE 256 channels: 3 splits of 22 + 22 + 20
    assert C.bias_grad_splits(64, 1024, multiprocessors=132) == (1, 64)  # many channels: one launch
    assert C.bias_grad_splits(64, 3, multiprocessors=132) == (64, 1)  # at most one split per image
    assert C.bias_grad_splits(5, 2, splits=4) == (3, 2)  # whole images, none empty
    if not ON_GPU:
        assert C.bias_grad_splits(64, 16) == (C.SIMULATOR_BIAS_SPLITS, 32)


# --------------------------------------------------------------------------------------------- v4 staged
@pytest.mark.parametrize("cin, cout, h, w, padding", [(3, 5, 5, 6, 1), (5, 2, 7, 5, 0), (1, 3, 4, 7, 2)])
@pytest.mark.parametrize("splits", [None, 1, 2])
def test_staged_weight_gradient_narrow_input_or_output(cin, cout, h, w, padding, splits):
    # a narrow input side (all planes staged, block per output channel), a narrow output side (one plane staged,
    # block per input channel), padding wider than k - 1; 3 images in 1, 2 or (the simulator's default) 2 splits
    assert run_backward_weight("staged", 3, cin, cout, h, w, 3, padding, block=32, splits=splits) < TOL


def test_staged_weight_gradient_refuses_layers_without_a_narrow_side():
    assert C.staged_fits(3, 256, 3, 1, 32, 32) and C.staged_fits(256, 3, 3, 1, 32, 32)
    assert not C.staged_fits(16, 32, 3, 0, 26, 26) and not C.staged_fits(1, 16, 3, 0, 200, 200)
    assert "staged" not in C.runnable_versions("backward_weight", (16, 32, 3, 0, 26, 26))
    assert "staged" in C.runnable_versions("backward_weight", (3, 256, 3, 1, 32, 32))
    with pytest.raises(ValueError, match="a 5 -> 6 layer on 4x4 inputs has no narrow side of at most 4 channels"):
        run_backward_weight("staged", 1, 5, 6, 4, 4, 3, 1)


# --------------------------------------------------------------------------------------------- layouts, replay
def test_strided_weight_views_and_replay():
    """w and dw as non-contiguous views (columns of a wider parameter block); a bound launch replays on the
    arrays' current contents."""
    rng = _rng("strided")
    x = rand(rng, 2, CIN, 5, 6)
    block_w = rand(rng, WG_COUT, CIN + 2, 3, 3)
    w_view = cuda.to_device(block_w)[:, 1:CIN + 1]
    assert not w_view.is_c_contiguous()
    wt = block_w[:, 1:CIN + 1]
    for version, spec in C.VERSIONS["forward"].items():
        d_x = cuda.to_device(x)
        out = poisoned(2, WG_COUT, 5, 6)
        own_block = not spec.takes_threads  # runs its GEMM version's fixed block (test_kernels_conv_gemm)
        launch = spec.launcher(d_x, w_view, None, out, 1, launch=False, **({} if own_block else _block(None)))
        assert np.isnan(out.copy_to_host()).all()  # launch=False: nothing ran
        launch()
        assert rel_err(out.copy_to_host(), C.conv_forward_ref(x, wt, None, 1)) < TOL, version
        d_x.copy_to_device(-x)
        launch()
        assert rel_err(out.copy_to_host(), C.conv_forward_ref(-x, wt, None, 1)) < TOL, version
    dy = rand(rng, 2, WG_COUT, 5, 6)
    dx = poisoned(2, CIN, 5, 6)
    C.conv_backward_data_tiled(cuda.to_device(dy), w_view, dx, 1, **_block(None))
    assert rel_err(dx.copy_to_host(), C.conv_backward_data_ref(dy, wt, x.shape, 1)) < TOL
    for version in ("naive", "block", "atomic"):
        dw_block = cuda.to_device(np.full((WG_COUT, CIN + 2, 3, 3), np.nan, np.float32))
        dw_view = dw_block[:, 1:CIN + 1]
        kw = {**_block(None), **({"splits": 2} if version == "block" else {})}  # zeroing + atomics on a view
        C.VERSIONS["backward_weight"][version].launcher(cuda.to_device(x), cuda.to_device(dy), dw_view, 1, **kw)
        got = dw_block.copy_to_host()
        assert rel_err(got[:, 1:CIN + 1], C.conv_backward_weight_ref(x, dy, 3, 1)) < TOL, version
        assert np.isnan(got[:, 0]).all() and np.isnan(got[:, CIN + 1]).all()  # nothing outside the view


# --------------------------------------------------------------------------------------------- errors
def _dev(*shape):
    return cuda.to_device(np.ones(shape, np.float32))


@pytest.mark.parametrize("version", ["naive", "tiled"])
def test_forward_shape_errors(version):
    fn = C.VERSIONS["forward"][version].launcher
    op = f"conv_forward_{version}"
    x, w, b = _dev(2, 3, 7, 9), _dev(5, 3, 3, 3), _dev(5)
    with pytest.raises(ValueError, match=rf"{op}: x\(2, 4, 7, 9\).*has 4 channels, w expects Cin = 3"):
        fn(_dev(2, 4, 7, 9), w, b, _dev(2, 5, 5, 7), 0)
    with pytest.raises(ValueError, match=rf"{op}: .*out\(2, 5, 7, 9\): out must be \(2, 5, 5, 7\)"):
        fn(x, w, b, _dev(2, 5, 7, 9), 0)
    with pytest.raises(ValueError, match=rf"{op}: w \(5, 3, 2, 2\) must be \(Cout, Cin, k, k\) with one odd k"):
        fn(x, _dev(5, 3, 2, 2), b, _dev(2, 5, 6, 8), 0)
    with pytest.raises(ValueError, match=rf"{op}: x is a host NumPy array"):
        fn(np.ones((2, 3, 7, 9), np.float32), w, b, _dev(2, 5, 5, 7), 0)
    with pytest.raises(ValueError, match=rf"{op}: bias must be \(5,\)"):
        fn(x, w, _dev(4), _dev(2, 5, 5, 7), 0)
    with pytest.raises(ValueError, match=rf"{op}: padding must be a non-negative int"):
        fn(x, w, b, _dev(2, 5, 9, 11), -1)
    with pytest.raises(ValueError, match=rf"{op}: .*the 2x2 input with padding 0 is smaller than the 3x3 kernel"):
        fn(_dev(1, 3, 2, 2), w, b, _dev(1, 5, 1, 1), 0)
    with pytest.raises(ValueError, match=rf"{op}: x must be float32"):
        fn(cuda.to_device(np.ones((2, 3, 7, 9))), w, b, _dev(2, 5, 5, 7), 0)


def test_pass_shape_errors():
    dy, w = _dev(2, 5, 5, 7), _dev(5, 3, 3, 3)
    with pytest.raises(ValueError, match=r"conv_backward_data_tiled: .*dy\(2, 5, 5, 7\): dy must be \(2, 5, 7, 9\)"):
        C.conv_backward_data_tiled(dy, w, _dev(2, 3, 7, 9), 1)
    with pytest.raises(ValueError, match=r"conv_backward_data_naive: relu_mask must have dx's shape \(2, 3, 7, 9\)"):
        C.conv_backward_data_naive(dy, w, _dev(2, 3, 7, 9), 0, relu_mask=_dev(2, 3, 7, 8))
    with pytest.raises(ValueError, match=r"conv_backward_weight_block: .*dw expects Cin = 4"):
        C.conv_backward_weight_block(_dev(2, 3, 7, 9), dy, _dev(5, 4, 3, 3), 0)
    with pytest.raises(ValueError, match=r"conv_backward_weight_naive: dw \(5, 3, 4, 4\) .* one odd k"):
        C.conv_backward_weight_naive(_dev(2, 3, 7, 9), dy, _dev(5, 3, 4, 4), 0)
    with pytest.raises(ValueError, match=r"conv_backward_weight_deterministic: splits must be a positive int"):
        C.conv_backward_weight_deterministic(_dev(2, 3, 7, 9), dy, _dev(5, 3, 3, 3), 0, splits=0)
    with pytest.raises(ValueError, match=r"conv_backward_weight_block: block must be a power of two"):
        C.conv_backward_weight_block(_dev(2, 3, 7, 9), dy, _dev(5, 3, 3, 3), 0, block=48)
    with pytest.raises(ValueError, match=r"conv_bias_grad_block: db must be \(5,\)"):
        C.conv_bias_grad_block(dy, _dev(4))
    with pytest.raises(ValueError, match=r"conv_bias_grad_naive: dy is a host NumPy array"):
        C.conv_bias_grad_naive(np.ones((2, 5, 5, 7), np.float32), _dev(5))
    with pytest.raises(ValueError, match=r"conv_bias_grad_split: splits must be a positive int or None"):
        C.conv_bias_grad_split(dy, _dev(5), splits=0)
    with pytest.raises(ValueError, match=r"conv_bias_grad_split: block must be a power of two"):
        C.conv_bias_grad_split(dy, _dev(5), block=48)
    with pytest.raises(ValueError, match=r"conv_forward_tiled: block must be a thread count or \(TW, TH\)"):
        C.conv_forward_tiled(_dev(2, 3, 7, 9), w, None, dy, 0, block=(4, 0))
    with pytest.raises(ValueError, match=r"conv_forward_tiled: .*does not fit in 49152 bytes of shared memory"):
        C.conv_forward_tiled(_dev(1, 1, 5, 5), _dev(1, 1, 81, 81), None, _dev(1, 1, 5, 5), 40, block=(32, 32))


def test_registry():
    assert set(C.VERSIONS) == set(C.PASSES)
    assert set(C.VERSIONS["backward_weight"]) >= {"naive", "block", "shuffle", "deterministic"}
    assert [(p, n) for p, table in C.VERSIONS.items() for n, v in table.items() if v.needs_gpu] == [
        ("backward_weight", "shuffle")]
    assert C.conv_launcher("forward", "tiled") is C.conv_forward_tiled
    with pytest.raises(ValueError, match=r"conv: unknown backward_data version 'x'; choose from \['naive'"):
        C.conv_launcher("backward_data", "x")
    with pytest.raises(ValueError, match="conv: unknown pass"):
        C.conv_launcher("sideways", "naive")


# --------------------------------------------------------------------------------------------- bench path
def test_every_version_validates_through_the_bench(capsys):
    problems = bench_conv.conv_problems(quick=True)
    assert {p.op for p in problems} == {f"conv_{name}" for name in C.PASSES}
    configurations = bench.validate(problems, [32])
    assert "all results match" in capsys.readouterr().out
    validated = {(c.problem.op, c.version) for c in configurations}
    assert validated == {(f"conv_{name}", version) for name in C.PASSES for version in C.runnable_versions(name)}


# --------------------------------------------------------------------------------------------- real GPU
GPU_SHAPE = (8, 19, 21, 30, 33)  # N, Cin, Cout, H, W: larger, still odd


@pytest.mark.gpu
@pytest.mark.parametrize("padding", [0, 1])
def test_shuffle_weight_gradient_gpu(padding):
    for splits in (1, 3, None):
        assert run_backward_weight("shuffle", N, CIN, COUT, H, W, 3, padding, splits=splits) < TOL
    for block in (32, 256, 1024):
        assert run_backward_weight("shuffle", *GPU_SHAPE, 3, padding, key=("gpu",), block=block) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("padding", [0, 1])
def test_every_version_gpu_sizes(padding):
    for version in C.VERSIONS["forward"]:
        for block in _blocks(version, (64, 256, 1024)):
            assert run_forward(version, *GPU_SHAPE, 3, padding, relu=True, block=block, key=("gpu",)) < TOL
    for version in C.VERSIONS["backward_data"]:
        for block in _blocks(version, (64, 256, 1024)):
            assert run_backward_data(version, *GPU_SHAPE, 3, padding, mask=True, block=block, key=("gpu",)) < TOL
    n, cin, cout, h, w = GPU_SHAPE
    for version in C.runnable_versions("backward_weight", (cin, cout, 3, padding, h, w)):
        for block in _blocks(version, (64, 256, 1024)):
            assert run_backward_weight(version, *GPU_SHAPE, 3, padding, block=block, key=("gpu",)) < 1e-4
    for shape in ((8, 3, 37, 21, 19), (8, 37, 3, 21, 19)):  # the staged version's narrow input, narrow output
        for block in (64, 256, 1024):
            assert run_backward_weight("staged", *shape, 3, padding, block=block, key=("gpu",)) < 1e-4
    for version in C.VERSIONS["bias_grad"]:
        rng = _rng("gpu bias", version)
        dy = rand(rng, 64, 33, 26, 26)
        db = poisoned(33)
        C.VERSIONS["bias_grad"][version].launcher(cuda.to_device(dy), db)
        assert rel_err(db.copy_to_host(), C.conv_bias_grad_ref(dy)) < 1e-4


@pytest.mark.gpu
def test_kernel_size_5_with_1024_threads_gpu():
    """k = 5: 25 sums, reduced in several trees when 1024 threads leave shared memory for only 11 rows."""
    for version in ("block", "deterministic", "shuffle"):
        assert run_backward_weight(version, 4, 5, 6, 20, 21, 5, 2, block=1024, splits=2) < 1e-4
    for version in C.runnable_versions("forward", (5, 6, 5, 2, 20, 21)):
        (block,) = _blocks(version, (1024,))
        assert run_forward(version, 4, 5, 6, 20, 21, 5, 2, block=block) < TOL
    for version in C.runnable_versions("backward_data", (5, 6, 5, 2, 20, 21)):
        (block,) = _blocks(version, (1024,))
        assert run_backward_data(version, 4, 5, 6, 20, 21, 5, 2, mask=True, block=block) < TOL


@pytest.mark.gpu
def test_deterministic_bit_identical_and_atomics_close_gpu():
    rng = _rng("gpu determinism")
    x, dy = rand(rng, 64, 16, 26, 26), rand(rng, 64, 32, 24, 24)
    runs = {}
    for version in ("deterministic", "block", "shuffle"):
        runs[version] = []
        for _ in range(3):
            dw = poisoned(32, 16, 3, 3)
            C.VERSIONS["backward_weight"][version].launcher(cuda.to_device(x), cuda.to_device(dy), dw, 0, splits=16)
            runs[version].append(dw.copy_to_host())
    for again in runs["deterministic"][1:]:
        np.testing.assert_array_equal(runs["deterministic"][0], again)
    ref = C.conv_backward_weight_ref(x, dy, 3, 0)
    for version, results in runs.items():
        assert rel_err(results[0], ref) < 1e-4, version


@pytest.mark.gpu
@pytest.mark.parametrize("n, cin, cout, h, w", [(64, 1, 16, 28, 28), (64, 16, 32, 26, 26)])
def test_weight_and_bias_gradients_cnn_shapes_gpu(n, cin, cout, h, w):
    """The CNN's conv1 and conv2 at batch 64 (36 864 to 43 264 terms per weight): naive's and atomic's dw and db in
    one launch or pass, atomic's each alone, float32-close to float64 at every block."""
    for block in (64, 256, 1024):
        for version in ("naive", "atomic"):
            errors = run_backward_weight_bias(version, n, cin, cout, h, w, 3, 0, block=block, key=("gpu",))
            assert max(errors) < 1e-4, (version, block)
        assert run_backward_weight("atomic", n, cin, cout, h, w, 3, 0, block=block, key=("gpu",)) < 1e-4
    rng = _rng("gpu atomic bias", cout)
    dy = rand(rng, n, cout, h - 2, w - 2)
    db = poisoned(cout)
    C.conv_bias_grad_atomic(cuda.to_device(dy), db)
    assert rel_err(db.copy_to_host(), C.conv_bias_grad_ref(dy)) < 1e-4


@pytest.mark.gpu
def test_split_bias_grad_gpu():
    """The CNN's bias gradients with the device's split count: bit-identical runs, float32-close to float64."""
    rng = _rng("gpu split bias")
    for shape in ((64, 16, 26, 26), (64, 32, 24, 24)):
        dy = rand(rng, *shape)
        d_dy = cuda.to_device(dy)
        for block in (64, 256, 1024):
            runs = []
            for _ in range(2):
                db = poisoned(shape[1])
                C.conv_bias_grad_split(d_dy, db, block=block)
                runs.append(db.copy_to_host())
            np.testing.assert_array_equal(runs[0], runs[1])
            assert rel_err(runs[0], C.conv_bias_grad_ref(dy)) < 1e-4, (shape, block)
