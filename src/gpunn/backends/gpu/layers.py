"""Per-layer GPU launchers of the engine: each gpunn.nn layer type has a stage class that binds its forward and
backward launches (gpunn.kernels) on the buffers the engine allocated for one batch shape.

A stage sees activations as `Act`s and gradients as device arrays, all with the batch as first axis:

    forward(binder, x, y)                      launches computing y from x
    backward(binder, x, y, dy, dx, mask)       launches computing the parameter gradients and, when dx is not
                                               None, dx = the gradient w.r.t. x; `mask` (x's shape, or None):
                                               dx must be zeroed where mask <= 0, the ReLU backward of the layer
                                               before, fused into this pass (mask is that layer's ReLU output)

Gradients are written, not accumulated (the SGD launch zeroes the buffer after the update for the few
kernels that do accumulate: atomic column sums). Fusions are decided by `plan` from the policy: a ReLU
after a Linear becomes the Linear's epilogue (`relu`), and a Linear whose input comes straight from the
batch gather or from another Linear folds its bias into the GEMM (`fold`); under `upsample: fused` an Upsample
followed by a Conv2d becomes one conv stage reading through the upsample (`up`); a Conv2d + ReLU + MaxPool2d run
becomes one ConvPoolStage where the policy's `pool` says so (policy.pool_fused; a WinogradPoolStage where its conv
runs Winograd, policy.pool_winograd); a model's final Linear becomes a
LinearHeadStage, which is its loss head too, where the policy's `head` says so (policy.head_fused). A new model needs
new stage classes only for layer types listed nowhere in STAGES; the engine does not change.

The loss head (HEADS, by the model's loss) runs after the forward stages: `stage.loss_head(x, head)` of the last
stage gives it (x: that stage's input), `head` itself unless the stage fuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpunn.errors import GpunnError
from gpunn.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Upsample
from gpunn.nn.functional import DEFAULT_REDUCTION

from .policy import (
    BIAS_WITH_WEIGHT,
    Policy,
    conv_version,
    gemm_splits,
    gemm_version,
    head_fused,
    pool_bias_with_weight,
    pool_fused,
    pool_winograd,
    precision_gemm,
    tensor_pass,
)

# a conv whose forward and weight gradient both run Winograd transforms x once: the forward keeps V for the weight
# gradient (gpunn.kernels.conv.winograd; H100 numbers: the issue-26 notes)
SHARE_WINOGRAD_INPUT = True
# a bf16 policy's Winograd passes on the tensor cores with their transform buffers in BF16 (conv.winograd storage
# "bf16": the same results, half the bytes, read by the GEMM as BF16 pairs). H200, the autoencoder's gpu-bf16
# epoch, one call: 0.7329 s off, 0.6815 s on (docs/notes/issue-42-progress.md, stop 55)
WINOGRAD_BF16_STORAGE = True


@dataclass
class Act:
    """An activation of a step program: `view` (rows, *shape) is what producers write and consumers read;
    `full` is the allocation: `view` itself, or `view` plus a trailing ones column when a bias-folding Linear
    reads it (2-D activations only)."""

    view: object
    full: object
    aux: object = None  # what the producing stage keeps for its backward (max-pool: the argmax)


class Binder:
    """What stages bind their launches with: the policy, the flat parameter and gradient buffers, the lr, and the
    loss reduction the head's gradient is of (batch "mean" or "sum": the run's, RunSpec.reduction)."""

    def __init__(self, policy: Policy, params, grads, lr: float, reduction: str = DEFAULT_REDUCTION):
        self.policy = policy
        self.params = params
        self.grads = grads
        self.lr = lr
        self.reduction = reduction

    def gemm(self, a, b, out, **kw):
        from gpunn.kernels import gemm

        rows, cols = out.shape
        k = int(a.shape[0] if kw.get("trans_a") else a.shape[1])
        version = gemm_version(self.policy, rows, cols, k)
        if version == "naive" and self.policy.block:  # the naive GEMM's 2-D block: a warp along C's columns
            bx = min(self.policy.block, 32)
            kw["block"] = (bx, self.policy.block // bx)
        if self.policy.gemm == "auto":  # split-K where few tiles loop over a long K (policy.gemm_splits)
            tiles = gemm.output_tiles(version, rows, cols)
            splits = gemm_splits(self.policy, tiles, k, gemm.multiprocessors(), version)
            if splits != 1:
                kw["splits"] = splits  # None: gemm_split_k's automatic count
        return gemm.gemm(a, b, out, version=version, launch=False, **kw)

    @property
    def threads(self) -> dict:
        """Keyword arguments giving a thread-count kernel the run's block size (none: its default)."""
        return self.policy.kw()


