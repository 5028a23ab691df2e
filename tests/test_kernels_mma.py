"""The tensor-core MMA (gpunn.kernels.mma): its roundings against independent float64 formulas, the emulation
against the fragment layout written out lane by lane, and kernels calling the MMA (under the simulator: the
emulation's warp exchange; on a GPU, the same tests check that the hardware agrees with the emulation bit for bit
on the roundings and to float32 rounding on the products)."""

import numpy as np
import pytest
from numba import cuda, float32

from gpunn.kernels import mma as M


def _rng(*key):
    return np.random.default_rng([ord(c) for c in "".join(map(str, key))])


def _ties_and_randoms(rng, n=2000):
    """Random float32 of many magnitudes, plus values exactly halfway between two TF32 and two BF16 numbers."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    bits = x.view(np.uint32)
    tf32_ties = ((bits & np.uint32(0xFFFFE000)) | np.uint32(0x1000)).view(np.float32)
    bf16_ties = ((bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)
    return np.concatenate([x, tf32_ties, bf16_ties, np.float32([0.0, -0.0, 1.0, -1.5])])


def _round_reference(x, mantissa_bits, ties):
    """Nearest number with `mantissa_bits` explicit mantissa bits, in float64: ties away from zero or to even."""
    x = x.astype(np.float64)
    mag = np.abs(x)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    ulp = np.exp2(exp - mantissa_bits)
    q = mag / ulp
    r = np.floor(q + 0.5) if ties == "away" else np.round(q)
    return np.where(mag > 0, np.sign(x) * r * ulp, x)


def test_round_tf32_is_nearest_ties_away():
    x = _ties_and_randoms(_rng("tf32"))
    got = M.round_tf32(x)
    assert np.array_equal(got.astype(np.float64), _round_reference(x, 10, "away"))
    assert not np.any(got.view(np.uint32) & np.uint32(0x1FFF))  # 13 low bits clear: a TF32 number
    assert np.isinf(M.round_tf32(np.float32([np.inf]))[0]) and np.isnan(M.round_tf32(np.float32([np.nan]))[0])


def test_round_bf16_is_nearest_even():
    x = _ties_and_randoms(_rng("bf16"))
    got = M.round_bf16(x)
    assert np.array_equal(got.astype(np.float64), _round_reference(x, 7, "even"))
    assert np.isnan(M.round_bf16(np.float32([np.nan]))[0])


def _pair(lo, hi) -> int:
    """Two float32 as one register of two BF16 (lo in the low half), through the host rounding."""
    bits = M._bf16_bits(np.float32([lo, hi])).astype(np.uint32)
    return int(bits[0] | (bits[1] << np.uint32(16)))


def _fragments(fmt, a, b, c):
    """Lane-by-lane fragments of A (16 x K), B (K x 8), C (16 x 8), as the PTX ISA's fragment tables give them."""
    a_frag = np.zeros((32, 4), np.float32 if fmt == "tf32" else np.uint32)
    b_frag = np.zeros((32, 2), a_frag.dtype)
    c_frag = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if fmt == "tf32":
            a_frag[lane] = [a[g, t], a[g + 8, t], a[g, t + 4], a[g + 8, t + 4]]
            b_frag[lane] = [b[t, g], b[t + 4, g]]
        else:
            a_frag[lane] = [_pair(a[g, 2 * t], a[g, 2 * t + 1]), _pair(a[g + 8, 2 * t], a[g + 8, 2 * t + 1]),
                            _pair(a[g, 2 * t + 8], a[g, 2 * t + 9]), _pair(a[g + 8, 2 * t + 8], a[g + 8, 2 * t + 9])]
            b_frag[lane] = [_pair(b[2 * t, g], b[2 * t + 1, g]), _pair(b[2 * t + 8, g], b[2 * t + 9, g])]
        c_frag[lane] = [c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]]
    return a_frag, b_frag, c_frag


def _unfragment(d_frag):
    d = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = d_frag[lane]
    return d


