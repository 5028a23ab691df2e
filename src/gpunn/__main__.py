import sys

from gpunn.cli import main

sys.exit(main())
