"""ggml's 32-element block formats (ggml-common.h): one f16 scale (and a min for q4_1) per block.

    q8_0  34 B   | d f16 | qs: 32 x int8                          x = d * q
    q4_0  18 B   | d f16 | qs: 16 B, 2 nibbles each               x = d * (q - 8)
    q4_1  20 B   | d f16 | m f16 | qs: 16 B                       x = d * q + m
    q5_0  22 B   | d f16 | qh: u32, bit j = 5th bit of element j | qs: 16 B    x = d * (q - 16)
    q5_1  24 B   | d f16 | m f16 | qh: u32 | qs: 16 B               x = d * q + m

Nibbles: byte j of qs holds element j in its low nibble and element j + 16 in its high nibble.
The numpy decoders repeat ggml's float operations in ggml's order (f32 rounding depends on it),
so they equal gguf.quants.dequantize bit for bit.
"""

from typing import NamedTuple

import numpy as np

from .base import Format, f16_at, nibbles


class Q8_0Layout(NamedTuple):
    code: int = 3
    block_elems: int = 32
    block_bytes: int = 34
    d: int = 0
    qs: int = 2


class Q4_0Layout(NamedTuple):
    code: int = 4
    block_elems: int = 32
    block_bytes: int = 18
    d: int = 0
    qs: int = 2
    zero: int = 8  # q - zero


class Q4_1Layout(NamedTuple):
    code: int = 5
    block_elems: int = 32
    block_bytes: int = 20
    d: int = 0
    m: int = 2
    qs: int = 4


class Q5_0Layout(NamedTuple):
    code: int = 6
    block_elems: int = 32
    block_bytes: int = 22
    d: int = 0
    qh: int = 2
    qs: int = 6
    zero: int = 16


class Q5_1Layout(NamedTuple):
    code: int = 9
    block_elems: int = 32
    block_bytes: int = 24
    d: int = 0
    m: int = 2
    qh: int = 4
    qs: int = 8


L8_0, L4_0, L4_1, L5_0, L5_1 = Q8_0Layout(), Q4_0Layout(), Q4_1Layout(), Q5_0Layout(), Q5_1Layout()


def _q8_0(b):
    L = L8_0
    return b[:, L.qs :].view(np.int8).astype(np.float32) * f16_at(b, L.d)


def _q4_0(b):
    L = L4_0
    q = nibbles(b[:, L.qs :]).astype(np.int8) - np.int8(L.zero)
    return f16_at(b, L.d) * q.astype(np.float32)


def _q4_1(b):
    L = L4_1
    return f16_at(b, L.d) * nibbles(b[:, L.qs :]).astype(np.float32) + f16_at(b, L.m)


def _five_bits(b, L):
    """(n, 32) uint8: the nibbles with the 5th bits of qh (bit j: element j)."""
    qh = np.ascontiguousarray(b[:, L.qh : L.qh + 4]).view(np.uint32)
    hi = ((qh >> np.arange(L.block_elems, dtype=np.uint32)) & 1).astype(np.uint8)
    return nibbles(b[:, L.qs :]) | (hi << 4)


def _q5_0(b):
    L = L5_0
    q = _five_bits(b, L).astype(np.int8) - np.int8(L.zero)
    return f16_at(b, L.d) * q.astype(np.float32)


def _q5_1(b):
    L = L5_1
    return f16_at(b, L.d) * _five_bits(b, L).astype(np.float32) + f16_at(b, L.m)


Q8_0 = Format("q8_0", 8, L8_0, _q8_0)
Q4_0 = Format("q4_0", 2, L4_0, _q4_0)
Q4_1 = Format("q4_1", 3, L4_1, _q4_1)
Q5_0 = Format("q5_0", 6, L5_0, _q5_0)
Q5_1 = Format("q5_1", 7, L5_1, _q5_1)
