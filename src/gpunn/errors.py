"""The one exception type users see as a single clear line (the CLI prints it and exits non-zero; a script using
the Python API gets the same line instead of a traceback once `install_excepthook` ran: gpunn.api does)."""

import os
import sys


class GpunnError(Exception):
    """A problem the user can fix: bad input file, bad config key, missing data. The message is one line
    that names the file or key and says what to do."""


def remake_hint(path) -> str:
    """How to make a pipeline output again: remove it and ask Snakemake for it (which reruns its job)."""
    return f"remove it and run `snakemake --cores 2 {path}` (with the run's --configfile) to make it again"


TRACEBACK_VARIABLE = "GPUNN_TRACEBACK"  # set to 1: GpunnErrors keep their full traceback in scripts


def install_excepthook() -> None:
    """Make an uncaught GpunnError end a script with its one line ('gpunn: error: ...' on stderr, exit status 1)
    instead of a traceback; every other exception keeps the hook it had. Idempotent; a no-op with
    GPUNN_TRACEBACK=1."""
    previous = sys.excepthook
    if os.environ.get(TRACEBACK_VARIABLE) == "1" or getattr(previous, "gpunn", False):
        return

    def hook(kind, value, traceback):
        if issubclass(kind, GpunnError):
            print(f"gpunn: error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.gpunn = True
    sys.excepthook = hook
