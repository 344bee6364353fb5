"""SHA-256 of files, remembered in FUEL_HOME/sha256.json under (real path, size, mtime) so a 5 GB
model is hashed once, not on every report; a file that changes size or mtime is hashed again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE_NAME = "sha256.json"


def _cache_path() -> Path:
    from .derived_cache import fuel_home

    return fuel_home() / CACHE_NAME


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}  # a missing or damaged cache only costs a re-hash


def sha256(path: str | os.PathLike) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = _cache_path()
    cache = _load(cache_file)
    if key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    # drop this file's stale entries and those of files that are gone (test runs' temporary models)
    cache = {k: v for k, v in _load(cache_file).items()
             if not k.startswith(real + "|") and os.path.exists(k.rsplit("|", 2)[0])}
    cache[key] = digest
    try:  # write whole or not at all: concurrent runs may race, never half-write
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{CACHE_NAME}.{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=0))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only FUEL_HOME: the hash is still right, just not remembered
    return digest


def model_files(source) -> list[Path]:
    """The files that make the model: the .gguf file, or a directory's config, weights and tokenizer."""
    if source.kind == "gguf":
        return [Path(source.path)]
    d = Path(source.path)
    names = ["config.json", *sorted(p.name for p in d.glob("*.safetensors")), "tokenizer.json"]
    return [d / n for n in names if (d / n).is_file()]
