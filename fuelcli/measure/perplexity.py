"""`fuel perplexity`: llama-perplexity's method (tools/perplexity/perplexity.cpp, `perplexity()`), so
the numbers compare with llama.cpp's on the same file and text.

The text goes into windows of n_ctx tokens (oracle/windows.py: BOS in front of each when the
vocabulary adds one; at least 2 * n_ctx tokens, as llama.cpp asks). Each window starts from an
empty KV cache; its first half is prefilled without logits, its second half with all logits, and
the logits at positions n_ctx/2 .. n_ctx-2 score the next token: n_ctx/2 - 1 tokens per window.
PPL = exp(mean NLL) over every scored token; the uncertainty is llama.cpp's,
sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)) * PPL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .. import __version__
from ..oracle.metrics import ROWS, perplexity as ppl_of
from ..oracle.provenance import model_record
from ..oracle import tolerances
from ..oracle.tolerances import DEFAULT_CTX
from ..oracle.windows import text_windows


def next_token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, in float64, ROWS rows at a time."""
    out = np.empty(len(targets))
    for s in range(0, len(targets), ROWS):
        x = logits[s:s + ROWS].astype(np.float64)
        m = x.max(-1)
        lse = m + np.log(np.exp(x - m[:, None]).sum(-1))
        out[s:s + ROWS] = lse - x[np.arange(len(x)), targets[s:s + ROWS]]
    return out


@dataclass
class PerplexityResult:
    file: str
    ctx: int
    n_tokens: int  # the whole text, tokenized
    running: list = field(default_factory=list)  # PPL after each window, as llama.cpp prints them
    nll: list = field(default_factory=list)  # arrays, one per window
    seconds: float = 0.0  # inside the engine
    tokenize_seconds: float = 0.0
    provenance: dict = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(sum(len(x) for x in self.nll))

    @property
    def ppl(self) -> tuple[float, float]:
        return ppl_of(np.concatenate(self.nll))

    @property
    def tokens_per_second(self) -> float:
        return len(self.nll) * self.ctx / self.seconds if self.seconds > 0 else float("nan")

    def to_json(self) -> dict:
        ppl, err = self.ppl
        return {"file": self.file, "ctx": self.ctx, "chunks": len(self.nll), "tokens": self.n_tokens,
                "scored": self.count, "ppl": ppl, "ppl_stderr": err, "running": self.running,
                "mean_nll": float(np.concatenate(self.nll).mean()),
                "speed": {"tokens": len(self.nll) * self.ctx, "seconds": round(self.seconds, 3),
                          "tokens_per_second": round(self.tokens_per_second, 2)},
                "provenance": self.provenance}


def perplexity(model, file, ctx: int = DEFAULT_CTX, chunks: int | None = None, device: str | None = None,
               on_start=None, on_chunk=None, cache_type: str = "f32",
               activations: str | None = None) -> PerplexityResult:
    """on_start(windows, tokenize_seconds) before the first window; on_chunk(index, n, result,
    seconds of that window) after each."""
    from ..backends import make_engine

    t0 = time.perf_counter()
    w = text_windows(model, file, ctx, chunks, min_tokens=2 * ctx)
    r = PerplexityResult(str(file), ctx, len(w.ids), tokenize_seconds=time.perf_counter() - t0)
    engine = make_engine(model.cfg, model.weights, n_ctx=ctx, device=device, cache_type=cache_type,
                         activations=activations)
    if on_start is not None:
        on_start(w, r.tokenize_seconds)
    first = w.first
    for c in range(w.n_chunks):
        ids = w.window(c)
        t0 = time.perf_counter()
        engine.reset()
        for s in range(0, first, tolerances.SLICE):  # context only: no logits wanted
            engine.prefill(ids[s:min(first, s + tolerances.SLICE)])
        nll = []
        for s in range(first, ctx, tolerances.SLICE):
            e = min(ctx, s + tolerances.SLICE)
            logits = engine.prefill(ids[s:e], all_logits=True)
            rows = min(e, ctx - 1) - s  # the last position has no next token
            nll.append(next_token_nll(logits[:rows], np.asarray(ids[s + 1:s + 1 + rows])))
        dt = time.perf_counter() - t0
        r.seconds += dt
        r.nll.append(np.concatenate(nll))
        r.running.append(r.ppl[0])
        if on_chunk is not None:
            on_chunk(c, w.n_chunks, r, dt)
    r.provenance = {"fuel": {"version": __version__, "device": engine.device, "backend": engine.backend},
                    "model": model_record(model.source)}
    return r