class Stage:
    view = False      # no kernel: the output is the input reshaped (Flatten)
    in_place = False  # the output overwrites the input, the input gradient the output gradient (unfused ReLU)
    relu = False      # a ReLU after this layer is fused into it
    fold = False      # the bias is folded into the GEMM (the input carries a ones column)
    params = 0        # parameters in the flat buffer

    def out_shape(self, in_shape: tuple) -> tuple:
        return in_shape

    def forward(self, binder: Binder, x: Act, y: Act) -> list:
        return []

    def backward(self, binder: Binder, x: Act, y: Act, dy, dx, mask) -> list:
        return []

    def loss_head(self, x: Act, head):
        """The loss head of a program ending in this stage (x: its input): `head` (HEADS), unless it fuses it."""
        return head


class LinearStage(Stage):
    def __init__(self, layer: Linear, offset: int, relu: bool):
        self.inputs, self.outputs = layer.in_features, layer.out_features
        self.offset = offset
        self.relu = relu
        self.params = self.inputs * self.outputs + self.outputs

    def __repr__(self):
        extras = (", relu" if self.relu else "") + (", folded bias" if self.fold else "")
        return f"Linear({self.inputs}, {self.outputs}{extras})"

    def out_shape(self, in_shape):
        if math.prod(in_shape) != self.inputs:
            raise GpunnError(f"GPU engine: Linear({self.inputs}, {self.outputs}) gets inputs of shape {in_shape}")
        return (self.outputs,)

    def weight(self, buf, with_bias: bool = False):
        """W (inputs, outputs) in a flat buffer, or [W; b] (inputs + 1, outputs): the bias is stored right after."""
        rows = self.inputs + (1 if with_bias else 0)
        return buf[self.offset:self.offset + rows * self.outputs].reshape(rows, self.outputs)

    def bias(self, buf):
        start = self.offset + self.inputs * self.outputs
        return buf[start:start + self.outputs]

    def forward(self, binder, x, y):
        from gpunn.kernels import elementwise

        p = binder.params
        if self.fold:
            return [binder.gemm(x.full, self.weight(p, with_bias=True), y.view, relu=self.relu)]
        if binder.policy.fuse:
            return [binder.gemm(x.view, self.weight(p), y.view, bias=self.bias(p), relu=self.relu)]
        return [binder.gemm(x.view, self.weight(p), y.view),
                elementwise.bias_add(y.view, self.bias(p), launch=False, **binder.threads)]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels import reduce

        p, g = binder.params, binder.grads
        launches = []
        if dx is not None:  # before the update: SGD runs last
            launches.append(binder.gemm(dy, self.weight(p), dx, trans_b=True, relu_mask=mask))
        if self.fold:
            launches.append(binder.gemm(x.full, dy, self.weight(g, with_bias=True), trans_a=True))
        else:
            launches.append(binder.gemm(x.view, dy, self.weight(g), trans_a=True))
            if binder.policy.fuse:
                launches.append(reduce.colsum_tree(dy, self.bias(g), launch=False, **binder.threads))
            else:  # the bias gradient is zero here: the SGD launch zeroes every gradient after its update
                launches.append(reduce.colsum_atomic(dy, self.bias(g), launch=False, zeroed=True, **binder.threads))
        return launches


