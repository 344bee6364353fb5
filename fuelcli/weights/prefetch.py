"""A model's weights mapped into the process ahead of its first forward, on another thread.

Weights are views of read-only file mappings, so the first forward stops on a page fault each time
it reaches pages not yet mapped (~5,900 faults and ~25-40 ms of the Qwen demo's first prefill, its
file already in the page cache; every page read from disk when it is not). `start(arrays)` has a
daemon thread ask Linux to map them all (madvise MADV_POPULATE_READ, Linux 5.14 and later; ctypes
releases the GIL for the call) while the main thread builds the tokenizer. Elsewhere, or where the
kernel refuses, nothing happens and the forward faults the pages in as before. llama.cpp maps its
files with MAP_POPULATE for the same reason. Weights larger than the memory available are left
alone: their last pages would only push their first out of the page cache.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading

from ..process.memory import available_bytes

MADV_POPULATE_READ = 22  # linux/mman.h (Python's mmap module names it from 3.13 on)


def spans(arrays) -> list[tuple[int, int]]:
    """(address, length) of the pages the arrays' bytes lie in, overlapping or touching ranges merged."""
    page = mmap.PAGESIZE
    ranges = sorted((a.ctypes.data // page * page, a.ctypes.data + a.nbytes) for a in arrays if a.nbytes)
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in merged]


def start(arrays) -> threading.Thread | None:
    """Begins mapping the arrays' pages in a daemon thread (Linux); returns it, or None when it
    does not (another OS, nothing to map, or more than the memory available)."""
    if not sys.platform.startswith("linux"):
        return None
    todo = spans(arrays)
    avail = available_bytes()
    if not todo or (avail is not None and sum(n for _, n in todo) > avail):
        return None

    def populate():
        try:
            madvise = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for addr, n in todo:
            if madvise(addr, n, MADV_POPULATE_READ) != 0:  # EINVAL before Linux 5.14: the forward faults them in
                return

    t = threading.Thread(target=populate, name="fuel-prefetch", daemon=True)
    t.start()
    return t
