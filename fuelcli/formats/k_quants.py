"""ggml's K-quants: 256-element super-blocks of sub-blocks with their own scales (ggml-common.h).

q4_k, 144 B: | d f16 | dmin f16 | scales: 12 B | qs: 128 B |
    8 sub-blocks of 32; sub-block i has a 6-bit scale sc_i and a 6-bit min m_i packed in the 12
    scale bytes (get_scale_min_k4: i < 4 -> low 6 bits of bytes i and i+4; i >= 4 -> low/high
    nibble of byte i+4 plus the top 2 bits of bytes i-4 and i). x = (d * sc_i) * q - dmin * m_i.
    qs holds 4 chunks of 32 bytes; chunk c carries sub-block 2c in its low nibbles and 2c+1 in its
    high nibbles.

q5_k, 176 B: | d f16 | dmin f16 | scales: 12 B | qh: 32 B | qs: 128 B |
    q4_k's scales, mins and nibbles, and a 5th bit: element l of sub-block i (l < 32) has it at
    bit i of qh[l]. x = (d * sc_i) * q - dmin * m_i, q 5 bits.

q2_k, 84 B: | scales: 16 B | qs: 64 B | d f16 | dmin f16 |
    16 sub-blocks of 16, x = (d * sc_s) * q - dmin * m_s, q 2 bits: element e = 128h + 32k + l
    (l < 32) takes q from qs[32h + l] at bits 2k (as q3_k's ql); its sub-block is e // 16, whose
    4-bit scale sc_s is the low nibble of scales[s] and its 4-bit min m_s the high nibble.

q3_k, 110 B: | hmask: 32 B | qs: 64 B | scales: 12 B | d f16 |
    16 sub-blocks of 16, x = (d * (sc_s - 32)) * q, q = ql - 4 * (1 - hbit) in -4..3: element
    e = 128h + 32k + l (l < 32) takes ql from qs[32h + l] at bits 2k and hbit from hmask[l] at bit
    e // 32; its sub-block is e // 16. The 6-bit sc_s: low 4 bits from the nibble of scales[s % 8]
    (low for s < 8), top 2 bits from scales[8 + s % 4] at bits 2 * (s // 4).

q6_k, 210 B: | ql: 128 B | qh: 64 B | scales: 16 x int8 | d f16 |
    16 sub-blocks of 16, x = (d * scale_s) * (q - 32), q 6 bits: two halves of 128 elements; in
    half h, element l + 32k (l < 32, k < 4) takes its low 4 bits from ql[64h + l + 32(k & 1)]
    (low nibble for k < 2, high for k >= 2) and its top 2 bits from qh[32h + l] at bit 2k; its
    sub-block is 8h + 2k + l // 16.
"""

from typing import NamedTuple

import numpy as np

from .base import Format, f16_at


class Q4_KLayout(NamedTuple):
    code: int = 7
    block_elems: int = 256
    block_bytes: int = 144
    d: int = 0
    dmin: int = 2
    scales: int = 4
    qs: int = 16
    sub_blocks: int = 8
    sub_elems: int = 32


class Q2_KLayout(NamedTuple):
    code: int = 16
    block_elems: int = 256
    block_bytes: int = 84
    scales: int = 0
    qs: int = 16
    d: int = 80
    dmin: int = 82
    sub_blocks: int = 16
    sub_elems: int = 16
    half: int = 128  # elements per half of qs


class Q3_KLayout(NamedTuple):
    code: int = 11
    block_elems: int = 256
    block_bytes: int = 110
    hmask: int = 0
    qs: int = 32
    scales: int = 96
    d: int = 108
    sub_blocks: int = 16
    sub_elems: int = 16
    half: int = 128  # elements per half of qs
    zero: int = 4  # q = (ql | 4 * hbit) - zero
    scale_zero: int = 32  # the 6-bit scales are stored + 32


class Q5_KLayout(NamedTuple):
    code: int = 10
    block_elems: int = 256
    block_bytes: int = 176
    d: int = 0
    dmin: int = 2
    scales: int = 4
    qh: int = 16
    qs: int = 48
    sub_blocks: int = 8
    sub_elems: int = 32


class Q6_KLayout(NamedTuple):
    code: int = 8
    block_elems: int = 256
    block_bytes: int = 210
    ql: int = 0
    qh: int = 128
    scales: int = 192
    d: int = 208
    sub_blocks: int = 16
    sub_elems: int = 16
    half: int = 128  # elements per half
    zero: int = 32


