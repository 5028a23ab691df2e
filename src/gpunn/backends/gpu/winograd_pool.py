"""The engine's Conv2d + ReLU + MaxPool2d(2) stage on Winograd F(2x2, 3x3) (gpunn.kernels.conv.winograd_pool),
chosen by layers.plan where policy.pool_winograd says so (the autoencoder's 256 -> 128 conv2 under gpu-graph, gpu-tf32
and gpu-bf16). It replaces a Winograd Conv2dStage (bias + ReLU) and its MaxPool2dStage with the same bits: the
forward's output transform adds the bias, applies the ReLU and writes the pooled map and the route (the pooled
family's format, ConvPoolStage's); the input and weight gradients read the pooled gradient through the route. Each
pass gets the plain Winograd pass's arguments (Conv2dStage._tensor_kw: the batched GEMM on the tensor cores and BF16
transform buffers where the plain passes have them), and the forward keeps x's transform V for the weight gradient
where Conv2dStage would (_shares_winograd_input). The bias gradient: made by the weight-gradient pass where the
layer's bias_grad version is BIAS_WITH_WEIGHT (policy.AUTO_WINOGRAD_BIAS), else the pooled bias launches
(pooled.conv_bias_grad_pool, ConvPoolStage's: the full-size gradient the split reduction would sum is never made).
"""

from __future__ import annotations

import numpy as np

from .layers import ConvPoolStage
from .policy import BIAS_WITH_WEIGHT


class WinogradPoolStage(ConvPoolStage):
    """ConvPoolStage on the Winograd pooled passes; y.aux = (route, V or None)."""

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
