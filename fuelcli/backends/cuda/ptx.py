"""Compile every CUDA kernel to PTX without a GPU (NVVM only), with the argument types the engine
launches it with: `python -m fuelcli.backends.cuda.ptx [sm_XY] [--facts]` prints one line per kernel;
with --facts also what its PTX does per kernel: global loads by width, warp shuffles, shared-memory
barriers, and, where CUDA's `ptxas` is on PATH, the registers, stack and spills it assembles to.

The simulator runs Python, so it accepts code that NVVM rejects (types that do not unify, calls it
cannot lower); this is the check that the kernels compile for a real device. numba-cuda asks the
current device for its compute capability when it compiles a device function; with no GPU that
question is answered with the target's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from ...process.extras import pip_install

U8 = "uint8[::1]"
I32V = "int32[::1]"
I32M = "int32[:, ::1]"
I64M = "int64[:, ::1]"
F32V = "float32[::1]"
F32M = "float32[:, ::1]"
KV = "float32[:, :, :, ::1]"
I, F = "int64", "float32"


def signatures() -> dict:
    """kernel name -> (dispatcher, signature), for every kernel the engine launches: the decode
    products once per weight format (`matvec q4_k`; swiglu with gate and up in one format)."""
    from ...formats import FORMATS
    from .kernels import attention, dequant, matmul, matvec, moe, probe, rows

    def sig(*args):
        return "void(" + ", ".join(args) + ")"

    per_format = {}
    for name, f in FORMATS.items():
        per_format[f"matvec {name}"] = (matvec.matvec_kernel(f.code),
                                        sig(U8, I64M, I, I, F32V, F32V, I, F32V, I, I, F, F32V, I32V))
        per_format[f"swiglu {name}"] = (matvec.swiglu_kernel(f.code, f.code), sig(U8, I64M, I, I, F32V, F32V))
    return {
        "take_rows": (dequant.take_rows, sig(U8, I, I, I, I32V, I, F32M, F32V, I, F, F32M)),
        **per_format,
        "moe_swiglu": (moe.moe_swiglu, sig(U8, I64M, I64M, F32M, I, "boolean", F32M, F32V, I, F, I32M, F32M, F32M)),
        "moe_down": (moe.moe_down, sig(U8, I64M, I64M, I32M, F32M, F32M, F32M)),
        "matmul": (matmul.matmul, sig(U8, I64M, I, F32M, I, F32V, I, F32M, I, I)),
        "rope_store": (attention.rope_store, sig(F32M, I, I, I, I, F32V, I, I, F, F32M, F32M, KV, KV, I)),
        "attend": (attention.attend, sig(F32M, I, I, I, I, I, KV, KV, I, F32M)),
        "attend_one": (attention.attend_one, sig(F32M, I, I, I, I, I, F32V, I, I, F, F32M, F32M, KV, KV, I, F32M)),
        "rmsnorm": (rows.rmsnorm, sig(F32M, F32V, I, F, F32M)),
        "silu_mul": (rows.silu_mul, sig(F32M, F32M, I)),
        "argmax": (rows.argmax, sig(F32M, I, I32V)),
        "read_xor": (probe.read_xor, sig("uint32[::1]", I, I, "uint32[::1]")),
    }


def kernels() -> dict:
    """Every kernel (not device function) defined in the kernels package, by name (the per-format
    decode products come from factories: signatures() lists them)."""
    import importlib
    import pkgutil

    from numba.cuda.dispatcher import CUDADispatcher

    from . import kernels as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device") and obj.__module__ == module.__name__:
                found[name] = obj
    return found


def compile_all(cc=(9, 0), keep: dict | None = None) -> dict:
    """name -> (ok, seconds, PTX bytes or the error's first line), for every kernel of the package;
    `keep` (when given) gets name -> PTX text."""
    from types import SimpleNamespace

    from numba import cuda
    from numba.cuda import dispatcher

    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    sigs = signatures()
    out = {name: (False, 0.0, "no signature in ptx.signatures()") for name in kernels() if name not in sigs}
    for name, (kernel, signature) in sigs.items():
        t0 = time.perf_counter()
        try:
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc)
            out[name] = (True, time.perf_counter() - t0, len(ptx))
            if keep is not None:
                keep[name] = ptx
        except Exception as e:  # report every kernel, not the first failure
            out[name] = (False, time.perf_counter() - t0, " ".join(str(e).split())[:300])
    return out


LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.v(\d))?\.[a-z]+(\d+)\b")


def ptx_facts(ptx: str, arch: str) -> dict:
    """What one kernel's PTX does: global loads counted by width in bytes (a vector load counts once,
    at its full width), warp shuffles, block barriers; registers, stack bytes and spills from
    `ptxas -v` when ptxas is on PATH (else None)."""
    loads = {}
    for vec, bits in LOAD.findall(ptx):
        width = int(vec or 1) * int(bits) // 8
        loads[width] = loads.get(width, 0) + 1
    facts = {"loads": dict(sorted(loads.items())), "shfl": len(re.findall(r"\bshfl\.sync", ptx)),
             "bar": len(re.findall(r"\bbar\.sync|\bbarrier\.sync", ptx)), "regs": None, "stack": None, "spill": None}
    ptxas = shutil.which("ptxas")
    if ptxas:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            r = subprocess.run([ptxas, f"-arch={arch}", "-v", f.name, "-o", os.devnull], capture_output=True,
                               text=True)
        text = r.stdout + r.stderr
        regs = re.search(r"Used (\d+) registers", text)
        stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
        if regs and stack:
            facts.update(regs=int(regs[1]), stack=int(stack[1]), spill=int(stack[2]) + int(stack[3]))
    return facts


def facts_line(name: str, f: dict) -> str:
    loads = " ".join(f"{n}x{w}B" for w, n in f["loads"].items()) or "-"
    regs = "ptxas not found" if f["regs"] is None else f"{f['regs']} regs, stack {f['stack']} B, spill {f['spill']} B"
    return f"     {name:<12} loads {loads}; shfl {f['shfl']}, bar {f['bar']}; {regs}"


NO_NVVM = 77  # exit status when NVVM is not installed: nothing was checked


def main(argv) -> int:
    facts = "--facts" in argv
    argv = [a for a in argv if a != "--facts"]
    arch = argv[1] if len(argv) > 1 else "sm_90"
    cc = (int(arch[3:-1]), int(arch[-1]))
    try:
        import numba_cuda  # noqa: F401  (NVIDIA's target, not numba's deprecated built-in one)
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as e:  # ImportError, NvvmSupportError, OSError: say which, check nothing
        print(f"no NVVM here ({' '.join(str(e).split())[:200]}): {pip_install('cuda')}")
        return NO_NVVM
    texts = {}
    results = compile_all(cc, texts)
    for name, (ok, secs, what) in results.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name:<12} {arch} {secs:5.1f} s  {what if not ok else f'{what} B of PTX'}")
    if facts:
        for name, ptx in texts.items():
            print(facts_line(name, ptx_facts(ptx, arch)))
    return 0 if all(ok for ok, _, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
