"""HF checkpoint names -> ModelWeights. One table for all four families; Qwen3-MoE adds the
router and experts, stored per expert (hub files) or fused (files written by transformers 5)."""

from pathlib import Path

from ..config import ModelConfig
from .build import Lookup, ModelWeights, Names, build_weights, expert_views, row_slice
from .safetensors import read_checkpoint


HF_NAMES = Names(
    embed="model.embed_tokens", output="lm_head", final_norm="model.norm",
    attn_norm="model.layers.{i}.input_layernorm", q="model.layers.{i}.self_attn.q_proj",
    k="model.layers.{i}.self_attn.k_proj", v="model.layers.{i}.self_attn.v_proj",
    o="model.layers.{i}.self_attn.o_proj", q_norm="model.layers.{i}.self_attn.q_norm",
    k_norm="model.layers.{i}.self_attn.k_norm", ffn_norm="model.layers.{i}.post_attention_layernorm",
    gate="model.layers.{i}.mlp.gate_proj", up="model.layers.{i}.mlp.up_proj", down="model.layers.{i}.mlp.down_proj",
    layer_prefix="model.layers.", layer_count_key="num_hidden_layers",
    ignorable=("rotary_emb.inv_freq",),  # RoPE buffers in older Llama checkpoints: fuel derives its own
)


def _experts(w: Lookup, cfg: ModelConfig, i: int):
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    p = f"model.layers.{i}.mlp"
    router = w.matrix(f"{p}.gate.weight", (E, H))
    if w.has(f"{p}.experts.gate_up_proj"):
        fused = w.matrix(f"{p}.experts.gate_up_proj", (E, 2 * I, H))
        return (router, expert_views(row_slice(fused, 0, I)), expert_views(row_slice(fused, I, 2 * I)),
                expert_views(w.matrix(f"{p}.experts.down_proj", (E, H, I))))
    return (router,
            [w.matrix(f"{p}.experts.{e}.gate_proj.weight", (I, H)) for e in range(E)],
            [w.matrix(f"{p}.experts.{e}.up_proj.weight", (I, H)) for e in range(E)],
            [w.matrix(f"{p}.experts.{e}.down_proj.weight", (H, I)) for e in range(E)])


def load_hf_weights(model_dir: Path, cfg: ModelConfig) -> ModelWeights:
    w = Lookup(read_checkpoint(model_dir), str(model_dir))
    return build_weights(w, HF_NAMES, cfg, lambda i: _experts(w, cfg, i))
