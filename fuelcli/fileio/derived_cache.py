"""Where fuel keeps its files: FUEL_HOME (fetched models, remembered hashes), and what it derives
from files to start faster: compiled kernels (backends/cpu/llvm.py) and parsed GGUF headers
(weights/gguf_cache.py).

NUMBA_CACHE_DIR when set (so that one variable moves every compiled or derived cache, numba's own
included: `fuel bench --first-token` empties it to time a fresh install), else FUEL_HOME.
Everything here can be deleted at any time; it is rebuilt on the next start.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fuel_home() -> Path:
    """Where fuel keeps what it fetches and remembers (demo models, hashes, chat history)."""
    return Path(os.environ.get("FUEL_HOME") or "~/.cache/fuel").expanduser()


def cache_root() -> Path:
    return Path(os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("FUEL_HOME") or "~/.cache/fuel").expanduser()


def write_atomic(path: Path, data: bytes):
    """Write whole or not at all (a temporary file renamed): a concurrent reader never sees half."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
