"""The SHA-256 cache of provenance: right digests, reused while (path, size, mtime) hold, recomputed
when any changes, stale entries dropped, a broken cache file survived."""

import hashlib
import json
import os

from fuelcli.fileio import filehash


def test_sha256_cached_by_path_size_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "home"))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"abc" * 1000)
    want = hashlib.sha256(b"abc" * 1000).hexdigest()
    assert filehash.sha256(f) == want
    st = os.stat(f)
    f.write_bytes(b"xyz" * 1000)  # same size; put the mtime back: the cache cannot tell, by design
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert filehash.sha256(f) == want
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new mtime: hashed again
    assert filehash.sha256(f) == hashlib.sha256(b"xyz" * 1000).hexdigest()
    cache = json.loads((tmp_path / "home" / filehash.CACHE_NAME).read_text())
    assert len(cache) == 1  # the stale entry of the same file is gone

    g = tmp_path / "other.bin"
    g.write_bytes(b"1")
    filehash.sha256(g)
    g.unlink()
    h = tmp_path / "third.bin"
    h.write_bytes(b"2")
    filehash.sha256(h)
    keys = json.loads((tmp_path / "home" / filehash.CACHE_NAME).read_text())
    assert not any(k.startswith(str(g.resolve())) for k in keys)  # files that are gone are dropped

    (tmp_path / "home" / filehash.CACHE_NAME).write_text("{broken")
    assert filehash.sha256(f) == hashlib.sha256(b"xyz" * 1000).hexdigest()
