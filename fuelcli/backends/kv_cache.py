"""The KV cache: K and V of every layer at every position, [layers, n_ctx, kv_heads, head_dim], and
with `slots` (several sequences, each its own n_ctx positions) [layers, slots, n_ctx, ...].

One object per engine; the backend decides where the arrays live (host numpy, device memory) and
how K is laid out: key_block b > 0 keeps K in blocks of b positions, each [kv_heads, head_dim, b]
(the positions in the last axis: the CPU attention's scores take b keys per vector), so K is
[layers, (slots,) ceil(n_ctx / b), kv_heads, head_dim, b]; 0 keeps it like V. slots = 0: no slot
axis (the CUDA engine's single sequence); the CPU engine always has it (1 for one sequence).
Positions past the engine's `pos` hold stale values that the next forward overwrites.
The values are float32, or float16 (`--cache-type f16`, as llama.cpp's default cache: half the
memory and the bytes a decode step reads, each K and V value rounded once), held as their uint16
bits (numba takes no float16 arrays; `values` views them as float16).
"""

from __future__ import annotations

import numpy as np

CACHE_TYPES = {"f32": np.float32, "f16": np.float16}  # the values
_STORED = {"f32": np.float32, "f16": np.uint16}  # the arrays' dtype


class KVCache:
    def __init__(self, n_layers: int, n_ctx: int, n_kv_heads: int, head_dim: int, alloc=np.zeros,
                 key_block: int = 0, cache_type: str = "f32", slots: int = 0):
        lead = (n_layers, slots) if slots else (n_layers,)
        self.shape = (*lead, n_ctx, n_kv_heads, head_dim)
        self.key_block = key_block
        self.k_shape = ((*lead, -(-n_ctx // key_block), n_kv_heads, head_dim, key_block) if key_block
                        else self.shape)
        self.cache_type = cache_type
        self.k = alloc(self.k_shape, _STORED[cache_type])
        self.v = alloc(self.shape, _STORED[cache_type])

    @property
    def n_ctx(self) -> int:
        """Positions per sequence."""
        return self.shape[-3]

    @property
    def nbytes(self) -> int:
        return (int(np.prod(self.k_shape)) + int(np.prod(self.shape))) * np.dtype(_STORED[self.cache_type]).itemsize

    def values(self, a: np.ndarray) -> np.ndarray:
        """self.k or self.v (or a part) as its values."""
        return a.view(CACHE_TYPES[self.cache_type])
