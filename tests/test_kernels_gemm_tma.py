"""tma_tf32 / tma_bf16 (gpunn.kernels.gemm.direct_tma: ws_* with TMA as the producer) against the float64 product of
their inputs as the tensor core reads them, the tensor-map encoder's refusals, and mutations of the kernel that must
fail under the TMA emulation (gpunn.kernels.tma): a wrong expect_tx count, box coordinate, swizzle or parity. Small
odd shapes reach the zero fill past M, N and K, both tiles and the ring's wrap; outputs are NaN-poisoned first. The
``gpu``-marked test repeats them at real sizes on a Hopper GPU (``pytest -m gpu``)."""

import functools
import os

import numpy as np
import pytest
from numba import cuda, uint32

from gpunn.kernels import gemm as G
from gpunn.kernels import mbarrier as MB
from gpunn.kernels import tma as T
from gpunn.kernels.async_copy import shared_address
from gpunn.kernels.gemm import direct_tma, direct_ws
from kmajor_gemm import launch_error, operand

TOL = 1e-5
_ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1" and cuda.is_available()


def _run(fmt, m, n, k, epilogue="none", stages=direct_tma.STAGES, bn=direct_tma.BN, regs=direct_tma.REGS, key=(),
         persistent=0):
    """One launch on fresh inputs: max|out - ref| / max|ref| (ref: float64 of the inputs as the MMA reads them); inf
    where outputs stay NaN (a mutation's failure)."""
    launch = functools.partial(G.gemm_tma, fmt, stages=stages, bn=bn, regs=regs, persistent=persistent)
    return launch_error(f"tma_{fmt}", launch, m, n, k, epilogue, (fmt, m, n, k, epilogue, stages, bn, *key),
                        unwritten="inf")


def _tf32_error(out, a, b):
    """max|out - ref| / max|ref| of a tma_tf32 product ``a @ b.T`` (ref: float64 of the inputs as the MMA reads)."""
    ref = G.gemm_reference(a, b, trans_b=True, inputs=G.VERSIONS["tma_tf32"].inputs)
    return float(np.abs(out.copy_to_host() - ref).max() / np.abs(ref).max())


# (fmt, M, N, K, epilogue, stages, bn): TF32 steps (boxes) are 32 K, BF16 64; K a multiple of 16 bytes
CASES = [
    ("tf32", 130, 7, 76, "bias_relu", 2, 256),  # zero past M (2nd block), N and K (a 12-K tail); 3 steps round 2
    ("tf32", 3, 260, 164, "mask", 2, 256),      # 2 blocks of N, zero past N in the 256 tile; 6 steps round 2
    ("tf32", 5, 129, 296, "none", 4, 256),      # the default ring: 10 steps round 4 stages
    ("tf32", 5, 130, 200, "none", 3, 128),      # the 128 x 128 tile (m64n128): 7 steps round 3
    ("bf16", 130, 6, 80, "relu", 2, 256),       # a 16-K tail step
    ("bf16", 5, 257, 520, "bias", 3, 256),      # a tail step of 8 K; 9 steps round 3
    ("bf16", 5, 130, 200, "none", 2, 128),      # the 128 x 128 tile: 4 steps round 2
]


@pytest.mark.parametrize("fmt,m,n,k,epilogue,stages,bn", CASES)
def test_tma_against_float64(fmt, m, n, k, epilogue, stages, bn):
    assert _run(fmt, m, n, k, epilogue, stages, bn) < TOL


def test_tma_without_register_reallocation():
    assert _run("tf32", 3, 9, 100, "none", 2, 256, regs=None) < TOL


@pytest.mark.parametrize("fmt,m,n,k,stages,bn,blocks", [
    ("tf32", 130, 260, 76, 2, 256, 2),  # 4 tiles on 2 blocks: each 2 tiles of 3 steps round 2 stages
    ("bf16", 250, 130, 200, 3, 128, 3),  # 4 tiles on 3 blocks (one takes 2), 4 steps round 3
    ("tf32", 5, 9, 40, 2, 256, -1),  # one block an SM (1 under the simulator), one tile
])
def test_tma_persistent(fmt, m, n, k, stages, bn, blocks):
    assert _run(fmt, m, n, k, "bias", stages, bn, persistent=blocks) < TOL


