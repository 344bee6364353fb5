"""The two library entries of `fuel diff`: a short token list (diff) and a long text in
llama-perplexity windows (diff_text). Both stream each window through fuel and the oracle side by
side and reduce every block of logits as it arrives (metrics.WindowStats)."""

from __future__ import annotations

from ..errors import InputError
from .fuel_side import FuelSide, aligned
from .http_json import is_url
from .metrics import WindowStats, layer_diffs
from .oracles import make_oracle
from .provenance import provenance, speed
from .report import DiffResult, TextDiffResult, from_window
from .tolerances import (DEFAULT_CTX, DEFAULT_DECODE_STEPS, DEFAULT_LAYER_RTOL, DEFAULT_MIN_TOP1,
                         DEFAULT_TOL)
from .windows import text_windows


def _window(fuel: FuelSide, oracle, ids, n_states: int, compared=None) -> WindowStats:
    """compared(positions so far) after each piece both sides have given."""
    st = WindowStats(ids, n_states)
    for start, f, o, fs, os_ in aligned(fuel.window(ids), oracle.window(ids, hidden=n_states > 0)):
        st.add(start, f, o, fs, os_)
        if compared is not None:
            compared(start + len(f))
    return st


def diff(model, ids: list, oracle: str = "self", path: str = "decode", tol: float = DEFAULT_TOL,
         min_top1: float = DEFAULT_MIN_TOP1, layers: bool = False, layer_tol: float = DEFAULT_LAYER_RTOL,
         decode_steps: int = DEFAULT_DECODE_STEPS, atol: float | None = None,
         device: str | None = None, cache_type: str = "f32", server: dict | None = None,
         activations: str | None = None) -> DiffResult:
    """server: a URL oracle's options (top_k, server_model, api_key)."""
    from ..assembly.forward_paths import validate_ids

    validate_ids(model, ids)
    fuel = FuelSide(model, len(ids), path, decode_steps, hidden=layers, device=device, cache_type=cache_type,
                    activations=activations)
    n_pre = fuel.prefill_len(len(ids))
    orc = make_oracle(oracle, model, len(ids), len(ids), layers, server)
    st = _window(fuel, orc, ids, model.cfg.num_layers + 1 if layers else 0)
    result = DiffResult(orc.name, path, list(ids), n_pre, from_window(st, n_pre), tol, min_top1, atol,
                        provenance=provenance(model, fuel, orc), window=st, top_k=orc.top_k)
    if layers:
        result.layers = layer_diffs(st.layer_abs, st.layer_scale, layer_tol)
        result.layer_tol, result.layer_oracle = layer_tol, orc.layer_name
    return result


def diff_text(model, file, oracle: str = "self", ctx: int = DEFAULT_CTX, chunks: int | None = None,
              path: str = "decode", tol: float = DEFAULT_TOL, min_top1: float = DEFAULT_MIN_TOP1,
              layers: bool = False, layer_tol: float = DEFAULT_LAYER_RTOL,
              decode_steps: int = DEFAULT_DECODE_STEPS, atol: float | None = None, device: str | None = None,
              progress=None, cache_type: str = "f32", within=None, activations: str | None = None) -> TextDiffResult:
    """progress(chunk_index, n_chunks, result_so_far) after every window; within(chunk_index,
    n_chunks, positions compared) as a window goes."""
    if is_url(oracle):
        raise InputError("--text needs an oracle of whole logits (its perplexity, every window's KL); a server "
                         "gives top-k log-probabilities one request per position: use --tokens or --prompt")
    w = text_windows(model, file, ctx, chunks)
    fuel = FuelSide(model, ctx, path, decode_steps, hidden=layers, device=device, cache_type=cache_type,
                    activations=activations)
    fuel.prefill_len(ctx)  # the path's own checks before anything heavy loads
    orc = make_oracle(oracle, model, ctx, w.n_chunks * ctx, layers)
    result = TextDiffResult(orc.name, path, w, [], tol, min_top1, atol,
                            layer_tol if layers else None, orc.layer_name if layers else None)
    for c in range(w.n_chunks):
        compared = None if within is None else lambda done, c=c: within(c, w.n_chunks, done)
        result.stats.append(_window(fuel, orc, w.window(c), model.cfg.num_layers + 1 if layers else 0, compared))
        if progress is not None:
            progress(c, w.n_chunks, result)
    result.speed = speed(("fuel", fuel), ("oracle", orc))
    result.provenance = provenance(model, fuel, orc)
    return result
