"""The oracles fuel is compared with. Each streams one window of tokens as blocks of logits (and, for
--layers, residual-stream states), so a long text never holds more than a slice of [rows, vocab]:

  self          fuel's own numpy reference (assembly/reference.py): one full-prefix forward over the window
                (by causality position t sees exactly ids[:t+1]), the output head applied a slice
                at a time.
  transformers  HF transformers, eager attention, float32, on the same weights (directory, or the
                .gguf file through `gguf_file=`), fed slices through its KV cache.
  llama.cpp     llama-cpp-python on the same .gguf file: llama_decode over slices, logits of every
                token, the KV cache cleared between windows.
The two peers run in processes of their own (fuelcli/peers/): their threads never share fuel's
process, and a peer that crashes is one error line (exit 5), not fuel's death.
  URL           an OpenAI-compatible server's top-k log-probabilities (server.py), by teacher forcing.
  PATH          saved logits [rows, vocab]: .npy (memory-mapped), .npz (key `logits` or the first
                array), .safetensors (key `logits` or the only tensor), or .bin, llama.cpp's raw
                float32 dump (model-conversion scripts); rows = every position of every window.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..model.finite import first_bad_row
from ..fileio.files import is_present, open_regular
from . import tolerances
from .base import Oracle

LLAMA_CPP_NAMES = ("llama.cpp", "llama-cpp", "llamacpp")


# ---------------------------------------------------------------- self


class SelfOracle(Oracle):
    name = "self (reference.py, full-prefix numpy forward)"
    layer_name = "reference.py"

    def __init__(self, model):
        super().__init__()
        self.model, self._out = model, None

    def window(self, ids, hidden=False):
        from ..formats import dequantize
        from ..assembly import reference

        cfg, w = self.model.cfg, self.model.weights
        out = self._timed(lambda: reference.trunk(cfg, w, ids, hidden=hidden), len(ids))
        x, states = out if hidden else (out, None)
        if self._out is None:
            self._out = dequantize(w.output)  # kept: every window's rows go through it
        step = tolerances.SLICE
        for s in range(0, len(ids), step):
            logits = reference.head(cfg, w, x[s:s + step], self._out)
            reference.check_reference_logits(cfg, w, logits, ids[:s + len(logits)], s)
            yield s, logits, None if states is None else states[:, s:s + step]

    def provenance(self):
        return {"oracle": "self", "implementation": "fuelcli/assembly/reference.py (numpy)", "dtype": "float32",
                "device": "cpu"}


# ---------------------------------------------------------------- peers: each in a process of its own


def _peer_threads() -> int:
    from ..process import threads  # noqa: F401  (numba's threading environment, before numba is imported)
    import numba

    return numba.get_num_threads()  # fuel's own thread count, so the sides compare fairly


class TransformersOracle(Oracle):
    name = "transformers (eager, float32)"
    layer_name = "transformers"

    def __init__(self, model):
        from ..peers import require
        from ..peers.child import PeerProcess

        super().__init__()
        src = model.source
        self.peer = PeerProcess(require("transformers", "--oracle"), _peer_threads(), path=str(src.path),
                                source_kind=src.kind, name=src.name, attention="eager")

    def window(self, ids, hidden=False):
        """The window in slices through transformers' own KV cache (peers/transformers.py)."""
        self.peer.call("reset")
        for s in range(0, len(ids), tolerances.SLICE):
            block = np.asarray(ids[s:s + tolerances.SLICE], np.int64)
            logits, states, dt = self.peer.call("window_slice", block, s, hidden)
            self.seconds, self.tokens = self.seconds + dt, self.tokens + len(block)
            yield s, logits, states

    def provenance(self):
        i = self.peer.info
        return {"oracle": "transformers", "version": i["version"], "torch": i["torch"], "dtype": "float32",
                "attention": i["attention"], "device": "cpu", "threads": i["threads"]}


class LlamaCppOracle(Oracle):
    name = "llama.cpp (llama-cpp-python)"

    def __init__(self, model, n_ctx: int):
        from ..peers import require
        from ..peers.child import PeerProcess

        super().__init__()
        if model.source.kind != "gguf":
            raise InputError("--oracle llama.cpp reads .gguf files; this model is a safetensors directory")
        src = model.source
        self.peer = PeerProcess(require("llama.cpp", "--oracle"), _peer_threads(), path=str(src.path),
                                name=src.name, n_ctx=n_ctx, n_batch=tolerances.SLICE)

    def window(self, ids, hidden=False):
        self.peer.call("clear")
        for s in range(0, len(ids), tolerances.SLICE):
            block = np.asarray(ids[s:s + tolerances.SLICE], np.int64)
            logits, dt = self.peer.call("logits", block, s)
            self.seconds, self.tokens = self.seconds + dt, self.tokens + len(block)
            yield s, logits, None

    def provenance(self):
        i = self.peer.info
        return {"oracle": "llama.cpp", "llama_cpp_python": i["version"], "system_info": i["system_info"],
                "threads": i["threads"], "dtype": "as stored (GGUF)", "device": "cpu"}