def _problem(fmt, rng):
    k = M.MMA_SHAPES[fmt][2]
    a = rng.standard_normal((16, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    round_ = M.round_tf32 if fmt == "tf32" else M.round_bf16
    a, b = round_(a), round_(b)
    return a, b, c, a.astype(np.float64) @ b.astype(np.float64) + c


@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_emulation_matches_the_layout_tables(fmt):
    a, b, c, ref = _problem(fmt, _rng("layout", fmt))
    d = _unfragment(M.emulate_mma(fmt, *_fragments(fmt, a, b, c)))
    assert np.max(np.abs(d - ref)) / np.max(np.abs(ref)) < 1e-6


def test_emulated_tf32_truncates_unrounded_inputs():
    """The tensor core reads a float32's 19 high bits: an input not rounded first is truncated, not rounded."""
    a = np.full((16, 8), np.float32(1 + 2**-11 + 2**-12))  # rounds up to 1 + 2**-10, truncates to 1
    b = np.zeros((8, 8), np.float32)
    b[0, :] = 1.0
    d = _unfragment(M.emulate_mma("tf32", *_fragments("tf32", a, b, np.zeros((16, 8), np.float32))))
    assert np.all(d == 1.0)


def _mma_kernel(fmt, rounds):
    """Each warp: loads its lanes' fragments, runs `rounds` MMAs accumulating into D (D = A B rounds times + C)."""
    op = M.mma_tf32 if fmt == "tf32" else M.mma_bf16

    @cuda.jit
    def kernel(a_frag, b_frag, c_frag, d_frag):
        w = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        d0, d1, d2, d3 = c_frag[w, lane, 0], c_frag[w, lane, 1], c_frag[w, lane, 2], c_frag[w, lane, 3]
        for _ in range(rounds):
            d0, d1, d2, d3 = op(a_frag[w, lane, 0], a_frag[w, lane, 1], a_frag[w, lane, 2], a_frag[w, lane, 3],
                                b_frag[w, lane, 0], b_frag[w, lane, 1], d0, d1, d2, d3)
        d_frag[w, lane, 0] = d0
        d_frag[w, lane, 1] = d1
        d_frag[w, lane, 2] = d2
        d_frag[w, lane, 3] = d3

    return kernel


@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_mma_in_a_kernel_equals_the_emulation(fmt):
    """Two blocks of two warps, each warp its own problem, two MMAs in a row: under the simulator the warp exchange
    keeps warps, blocks and calls apart; on a GPU the hardware's fragment layout is the emulation's."""
    rng = _rng("kernel", fmt)
    warps, rounds = 4, 2
    problems = [_problem(fmt, rng) for _ in range(warps)]
    frags = [_fragments(fmt, a, b, c) for a, b, c, _ in problems]
    a_frag, b_frag, c_frag = (np.stack([f[i] for f in frags]) for i in range(3))
    d_frag = cuda.to_device(np.full((warps, 32, 4), np.nan, np.float32))
    _mma_kernel(fmt, rounds)[2, 64](cuda.to_device(a_frag), cuda.to_device(b_frag), cuda.to_device(c_frag), d_frag)
    d_frag = d_frag.copy_to_host()
    for w, (a, b, c, _) in enumerate(problems):
        ref = rounds * (a.astype(np.float64) @ b.astype(np.float64)) + c
        got = _unfragment(d_frag[w])
        assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-6, w


def test_roundings_in_a_kernel_equal_the_host_ones():
    x = _ties_and_randoms(_rng("kernel-round"), n=200)

    @cuda.jit
    def kernel(x, tf32, bf16):
        i = cuda.grid(1)
        if i < x.size:
            tf32[i] = M.to_tf32(x[i])
            bf16[i] = M.pack_bf16(x[i], -x[i])

    tf32 = cuda.to_device(np.full(x.size, np.nan, np.float32))
    bf16 = cuda.to_device(np.zeros(x.size, np.uint32))
    kernel[(x.size + 127) // 128, 128](cuda.to_device(x), tf32, bf16)
    assert np.array_equal(tf32.copy_to_host().view(np.uint32), M.round_tf32(x).view(np.uint32))
    packed = bf16.copy_to_host()
    assert np.array_equal((packed << np.uint32(16)).view(np.float32), M.round_bf16(x))
    assert np.array_equal((packed & np.uint32(0xFFFF0000)).view(np.float32), M.round_bf16(-x))


def test_bf16_bits_are_pack_bf16s_low_half_and_bf16_float_their_inverse():
    """The BF16 storage's rounding (``bf16_bits``) is ``pack_bf16``'s, bit for bit (NaN, infinities, subnormals,
    ties included); ``bf16_float`` gives back the BF16 value exactly and passes a float32 unchanged."""
    x = np.concatenate([_ties_and_randoms(_rng("bf16-bits"), n=200),
                        np.float32([np.nan, np.inf, -np.inf, 1e-40, -3e-39, 3.4e38])])

    @cuda.jit
    def kernel(x, bits, packed, back, same):
        i = cuda.grid(1)
        if i < x.size:
            bits[i] = M.bf16_bits(x[i])
            packed[i] = M.pack_bf16(x[i], float32(0.0))
            back[i] = M.bf16_float(bits[i])
            same[i] = M.bf16_float(x[i])

    n = x.size
    bits, packed = cuda.to_device(np.zeros(n, np.uint16)), cuda.to_device(np.zeros(n, np.uint32))
    back, same = cuda.to_device(np.zeros(n, np.float32)), cuda.to_device(np.zeros(n, np.float32))
    kernel[(n + 127) // 128, 128](cuda.to_device(x), bits, packed, back, same)
    got = bits.copy_to_host()
    assert np.array_equal(got, (packed.copy_to_host() & np.uint32(0xFFFF)).astype(np.uint16))
    num = ~np.isnan(x)  # (a GPU's NaN is the canonical one, the emulation's keeps the payload: both NaN)
    assert np.array_equal(got[num], M._bf16_bits(x)[num])
    assert np.array_equal(back.copy_to_host()[num], M.round_bf16(x)[num])
    assert np.array_equal(np.isnan(back.copy_to_host()), np.isnan(x))
    assert np.array_equal(same.copy_to_host().view(np.uint32), x.view(np.uint32))


def test_a_warp_missing_from_an_mma_is_an_error():
    """Under the simulator: a lane that skips the MMA its warp runs is reported, not computed around."""
    @cuda.jit
    def kernel(out):
        lane = cuda.threadIdx.x
        if lane != 3:
            d = M.mma_tf32(float32(1), float32(1), float32(1), float32(1), float32(1), float32(1),
                           float32(0), float32(0), float32(0), float32(0))
            out[lane] = d[0]
        cuda.syncthreads()

    from gpunn.device import simulator_enabled

    if not simulator_enabled():
        pytest.skip("on a GPU a diverged mma.sync is undefined behaviour, not an error")
    with pytest.raises(RuntimeError, match="mma_tf32: not every thread of group 0 reached it"):
        kernel[1, 32](cuda.to_device(np.zeros(32, np.float32)))
