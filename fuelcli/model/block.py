"""The block description: what each decoder layer computes, as data that every path reads.

A family turns its config into one `Block` per layer (config.py asks the family's hooks); the
numpy reference interprets the blocks (it is the oracle), the CPU engine flattens them into
per-layer tables, and each backend names the features it runs, so that `make_engine` refuses a
model whose blocks ask for more in one line instead of computing something else.

    x = embed(token) * cfg.embed_scale
    every layer:   x += [post-norm] attention(norm(x))       (post-norm: Block.sandwich)
                   x += [post-norm] ffn(norm(x))
    logits = softcap(head(norm(x)))                           (cfg.final_softcap; 0 = none)

Every norm is an RMSNorm whose weight w is applied as (cfg.norm_offset + w) (Gemma's 1 + w); the
weight readers fold the offset into the f32 weights, so no path computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rope import RopeConfig

# the gate activation of the FFN's GLU (act(gate) * up) by its name here; the config spellings
# transformers uses for each (hidden_act / hidden_activation)
ACTIVATIONS = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")}


@dataclass(frozen=True)
class Attention:
    window: int = 0  # 0 = full causal; w: the query at i sees the keys i - w < j <= i
    rope: RopeConfig | None = RopeConfig()  # None: no rotary embedding in this layer (NoPE)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE
    qkv_bias: bool = False
    o_bias: bool = False
    scale: float | None = None  # what q·k is multiplied by; None: 1 / sqrt(head_dim)


@dataclass(frozen=True)
class Ffn:
    moe: bool = False  # a sparse mixture of experts (the model's experts_per_tok of num_experts)
    activation: str = "silu"  # a key of ACTIVATIONS


@dataclass(frozen=True)
class Block:
    attention: Attention
    ffn: Ffn
    sandwich: bool = False  # an RMSNorm on the attention's and the FFN's output before each residual add


def features(cfg) -> dict:
    """The properties a model's blocks use beyond a plain pre-norm SiLU decoder with one RoPE:
    {feature name: an example layer}, for the backends to refuse what they do not run."""
    found = {}

    def note(name, layer):
        found.setdefault(name, layer)

    ropes = {}
    for i, b in enumerate(cfg.blocks):
        a = b.attention
        if a.rope is None:
            note("layers without RoPE", i)
        else:
            ropes.setdefault(a.rope, i)
        if a.scale is not None:
            note("an attention scale other than 1/sqrt(head_dim)", i)
        if b.sandwich:
            note("post-attention and post-FFN norms", i)
        if b.ffn.activation != "silu":
            note(f"a {b.ffn.activation} FFN", i)
    if len(ropes) > 1:
        note("a RoPE base or scaling per layer", sorted(ropes.values())[1])
    if cfg.embed_scale != 1.0:
        note("an embedding scale", 0)
    if cfg.final_softcap:
        note("a final logit softcap", cfg.num_layers - 1)
    return found


def rope_variants(cfg) -> list:
    """The distinct RoPEs of the model's layers, in first-use order (one cos/sin table each)."""
    return list(dict.fromkeys(b.attention.rope for b in cfg.blocks if b.attention.rope is not None))