# ---------------------------------------------------------------- saved logits


class SavedOracle(Oracle):
    def __init__(self, path: Path, rows: int, vocab: int):
        super().__init__()
        self.path = Path(path)
        self.name = f"saved logits {path}"
        self.arr = load_saved_logits(self.path, rows, vocab)
        self.offset = 0

    def window(self, ids, hidden=False):
        n = len(ids)
        base, self.offset = self.offset, self.offset + n
        step = tolerances.SLICE
        for s in range(0, n, step):
            block = np.asarray(self.arr[base + s:base + min(n, s + step)], np.float32)
            bad = first_bad_row(block)
            if bad is not None:
                raise InputError(f"{self.path}: the saved logits at position (row) {base + s + bad} are NaN or inf "
                                 "(or beyond float32)")
            yield s, block, None

    def provenance(self):
        from ..fileio.filehash import sha256

        return {"oracle": "file", "path": str(self.path.resolve()), "sha256": sha256(self.path),
                "format": self.path.suffix.lower()}


def load_saved_logits(path: Path, rows: int, vocab: int):
    """[rows, vocab] floating point, memory-mapped where the format allows (.npy, .bin)."""
    if not is_present(path):
        raise InputError(f"{path}: no such file (--oracle takes self, transformers, llama.cpp, a "
                         ".npy/.npz/.safetensors/.bin file or a server's http(s)://HOST:PORT/v1)")
    open_regular(path).close()  # a FIFO or a directory is refused here, before a reader blocks on it
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        elif suffix == ".bin":
            size = os.path.getsize(path)
            if size % (4 * vocab):
                raise InputError(f"{path}: {size} bytes is not a whole number of float32 rows of vocab {vocab} "
                                 "(a llama.cpp .bin logits dump is raw float32 [n_tokens, n_vocab])")
            arr = np.memmap(path, dtype="<f4", mode="r").reshape(-1, vocab)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if not z.files:
                    raise InputError(f"{path}: empty .npz")
                arr = z["logits"] if "logits" in z.files else z[z.files[0]]
        elif suffix == ".safetensors":
            from safetensors.numpy import load_file

            tensors = load_file(str(path))
            if "logits" in tensors:
                arr = tensors["logits"]
            elif len(tensors) == 1:
                arr = next(iter(tensors.values()))
            else:
                raise InputError(f"{path}: {len(tensors)} tensors and none named 'logits'")
        else:
            raise InputError(f"{path}: unknown logits file type {suffix!r} (use .npy, .npz, .safetensors or .bin)")
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{path}: cannot read logits: {type(e).__name__}: {e}") from None
    if arr.ndim != 2 or arr.shape != (rows, vocab):
        raise InputError(f"{path}: logits of shape {list(arr.shape)}, expected [seq={rows}, vocab={vocab}]")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"{path}: logits dtype {arr.dtype} is not floating point")
    return arr


# ---------------------------------------------------------------- choosing one


def make_oracle(spec: str, model, n_ctx: int, rows: int, layers: bool, server: dict | None = None) -> Oracle:
    """--oracle SPEC for a comparison of `rows` positions in windows of at most n_ctx tokens; server:
    a URL oracle's options (top_k, server_model, api_key)."""
    from .http_json import is_url

    if is_url(spec):
        from .server import ServerOracle

        if layers:
            raise InputError("--layers needs hidden states: a server gives log-probabilities only "
                             "(use --oracle self or --oracle transformers)")
        return ServerOracle(model, spec, **{"top_k": tolerances.DEFAULT_TOP_K, **(server or {})})
    if spec == "self":
        oracle = SelfOracle(model)
    elif spec == "transformers":
        oracle = TransformersOracle(model)
    elif spec.lower() in LLAMA_CPP_NAMES:
        if layers:
            raise InputError("--layers needs hidden states: llama.cpp gives logits only "
                             "(use --oracle self or --oracle transformers)")
        oracle = LlamaCppOracle(model, n_ctx)
    else:
        if layers:
            raise InputError("--layers needs hidden states: use --oracle self or --oracle transformers "
                             "(saved logits carry none)")
        oracle = SavedOracle(Path(spec), rows, model.cfg.vocab_size)
    return oracle
