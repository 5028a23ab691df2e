"""Convolution benchmark problems for ``python -m gpunn.bench conv`` (gpunn.bench runs them: validation of
every version x block against the float64 reference first, then CUDA-event timing, one line each).

    conv_problems(quick=False, seed=0) -> list[gpunn.bench.Problem]

What is benchmarked
    Every pass of ``gpunn.kernels.conv.VERSIONS`` (forward with bias (+ ReLU), backward-data (with the
    previous layer's ReLU mask where the layer's input is a ReLU output), backward-weight, bias gradient), every
    version registered there (versions added later, e.g. v3 implicit GEMM, are picked up; ``NEEDS_GPU`` ones
    are left out under the simulator), at the shapes the models train with (batch 64, k = 3):
        CNN (E4, padding 0):  1 -> 16 at 28x28,  16 -> 32 at 26x26
        AE  (E5, padding 1):  3 -> 256 at 32x32, 256 -> 128 at 16x16, 128 -> 128 at 8x8,
                              128 -> 256 at 16x16, 256 -> 3 at 32x32 (no ReLU: the reconstruction)
    ``quick``: one tiny shape (2 images, 2 -> 3 channels, 5x6, padding 1), what the simulator tests run.

    Each problem's op is ``conv_<pass>``; its m, n, k columns are the pass's GEMM-equivalent sizes (forward
    Cout x N*OH*OW x Cin*k*k, backward-data Cin x N*H*W x Cout*k*k, backward-weight Cout x Cin*k*k x N*OH*OW;
    the bias gradient is a memory-bound column sum: rows N*OH*OW, cols Cout). GFLOP/s = 2*M*N*K / time, the
    nominal direct-convolution count (padding zeros included). The tolerance is ``bench.gemm_tolerance`` of the
    reduction length K.

Reference: PyTorch with cuDNN, fp32 (``torch.backends.cudnn.allow_tf32 = False``; ``cudnn.benchmark = True``
so cuDNN picks its fastest algorithm during the warm-up launches): ``torch.nn.functional.conv2d`` (+ relu_),
``torch.nn.grad.conv2d_input`` (+ ``aten.threshold_backward`` for the mask), ``torch.nn.grad.conv2d_weight``,
``dy.sum((0, 2, 3))``; pct_of_ref = 100 * cuDNN ms / kernel ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from gpunn.bench.core import Problem, _poisoned, _random
from gpunn.bench.gemm import gemm_tolerance
from gpunn.kernels import conv

__all__ = ["CONV_CASES", "QUICK_CONV_CASES", "ConvCase", "conv_case_problems", "conv_problems"]


@dataclass(frozen=True)
class ConvCase:
    """One convolution layer: batch n, cin -> cout channels on h x w inputs, k x k kernel, padding.
    ``relu``: the forward fuses a ReLU; ``input_relu``: the layer's input is a ReLU output, so its
    backward-data fuses that ReLU's mask."""

    case: str
    n: int
    cin: int
    cout: int
    h: int
    w: int
    k: int = 3
    padding: int = 0
    relu: bool = True
    input_relu: bool = True

    @property
    def out_hw(self):
        return (conv.conv_output_size(self.h, self.k, self.padding),
                conv.conv_output_size(self.w, self.k, self.padding))


CONV_CASES = (
    ConvCase("cnn_conv1", 64, 1, 16, 28, 28, padding=0, input_relu=False),
    ConvCase("cnn_conv2", 64, 16, 32, 26, 26, padding=0),
    ConvCase("ae_enc1", 64, 3, 256, 32, 32, padding=1, input_relu=False),
    ConvCase("ae_enc2", 64, 256, 128, 16, 16, padding=1),
    ConvCase("ae_dec1", 64, 128, 128, 8, 8, padding=1),
    ConvCase("ae_dec2", 64, 128, 256, 16, 16, padding=1),
    ConvCase("ae_dec3", 64, 256, 3, 32, 32, padding=1, relu=False),
)
QUICK_CONV_CASES = (ConvCase("quick", 2, 2, 3, 5, 6, padding=1),)


def conv_problems(quick: bool = False, seed: int = 0, passes=conv.PASSES) -> list[Problem]:
    """The conv problems of every case x pass (tiny ones with `quick`); call from gpunn.bench.op_problems."""
    rng = np.random.default_rng(seed)
    return [p for case in (QUICK_CONV_CASES if quick else CONV_CASES) for p in conv_case_problems(case, rng, passes)]


def _to_device(host):
    return None if host is None else cuda.to_device(host)


