"""Gemma 3 (text): sandwich norms whose weights apply as 1 + w, GELU-tanh, QK-norm, local layers with
a sliding window and their own RoPE base beside global ones (5 : 1), a √hidden embedding scale,
q·k scaled by query_pre_attn_scalar^-0.5, tied embeddings, an optional final logit softcap.

Layer types: `layer_types`, else every `sliding_window_pattern`-th layer (6) is global. RoPE: per
layer type in transformers 5's rope_parameters; in hub files `rope_theta` + `rope_scaling` are the
global layers' and `rope_local_base_freq` the local ones'. GGUF (arch gemma3, as llama.cpp reads
it): norms stored as 1 + w; no sliding_window key means no local layers; freq_base_swa defaults to
10000; the 27B (62 layers) scales q·k by (hidden / heads)^-0.5, the others by head_dim^-0.5.
"""

from dataclasses import replace

from ..errors import ConfigError
from ..model.rope import RopeConfig
from .base import COMMON_DEFAULTS, Family
from .qwen2 import layer_type_list
from .schema import DECODER

_TEMPLATE = (  # the Gemma turn format: the system text opens the first user turn
    "{{ bos_token }}"
    "{%- set first = messages[0]['content'] + '\\n\\n' if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for m in (messages[1:] if first else messages) -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (first if loop.first else '') + m['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def gemma_windows(r, n_layers: int):
    window = r.integer("sliding_window")
    types = layer_type_list(r)
    if types is not None:
        rule = "layer_types from config.json"
    else:
        pattern = r.raw.get("sliding_window_pattern", r.raw.get("_sliding_window_pattern", 6))
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
            raise ConfigError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
        rule = f"every {pattern}th layer global (sliding_window_pattern={pattern})"
    windows = [window if t == "sliding_attention" else 0 for t in types]
    return windows, f"{rule}: local layers windowed (w={window})" if any(windows) else f"{rule}: every layer full"


def gemma_ropes(r, windows, rope_for):
    if isinstance(r.raw.get("rope_parameters"), dict) and any(
            isinstance(v, dict) for v in r.raw["rope_parameters"].values()):
        local, full = rope_for("sliding_attention"), rope_for("full_attention")
    else:
        theta = r.number("rope_local_base_freq")
        if theta <= 0:
            raise ConfigError(f"rope_local_base_freq must be > 0, got {theta!r}")
        local, full = RopeConfig(theta=theta), rope_for("full_attention")
    ropes = [local if w else full for w in windows]
    return ropes, f"local layers θ={local.theta:g}, global layers θ={full.theta:g}" + (
        "" if full.type == "default" else f" {full.type} ×{full.factor:g}")


def query_scale(r, head_dim: int):
    scalar = r.number("query_pre_attn_scalar")
    if scalar <= 0:
        raise ConfigError(f"query_pre_attn_scalar must be > 0, got {scalar!r}")
    return None if scalar == head_dim else scalar ** -0.5


def gguf_config(meta: dict, d: dict):
    """What llama.cpp reads of a gemma3 file beyond the common keys."""
    n = d.get("num_hidden_layers")
    if "sliding_window" not in d and isinstance(n, int):
        d["layer_types"] = ["full_attention"] * n
    pattern = meta.get("gemma3.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per layer: true = sliding
        d["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None:
        d["sliding_window_pattern"] = pattern
    heads, hidden = d.get("num_attention_heads"), d.get("hidden_size")
    if n == 62 and isinstance(heads, int) and heads and isinstance(hidden, int):
        d["query_pre_attn_scalar"] = hidden // heads
    elif isinstance(d.get("head_dim"), int):
        d["query_pre_attn_scalar"] = d["head_dim"]


_WEIGHTS = DECODER.renamed(
    hf={"post_attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
        "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm.weight",
        "post_ffn_norm": "model.layers.{i}.post_feedforward_layernorm.weight"},
    gguf={"post_attn_norm": "blk.{i}.post_attention_norm.weight", "post_ffn_norm": "blk.{i}.post_ffw_norm.weight"})

GEMMA3 = Family(
    model_type="gemma3_text",
    architectures=("Gemma3ForCausalLM",),
    gguf_arch="gemma3",
    defaults={**COMMON_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072, "head_dim": 256,
              "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 4096,
              "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
              "bos_token_id": 2, "eos_token_id": 1},
    windows=gemma_windows,
    qk_norm=True,
    ropes=gemma_ropes,
    attention_scale=query_scale,
    activation_key="hidden_activation",
    sandwich=True,
    norm_offset=1.0,
    embed_scale=lambda r, hidden: hidden ** 0.5,
    softcap_key="final_logit_softcapping",
    weights=replace(_WEIGHTS, gguf_norm_shift=1.0),  # its GGUF files store norms as 1 + w
    unsupported_flags=("use_bidirectional_attention",),
    unsupported_keys=("attn_logit_softcapping",),
    gguf_keys={"attention.sliding_window": "sliding_window", "rope.freq_base_swa": "rope_local_base_freq",
               "final_logit_softcapping": "final_logit_softcapping"},
    gguf_config=gguf_config,
    chat_template=_TEMPLATE,
)
