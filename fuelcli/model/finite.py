"""Non-finite values: the forward runs on whatever the weights hold, the logits are checked.

The kernels never raise on NaN or inf (numba's numpy error model: a division by zero gives inf,
see backends/cpu/jit.py; the reference runs under np.errstate(all="ignore")). Every path that hands
logits on (run, logits, diff: decode, prefill and reference) checks them first; NaN or inf stops
with NonFinite (exit 2) naming the position, the first layer whose output went non-finite (the
residual stream of the same tokens, recomputed with hidden states, as `fuel diff --layers` reads
it) and, where one is, the first weight of that layer holding NaN or inf.
"""

from __future__ import annotations

import numpy as np

from ..errors import NonFinite
from ..families.schema import DECODER, EXPERTS


def first_bad_row(logits: np.ndarray) -> int | None:
    rows = np.asarray(logits).reshape(-1, np.shape(logits)[-1])
    bad = ~np.isfinite(rows).all(axis=-1)
    return int(np.argmax(bad)) if bad.any() else None


def first_bad_layer(states: np.ndarray) -> int | None:
    """states [L+1, T, H] (entry 0 the embeddings): -1 for the embeddings, i for layer i, None if finite."""
    bad = ~np.isfinite(states.reshape(len(states), -1)).all(axis=-1)
    return int(np.argmax(bad)) - 1 if bad.any() else None


def _named_arrays(weights, layer: int | None):
    """(name, float32 array) of the weights that feed the given stage, one at a time."""
    from ..formats import dequantize

    def vector_name(v, what):
        return weights.vector_names.get(id(v), what)

    def items():
        if layer is None:
            yield vector_name(weights.final_norm, "final norm"), weights.final_norm
            yield weights.output.name, weights.output
        elif layer < 0:
            yield weights.embed.name, weights.embed
        else:
            lw = weights.layers[layer]
            for spec in DECODER.layer:  # every role a layer may have, in schema order
                value = getattr(lw, spec.role)
                for v in value if spec.kind == EXPERTS else [value]:
                    if v is not None:
                        yield (vector_name(v, f"{spec.role} of layer {layer}") if isinstance(v, np.ndarray) else v.name), v

    for name, value in items():
        yield name, value if isinstance(value, np.ndarray) else dequantize(value)  # f32 vectors, stored matrices


def bad_weight(weights, layer: int | None) -> str | None:
    """The first weight of a stage (layer i, -1 embeddings, None output) holding NaN or inf."""
    if weights is None:
        return None
    return next((name for name, a in _named_arrays(weights, layer) if not np.isfinite(a).all()), None)


def _stage(layer: int | None, n_layers: int) -> str:
    if layer is None:
        return "after the last layer (final norm or output matrix)"
    return "in the token embeddings" if layer < 0 else f"in layer {layer} of {n_layers}"


def require_finite(logits: np.ndarray, path: str, locate, weights=None, n_layers: int = 0,
                   first_pos: int = 0) -> None:
    """Raise NonFinite if the logits hold NaN or inf. locate() -> the residual stream [L+1, T, H] of
    the same tokens (called only then); weights: the ModelWeights, to name a bad weight."""
    row = first_bad_row(logits)
    if row is None:
        return
    values = np.asarray(logits).reshape(-1, np.shape(logits)[-1])[row]
    what = "NaN" if np.isnan(values).any() else "inf"
    layer = first_bad_layer(locate())
    culprit = bad_weight(weights, layer)
    cause = (f"weight {culprit} holds NaN or inf" if culprit else
             "no weight there is NaN or inf, so the values overflow float32")
    raise NonFinite(f"the logits at position {first_pos + row} are {what} ({path} path): the residual stream "
                    f"first goes non-finite {_stage(layer, n_layers)}; {cause}")


def engine_states(engine, tokens) -> np.ndarray:
    """The residual stream of `tokens` from a fresh forward of the engine (its cache is reset)."""
    engine.reset()
    return engine.prefill(list(tokens), hidden=True)[1]


def check_engine_logits(engine, logits: np.ndarray, tokens, path: str, first_pos: int = 0) -> None:
    """require_finite for logits an engine computed from `tokens` (all the tokens fed so far)."""
    if first_bad_row(logits) is None:  # the common case, before touching anything else of the engine
        return
    require_finite(logits, path, lambda: engine_states(engine, tokens), getattr(engine, "weights", None),
                   engine.cfg.num_layers, first_pos)
