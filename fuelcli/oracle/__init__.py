"""Compare fuel's fast path with an oracle (`fuel diff`): per position KL(oracle ‖ fuel), max|Δ| of
the logits and top-1 agreement; per layer max|Δ| of the residual stream; over long texts, in
llama-perplexity windows, the perplexity of both sides.

    tolerances.py  default thresholds (measured) and window sizes
    metrics.py     per-position reductions, block by block (bounded memory)
    fuel_side.py   fuel's engine over a window, as blocks of logits
    oracles.py     self, transformers, llama.cpp, saved logits: the same blocks from the oracle
    server.py      an OpenAI-compatible server's top-k logprobs (http_json.py: its requests);
                   topk.py: what those give against fuel's logits
    windows.py     a text file as llama-perplexity windows
    compare.py     diff (a short token list) and diff_text (a long text)
    report.py      results, verdicts, JSON
    provenance.py  what was compared (versions, model SHA-256)
    picture.py     KL against position (and per-layer divergence) in the terminal; plot.py: PNG/SVG
"""

from .tolerances import (DEFAULT_CTX, DEFAULT_DECODE_STEPS, DEFAULT_LAYER_RTOL, DEFAULT_MIN_TOP1,
                         DEFAULT_TOL, DEFAULT_TOP_K)


def __getattr__(name):
    """diff, diff_text and kl_div load on first use: every CLI start imports this package for the
    defaults of `fuel diff`'s options, and `fuel run` needs nothing else from it."""
    if name in ("diff", "diff_text"):
        from . import compare

        return getattr(compare, name)
    if name == "kl_div":
        from .metrics import kl_div

        return kl_div
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["diff", "diff_text", "kl_div", "DEFAULT_CTX", "DEFAULT_DECODE_STEPS", "DEFAULT_LAYER_RTOL",
           "DEFAULT_MIN_TOP1", "DEFAULT_TOL", "DEFAULT_TOP_K"]
