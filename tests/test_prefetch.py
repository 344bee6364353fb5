"""weights/prefetch.py: a model's file pages mapped in the background before the first forward."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import pytest

from fuelcli.weights import prefetch

PAGE = mmap.PAGESIZE


def test_spans_cover_whole_pages_and_merge_neighbours():
    buf = np.zeros(16 * PAGE, np.uint8)
    base = buf.ctypes.data
    first = buf[PAGE + 10: 2 * PAGE]  # ends where the next begins: one span
    second = buf[2 * PAGE: 3 * PAGE + 1]
    apart = buf[8 * PAGE + 5: 9 * PAGE]
    got = prefetch.spans([apart, second, first, buf[:0]])
    lo = (base + PAGE + 10) // PAGE * PAGE
    assert got == [(lo, base + 3 * PAGE + 1 - lo), ((base + 8 * PAGE + 5) // PAGE * PAGE,
                                                   base + 9 * PAGE - (base + 8 * PAGE + 5) // PAGE * PAGE)]
    assert prefetch.spans([]) == []


def _populate_supported() -> bool:
    m = mmap.mmap(-1, PAGE)
    a = np.frombuffer(m, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ok = libc.madvise(a.ctypes.data, PAGE, prefetch.MADV_POPULATE_READ) == 0
    del a
    m.close()
    return ok


def _mapped_kib(addr: int) -> int:
    """Rss of the mapping holding addr (/proc/self/smaps): the KiB of it in this process's page tables."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= addr < hi:
                rss = next(ln for ln in lines[i + 1:] if ln.startswith("Rss:"))
                return int(rss.split()[1])
    raise AssertionError("no mapping holds the address")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _populate_supported(),
                    reason="needs Linux 5.14's MADV_POPULATE_READ")
@pytest.mark.parametrize("warm", [True, False])
def test_pages_are_mapped_before_the_first_read(tmp_path, warm):
    """After the prefetch thread every page of a file mapping is in the page tables (Rss is the
    whole file) though nothing has read it; the control, without the thread, has (almost) none."""
    path = tmp_path / "weights.bin"
    path.write_bytes(np.ones(32 << 20, np.uint8).tobytes())  # 32 MiB, in the page cache once written
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if warm:
        prefetch.start([data[: data.size // 2], data[data.size // 2:]]).join(timeout=60)
    kib = _mapped_kib(data.ctypes.data)
    assert kib == 32 << 10 if warm else kib < 4 << 10


def test_nothing_to_map_starts_no_thread():
    assert prefetch.start([np.zeros(0, np.uint8)]) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prefetches on Linux only")
def test_weights_larger_than_the_memory_left_are_not_prefetched(monkeypatch):
    data = np.zeros(4 * PAGE, np.uint8)
    monkeypatch.setattr(prefetch, "available_bytes", lambda: 2 * PAGE)
    assert prefetch.start([data]) is None
    monkeypatch.setattr(prefetch, "available_bytes", lambda: 8 * PAGE)  # the control: it fits
    t = prefetch.start([data])
    assert t is not None
    t.join(timeout=60)
