"""Qwen3-MoE: Qwen3 attention, and a sparse FFN on some layers.

Router: softmax in f32 over all experts, top `num_experts_per_tok`, divided by their sum only if
`norm_topk_prob`; no shared expert. Layer i is MoE iff i not in mlp_only_layers, num_experts > 0 and
(i + 1) % decoder_sparse_step == 0; otherwise a dense MLP of intermediate_size. transformers applies
one global mask: every layer windowed when use_sliding_window is on.
"""

from ..errors import ConfigError
from .base import COMMON_DEFAULTS, Family, FfnPlan
from .qwen2 import window_keys


def all_layers_window(r, n_layers: int):
    _, window, _ = window_keys(r)
    if not window:
        return [0] * n_layers, "use_sliding_window=false → every layer full"
    return [window] * n_layers, f"use_sliding_window=true → every layer windowed (w={window})"


def moe_ffn(r, n_layers: int) -> FfnPlan:
    if r.raw.get("num_experts") is None and r.raw.get("num_local_experts") is not None:
        experts = r.integer("num_local_experts", "num_experts")  # the name transformers 5 writes
    else:
        experts = r.integer("num_experts")
    k = r.integer("num_experts_per_tok", "experts_per_tok")
    moe_inter = r.integer("moe_intermediate_size")
    norm_topk = r.flag("norm_topk_prob")
    step = r.integer("decoder_sparse_step")
    mlp_only = set(r.int_list("mlp_only_layers"))
    if k > experts:
        raise ConfigError(f"num_experts_per_tok={k} > num_experts={experts}")
    if experts and (k == 0 or step == 0):
        raise ConfigError(f"num_experts_per_tok={k} and decoder_sparse_step={step} must be > 0")
    layers = tuple(experts > 0 and i not in mlp_only and (i + 1) % step == 0 for i in range(n_layers))
    r.origin["moe_layers"] = "derived"
    return FfnPlan(layers, experts, k, moe_inter, norm_topk)


QWEN3_MOE = Family(
    model_type="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    gguf_arch="qwen3moe",
    defaults={
        **COMMON_DEFAULTS,
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
    ffn=moe_ffn,
    qk_norm=True,
    # llama.cpp's qwen3moe always renormalises the top-k weights (transformers' GGUF loader too)
    gguf_defaults={"norm_topk_prob": True},
)
