"""The persistent step program (Policy.step "persistent" or "phased"): a two-layer ReLU MLP with the softmax-CE
head trained on resident data in two launches a step (three when phased), gpunn.kernels.mlp_step, instead of one
stage launch per layer op.

`fits` says whether a model is one the step covers: [Flatten,] Linear, ReLU, Linear under the softmax_ce loss
with at most mlp_step.MAX_CLASSES classes; the engine builds every other model, and any program whose batch is
copied from the host rather than gathered on the device, from the layer stages (layers.py). `launches` binds the
step on the engine's flat parameter and gradient buffers, in the folded layout the layer stages use
(LinearStage.weight: each bias row right after its W), so both paths train the same parameters.

The engine's Program contract holds: `forward` (the forward launch(es): gather, both layers, loss head, per-sample
losses, dh) and `backward` ending in its `updates` = 1 SGD launch, here the backward itself, which applies each
parameter's update as it makes its gradient and advances the step counter. Its non-updating twin, writing the
gradient buffer instead, ends the program's `gradients` list (what GpuEngine.gradients runs).
"""

from __future__ import annotations

from gpunn.nn import Flatten, Linear, ReLU

from .layers import LinearStage

STEPS = ("persistent", "phased")  # the Policy.step values this module serves (mlp_step's versions)


def fits(engine) -> bool:
    """Whether `engine`'s policy asks for the persistent step and its model is one it covers."""
    from gpunn.kernels.mlp_step import MAX_CLASSES

    policy = engine.policy
    if policy.step not in STEPS or not policy.resident or engine.model_spec.loss != "softmax_ce":
        return False
    layers = list(engine.model.layers)
    if layers and isinstance(layers[0], Flatten):
        layers = layers[1:]
    kinds = [type(layer) for layer in layers]
    return (kinds == [Linear, ReLU, Linear] and layers[0].out_features == layers[2].in_features
            and 2 <= layers[2].out_features <= MAX_CLASSES)


def _weights(engine):
    """(fc1, fc2): the two LinearStages of the engine's plan (their offsets into the flat buffers)."""
    fc1, fc2 = (stage for stage in engine.train_stages if isinstance(stage, LinearStage))
    return fc1, fc2


def launches(engine, rows: int, source, labels, order, counter, stride: int, losses) -> tuple[list, list, list]:
    """(forward, backward, gradients) of the step on `rows` rows gathered from the resident `source` by (order,
    counter, stride): the launches of the engine's Program (backward: the updating launch alone; gradients: the
    forward and the non-updating backward)."""
    from gpunn.kernels import mlp_step

    fc1, fc2 = _weights(engine)
    block = engine.policy.block or mlp_step.BLOCK
    buffers = mlp_step.step_buffers(rows, fc1.inputs, fc1.outputs, fc2.outputs, block=block)
    p, g = engine.params, engine.grads
    w1, w2 = fc1.weight(p, with_bias=True), fc2.weight(p, with_bias=True)
    forward = mlp_step.step_forward(source, labels, order, counter, stride, w1, w2, losses, buffers,
                                    reduction=engine.binder.reduction, version=engine.policy.step, block=block,
                                    stream=engine.stream, launch=False)
    forward = list(getattr(forward, "launches", [forward]))  # the phased version: two launches
    kw = {"block": block, "stream": engine.stream, "launch": False}
    update = mlp_step.step_backward(source, w1, w2, buffers, engine.lr, counter, **kw)
    grads = mlp_step.step_backward(source, w1, w2, buffers, engine.lr, counter, **kw,
                                   grads=(fc1.weight(g, with_bias=True), fc2.weight(g, with_bias=True)))
    return forward, [update], forward + [grads]
