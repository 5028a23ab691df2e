"""Issue 40: where a warm GPU job's start-up goes, the whole process. For each job: one cold run (fills its cache
folder), two warm runs (wall, epochs, the run's own startup record), one warm run under cProfile (the top functions by
cumulative time, written as text) and one under `-X importtime` (the slowest imports). Also the floor: an empty
interpreter, `import gpunn.train`, and a CUDA context made by numba.

    python startup_profile.py SRC PREPARED_DIR OUT_DIR [JOBS [MODES]]
        JOBS: experiment/variant pairs of startup.py's list (default e1/gpu-graph,e4/gpu-graph,e5/gpu-graph)
        MODES: of cold, warm, cprofile, importtime and served (gpunn.warm), in order (default cold,warm,warm,
        cprofile,importtime)
"""

import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

from startup import JOBS  # this folder's start-up study

FLOOR = {
    "python -c pass": "pass",
    "import gpunn.train": "import gpunn.train",
    "numba cuda context": "from numba import cuda; cuda.current_context()",
    "gpunn.kernels + context": "import gpunn.kernels; from numba import cuda; cuda.current_context()",
}


def _run(args, src, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(src), **(env_extra or {})}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - start, done


def main(src: str, prepared: str, out: str, jobs: str = "e1/gpu-graph,e4/gpu-graph,e5/gpu-graph",
         modes: str = "cold,warm,warm,cprofile,importtime") -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, code in FLOOR.items():
        walls = [_run(["-c", code], src)[0] for _ in range(3)]
        rows.append({"job": name, "mode": "floor", "wall_s": min(walls)})
        print(json.dumps(rows[-1]), flush=True)
    for experiment, dataset, run_path in JOBS:
        variant = run_path.split("/")[3]
        if f"{experiment}/{variant}" not in jobs.split(","):
            continue
        cache = out / "cache" / f"{experiment}-{variant}"
        env = {"GPUNN_KERNEL_CACHE": str(cache)}
        train = ["-m", "gpunn", "train", run_path, "--data", str(Path(prepared) / f"{dataset}.npz")]
        for mode in modes.split(","):
            run_out = out / "runs" / f"{experiment}-{variant}-{mode}"
            args = train + ["--out", str(run_out)]
            prof = out / f"{experiment}-{variant}.prof"
            if mode == "cprofile":
                args = ["-m", "cProfile", "-o", str(prof), *args]
            elif mode == "importtime":
                args = ["-X", "importtime", *args]
            # served: run by a warm server (gpunn.warm, GPUNN_WARM=1; the first one starts it)
            wall, done = _run(args, src, {**env, "GPUNN_WARM": "1"} if mode == "served" else env)
            if done.returncode:
                print(done.stderr[-2000:], flush=True)
                continue
            metrics = json.loads((run_out / "metrics.json").read_text())
            rows.append({"job": f"{experiment}/{variant}", "mode": mode, "wall_s": wall,
                         "epochs_s": metrics["total_train_time_s"],
                         "startup_s": wall - metrics["total_train_time_s"], **(metrics.get("startup") or {})})
            print(json.dumps(rows[-1]), flush=True)
            if mode == "cprofile":
                text = io.StringIO()
                stats = pstats.Stats(str(prof), stream=text)
                stats.sort_stats("cumulative").print_stats(60)
                stats.sort_stats("tottime").print_stats(30)
                (out / f"{experiment}-{variant}-cprofile.txt").write_text(text.getvalue())
            if mode == "importtime":
                lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
                parsed = []
                for line in lines[1:]:  # "import time: SELF | CUMULATIVE | NAME", microseconds
                    self_us, cumulative_us, name = (part.strip() for part in line.split("|"))
                    parsed.append((int(cumulative_us), int(self_us.split(":")[-1]), name))
                parsed.sort(reverse=True)
                (out / f"{experiment}-{variant}-importtime.txt").write_text(
                    "\n".join(f"{c / 1e3:9.1f} ms cumulative {s / 1e3:8.1f} ms self  {n}" for c, s, n in parsed[:80]))
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "startup_profile.csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
