"""ModelWeights: every weight of the shared decoder under one set of names, whatever the file.

Matrices stay `Tensor`s in their stored format; norms and biases (tiny) are widened to f32 once.
Experts are one 2-D Tensor per expert (views of a stacked tensor where the file stacks them).
"""

from dataclasses import dataclass, field

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from .formats import dequantize
from .tensor import Tensor


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    ffn_norm: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    o_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    # dense FFN
    gate: Tensor | None = None
    up: Tensor | None = None
    down: Tensor | None = None
    # MoE FFN
    router: Tensor | None = None
    gate_exps: list = field(default_factory=list)
    up_exps: list = field(default_factory=list)
    down_exps: list = field(default_factory=list)


@dataclass
class ModelWeights:
    embed: Tensor
    output: Tensor  # the same object as embed when tied: no second copy
    final_norm: np.ndarray
    layers: list

    def tensors(self):
        """Every distinct stored matrix once (tied embeddings counted once)."""
        seen = {}
        for t in [self.embed, self.output]:
            seen[id(t)] = t
        for layer in self.layers:
            for t in [layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down, layer.router]:
                if t is not None:
                    seen[id(t)] = t
            for t in layer.gate_exps + layer.up_exps + layer.down_exps:
                seen[id(t)] = t
        return list(seen.values())


def expert_views(t: Tensor) -> list:
    """Split a stacked [E, rows, cols] tensor into per-expert 2-D views (no copy)."""
    return [Tensor(f"{t.name}[{e}]", t.fmt, t.shape[1:], t.data[e]) for e in range(t.shape[0])]


def row_slice(t: Tensor, start: int, stop: int) -> Tensor:
    """Rows start:stop of every expert of a stacked tensor (a view): splits fused gate_up."""
    return Tensor(f"{t.name}[{start}:{stop}]", t.fmt, t.shape[:-2] + (stop - start, t.shape[-1]),
                  t.data[..., start:stop, :])


class Lookup:
    """Takes tensors by name from a file's table, checking shapes against the config."""

    def __init__(self, tensors: dict, where: str):
        self.tensors, self.where = tensors, where

    def has(self, name: str) -> bool:
        return name in self.tensors

    def matrix(self, name: str, shape: tuple) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise InputError(f"{self.where}: missing tensor {name}")
        if tuple(t.shape) != tuple(shape):
            raise InputError(f"{self.where}: tensor {name} has shape {list(t.shape)}, the config implies {list(shape)}")
        return t

    def vector(self, name: str, n: int, optional: bool = False) -> np.ndarray | None:
        if optional and name not in self.tensors:
            return None
        t = self.matrix(name, (n,))
        return np.ascontiguousarray(dequantize(t), dtype=np.float32)


def check_layer_count(cfg: ModelConfig, layers: list):
    if len(layers) != cfg.num_layers:
        raise InputError(f"weights hold {len(layers)} layers, config says {cfg.num_layers}")
