"""The layer plan: per layer, what its block does (attention full or window w, RoPE or none, norms,
FFN dense or MoE and its activation); and the mask plan, the distinct attention masks and which
layers read each. Derived from ModelConfig's blocks only."""

from dataclasses import dataclass

from .block import Block
from .config import ModelConfig
from .rope import RopeConfig

ACTIVATION_NAMES = {"silu": "SiLU", "gelu_tanh": "GELU-tanh"}


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
        kind = f"window {self.window}" if self.window else "full"
        shared = self.block.attention.kv_from
        return kind if shared is None else f"{kind}, KV of layer {shared}"

    @property
    def rope(self) -> str:
        return rope_text(self.block.attention.rope)

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
        if lp.window not in variants:
            name = "causal" if lp.window == 0 else f"window{lp.window}"
            variants[lp.window] = MaskVariant(name, lp.window, [])
        variants[lp.window].layers.append(lp.index)
    return MaskPlan(layers, list(variants.values()), cfg.window_rule)
