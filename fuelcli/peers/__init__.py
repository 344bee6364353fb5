"""Peers: the other engines fuel is measured (`bench --compare`) and checked (`diff --oracle`) against.

Each peer runs in a child process of its own (child.py), for bench and for the oracle alike:
  * its thread pool does not share fuel's process: torch's OpenMP pool and numba's in one process
    fought over 2 cores and slowed transformers' prefill 2.6x (DESIGN.md part B), a bias in fuel's
    favour;
  * a peer that crashes (a native llama-cpp-python build segfaults in eval on CPUs with AMX) is one
    error line naming the peer and the signal, exit 5, with the build advice, not fuel's death.

  llama_cpp.py      llama-cpp-python on the same .gguf: timed pp/tg runs, every position's logits
  transformers.py   HF transformers in float32: timed pp/tg runs, logits and residual states
  install.py        what to install for each, and how to build llama-cpp-python where it crashes

The adapters import only their peer and fuelcli.errors, never numba: the child has no fuel pool.
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

from ..errors import InputError, MissingDependency
from . import install


class PeerKind(NamedTuple):
    name: str  # as --compare / --oracle take it
    package: str  # what the user installs
    modules: tuple  # what must be importable
    adapter: str  # "module:Class", built in the child
    install: str  # the advice when it is missing
    crash: str  # the advice when its process dies
    extra: str  # fuel's extra that installs it (process/extras.py)


PEERS = {
    "llama.cpp": PeerKind("llama.cpp", "llama-cpp-python", ("llama_cpp",), "fuelcli.peers.llama_cpp:LlamaCppPeer",
                          install.LLAMA_CPP, install.LLAMA_CPP_CRASH, "llama-cpp"),
    "transformers": PeerKind("transformers", "transformers torch", ("torch", "transformers"),
                             "fuelcli.peers.transformers:TransformersPeer", install.TRANSFORMERS,
                             install.TRANSFORMERS_CRASH, "test"),
}


def missing_module(kind: PeerKind) -> str | None:
    """The first of the peer's modules that is not installed (without importing it: importing torch
    here would start its thread pool in fuel's process), else None."""
    for name in kind.modules:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a parent package missing; a module set to None
            return name
    return None


def require(name: str, option: str) -> PeerKind:
    """The peer called `name`, installed; MissingDependency (exit 4) naming what to install if not."""
    kind = PEERS.get(name)
    if kind is None:
        raise InputError(f"{option} takes one of {', '.join(PEERS)}, got {name!r}")
    absent = missing_module(kind)
    if absent is not None:
        raise MissingDependency(f"{option} {name} needs the Python package(s) `{kind.package}` ({absent} is not "
                                f"installed): {kind.install}")
    return kind
