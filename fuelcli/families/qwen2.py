"""Qwen2: q/k/v biases always, per-layer sliding windows (transformers' direction)."""

from ..errors import ConfigError
from .base import COMMON_DEFAULTS, Family

WINDOW_KINDS = ("full_attention", "sliding_attention")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def layer_type_list(r):
    """config.json's layer_types, checked (a list of WINDOW_KINDS), or None when absent."""
    types = r.raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError(f"layer_types must be a list of strings, got {types!r}")
        bad = sorted(set(types) - set(WINDOW_KINDS))
        if bad:
            raise ConfigError(f"layer_types entries {bad} are not supported; supported: {', '.join(WINDOW_KINDS)}")
    return types


def window_keys(r):
    """Type-check the window keys wherever they are set -> (use_sliding_window, the window when
    in use (transformers' default 4096) or None, layer_types or None)."""
    use = r.flag("use_sliding_window", default=False)
    window = r.raw.get("sliding_window", 4096)
    if window is not None and not _is_count(window):
        raise ConfigError(f"sliding_window must be a non-negative integer or null, got {window!r}")
    types = layer_type_list(r)
    mwl = r.raw.get("max_window_layers")
    if mwl is not None and not _is_count(mwl):
        raise ConfigError(f"max_window_layers must be a non-negative integer, got {mwl!r}")
    return use, window if use else None, types


def qwen_windows(r, n_layers: int):
    """transformers' Qwen2/Qwen3 rule: layer_types wins; otherwise layer i is windowed iff
    use_sliding_window and sliding_window are set and i >= max_window_layers (the first
    max_window_layers layers are full)."""
    use, window, types = window_keys(r)
    if types is not None:
        windows = [window if (t == "sliding_attention" and window) else 0 for t in types]
        if not use:
            return windows, "layer_types from config.json; use_sliding_window=false → every layer full"
        return windows, f"layer_types from config.json (w={window})"
    if not window:
        return [0] * n_layers, "use_sliding_window=false → every layer full"
    mwl = r.raw.get("max_window_layers", 28)
    if mwl is None:  # read only here: windows on and no layer_types
        raise ConfigError("max_window_layers must be a non-negative integer when use_sliding_window is true, "
                          "got None")
    windows = [window if i >= mwl else 0 for i in range(n_layers)]
    return windows, (
        f"use_sliding_window=true, max_window_layers={mwl} → layers {mwl}–{n_layers - 1} windowed (w={window})"
        if mwl < n_layers
        else f"use_sliding_window=true, max_window_layers={mwl} ≥ layers → every layer full"
    )


QWEN2 = Family(
    model_type="qwen2",
    architectures=("Qwen2ForCausalLM",),
    gguf_arch="qwen2",
    defaults={**COMMON_DEFAULTS, "vocab_size": 151936, "max_position_embeddings": 32768},
    windows=qwen_windows,
    qkv_bias=lambda raw: True,
    o_bias=lambda raw: False,
)
