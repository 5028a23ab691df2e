"""gpunn: neural networks trained from scratch on the GPU (numba.cuda), with float64-checked CPU references.

Subpackages:
    gpunn.data    download with md5 verification, IDX / CIFAR-10 parsers, offline datasets, prepared caches
    gpunn.nn      NumPy CPU references (layers, models, flat parameter buffer, SGD) and the numba serial MLP
    gpunn.report  figures and summary tables

The Python API (gpunn.api): a model of gpunn.nn trained on "cpu" or "cuda" without the pipeline,
`gpunn.api.Trainer(model, "cuda").fit(x, y)`.
"""

__version__ = "0.1.0"
