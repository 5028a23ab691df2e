"""PTX / ptxas facts of GEMM kernels without a GPU: registers, spills, local memory, the inner loop's mix.

    PYTHONPATH=src [NVDISASM=path] python docs/notes/issue-26/ptx_facts.py [VERSION ...]

numba-cuda's compile_ptx (NVVM) for cc 9.0, then ptxas -v of the local toolkit (sm_90). Per kernel: registers,
spill stores/loads, ld/st.local in the PTX, the longest loop body of 64+ fma (the inner loop: fma, ld.shared.v4
and other instructions), the total instruction count and, with NVDISASM, the SASS loops' sizes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from numba import cuda, types
from numba.cuda import dispatcher
from numba.cuda.cudadrv import libs, nvrtc, nvvm

from gpunn.kernels.gemm import VERSIONS
from gpunn.kernels.gemm.problem import CONV_FIELDS

U32 = types.uint32
F2C = types.Array(types.float32, 2, "C")
F2A = types.Array(types.float32, 2, "A")
F1C = types.Array(types.float32, 1, "C")
F4A = types.Array(types.float32, 4, "A")
DENSE_DIMS = types.UniTuple(U32, 3)
CONV_DIMS = types.UniTuple(U32, 3 + len(CONV_FIELDS))


class _Device:  # no GPU here: device functions are compiled for this compute capability
    compute_capability = (9, 0)


dispatcher.get_current_device = _Device
LIBDEVICE = "/usr/local/cuda-13.0/nvvm/libdevice/libdevice.10.bc"  # the local toolkit's
nvvm.get_libdevice = libs.get_libdevice = lambda: LIBDEVICE
nvvm.open_libdevice = lambda: Path(LIBDEVICE).read_bytes()
nvrtc.get_arch_option = lambda major, minor: f"compute_{major}{minor}"  # no NVRTC here to list the archs

# (label, a_map, b_map, store, ksize, epilogue, split, arg types)
CASES = [
    ("NN none", "dense", "dense", "dense", 1, "none", False, (F2C, F2C, F2C, F1C, DENSE_DIMS)),
    ("NN flat none", "dense_flat", "dense_flat", "dense", 1, "none", False, (F1C, F1C, F2C, F1C, DENSE_DIMS)),
    ("NN A-flat none", "dense_flat", "dense", "dense", 1, "none", False, (F1C, F2C, F2C, F1C, DENSE_DIMS)),
    ("TT B-flat none", "dense_t", "dense_t_flat", "dense", 1, "none", False, (F2C, F1C, F2C, F1C, DENSE_DIMS)),
    ("TT none", "dense_t", "dense_t", "dense", 1, "none", False, (F2C, F2C, F2C, F1C, DENSE_DIMS)),
    ("NT flat none", "dense_flat", "dense_t_flat", "dense", 1, "none", False, (F1C, F1C, F2C, F1C, DENSE_DIMS)),
    ("TN flat none", "dense_t_flat", "dense_flat", "dense", 1, "none", False, (F1C, F1C, F2C, F1C, DENSE_DIMS)),
    ("NN bias_relu", "dense", "dense", "dense", 1, "bias_relu", False, (F2C, F2C, F2C, F1C, DENSE_DIMS)),
    ("NT mask", "dense", "dense_t", "dense", 1, "mask", False, (F2C, F2C, F2C, F2C, DENSE_DIMS)),
    ("TN none", "dense_t", "dense", "dense", 1, "none", False, (F2C, F2C, F2C, F1C, DENSE_DIMS)),
    ("TT A-layout", "dense_t", "dense_t", "dense", 1, "none", False, (F2A, F2A, F2A, F1C, DENSE_DIMS)),
    ("NN split", "dense", "dense", "partial", 1, "none", True, (F2A, F2A, F1C, F1C, types.UniTuple(U32, 4))),
    ("conv fwd k3 bias_relu", "im2col", "weight_t", "nchw", 3, "bias_relu", False,
     (F1C, F4A, F1C, F1C, CONV_DIMS)),
    ("conv dgrad k3 mask", "im2col", "weight_flip_t", "nchw", 3, "mask", False, (F1C, F4A, F1C, F1C, CONV_DIMS)),
    ("conv wgrad k3 split", "channels", "im2col_k", "partial", 3, "none", True,
     (F1C, F1C, F1C, F1C, types.UniTuple(U32, 4 + len(CONV_FIELDS)))),
]


def _ptxas(ptx: str, max_registers=None) -> tuple[int, int, int, str]:
    """(registers, spill store bytes, spill load bytes, SASS or "") of one kernel's PTX; the SASS where the
    environment names an nvdisasm (NVDISASM=path: e.g. from the nvidia-cuda-nvdisasm wheel)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        cap = [f"-maxrregcount={max_registers}"] if max_registers else []
        out = subprocess.run(["ptxas", "-v", "-arch=sm_90", *cap, "-o", str(cubin), str(src)], capture_output=True,
                             text=True, check=True).stderr
        nvdisasm = os.environ.get("NVDISASM")
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout if nvdisasm else ""
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    st, ld = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out).groups())
    return regs, st, ld, sass


