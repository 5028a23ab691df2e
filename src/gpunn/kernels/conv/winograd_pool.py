"""Convolution version ``winograd`` fused with ReLU and the 2x2 max pool (the ``pooled`` family's format: pooled
output and int8 route per window, ROUTE_NONE where the ReLU passed nothing, first position on ties, NaN wins).

F(2x2, 3x3)'s output tile is a 2x2 block at an even origin: exactly one pooling window. So the tiles of these
passes are the pooling windows (N * (OH//2) * (OW//2) of them; an odd OH or OW's last conv row / column belongs to
no window and is neither computed nor given a gradient, MaxPool2d's floor), and:

* forward (``conv_forward_pool_winograd``): ``winograd``'s weight and input transforms and batched GEMM, then an
  output transform that adds the bias, applies the ReLU and takes the window's max and route
  (``gemm.mappings.window_epilogue``), writing the pooled map and the route only;
* weight gradient (``conv_backward_weight_pool_winograd``, with the bias gradient
  ``conv_backward_weight_bias_pool_winograd``): ``winograd_wgrad``'s passes with the dy transform reading a tile's
  2x2 dy through (dpool, route): dy[n, c, h, w] = dpool[n, c, h//2, w//2] where route == 2*(h%2) + w%2, else 0;
* input gradient (``conv_backward_data_pool_winograd``): ``winograd``'s input gradient with the input transform
  reading its 4x4 window of dy (four pooling windows) the same way (``winograd._reader``), on the expanded size
  (2*PH, 2*PW), zero beyond; the ReLU mask of the previous layer in the output transform.

Arguments as the pooled family's (``pooled``) plus the Winograd ones (``version``, ``block``, ``v``, ``storage``,
``splits``: ``winograd``). The forward's kept ``v`` (``input_transform_size(x_shape, padding, pool=True)``
elements) serves this step's pooled weight gradient. References: ``pooled.conv_relu_pool_forward_ref`` and
``pooled_grad_ref``. H200 figures, and the engine's stage on these passes: NOTES.md.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int8, uint32

from ..common import epilogue_args, epilogue_flags, shape
from ..gemm.mappings import window_epilogue
from ..jit import jit
from ..launch import LaunchGroup, check_device_array, flat
from .implicit_gemm import _activation, _expect, _geometry
from .pooled import _dgrad_checks, _pooled_pair, _pooled_shape
from .wgrad_bias import check_db
from .winograd import (
    _C,
    _T,
    _TH,
    _TW,
    _at_m,
    _at_m_a,
    _bind,
    _check,
    _input_kernel,
    _tile,
    output_launch,
    winograd_group,
)
from .winograd_wgrad import _winograd_wgrad

__all__ = ["conv_backward_data_pool_winograd", "conv_backward_weight_bias_pool_winograd",
           "conv_backward_weight_pool_winograd", "conv_forward_pool_winograd"]


@functools.cache
def _pool_output_kernel(epilogue):
    """The forward's output transform with the window epilogue (bias, ReLU: `epilogue`)."""
    has_bias, relu, _ = epilogue_flags(epilogue)
    pool = window_epilogue(has_bias, relu)

    @jit
    def pool_output_transform(m, c_out, aux, dims):
        """c_out = (pooled, route) flat (N, C, TH, TW): the max of tile t's A^T M A in channel c (m (16, C, T)) after
        the epilogue, and its position 2*i + j (ROUTE_NONE where the ReLU leaves it not > 0)."""
        t2 = cuda.local.array(8, float32)
        t_all = dims[_T]
        ct = uint32(dims[_C] * t_all)
        tt = uint32(dims[_TH] * dims[_TW])
        e = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        stride = uint32(cuda.gridDim.x * cuda.blockDim.x)
        while e < ct:
            c, n, ty, tx = _tile(e, t_all, tt, dims)
            _at_m(m, ct, e, t2)
            best, pos = pool(aux, c, _at_m_a(t2, 0, 0), _at_m_a(t2, 0, 1), _at_m_a(t2, 1, 0), _at_m_a(t2, 1, 1))
            idx = uint32(uint32(uint32(n * dims[_C] + c) * dims[_TH] + ty) * dims[_TW] + tx)
            c_out[0][idx] = best
            c_out[1][idx] = int8(pos)
            e = uint32(e + stride)

    return pool_output_transform