def test_tma_launch_keeps_its_operands_alive():
    """The tensor maps hold only the operands' addresses: a launch bound now and run later (the bench binds on
    temporaries) keeps a and b alive, so their memory is not freed and reused under the maps."""
    import gc
    import weakref

    rng = np.random.default_rng(5)
    a_host, b_host = operand(rng, 3, 8, "tf32"), operand(rng, 4, 8, "tf32")
    a, b = cuda.to_device(a_host), cuda.to_device(b_host)
    alive = weakref.ref(a), weakref.ref(b)
    out = cuda.to_device(np.full((3, 4), np.nan, np.float32))
    launch = G.gemm_tma("tf32", a, b, out, launch=False)
    del a, b
    gc.collect()
    assert all(ref() is not None for ref in alive)
    launch()
    assert _tf32_error(out, a_host, b_host) < TOL


def test_tma_refuses_what_it_cannot_read():
    a32, b32 = cuda.to_device(np.zeros((4, 6), np.float32)), cuda.to_device(np.zeros((5, 6), np.float32))
    out = cuda.to_device(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="multiple of 16 bytes: K a multiple of 4"):
        G.gemm_tma("tf32", a32, b32, out)
    a16, b16 = cuda.to_device(np.zeros((4, 12), np.uint16)), cuda.to_device(np.zeros((5, 12), np.uint16))
    with pytest.raises(ValueError, match="K a multiple of 8"):
        G.gemm_tma("bf16", a16, b16, out)
    with pytest.raises(ValueError, match="2 stages or more"):
        G.gemm_tma("tf32", cuda.to_device(np.zeros((4, 8), np.float32)), cuda.to_device(np.zeros((5, 8), np.float32)),
                   out, stages=5)
    with pytest.raises(ValueError, match="K-major flat operands only"):
        direct_tma.kernel("tf32")("dense", "dense", "dense", 1, "none")
    with pytest.raises(ValueError, match="float32 or uint16"):
        T.encode_2d(cuda.to_device(np.zeros((4, 8), np.float64)), 128)
    with pytest.raises(ValueError, match="C-contiguous 2-D"):
        T.encode_2d(cuda.to_device(np.zeros(8, np.float32)), 128)
    with pytest.raises(ValueError, match="16-byte aligned"):
        T.encode_2d(cuda.to_device(np.zeros(40, np.float32))[1:33].reshape(4, 8), 128)
    with pytest.raises(ValueError, match="box rows 1..256"):
        T.encode_2d(cuda.to_device(np.zeros((4, 8), np.float32)), 257)
    assert G.VERSIONS["tma_bf16"].shared == direct_tma.shared_bytes() == direct_ws.shared_bytes()
    assert direct_tma.stage_bytes() == (128 + 256) * 128


# ---------------------------------------------------------------- one bulk tensor copy, alone

@cuda.jit
def _copy_box(tmap, out, done, k0, row0, tries):
    """One box (16 rows of 128 bytes) by TMA into 1024-byte aligned shared memory, then its words to ``out``;
    done[0] = 1 when the barrier's phase completed within ``tries`` try_waits (a bounded wait: no hang)."""
    smem = cuda.shared.array(0, uint32)
    t = cuda.threadIdx.x
    base = uint32(uint32((uint32(1024) - (shared_address(smem) & uint32(1023))) & uint32(1023)) >> uint32(2))
    bar = uint32(base + uint32(512))
    if t == 0:
        MB.mbar_init(smem, bar, uint32(1))
        MB.fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        MB.mbar_arrive_expect_tx(smem, bar, uint32(2048))
        T.tma_load_2d(smem, base, tmap, uint32(k0), uint32(row0), bar)
    ok = uint32(0)
    n = 0
    while ok == 0 and n < tries:
        ok = MB.mbar_try_wait(smem, bar, uint32(0))
        n += 1
    if t == 0:
        done[0] = ok
    for i in range(t, 512, 32):
        out[i] = smem[base + i]


