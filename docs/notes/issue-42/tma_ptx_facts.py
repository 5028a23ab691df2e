"""PTX / ptxas facts of the tma_* GEMM kernels without a GPU (ws_ptx_facts.py's compile path: numba-cuda's NVVM for
cc 9.0, `.target` raised to sm_90a, the local ptxas): registers, spills, the bulk tensor copies, expect_tx arrivals,
tensor-map prefetches, mbarrier waits, MMAs and setmaxnreg in the PTX; ptxas accepting the PTX is the check of the
inline-asm syntax.

    PYTHONPATH=src python docs/notes/issue-42/tma_ptx_facts.py [--keep DIR]"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ws_ptx_facts as W  # noqa: E402  (sets NUMBA_ENABLE_CUDASIM=0 and the no-GPU patches first)
from numba import cuda, types  # noqa: E402

from gpunn.kernels.gemm import direct_tma  # noqa: E402

MAP = types.Array(types.uint64, 1, "C")  # a tensor map: 16 uint64 in global memory
# (stages, bn, regs, epilogue, persistent)
TMA = ((4, 256, direct_tma.REGS, "none", False), (3, 256, direct_tma.REGS, "none", False),
       (4, 256, None, "none", False), (4, 256, direct_tma.REGS, "mask", False),
       (6, 128, direct_tma.REGS, "none", False), (4, 256, direct_tma.REGS, "none", True))


def main(argv):
    keep = Path(argv[argv.index("--keep") + 1]) if "--keep" in argv else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    for fmt in ("tf32", "bf16"):
        for stages, bn, regs, epilogue, persistent in TMA:
            label = (f"tma_{fmt} {stages}st bn{bn} regs{'-'.join(map(str, regs)) if regs else 'none'}"
                     f"{' persistent' if persistent else ''}")
            kern = direct_tma.kernel(fmt, stages, bn, regs, persistent=persistent)(direct_tma.A_MAP, direct_tma.B_MAP,
                                                                                   "dense", 1, epilogue)
            aux = W.F2C if epilogue == "mask" else W.F1C
            ptx, _ = cuda.compile_ptx(kern.py_func, (MAP, MAP, W.F2C, aux, W.DIMS), cc=(9, 0))
            ptx = re.sub(r"\.target sm_90\b", ".target sm_90a", ptx)
            if keep:
                (keep / (re.sub(r"\W+", "_", f"{label} {epilogue}") + ".ptx")).write_text(ptx)
            out = W.ptxas(ptx, kern.targetoptions.get("max_registers"))
            regs_used = re.search(r"Used (\d+) registers", out)
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
            counts = {k: len(re.findall(p, ptx)) for k, p in (
                ("wgmma", r"wgmma\.mma_async"), ("local", r"\b(ld|st)\.local"), ("try_wait", r"mbarrier\.try_wait"),
                ("bulk.tensor", r"cp\.async\.bulk\.tensor"), ("expect_tx", r"arrive\.expect_tx"),
                ("prefetch.tensormap", r"prefetch\.tensormap"), ("cp.async", r"cp\.async\.c[ag]"),
                ("setmaxnreg", r"setmaxnreg"), ("bar.sync", r"\bbar\.sync|barrier\.sync"))}
            version = re.search(r"\.version (\S+)", ptx)
            notes = [ln.strip() for ln in out.splitlines() if "warning" in ln.lower() or "error" in ln.lower()]
            print(f"{label:43s} {epilogue:5s} PTX {version.group(1) if version else '?'} regs "
                  f"{regs_used.group(1) if regs_used else '?':>3s} spill st/ld "
                  f"{'/'.join(spill.groups()) if spill else '?'} | {counts}", *notes, sep="\n  " if notes else "",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
