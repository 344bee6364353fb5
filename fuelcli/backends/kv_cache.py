"""The KV cache: K and V of every layer at every position, [layers, n_ctx, kv_heads, head_dim].

One object per engine; the backend decides where the arrays live (host numpy, device memory).
Positions past the engine's `pos` hold stale values that the next forward overwrites.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, n_layers: int, n_ctx: int, n_kv_heads: int, head_dim: int, alloc=np.zeros):
        self.shape = (n_layers, n_ctx, n_kv_heads, head_dim)
        self.k = alloc(self.shape, np.float32)
        self.v = alloc(self.shape, np.float32)

    @property
    def n_ctx(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * int(np.prod(self.shape)) * np.dtype(np.float32).itemsize
