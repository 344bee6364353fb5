"""How /v1/embeddings turns a text's hidden states into one vector: the model's own pooling.

The pooling follows what the model declares, as llama-server and sentence-transformers read it:
a GGUF file's `{arch}.pooling_type` (llama.cpp's enum), else sentence-transformers' Pooling module
config in the model directory (modules.json names it; `1_Pooling/config.json` by default), else
last-token pooling, as Qwen3-Embedding (a causal LM's last position is the only one that has read
the whole text). `fuel serve --pooling` overrides it. The states pooled are the final-normed hidden
states (what the output head reads); the vector is L2-normalised, and `dimensions` truncates it
first (Matryoshka) and normalises again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..assembly.reference import rmsnorm
from ..errors import InputError
from ..fileio.files import is_present, read_regular
from ..fileio.jsondoc import MAX_BYTES, read_object

MODES = ("mean", "cls", "last")
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's LLAMA_POOLING_TYPE_*
ST_MODES = {"mean_tokens": "mean", "cls_token": "cls", "lasttoken": "last", "max_tokens": "max",
            "mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean_tokens": "weightedmean"}


@dataclass
class Pooling:
    mode: str  # one of MODES, or what the model declared that fuel does not pool ("none", "rank", "max", ...)
    source: str  # where it came from, for the log and the errors

    @property
    def supported(self) -> bool:
        return self.mode in MODES


def _pooling_dir(directory: Path) -> str:
    """Where modules.json puts the Pooling module (1_Pooling when it is absent or says nothing)."""
    path = directory / "modules.json"
    if not is_present(path):
        return "1_Pooling"
    try:
        listed = json.loads(read_regular(path, MAX_BYTES))
    except (ValueError, RecursionError):
        raise InputError(f"{path} is not valid JSON") from None
    if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
        raise InputError(f"{path} is not a sentence-transformers modules list (an array of objects)")
    found = [m.get("path") for m in listed if str(m.get("type", "")).endswith(".Pooling")]
    if found and not isinstance(found[0], str):
        raise InputError(f"{path}: the Pooling module's path must be a string")
    return found[0] if found else "1_Pooling"


def _sentence_transformers(directory: Path) -> Pooling | None:
    config = directory / _pooling_dir(directory) / "config.json"
    conf = read_object(config, required=False)
    if conf is None:
        return None
    if isinstance(conf.get("pooling_mode"), str):  # Pooling(pooling_mode=...)'s own spelling
        named = [{"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(conf["pooling_mode"], conf["pooling_mode"])]
    else:
        named = [mode for key, mode in ST_MODES.items() if conf.get(f"pooling_mode_{key}") is True]
    return Pooling(named[0] if len(named) == 1 else "+".join(named) or "none", str(config))


def model_pooling(source_kind: str, path: Path, gguf_meta: dict | None, override: str | None) -> Pooling:
    """The pooling of the model at `path` (a model directory, or a .gguf file with its metadata)."""
    if override is not None:  # one of MODES (the command checks it)
        return Pooling(override, "--pooling")
    if gguf_meta is not None:
        arch = gguf_meta.get("general.architecture")
        value = gguf_meta.get(f"{arch}.pooling_type")
        if value is not None:
            mode = GGUF_POOLING.get(value, f"type {value!r}") if isinstance(value, int) else f"type {value!r}"
            return Pooling(mode, f"{arch}.pooling_type")
    elif source_kind == "dir":
        found = _sentence_transformers(Path(path))
        if found is not None:
            return found
    return Pooling("last", "a causal LM's default (last token, as Qwen3-Embedding)")


@dataclass
class Embedder:
    """What the engine's hidden states need to become a text's vector: the final norm and the pooling."""

    final_norm: np.ndarray
    eps: float
    pooling: Pooling
    hidden_size: int

    def vector(self, residual: np.ndarray) -> np.ndarray:
        """The last layer's residual stream [T, H] (engine.prefill(hidden=True)[1][-1]) -> the pooled,
        L2-normalised vector [H] (float32)."""
        states = rmsnorm(residual.astype(np.float32), self.final_norm, self.eps)
        mode = self.pooling.mode
        pooled = states[0] if mode == "cls" else states[-1] if mode == "last" else states.mean(axis=0)
        return normalized(pooled)


def normalized(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    norm = np.linalg.norm(v)
    return (v / norm if norm > 0 else v).astype(np.float32)


def truncated(v: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Matryoshka: the first `dimensions` components, normalised again."""
    return v if dimensions is None or dimensions >= len(v) else normalized(v[:dimensions])