def _check_copy(fmt):
    """A box over the tensor's corner (zero fill past K and rows), swizzled: the words where wgmma reads them."""
    rng = np.random.default_rng(3)
    x = operand(rng, 20, 40, fmt)  # rows 8..23 of 20, K from 32 (TF32: 32..63 of 40; BF16: 32..95 of 40)
    out, done = cuda.to_device(np.zeros(512, np.uint32)), cuda.to_device(np.zeros(1, np.uint32))
    _copy_box[1, 32, 0, 1024 + 2048 + 16](T.encode_2d(cuda.to_device(x), 16), out, done, 32, 8, 100 if _ON_GPU else 20)
    assert done.copy_to_host()[0] == 1, "the TMA copy never completed its bytes on the barrier"
    box_k = 128 // x.itemsize
    box = np.zeros((16, box_k), x.dtype)
    box[:12, :8] = x[8:20, 32:40]
    logical = box.reshape(-1).view(np.uint8)
    physical = np.arange(2048)
    expected = logical[physical ^ (((physical >> 7) & 7) << 4)]  # the 128-byte swizzle (an involution)
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint8), expected)


@pytest.mark.skipif(_ON_GPU, reason="the emulation (the gpu test runs the copy on the GPU)")
@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_tma_copy_one_box(fmt):
    _check_copy(fmt)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_tma_copy_one_box_gpu(fmt):
    if tuple(cuda.get_current_device().compute_capability) < (9, 0):
        pytest.skip("TMA: compute capability 9.0 or newer")
    _check_copy(fmt)


# ---------------------------------------------------------------- mutations the emulation must catch

def _mutant(monkeypatch, **patch):
    for target, value in patch.items():
        module, name = target.split(":")
        monkeypatch.setattr({"kernel": direct_tma, "tma": T}[module], name, value)
    monkeypatch.setattr(MB, "SPIN_LIMIT", 60)  # a deadlock is called sooner
    try:
        return _run("tf32", 5, 9, 200, "none", 2, 256, key=("mutant", *sorted(patch)))
    except RuntimeError as exc:  # a deadlock, or an arrival on a completed phase
        return f"RuntimeError: {exc}"


def test_mutation_expect_tx_too_low(monkeypatch):
    """Only A's box expected: the phase completes before B's copy lands."""
    result = _mutant(monkeypatch, **{"kernel:stage_bytes": lambda bn=256: 128 * 128})
    assert isinstance(result, str) or result > 1e-3, result


def test_mutation_expect_tx_too_high(monkeypatch):
    result = _mutant(monkeypatch, **{"kernel:stage_bytes": lambda bn=256: (128 + bn) * 128 + 16})
    assert isinstance(result, str) and "deadlock" in result, result


def test_mutation_box_coordinate(monkeypatch):
    """B's box one K step ahead."""
    load = T.tma_load_2d

    def shifted(smem, word, tmap, k0, row0, bar):
        load(smem, word, tmap, k0 + (32 if int(word) % 12288 else 0), row0, bar)

    result = _mutant(monkeypatch, **{"kernel:tma_load_2d": shifted})
    assert isinstance(result, str) or result > 1e-3, result


def test_mutation_box_row(monkeypatch):
    """A's box one row down."""
    load = T.tma_load_2d

    def shifted(smem, word, tmap, k0, row0, bar):
        load(smem, word, tmap, k0, row0 + (0 if int(word) % 12288 else 1), bar)

    result = _mutant(monkeypatch, **{"kernel:tma_load_2d": shifted})
    assert isinstance(result, str) or result > 1e-3, result


