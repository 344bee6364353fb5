"""What a bug report needs: `fuel --version` (fuel, numba, llvmlite, the CPU kernels' instruction
set) and `fuel doctor` (what is installed, what each extra would add, the caches and their sizes).

Versions come from the installed distributions' metadata, so nothing heavy (torch) is imported;
the instruction set is the one the CPU engine would pick (backends/cpu/llvm.host_isa, FUEL_ISA
honoured).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..process.extras import DIST, EXTRAS, pip_install

PACKAGE = Path(__file__).resolve().parents[1]  # fuelcli/, not this module's cli/
CORE = ("numba", "llvmlite", "numpy", "tokenizers", "safetensors", "huggingface_hub", "typer", "rich", "jinja2")


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kernel_isa() -> dict:
    """{"isa": name, "amx": bool} the CPU engine would use here, or {"error": why}."""
    try:
        from ..backends.cpu import amx
        from ..backends.cpu.llvm import host_isa

        isa = host_isa()
        return {"isa": isa.name, "amx": bool(amx.available(isa))}
    except Exception as e:  # a FUEL_ISA this CPU cannot run, no LLVM target: say so, do not fail
        return {"error": str(e)}


def isa_text(k: dict) -> str:
    if "error" in k:
        return f"unavailable ({k['error']})"
    return k["isa"] + (" + AMX tiles for prefill" if k["amx"] else "")


def activations_text() -> str:
    """The activations the engines take by default here (FUEL_ACTIVATIONS; --activations per run)."""
    from ..backends import resolve_activations

    try:
        kind = resolve_activations(None)
    except Exception as e:  # a FUEL_ACTIVATIONS fuel does not know: say so, do not fail
        return f"unavailable ({e})"
    return f"{kind}" + (" (FUEL_ACTIVATIONS)" if os.environ.get("FUEL_ACTIVATIONS") else "")


def version_text() -> str:
    import llvmlite.binding as llb

    llvm = ".".join(map(str, llb.llvm_version_info))
    return (f"fuel {__version__} ({DIST})\n"
            f"numba {dist_version('numba')}, llvmlite {dist_version('llvmlite')} (LLVM {llvm}), "
            f"numpy {dist_version('numpy')}, Python {platform.python_version()}\n"
            f"CPU kernels: {isa_text(kernel_isa())} on {cpu_name()}\n"
            f"activations: {activations_text()}")


def dir_size(path: Path, pattern: str = "*") -> int:
    total = 0
    try:
        for p in path.rglob(pattern):
            try:
                if p.is_file() and not p.is_symlink():
                    total += p.stat().st_size
            except OSError:
                pass
    except OSError:
        pass
    return total


def caches() -> list[dict]:
    """Every directory fuel writes or reads models from: where, how big, what it holds."""
    from ..fileio.derived_cache import cache_root, fuel_home
    from ..sources import demo

    home = fuel_home()
    derived = cache_root()
    out = [{"name": "FUEL_HOME", "path": str(home), "bytes": dir_size(home),
            "holds": "pulled demo models (" + (", ".join(a for a in demo.DEMOS if demo.is_pulled(a)) or "none pulled")
                     + "), file hashes, the chat history"}]
    for sub, holds in (("fuel-kernels", "compiled CPU kernels (object code per format and CPU)"),
                       ("gguf-headers", "parsed GGUF headers, for a faster start")):
        out.append({"name": sub, "path": str(derived / sub), "bytes": dir_size(derived / sub), "holds": holds})
    nb = os.environ.get("NUMBA_CACHE_DIR")
    nb_path = Path(nb).expanduser() if nb else PACKAGE
    out.append({"name": "numba cache", "path": str(nb_path) if nb else f"{nb_path}/**/__pycache__",
                "bytes": dir_size(nb_path, "*.nb[ic]"), "holds": "numba's compiled forward (NUMBA_CACHE_DIR moves it)"})
    try:
        from huggingface_hub import constants

        hub = Path(constants.HF_HUB_CACHE)
        out.append({"name": "hub cache", "path": str(hub), "bytes": dir_size(hub),
                    "holds": "models fetched from the hub (HF_HOME / HF_HUB_CACHE move it)"})
    except Exception:  # huggingface_hub broken: the rest of the report still helps
        pass
    return out


def report() -> dict:
    from ..peers import PEERS, missing_module

    # an extra whose peer's advice starts with the extra's own pip line gets the whole advice
    # (llama-cpp: how to build it on AMX CPUs, said once in peers/install.py)
    advice = {k.extra: k.install for k in PEERS.values() if k.install.startswith(pip_install(k.extra))}
    extras = []
    for e in EXTRAS.values():
        versions = {p: dist_version(p) for p in e.packages}
        extras.append({"extra": e.name, "installed": all(versions.values()), "packages": versions,
                       "adds": e.adds, "install": advice.get(e.name, pip_install(e.name))})
    peers = [{"peer": k.name, "installed": missing_module(k) is None, "extra": k.extra, "install": k.install}
             for k in PEERS.values()]
    return {"fuel": __version__, "distribution": DIST, "python": sys.version.split()[0],
            "executable": sys.executable, "fuel_package": str(PACKAGE),
            "core": {p: dist_version(p) for p in CORE}, "cpu": cpu_name(), "kernels": kernel_isa(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "fuel_threads": os.environ.get("FUEL_THREADS") or None, "extras": extras, "peers": peers, "caches": caches()}