class LinearHeadStage(LinearStage):
    """A final Linear fused with its softmax_ce loss head (gpunn.kernels.linear_head, under the policy's `head`): the
    forward binds nothing, its launch is the loss head's (logits, dlogits and the per-sample losses from x); the
    backward is one launch writing dx (masked by the ReLU before, if any), dW and db into the gradient buffer in
    LinearStage's layout. Never folded: it reads W and b where they are and its input needs no ones column."""

    def __init__(self, layer: Linear, offset: int):
        super().__init__(layer, offset, relu=False)

    def __repr__(self):
        return f"Linear({self.inputs}, {self.outputs}) + softmax_ce"

    def loss_head(self, x, head):
        def fused(binder, out, labels, target, dout, losses, counter, stride) -> list:
            from gpunn.kernels import linear_head

            p = binder.params
            return [linear_head.head_forward(self._rows(x.view), self.weight(p), self.bias(p), labels, out, dout,
                                             losses, counter=counter, stride=stride, reduction=binder.reduction,
                                             launch=False, **binder.threads)]

        return fused

    def forward(self, binder, x, y):
        return []

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels import linear_head

        p, g = binder.params, binder.grads
        x2, dx2, mask2 = (self._rows(a) for a in (x.view, dx, mask))
        return [linear_head.head_backward(x2, dy, self.weight(p), dx2, self.weight(g), self.bias(g), relu_mask=mask2,
                                          launch=False, **binder.threads)]

    def _rows(self, a):
        """a (rows, ...) as the (rows, inputs) matrix the kernels take (None stays None)."""
        return a if a is None or len(a.shape) == 2 else a.reshape(a.shape[0], self.inputs)


class ReluStage(Stage):
    """A ReLU not fused into the layer before it (the unfused policies): in place, like E1's kernels."""

    in_place = True

    def __repr__(self):
        return "ReLU"

    def forward(self, binder, x, y):
        from gpunn.kernels import elementwise

        return [elementwise.relu_forward(x.view, y.view, launch=False, **binder.threads)]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels import elementwise

        return [elementwise.relu_backward(y.view, dy, dx, launch=False, **binder.threads)]


class FlattenStage(Stage):
    view = True

    def __repr__(self):
        return "Flatten"

    def out_shape(self, in_shape):
        return (math.prod(in_shape),)


