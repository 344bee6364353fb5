"""The CPU engine's per-layer geometry (Gemma 4): forward.lay's per-layer columns, the KV cache laid out
layer by layer at each layer's own size (layer_kv.py), a RoPE table per (RoPE, head_dim) and an
attention kernel per head_dim. A layer that shares another's K/V keeps none of its own: the cache
holds only the layers that store K/V.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...model.rope import cos_sin
from ..kv_cache import CACHE_TYPES
from .attention import KEY_BLOCK


def per_layer(cfg) -> bool:
    """Whether some attention layer has its own head_dim or KV heads, or shares another's K/V."""
    return any(b.linear is None and (b.attention.head_dim or b.attention.kv_heads or b.attention.kv_from is not None)
               for b in cfg.blocks)


def widest(cfg):
    """The config with the largest head_dim, KV width and FFN width of its layers (the activations'
    sizes)."""
    layers = [cfg.at(b) for b in cfg.blocks]
    hd = max(c.head_dim for c in layers)
    kv = max(c.kv_dim for c in layers)
    return replace(cfg, head_dim=hd, num_kv_heads=-(-kv // hd),
                   intermediate_size=max(c.intermediate_size for c in layers))


class LayerKV:
    """K and V of every layer that stores them, one layer after the other, each [slots, its size]
    (the arrays keep KVCache's ranks, so the forward compiled for one serves both)."""

    def __init__(self, k_values: int, v_values: int, cache_type: str = "f32"):
        dtype = np.uint16 if cache_type == "f16" else np.float32
        self.cache_type = cache_type
        self.k = np.zeros((1, 1, k_values // KEY_BLOCK, 1, 1, KEY_BLOCK), dtype)
        self.v = np.zeros((1, 1, v_values, 1, 1), dtype)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def values(self, a: np.ndarray) -> np.ndarray:
        return a.view(CACHE_TYPES[self.cache_type])


def fill(lay: np.ndarray, cfg, n_ctx: int, slots: int, F, ones: int) -> tuple[int, int]:
    """lay's per-layer columns (forward.L_HD ..); ones: the vector of ones a v norm takes. Returns the
    K and V values the cache holds."""
    B = KEY_BLOCK
    blocks = -(-n_ctx // B)
    lay[:, F.L_VNORM] = -1
    koff = voff = 0
    own = {}
    for l, b in enumerate(cfg.blocks):
        c = cfg.at(b)
        lay[l, F.L_HD], lay[l, F.L_NKV], lay[l, F.L_WIDTH] = c.head_dim, c.num_kv_heads, c.intermediate_size
        lay[l, F.L_MOE_BESIDE] = b.ffn.moe_beside
        if b.linear is not None:
            continue
        a = b.attention
        lay[l, F.L_VNORM] = ones if a.v_norm else -1
        lay[l, F.L_VISK] = a.v_is_k
        lay[l, F.L_SHARED] = a.kv_from is not None
        if a.scale is not None and c.head_dim != cfg.head_dim:  # the layer's kernel divides by its sqrt(head_dim)
            scale = np.float32(a.scale * np.sqrt(c.head_dim))
            lay[l, F.L_QSCALE] = 0 if scale == 1 else int(scale.view(np.int32))
        if a.kv_from is None:
            kslot, vslot = blocks * B * c.kv_dim, n_ctx * c.kv_dim
            own[l] = (koff, voff, kslot, vslot)
            koff, voff = koff + slots * kslot, voff + slots * vslot
        lay[l, F.L_KOFF:F.L_VSLOT + 1] = own[l if a.kv_from is None else a.kv_from]
    return koff, voff


def follow_blocks(mat_idx: np.ndarray, vec_idx: np.ndarray, cfg, F) -> None:
    """A layer whose block does not use its per-layer input or its scalar runs without them, even
    where the weights hold them (the blocks say what runs)."""
    for l, b in enumerate(cfg.blocks):
        if not b.per_layer_input:
            mat_idx[l, F.M_PLG] = -1
        if not b.layer_scalar:
            vec_idx[l, F.V_LSCALAR] = -1


def rope_tables(cfg, n_ctx: int, lay: np.ndarray, F) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [tables, n_ctx, largest head_dim / 2], one table per (RoPE, head_dim) of the layers,
    each laid out [n_ctx, its head_dim / 2] from the table's start (the RoPE kernel reads it at the
    layer's head_dim); lay's L_ROPE column points each layer at its own."""
    keys, hds = {}, []
    for l, b in enumerate(cfg.blocks):
        if b.linear is None and b.attention.rope is not None:
            key = (b.attention.rope, cfg.at(b).head_dim)
            lay[l, F.L_ROPE] = keys.setdefault(key, len(keys))
            hds.append(key[1])
    half = max(hds or [cfg.head_dim]) // 2
    cos, sin = (np.zeros((max(len(keys), 1), n_ctx, half), np.float32) for _ in range(2))
    for (rope, hd), i in keys.items():
        c, s = cos_sin(rope, hd, n_ctx)
        cos[i].reshape(-1)[:c.size], sin[i].reshape(-1)[:s.size] = c.reshape(-1), s.reshape(-1)
    return cos, sin


def attention_kernels(lay: np.ndarray, cfg, F, table) -> list:
    """Each layer whose head_dim is not the model's gets the attention and combine kernels compiled
    for its own (table(head_dim): a core table); returns the tables (their kernels must stay loaded)."""
    from .matmul import C_ATTENTION, C_COMBINE

    tables = {}
    for l, b in enumerate(cfg.blocks):
        hd = int(lay[l, F.L_HD])
        if b.linear is None and hd != cfg.head_dim:
            t = tables.setdefault(hd, table(hd))
            lay[l, F.L_ATT], lay[l, F.L_COMB] = t[C_ATTENTION], t[C_COMBINE]
    return list(tables.values())
