"""PTX / ptxas facts of the ws_* GEMM kernels (and direct_* beside them) without a GPU: registers, spills, local
memory, the MMAs, mbarrier and setmaxnreg instructions in the PTX.

    PYTHONPATH=src python docs/notes/issue-42/ws_ptx_facts.py [--keep DIR]

numba-cuda's compile_ptx (NVVM) for cc 9.0 with issue-26/ptx_facts.py's no-GPU patches, `.target` raised to sm_90a
(wgmma, setmaxnreg), then `ptxas -v -arch=sm_90a -maxrregcount=<the kernel's max_registers>` of the local toolkit.
``--keep DIR`` writes each kernel's PTX there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

from numba import cuda, types  # noqa: E402
from numba.cuda import dispatcher  # noqa: E402
from numba.cuda.cudadrv import libs, nvrtc, nvvm  # noqa: E402

from gpunn.kernels.gemm import direct, direct_ws  # noqa: E402


class _Device:  # no GPU here: device functions are compiled for this compute capability
    compute_capability = (9, 0)


dispatcher.get_current_device = _Device
LIBDEVICE = "/usr/local/cuda-13.0/nvvm/libdevice/libdevice.10.bc"  # the local toolkit's
nvvm.get_libdevice = libs.get_libdevice = lambda: LIBDEVICE
nvvm.open_libdevice = lambda: Path(LIBDEVICE).read_bytes()
nvrtc.get_arch_option = lambda major, minor: f"compute_{major}{minor}"  # no NVRTC here to list the archs

U32 = types.uint32
F2C = types.Array(types.float32, 2, "C")
F1C = types.Array(types.float32, 1, "C")
H1C = types.Array(types.uint16, 1, "C")
DIMS = types.UniTuple(U32, 3)

# (label, factory, epilogue)
WS = ((4, 256, direct_ws.REGS, "none"), (4, 256, None, "none"), (4, 256, direct_ws.REGS, "mask"),
      (6, 128, direct_ws.REGS, "none"))  # (stages, bn, regs, epilogue)
CASES = [
    *((f"ws_{f} {s}st bn{bn} regs{'-'.join(map(str, r)) if r else 'none'}", direct_ws.kernel(f, s, bn, r), ep)
      for f in ("tf32", "bf16") for s, bn, r, ep in WS),
    *((f"direct_{f} 7st", direct.kernel(f, 7), "none") for f in ("tf32", "bf16")),
]


def ptxas(ptx: str, max_registers: int | None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cap = [f"-maxrregcount={max_registers}"] if max_registers else []
        run = subprocess.run(["ptxas", "-v", "-arch=sm_90a", *cap, "-o", str(Path(tmp) / "k.cubin"), str(src)],
                             capture_output=True, text=True)
        return run.stderr + (f"\n(ptxas exit {run.returncode})" if run.returncode else "")


def main(argv):
    keep = Path(argv[argv.index("--keep") + 1]) if "--keep" in argv else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    for label, factory, epilogue in CASES:
        kern = factory(direct.A_MAP, direct.B_MAP, "dense", 1, epilogue)
        fmt = "bf16" if "bf16" in label else "tf32"
        x = H1C if fmt == "bf16" else F1C
        aux = F2C if epilogue == "mask" else F1C
        ptx, _ = cuda.compile_ptx(kern.py_func, (x, x, F2C, aux, DIMS), cc=(9, 0))
        ptx = re.sub(r"\.target sm_90\b", ".target sm_90a", ptx)
        if keep:
            (keep / (re.sub(r"\W+", "_", f"{label} {epilogue}") + ".ptx")).write_text(ptx)
        out = ptxas(ptx, kern.targetoptions.get("max_registers"))
        regs = re.search(r"Used (\d+) registers", out)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
        counts = {k: len(re.findall(p, ptx)) for k, p in (
            ("wgmma", r"wgmma\.mma_async"), ("local", r"\b(ld|st)\.local"), ("try_wait", r"mbarrier\.try_wait"),
            ("cp.async", r"cp\.async\.c[ag]"), ("noinc", r"cp\.async\.mbarrier\.arrive"),
            ("setmaxnreg", r"setmaxnreg"), ("bar.sync", r"\bbar\.sync|barrier\.sync"))}
        shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+)", ptx)))
        notes = [ln.strip() for ln in out.splitlines() if "warning" in ln.lower() or "error" in ln.lower()]
        print(f"{label:34s} {epilogue:5s} regs {regs.group(1) if regs else '?':>3s} spill st/ld "
              f"{'/'.join(spill.groups()) if spill else '?'} | PTX {counts} {shapes}", *notes, sep="\n  "
              if notes else "", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
