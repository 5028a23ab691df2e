import sys

from gpunn import blas_idle

blas_idle.sleep_when_idle(sys.argv[1:])  # before anything loads NumPy's OpenBLAS

from gpunn import warm  # noqa: E402

if warm.wanted(sys.argv[1:]):  # GPUNN_WARM=1: the job runs in a fork of the warm server (gpunn.warm)
    code = warm.run(sys.argv[1:])
    if code is not None:
        sys.exit(code)

from gpunn.cli import main  # noqa: E402

sys.exit(main())
