"""Phi-3 / Phi-4 (phi3): Llama's block with q|k|v in one stored matrix and gate|up in another (split
by rows at load, a view in any format), a sliding window on every layer when sliding_window is set
(as transformers; llama.cpp turns Phi's window off), and LongRoPE scaling (model/rope.py). Partial
rotary embeddings (Phi-4-mini's partial_rotary_factor 0.75) are refused. GGUF arch phi3 keeps
LongRoPE's factors as tensors and stores gate|up as ffn_up."""

from ..errors import ConfigError
from .base import COMMON_DEFAULTS, Family, one_rope
from .mistral import every_layer_window
from .schema import DECODER, Fused


def full_rotary_ropes(r, windows, rope_for):
    for where in (r.raw, r.raw.get("rope_parameters") or {}):
        factor = where.get("partial_rotary_factor") if isinstance(where, dict) else None
        if factor not in (None, 1, 1.0):
            raise ConfigError(f"partial_rotary_factor={factor!r} is not supported (fuel rotates every dimension)")
    return one_rope(r, windows, rope_for)


PHI3 = Family(
    model_type="phi3",
    architectures=("Phi3ForCausalLM",),
    gguf_arch="phi3",
    defaults={**COMMON_DEFAULTS, "vocab_size": 32064, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "sliding_window": None, "bos_token_id": 1, "eos_token_id": 32000},
    windows=every_layer_window,
    ropes=full_rotary_ropes,
    weights=DECODER.with_fused(
        Fused(("q", "k", "v"), hf="model.layers.{i}.self_attn.qkv_proj.weight", gguf="blk.{i}.attn_qkv.weight"),
        Fused(("gate", "up"), hf="model.layers.{i}.mlp.gate_up_proj.weight", gguf="blk.{i}.ffn_up.weight")),
    gguf_keys={"attention.sliding_window": "sliding_window"},
)