def conv_case_problems(case: ConvCase, rng, passes=conv.PASSES) -> list[Problem]:
    n, cin, cout, h, w, k, p = case.n, case.cin, case.cout, case.h, case.w, case.k, case.padding
    oh, ow = case.out_hw
    x = _random(rng, (n, cin, h, w))
    weight = _random(rng, (cout, cin, k, k), scale=float(np.sqrt(2.0 / (cin * k * k))))  # He init
    bias = _random(rng, (cout,))
    dy = _random(rng, (n, cout, oh, ow))
    mask = x if case.input_relu else None  # the ReLU output feeding this layer: dx = 0 where it is <= 0
    shape_label = f"{n}x{cin}x{h}x{w} k{k} p{p} -> {cout}"
    conv_flops = 2 * n * cout * oh * ow * cin * k * k
    x_bytes, y_bytes, w_bytes = 4 * x.size, 4 * dy.size, 4 * weight.size

    def problem(pass_name, dims, output_names, expected, tolerance, bytes_moved, flops, bind, torch_ref):
        layer = (cin, cout, k, p, h, w)
        return Problem(op=f"conv_{pass_name}", case=case.case, versions=conv.runnable_versions(pass_name, layer),
                       dims=dims, shape_label=shape_label, n_elements=int(expected[0].size),
                       output_names=output_names, expected=tuple(expected), tolerance=tolerance,
                       bytes_moved=bytes_moved, flops=flops, bind=bind, torch_ref=torch_ref)

    def cudnn(torch):
        torch.backends.cudnn.allow_tf32 = False  # fp32 against fp32
        torch.backends.cudnn.benchmark = True  # cuDNN's fastest algorithm, chosen during the warm-up launches
        return lambda host: None if host is None else torch.from_numpy(host).cuda()

    # ---- forward
    def bind_forward(launcher, block, stream):
        out = _poisoned((n, cout, oh, ow))
        launch = launcher(cuda.to_device(x), cuda.to_device(weight), cuda.to_device(bias), out, p,
                          relu=case.relu, block=block, stream=stream, launch=False)
        return launch, (out,)

    def torch_forward(torch):
        tensor = cudnn(torch)
        x_t, w_t, b_t = tensor(x), tensor(weight), tensor(bias)

        def run():
            y = torch.nn.functional.conv2d(x_t, w_t, b_t, padding=p)
            if case.relu:
                y.relu_()

        return "cudnn conv2d" + (" + relu_" if case.relu else ""), run

    # ---- backward-data
    def bind_backward_data(launcher, block, stream):
        dx = _poisoned((n, cin, h, w))
        launch = launcher(cuda.to_device(dy), cuda.to_device(weight), dx, p, relu_mask=_to_device(mask),
                          block=block, stream=stream, launch=False)
        return launch, (dx,)

    def torch_backward_data(torch):
        tensor = cudnn(torch)
        dy_t, w_t, mask_t = tensor(dy), tensor(weight), tensor(mask)

        def run():
            dx = torch.nn.grad.conv2d_input((n, cin, h, w), w_t, dy_t, padding=p)
            if mask_t is not None:
                torch.ops.aten.threshold_backward(dx, mask_t, 0.0)

        return "cudnn conv2d_input" + (" + threshold_backward" if mask is not None else ""), run

    # ---- backward-weight
    def bind_backward_weight(launcher, block, stream):
        dw = _poisoned((cout, cin, k, k))
        launch = launcher(cuda.to_device(x), cuda.to_device(dy), dw, p, block=block, stream=stream, launch=False)
        return launch, (dw,)

    def torch_backward_weight(torch):
        tensor = cudnn(torch)
        x_t, dy_t = tensor(x), tensor(dy)
        return "cudnn conv2d_weight", lambda: torch.nn.grad.conv2d_weight(x_t, (cout, cin, k, k), dy_t, padding=p)

    # ---- bias gradient
    def bind_bias_grad(launcher, block, stream):
        db = _poisoned((cout,))
        launch = launcher(cuda.to_device(dy), db, block=block, stream=stream, launch=False)
        return launch, (db,)

    def torch_bias_grad(torch):
        dy_t = cudnn(torch)(dy)
        return "torch dy.sum((0, 2, 3))", lambda: dy_t.sum(dim=(0, 2, 3))

    builders = {
        "forward": lambda: problem(
            "forward", {"m": cout, "n": n * oh * ow, "k": cin * k * k}, ("out",),
            [conv.conv_forward_ref(x, weight, bias, p, case.relu)], gemm_tolerance(cin * k * k),
            x_bytes + w_bytes + 4 * cout + y_bytes, conv_flops, bind_forward, torch_forward),
        "backward_data": lambda: problem(
            "backward_data", {"m": cin, "n": n * h * w, "k": cout * k * k}, ("dx",),
            [conv.conv_backward_data_ref(dy, weight, x.shape, p, mask)], gemm_tolerance(cout * k * k),
            y_bytes + w_bytes + x_bytes * (2 if mask is not None else 1), conv_flops, bind_backward_data,
            torch_backward_data),
        "backward_weight": lambda: problem(
            "backward_weight", {"m": cout, "n": cin * k * k, "k": n * oh * ow}, ("dw",),
            [conv.conv_backward_weight_ref(x, dy, k, p)], gemm_tolerance(n * oh * ow),
            x_bytes + y_bytes + w_bytes, conv_flops, bind_backward_weight, torch_backward_weight),
        "bias_grad": lambda: problem(
            "bias_grad", {"rows": n * oh * ow, "cols": cout}, ("db",), [conv.conv_bias_grad_ref(dy)],
            gemm_tolerance(n * oh * ow), y_bytes + 4 * cout, 0, bind_bias_grad, torch_bias_grad),
    }
    unknown = [name for name in passes if name not in builders]
    if unknown:
        raise ValueError(f"conv_case_problems: unknown passes {unknown}; choose from {list(builders)}")
    return [builders[name]() for name in passes]
