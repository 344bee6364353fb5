"""gpt-oss (gpt_oss): attention with q/k/v/o biases and a learned sink logit per head in each
softmax's denominator, windowed (sliding_window, 128) and full layers alternating (`layer_types`,
else every even layer windowed), one YaRN RoPE; a MoE on every layer whose router has a bias and
takes the softmax over its top-k logits only, and whose experts have biases and a clamped SwiGLU:
g = min(gate, limit), u = clip(up, -limit, limit), (u + 1) · g · sigmoid(alpha · g) (swiglu_limit 7,
swiglu_alpha 1.702). Norms multiply by w.

HF files as transformers 5 writes them: `mlp.experts.gate_up_proj` [E, H, 2I] (x @ W) whose columns
alternate gate and up, `gate_up_proj_bias` [E, 2I] alike, `down_proj` [E, I, H], `down_proj_bias`
[E, H]. The hub's own files keep the experts in MXFP4 blocks (`quantization_config`): refused here.

GGUF (arch gpt-oss, as llama.cpp's converter writes it): gate and up apart (ffn_gate_exps,
ffn_up_exps, [E, I, H], MXFP4 in users' files) with their biases, the router's bias as
ffn_gate_inp.bias, the sinks as attn_sinks, post_attention_layernorm as post_attention_norm; no key
says the layer types (llama.cpp: every even layer windowed), the SwiGLU's limit and alpha (llama.cpp:
7 and 1.702) or YaRN's `truncate`: false here, the model's own (OpenAI's reference, transformers,
vLLM), where ggml's YaRN always rounds the ramp's bounds.
"""

import math
from dataclasses import replace

from ..errors import ConfigError
from ..model.rope import RopeConfig
from .base import COMMON_DEFAULTS, Family, FfnPlan, one_rope
from .qwen2 import layer_type_list
from .schema import DECODER, Fused

_M = "model.layers.{i}.mlp"

# transformers' GptOssConfig when config.json names no RoPE
DEFAULT_YARN = dict(type="yarn", factor=32.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0,
                    truncate=False)


def alternating_windows(r, n_layers: int):
    window = r.integer("sliding_window")
    types = layer_type_list(r)
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
        rule = "every even layer windowed (transformers' default)"
    else:
        rule = "layer_types from config.json"
    windows = [window if t == "sliding_attention" else 0 for t in types]
    return windows, f"{rule}: windowed layers w={window}" if any(windows) else f"{rule}: every layer full"


def yarn_unless_told(r, windows, rope_for):
    """The config's RoPE per layer type, else (no RoPE key at all) transformers' default YaRN."""
    if r.raw.get("rope_parameters") is not None or r.raw.get("rope_scaling") is not None:
        return one_rope(r, windows, rope_for)
    r.origin["rope_scaling"] = "default"
    mscale = 0.1 * math.log(DEFAULT_YARN["factor"]) + 1.0  # transformers' attention factor for it
    return [RopeConfig(theta=r.number("rope_theta"), attention_factor=mscale, **DEFAULT_YARN)] * len(windows), None


def experts_every_layer(r, n_layers: int) -> FfnPlan:
    if r.raw.get("num_local_experts") is None and r.raw.get("num_experts") is not None:
        experts = r.integer("num_experts")
    else:
        experts = r.integer("num_local_experts", "num_experts")
    k = r.integer("num_experts_per_tok", "experts_per_tok")
    if not 0 < k <= experts:
        raise ConfigError(f"num_experts_per_tok={k} must be in 1..num_local_experts={experts}")
    limit, alpha = r.number("swiglu_limit"), r.number("swiglu_alpha")
    if limit <= 0:
        raise ConfigError(f"swiglu_limit must be > 0, got {limit!r}")
    r.origin["moe_layers"] = "derived"
    width = r.integer("intermediate_size", "moe_intermediate_size")  # every expert's; no dense layers
    return FfnPlan((True,) * n_layers, experts, k, width, router="topk_softmax", router_bias=True, expert_bias=True,
                   swiglu_limit=limit, swiglu_alpha=alpha)


def gguf_config(meta: dict, d: dict):
    scaling = d.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type") == "yarn":
        d["rope_scaling"] = {**scaling, "truncate": False}


def attention_bias(raw: dict) -> bool:
    return bool(raw.get("attention_bias", True))


def _every_expert_row(c) -> int:  # gate and up alternate row by row: one of each per intermediate row
    return c.moe_intermediate_size


WEIGHTS = (replace(DECODER, fused=())  # gate_up_proj is interleaved and transposed here, not Qwen3-MoE's
           .renamed(hf={"router": f"{_M}.router.weight", "router_bias": f"{_M}.router.bias",
                        "down_exps": f"{_M}.experts.down_proj", "down_exps_bias": f"{_M}.experts.down_proj_bias"},
                    gguf={"ffn_norm": "blk.{i}.post_attention_norm.weight"})
           .with_weight("down_exps", hf_transposed=True)
           .with_fused(Fused(("gate_exps", "up_exps"), hf=f"{_M}.experts.gate_up_proj", interleaved=_every_expert_row,
                             hf_transposed=True),
                       Fused(("gate_exps_bias", "up_exps_bias"), hf=f"{_M}.experts.gate_up_proj_bias",
                             interleaved=_every_expert_row)))

GPT_OSS = Family(
    model_type="gpt_oss",
    architectures=("GptOssForCausalLM",),
    gguf_arch="gpt-oss",
    defaults={**COMMON_DEFAULTS, "vocab_size": 201088, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 150000.0, "head_dim": 64, "sliding_window": 128, "num_local_experts": 128,
              "num_experts_per_tok": 4, "swiglu_limit": 7.0, "swiglu_alpha": 1.702},
    windows=alternating_windows,
    ffn=experts_every_layer,
    qkv_bias=attention_bias,
    o_bias=attention_bias,
    sinks=True,
    ropes=yarn_unless_told,
    weights=WEIGHTS,
    unsupported_keys=("quantization_config",),
    gguf_keys={"attention.sliding_window": "sliding_window"},
    gguf_config=gguf_config,
)
