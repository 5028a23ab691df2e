"""The ``phase`` forward of a conv on a 2x upsampled map (gpunn.kernels.conv.phase_up) against the float64
reference: tails of its row bands and channel chunks, the epilogues, determinism, refusals, and on a GPU the
autoencoder's last layer."""

import os
import zlib

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels.conv import phase_up as P
from gpunn.kernels.conv import upsampled as U

TOL = 1e-5


def _rand(key, *shape):
    a = np.random.default_rng(zlib.crc32(repr(key).encode())).standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return a


def _run(n, cin, cout, h, w, bias=True, relu=False):
    """(relative error against conv_forward_up_ref, the output) of one launch into a NaN-poisoned output."""
    key = (n, cin, cout, h, w, bias, relu)
    x, wt = _rand(("x", key), n, cin, h, w), _rand(("w", key), cout, cin, 3, 3)
    b = _rand(("b", key), cout) if bias else None
    out = cuda.to_device(np.full((n, cout, 2 * h, 2 * w), np.nan, np.float32))
    P.conv_forward_phase_up(cuda.to_device(x), cuda.to_device(wt), None if b is None else cuda.to_device(b), out, 1,
                            relu=relu)
    got = out.copy_to_host()
    ref = U.conv_forward_up_ref(x, wt, b, 1, relu)
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    return float(np.abs(got - ref).max() / np.abs(ref).max()), got


@pytest.mark.parametrize("n,cin,cout,h,w,bias,relu", [
    (2, 3, 3, 5, 3, True, False),   # a second band of one row: its pair's lower pixel and the band's tail
    (1, 2, 1, 2, 5, False, True),   # one output channel, no bias, ReLU, one band
    (1, 5, 4, 3, 2, True, True),    # four output channels, an odd map
])
def test_forward_matches_the_reference(n, cin, cout, h, w, bias, relu):
    assert _run(n, cin, cout, h, w, bias, relu)[0] < TOL


def test_channel_chunks_and_determinism(monkeypatch):
    """Channels staged two at a time (a tail chunk of one): the same result, bit for bit on a rerun."""
    monkeypatch.setattr(P, "FWD_CIC", 2)
    err, first = _run(1, 5, 3, 4, 3)
    assert err < TOL
    assert np.array_equal(first, _run(1, 5, 3, 4, 3)[1])


def test_fits_and_refusals():
    assert P.phase_forward_fits(256, 3, 3, 1, 32, 32)  # (the upsampled map's size, as every version's limits)
    assert not P.phase_forward_fits(256, 5, 3, 1, 32, 32)  # too many output channels
    assert not P.phase_forward_fits(256, 3, 1, 0, 32, 32)  # not 3x3, padding 1
    assert not P.phase_forward_fits(256, 3, 3, 1, 32, 2 * P.FWD_MAX_WIDTH + 2)
    assert not P.phase_forward_fits(256, 3, 3, 1, 31, 32)  # not an upsampled map
    x = cuda.to_device(np.zeros((1, 2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="Cout <= 4"):
        P.conv_forward_phase_up(x, cuda.to_device(np.zeros((5, 2, 3, 3), np.float32)), None,
                                cuda.to_device(np.zeros((1, 5, 6, 8), np.float32)), 1)
    with pytest.raises(ValueError, match="out must have shape"):
        P.conv_forward_phase_up(x, cuda.to_device(np.zeros((3, 2, 3, 3), np.float32)), None,
                                cuda.to_device(np.zeros((1, 3, 3, 4), np.float32)), 1)


_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
def test_gpu_autoencoder_last_layer():
    """256 -> 3 on 16x16 -> 32x32 at batch 8 with its bias, and an odd case with a partial last band and a tail
    chunk of channels."""
    assert _run(8, 256, 3, 16, 16)[0] < TOL
    assert _run(3, 45, 2, 7, 9, relu=True)[0] < TOL
