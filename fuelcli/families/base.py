"""What a family adapter is. No forward code lives in a family: the decoder (reference and every
backend) is shared and interprets the per-layer blocks (model/block.py) that model/config.py builds from the
family's answers; an adapter answers only what differs, and declares its tensors (schema.py).

Hooks get the config reader `r` of model/config.py (r.raw is the config.json dict; r.integer / r.flag /
r.get / r.number read a key with the family defaults, type-check it and note its origin), so a
family reads and checks its own keys and model/config.py never names a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..errors import ConfigError
from .schema import DECODER, Schema


class FfnPlan(NamedTuple):
    moe_layers: tuple  # per layer: True = sparse MoE FFN
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_intermediate_size: int = 0  # a shared expert's width beside the experts (0: none)
    # the MoE's router and experts beyond the default (block.Ffn's fields of the same names)
    router: str = "softmax"
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.702


def dense_ffn(r, n_layers: int) -> FfnPlan:
    return FfnPlan((False,) * n_layers)


def no_windows(r, n_layers: int):
    return [0] * n_layers, "no sliding window in this family"


def no_linear_layers(r, n_layers: int):
    return [None] * n_layers


def whole_head_rotary(r, head_dim: int) -> int:
    return 0


def same_layers(r, blocks: tuple) -> tuple:
    return blocks


def no_model_fields(r) -> dict:
    return {}


def unwrapped(raw: dict) -> dict:
    return raw


def nested_text_config(raw: dict) -> dict:
    """A vision-language wrapper's config.json -> its decoder's: the keys of its text_config, with the
    top-level tie_word_embeddings (what transformers ties the wrapper's head by), bos and eos ids
    where text_config lacks them."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"model_type {raw.get('model_type')!r} needs a text_config object, got {text!r}")
    top, own = raw.get("tie_word_embeddings"), text.get("tie_word_embeddings")
    if top is not None and own is not None and top != own:
        raise ConfigError(f"tie_word_embeddings is {top} but text_config.tie_word_embeddings is {own}: which is meant?")
    merged = dict(text)
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if merged.get(key) is None and raw.get(key) is not None:
            merged[key] = raw[key]
    return merged


def attention_bias(raw: dict) -> bool:
    return bool(raw.get("attention_bias", False))


def one_rope(r, windows, rope_for):
    """Every layer rotates with the RoPE of its attention kind (the same one unless the config's
    rope_parameters are given per layer type)."""
    ropes = [rope_for("sliding_attention" if w else "full_attention") for w in windows]
    return ropes, None


def default_scale(r, head_dim: int):
    return None


@dataclass(frozen=True)
class Family:
    model_type: str
    architectures: tuple
    gguf_arch: str  # GGUF `general.architecture`
    # transformers' defaults for the keys this family reads (the dataclass defaults of its config class)
    defaults: dict
    # (reader, n_layers) -> (per-layer window or 0, the rule in words)
    windows: Callable = no_windows
    # (reader, n_layers) -> FfnPlan
    ffn: Callable = dense_ffn
    qkv_bias: Callable = attention_bias
    o_bias: Callable = attention_bias
    qk_norm: bool = False
    output_gate: bool = False  # Attention.output_gate on every attention layer
    sinks: bool = False  # Attention.sinks on every attention layer
    # (reader, head_dim) -> the leading dimensions RoPE rotates (0: the whole head)
    rotary_dim: Callable = whole_head_rotary
    # (reader, n_layers) -> per layer a block.LinearAttention, or None for an attention layer
    mixers: Callable = no_linear_layers
    # (reader, windows, rope_for) -> (per-layer RopeConfig or None for no RoPE, the rule in words or
    # None when every layer has the same); rope_for(layer_type) reads the config's RoPE for
    # "full_attention" or "sliding_attention" layers
    ropes: Callable = one_rope
    # (reader, head_dim) -> what q·k is multiplied by, None for 1 / sqrt(head_dim)
    attention_scale: Callable = default_scale
    activation_key: str = "hidden_act"  # the config key naming the FFN's gate activation
    sandwich: bool = False  # Block.sandwich on every layer
    norm_offset: float = 0.0  # norm weights are applied as norm_offset + w
    # (reader, hidden_size) -> what the embedding rows are multiplied by
    embed_scale: Callable = lambda r, hidden: 1.0
    softcap_key: str | None = None  # the config key of a final logit softcap (null: none)
    # a layer's tensors: roles, names in each file kind, shapes, transforms (schema.py)
    weights: Schema = DECODER
    # boolean keys naming a feature fuel lacks: true is a ConfigError naming the key
    unsupported_flags: tuple = ()
    # keys whose value, when not null, is a feature fuel lacks
    unsupported_keys: tuple = ()
    # GGUF: "{arch}." key suffixes this family reads beyond model/config.py's common ones -> config key
    gguf_keys: dict = field(default_factory=dict)
    # config.json keys a GGUF file of this arch implies but does not store (llama.cpp's own choices)
    gguf_defaults: dict = field(default_factory=dict)
    # (metadata, config dict) -> None: what else of a GGUF file's metadata this family translates
    gguf_config: Callable | None = None
    # GGUF key suffixes that may hold one value per layer: passed on as lists, for gguf_config
    gguf_per_layer: tuple = ()
    # (the file's tensor names, config dict) -> None: what a family reads from which tensors exist
    gguf_tensors_config: Callable | None = None
    # convert_hf_to_gguf permutes q/k rows for ggml's adjacent-pair RoPE in this arch: undo on load
    gguf_permuted_qk: bool = False
    # (raw config) -> the dict the other hooks read: a multimodal wrapper's text_config
    text_config: Callable = unwrapped
    # (reader, blocks) -> blocks: per-layer properties the common hooks do not set (model/config.py
    # builds the blocks first, then the family adjusts them)
    layers: Callable = same_layers
    # (reader) -> {ModelConfig field: value} for the fields no common hook sets
    model_fields: Callable = no_model_fields
    # the chat template for files that carry none (llama.cpp falls back to its own per model)
    chat_template: str | None = None


COMMON_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0, "hidden_act": "silu"}
