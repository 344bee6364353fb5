"""The layer plan: per layer, its attention (full or window w) and FFN (dense or MoE); and the mask
plan, the distinct attention masks and which layers read each. Derived from ModelConfig only."""

from dataclasses import dataclass

from .config import ModelConfig


@dataclass(frozen=True)
class LayerPlan:
    index: int
    window: int  # 0 = full causal
    moe: bool

    @property
    def attention(self) -> str:
        return f"window {self.window}" if self.window else "full"


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
    return [LayerPlan(i, cfg.windows[i], cfg.moe_layers[i]) for i in range(cfg.num_layers)]


def mask_plan(cfg: ModelConfig) -> MaskPlan:
    layers = layer_plans(cfg)
    variants = {}
    for lp in layers:
        if lp.window not in variants:
            name = "causal" if lp.window == 0 else f"window{lp.window}"
            variants[lp.window] = MaskVariant(name, lp.window, [])
        variants[lp.window].layers.append(lp.index)
    return MaskPlan(layers, list(variants.values()), cfg.window_rule)
