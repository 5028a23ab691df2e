"""E3's block-size sweep of the memory-bound kernels (``gpunn sweep-blocks``): every kernel of gpunn.bench.ops
on each ROWSxCOLS shape at each block size, validated first; one row per kernel x block (SWEEP_COLUMNS)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpunn import provenance
from gpunn.bench.core import benchmark
from gpunn.bench.ops import MEMORY_BOUND_BUILDERS
from gpunn.errors import GpunnError

SWEEP_COLUMNS = ["op", "block", "rows", "cols", "n_elements", "ms", "gb_per_s", "repeats", *provenance.CSV_COLUMNS]


def block_sweep(block_sizes, rows: int, cols: int, repeats: int, seed: int = 0, log=print) -> pd.DataFrame:
    """E3: every memory-bound kernel (elementwise, softmax, column sums, SGD) on (rows, cols) at each block
    size, validated first; one row per kernel x block (columns ``SWEEP_COLUMNS``)."""
    if repeats < 1:
        raise GpunnError(f"sweep: repeats must be at least 1, got {repeats}")
    rng = np.random.default_rng(seed)
    case = f"{rows}x{cols}"
    problems = [p for build in MEMORY_BOUND_BUILDERS.values() for p in build(rows, cols, case, rng)]
    results = benchmark(problems, block_sizes, repeats, log, compare_torch=False)
    return pd.DataFrame(
        [{"op": r["version"], "block": r["block"], "rows": rows, "cols": cols, "n_elements": r["n_elements"],
          "ms": r["ms"], "gb_per_s": r["gbps"], "repeats": r["repeats"],
          **{key: r[key] for key in provenance.CSV_COLUMNS}} for r in results],
        columns=SWEEP_COLUMNS,
    )


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'64x256,8192x4096' -> [(64, 256), (8192, 4096)]."""
    shapes = []
    for item in text.replace(",", " ").split():
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise GpunnError(f"--shapes: expected ROWSxCOLS with positive integers (e.g. 64x256), got '{item}'")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise GpunnError("--shapes: no shape given (e.g. 64x256,8192x4096)")
    return shapes
