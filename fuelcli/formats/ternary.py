"""ggml's ternary types (BitNet b1.58, TriLMs; ggml-common.h): 256 elements of q in {0, 1, 2},
x = d * (q - 1), one f16 scale a block.

tq2_0, 66 B: | qs: 64 B | d f16 |
    q 2 bits: element e = 128h + 32k + l (l < 32) at bits 2k of qs[32h + l] (q2_k's order).

tq1_0, 54 B: | qs: 48 B | qh: 4 B | d f16 |
    q a base-3 digit: a byte b holds 5 (qs) or 4 (qh) digits as the fraction b / 256; digit m is
    ((b * 3^m mod 256) * 3) >> 8. Element 32m + l (l < 32) is digit m of qs[l], element
    160 + 16m + l (l < 16) digit m of qs[32 + l], element 240 + 4m + l (l < 4) digit m of qh[l].

The numpy decoders repeat gguf-py's integer and float operations in its order (bit-exact).
"""

from typing import NamedTuple

import numpy as np

from .base import Format, f16_at

POW3 = (1, 3, 9, 27, 81)  # the multipliers of a byte's base-3 digits


class TQ2_0Layout(NamedTuple):
    code: int = 22
    block_elems: int = 256
    block_bytes: int = 66
    qs: int = 0
    d: int = 64
    sub_blocks: int = 8
    sub_elems: int = 32


class TQ1_0Layout(NamedTuple):
    code: int = 23
    block_elems: int = 256
    block_bytes: int = 54
    qs: int = 0  # 48 B: 32 of 5 digits (elements 0..159), 16 of 5 (160..239)
    qh: int = 48  # 4 B of 4 digits (240..255)
    d: int = 52
    sub_blocks: int = 8
    sub_elems: int = 32


LTQ2_0, LTQ1_0 = TQ2_0Layout(), TQ1_0Layout()
_P3 = np.array(POW3, np.uint8)


def _tq2_0(b):
    L, n = LTQ2_0, b.shape[0]
    q = b[:, L.qs : L.d].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = (q & 3).reshape(n, L.block_elems).astype(np.int8) - np.int8(1)
    return f16_at(b, L.d) * q.astype(np.float32)


def _tq1_0(b):
    L, n = LTQ1_0, b.shape[0]
    qs0 = (b[:, L.qs : L.qs + 32].reshape(n, 1, 32) * _P3.reshape(1, 5, 1)).reshape(n, 160)
    qs1 = (b[:, L.qs + 32 : L.qh].reshape(n, 1, 16) * _P3.reshape(1, 5, 1)).reshape(n, 80)
    qh = (b[:, L.qh : L.d].reshape(n, 1, 4) * _P3[:4].reshape(1, 4, 1)).reshape(n, 16)
    q = np.concatenate([qs0, qs1, qh], axis=-1)
    q = ((q.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)
    return f16_at(b, L.d) * q.astype(np.float32)


TQ2_0 = Format("tq2_0", 35, LTQ2_0, _tq2_0)
TQ1_0 = Format("tq1_0", 34, LTQ1_0, _tq1_0)
