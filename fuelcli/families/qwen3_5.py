"""Qwen3.5 / 3.6 (qwen3_5_text, qwen3_5_moe_text): hybrid layers, three of four a gated DeltaNet
(linear attention, block.LinearAttention) and every fourth softmax attention whose q_proj also emits
a gate per head (output * sigmoid(gate)), with QK-norm and RoPE over the first partial_rotary_factor
of each head (mRoPE's text positions are plain positions). Norms apply as 1 + w, except the linear
layer's gated norm, which multiplies by w. The MoE sizes run a MoE on every layer, softmax top-k
always renormalised, plus a shared expert scaled by sigmoid(shared_expert_gate).

`layer_types` names each layer; without it every full_attention_interval-th layer (4) is full.

The hub's checkpoints are the vision-language wrappers (qwen3_5, qwen3_5_moe): the decoder's keys in
text_config, its tensors under model.language_model.; the vision tower (model.visual.) and the
multi-token-prediction head (mtp.) are accepted and not run.

GGUF (arch qwen35, qwen35moe, as llama.cpp's converter writes them): the linear layer's sizes in the
ssm.* keys (conv_kernel, state_size = key head dim, group_count = key heads, time_step_rank = value
heads, inner_size = value dim), the layer kinds in attention.recurrent_layers, the rotated dimensions
in rope.dimension_count (rope.dimension_sections is mRoPE's split, moot for text positions); the MTP
head as extra layers (nextn_predict_layers). Stored differently, undone on load: norms as 1 + w
(not the linear layer's gated norm), A_log as A = -exp(A_log), and where key heads are fewer than
value heads the value heads tiled (kh + k_heads * i) instead of grouped by key head (kh * r + i),
in in_proj_qkv's and conv1d's V rows, in_proj_z's rows, in_proj_a/b's rows, A and dt_bias, and
out_proj's columns. q_proj keeps its per-head q|gate rows. out_proj's columns move as whole blocks
where the format's block divides the value head dim (the float formats, 32-element blocks); in a
K-quant file (256-element blocks) out_proj is widened to f32 on load.
"""

from dataclasses import replace

import numpy as np

from ..errors import ConfigError
from ..model.block import LinearAttention
from .base import COMMON_DEFAULTS, Family, FfnPlan, nested_text_config
from .schema import DECODER, Elementwise, Fused, Regroup

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


def gguf_config(meta: dict, d: dict):
    """What llama.cpp's qwen35, qwen35moe and qwen3next keys say beyond gguf_keys."""
    arch = meta["general.architecture"]
    inner, heads = meta.get(f"{arch}.ssm.inner_size"), d.get("linear_num_value_heads")
    if inner is not None:
        if not isinstance(inner, int) or isinstance(inner, bool) or not isinstance(heads, int) or not heads \
                or inner % heads:
            raise ConfigError(f"{arch}.ssm.inner_size={inner!r} is not a multiple of {arch}.ssm.time_step_rank="
                              f"{heads!r} (the value heads)")
        d["linear_value_head_dim"] = inner // heads
    recurrent = meta.get(f"{arch}.attention.recurrent_layers")
    if recurrent is not None:
        if not isinstance(recurrent, list) or not all(isinstance(x, bool) for x in recurrent):
            raise ConfigError(f"{arch}.attention.recurrent_layers must be an array of booleans")
        # the MTP layers llama.cpp appends are not the model's (config_from_gguf took them off)
        d["layer_types"] = ["linear_attention" if x else "full_attention"
                            for x in recurrent[:d.get("num_hidden_layers", len(recurrent))]]
    rotated, head_dim = meta.get(f"{arch}.rope.dimension_count"), d.get("head_dim")
    if rotated is not None and isinstance(head_dim, int) and head_dim:
        d["partial_rotary_factor"] = rotated / head_dim


