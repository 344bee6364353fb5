"""Mixtral: Mistral's attention and a sparse FFN on every layer: softmax over all experts in f32,
the top num_experts_per_tok, always renormalised to sum 1; each expert a SwiGLU of
intermediate_size. Hub files store experts as block_sparse_moe.experts.{e}.w1 (gate), w3 (up),
w2 (down). GGUF: arch llama with expert tensors (the Llama family sends such files here)."""

from .base import COMMON_DEFAULTS, Family, FfnPlan
from .mistral import every_layer_window
from .schema import DECODER

_P = "model.layers.{i}.block_sparse_moe"


def mixtral_ffn(r, n_layers: int) -> FfnPlan:
    if r.raw.get("num_local_experts") is None and r.raw.get("num_experts") is not None:
        experts = r.integer("num_experts")  # a GGUF file's expert_count
    else:
        experts = r.integer("num_local_experts", "num_experts")
    k = r.integer("num_experts_per_tok", "experts_per_tok")
    if not 0 < k <= experts:
        from ..errors import ConfigError

        raise ConfigError(f"num_experts_per_tok={k} must be between 1 and num_local_experts={experts}")
    r.origin["moe_layers"] = "derived"
    return FfnPlan((True,) * n_layers, experts, k, r.integer("intermediate_size", "moe_intermediate_size"), True)


MIXTRAL = Family(
    model_type="mixtral",
    architectures=("MixtralForCausalLM",),
    gguf_arch=None,
    defaults={**COMMON_DEFAULTS, "vocab_size": 32000, "max_position_embeddings": 4096 * 32, "sliding_window": None,
              "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2,
              "bos_token_id": 1, "eos_token_id": 2},
    windows=every_layer_window,
    ffn=mixtral_ffn,
    weights=DECODER.renamed(hf={"router": f"{_P}.gate.weight", "gate_exps": f"{_P}.experts.{{e}}.w1.weight",
                                "up_exps": f"{_P}.experts.{{e}}.w3.weight",
                                "down_exps": f"{_P}.experts.{{e}}.w2.weight"}),
    gguf_permuted_qk=True,
)
