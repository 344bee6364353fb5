"""Parsed GGUF headers kept on disk, so a start does not walk the vocabulary again.

A 151k-token vocabulary is ~300k length-prefixed strings (tokens and merges): walking them takes a
start ~0.2 s; an entry here loads in ~0.03 s (each big string array is stored as one string).
Only what the parser returns is kept (metadata, tensor infos, where the header ends); every check
on it still runs on each start (gguf.py, gguf_meta.py).

An entry is keyed by the file's identity: real path, device, inode, size, mtime and ctime (which
no one can set back), and the parser's own source, so a file rewritten, replaced or touched, or a
fuel whose parser changed, misses. An entry carries the SHA-256 of its payload: a damaged or cut
entry is ignored and written again, never trusted. Only headers with a vocabulary-sized string
array are kept (small ones parse in microseconds); a file keeps one entry (a new one replaces the
older). Entries live in gguf-headers/ under derived_cache.cache_root(); a read-only or full cache only
costs the parse.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

from ..fileio.derived_cache import cache_root, write_atomic

MIN_STRINGS = 4096  # a string array at least this long makes a header worth keeping
_SEP = "\x00"
_PARSER = hashlib.sha256(b"".join(p.read_bytes() for p in
                                  (Path(__file__), Path(__file__).with_name("gguf.py")))).hexdigest()


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:n]


def _entry(path: str, st: os.stat_result) -> Path:
    """gguf-headers/PATH-IDENTITY: the path's part names a file's entries whatever its version."""
    real = os.path.realpath(path)
    identity = f"{real}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{_PARSER}"
    return cache_root() / "gguf-headers" / f"{_hex(real, 16)}-{_hex(identity, 32)}"


def load(path: str, st: os.stat_result):
    """(meta, infos, header_end) as parsed before from this very file, or None."""
    try:
        data = _entry(path, st).read_bytes()
        digest, payload = data[:32], data[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        order, small, joined, infos, end = pickle.loads(payload)
        return {k: joined[k].split(_SEP) if k in joined else small[k] for k in order}, infos, end
    except Exception:  # missing, unreadable or damaged: parse the file
        return None


def store(path: str, st: os.stat_result, meta: dict, infos: list, end: int):
    joined = {}
    for k, v in meta.items():
        if isinstance(v, list) and len(v) >= MIN_STRINGS and all(isinstance(s, str) for s in v):
            s = _SEP.join(v)
            if s.count(_SEP) == len(v) - 1:  # no element holds the separator: the split gives v back
                joined[k] = s
    if not joined:
        return
    small = {k: v for k, v in meta.items() if k not in joined}
    payload = pickle.dumps((list(meta), small, joined, infos, end), protocol=pickle.HIGHEST_PROTOCOL)
    entry = _entry(path, st)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(entry, hashlib.sha256(payload).digest() + payload)
        for old in entry.parent.glob(entry.name[:17] + "*"):  # this file's earlier versions
            if old != entry and "." not in old.name:  # (not another writer's temporary file)
                old.unlink(missing_ok=True)
    except OSError:
        pass
