"""HF checkpoint names -> ModelWeights. One table for all four families; Qwen3-MoE adds the
router and experts, stored per expert (hub files) or fused (files written by transformers 5)."""

from pathlib import Path

from ..config import ModelConfig
from .model import LayerWeights, Lookup, ModelWeights, expert_views, row_slice
from .safetensors import read_checkpoint


def _moe(w: Lookup, p: str, cfg: ModelConfig, layer: LayerWeights):
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    layer.router = w.matrix(f"{p}.mlp.gate.weight", (E, H))
    if w.has(f"{p}.mlp.experts.gate_up_proj"):
        fused = w.matrix(f"{p}.mlp.experts.gate_up_proj", (E, 2 * I, H))
        layer.gate_exps = expert_views(row_slice(fused, 0, I))
        layer.up_exps = expert_views(row_slice(fused, I, 2 * I))
        layer.down_exps = expert_views(w.matrix(f"{p}.mlp.experts.down_proj", (E, H, I)))
    else:
        x = f"{p}.mlp.experts"
        layer.gate_exps = [w.matrix(f"{x}.{e}.gate_proj.weight", (I, H)) for e in range(E)]
        layer.up_exps = [w.matrix(f"{x}.{e}.up_proj.weight", (I, H)) for e in range(E)]
        layer.down_exps = [w.matrix(f"{x}.{e}.down_proj.weight", (H, I)) for e in range(E)]


def load_hf_weights(model_dir: Path, cfg: ModelConfig) -> ModelWeights:
    w = Lookup(read_checkpoint(model_dir), model_dir.name)
    H, V, D = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    embed = w.matrix("model.embed_tokens.weight", (V, H))
    output = embed if cfg.tie_embeddings or not w.has("lm_head.weight") else w.matrix("lm_head.weight", (V, H))
    if output is embed and not cfg.tie_embeddings:
        w.matrix("lm_head.weight", (V, H))  # untied but absent: the error names it
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        layer = LayerWeights(
            attn_norm=w.vector(f"{p}.input_layernorm.weight", H),
            q=w.matrix(f"{a}.q_proj.weight", (cfg.q_dim, H)),
            k=w.matrix(f"{a}.k_proj.weight", (cfg.kv_dim, H)),
            v=w.matrix(f"{a}.v_proj.weight", (cfg.kv_dim, H)),
            o=w.matrix(f"{a}.o_proj.weight", (H, cfg.q_dim)),
            ffn_norm=w.vector(f"{p}.post_attention_layernorm.weight", H),
        )
        if cfg.qkv_bias:
            layer.q_bias = w.vector(f"{a}.q_proj.bias", cfg.q_dim)
            layer.k_bias = w.vector(f"{a}.k_proj.bias", cfg.kv_dim)
            layer.v_bias = w.vector(f"{a}.v_proj.bias", cfg.kv_dim)
        if cfg.o_bias:
            layer.o_bias = w.vector(f"{a}.o_proj.bias", H)
        if cfg.qk_norm:
            layer.q_norm = w.vector(f"{a}.q_norm.weight", D)
            layer.k_norm = w.vector(f"{a}.k_norm.weight", D)
        if cfg.moe_layers[i]:
            _moe(w, p, cfg, layer)
        else:
            I = cfg.intermediate_size
            layer.gate = w.matrix(f"{p}.mlp.gate_proj.weight", (I, H))
            layer.up = w.matrix(f"{p}.mlp.up_proj.weight", (I, H))
            layer.down = w.matrix(f"{p}.mlp.down_proj.weight", (H, I))
        layers.append(layer)
    weights = ModelWeights(embed=embed, output=output, final_norm=w.vector("model.norm.weight", H), layers=layers)
    w.check_no_extra_layers("model.layers.", cfg, "num_hidden_layers")
    return weights