class Conv2dStage(Stage):
    """Stride-1 convolution (gpunn.kernels.conv), the versions per pass from the policy; bias and ReLU fused
    into the forward under a fusing policy, the bias gradient its own launches or, where the policy's bias_grad
    version is BIAS_WITH_WEIGHT, made by the weight-gradient launches (ConvVersion.with_bias)."""

    def __init__(self, layer: Conv2d, offset: int, relu: bool, up: bool = False):
        self.cin, self.cout = layer.in_channels, layer.out_channels
        self.k, self.padding = layer.kernel_size, layer.padding
        self.offset = offset
        self.relu = relu
        self.up = up  # its input is the map before a 2x Upsample fused into it (conv.UP_VERSIONS)
        self.params = self.cout * self.cin * self.k * self.k + self.cout

    def __repr__(self):
        return (f"{'Upsample(2)+' if self.up else ''}Conv2d({self.cin}, {self.cout}, k{self.k}, p{self.padding}"
                f"{', relu' if self.relu else ''})")

    def out_shape(self, in_shape):
        if len(in_shape) != 3 or in_shape[0] != self.cin:
            raise GpunnError(f"GPU engine: {self!r} gets inputs of shape {in_shape}, wants ({self.cin}, H, W)")
        _, h, w = in_shape
        if self.up:
            h, w = 2 * h, 2 * w
        grow = 2 * self.padding - self.k + 1
        return (self.cout, h + grow, w + grow)

    def weight(self, buf):
        return buf[self.offset:self.offset + self.cout * self.cin * self.k * self.k].reshape(
            self.cout, self.cin, self.k, self.k)

    def bias(self, buf):
        start = self.offset + self.cout * self.cin * self.k * self.k
        return buf[start:start + self.cout]

    def _name(self, binder, step: str, x=None) -> str:
        """The pass's version name under the policy (policy.conv_version: "auto" chooses by this layer's shape and,
        given its input x, size)."""
        size = None if x is None else tuple((2 if self.up else 1) * int(s) for s in x.shape[2:])
        return conv_version(binder.policy, step, self.cin, self.cout, self.k, self.padding, size, up=self.up)

    def _version(self, binder, step: str, x=None, with_bias: bool = False):
        """The pass's launcher under the policy, given the run's block size unless it runs a fixed block
        (ConvVersion.takes_threads); `with_bias`: the weight-gradient version's launcher that makes the bias
        gradient too."""
        import functools

        from gpunn.kernels import conv

        name = self._name(binder, step, x)
        version = conv.upsampled_version(step, name) if self.up else conv.VERSIONS[step][name]
        launcher = version.with_bias if with_bias else version.launcher
        if launcher is None:
            raise ValueError(f"GPU engine: {self!r}: bias_grad {BIAS_WITH_WEIGHT!r} needs a weight-gradient version "
                             f"that makes the bias gradient (conv.ConvVersion.with_bias); {name!r} does not: "
                             f"choose another bias_grad or backward_weight version")
        threads = binder.threads if version.takes_threads else {}
        return functools.partial(launcher, launch=False, **threads, **self._tensor_kw(binder, step, name))

    def _tensor_kw(self, binder, step: str, name: str) -> dict:
        """The pass's keywords under a precision policy where it runs on the tensor cores (tensor_pass): its GEMM's
        version (precision_gemm) and, for a ``winograd`` pass, its transform buffers' storage (_winograd_storage);
        else none."""
        if not tensor_pass(binder.policy, step, self.cin, self.cout, self.k, self.up):
            return {}
        kw = {"version": precision_gemm(binder.policy)}
        if name == "winograd" and self._winograd_storage(binder) == "bf16":
            kw["storage"] = "bf16"
        return kw

    def _winograd_storage(self, binder) -> str:
        """The storage of this conv's Winograd transform buffers under the policy: "bf16" with WINOGRAD_BF16_STORAGE
        on, for a bf16 policy whose three passes of this conv are on the tensor cores (the forward's kept V is read
        by the weight gradient: one storage for all), else "fp32"."""
        policy = binder.policy
        tensor = all(tensor_pass(policy, step, self.cin, self.cout, self.k)
                     for step in ("forward", "backward_data", "backward_weight"))
        return "bf16" if WINOGRAD_BF16_STORAGE and policy.precision == "bf16" and tensor else "fp32"

    def _shares_winograd_input(self, binder, x) -> bool:
        """Whether the forward and the weight gradient both run ``winograd`` (SHARE_WINOGRAD_INPUT on): the
        forward then keeps x's transform in y.aux and the weight gradient reads it (x is transformed once)."""
        if not SHARE_WINOGRAD_INPUT:
            return False
        size = tuple((2 if self.up else 1) * int(s) for s in x.shape[2:])
        return all(conv_version(binder.policy, step, self.cin, self.cout, self.k, self.padding, size) == "winograd"
                   for step in ("forward", "backward_weight"))

    def forward(self, binder, x, y):
        # the bias is part of every conv forward (as in the papers' naive kernels); the ReLU only when fused
        p = binder.params
        kw = {}
        if self._shares_winograd_input(binder, x.view):
            from numba import cuda

            from gpunn.kernels.conv import winograd

            y.aux = cuda.device_array(winograd.input_transform_size(x.view.shape, self.padding, self.up),
                                      winograd.transform_dtype(self._winograd_storage(binder)))
            kw["v"] = y.aux  # x transformed, for this program's weight gradient
        forward = self._version(binder, "forward", x.view)
        return [forward(x.view, self.weight(p), self.bias(p), y.view, self.padding, relu=self.relu, **kw)]

    def backward(self, binder, x, y, dy, dx, mask):
        p, g = binder.params, binder.grads
        launches = []
        if dx is not None:
            launches.append(self._version(binder, "backward_data")(dy, self.weight(p), dx, self.padding,
                                                                   relu_mask=mask))
        kw = {"v": y.aux} if self._shares_winograd_input(binder, x.view) else {}
        if self._name(binder, "bias_grad", x.view) == BIAS_WITH_WEIGHT:  # one pass makes both
            launches.append(self._version(binder, "backward_weight", x.view, with_bias=True)(
                x.view, dy, self.weight(g), self.bias(g), self.padding, **kw))
            return launches
        launches.append(self._version(binder, "backward_weight", x.view)(x.view, dy, self.weight(g), self.padding,
                                                                         **kw))
        launches.append(self._version(binder, "bias_grad")(dy, self.bias(g)))
        return launches


