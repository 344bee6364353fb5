"""The parsed-header cache (weights/gguf_cache.py): a hit reads what a parse reads, a changed file
misses, a damaged entry is ignored and written again, an unwritable cache only costs the parse."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from fuelcli.weights import gguf as reader
from fuelcli.weights import gguf_cache

N = 64  # tokens: the tests lower MIN_STRINGS below this, so these small files are cached


def _write(path: Path, word: str = "tok") -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"{word}{i:03d}" for i in range(N)])
    w.add_array("tokenizer.ggml.merges", [f"{word[0]} {i:03d}" for i in range(N)])
    w.add_uint32("test.u32", 7)
    w.add_string("test.str", "héllo")
    w.add_tensor("t.f32", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "MIN_STRINGS", N // 2)
    return tmp_path / "cache" / "gguf-headers"


def _no_parse(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("parsed instead of read from the cache")

    monkeypatch.setattr(reader, "_parse", refuse)


def _same(a, b):
    assert list(a.meta.items()) == list(b.meta.items())
    assert (a.data_offset, a.alignment, list(a.tensors)) == (b.data_offset, b.alignment, list(b.tensors))
    for k in a.tensors:
        assert a.tensors[k].shape == b.tensors[k].shape and a.tensors[k].fmt == b.tensors[k].fmt
        np.testing.assert_array_equal(a.tensors[k].data, b.tensors[k].data)


def test_a_hit_reads_what_the_parse_reads(tmp_path, cache, monkeypatch):
    f = _write(tmp_path / "m.gguf")
    parsed = reader.read_gguf(f)
    assert len(list(cache.iterdir())) == 1
    _no_parse(monkeypatch)
    _same(reader.read_gguf(f), parsed)
    assert reader.read_gguf(f, tensors=False).meta == parsed.meta


def test_small_headers_are_not_kept(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(gguf_cache, "MIN_STRINGS", N + 1)
    reader.read_gguf(_write(tmp_path / "m.gguf"))
    assert not cache.exists() or not list(cache.iterdir())


def _rewrite_in_place(f: Path):
    """New tokens of the same length, the old mtime put back: only ctime (and the bytes) differ."""
    time.sleep(0.05)  # file times tick in jiffies: the rewrite must get a later ctime
    st = f.stat()
    new = _write(f.with_name("new.gguf"), word="TOK").read_bytes()
    assert len(new) == st.st_size
    with open(f, "r+b") as fh:
        fh.write(new)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size


def test_a_changed_file_misses(tmp_path, cache):
    f = _write(tmp_path / "m.gguf")
    assert reader.read_gguf(f).meta["tokenizer.ggml.tokens"][0] == "tok000"
    _rewrite_in_place(f)
    assert reader.read_gguf(f).meta["tokenizer.ggml.tokens"][0] == "TOK000"
    assert len(list(cache.iterdir())) == 1  # the stale entry was replaced


def test_control_a_key_without_ctime_would_be_stale(tmp_path, cache, monkeypatch):
    """The scenario above discriminates: keyed on path, size and mtime only, the cache serves the
    old tokens."""
    real = gguf_cache._entry

    def weak(path, st):
        return real(path, os.stat_result((0, 0, 0, 0, 0, 0, st.st_size, 0, 0, 0, 0, 0, st.st_mtime_ns, 0)))

    monkeypatch.setattr(gguf_cache, "_entry", weak)
    f = _write(tmp_path / "m.gguf")
    reader.read_gguf(f)
    _rewrite_in_place(f)
    assert reader.read_gguf(f).meta["tokenizer.ggml.tokens"][0] == "tok000"


@pytest.mark.parametrize("damage", ["flip", "cut", "empty", "garbage", "valid digest, bad payload"])
def test_a_damaged_entry_is_ignored_and_written_again(tmp_path, cache, damage):
    f = _write(tmp_path / "m.gguf")
    parsed = reader.read_gguf(f)
    (entry,) = cache.iterdir()
    data = entry.read_bytes()
    if damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 1]) + data[-9:]
    elif damage == "cut":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "garbage":
        data = os.urandom(len(data))
    else:
        import hashlib

        payload = b"not a pickle"
        data = hashlib.sha256(payload).digest() + payload
    entry.write_bytes(data)
    _same(reader.read_gguf(f), parsed)
    assert entry.read_bytes() != data  # written again


def test_an_unwritable_cache_only_costs_the_parse(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker))  # gguf-headers/ cannot be made under a file
    monkeypatch.setattr(gguf_cache, "MIN_STRINGS", N // 2)
    f = _write(tmp_path / "m.gguf")
    _same(reader.read_gguf(f), reader.read_gguf(f))


def test_a_separator_inside_a_string_keeps_the_list(tmp_path, cache, monkeypatch):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(N - 1)] + ["a\x00b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = tmp_path / "m.gguf"
    parsed = reader.read_gguf(f)
    assert not cache.exists() or not list(cache.iterdir())  # nothing worth joining: nothing kept
    assert parsed.meta["tokenizer.ggml.tokens"][-1] == "a\x00b"