L2_K, L3_K, L4_K, L5_K, L6_K = Q2_KLayout(), Q3_KLayout(), Q4_KLayout(), Q5_KLayout(), Q6_KLayout()


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 scale bytes (n, 12) -> (scale, min) of the 8 sub-blocks, two (n, 8) uint8."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k_family(b, L):
    """q4_k and q5_k: (d * sc_i) * q - dmin * m_i, q the nibbles (with q5_k's 5th bits)."""
    n = b.shape[0]
    d, dmin = f16_at(b, L.d), f16_at(b, L.dmin)
    sc, mn = k_scale_min(b[:, L.scales : L.scales + 12])
    ds = (d * sc.astype(np.float32)).reshape(n, L.sub_blocks, 1)
    dm = (dmin * mn.astype(np.float32)).reshape(n, L.sub_blocks, 1)
    chunks = L.sub_blocks // 2
    qs = b[:, L.qs :].reshape(n, chunks, 1, L.sub_elems) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, L.sub_blocks, L.sub_elems)
    if hasattr(L, "qh"):
        bits = b[:, L.qh : L.qs].reshape(n, 1, L.sub_elems) >> np.arange(L.sub_blocks, dtype=np.uint8).reshape(1, -1, 1)
        q = q | ((bits & 1) << 4)
    return (ds * q.astype(np.float32) - dm).reshape(n, L.block_elems)


def _q4_k(b):
    return _q4_k_family(b, L4_K)


def _q5_k(b):
    return _q4_k_family(b, L5_K)


def _two_bits(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes -> (n, 256) uint8: the 2-bit fields of q2_k's qs and q3_k's ql, element
    128h + 32k + l from byte 32h + l at bits 2k."""
    n = qs.shape[0]
    return ((qs.reshape(n, 2, 1, 32) >> np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, 256)


def _q2_k(b):
    L, n = L2_K, b.shape[0]
    sc = b[:, L.scales : L.qs]
    dl = (f16_at(b, L.d) * (sc & 0x0F).astype(np.float32)).reshape(n, L.sub_blocks, 1)
    ml = (f16_at(b, L.dmin) * (sc >> 4).astype(np.float32)).reshape(n, L.sub_blocks, 1)
    q = _two_bits(b[:, L.qs : L.d]).reshape(n, L.sub_blocks, L.sub_elems).astype(np.float32)
    return (dl * q - ml).reshape(n, L.block_elems)


def q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes (n, 12) -> the 16 signed sub-block scales sc_s - 32, (n, 16) int8."""
    lo = (scales[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 0x0F
    hi = (scales[:, 8:].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 3
    return (lo | (hi << 4)).astype(np.int8) - np.int8(L3_K.scale_zero)


def _q3_k(b):
    L, n = L3_K, b.shape[0]
    dl = (f16_at(b, L.d) * q3_k_scales(b[:, L.scales : L.d]).astype(np.float32)).reshape(n, L.sub_blocks, 1)
    ql = _two_bits(b[:, L.qs : L.scales])
    hb = ((b[:, L.hmask : L.qs].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1)
    q = (ql | (hb.reshape(n, L.block_elems) << 2)).astype(np.int8) - np.int8(L.zero)
    return (dl * q.reshape(n, L.sub_blocks, L.sub_elems).astype(np.float32)).reshape(n, L.block_elems)


def _q6_k(b):
    L, n = L6_K, b.shape[0]
    ql, qh = b[:, L.ql : L.qh], b[:, L.qh : L.scales]
    ds = (f16_at(b, L.d) * b[:, L.scales : L.d].view(np.int8).astype(np.float32)).reshape(n, L.sub_blocks, 1)
    lo = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    lo = (lo & 0x0F).reshape(n, 2, 4, 32)
    hi = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    hi = (hi & 0x03).reshape(n, 2, 4, 32)
    q = (lo | (hi << 4)).astype(np.int8) - np.int8(L.zero)
    return (ds * q.reshape(n, L.sub_blocks, L.sub_elems).astype(np.float32)).reshape(n, L.block_elems)


Q2_K = Format("q2_k", 10, L2_K, _q2_k)
Q3_K = Format("q3_k", 11, L3_K, _q3_k)
Q4_K = Format("q4_k", 12, L4_K, _q4_k)
Q5_K = Format("q5_k", 13, L5_K, _q5_k)
Q6_K = Format("q6_k", 14, L6_K, _q6_k)