class ConvPoolStage(Conv2dStage):
    """Conv2d + ReLU + MaxPool2d(2) as one stage (gpunn.kernels.conv.pooled, under the policy's `pool`): the forward
    writes the pooled output and its route (y.aux: the winner per window, or none where the ReLU passed nothing),
    the backward reads the pooled gradient through the route, so the conv's full-size output and gradient are never
    stored. `relu` stays False: the route carries the ReLU, the next layer's input gradient needs no mask."""

    def __init__(self, layer: Conv2d, offset: int):
        super().__init__(layer, offset, relu=False)

    def __repr__(self):
        return f"Conv2d({self.cin}, {self.cout}, k{self.k}, p{self.padding}, relu, maxpool2)"

    def out_shape(self, in_shape):
        c, h, w = super().out_shape(in_shape)
        return (c, h // 2, w // 2)

    def _direct(self, binder, step: str, x) -> bool:
        """Whether the pass `step` (forward, backward_data) runs as a direct convolution (policy.pool_conv "direct"
        where direct_pooled's limits allow this layer on x's maps; else the pooled GEMMs)."""
        if binder.policy.pool_conv[step] != "direct":
            return False
        from gpunn.kernels.conv import direct_pooled

        h, w = (int(s) for s in x.view.shape[2:])
        return direct_pooled.direct_fits(self.cin, self.cout, self.k, self.padding, h, w)

    def forward(self, binder, x, y):
        from numba import cuda

        from gpunn.kernels.conv import direct_pooled, pooled

        p = binder.params
        y.aux = cuda.device_array(y.view.shape, np.int8)  # the route, for this program's backward
        launcher = (direct_pooled.conv_forward_pool_direct if self._direct(binder, "forward", x)
                    else pooled.conv_forward_pool_implicit_gemm)
        return [launcher(x.view, self.weight(p), self.bias(p), y.view, y.aux, self.padding, launch=False)]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels.conv import direct_pooled, pooled

        p, g = binder.params, binder.grads
        launches = []
        if dx is not None:
            launcher = (direct_pooled.conv_backward_data_pool_direct if self._direct(binder, "backward_data", x)
                        else pooled.conv_backward_data_pool_implicit_gemm)
            launches.append(launcher(dy, y.aux, self.weight(p), dx, self.padding, relu_mask=mask, launch=False))
        both = pool_bias_with_weight(binder.policy, self.cin, self.cout, self.k, tuple(int(s) for s in dy.shape[2:]))
        if both is not None:  # one pass makes the weight and bias gradients
            from gpunn.kernels.conv import POOL_WGRAD_BIAS

            launches.append(POOL_WGRAD_BIAS[both](x.view, dy, y.aux, self.weight(g), self.bias(g), self.padding,
                                                  launch=False))
            return launches
        launches.append(pooled.conv_backward_weight_pool_implicit_gemm(x.view, dy, y.aux, self.weight(g),
                                                                       self.padding, launch=False))
        launches.append(pooled.conv_bias_grad_pool(dy, y.aux, self.bias(g), launch=False, **binder.threads))
        return launches


class WinogradPoolStage(ConvPoolStage):
    """ConvPoolStage on Winograd F(2x2, 3x3)'s pooled passes (gpunn.kernels.conv.winograd_pool), where
    policy.pool_winograd says so: the forward's output transform adds the bias, applies the ReLU and writes the pooled
    map and route; the gradients read the pooled gradient through the route. Each pass gets the plain Winograd
    pass's keywords (_tensor_kw) and the forward keeps x's transform V where _shares_winograd_input; the bias
    gradient is made by the weight-gradient pass under BIAS_WITH_WEIGHT, else by the pooled bias launches.
    y.aux = (route, V or None)."""

    def __repr__(self):
        return f"Conv2d({self.cin}, {self.cout}, k{self.k}, p{self.padding}, relu, maxpool2, winograd)"

    def forward(self, binder, x, y):
        from numba import cuda

        from gpunn.kernels.conv import winograd, winograd_pool

        p = binder.params
        route = cuda.device_array(y.view.shape, np.int8)  # the route, for this program's backward
        v = None
        if self._shares_winograd_input(binder, x.view):  # x transformed, for this program's weight gradient
            v = cuda.device_array(winograd.input_transform_size(x.view.shape, self.padding, pool=True),
                                  winograd.transform_dtype(self._winograd_storage(binder)))
        y.aux = (route, v)
        return [winograd_pool.conv_forward_pool_winograd(x.view, self.weight(p), self.bias(p), y.view, route,
                                                         self.padding, launch=False, v=v,
                                                         **self._tensor_kw(binder, "forward", "winograd"))]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels.conv import pooled, winograd_pool

        p, g = binder.params, binder.grads
        route, v = y.aux
        launches = []
        if dx is not None:
            launches.append(winograd_pool.conv_backward_data_pool_winograd(
                dy, route, self.weight(p), dx, self.padding, relu_mask=mask, launch=False,
                **self._tensor_kw(binder, "backward_data", "winograd")))
        kw = {"v": v, "launch": False, **self._tensor_kw(binder, "backward_weight", "winograd")}
        if self._name(binder, "bias_grad", x.view) == BIAS_WITH_WEIGHT:  # one pass makes both
            launches.append(winograd_pool.conv_backward_weight_bias_pool_winograd(
                x.view, dy, route, self.weight(g), self.bias(g), self.padding, **kw))
            return launches
        launches.append(winograd_pool.conv_backward_weight_pool_winograd(x.view, dy, route, self.weight(g),
                                                                         self.padding, **kw))
        launches.append(pooled.conv_bias_grad_pool(dy, route, self.bias(g), launch=False, **binder.threads))
        return launches


class MaxPool2dStage(Stage):
    """2x2 max pool (gpunn.kernels.pool): forward with the argmax, backward by the policy's version (atomic
    scatter or race-free gather), the ReLU mask of the layer before fused into the backward."""

    def __repr__(self):
        return "MaxPool2d(2)"

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, h // 2, w // 2)

    def forward(self, binder, x, y):
        from numba import cuda

        from gpunn.kernels import pool

        y.aux = cuda.device_array(y.view.shape, np.int8)  # the winners, for this program's backward
        return [pool.maxpool2x2_forward_v1(x.view, y.view, y.aux, launch=False, **binder.threads)]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels import pool

        if dx is None:
            return []
        backward = pool.OPS["maxpool2x2_backward"][binder.policy.pool_backward]
        return [backward(dy, y.aux, dx, relu_mask=mask, launch=False, **binder.threads)]


class UpsampleStage(Stage):
    def __repr__(self):
        return "Upsample(2)"

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, 2 * h, 2 * w)

    def forward(self, binder, x, y):
        from gpunn.kernels import pool

        return [pool.upsample2x_forward(x.view, y.view, launch=False, **binder.threads)]

    def backward(self, binder, x, y, dy, dx, mask):
        from gpunn.kernels import pool

        return [] if dx is None else [pool.upsample2x_backward(dy, dx, relu_mask=mask, launch=False, **binder.threads)]