def conv_forward_pool_winograd(x, w, bias, out, route, padding, relu=True, version=None, block=None, stream=0,
                               launch=True, v=None, storage="fp32") -> LaunchGroup:
    """out, route (N, Cout, OH//2, OW//2) = maxpool2x2(ReLU(conv(x, w) + bias)) and its route, as
    ``pooled.conv_forward_pool_implicit_gemm``: x (N, Cin, H, W), w (Cout, Cin, 3, 3), bias (Cout,) or None;
    ``relu=False`` pools the conv itself. ``version``, ``block``, ``v``, ``storage`` as
    ``winograd.conv_forward_winograd``'s (``v``: ``input_transform_size(x.shape, padding, pool=True)`` elements)."""
    op = "conv_forward_pool_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), w, padding)
    _check(op, k, padding)
    n, cout = shape(x)[0], int(w.shape[0])
    pooled = _pooled_shape(op, n, cout, oh, ow)
    c = _pooled_pair(op, "out", out, route, pooled)
    if bias is not None:
        check_device_array(op, "bias", bias, 1)
        _expect(op, "bias", bias, (cout,))
    epilogue, aux = epilogue_args(op, bias, relu, None)

    def output(m, td):
        return _bind(_pool_output_kernel(epilogue), int(td[_C] * td[_T]), (m, c, aux, td), stream,
                     f"{op}[output transform + pool,{epilogue}]")

    return winograd_group(op, flat(x), shape(x), w, cout, 2 * pooled[2], 2 * pooled[3], padding, False, version,
                          block, stream, launch, output, _input_kernel(False, storage), v, storage)


def conv_backward_data_pool_winograd(dpool, route, w, dx, padding, relu_mask=None, version=None, block=None,
                                     stream=0, launch=True, storage="fp32") -> LaunchGroup:
    """dx (N, Cin, H, W) = dL/dx of the fused forward given dpool (its pooled output's gradient) and its route
    (N, Cout, OH//2, OW//2); dx = 0 where ``relu_mask`` (dx's shape) <= 0. ``storage``: the transformed dy's."""
    op = "conv_backward_data_pool_winograd"
    k, pooled, src = _dgrad_checks(op, dpool, route, w, dx, padding, relu_mask)
    _check(op, k, padding)
    cin, h, wd = shape(dx)[1:]
    epilogue, aux = epilogue_args(op, None, False, None if relu_mask is None else flat(relu_mask))
    # the source map is the pooled one, read as the expanded gradient (2PH, 2PW) (the input kernel's `pool`)
    return winograd_group(op, src, pooled, w, cin, h, wd, 2 - int(padding), True, version, block, stream, launch,
                          output_launch(op, epilogue, dx, aux, stream), _input_kernel(False, storage, pool=True),
                          None, storage)


def conv_backward_weight_pool_winograd(x, dpool, route, dw, padding, version=None, block=None, stream=0,
                                       launch=True, splits=None, v=None, storage="fp32") -> LaunchGroup:
    """dw (Cout, Cin, 3, 3) (overwritten) of the fused forward given dpool and its route; x (N, Cin, H, W).
    ``splits``, ``v`` (the pooled forward's), ``storage`` as ``winograd_wgrad.conv_backward_weight_winograd``'s."""
    op = "conv_backward_weight_pool_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    return _winograd_wgrad(op, x, dpool, dw, padding, k, oh, ow, version, block, stream, launch, splits, False, v,
                           storage, route=route)


def conv_backward_weight_bias_pool_winograd(x, dpool, route, dw, db, padding, version=None, block=None, stream=0,
                                            launch=True, splits=None, v=None, storage="fp32") -> LaunchGroup:
    """``conv_backward_weight_pool_winograd`` that also makes db (Cout,) = the sum of dpool over the windows with a
    route (``pooled.conv_bias_grad_pool``'s value) in its dy transform (``winograd_wgrad``'s with-bias path)."""
    op = "conv_backward_weight_bias_pool_winograd"
    _activation(op, "x", x)
    k, oh, ow = _geometry(op, shape(x), dw, padding, "dw")
    check_db(op, db, int(dw.shape[0]))
    return _winograd_wgrad(op, x, dpool, dw, padding, k, oh, ow, version, block, stream, launch, splits, False, v,
                           storage, db, route=route)
