"""What a weight format is: a name, a dispatch code, ggml's type id, a block and its layout.

`layout` is a NamedTuple of plain ints (the block's size and the byte offset of each field). The
numba CPU kernels and the numba.cuda kernels read it as a module-level constant, so every size and
offset in them comes from here and is folded at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Format:
    name: str
    ggml_type: int  # ggml_type id (ggml.h), as stored in GGUF tensor infos
    layout: tuple  # NamedTuple: code, block_elems, block_bytes, then field offsets
    decode: Callable  # numpy: (n, block_bytes) uint8 -> (n, block_elems) float32

    @property
    def code(self) -> int:
        """The small stable int the kernels dispatch on (its index in the registry)."""
        return self.layout.code

    @property
    def block_elems(self) -> int:
        return self.layout.block_elems

    @property
    def block_bytes(self) -> int:
        return self.layout.block_bytes

    @property
    def f16_fields(self) -> tuple[int, ...]:
        """Byte offsets in a block of its f16 scales: the layout fields d, dmin and m."""
        return tuple(getattr(self.layout, n) for n in ("d", "dmin", "m") if hasattr(self.layout, n))


def f16_at(blocks, offset: int):
    """(n, block_bytes) uint8 -> (n, 1) float32: the little-endian f16 at `offset` of each block."""
    import numpy as np

    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16).astype(np.float32)


def nibbles(qs):
    """(n, k) packed bytes -> (n, 2k) uint8: low nibbles are elements 0..k-1, high nibbles k..2k-1."""
    import numpy as np

    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
