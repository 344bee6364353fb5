"""The forward's per-layer attention geometry (Gemma 4): each layer's head_dim and KV heads, where
its K and V lie in the cache (matmul.attention takes the kernel compiled for its head_dim).

The cache is one flat run of memory read through lay's columns (forward.L_*): a layer's K of slot s
begins kv_off[K] + s * kv_slot[K] values in (V likewise), so layers of different sizes lie one after
the other, and a layer that shares another's K/V (Attention.kv_from) has that layer's offsets.
engine_layers.py fills the columns; for a model of one geometry they give KVCache's own layout.
"""

import numpy as np

from .jit import helper


@helper()
def rows_of(buf, T, n):
    """The first T rows of n values of a 2D buffer's memory, as a C-contiguous [T, n] view."""
    return buf.reshape(-1)[:T * n].reshape(T, n)


@helper()
def kv_at(k_cache, v_cache, koff, voff, kslot, vslot, slot):
    """The layer's K and V of the slot (flat views: the kernels take their addresses)."""
    k, v = k_cache.reshape(-1), v_cache.reshape(-1)
    k0, v0 = koff + slot * kslot, voff + slot * vslot
    return k[k0:k0 + kslot], v[v0:v0 + vslot]


@helper()
def copy_rows(dst, src):
    for t in range(src.shape[0]):
        for i in range(src.shape[1]):
            dst[t, i] = src[t, i]


@helper()
def scale_by(x, s):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] *= s


@helper()
def add_rows(x, y):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += y[t, i]


@helper()
def per_layer_rows(rows, proj, scale_own, out):
    """Gemma 4's per-layer inputs into out [L, T, P]: (proj + rows * scale_own) / sqrt(2), rows and
    proj [T, L * P] (proj already normed per layer)."""
    L, T, P = out.shape[0], out.shape[1], out.shape[2]
    r2 = np.float32(2 ** -0.5)
    for t in range(T):
        for l in range(L):
            for i in range(P):
                out[l, t, i] = (proj[t, l * P + i] + rows[t, l * P + i] * scale_own) * r2
