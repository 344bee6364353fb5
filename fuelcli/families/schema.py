"""A layer's tensors, declared once: what each is, where each file kind keeps it, its shape and when
a layer has it. The weight readers (weights/build.py), the CPU engine's slot tables, the CUDA
engine's weights and the reference all walk a family's `Schema`; none lists tensor names or slots
of its own.

A `Weight` is a role (the `LayerWeights` field the paths read), its kind, its name in an HF
checkpoint and in a GGUF file (full templates: {i} the layer, {e} an expert where a file stores one
matrix per expert), a shape rule of the config and a presence rule of the layer's block. Load-time
transforms are declared beside it: `heads` (the rows llama-arch GGUF files permute for ggml's
adjacent-pair RoPE, un-permuted on load), a norm's offset (cfg.norm_offset less what the file stores
already, `Schema.gguf_norm_shift`), `Fused` (one stored matrix whose rows are several roles'), and
per file kind `Weight.undo`: what a converter did to one weight, undone on load (`Regroup`: units of
rows or columns stored in another order; `Elementwise`: a vector stored as a function of the value).
A family takes `DECODER` and renames, fuses, undoes or adds what its files differ in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

MATRIX, NORM, VECTOR, EXPERTS = "matrix", "norm", "vector", "experts"


def _always(block) -> bool:
    return True


@dataclass(frozen=True)
class Weight:
    role: str
    kind: str  # MATRIX, NORM (f32, applied as offset + w), VECTOR (f32 as stored: a bias, a conv), EXPERTS
    hf: str | None  # None: no tensor under this file kind (the layer then cannot have it)
    gguf: str | None
    shape: Callable  # (cfg) -> shape; EXPERTS: (experts, rows, cols)
    when: Callable = _always  # (block) -> whether the layer has it
    heads: Callable | None = None  # (cfg) -> heads whose rows a permuted GGUF file reorders
    hf_shape: Callable | None = None  # (cfg) -> the shape HF files store, when not `shape` (reshaped on load)
    # HF files store the matrix transposed, [..., cols, rows] (transformers' x @ W experts of gpt-oss);
    # transposed on load (a copy)
    hf_transposed: bool = False
    undo: dict = field(default_factory=dict)  # file kind -> (Regroup | Elementwise, ...): applied in order on load

    def name(self, kind: str, i: int = 0) -> str | None:
        """Where a file kind keeps it in layer i ({e} left for the reader where one per expert)."""
        template = getattr(self, kind)
        return None if template is None else template.format(i=i, e="{e}")


@dataclass(frozen=True)
class Regroup:
    """Units of `unit(cfg)` consecutive rows (axis 0; columns with axis=1) from `start(cfg)` on, stored
    in another order: the loaded unit u is the stored unit order(cfg)[u]."""

    unit: Callable
    order: Callable
    start: Callable = lambda cfg: 0
    axis: int = 0


@dataclass(frozen=True)
class Elementwise:
    """A vector stored as f(value): `undo` maps the stored numbers back (f32 in, f32 out)."""

    undo: Callable
    what: str


@dataclass(frozen=True)
class Fused:
    """One stored tensor whose rows (axis -2) are `parts`' rows in order, split into views on load;
    `interleaved`: (cfg) -> heads, the rows are each head's rows of every part in turn instead (Qwen3.5's
    q|gate per head; gpt-oss's gate|up, one row each in turn; split into copies). Parts of kind VECTOR
    are split along their last axis the same way (gpt-oss's gate|up biases). `optional`: used only
    where the file holds it (else the parts' own names); `with_names`: roles read under these exact
    names when the fused tensor is used (transformers 5's stacked experts); `hf_transposed`: HF files
    store the whole tensor transposed (as Weight.hf_transposed)."""

    parts: tuple
    hf: str | None = None
    gguf: str | None = None
    optional: bool = False
    with_names: dict = field(default_factory=dict)
    interleaved: Callable | None = None
    hf_transposed: bool = False


@dataclass(frozen=True)
class Schema:
    model: tuple  # Weights outside the layers: embed, output, final_norm
    layer: tuple  # a layer's Weights, in the order they are read (and named in errors)
    fused: tuple = ()
    per_layer_inputs: tuple = ()  # model-level Weights read when cfg.per_layer_input_size (Gemma 4)
    layer_prefix: dict = field(default_factory=lambda: {"hf": "model.layers.", "gguf": "blk."})
    layer_count_key: dict = field(default_factory=lambda: {"hf": "num_hidden_layers", "gguf": "block_count"})
    ignorable: tuple = ()  # name endings of tensors no model reads (buffers some checkpoints carry)
    gguf_norm_shift: float = 0.0  # what GGUF files already added to every norm weight (Gemma's 1 + w)
    # (name prefix, what it is): tensors a file may hold that no path runs (a vision tower, an MTP
    # head); accepted and left unread, and `fuel inspect config` says so
    not_run: tuple = ()

    def renamed(self, hf: dict | None = None, gguf: dict | None = None) -> "Schema":
        """The same tensors under other names (role -> template) in one or both file kinds."""
        def rename(w: Weight) -> Weight:
            return replace(w, hf=(hf or {}).get(w.role, w.hf), gguf=(gguf or {}).get(w.role, w.gguf))

        return replace(self, model=tuple(map(rename, self.model)), layer=tuple(map(rename, self.layer)))

    def role(self, role: str) -> Weight:
        return next(w for w in self.model + self.layer if w.role == role)

    def with_weight(self, role: str, **changes) -> "Schema":
        """The same tensors with one layer role's declaration changed (a stored layout, a transform)."""
        return replace(self, layer=tuple(replace(w, **changes) if w.role == role else w for w in self.layer))

    def with_fused(self, *fused: Fused) -> "Schema":
        return replace(self, fused=self.fused + fused)

    def undoing(self, kind: str, undo: dict) -> "Schema":
        """The same tensors with role -> (Regroup | Elementwise, ...) undone on load from this file kind."""
        def add(w: Weight) -> Weight:
            return replace(w, undo={**w.undo, kind: w.undo.get(kind, ()) + undo[w.role]}) if w.role in undo else w

        return replace(self, layer=tuple(map(add, self.layer)))

    def nested(self, prefix: str, not_run: tuple = ()) -> "Schema":
        """The HF names under `prefix` instead of "model." (a multimodal wrapper's language model),
        beside tensors that are not run."""
        def move(name):
            return prefix + name[len("model."):] if name and name.startswith("model.") else name

        def moved(w: Weight) -> Weight:
            return replace(w, hf=move(w.hf))

        fused = tuple(replace(f, hf=move(f.hf), with_names={r: move(n) for r, n in f.with_names.items()})
                      for f in self.fused)
        return replace(self, model=tuple(map(moved, self.model)), layer=tuple(map(moved, self.layer)), fused=fused,
                       per_layer_inputs=tuple(map(moved, self.per_layer_inputs)), layer_prefix={**self.layer_prefix, "hf": move(self.layer_prefix["hf"])},
                       not_run=self.not_run + not_run)

    def norm_shift(self, kind: str) -> float:
        return self.gguf_norm_shift if kind == "gguf" else 0.0


def _h(c):
    return (c.hidden_size,)


_A, _M = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"
_L, _S = "model.layers.{i}.linear_attn", "model.layers.{i}.mlp.shared_expert"


def _attends(b):
    return b.linear is None


def _linear(b):
    return b.linear is not None


def _qkv_bias(b):
    return _attends(b) and b.attention.qkv_bias


def _qk_norm(b):
    return _attends(b) and b.attention.qk_norm


def _sandwich(b):
    return b.sandwich


def _dense(b):
    return not b.ffn.moe


def _moe(b):
    return b.ffn.moe or b.ffn.moe_beside


def _own_kv(b):
    return _attends(b) and b.attention.kv_from is None


def _own_v(b):
    return _own_kv(b) and not b.attention.v_is_k


def _moe_beside(b):
    return b.ffn.moe_beside


def _per_layer_input(b):
    return b.per_layer_input


def _shared(b):
    return b.ffn.moe and b.ffn.shared_expert


def _sinks(b):
    return _attends(b) and b.attention.sinks


def _router_bias(b):
    return b.ffn.moe and b.ffn.router_bias


def _expert_bias(b):
    return b.ffn.moe and b.ffn.expert_bias


def _q_heads(c):
    return c.num_heads


def _kv_heads(c):
    return c.num_kv_heads


DECODER = Schema(
    model=(
        Weight("embed", MATRIX, "model.embed_tokens.weight", "token_embd.weight", lambda c: (c.vocab_size, c.hidden_size)),
        Weight("output", MATRIX, "lm_head.weight", "output.weight", lambda c: (c.vocab_size, c.hidden_size)),
        Weight("final_norm", NORM, "model.norm.weight", "output_norm.weight", _h),
    ),
    layer=(
        Weight("q", MATRIX, f"{_A}.q_proj.weight", "blk.{i}.attn_q.weight", lambda c: (c.q_dim, c.hidden_size),
               when=_attends, heads=_q_heads),
        Weight("k", MATRIX, f"{_A}.k_proj.weight", "blk.{i}.attn_k.weight", lambda c: (c.kv_dim, c.hidden_size),
               when=_own_kv, heads=_kv_heads),
        Weight("v", MATRIX, f"{_A}.v_proj.weight", "blk.{i}.attn_v.weight", lambda c: (c.kv_dim, c.hidden_size),
               when=_own_v),
        Weight("attn_norm", NORM, "model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight", _h),
        Weight("o", MATRIX, f"{_A}.o_proj.weight", "blk.{i}.attn_output.weight", lambda c: (c.hidden_size, c.q_dim),
               when=_attends),
        Weight("ffn_norm", NORM, "model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight", _h),
        # Gemma's sandwich: each sub-layer's output normed before its residual add (names per family)
        Weight("post_attn_norm", NORM, None, None, _h, when=_sandwich),
        Weight("post_ffn_norm", NORM, None, None, _h, when=_sandwich),
        Weight("q_bias", VECTOR, f"{_A}.q_proj.bias", "blk.{i}.attn_q.bias", lambda c: (c.q_dim,), when=_qkv_bias,
               heads=_q_heads),
        Weight("k_bias", VECTOR, f"{_A}.k_proj.bias", "blk.{i}.attn_k.bias", lambda c: (c.kv_dim,),
               when=lambda b: _qkv_bias(b) and _own_kv(b), heads=_kv_heads),
        Weight("v_bias", VECTOR, f"{_A}.v_proj.bias", "blk.{i}.attn_v.bias", lambda c: (c.kv_dim,),
               when=lambda b: _qkv_bias(b) and _own_v(b)),
        Weight("o_bias", VECTOR, f"{_A}.o_proj.bias", "blk.{i}.attn_output.bias", _h,
               when=lambda b: _attends(b) and b.attention.o_bias),
        Weight("q_norm", NORM, f"{_A}.q_norm.weight", "blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,),
               when=_qk_norm),
        Weight("k_norm", NORM, f"{_A}.k_norm.weight", "blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,),
               when=lambda b: _qk_norm(b) and _own_kv(b)),
        Weight("router", MATRIX, f"{_M}.gate.weight", "blk.{i}.ffn_gate_inp.weight",
               lambda c: (c.num_experts, c.hidden_size), when=_moe),
        Weight("gate_exps", EXPERTS, f"{_M}.experts.{{e}}.gate_proj.weight", "blk.{i}.ffn_gate_exps.weight",
               lambda c: (c.num_experts, c.moe_intermediate_size, c.hidden_size), when=_moe),
        Weight("up_exps", EXPERTS, f"{_M}.experts.{{e}}.up_proj.weight", "blk.{i}.ffn_up_exps.weight",
               lambda c: (c.num_experts, c.moe_intermediate_size, c.hidden_size), when=_moe),
        Weight("down_exps", EXPERTS, f"{_M}.experts.{{e}}.down_proj.weight", "blk.{i}.ffn_down_exps.weight",
               lambda c: (c.num_experts, c.hidden_size, c.moe_intermediate_size), when=_moe),
        Weight("gate", MATRIX, f"{_M}.gate_proj.weight", "blk.{i}.ffn_gate.weight",
               lambda c: (c.intermediate_size, c.hidden_size), when=_dense),
        Weight("up", MATRIX, f"{_M}.up_proj.weight", "blk.{i}.ffn_up.weight",
               lambda c: (c.intermediate_size, c.hidden_size), when=_dense),
        Weight("down", MATRIX, f"{_M}.down_proj.weight", "blk.{i}.ffn_down.weight",
               lambda c: (c.hidden_size, c.intermediate_size), when=_dense),
        # Qwen3.5's attention output gate: q_proj's other half (families fuse it with q)
        Weight("q_gate", MATRIX, None, None, lambda c: (c.q_dim, c.hidden_size),
               when=lambda b: _attends(b) and b.attention.output_gate),
        # linear attention (block.LinearAttention)
        Weight("lin_qkv", MATRIX, f"{_L}.in_proj_qkv.weight", None, lambda c: (c.linear.conv_dim, c.hidden_size),
               when=_linear),
        Weight("lin_z", MATRIX, f"{_L}.in_proj_z.weight", None, lambda c: (c.linear.value_dim, c.hidden_size),
               when=_linear),
        Weight("lin_b", MATRIX, f"{_L}.in_proj_b.weight", None, lambda c: (c.linear.v_heads, c.hidden_size),
               when=_linear),
        Weight("lin_a", MATRIX, f"{_L}.in_proj_a.weight", None, lambda c: (c.linear.v_heads, c.hidden_size),
               when=_linear),
        Weight("lin_conv", VECTOR, f"{_L}.conv1d.weight", None, lambda c: (c.linear.conv_dim, c.linear.conv_kernel),
               when=_linear, hf_shape=lambda c: (c.linear.conv_dim, 1, c.linear.conv_kernel)),
        Weight("lin_dt_bias", VECTOR, f"{_L}.dt_bias", None, lambda c: (c.linear.v_heads,), when=_linear),
        Weight("lin_a_log", VECTOR, f"{_L}.A_log", None, lambda c: (c.linear.v_heads,), when=_linear),
        Weight("lin_norm", VECTOR, f"{_L}.norm.weight", None, lambda c: (c.linear.v_head_dim,), when=_linear),
        Weight("lin_out", MATRIX, f"{_L}.out_proj.weight", None, lambda c: (c.hidden_size, c.linear.value_dim),
               when=_linear),
        # a shared expert beside the experts, scaled by sigmoid(x · shared_expert_gate)
        Weight("shared_gate", MATRIX, f"{_S}.gate_proj.weight", None,
               lambda c: (c.shared_expert_intermediate_size, c.hidden_size), when=_shared),
        Weight("shared_up", MATRIX, f"{_S}.up_proj.weight", None,
               lambda c: (c.shared_expert_intermediate_size, c.hidden_size), when=_shared),
        Weight("shared_down", MATRIX, f"{_S}.down_proj.weight", None,
               lambda c: (c.hidden_size, c.shared_expert_intermediate_size), when=_shared),
        Weight("shared_expert_gate", MATRIX, f"{_M}.shared_expert_gate.weight", None, lambda c: (1, c.hidden_size),
               when=_shared),
        # gpt-oss: a sink logit per head, the router's bias, each expert's biases ([experts, rows])
        Weight("sinks", VECTOR, f"{_A}.sinks", "blk.{i}.attn_sinks.weight", lambda c: (c.num_heads,), when=_sinks),
        Weight("router_bias", VECTOR, f"{_M}.gate.bias", "blk.{i}.ffn_gate_inp.bias", lambda c: (c.num_experts,),
               when=_router_bias),
        Weight("gate_exps_bias", VECTOR, None, "blk.{i}.ffn_gate_exps.bias",
               lambda c: (c.num_experts, c.moe_intermediate_size), when=_expert_bias),
        Weight("up_exps_bias", VECTOR, None, "blk.{i}.ffn_up_exps.bias",
               lambda c: (c.num_experts, c.moe_intermediate_size), when=_expert_bias),
        Weight("down_exps_bias", VECTOR, None, "blk.{i}.ffn_down_exps.bias", lambda c: (c.num_experts, c.hidden_size),
               when=_expert_bias),
        # Gemma 4's MoE beside the dense FFN: the router's input scale and per-expert output scale,
        # the dense output's norm, the experts' input and output norms
        Weight("router_scale", VECTOR, "model.layers.{i}.router.scale", None, _h, when=_moe_beside),
        Weight("per_expert_scale", VECTOR, "model.layers.{i}.router.per_expert_scale", None,
               lambda c: (c.num_experts,), when=_moe_beside),
        Weight("post_ffn_norm_1", NORM, "model.layers.{i}.post_feedforward_layernorm_1.weight", None, _h,
               when=_moe_beside),
        Weight("ffn_norm_2", NORM, "model.layers.{i}.pre_feedforward_layernorm_2.weight", None, _h, when=_moe_beside),
        Weight("post_ffn_norm_2", NORM, "model.layers.{i}.post_feedforward_layernorm_2.weight", None, _h,
               when=_moe_beside),
        # Gemma 4's per-layer input (Block.per_layer_input)
        Weight("pl_gate", MATRIX, "model.layers.{i}.per_layer_input_gate.weight", None,
               lambda c: (c.per_layer_input_size, c.hidden_size), when=_per_layer_input),
        Weight("pl_proj", MATRIX, "model.layers.{i}.per_layer_projection.weight", None,
               lambda c: (c.hidden_size, c.per_layer_input_size), when=_per_layer_input),
        Weight("pl_norm", NORM, "model.layers.{i}.post_per_layer_input_norm.weight", None, _h,
               when=_per_layer_input),
        Weight("layer_scalar", VECTOR, "model.layers.{i}.layer_scalar", None, lambda c: (1,),
               when=lambda b: b.layer_scalar),
    ),
    # outside the layers, read when the config has per-layer inputs: the token's rows of every layer's
    # input (one packed table, kept as stored) and the projection of the embedding that joins them
    per_layer_inputs=(
        Weight("per_layer_embed", MATRIX, "model.embed_tokens_per_layer.weight", None,
               lambda c: (c.per_layer_vocab, c.num_layers * c.per_layer_input_size)),
        Weight("per_layer_proj", MATRIX, "model.per_layer_model_projection.weight", None,
               lambda c: (c.num_layers * c.per_layer_input_size, c.hidden_size)),
        Weight("per_layer_proj_norm", NORM, "model.per_layer_projection_norm.weight", None,
               lambda c: (c.per_layer_input_size,)),
    ),
    # files written from transformers 5's in-memory layout stack every expert's gate|up in one tensor
    fused=(Fused(("gate_exps", "up_exps"), hf=f"{_M}.experts.gate_up_proj", optional=True,
                 with_names={"down_exps": f"{_M}.experts.down_proj"}),),
    ignorable=("rotary_emb.inv_freq",),  # RoPE buffers in older Llama checkpoints: fuel derives its own
)

# The roles every path knows, in the order of the engines' slot tables (a family may rename a
# weight, not add a role: a new role is new maths in every path).
MATRICES = tuple(w.role for w in DECODER.layer if w.kind == MATRIX)
VECTORS = tuple(w.role for w in DECODER.layer if w.kind in (NORM, VECTOR))
EXPERT_ROLES = tuple(w.role for w in DECODER.layer if w.kind == EXPERTS)
