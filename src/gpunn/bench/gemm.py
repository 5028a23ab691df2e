"""GEMM problems: every version with a dense launcher (``gemm.DENSE_LAUNCHERS``) on the MLP's shapes, 4096^3, the
autoencoder's largest convolutions as dense GEMMs (AE_CASES) and an odd validation shape, each beside cuBLAS (through
torch) in its own format as % of its time: the fp32 versions against fp32 (TF32 off), the tensor-core versions
against TF32 and BF16 cuBLAS, each checked against the float64 reference of its inputs rounded as it rounds them;
the relative-error limit grows with sqrt(K) (gemm_tolerance)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda

from gpunn.bench.core import TOLERANCE, Problem, _poisoned, _random
from gpunn.kernels import gemm


def gemm_tolerance(k: int) -> float:
    """Relative-error limit of an fp32 GEMM with fp32 accumulation over K terms.

    Rounding errors of a K-term dot product grow like sqrt(K). Measured for sequential fp32 accumulation
    (no FMA, the worst order the kernels use) on standard-normal inputs: 3.4e-7 at K=64, 1.2e-6 at K=784,
    2.6e-6 at K=4096; the limit, 5e-5 at K=4096 scaled by sqrt(K / 4096) and never below 1e-5, leaves a
    margin of about 20x, while a wrong index or a skipped tile gives errors of order 1."""
    return max(TOLERANCE, 5e-5 * math.sqrt(k / 4096))


@dataclass(frozen=True)
class GemmCase:
    case: str
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    bias: bool = False
    relu: bool = False
    split_k: bool = False  # also time the register-blocked versions with automatic split-K ("<version>+splitk")
    versions: tuple | None = None  # only these versions (None: every dense launcher, and the direct ones where
    # the operands are K-major: A (M, K), B stored (N, K), i.e. trans_b without trans_a)


# The autoencoder 256-128 at batch 64: its two largest convolutions (3x3, 16x16 outputs) as the dense GEMMs of their
# implicit im2col, M = batch x pixels, N = out channels, K = in channels x 9; the weight gradient M = out channels,
# N = in channels x 9, K = batch x pixels (A^T: the output gradient, read in place; few output tiles over a long K,
# so also with split-K, as the training engine runs it: gpunn.backends.gpu.policy.gemm_splits)
AE_CASES = (
    GemmCase("ae_conv2_forward", 64 * 16 * 16, 128, 256 * 9),
    GemmCase("ae_conv4_forward", 64 * 16 * 16, 256, 128 * 9),
    GemmCase("ae_conv2_grad_w", 128, 256 * 9, 64 * 16 * 16, trans_a=True, split_k=True),
    GemmCase("ae_conv4_grad_x", 64 * 16 * 16, 128 * 9, 256),
)
# The MLP 784-256-10 at batch 64: y = x @ W + b, W stored (in, out); gradients dW = x^T dy, dx = dy W^T.
GEMM_CASES = (
    GemmCase("square_4096", 4096, 4096, 4096),
    # the same with B stored (N, K): the tensor-core versions beside the direct and ws ones (K-major operands only)
    GemmCase("square_4096_bt", 4096, 4096, 4096, trans_b=True, versions=("tensor_tf32", "tensor_bf16", "wgmma_tf32",
                                                                         "wgmma_bf16", "direct_tf32", "direct_bf16",
                                                                         "ws_tf32", "ws_bf16", "tma_tf32",
                                                                         "tma_bf16")),
    GemmCase("mlp_fc1_forward", 64, 256, 784, bias=True, relu=True),
    GemmCase("mlp_fc2_forward", 64, 10, 256, bias=True),
    GemmCase("mlp_fc2_grad_w", 256, 10, 64, trans_a=True),
    GemmCase("mlp_fc2_grad_x", 64, 256, 10, trans_b=True),
    GemmCase("mlp_fc1_grad_w", 784, 256, 64, trans_a=True),
    GemmCase("odd_validation", 257, 129, 301, bias=True, relu=True),
    *AE_CASES,
)
QUICK_GEMM_CASES = (
    GemmCase("quick_bias_relu", 19, 13, 11, bias=True, relu=True),
    GemmCase("quick_transposed", 13, 7, 5, trans_a=True, trans_b=True),
    GemmCase("quick_split_k", 7, 5, 67, trans_a=True, split_k=True),  # a long K over few tiles, split
    GemmCase("quick_k_major", 9, 6, 20, trans_b=True, bias=True, versions=("tensor_bf16", "direct_tf32",
                                                                        "direct_bf16")),
)


SPLIT_K_VERSIONS = ("regblock", "regblock128", "coalesced128", "tensor_tf32", "tensor_bf16", "wgmma_tf32",
                    "wgmma_bf16")


def _direct(family, fmt):
    """``gemm_<family>`` (direct, ws) in the dense launchers' form, for K-major operands (A (M, K), B stored (N, K):
    trans_b): BF16 operands converted to their uint16 bits when bound (rounded to nearest, as the reference rounds
    them; not timed, as torch's bfloat16 copies are not)."""
    entry = getattr(gemm, f"gemm_{family}")

    def launcher(a, b, out, trans_a=False, trans_b=False, bias=None, relu=False, block=None, stream=0, launch=True):
        if trans_a or not trans_b:
            raise ValueError(f"{family}_{fmt}: K-major operands only (A (M, K), B stored (N, K): trans_b)")
        if fmt == "bf16":
            a, b = (cuda.to_device(_bf16_bits(x.copy_to_host())) for x in (a, b))
        return entry(fmt, a, b, out, bias=bias, relu=relu, stream=stream, launch=launch)

    return launcher


def _bf16_bits(x):
    return (gemm.round_inputs(x, "bf16").view(np.uint32) >> np.uint32(16)).astype(np.uint16)


DIRECT_LAUNCHERS = {f"{family}_{fmt}": _direct(family, fmt) for family in ("direct", "ws", "tma")
                    for fmt in ("tf32", "bf16")}


def direct_takes(name: str, k: int) -> bool:
    """Whether the direct-family launcher `name` takes K-major operands of depth k: BF16 pairs need K even, TMA's rows
    a multiple of 16 bytes (K % 4 in TF32, K % 8 in BF16)."""
    family, fmt = name.split("_")
    return (fmt == "tf32" or k % 2 == 0) and (family != "tma" or k % (4 if fmt == "tf32" else 8) == 0)


def _versions(case: GemmCase) -> dict:
    """Every dense launcher, the direct ones where the operands are K-major (those that take its K), and with
    `split_k` the register-blocked ones again with automatic split-K; only `case.versions` where given."""
    versions = dict(gemm.DENSE_LAUNCHERS)
    if case.trans_b and not case.trans_a:
        versions.update({name: fn for name, fn in DIRECT_LAUNCHERS.items() if direct_takes(name, case.k)})
    if case.split_k:
        versions.update({f"{name}+splitk": functools.partial(gemm.DENSE_LAUNCHERS[name], splits=None)
                         for name in SPLIT_K_VERSIONS})
    return versions if case.versions is None else {name: versions[name] for name in case.versions}


def gemm_problems(cases, seed=0) -> list[Problem]:
    rng = np.random.default_rng(seed)
    return [_gemm_problem(case, rng) for case in cases]


def _gemm_problem(case: GemmCase, rng) -> Problem:
    m, n, k = case.m, case.n, case.k
    a = _random(rng, (k, m) if case.trans_a else (m, k))
    b = _random(rng, (n, k) if case.trans_b else (k, n))
    bias = _random(rng, (n,)) if case.bias else None
    expected = gemm.gemm_reference(a, b, case.trans_a, case.trans_b, bias, case.relu)

    def bind(launcher, block, stream):
        out = _poisoned((m, n))
        launch = launcher(cuda.to_device(a), cuda.to_device(b), out, trans_a=case.trans_a, trans_b=case.trans_b,
                          bias=None if bias is None else cuda.to_device(bias), relu=case.relu, block=block,
                          stream=stream, launch=False)
        return launch, (out,)

    def torch_ref(torch, fmt="fp32"):
        """cuBLAS through torch: fp32 (TF32 off); tf32 (TF32 on for this call); bf16 (operands, bias and output
        converted to bfloat16 beforehand, fp32 accumulation: what torch.autocast runs)."""
        dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
        left = torch.from_numpy(a).cuda().to(dtype)
        right = torch.from_numpy(b).cuda().to(dtype)
        left = left.t() if case.trans_a else left  # transposed views, as the kernels read them in place
        right = right.t() if case.trans_b else right
        out = torch.empty((m, n), device="cuda", dtype=dtype)
        bias_t = None if bias is None else torch.from_numpy(bias).cuda().to(dtype)
        tf32 = fmt in ("tf32", "tf32_trunc")  # (cuBLAS's TF32 reads float32 operands: the truncation)

        def run():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            if bias_t is None:
                torch.matmul(left, right, out=out)
            else:
                torch.addmm(bias_t, left, right, out=out)
            if case.relu:
                out.relu_()
            torch.backends.cuda.matmul.allow_tf32 = False

        name = "torch.matmul" if bias is None else "torch.addmm"
        label = "tf32" if tf32 else fmt
        return name + (" + relu_" if case.relu else "") + ("" if fmt == "fp32" else f" ({label})"), run

    @functools.cache
    def expected_for(fmt):
        return (gemm.gemm_reference(a, b, case.trans_a, case.trans_b, bias, case.relu, inputs=fmt),)

    flags = ("A^T " if case.trans_a else "") + ("B^T " if case.trans_b else "") + \
            ("+bias " if case.bias else "") + ("+relu" if case.relu else "")
    return Problem(
        op="gemm", case=case.case, versions=_versions(case), dims={"m": m, "n": n, "k": k},
        shape_label=f"{m}x{n}x{k} {flags}".strip(), n_elements=m * n, output_names=("out",),
        expected=(expected,), tolerance=gemm_tolerance(k),
        bytes_moved=4 * (a.size + b.size + m * n + (n if case.bias else 0)), flops=2 * m * n * k,
        bind=bind, torch_ref=torch_ref, input_format=_input_format, expected_for=expected_for,
    )


def _input_format(version: str) -> str:
    """What a bench version ("<name>" or "<name>+splitk") rounds its inputs to; fp32 for a launcher with no version
    record."""
    spec = gemm.VERSIONS.get(version.split("+")[0])
    return "fp32" if spec is None else spec.inputs