def _sass_loops(sass: str) -> str:
    """The SASS loops holding FFMAs, innermost first: 'instructions/FFMAs' each (the inner loop over k, then the
    loop over K steps, whose count includes one trip of the inner loop)."""
    ins, labels, loops = [], {}, []
    for ln in sass.splitlines():
        m = re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", ln)
        if m:
            ins.append(m.group(1))
        m = re.match(r"^\.(L_x_\d+):", ln.strip())
        if m:
            labels[m.group(1)] = len(ins)
    for i, txt in enumerate(ins):
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", txt)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            body = ins[labels[m.group(1)]:i + 1]
            ffma = sum("FFMA" in t for t in body)
            if ffma:
                loops.append((len(body), f"{len(body)}/{ffma}"))
    return " ".join(text for _, text in sorted(loops))


def _inner_loop(ptx: str) -> Counter:
    """Instruction mix of the loop body with the most fma (label to the branch back to it)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    best = Counter()
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.match(r"^\$?\w+:$", ln)}
    for i, ln in enumerate(lines):
        mt = re.match(r"^(@%p\d+ )?bra(\.uni)?\s+(\S+);", ln)
        if mt and mt.group(3) in labels and labels[mt.group(3)] < i:
            body = lines[labels[mt.group(3)]:i + 1]
            ops = Counter(b.split()[0].split(".")[0] if not b.startswith("@") else b.split()[1].split(".")[0]
                          for b in body if b and not b.endswith(":") and not b.startswith("//"))
            ops["ld.shared.v4"] = sum(1 for b in body if "ld.shared.v4" in b)
            ops["total"] = sum(v for kk, v in ops.items() if kk != "ld.shared.v4")
            if ops["fma"] > best["fma"]:
                best = ops
    return best


def _factory(name):
    """A version's kernel factory."""
    return VERSIONS[name].kernel


def main(names):
    for name in names:
        factory = _factory(name)
        for label, am, bm, st, ks, ep, split, sig in CASES:
            kern = factory(am, bm, st, ks, ep, split)
            bounds = kern.targetoptions.get("launch_bounds")  # as the kernel's dispatcher compiles it
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0), launch_bounds=bounds)
            regs, sst, sld, sass = _ptxas(ptx, kern.targetoptions.get("max_registers"))
            local = len(re.findall(r"\b(ld|st)\.local", ptx))
            inner = _inner_loop(ptx)
            n_instr = sum(1 for ln in ptx.splitlines() if re.match(r"^\s+(@%p\d+ )?[a-z]", ln))
            print(f"{name:12s} {label:24s} regs {regs:3d} spill st/ld {sst}/{sld} local {local} | inner loop "
                  f"{inner['total']} instr: {inner['fma']} fma, {inner['ld.shared.v4']} ld.shared.v4, "
                  f"{inner['ld']} ld | kernel {n_instr} instr" + (f" | SASS loops {_sass_loops(sass)}" if sass else ""),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["regblock128", "coalesced128"])
