"""ggml's non-linear 4-bit i-quants (ggml-common.h): each 4-bit index picks one of 16 int8 values.

    iq4_nl  18 B  | d f16 | qs: 16 B |                                   x = d * KVALUES[q]
    iq4_xs 136 B  | d f16 | scales_h u16 | scales_l: 4 B | qs: 128 B |  x = (d * (ls_i - 32)) * KVALUES[q]

Nibbles as the legacy formats': byte j of a 32-element group's 16 bytes holds element j in its low
nibble and element j + 16 in its high one (iq4_xs: group i at qs[16i ..]). iq4_xs's 6-bit ls_i of
group i: the nibble i % 2 of scales_l[i // 2], then bits 2i..2i+1 of scales_h as its top 2 bits.
The numpy decoders repeat gguf-py's float operations in its order (bit-exact).
"""

from typing import NamedTuple

import numpy as np

from .base import Format, f16_at, nibbles

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # kvalues_iq4nl
_KV = np.array(KVALUES, np.int8)


class IQ4_NLLayout(NamedTuple):
    code: int = 12
    block_elems: int = 32
    block_bytes: int = 18
    d: int = 0
    qs: int = 2


class IQ4_XSLayout(NamedTuple):
    code: int = 13
    block_elems: int = 256
    block_bytes: int = 136
    d: int = 0
    scales_h: int = 2
    scales_l: int = 4
    qs: int = 8
    sub_blocks: int = 8
    sub_elems: int = 32
    scale_zero: int = 32  # the 6-bit scales are stored + 32


LIQ4_NL, LIQ4_XS = IQ4_NLLayout(), IQ4_XSLayout()


def _iq4_nl(b):
    L = LIQ4_NL
    return f16_at(b, L.d) * _KV[nibbles(b[:, L.qs :])].astype(np.float32)


def iq4_xs_scales(b) -> np.ndarray:
    """(n, 136) iq4_xs blocks -> (n, 8) int8: each group's ls_i - 32."""
    L = LIQ4_XS
    lo = (b[:, L.scales_l : L.qs].reshape(-1, 4, 1) >> np.array([0, 4], np.uint8).reshape(1, 1, 2)).reshape(-1, 8) & 15
    sh = np.ascontiguousarray(b[:, L.scales_h : L.scales_l]).view(np.uint16)
    hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
    return (lo | (hi << 4)).astype(np.int8) - np.int8(L.scale_zero)


def _iq4_xs(b):
    L, n = LIQ4_XS, b.shape[0]
    dl = (f16_at(b, L.d) * iq4_xs_scales(b).astype(np.float32)).reshape(n, L.sub_blocks, 1)
    q = nibbles(b[:, L.qs :].reshape(n * L.sub_blocks, 16)).reshape(n, L.sub_blocks, L.sub_elems)
    return (dl * _KV[q].astype(np.float32)).reshape(n, L.block_elems)


IQ4_NL = Format("iq4_nl", 20, LIQ4_NL, _iq4_nl)
IQ4_XS = Format("iq4_xs", 23, LIQ4_XS, _iq4_xs)
