"""HF transformers in float32 on the same weights (the directory, or `gguf_file=` for a .gguf, which
it dequantises), in its own process (child.py).

For bench: pp = one forward over N ids (the last position's logits only, as fuel), tg = N
one-token forwards through the KV cache, under torch.inference_mode(), a fresh cache per run; the
seconds are timed here, around the forwards alone.
For the oracle (eager attention): a window's slices through its own KV cache, every position's
logits and, for --layers, the residual stream after every layer.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import time
from pathlib import Path

import numpy as np

from ..errors import InputError, MissingDependency, NonFinite
from ..model.finite import first_bad_row


class TransformersPeer:
    def __init__(self, path: str, source_kind: str, name: str, threads: int, attention: str | None = None):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Loading weights" bars on stderr
        torch.set_num_threads(threads)
        self.torch, self.version = torch, transformers.__version__
        kw = dict(dtype=torch.float32)
        if attention:
            kw["attn_implementation"] = attention
        try:
            if source_kind == "gguf":
                try:
                    import gguf  # noqa: F401
                except ImportError:
                    raise MissingDependency("transformers reads a .gguf file through the `gguf` package: "
                                            "pip install gguf") from None
                # its GGUF loader draws a tqdm bar on stderr that disable_progress_bar() does not reach
                with contextlib.redirect_stderr(io.StringIO()):
                    model = AutoModelForCausalLM.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name,
                                                                 **kw)
            else:
                model = AutoModelForCausalLM.from_pretrained(path, **kw)
        except MissingDependency:
            raise
        except Exception as e:  # an architecture transformers does not know, a broken file, ...
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise InputError(f"transformers could not load {name}: {type(e).__name__}: {first}") from None
        self.model = model.eval()
        # transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` before)
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.attention = getattr(model.config, "_attn_implementation", None) or "default"
        self.threads = torch.get_num_threads()
        self.past = None

    def info(self) -> dict:
        return {"version": self.version, "torch": self.torch.__version__,
                "threads": self.threads, "attention": self.attention,
                "detail": f"transformers {self.version}, torch {self.torch.__version__}, float32, "
                          f"attn {self.attention}"}

    def _ids(self, ids):
        return self.torch.from_numpy(np.ascontiguousarray(ids, np.int64).reshape(1, -1))

    def _forward(self, ids_2d, past, **kw):
        out = self.model(input_ids=ids_2d, use_cache=True, **kw, **{self.cache_kw: past})
        cache = getattr(out, self.cache_kw, None)
        return out, (cache if cache is not None else out.past_key_values)

    # ---------------------------------------------------------------- bench

    def prepare(self, depth_ids, seqs: int = 1):
        """A fresh DynamicCache (of `seqs` rows of the batch dimension) holding depth_ids."""
        self.past = None
        if len(depth_ids):
            with self.torch.inference_mode():
                _, self.past = self._forward(self._ids(depth_ids).repeat(seqs, 1), None, logits_to_keep=1)

    def pp(self, ids) -> float:
        x = self._ids(ids)
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            _, self.past = self._forward(x, self.past, logits_to_keep=1)
            return time.perf_counter() - t0

    def tg(self, ids) -> float:
        """ids [N] (one sequence) or [N, B] (B sequences, the batch dimension): N forward steps."""
        xs = [self._ids(ids[i]).reshape(-1, 1) for i in range(len(ids))]
        fwd, past = self._forward, self.past
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            for x in xs:
                _, past = fwd(x, past, logits_to_keep=1)
            dt = time.perf_counter() - t0
        self.past = past
        return dt

    def cache_length(self) -> int:
        return 0 if self.past is None else int(self.past.get_seq_length())

    # ---------------------------------------------------------------- oracle

    def reset(self):
        self.past = None

    def window_slice(self, ids, start: int, hidden: bool):
        """The next slice of a window through the KV cache: (logits [n, vocab] float32, states
        [L+1, n, H] or None, seconds). The states are output_hidden_states[:-1] (embeddings, after
        layers 0..L-2) plus the last decoder layer's own output, taken with a forward hook
        (hidden_states[-1] is after the final norm)."""
        torch = self.torch
        captured, handle = {}, None
        if hidden:
            def hook(_mod, _inp, out):
                captured["last"] = out[0] if isinstance(out, (tuple, list)) else out

            handle = self.model.model.layers[-1].register_forward_hook(hook)
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                out, self.past = self._forward(self._ids(ids), self.past, output_hidden_states=hidden)
                dt = time.perf_counter() - t0
        finally:
            if handle is not None:
                handle.remove()
        logits = out.logits[0].float().numpy().astype(np.float32)
        bad = first_bad_row(logits)
        if bad is not None:
            raise NonFinite(f"the transformers oracle's logits at position {start + bad} are NaN or inf")
        states = None
        if hidden:
            last = captured["last"]
            hs = [h[0].float().numpy() for h in out.hidden_states[:-1]]
            hs.append((last[0] if last.dim() == 3 else last).float().numpy())
            states = np.stack(hs).astype(np.float32)
        return logits, states, dt
