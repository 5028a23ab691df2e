"""What the issue-42 device probes share (imported from the probe scripts' folder): a recorder of each launch's
median GPU time (bench.core.median_launch_ms: warm-up, queued behind a GPU hold, so the host's gaps between a
group's launches are not counted), random and NaN-poisoned device buffers, the relative-error line, the CSV."""
import numpy as np
from numba import cuda

from gpunn.bench.core import median_launch_ms, numba_clock


class Probe:
    def __init__(self, reps, seed=0, width=78):
        self.reps, self.width = reps, width
        self.rng = np.random.default_rng(seed)
        self.timings = []

    def timed(self, name, launch):
        """The launch's median GPU time over `reps` launches, recorded and printed."""
        ms = median_launch_ms(launch, self.reps, numba_clock(0)).ms
        self.timings.append((name, ms))
        print(f"{name:{self.width}s} {ms:8.4f} ms", flush=True)

    def rand(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def write_csv(self, path):
        with open(path, "w") as f:
            f.write("launch,ms\n" + "".join(f"\"{n}\",{ms:.5f}\n" for n, ms in self.timings))


def nan(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def rel(got, ref):
    return f"rel err {np.abs(got - ref).max() / np.abs(ref).max():.2e} finite {np.isfinite(got).all()}"
