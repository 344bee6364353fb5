"""SmolLM3: Llama's block with no RoPE on some layers (no_rope_layers: 1 = RoPE, 0 = none; by
default every no_rope_layer_interval-th layer, 4, has none), and windows only where layer_types say
sliding_attention and use_sliding_window is on (by default: the NoPE layers). GGUF arch smollm3
(llama.cpp: every 4th layer without RoPE; q/k permuted as Llama's)."""

from ..errors import ConfigError
from .base import COMMON_DEFAULTS, Family
from .qwen2 import layer_type_list, window_keys


def _rope_flags(r, n_layers: int) -> list:
    flags = r.raw.get("no_rope_layers")
    if flags is None:
        step = r.integer("no_rope_layer_interval")
        if step == 0:
            raise ConfigError("no_rope_layer_interval must be > 0")
        return [int((i + 1) % step != 0) for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) or isinstance(f, bool)
                                                                     for f in flags):
        raise ConfigError(f"no_rope_layers must be a list of {n_layers} zeros and ones, got {flags!r}")
    return flags


def smollm3_windows(r, n_layers: int):
    use, window, _ = window_keys(r)
    types = layer_type_list(r)
    if types is None:
        rope = _rope_flags(r, n_layers)
        types = ["sliding_attention" if use and window and not rope[i] else "full_attention" for i in range(n_layers)]
    windows = [window if use and window and t == "sliding_attention" else 0 for t in types]
    return windows, (f"sliding_attention layers windowed (w={window})" if any(windows)
                     else "use_sliding_window=false → every layer full")


def smollm3_ropes(r, windows, rope_for):
    flags = _rope_flags(r, len(windows))
    ropes = [rope_for("sliding_attention" if w else "full_attention") if flags[i] else None
             for i, w in enumerate(windows)]
    none = [i for i, f in enumerate(flags) if not f]
    return ropes, (f"no RoPE on layers {', '.join(map(str, none))} (no_rope_layers)" if none else None)


SMOLLM3 = Family(
    model_type="smollm3",
    architectures=("SmolLM3ForCausalLM",),
    gguf_arch="smollm3",
    defaults={**COMMON_DEFAULTS, "vocab_size": 128256, "max_position_embeddings": 32768, "rope_theta": 2_000_000.0,
              "tie_word_embeddings": True, "no_rope_layer_interval": 4, "bos_token_id": 128000,
              "eos_token_id": 128001},
    windows=smollm3_windows,
    ropes=smollm3_ropes,
    unsupported_flags=("mlp_bias",),
    gguf_permuted_qk=True,
)
