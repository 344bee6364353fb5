"""Negative controls' edits of a ModelConfig's blocks (model/block.py): the same model, one property flipped."""

import dataclasses


def with_blocks(cfg, change):
    """cfg with block i replaced by change(i, block)."""
    return dataclasses.replace(cfg, blocks=tuple(change(i, b) for i, b in enumerate(cfg.blocks)))


def with_attention(cfg, layers=None, **changes):
    """Every layer's (or those in `layers`) attention with `changes`; a callable value is applied to
    the attention's current value of that field."""
    def change(i, b):
        if layers is not None and i not in layers:
            return b
        a = b.attention
        new = {k: v(getattr(a, k)) if callable(v) else v for k, v in changes.items()}
        return dataclasses.replace(b, attention=dataclasses.replace(a, **new))

    return with_blocks(cfg, change)


def with_ffn(cfg, **changes):
    return with_blocks(cfg, lambda i, b: dataclasses.replace(b, ffn=dataclasses.replace(b.ffn, **changes)))


def inverted_windows(cfg):
    """The seeds' direction: the windowed and the full layers swapped."""
    w = max(cfg.windows)
    return with_attention(cfg, window=lambda x: 0 if x else w)
