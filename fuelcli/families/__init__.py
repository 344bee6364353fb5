"""One small adapter per model_type: which config keys it reads, its defaults and quirks.

No forward code lives here: the decoder (reference and engine) is shared and reads the resolved
ModelConfig. An adapter answers only what differs between families.
"""

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Family:
    model_type: str
    architectures: tuple
    # transformers' defaults for the keys this family reads (the dataclass defaults of its config class)
    defaults: dict
    # (raw config, n_layers) -> (per-layer window or 0, the rule in words)
    windows: Callable
    # the raw keys `windows` reads; config.py type-checks them before calling it
    window_keys: tuple = ()
    # boolean keys naming a feature fuel lacks: true is a ConfigError naming the key
    unsupported_flags: tuple = ()
    qkv_bias: Callable = lambda raw: bool(raw.get("attention_bias", False))
    o_bias: Callable = lambda raw: bool(raw.get("attention_bias", False))
    qk_norm: bool = False
    moe: bool = False
    # GGUF `general.architecture` name
    gguf_arch: str = ""
    notes: tuple = field(default_factory=tuple)


def no_windows(raw: dict, n_layers: int):
    return [0] * n_layers, "no sliding window in this family"


def qwen_windows(raw: dict, n_layers: int):
    """transformers' Qwen2/Qwen3 rule: layer_types wins; otherwise layer i is windowed iff
    use_sliding_window and sliding_window are set and i >= max_window_layers (the first
    max_window_layers layers are full)."""
    use = bool(raw.get("use_sliding_window", False))
    window = raw.get("sliding_window", 4096) if use else None
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        windows = [window if (t == "sliding_attention" and window) else 0 for t in layer_types]
        if not use:
            return windows, "layer_types from config.json; use_sliding_window=false → every layer full"
        return windows, f"layer_types from config.json (w={window})"
    if not window:
        return [0] * n_layers, "use_sliding_window=false → every layer full"
    mwl = int(raw.get("max_window_layers", 28))
    windows = [window if i >= mwl else 0 for i in range(n_layers)]
    return windows, (
        f"use_sliding_window=true, max_window_layers={mwl} → layers {mwl}–{n_layers - 1} windowed (w={window})"
        if mwl < n_layers
        else f"use_sliding_window=true, max_window_layers={mwl} ≥ layers → every layer full"
    )


def all_layers_window(raw: dict, n_layers: int):
    """Qwen3-MoE in transformers: one global mask, windowed for every layer when enabled."""
    window = raw.get("sliding_window", 4096) if raw.get("use_sliding_window", False) else None
    if not window:
        return [0] * n_layers, "use_sliding_window=false → every layer full"
    return [int(window)] * n_layers, f"use_sliding_window=true → every layer windowed (w={window})"


_QWEN_WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
_COMMON = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0}

LLAMA = Family(
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    defaults={**_COMMON, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    windows=no_windows,
    # transformers' Llama adds biases to gate/up/down when mlp_bias is true; the shared decoder has none
    unsupported_flags=("mlp_bias",),
    gguf_arch="llama",
)
QWEN2 = Family(
    model_type="qwen2",
    architectures=("Qwen2ForCausalLM",),
    defaults={**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768},
    windows=qwen_windows,
    window_keys=_QWEN_WINDOW_KEYS,
    qkv_bias=lambda raw: True,
    o_bias=lambda raw: False,
    gguf_arch="qwen2",
)
QWEN3 = Family(
    model_type="qwen3",
    architectures=("Qwen3ForCausalLM",),
    defaults={**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768, "head_dim": 128},
    windows=qwen_windows,
    window_keys=_QWEN_WINDOW_KEYS,
    qk_norm=True,
    gguf_arch="qwen3",
)
QWEN3_MOE = Family(
    model_type="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    defaults={
        **_COMMON,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    windows=all_layers_window,
    window_keys=("use_sliding_window", "sliding_window"),
    qk_norm=True,
    moe=True,
    gguf_arch="qwen3moe",
)

FAMILIES = {f.model_type: f for f in (LLAMA, QWEN2, QWEN3, QWEN3_MOE)}
BY_ARCHITECTURE = {a: f for f in FAMILIES.values() for a in f.architectures}
BY_GGUF_ARCH = {f.gguf_arch: f for f in FAMILIES.values()}
