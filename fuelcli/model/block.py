"""The block description: what each decoder layer computes, as data that every path reads.

A family turns its config into one `Block` per layer (config.py asks the family's hooks); the
numpy reference interprets the blocks (it is the oracle), the CPU engine flattens them into
per-layer tables, and each backend names the features it runs, so that `make_engine` refuses a
model whose blocks ask for more in one line instead of computing something else.

    x = embed(token) * cfg.embed_scale
    every layer:   x += [post-norm] mixer(norm(x))           (post-norm: Block.sandwich)
                   x += [post-norm] ffn(norm(x))
                  [x += per-layer input(x, the layer's row)]  (Block.per_layer_input)
                  [x *= layer scalar]                         (Block.layer_scalar)
    logits = softcap(head(norm(x)))                           (cfg.final_softcap; 0 = none)

A layer's token mixer is softmax attention over a KV cache, or linear attention (Block.linear: a
gated DeltaNet keeping a fixed-size recurrent state and a conv window per sequence).

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
    output_gate: bool = False  # q_proj also emits a gate per head: output * sigmoid(gate) before o_proj
    rotary_dim: int = 0  # the leading dimensions of each head RoPE rotates; 0: all of them
    sinks: bool = False  # a learned logit per head joins each query's softmax denominator (gpt-oss)
    head_dim: int = 0  # this layer's head_dim and KV heads; 0: the model's (ModelConfig.at)
    kv_heads: int = 0
    v_norm: bool = False  # an RMSNorm without weight over head_dim on v
    v_is_k: bool = False  # no v projection: v is k's projection (before k's norm and RoPE)
    kv_from: int | None = None  # no k/v of its own: attends to layer kv_from's (normed, rotated) k and v


@dataclass(frozen=True)
class LinearAttention:
    """A gated DeltaNet token mixer (Qwen3.5, Qwen3-Next): in_proj_qkv -> causal depthwise conv
    (conv_kernel taps, SiLU) -> q, k, v; the delta rule over a [k_head_dim, v_head_dim] state per
    value head (k heads repeat to the value heads); RMSNorm(o) * silu(z) -> out_proj."""

    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def state_floats(self) -> int:
        """f32 values a sequence keeps for the layer: the recurrent state and the conv window."""
        return self.v_heads * self.k_head_dim * self.v_head_dim + self.conv_dim * (self.conv_kernel - 1)


@dataclass(frozen=True)
class Ffn:
    moe: bool = False  # a sparse mixture of experts (the model's experts_per_tok of num_experts)
    activation: str = "silu"  # a key of ACTIVATIONS
    shared_expert: bool = False  # beside the experts, one always-on expert scaled by sigmoid(x · w)
    # "softmax": over all experts, then the top-k (renormalised when cfg.norm_topk_prob);
    # "topk_softmax": the top-k router logits, softmax over those k only (gpt-oss)
    router: str = "softmax"
    router_bias: bool = False  # the router's logits have a bias
    expert_bias: bool = False  # each expert's gate, up and down projections have biases
    # > 0: gpt-oss's clamped SwiGLU, (clip(up, ±limit) + 1) · g · sigmoid(swiglu_alpha · g) with
    # g = min(gate, limit), instead of act(gate) · up
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.702
    width: int = 0  # the dense GLU's intermediate size in this layer; 0: the model's
    # Gemma 4: a routed MoE beside the dense GLU, each output normed, their sum normed (post_ffn_norm)
    moe_beside: bool = False


@dataclass(frozen=True)
class Block:
    attention: Attention
    ffn: Ffn
    sandwich: bool = False  # an RMSNorm on the attention's and the FFN's output before each residual add
    linear: LinearAttention | None = None  # the token mixer is linear attention (attention unused)
    # Gemma 4's per-layer input: after the FFN, x += norm(proj(act(gate(x)) * the layer's input row))
    per_layer_input: bool = False
    layer_scalar: bool = False  # the layer's output (the residual stream) times a stored scalar


LINEAR_LAYERS = "linear-attention layers (gated DeltaNet)"
OUTPUT_GATE = "an attention output gate"
PARTIAL_ROTARY = "RoPE over part of each head"
SHARED_EXPERT = "a shared expert"
ATTENTION_SINKS = "attention sinks"
TOPK_SOFTMAX = "a softmax over the chosen experts only"
ROUTER_BIAS = "a router bias"
EXPERT_BIAS = "expert biases"
CLAMPED_SWIGLU = "a clamped SwiGLU"
LAYER_GEOMETRY = "head_dim or KV heads per layer"
V_NORM = "an RMSNorm on v"
V_IS_K = "v taken from k (attention_k_eq_v)"
SHARED_KV = "KV shared across layers"
FFN_WIDTH = "an FFN width per layer"
MOE_BESIDE = "a MoE block beside the dense FFN"
PER_LAYER_INPUTS = "per-layer inputs"
LAYER_SCALAR = "a layer output scalar"


def features(cfg) -> dict:
    """The properties a model's blocks use beyond a plain pre-norm SiLU decoder with one RoPE:
    {feature name: an example layer}, for the backends to refuse what they do not run."""
    found = {}

    def note(name, layer):
        found.setdefault(name, layer)

    ropes = {}
    for i, b in enumerate(cfg.blocks):
        a = b.attention
        if b.linear is not None:
            note(LINEAR_LAYERS, i)
        if b.ffn.shared_expert:
            note(SHARED_EXPERT, i)
        if b.ffn.moe:
            for name, used in ((TOPK_SOFTMAX, b.ffn.router == "topk_softmax"), (ROUTER_BIAS, b.ffn.router_bias),
                               (EXPERT_BIAS, b.ffn.expert_bias), (CLAMPED_SWIGLU, b.ffn.swiglu_limit > 0)):
                if used:
                    note(name, i)
        if b.ffn.width:
            note(FFN_WIDTH, i)
        if b.ffn.moe_beside:
            note(MOE_BESIDE, i)
        if b.per_layer_input:
            note(PER_LAYER_INPUTS, i)
        if b.layer_scalar:
            note(LAYER_SCALAR, i)
        if b.linear is not None:
            continue
        if a.head_dim or a.kv_heads:
            note(LAYER_GEOMETRY, i)
        if a.v_norm:
            note(V_NORM, i)
        if a.v_is_k:
            note(V_IS_K, i)
        if a.kv_from is not None:
            note(SHARED_KV, i)
        if a.output_gate:
            note(OUTPUT_GATE, i)
        if a.rotary_dim:
            note(PARTIAL_ROTARY, i)
        if a.sinks:
            note(ATTENTION_SINKS, i)
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
