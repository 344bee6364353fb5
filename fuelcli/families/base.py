"""What a family adapter is. No forward code lives in a family: the decoder (reference and every
backend) is shared and reads the resolved ModelConfig; an adapter answers only what differs.

Hooks get the config reader `r` of config.py (r.raw is the config.json dict; r.integer / r.flag /
r.get read a key with the family defaults, type-check it and note its origin), so a family reads and
checks its own keys and config.py never names a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple


class FfnPlan(NamedTuple):
    moe_layers: tuple  # per layer: True = sparse MoE FFN
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False


def dense_ffn(r, n_layers: int) -> FfnPlan:
    return FfnPlan((False,) * n_layers)


def no_windows(r, n_layers: int):
    return [0] * n_layers, "no sliding window in this family"


def attention_bias(raw: dict) -> bool:
    return bool(raw.get("attention_bias", False))


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
    # boolean keys naming a feature fuel lacks: true is a ConfigError naming the key
    unsupported_flags: tuple = ()
    # config.json keys a GGUF file of this arch implies but does not store (llama.cpp's own choices)
    gguf_defaults: dict = field(default_factory=dict)
    # convert_hf_to_gguf permutes q/k rows for ggml's adjacent-pair RoPE in this arch: undo on load
    gguf_permuted_qk: bool = False


COMMON_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0}