# ---- heads: the loss gradient of the model's output and the per-sample losses


def softmax_ce_head(binder, out, labels, target, dout, losses, counter, stride) -> list:
    from gpunn.kernels import softmax

    return [softmax.softmax_ce_grad(out, labels, dout, losses, block=binder.policy.ce_block, counter=counter,
                                    stride=stride, launch=False, reduction=binder.reduction)]


def mse_head(binder, out, labels, target, dout, losses, counter, stride) -> list:
    from gpunn.kernels import mse

    return [mse.mse_loss_grad(out, target, dout, losses, counter=counter, stride=stride, launch=False,
                              **binder.threads)]


# the loss head of each gpunn.nn.models.ModelSpec.loss
HEADS = {"softmax_ce": softmax_ce_head, "mse": mse_head}


# ---- planning


STAGES = {
    Linear: LinearStage,
    Conv2d: Conv2dStage,
    ReLU: lambda layer, offset, relu: ReluStage(),
    Flatten: lambda layer, offset, relu: FlattenStage(),
    MaxPool2d: lambda layer, offset, relu: MaxPool2dStage(),
    Upsample: lambda layer, offset, relu: UpsampleStage(),
}
FUSES_RELU = (Linear, Conv2d)  # layer types whose kernels take a ReLU epilogue