def test_mutation_swizzle(monkeypatch):
    """Tensor maps without the swizzle (a 64- or 32-byte one is refused for 128-byte box rows, as by the driver)."""
    result = _mutant(monkeypatch, **{"tma:encode_2d": functools.partial(T.encode_2d, swizzle=0)})
    assert isinstance(result, str) or result > 1e-3, result
    with pytest.raises(ValueError, match="over the 64-byte swizzle"):
        T.encode_2d(cuda.to_device(np.zeros((4, 8), np.float32)), 128, swizzle=64)


def test_mutation_consumer_parity(monkeypatch):
    """The consumers wait full[i] with the parity flipped: they pass before the copies land."""
    wait = MB.mbar_wait
    full0, empty0 = 2 * direct_ws.stage_words(256), 2 * direct_ws.stage_words(256) + 4  # 2 stages, base word 0

    def flipped(smem, word, parity):
        wait(smem, word, parity ^ (1 if full0 <= int(word) < empty0 else 0))

    result = _mutant(monkeypatch, **{"kernel:mbar_wait": flipped})
    assert isinstance(result, str) or result > 1e-3, result


def test_mutation_producer_parity(monkeypatch):
    """The producer waits empty[i] with the parity unflipped: its first wait never passes."""
    wait = MB.mbar_wait
    empty0 = 2 * direct_ws.stage_words(256) + 4

    def flipped(smem, word, parity):
        wait(smem, word, parity ^ (1 if int(word) >= empty0 else 0))

    result = _mutant(monkeypatch, **{"kernel:mbar_wait": flipped})
    assert isinstance(result, str) and "deadlock" in result, result


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
@pytest.mark.parametrize("fmt", ["tf32", "bf16"])
def test_tma_gpu_sizes(fmt):
    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("TMA + wgmma: compute capability 9.0 only")
    _check_copy(fmt)  # a TMA that never completes fails here instead of hanging the GEMMs
    k = 296 if fmt == "tf32" else 304  # a K tail; rows of a multiple of 16 bytes
    for stages, bn, regs in ((direct_tma.STAGES, 256, direct_tma.REGS), (3, 256, None), (6, 128, direct_tma.REGS)):
        epilogues = G.EPILOGUES if stages == direct_tma.STAGES else ("bias_relu",)  # (compiles: the timeout)
        for epilogue in epilogues:
            err = _run(fmt, 257, 129, k, epilogue, stages, bn, regs, key=("gpu",))
            assert err < TOL, (fmt, stages, bn, regs, epilogue, err)
        err = _run(fmt, 1024, 1024, 1024, "bias_relu", stages, bn, regs, key=("gpu",))
        assert err < TOL, (fmt, stages, bn, regs, err)
    for blocks in (-1, 7):  # persistent: one block an SM; 7 blocks over 8 x 4 tiles (1024^3), 3 x 5 (257 x 1200)
        err = _run(fmt, 1024, 1024, 1024, "bias_relu", key=("gpu", blocks), persistent=blocks)
        assert err < TOL, (fmt, "persistent", blocks, err)
        err = _run(fmt, 257, 1200, k, "bias_relu", key=("gpu", blocks), persistent=blocks)
        assert err < TOL, (fmt, "persistent", blocks, err)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a real CUDA GPU")
def test_tma_gpu_launch_bound_on_temporaries():
    """What the bench does: bind on temporary operands, launch later. Freed memory is flushed and refilled with NaN
    before the launch; the launch's own references keep the operands' memory, so the product stays right."""
    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("TMA + wgmma: compute capability 9.0 only")
    rng = np.random.default_rng(7)
    a_host, b_host = operand(rng, 300, 296, "tf32"), operand(rng, 260, 296, "tf32")
    out = cuda.to_device(np.full((300, 260), np.nan, np.float32))
    launch = G.gemm_tma("tf32", cuda.to_device(a_host), cuda.to_device(b_host), out, launch=False)
    cuda.current_context().deallocations.clear()
    junk = [cuda.to_device(np.full_like(x, np.nan)) for x in (a_host, b_host)]
    launch()
    cuda.synchronize()
    assert _tf32_error(out, a_host, b_host) < TOL, len(junk)
