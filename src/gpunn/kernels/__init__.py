"""numba.cuda kernels of gpunn, one module per op, or one package per family for GEMM and convolution (llm.c
``dev/cuda`` style: named versions, a small launcher each, a dispatcher, and the CPU reference beside them).

* ``gemm`` (package): ``C = op(A) @ op(B)`` (+ bias, + ReLU, or a ReLU-backward mask): versions ``naive``,
  ``tiled16``, ``regblock``, ``regblock128``, ``skinny``, one module each, one ``VERSIONS`` table; operand
  mappings (im2col, weights, NCHW stores) and split-K. ``gemm.rbf``: its float64 member, ``A @ B^T`` with an RBF
  epilogue (E6's SVM kernel matrix, equal to scikit-learn's ``rbf_kernel`` to rounding) and the squared row norms.
* ``conv`` (package): stride-1 convolution forward, backward-data, backward-weight and bias gradient: ``naive``,
  ``tiled``, block reductions, ``staged``, ``implicit_gemm`` (on the GEMM package's mappings), ``split``.
* ``common``: what the GEMM and convolution families share (epilogue arguments and flags, grid arithmetic).
* ``pool``: 2x2 max pool (forward with argmax; atomic and gather backward) and nearest 2x upsampling.
* ``mse``: the autoencoder's MSE head (per-sample losses and the gradient in one launch).
* ``elementwise``: element-wise activations and their gradients.
* ``softmax``: row-wise softmax and softmax cross-entropy.
* ``reduce``: sums and reductions (e.g. bias gradients).
* ``sgd``: the SGD parameter update.
* ``mlp_step``: a two-layer ReLU MLP's whole softmax-CE training step in two launches (a cooperative forward
  with one grid-wide sync, a backward applying the SGD update), or three plain ones (gpu-graph's MLP step).
* ``launch``: bound launches (grid, block and arguments fixed once) that training steps replay or capture,
  the argument checks every module shares, the event clock; importing it silences numba's low-occupancy
  warnings.
* ``transfers``: bound host<->device copies and events (pointers, sizes and streams fixed once), the host path of
  the per-step variants.

Nothing heavy is imported here, so ``import gpunn.kernels`` does not pull in numba; import the op modules
directly (``from gpunn.kernels import gemm``). Importing it first brings the package's .pyc files up to date, so that
the on-disk kernel cache's keys are the same in every process (gpunn.kernel_cache.byte_compile_kernels).
"""

from gpunn.kernel_cache import byte_compile_kernels

byte_compile_kernels()
