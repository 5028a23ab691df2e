"""numba.cuda kernels of gpunn, one module per op (llm.c ``dev/cuda`` style: numbered versions, a small
launcher each, a dispatcher, and the CPU reference in the same file).

* ``gemm``: ``C = op(A) @ op(B)`` (+ bias, + ReLU, or a ReLU-backward mask): naive, 16x16 shared-memory
  tiles, register-blocked 64x64 and 128x128 tiles.
* ``gemm_rbf``: the float64 member of the GEMM family, ``A @ B^T`` with an RBF epilogue (E6's SVM kernel
  matrix, equal to scikit-learn's ``rbf_kernel`` to rounding) and the squared row norms it needs.
* ``conv``: stride-1 convolution forward, backward-data, backward-weight and bias gradient: direct, shared-
  memory tiles with halo, implicit-im2col GEMM.
* ``pool``: 2x2 max pool (forward with argmax; atomic and gather backward) and nearest 2x upsampling.
* ``mse``: the autoencoder's MSE head (per-sample losses and the gradient in one launch).
* ``elementwise``: element-wise activations and their gradients.
* ``softmax``: row-wise softmax and softmax cross-entropy.
* ``reduce``: sums and reductions (e.g. bias gradients).
* ``sgd``: the SGD parameter update.
* ``launch``: bound launches (grid, block and arguments fixed once) that training steps replay or capture,
  the argument checks every module shares, the event clock; importing it silences numba's low-occupancy
  warnings.
* ``transfers``: bound host<->device copies and events (pointers, sizes and streams fixed once), the host path of
  the per-step variants.

Nothing is imported here, so ``import gpunn.kernels`` does not pull in numba; import the op modules
directly (``from gpunn.kernels import gemm``).
"""
