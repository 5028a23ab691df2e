"""Issue 40's probes of two overlap suspects on a lent machine: virtual cores sharing a physical one, and CPU 0's
interrupts. Writes probe_cores.csv and prints a summary.

1. Interrupts: /proc/interrupts summed per CPU over SECONDS of an idle machine (per second).
2. Core pairs: a single-threaded loop pinned to core 0 timed alone, then beside the same loop pinned to core j, for
   every other core j; two kinds of loop: compute-bound (a 16 KB array updated in place, in L1) and memory-bound
   (a 256 MB array copied). A sibling of core 0 (one physical core, two virtual ones) slows the compute loop
   (each gets part of the core); a memory-bound slowdown on every j is bandwidth shared by all.
The VM's lscpu may show one thread per core while the host shares physical cores: this measures instead.

    python probe_cores.py OUT_DIR [SECONDS]
"""

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPEATS = 3


def _loop(core: int, kind: str, start, result) -> None:
    os.sched_setaffinity(0, {core})
    if kind == "compute":
        a = np.ones(4096, np.float32)
        start.wait()
        t = time.perf_counter()
        for _ in range(20000):
            a *= np.float32(1.0000001)
            a += np.float32(1e-9)
    else:
        a = np.ones(2**26, np.float32)
        b = np.empty_like(a)
        start.wait()
        t = time.perf_counter()
        for _ in range(6):
            np.copyto(b, a)
    result.put((core, time.perf_counter() - t))


def timed(cores: list[int], kind: str) -> dict[int, float]:
    """Seconds of the loop on each of `cores`, all started at once."""
    start, result = mp.Event(), mp.Queue()
    procs = [mp.Process(target=_loop, args=(c, kind, start, result)) for c in cores]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process has made its array
    start.set()
    times = dict(result.get() for _ in procs)
    for p in procs:
        p.join()
    return times


def interrupts_per_s(seconds: float) -> list[float]:
    def totals():
        with open("/proc/interrupts") as fh:
            cpus = len(fh.readline().split())
            sums = [0] * cpus
            for line in fh:
                fields = line.split()[1:cpus + 1]
                for i, f in enumerate(fields):
                    if f.isdigit():
                        sums[i] += int(f)
        return sums

    before = totals()
    time.sleep(seconds)
    return [(b - a) / seconds for a, b in zip(before, totals())]


def main(out: str, seconds: str = "5") -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    rows = [{"probe": "interrupts_per_s", "core": c, "value": v}
            for c, v in zip(range(len(cores)), interrupts_per_s(float(seconds)))]
    for kind in ("compute", "memory"):
        alone = float(np.median([timed([cores[0]], kind)[cores[0]] for _ in range(REPEATS)]))
        rows.append({"probe": f"{kind}_alone_s", "core": cores[0], "value": alone})
        for j in cores[1:]:
            both = float(np.median([timed([cores[0], j], kind)[cores[0]] for _ in range(REPEATS)]))
            rows.append({"probe": f"{kind}_beside_core_j", "core": j, "value": both / alone})
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "probe_cores.csv", index=False)
    irq = frame[frame.probe == "interrupts_per_s"].set_index("core").value
    print(f"interrupts per s: core 0 {irq.iloc[0]:.0f}, the others' median {irq.iloc[1:].median():.0f}, "
          f"max {irq.iloc[1:].max():.0f}")
    for kind in ("compute", "memory"):
        ratios = frame[frame.probe == f"{kind}_beside_core_j"].set_index("core").value
        worst = ratios.sort_values(ascending=False).head(3)
        print(f"{kind}: core {cores[0]}'s loop beside core j / alone: median {ratios.median():.3f}, worst "
              + ", ".join(f"core {c} {v:.3f}" for c, v in worst.items()))


if __name__ == "__main__":
    main(*sys.argv[1:])
