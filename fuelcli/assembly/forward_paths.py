"""Logits of a whole sequence by each of fuel's three forward paths (`fuel logits`, `fuel diff`)."""

import numpy as np

from ..errors import InputError

PATHS = ("decode", "prefill", "reference")


def validate_ids(model, ids: list[int]):
    """Token ids a forward can take: some, within the context and the vocabulary."""
    if not ids:
        raise InputError("no tokens given")
    if len(ids) > model.cfg.max_position:
        raise InputError(f"{len(ids)} tokens exceed the model's context of {model.cfg.max_position}")
    bad = [i for i in ids if not 0 <= i < model.cfg.vocab_size]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the vocabulary 0..{model.cfg.vocab_size - 1}")


def logits_by_path(model, ids: list[int], path: str, hidden: bool = False, device: str | None = None,
                   cache_type: str = "f32", activations: str | None = None):
    """float32 [seq, vocab]; with hidden=True also the residual stream [L+1, seq, H].
    Non-finite logits raise NonFinite naming the layer where they start (finite.py)."""
    from ..model.finite import check_engine_logits

    validate_ids(model, ids)
    if path == "reference":
        from . import reference

        out = reference.forward(model.cfg, model.weights, ids, hidden=hidden)
        reference.check_reference_logits(model.cfg, model.weights, out[0] if hidden else out, ids)
        return out
    from ..backends import make_engine

    engine = make_engine(model.cfg, model.weights, n_ctx=len(ids), device=device, cache_type=cache_type,
                         activations=activations)
    if path == "prefill":
        out = engine.prefill(ids, all_logits=True, hidden=hidden)
        check_engine_logits(engine, out[0] if hidden else out, ids, path)
        return out
    rows, states = [], []
    for t in ids:
        out = engine.decode(t, hidden=hidden)
        rows.append(out[0] if hidden else out)
        if hidden:
            states.append(out[1])
    logits = np.stack(rows).astype(np.float32)
    check_engine_logits(engine, logits, ids, path)
    return (logits, np.concatenate(states, axis=1)) if hidden else logits
