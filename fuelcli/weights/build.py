"""ModelWeights: every weight of the shared decoder under one set of names, whatever the file.

Matrices stay `Tensor`s in their stored format; norms and biases (tiny) are widened to f32 once.
Experts are one 2-D Tensor per expert (views of a stacked tensor where the file stacks them).
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..families.names import Names
from ..formats import dequantize
from ..model.config import ModelConfig
from .tensor import Tensor


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    ffn_norm: np.ndarray
    post_attn_norm: np.ndarray | None = None  # sandwich norms (Block.sandwich)
    post_ffn_norm: np.ndarray | None = None
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
    vector_names: dict = field(default_factory=dict)  # id(f32 vector) -> its name in the file (messages)

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
    """Takes tensors by name from a file's table, checking shapes against the config.

    The table may carry `unsupported` (name -> stored dtype) for tensors the reader skipped; asking
    for one of those is an error naming its dtype, asking for none of them is fine (buffers such as
    an I64 position_ids). Every name taken is remembered, so tensors nobody took can be refused."""

    def __init__(self, tensors: dict, where: str):
        self.tensors, self.where = tensors, where
        self.unsupported = getattr(tensors, "unsupported", {})
        self.taken: set = set()
        self.vector_names: dict = {}

    def has(self, name: str) -> bool:
        return name in self.tensors or name in self.unsupported

    def matrix(self, name: str, shape: tuple) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            if name in self.unsupported:
                raise InputError(f"{self.where}: tensor {name} has dtype {self.unsupported[name]}, "
                                 f"which fuel does not read")
            raise InputError(f"{self.where}: missing tensor {name}")
        if tuple(t.shape) != tuple(shape):
            raise InputError(f"{self.where}: tensor {name} has shape {list(t.shape)}, the config implies {list(shape)}")
        self.taken.add(name)
        return t

    def vector(self, name: str, n: int, add: float = 0.0) -> np.ndarray:
        """A norm or bias widened to f32 (plus `add`, a norm's offset: a new array then)."""
        t = self.matrix(name, (n,))
        v = np.ascontiguousarray(dequantize(t), dtype=np.float32)
        if add:
            v = (v + np.float32(add)).astype(np.float32)
        self.vector_names[id(v)] = name
        return v

    def check_no_extra_layers(self, prefix: str, cfg: ModelConfig, key: str):
        """Error if the file holds tensors of a layer index >= cfg.num_layers (`{prefix}{L}.`)."""
        extra = {}
        for name in list(self.tensors) + list(self.unsupported):
            if name.startswith(prefix):
                index = name[len(prefix):].split(".", 1)[0]
                if index.isdigit() and int(index) >= cfg.num_layers:
                    extra.setdefault(int(index), name)
        if extra:
            top = max(extra)
            raise InputError(f"{self.where}: the weights hold {top + 1} layers ({extra[top]} exists) but "
                             f"{key}={cfg.num_layers}")

    def check_all_taken(self, cfg: ModelConfig, ignorable: tuple):
        """Error on a weight no part of the decoder took: it may carry a feature the config does not
        describe (an o_proj bias, a norm fuel lacks), and ignoring it would give wrong output quietly."""
        left = sorted(n for n in self.tensors if n not in self.taken and not n.endswith(ignorable))
        if left:
            more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
            raise InputError(f"{self.where}: tensor {left[0]}{more} is not a weight of a {cfg.family} model with "
                             f"this config; fuel refuses rather than ignore it")


def _check_stored_head(w: Lookup, name: str, embed: Tensor):
    """tie_word_embeddings with an output matrix stored too: the same bytes are harmless; different
    ones are refused, because the peers disagree on which is meant (transformers 5 keeps the stored
    head and warns, vLLM and mlx-lm drop it for the embedding)."""
    head = w.matrix(name, embed.shape)
    if head.fmt != embed.fmt or not np.array_equal(head.data, embed.data):
        raise InputError(f"{w.where}: tie_word_embeddings is true but the file stores a {name} that differs from "
                         f"{embed.name} (transformers would use {name}, vLLM and mlx-lm the embedding); set "
                         "tie_word_embeddings to what the checkpoint means")


def _experts(w: Lookup, n: Names, cfg: ModelConfig, i: int):
    """(router, gate_exps, up_exps, down_exps) of MoE layer i: stored per expert, stacked, or as
    transformers 5's fused gate_up (names.ExpertNames)."""
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    x = n.experts
    router = w.matrix(f"{x.router.format(i=i)}.weight", (E, H))
    if x.fused_gate_up and w.has(x.fused_gate_up.format(i=i)):
        fused = w.matrix(x.fused_gate_up.format(i=i), (E, 2 * I, H))
        return (router, expert_views(row_slice(fused, 0, I)), expert_views(row_slice(fused, I, 2 * I)),
                expert_views(w.matrix(x.fused_down.format(i=i), (E, H, I))))
    if "{e}" in x.gate:
        def each(template, shape):
            return [w.matrix(f"{template.format(i=i, e=e)}.weight", shape) for e in range(E)]

        return router, each(x.gate, (I, H)), each(x.up, (I, H)), each(x.down, (H, I))
    return (router, expert_views(w.matrix(f"{x.gate.format(i=i)}.weight", (E, I, H))),
            expert_views(w.matrix(f"{x.up.format(i=i)}.weight", (E, I, H))),
            expert_views(w.matrix(f"{x.down.format(i=i)}.weight", (E, H, I))))


def _split_rows(t: Tensor, sizes: tuple) -> list:
    """A fused matrix's row blocks (q|k|v, gate|up) as views."""
    out, start = [], 0
    for size in sizes:
        out.append(row_slice(t, start, start + size))
        start += size
    return out


def build_weights(w: Lookup, n: Names, cfg: ModelConfig, fix_qk=None) -> ModelWeights:
    """The one place that knows which weights the shared decoder reads and their shapes, from the
    family's names for this file kind (n).

    fix_qk(array, n_heads) -> array, applied to q/k rows and biases (GGUF llama's un-permute), or
    None. Norm weights get the model's norm_offset (less what the file already added) here, once.
    """
    H, V, D = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    fix = fix_qk or (lambda a, heads: a)

    def norm(name: str, size: int) -> np.ndarray:
        return w.vector(name, size, add=cfg.norm_offset - n.norm_shift)

    embed = w.matrix(f"{n.embed}.weight", (V, H))
    if cfg.tie_embeddings:
        output = embed  # the same object: no second copy
        if w.has(f"{n.output}.weight"):
            _check_stored_head(w, f"{n.output}.weight", embed)
    else:
        output = w.matrix(f"{n.output}.weight", (V, H))
    layers = []
    for i, block in enumerate(cfg.blocks):
        def name(template: str, kind: str = "weight") -> str:
            return f"{template.format(i=i)}.{kind}"

        a = block.attention
        if n.fused_qkv:
            q, k, v = _split_rows(w.matrix(name(n.fused_qkv), (cfg.q_dim + 2 * cfg.kv_dim, H)),
                                  (cfg.q_dim, cfg.kv_dim, cfg.kv_dim))
        else:
            q, k, v = (w.matrix(name(n.q), (cfg.q_dim, H)), w.matrix(name(n.k), (cfg.kv_dim, H)),
                       w.matrix(name(n.v), (cfg.kv_dim, H)))
        layer = LayerWeights(
            attn_norm=norm(name(n.attn_norm), H),
            q=fix(q, cfg.num_heads),
            k=fix(k, cfg.num_kv_heads),
            v=v,
            o=w.matrix(name(n.o), (H, cfg.q_dim)),
            ffn_norm=norm(name(n.ffn_norm), H),
        )
        if block.sandwich:
            layer.post_attn_norm = norm(name(n.post_attn_norm), H)
            layer.post_ffn_norm = norm(name(n.post_ffn_norm), H)
        if a.qkv_bias:
            layer.q_bias = fix(w.vector(name(n.q, "bias"), cfg.q_dim), cfg.num_heads)
            layer.k_bias = fix(w.vector(name(n.k, "bias"), cfg.kv_dim), cfg.num_kv_heads)
            layer.v_bias = w.vector(name(n.v, "bias"), cfg.kv_dim)
        if a.o_bias:
            layer.o_bias = w.vector(name(n.o, "bias"), H)
        if a.qk_norm:
            layer.q_norm = norm(name(n.q_norm), D)
            layer.k_norm = norm(name(n.k_norm), D)
        if block.ffn.moe:
            layer.router, layer.gate_exps, layer.up_exps, layer.down_exps = _experts(w, n, cfg, i)
        else:
            I = cfg.intermediate_size
            if n.fused_gate_up:
                layer.gate, layer.up = _split_rows(w.matrix(name(n.fused_gate_up), (2 * I, H)), (I, I))
            else:
                layer.gate = w.matrix(name(n.gate), (I, H))
                layer.up = w.matrix(name(n.up), (I, H))
            layer.down = w.matrix(name(n.down), (H, I))
        layers.append(layer)
    weights = ModelWeights(embed=embed, output=output, final_norm=norm(f"{n.final_norm}.weight", H),
                           layers=layers, vector_names=w.vector_names)
    w.check_no_extra_layers(n.layer_prefix, cfg, n.layer_count_key)
    w.check_all_taken(cfg, n.ignorable)
    return weights
