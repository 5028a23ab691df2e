"""Benchmark problems of the pooling, upsampling and MSE kernels (gpunn.kernels.pool, gpunn.kernels.mse), for
``python -m gpunn.bench pool``: every version is validated against its float64 reference, then timed, exactly
like the other op groups (gpunn.bench.validate / benchmark; the entry point is ``pool_problems``).

Shapes are the models' (batch 64):
    cnn     max pool of the second conv's ReLU output, 32x24x24
    ae      encoder pools 256x32x32 and 128x16x16; decoder upsamples 128x8x8 and 256x16x16; MSE at 3x32x32
    quick   tiny odd shapes for the simulator tests (``pool_problems(quick=True)``)

Problems, each op with every version of pool.OPS / mse.OPS:
    maxpool2x2_forward    v1                     torch: F.max_pool2d(x, 2, return_indices=True)
    maxpool2x2_backward   atomic, gather         torch: aten.max_pool2d_with_indices_backward (the kernel autograd
                                                 runs for max_pool2d, called directly: no autograd overhead)
        +relu_mask        atomic, gather         as training runs it, the ReLU backward of the pooled conv
                                                 fused; torch: the same + aten.threshold_backward
    upsample2x_forward    v1                     torch: F.interpolate(x, scale_factor=2, mode="nearest")
    upsample2x_backward   v1 (+relu_mask)        torch: aten.upsample_nearest2d_backward (+ threshold_backward)
    mse_loss_grad         mse_loss_grad          torch: per-sample F.mse_loss(reduction="none").mean and
                                                 aten.mse_loss_backward(mean)

rows/cols in the CSV are the batch and the elements per sample (C*H*W) of the op's input; the shape label is
the input's N x C x H x W. GB/s counts every array read or written once (argmax as 1 byte per element).
Memory-bound ops, so a version's GB/s against the H100's ~3.35 TB/s (H200 ~4.8 TB/s) HBM bandwidth says how
far it is from the roofline; at these sizes (1-17 M elements) launch latency is a large part of the time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpunn.bench.core import Problem, _launcher_problem, _Output, _random, _tensor
from gpunn.kernels import mse, pool

__all__ = ["AE_MSE", "AE_POOLS", "AE_UPSAMPLES", "CNN_POOLS", "QUICK", "pool_problems"]

# (case, input shape N x C x H x W)
CNN_POOLS = (("cnn_pool", (64, 32, 24, 24)),)
AE_POOLS = (("ae_pool1", (64, 256, 32, 32)), ("ae_pool2", (64, 128, 16, 16)))
AE_UPSAMPLES = (("ae_up1", (64, 128, 8, 8)), ("ae_up2", (64, 256, 16, 16)))
AE_MSE = (("ae_mse", (64, 3, 32, 32)),)
# quick: odd H/W (a dropped row and column), channels and batch that are multiples of nothing
QUICK = {"pool": (("quick_pool", (3, 5, 7, 9)),), "upsample": (("quick_up", (2, 3, 4, 5)),),
         "mse": (("quick_mse", (3, 5, 7, 9)),)}

_INT8_POISON = np.int8(-1)  # no valid argmax: an element never written fails the comparison


def _label(problem: Problem, shape) -> Problem:
    return dataclasses.replace(problem, shape_label="x".join(map(str, shape)))


def _problem(case, shape, kernel, launcher, args, outputs, expected, bytes_moved, torch_ref, n_elements):
    n = shape[0]
    per_sample = int(np.prod(shape[1:]))
    problem = _launcher_problem("pool", case, kernel, launcher, n, per_sample, args, outputs, expected,
                                bytes_moved, torch_ref, n_elements=n_elements)
    return _label(problem, shape)


def _pool_problems(case, shape, rng) -> list[Problem]:
    n, c, h, w = shape
    pooled = (n, c, h // 2, w // 2)
    n_in, n_out = int(np.prod(shape)), int(np.prod(pooled))
    x = _random(rng, shape)
    out_ref, argmax_ref = pool.maxpool2x2_forward_ref(x)
    dy = _random(rng, pooled)
    mask = _random(rng, shape)  # the pooled layer's ReLU output stands in: about half of it <= 0
    argmax_poisoned = np.full(pooled, _INT8_POISON, np.int8)  # a host array: copied fresh at every bind

    def forward_ref(torch):
        x_t = _tensor(torch, x)
        return "F.max_pool2d(return_indices=True)", \
            lambda: torch.nn.functional.max_pool2d(x_t, 2, return_indices=True)

    def backward_ref(masked):
        def ref(torch):
            x_t, dy_t, mask_t = _tensor(torch, x), _tensor(torch, dy), _tensor(torch, mask)
            _, indices = torch.nn.functional.max_pool2d(x_t, 2, return_indices=True)
            aten = torch.ops.aten

            def run():
                dx = aten.max_pool2d_with_indices_backward(dy_t, x_t, [2, 2], [2, 2], [0, 0], [1, 1], False, indices)
                if masked:
                    aten.threshold_backward(dx, mask_t, 0.0)

            return "aten.max_pool2d_with_indices_backward" + (" + threshold_backward" if masked else ""), run

        return ref

    problems = [_problem(case, shape, "maxpool2x2_forward_" + version, launcher,
                         (x, _Output(*pooled), argmax_poisoned), {"out": 1, "argmax": 2}, [out_ref, argmax_ref],
                         4 * n_in + 4 * n_out + n_out, forward_ref, n_out)
                for version, launcher in pool.OPS["maxpool2x2_forward"].items()]
    for masked in (False, True):
        expected = pool.maxpool2x2_backward_ref(dy, argmax_ref, shape, mask if masked else None)
        extra = (mask,) if masked else ()
        for version, launcher in pool.OPS["maxpool2x2_backward"].items():
            problems.append(_problem(
                case, shape, f"maxpool2x2_backward_{version}" + ("+relu_mask" if masked else ""), launcher,
                (dy, argmax_ref, _Output(*shape), *extra), {"dx": 2}, [expected],
                4 * n_out + n_out + 4 * n_in * (2 if masked else 1), backward_ref(masked), n_in))
    return problems


def _upsample_problems(case, shape, rng) -> list[Problem]:
    n, c, h, w = shape
    up = (n, c, 2 * h, 2 * w)
    n_in = int(np.prod(shape))
    x = _random(rng, shape)
    dy = _random(rng, up)
    mask = _random(rng, shape)

    def forward_ref(torch):
        x_t = _tensor(torch, x)
        return 'F.interpolate(scale_factor=2, mode="nearest")', \
            lambda: torch.nn.functional.interpolate(x_t, scale_factor=2, mode="nearest")

    def backward_ref(masked):
        def ref(torch):
            dy_t, mask_t = _tensor(torch, dy), _tensor(torch, mask)
            aten = torch.ops.aten

            def run():
                dx = aten.upsample_nearest2d_backward(dy_t, [2 * h, 2 * w], list(shape), 2.0, 2.0)
                if masked:
                    aten.threshold_backward(dx, mask_t, 0.0)

            return "aten.upsample_nearest2d_backward" + (" + threshold_backward" if masked else ""), run

        return ref

    problems = [_problem(case, shape, "upsample2x_forward_" + version, launcher, (x, _Output(*up)), {"out": 1},
                         [pool.upsample2x_forward_ref(x)], 4 * 5 * n_in, forward_ref, 4 * n_in)
                for version, launcher in pool.OPS["upsample2x_forward"].items()]
    for masked in (False, True):
        expected = pool.upsample2x_backward_ref(dy, mask if masked else None)
        extra = (mask,) if masked else ()
        problems += [_problem(case, shape, f"upsample2x_backward_{version}" + ("+relu_mask" if masked else ""),
                              launcher, (dy, _Output(*shape), *extra), {"dx": 1}, [expected],
                              4 * (5 + masked) * n_in, backward_ref(masked), n_in)
                     for version, launcher in pool.OPS["upsample2x_backward"].items()]
    return problems


def _mse_problems(case, shape, rng) -> list[Problem]:
    n = shape[0]
    size = int(np.prod(shape))
    pred = _random(rng, shape)
    target = np.abs(_random(rng, shape))  # images in [0, inf) against an unconstrained reconstruction
    expected_dpred, expected_losses = mse.mse_loss_grad_ref(pred, target)

    def mse_ref(torch):
        pred_t, target_t = _tensor(torch, pred), _tensor(torch, target)
        one = torch.ones((), device="cuda")

        def run():
            torch.nn.functional.mse_loss(pred_t, target_t, reduction="none").flatten(1).mean(1)
            torch.ops.aten.mse_loss_backward(one, pred_t, target_t, 1)  # 1: reduction mean

        return "F.mse_loss(reduction=none).mean(per sample) + aten.mse_loss_backward", run

    return [_problem(case, shape, name, launcher, (pred, target, _Output(*shape), _Output(n)),
                     {"dpred": 2, "losses": 3}, [expected_dpred, expected_losses], 4 * (3 * size + n), mse_ref,
                     size)
            for name, launcher in mse.OPS.items()]


def pool_problems(quick: bool = False, seed: int = 0) -> list[Problem]:
    """Every pool/upsample/MSE problem at the models' shapes (tiny odd ones with `quick`): what
    ``gpunn.bench.op_problems("pool", quick, seed)`` should return."""
    rng = np.random.default_rng(seed)
    pools = QUICK["pool"] if quick else CNN_POOLS + AE_POOLS
    upsamples = QUICK["upsample"] if quick else AE_UPSAMPLES
    losses = QUICK["mse"] if quick else AE_MSE
    return ([p for case, shape in pools for p in _pool_problems(case, shape, rng)]
            + [p for case, shape in upsamples for p in _upsample_problems(case, shape, rng)]
            + [p for case, shape in losses for p in _mse_problems(case, shape, rng)])
