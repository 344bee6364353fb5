"""An engine's kernel tables, compiled beside the numba forward on a first run.

A fresh install compiles two things before the first token, each on one core: numba's forward
(forward.py, ~5 s) and the IR kernel modules of the model's formats (llvm.py, ~2-5 s: the Qwen demo
needs 6 modules). When neither is cached, a child process compiles the kernel modules into the
on-disk cache while this process compiles the forward; the tables are then loaded from the cache.
(A child, not a thread: numba and the kernels would share LLVM's global context.) Whatever the
child did not leave in the cache (it failed, or was interrupted) compiles here, as it would have.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from .llvm import ISAS, Isa, is_cached

_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding the fuelcli package


def _build(codes, isa: Isa, head_dim: int, use_amx: bool, cache_type: str,
           activations: str = "int16") -> tuple[np.ndarray, np.ndarray]:
    from .matmul import core_table, kernel_table

    kern, core = kernel_table(codes, isa, use_amx), core_table(isa, head_dim, use_amx, cache_type)
    if activations == "q8":
        from . import q8_tables

        q8_tables.apply(kern, core, codes, isa)
    return kern, core


def _all_cached(codes, isa: Isa, head_dim: int, use_amx: bool, cache_type: str, activations: str = "int16") -> bool:
    from .core import module_name
    from .kernels import cached

    if activations == "q8":
        from . import q8_tables

        if not q8_tables.cached(codes, isa):
            return False
    return cached(codes, isa, use_amx) and is_cached(module_name(head_dim, cache_type), isa)


class KernelTables:
    """(kernel table, core table) of an engine; `background`: compile missing modules in a child
    process from now on (the caller has other compiling to do meanwhile)."""

    def __init__(self, codes, isa: Isa, head_dim: int, use_amx: bool, cache_type: str, background: bool,
                 activations: str = "int16"):
        self._spec = (sorted(int(c) for c in codes), isa, head_dim, use_amx, cache_type, activations)
        self._value = None
        self._child = None
        if background and not _all_cached(*self._spec):
            job = json.dumps([self._spec[0], isa.name, head_dim, use_amx, cache_type, activations])
            # this process's fuelcli, whatever the child's working directory holds
            code = f"import sys; sys.path.insert(0, {_ROOT!r}); from {__name__} import main; main(sys.argv[1])"
            try:
                self._child = subprocess.Popen([sys.executable, "-c", code, job], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except OSError:  # no child: everything compiles here
                self._child = None

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        if self._value is None:
            if self._child is not None:
                self._child.wait()
                self._child = None
            self._value = _build(*self._spec)
        return self._value


def main(job: str) -> None:
    """The child: compile (json [codes, isa name, head_dim, use_amx, cache type, activations]) into the
    on-disk cache."""
    codes, isa_name, head_dim, use_amx, cache_type, activations = json.loads(job)
    _build(codes, ISAS[isa_name], head_dim, use_amx, cache_type, activations)
