"""CPU references of gpunn: NumPy forward/backward ops (`functional`), layers and losses, the flat-buffer
`Sequential`, the three models (MLP, CNN, autoencoder) and their records (`MODELS`), SGD, and the numba serial
MLP baseline (`serial`).

    from gpunn.nn import Linear, ReLU, SoftmaxCrossEntropy, SGD, forward, backward, parameters
    layers = [Linear(784, 256), ReLU(), Linear(256, 10)]
    opt = SGD(parameters(layers), lr=0.01)

    from gpunn.nn import mlp
    model = mlp(seed=0)                      # Sequential, all parameters in model.flat
    opt = SGD(model.parameters(), lr=0.01)   # one vectorised update over the flat buffer
"""

from . import functional
from .layers import (
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    Module,
    MSELoss,
    Parameter,
    ParameterBuffer,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    Upsample,
    backward,
    forward,
    parameters,
)
from .models import MODELS, Autoencoder, ModelSpec, autoencoder, build_model, cnn, mlp, model_spec
from .optim import SGD

__all__ = [
    "functional",
    "Parameter",
    "Module",
    "Linear",
    "ReLU",
    "Conv2d",
    "MaxPool2d",
    "Upsample",
    "Flatten",
    "SoftmaxCrossEntropy",
    "MSELoss",
    "ParameterBuffer",
    "Sequential",
    "forward",
    "backward",
    "parameters",
    "mlp",
    "cnn",
    "autoencoder",
    "Autoencoder",
    "build_model",
    "MODELS",
    "ModelSpec",
    "model_spec",
    "SGD",
    "SerialMLP",
]


def __getattr__(name):
    # The serial baseline imports numba; load it only when asked for.
    if name == "SerialMLP":
        from .serial import SerialMLP

        return SerialMLP
    raise AttributeError(f"module 'gpunn.nn' has no attribute {name!r}")
