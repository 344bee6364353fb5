"""Qwen3.5 / 3.6 (qwen3_5_text, qwen3_5_moe_text): hybrid layers, three of four a gated DeltaNet
(linear attention, block.LinearAttention) and every fourth softmax attention whose q_proj also emits
a gate per head (output * sigmoid(gate)), with QK-norm and RoPE over the first partial_rotary_factor
of each head (mRoPE's text positions are plain positions). Norms apply as 1 + w, except the linear
layer's gated norm, which multiplies by w. The MoE sizes run a MoE on every layer, softmax top-k
always renormalised, plus a shared expert scaled by sigmoid(shared_expert_gate).

`layer_types` names each layer; without it every full_attention_interval-th layer (4) is full.
"""

from ..errors import ConfigError
from ..model.block import LinearAttention
from .base import COMMON_DEFAULTS, Family, FfnPlan
from .schema import DECODER, Fused

KINDS = ("linear_attention", "full_attention")


def layer_kinds(r, n_layers: int) -> list:
    types = r.raw.get("layer_types")
    if types is None:
        interval = r.integer("full_attention_interval")
        if interval < 1:
            raise ConfigError(f"full_attention_interval must be >= 1, got {interval}")
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ConfigError(f"layer_types must be a list of strings, got {types!r}")
    bad = sorted(set(types) - set(KINDS))
    if bad:
        raise ConfigError(f"layer_types entries {bad} are not supported here; supported: {', '.join(KINDS)}")
    if len(types) != n_layers:
        raise ConfigError(f"layer_types has {len(types)} entries but num_hidden_layers={n_layers}")
    return types


def no_windows(r, n_layers: int):
    return [0] * n_layers, "no sliding window (linear-attention layers instead)"


def linear_mixers(r, n_layers: int):
    spec = LinearAttention(k_heads=r.integer("linear_num_key_heads"), v_heads=r.integer("linear_num_value_heads"),
                           k_head_dim=r.integer("linear_key_head_dim"), v_head_dim=r.integer("linear_value_head_dim"),
                           conv_kernel=r.integer("linear_conv_kernel_dim"))
    if min(spec.k_heads, spec.v_heads, spec.k_head_dim, spec.v_head_dim, spec.conv_kernel) < 1:
        raise ConfigError(f"the linear-attention sizes must be > 0, got {spec}")
    if spec.v_heads % spec.k_heads:
        raise ConfigError(f"linear_num_value_heads={spec.v_heads} is not a multiple of "
                          f"linear_num_key_heads={spec.k_heads}")
    r.origin["linear_layers"] = "derived"
    return [spec if kind == "linear_attention" else None for kind in layer_kinds(r, n_layers)]


def partial_rotary(r, head_dim: int) -> int:
    params = r.raw.get("rope_parameters") if isinstance(r.raw.get("rope_parameters"), dict) else {}
    factor = params.get("partial_rotary_factor", r.raw.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {factor!r}")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise ConfigError(f"partial_rotary_factor={factor} leaves {dim} rotated dimensions of head_dim {head_dim}; "
                          "RoPE needs an even number")
    return 0 if dim == head_dim else dim


def moe_every_layer(r, n_layers: int) -> FfnPlan:
    experts, k = r.integer("num_experts"), r.integer("num_experts_per_tok")
    if not 0 < k <= experts:
        raise ConfigError(f"num_experts_per_tok={k} must be in 1..num_experts={experts}")
    r.origin["moe_layers"] = "derived"
    return FfnPlan((True,) * n_layers, experts, k, r.integer("moe_intermediate_size"), True,
                   r.integer("shared_expert_intermediate_size"))


# q_proj holds each head's q rows, then its gate rows
WEIGHTS = DECODER.with_fused(Fused(("q", "q_gate"), hf="model.layers.{i}.self_attn.q_proj.weight",
                                   interleaved=lambda c: c.num_heads))

_DEFAULTS = {**COMMON_DEFAULTS, "vocab_size": 248320, "max_position_embeddings": 32768, "head_dim": 256,
             "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4}

QWEN3_5 = Family(
    model_type="qwen3_5_text",
    architectures=("Qwen3_5ForCausalLM",),
    gguf_arch=None,
    defaults=_DEFAULTS,
    windows=no_windows,
    qk_norm=True,
    output_gate=True,
    rotary_dim=partial_rotary,
    mixers=linear_mixers,
    norm_offset=1.0,
    weights=WEIGHTS,
)

QWEN3_5_MOE = Family(
    model_type="qwen3_5_moe_text",
    architectures=("Qwen3_5MoeForCausalLM",),
    gguf_arch=None,
    defaults={**_DEFAULTS, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512},
    windows=no_windows,
    ffn=moe_every_layer,
    qk_norm=True,
    output_gate=True,
    rotary_dim=partial_rotary,
    mixers=linear_mixers,
    norm_offset=1.0,
    weights=WEIGHTS,
)
