"""Memory-bound problems, one builder per op family (elementwise, softmax, reduce, sgd): each kernel of the
family on one (rows, cols) shape, with its float64 reference and the equivalent torch op."""

from __future__ import annotations

import numpy as np

from gpunn.bench.core import Problem, _launcher_problem, _Output, _random, _tensor
from gpunn.kernels import elementwise, reduce, sgd, softmax

SGD_LR = 0.01
MEMORY_SHAPES = {"mlp_hidden": (64, 256), "large_odd": (8191, 4099)}
QUICK_MEMORY_SHAPES = {"quick": (3, 37)}


def elementwise_problems(rows, cols, case, rng) -> list[Problem]:
    x = _random(rng, (rows, cols))
    bias = _random(rng, (cols,))
    dy = _random(rng, (rows, cols))
    n = rows * cols

    def bias_add_ref(torch):
        x_t, b_t = _tensor(torch, x), _tensor(torch, bias)
        return "torch x.add_(bias)", lambda: x_t.add_(b_t)

    def relu_forward_ref(torch):
        x_t = _tensor(torch, x)
        return "torch.relu", lambda: torch.relu(x_t)

    def relu_backward_ref(torch):
        x_t, dy_t = _tensor(torch, x), _tensor(torch, dy)
        # the kernel autograd runs for ReLU's backward
        return "aten.threshold_backward", lambda: torch.ops.aten.threshold_backward(dy_t, x_t, 0.0)

    def bias_relu_ref(torch):
        x_t, b_t = _tensor(torch, x), _tensor(torch, bias)
        return "torch x.add_(bias).relu_()", lambda: x_t.add_(b_t).relu_()

    ew = elementwise
    return [
        _launcher_problem("elementwise", case, "bias_add", ew.bias_add, rows, cols, (x, bias), {"x": 0},
                          [ew.bias_add_ref(x, bias)], 4 * (2 * n + cols), bias_add_ref),
        _launcher_problem("elementwise", case, "relu_forward", ew.relu_forward, rows, cols, (x, _Output(rows, cols)),
                          {"out": 1}, [ew.relu_forward_ref(x)], 4 * 2 * n, relu_forward_ref),
        _launcher_problem("elementwise", case, "relu_backward", ew.relu_backward, rows, cols,
                          (x, dy, _Output(rows, cols)), {"dx": 2}, [ew.relu_backward_ref(x, dy)], 4 * 3 * n,
                          relu_backward_ref),
        _launcher_problem("elementwise", case, "bias_relu", ew.bias_relu, rows, cols, (x, bias), {"x": 0},
                          [ew.bias_relu_ref(x, bias)], 4 * (2 * n + cols), bias_relu_ref),
    ]


def softmax_problems(rows, cols, case, rng) -> list[Problem]:
    x = _random(rng, (rows, cols), scale=3.0) + np.float32(20.0)  # an offset only a max-subtracting softmax survives
    logits = _random(rng, (rows, cols), scale=3.0)
    labels = rng.integers(0, cols, size=rows).astype(np.int32)
    losses = np.abs(_random(rng, (rows,)))
    expected_dlogits, expected_losses = softmax.softmax_ce_grad_ref(logits, labels)
    n = rows * cols

    def softmax_rows_ref(torch):
        x_t = _tensor(torch, x)
        return "torch.softmax", lambda: torch.softmax(x_t, dim=1)

    def softmax_ce_grad_ref(torch):
        logits_t = _tensor(torch, logits)
        labels_t = torch.from_numpy(labels.astype(np.int64)).cuda()
        onehot = torch.nn.functional.one_hot(labels_t, cols).float()

        def run():
            torch.nn.functional.cross_entropy(logits_t, labels_t, reduction="none")
            torch.softmax(logits_t, dim=1).sub_(onehot).div_(rows)

        return "torch cross_entropy(reduction=none) + (softmax - onehot) / B", run

    def loss_mean_ref(torch):
        losses_t = _tensor(torch, losses)
        return "torch.mean", lambda: torch.mean(losses_t)

    return [
        _launcher_problem("softmax", case, "softmax_rows", softmax.softmax_rows, rows, cols,
                          (x, _Output(rows, cols)), {"out": 1}, [softmax.softmax_ref(x)], 4 * 2 * n,
                          softmax_rows_ref),
        _launcher_problem("softmax", case, "softmax_ce_grad", softmax.softmax_ce_grad, rows, cols,
                          (logits, labels, _Output(rows, cols), _Output(rows)), {"dlogits": 2, "losses": 3},
                          [expected_dlogits, expected_losses], 4 * (2 * n + 2 * rows), softmax_ce_grad_ref),
        # the mean over the batch's per-row losses, as in training: `rows` elements, one block
        _launcher_problem("softmax", case, "loss_mean", softmax.loss_mean, rows, cols, (losses, _Output(1)),
                          {"out": 1}, [softmax.loss_mean_ref(losses)], 4 * (rows + 1), loss_mean_ref,
                          n_elements=rows),
    ]


def reduce_problems(rows, cols, case, rng) -> list[Problem]:
    dy = _random(rng, (rows, cols))

    def colsum_ref(torch):
        dy_t = _tensor(torch, dy)
        return "torch.sum(dim=0)", lambda: torch.sum(dy_t, dim=0)

    return [
        _launcher_problem("reduce", case, name, launcher, rows, cols, (dy, _Output(cols)), {"db": 1},
                          [reduce.colsum_ref(dy)], 4 * (rows * cols + cols), colsum_ref)
        for name, launcher in reduce.VERSIONS.items()
    ]


def sgd_problems(rows, cols, case, rng) -> list[Problem]:
    params = _random(rng, (rows * cols,))
    grad = _random(rng, (rows * cols,))

    def sgd_ref(torch):
        params_t, grad_t = _tensor(torch, params), _tensor(torch, grad)

        def run():
            params_t.add_(grad_t, alpha=-SGD_LR)
            grad_t.zero_()

        return "torch p.add_(g, alpha=-lr); g.zero_()", run

    # reads and writes both buffers: the update and the fused zero_grad
    return [_launcher_problem("sgd", case, "sgd_step", sgd.sgd_step, rows, cols, (params, grad, SGD_LR),
                              {"flat": 0, "grad": 1},
                              [sgd.sgd_step_ref64(params, grad, SGD_LR), np.zeros(rows * cols)],
                              4 * 4 * rows * cols, sgd_ref)]


MEMORY_BOUND_BUILDERS = {"elementwise": elementwise_problems, "softmax": softmax_problems,
                         "reduce": reduce_problems, "sgd": sgd_problems}
