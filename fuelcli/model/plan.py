"""The layer plan: per layer, what its block does (attention full or window w, RoPE or none, norms,
FFN dense or MoE and its activation); and the mask plan, the distinct attention masks and which
layers read each. Derived from ModelConfig's blocks only."""

from dataclasses import dataclass

from .block import Block
from .config import ModelConfig
from .rope import RopeConfig

ACTIVATION_NAMES = {"silu": "SiLU", "gelu_tanh": "GELU-tanh"}
LINEAR_MASK = "none (linear attention)"  # the mask variant of linear-attention layers: they keep a state


def rope_text(rope: RopeConfig | None) -> str:
    """θ=10000, θ=500000 llama3 ×8, θ=1e+06 yarn ×4, ... or none (a layer without RoPE)."""
    if rope is None:
        return "none"
    text = f"θ={rope.theta:g}"
    if rope.type == "factors":
        return f"{text} rope_freqs"
    if rope.type == "proportional":  # the share of the frequencies that rotate
        scaled = "" if rope.factor == 1 else f" ×{rope.factor:g}"
        return f"{text} proportional {rope.partial_rotary_factor:g}{scaled}"
    return text if rope.type == "default" else f"{text} {rope.type} ×{rope.factor:g}"


@dataclass(frozen=True)
class LayerPlan:
    index: int
    block: Block

    @property
    def window(self) -> int:  # 0 = full causal
        return self.block.attention.window

    @property
    def moe(self) -> bool:
        return self.block.ffn.moe

    @property
    def attention(self) -> str:
        s = self.block.linear
        if s is not None:  # linear attention: a fixed-size state per sequence, no mask
            return (f"linear (gated DeltaNet: {s.k_heads}×{s.k_head_dim} key, {s.v_heads}×{s.v_head_dim} value "
                    f"heads, conv {s.conv_kernel}, {4 * s.state_floats / 1024:g} KiB a sequence)")
        text = f"window {self.window}" if self.window else "full"
        text += " + sinks" if self.block.attention.sinks else ""
        shared = self.block.attention.kv_from
        text += "" if shared is None else f", KV of layer {shared}"
        return text + (", output gate" if self.block.attention.output_gate else "")

    @property
    def rope(self) -> str:
        a = self.block.attention
        return rope_text(a.rope) + (f" over {a.rotary_dim} dims" if a.rotary_dim and a.rope else "")

    @property
    def norms(self) -> str:
        return "pre + post" if self.block.sandwich else "pre"

    def label(self, cfg: ModelConfig) -> str:
        """The block in a few words: attention, RoPE, norms, FFN (diff --layers names it)."""
        ffn = f"MoE {cfg.experts_per_tok} of {cfg.num_experts}" if self.moe else "dense"
        return f"{self.attention}, RoPE {self.rope}, {self.norms} norms, {ffn} {ACTIVATION_NAMES[self.block.ffn.activation]}"


@dataclass
class MaskVariant:
    name: str
    window: int
    layers: list


@dataclass
class MaskPlan:
    layers: list  # LayerPlan per layer
    variants: list  # MaskVariant, in first-use order
    rule: str

    def variant_of(self, layer: int) -> str:
        return next(v.name for v in self.variants if layer in v.layers)


def layer_plans(cfg: ModelConfig) -> list:
    return [LayerPlan(i, b) for i, b in enumerate(cfg.blocks)]


def mask_plan(cfg: ModelConfig) -> MaskPlan:
    layers = layer_plans(cfg)
    variants = {}
    for lp in layers:
        key = "linear" if lp.block.linear is not None else lp.window
        if key not in variants:
            name = LINEAR_MASK if key == "linear" else "causal" if lp.window == 0 else f"window{lp.window}"
            variants[key] = MaskVariant(name, lp.window, [])
        variants[key].layers.append(lp.index)
    return MaskPlan(layers, list(variants.values()), cfg.window_rule)