def plan(layers, policy: Policy, fold: bool, loss: str | None = None) -> list[Stage]:
    """The stages of a model's layer list under `policy`; `fold` allows folded biases and `loss` (the model's, None:
    no loss head) a final Linear fused with it (training programs)."""
    stages: list[Stage] = []
    offset = 0
    i = 0
    while i < len(layers):
        layer = layers[i]
        make = STAGES.get(type(layer))
        if make is None:
            raise GpunnError(f"GPU engine: no GPU launcher for layer {layer!r} yet (gpunn.backends.gpu.layers.STAGES)")
        up = (policy.upsample == "fused" and isinstance(layer, Upsample) and i + 1 < len(layers)
              and isinstance(layers[i + 1], Conv2d))
        if up:  # the Upsample's stage is the conv's, reading through it
            i += 1
            layer = layers[i]
        relu = policy.fuse and isinstance(layer, FUSES_RELU) and i + 1 < len(layers) and isinstance(layers[i + 1], ReLU)
        if (not up and relu and isinstance(layer, Conv2d) and i + 2 < len(layers)  # Conv2d + ReLU + MaxPool2d
                and isinstance(layers[i + 2], MaxPool2d)
                and pool_fused(policy, layer.in_channels, layer.out_channels, layer.kernel_size, layer.padding)):
            winograd = pool_winograd(policy, layer.in_channels, layer.out_channels, layer.kernel_size, layer.padding)
            stage = (WinogradPoolStage if winograd else ConvPoolStage)(layer, offset)
            offset += stage.params
            stages.append(stage)
            i += 3
            continue
        if (isinstance(layer, Linear) and i == len(layers) - 1 and fold
                and head_fused(policy, loss, layer.out_features)):
            stage = LinearHeadStage(layer, offset)
        else:
            stage = Conv2dStage(layer, offset, relu, up=True) if up else make(layer, offset, relu)
        offset += stage.params
        stages.append(stage)
        i += 2 if relu else 1
    if fold and policy.fuse:
        producer = "gather"  # the batch gather writes (rows, features) rows into any strided 2-D view
        for stage in stages:
            if producer == "gather" and stage.view:
                continue  # leading Flatten: the engine's input buffer is already (rows, features)
            if isinstance(stage, LinearStage) and not isinstance(stage, LinearHeadStage):
                stage.fold = producer == "gather" or isinstance(producer, LinearStage)
            producer = stage
    return stages
