"""The oracles fuel is compared with. Each streams one window of tokens as blocks of logits (and, for
--layers, residual-stream states), so a long text never holds more than a slice of [rows, vocab]:

  self          fuel's own numpy reference (reference.py): one full-prefix forward over the window
                (by causality position t sees exactly ids[:t+1]), the output head applied a slice
                at a time.
  transformers  HF transformers, eager attention, float32, on the same weights (directory, or the
                .gguf file through `gguf_file=`), fed slices through its KV cache.
  llama.cpp     llama-cpp-python on the same .gguf file: llama_decode over slices, logits of every
                token, the KV cache cleared between windows.
  PATH          saved logits [rows, vocab]: .npy (memory-mapped), .npz (key `logits` or the first
                array), .safetensors (key `logits` or the only tensor), or .bin, llama.cpp's raw
                float32 dump (model-conversion scripts); rows = every position of every window.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import numpy as np

from ..errors import InputError, MissingDependency, NonFinite
from ..files import is_present, open_regular
from ..finite import check_reference_logits, first_bad_row
from . import tolerances

LLAMA_CPP_NAMES = ("llama.cpp", "llama-cpp", "llamacpp")
LLAMA_CPP_INSTALL = (
    "pip install 'fuel[llama-cpp]' (llama-cpp-python; it compiles llama.cpp, about 5 minutes). On CPUs with "
    "AMX a native build dies with SIGILL: build it portable, "
    "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_FMA=ON -DGGML_F16C=ON\" "
    "pip install --no-binary llama-cpp-python llama-cpp-python"
)


class Oracle:
    name = "?"  # what the report says was compared
    layer_name = None  # what --layers compares with, for oracles that give residual-stream states

    def __init__(self):
        self.seconds, self.tokens = 0.0, 0

    def window(self, ids, hidden: bool = False):
        """Yields (start, logits [n, vocab] float32, states [L+1, n, H] or None) covering ids in order."""
        raise NotImplementedError

    def provenance(self) -> dict:
        raise NotImplementedError

    def _timed(self, fn, n: int):
        t0 = time.perf_counter()
        out = fn()
        self.seconds += time.perf_counter() - t0
        self.tokens += n
        return out


# ---------------------------------------------------------------- self


class SelfOracle(Oracle):
    name = "self (reference.py, full-prefix numpy forward)"
    layer_name = "reference.py"

    def __init__(self, model):
        super().__init__()
        self.model, self._out = model, None

    def window(self, ids, hidden=False):
        from .. import reference
        from ..formats import dequantize

        cfg, w = self.model.cfg, self.model.weights
        out = self._timed(lambda: reference.trunk(cfg, w, ids, hidden=hidden), len(ids))
        x, states = out if hidden else (out, None)
        if self._out is None:
            self._out = dequantize(w.output)  # kept: every window's rows go through it
        step = tolerances.SLICE
        for s in range(0, len(ids), step):
            logits = reference.head(cfg, w, x[s:s + step], self._out)
            check_reference_logits(cfg, w, logits, ids[:s + len(logits)], s)
            yield s, logits, None if states is None else states[:, s:s + step]

    def provenance(self):
        return {"oracle": "self", "implementation": "fuelcli/reference.py (numpy)", "dtype": "float32",
                "device": "cpu"}


# ---------------------------------------------------------------- transformers


class TransformersOracle(Oracle):
    name = "transformers (eager, float32)"
    layer_name = "transformers"

    def __init__(self, model):
        super().__init__()
        self.hf = _hf_load(model)
        import inspect

        import torch

        self.torch = torch
        # transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` before)
        params = inspect.signature(self.hf.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def window(self, ids, hidden=False):
        """The window in slices through transformers' own KV cache; the states are
        output_hidden_states[:-1] (embeddings, after layers 0..L-2) plus the last decoder layer's own
        output taken with a forward hook (hidden_states[-1] is after the final norm)."""
        torch, hf = self.torch, self.hf
        captured, handle = {}, None
        if hidden:
            def hook(_mod, _inp, out):
                captured["last"] = out[0] if isinstance(out, (tuple, list)) else out

            handle = hf.model.layers[-1].register_forward_hook(hook)
        cache, step = None, tolerances.SLICE
        try:
            for s in range(0, len(ids), step):
                block = torch.tensor([list(ids[s:s + step])], dtype=torch.long)
                with torch.inference_mode():
                    out = self._timed(lambda: hf(input_ids=block, use_cache=True, output_hidden_states=hidden,
                                                 **{self.cache_kw: cache}), block.shape[1])
                cache = getattr(out, self.cache_kw, None)
                if cache is None:
                    cache = out.past_key_values
                logits = out.logits[0].float().numpy().astype(np.float32)
                bad = first_bad_row(logits)
                if bad is not None:
                    raise NonFinite(f"the transformers oracle's logits at position {s + bad} are NaN or inf")
                states = None
                if hidden:
                    last = captured["last"]
                    hs = [h[0].float().numpy() for h in out.hidden_states[:-1]]
                    hs.append((last[0] if last.dim() == 3 else last).float().numpy())
                    states = np.stack(hs).astype(np.float32)
                del out
                yield s, logits, states
        finally:
            if handle is not None:
                handle.remove()

    def provenance(self):
        import transformers

        return {"oracle": "transformers", "version": transformers.__version__,
                "torch": self.torch.__version__, "dtype": "float32", "attention": "eager", "device": "cpu"}


def _hf_load(model):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        pkg = "torch" if "torch" in str(e) else "transformers"
        raise MissingDependency(
            f"--oracle transformers needs the `{pkg}` package: pip install torch transformers"
            + (" gguf" if model.source.kind == "gguf" else "")
        ) from None
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars on stderr
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    src = model.source
    try:
        if src.kind == "gguf":
            try:
                import gguf  # noqa: F401
            except ImportError:
                raise MissingDependency("--oracle transformers on a .gguf file needs the `gguf` package: "
                                        "pip install gguf") from None
            # its GGUF loader draws a tqdm bar on stderr that disable_progress_bar() does not reach
            with contextlib.redirect_stderr(io.StringIO()):
                hf = AutoModelForCausalLM.from_pretrained(str(src.path.parent), gguf_file=src.path.name, **kw)
        else:
            hf = AutoModelForCausalLM.from_pretrained(str(src.path), **kw)
    except MissingDependency:
        raise
    except Exception as e:  # an architecture transformers does not know, a broken file, ...
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(f"transformers could not load {src.name}: {type(e).__name__}: {first}") from None
    hf.eval()
    return hf


# ---------------------------------------------------------------- llama.cpp


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependency("--oracle llama.cpp needs the `llama-cpp-python` package: "
                                + LLAMA_CPP_INSTALL) from None
    return llama_cpp


class LlamaCppOracle(Oracle):
    name = "llama.cpp (llama-cpp-python)"

    def __init__(self, model, n_ctx: int):
        super().__init__()
        if model.source.kind != "gguf":
            raise InputError("--oracle llama.cpp reads .gguf files; this model is a safetensors directory")
        lc = self.lc = import_llama_cpp()
        from .. import threads  # noqa: F401  (numba's threading environment, before numba is imported)
        import numba

        self.threads = numba.get_num_threads()  # fuel's own thread count, so the sides compare fairly
        self.step = tolerances.SLICE
        try:
            self.llm = lc.Llama(model_path=str(model.source.path), n_ctx=n_ctx, n_batch=self.step, n_ubatch=self.step,
                                n_threads=self.threads, n_threads_batch=self.threads, logits_all=False,
                                verbose=False)
        except Exception as e:  # llama.cpp refuses the file (an architecture it lacks, ...)
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise InputError(f"llama.cpp could not load {model.source.name}: {first}") from None
        self.ctx = self.llm.ctx
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.llm.model))
        self.batch = lc.llama_batch_init(self.step, 0, 1)

    def __del__(self):
        batch = getattr(self, "batch", None)
        if batch is not None:
            self.lc.llama_batch_free(batch)

    def window(self, ids, hidden=False):
        lc, b = self.lc, self.batch
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        for s in range(0, len(ids), self.step):
            block = ids[s:s + self.step]
            b.n_tokens = len(block)
            for k, t in enumerate(block):
                b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = int(t), s + k, 1, 1
                b.seq_id[k][0] = 0
            rc = self._timed(lambda: lc.llama_decode(self.ctx, b), len(block))
            if rc != 0:
                raise InputError(f"llama.cpp llama_decode failed (code {rc}) at position {s}")
            ptr = lc.llama_get_logits(self.ctx)
            logits = np.ctypeslib.as_array(ptr, shape=(len(block), self.n_vocab)).copy()
            yield s, logits, None

    def provenance(self):
        info = self.lc.llama_print_system_info().decode("utf-8", "replace").strip()
        return {"oracle": "llama.cpp", "llama_cpp_python": getattr(self.lc, "__version__", "?"),
                "system_info": info, "threads": self.threads, "dtype": "as stored (GGUF)", "device": "cpu"}


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
        from ..filehash import sha256

        return {"oracle": "file", "path": str(self.path.resolve()), "sha256": sha256(self.path),
                "format": self.path.suffix.lower()}


def load_saved_logits(path: Path, rows: int, vocab: int):
    """[rows, vocab] floating point, memory-mapped where the format allows (.npy, .bin)."""
    if not is_present(path):
        raise InputError(f"{path}: no such file (--oracle takes self, transformers, llama.cpp or a "
                         ".npy/.npz/.safetensors/.bin file)")
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


def make_oracle(spec: str, model, n_ctx: int, rows: int, layers: bool) -> Oracle:
    """--oracle SPEC for a comparison of `rows` positions in windows of at most n_ctx tokens."""
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
