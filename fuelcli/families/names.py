"""Where a file kind keeps each weight of the shared decoder: one `Names` per family and file kind.

Templates take {i} for the layer; ".weight" / ".bias" is added. A name of None: the family has no
such weight. `fused_qkv` / `fused_gate_up` name one stored matrix whose rows are q|k|v or
gate|up (Phi-3); the weight readers split it by rows (a view, any format).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ExpertNames:
    """A MoE layer's router and experts. gate/up/down hold {e} when the file stores one matrix per
    expert, else they name one stacked [experts, rows, cols] tensor (GGUF). fused_gate_up and
    fused_down (exact names, no suffix added) are the stacked [E, 2I, H] and [E, H, I] tensors of
    files written from transformers 5's in-memory layout; a file holding them uses them."""

    router: str
    gate: str
    up: str
    down: str
    fused_gate_up: str | None = None
    fused_down: str | None = None


@dataclass(frozen=True)
class Names:
    embed: str
    output: str
    final_norm: str
    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    q_norm: str
    k_norm: str
    ffn_norm: str
    gate: str
    up: str
    down: str
    layer_prefix: str  # for the extra-layers check
    layer_count_key: str
    post_attn_norm: str | None = None  # sandwich norms (Block.sandwich)
    post_ffn_norm: str | None = None
    fused_qkv: str | None = None
    fused_gate_up: str | None = None
    experts: ExpertNames | None = None
    ignorable: tuple = ()  # name endings of tensors no model reads (buffers some checkpoints carry)
    # what the file already added to every norm weight (Gemma's GGUF stores 1 + w): the readers add
    # the model's norm_offset less this
    norm_shift: float = 0.0


HF = Names(
    embed="model.embed_tokens", output="lm_head", final_norm="model.norm",
    attn_norm="model.layers.{i}.input_layernorm", q="model.layers.{i}.self_attn.q_proj",
    k="model.layers.{i}.self_attn.k_proj", v="model.layers.{i}.self_attn.v_proj",
    o="model.layers.{i}.self_attn.o_proj", q_norm="model.layers.{i}.self_attn.q_norm",
    k_norm="model.layers.{i}.self_attn.k_norm", ffn_norm="model.layers.{i}.post_attention_layernorm",
    gate="model.layers.{i}.mlp.gate_proj", up="model.layers.{i}.mlp.up_proj", down="model.layers.{i}.mlp.down_proj",
    layer_prefix="model.layers.", layer_count_key="num_hidden_layers",
    experts=ExpertNames(router="model.layers.{i}.mlp.gate", gate="model.layers.{i}.mlp.experts.{e}.gate_proj",
                        up="model.layers.{i}.mlp.experts.{e}.up_proj",
                        down="model.layers.{i}.mlp.experts.{e}.down_proj",
                        fused_gate_up="model.layers.{i}.mlp.experts.gate_up_proj",
                        fused_down="model.layers.{i}.mlp.experts.down_proj"),
    ignorable=("rotary_emb.inv_freq",),  # RoPE buffers in older Llama checkpoints: fuel derives its own
)

GGUF = Names(
    embed="token_embd", output="output", final_norm="output_norm", attn_norm="blk.{i}.attn_norm",
    q="blk.{i}.attn_q", k="blk.{i}.attn_k", v="blk.{i}.attn_v", o="blk.{i}.attn_output",
    q_norm="blk.{i}.attn_q_norm", k_norm="blk.{i}.attn_k_norm", ffn_norm="blk.{i}.ffn_norm",
    gate="blk.{i}.ffn_gate", up="blk.{i}.ffn_up", down="blk.{i}.ffn_down",
    layer_prefix="blk.", layer_count_key="block_count",
    experts=ExpertNames(router="blk.{i}.ffn_gate_inp", gate="blk.{i}.ffn_gate_exps", up="blk.{i}.ffn_up_exps",
                        down="blk.{i}.ffn_down_exps"),
)

__all__ = ["GGUF", "HF", "ExpertNames", "Names", "replace"]