def _grouped(c) -> list:
    """The value heads grouped by key head (HF: kh * r + i) from llama.cpp's tiled order (kh + k_heads * i)."""
    k, r = c.linear.k_heads, c.linear.v_heads // c.linear.k_heads
    return [(u % r) * k + u // r for u in range(c.linear.v_heads)]


def _v_head_dim(c):
    return c.linear.v_head_dim


_PER_HEAD = Regroup(unit=lambda c: 1, order=_grouped)
_V_ROWS = Regroup(unit=_v_head_dim, order=_grouped)
_V_ROWS_AFTER_QK = Regroup(unit=_v_head_dim, order=_grouped, start=lambda c: 2 * c.linear.key_dim)
_V_COLUMNS = Regroup(unit=_v_head_dim, order=_grouped, axis=1)
A_LOG = Elementwise(lambda a: np.log(-a), "A = -exp(A_log)")
# q_proj holds each head's q rows, then its gate rows
Q_GATE = Fused(("q", "q_gate"), hf="model.layers.{i}.self_attn.q_proj.weight", gguf="blk.{i}.attn_q.weight",
               interleaved=lambda c: c.num_heads)
# llama.cpp's names of the roles Qwen3.5 and Qwen3-Next share
GGUF_NAMES = {"ffn_norm": "blk.{i}.post_attention_norm.weight", "lin_qkv": "blk.{i}.attn_qkv.weight",
              "lin_z": "blk.{i}.attn_gate.weight", "lin_conv": "blk.{i}.ssm_conv1d.weight",
              "lin_dt_bias": "blk.{i}.ssm_dt.bias", "lin_a_log": "blk.{i}.ssm_a", "lin_norm": "blk.{i}.ssm_norm.weight",
              "lin_out": "blk.{i}.ssm_out.weight", "shared_gate": "blk.{i}.ffn_gate_shexp.weight",
              "shared_up": "blk.{i}.ffn_up_shexp.weight", "shared_down": "blk.{i}.ffn_down_shexp.weight",
              "shared_expert_gate": "blk.{i}.ffn_gate_inp_shexp.weight"}
MTP = (("mtp.", "the multi-token-prediction head"),)

WEIGHTS = replace(
    DECODER.with_fused(Q_GATE)
    .renamed(gguf={"lin_b": "blk.{i}.ssm_beta.weight", "lin_a": "blk.{i}.ssm_alpha.weight", **GGUF_NAMES})
    .undoing("gguf", {"lin_qkv": (_V_ROWS_AFTER_QK,), "lin_conv": (_V_ROWS_AFTER_QK,), "lin_z": (_V_ROWS,),
                      "lin_a": (_PER_HEAD,), "lin_b": (_PER_HEAD,), "lin_dt_bias": (_PER_HEAD,),
                      "lin_a_log": (_PER_HEAD, A_LOG), "lin_out": (_V_COLUMNS,)}),
    gguf_norm_shift=1.0,
    not_run=MTP,
)
_WRAPPED = WEIGHTS.nested("model.language_model.", (("model.visual.", "the vision tower"),))

GGUF_KEYS = {"ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
             "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads",
             "full_attention_interval": "full_attention_interval",
             "expert_shared_feed_forward_length": "shared_expert_intermediate_size"}

_DEFAULTS = {**COMMON_DEFAULTS, "vocab_size": 248320, "max_position_embeddings": 32768, "head_dim": 256,
             "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4}

QWEN3_5 = Family(
    model_type="qwen3_5_text",
    architectures=("Qwen3_5ForCausalLM",),
    gguf_arch="qwen35",
    defaults=_DEFAULTS,
    windows=no_windows,
    qk_norm=True,
    output_gate=True,
    rotary_dim=partial_rotary,
    mixers=linear_mixers,
    norm_offset=1.0,
    weights=WEIGHTS,
    gguf_keys=GGUF_KEYS,
    gguf_config=gguf_config,
)

QWEN3_5_MOE = replace(
    QWEN3_5,
    model_type="qwen3_5_moe_text",
    architectures=("Qwen3_5MoeForCausalLM",),
    gguf_arch="qwen35moe",
    defaults={**_DEFAULTS, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512},
    ffn=moe_every_layer,
)

# the hub's vision-language wrappers: the same decoder, read from text_config and model.language_model.
QWEN3_5_VL = replace(QWEN3_5, model_type="qwen3_5", architectures=("Qwen3_5ForConditionalGeneration",),
                     gguf_arch=None, text_config=nested_text_config, weights=_WRAPPED)
QWEN3_5_MOE_VL = replace(QWEN3_5_MOE, model_type="qwen3_5_moe", architectures=("Qwen3_5MoeForConditionalGeneration",),
                         gguf_arch=None, text_config=nested_text_config, weights=_WRAPPED)
