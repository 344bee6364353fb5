"""The KV cache: K and V of every layer at every position, [layers, n_ctx, kv_heads, head_dim].

One object per engine; the backend decides where the arrays live (host numpy, device memory) and
how K is laid out: key_block b > 0 keeps K in blocks of b positions, each [kv_heads, head_dim, b]
(the positions in the last axis: the CPU attention's scores take b keys per vector), so K is
[layers, ceil(n_ctx / b), kv_heads, head_dim, b]; 0 keeps it like V.
Positions past the engine's `pos` hold stale values that the next forward overwrites.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, n_layers: int, n_ctx: int, n_kv_heads: int, head_dim: int, alloc=np.zeros,
                 key_block: int = 0):
        self.shape = (n_layers, n_ctx, n_kv_heads, head_dim)
        self.key_block = key_block
        self.k_shape = ((n_layers, -(-n_ctx // key_block), n_kv_heads, head_dim, key_block) if key_block
                        else self.shape)
        self.k = alloc(self.k_shape, np.float32)
        self.v = alloc(self.shape, np.float32)

    @property
    def n_ctx(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return (int(np.prod(self.k_shape)) + int(np.prod(self.shape))) * np.dtype(np.float32).itemsize
