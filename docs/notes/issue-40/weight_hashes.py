"""Issue 40, deliverable 5: every deterministic variant's weights bit-identical between two runs of the full config
(one GPU against two). `hash` writes, for every training run under RESULTS_DIR/runs/<machine>/, the sha256 of its
trained parameters (weights.npz's `flat`, float32) and whether its variant is deterministic; `compare` reads two
such files and lists, per deterministic run both hold, whether the hashes are equal (the weights themselves stay on
the machine: the returned archives leave out .npz files).

    python weight_hashes.py hash RESULTS_DIR OUT_CSV
    python weight_hashes.py compare ONE_GPU_CSV TWO_GPU_CSV
"""

import csv
import hashlib
import sys
from pathlib import Path

import numpy as np


def hash_runs(results: str, out: str) -> None:
    from gpunn.backends.registry import is_deterministic

    rows = []
    for weights in sorted(Path(results, "runs").glob("*/**/weights.npz")):
        run = weights.parent.relative_to(Path(results, "runs"))
        machine, path = run.parts[0], "/".join(run.parts[1:])
        with np.load(weights, allow_pickle=False) as saved:
            flat = np.ascontiguousarray(saved["flat"], dtype=np.float32)
        rows.append({"machine": machine, "run": path, "variant": run.parts[4],
                     "deterministic": is_deterministic(run.parts[4]),
                     "sha256": hashlib.sha256(flat.tobytes()).hexdigest()})
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["machine", "run", "variant", "deterministic", "sha256"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} runs hashed into {out}")


def compare(one: str, two: str) -> int:
    def read(path):
        with open(path) as handle:
            return {row["run"]: row for row in csv.DictReader(handle)}

    a, b = read(one), read(two)
    both = sorted(run for run in a.keys() & b.keys() if a[run]["deterministic"] == "True")
    differ = [run for run in both if a[run]["sha256"] != b[run]["sha256"]]
    print(f"{len(both)} deterministic runs in both; {len(both) - len(differ)} bit-identical, {len(differ)} differ")
    for run in differ:
        print(f"  differs: {run}")
    only = sorted(a.keys() ^ b.keys())
    if only:
        print(f"{len(only)} runs in one file only, e.g. {only[:3]}")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["hash"] and len(sys.argv) == 4:
        hash_runs(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
