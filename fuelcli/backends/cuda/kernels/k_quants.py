"""Unit decoders of ggml's K-quants (q2_k, q3_k, q4_k, q5_k, q6_k); layouts and bit drawings in
fuelcli/formats/k_quants.py. Same float operations in the same order as the numpy decode and the
CPU's dequant_row. A unit (UNIT consecutive elements) lies inside one sub-block: one scale.
"""

from numba import cuda, float32, int8, int32

from ....formats import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .common import UNIT, f16_at

L2K, L3K, L4K, L5K, L6K = Q2_K.layout, Q3_K.layout, Q4_K.layout, Q5_K.layout, Q6_K.layout


@cuda.jit(device=True)
def k_scale_min(w8, p, i):
    """Q4_K sub-block i's 6-bit (scale, min) from the 12 scale bytes at w8[p:] (get_scale_min_k4)."""
    if i < 4:
        return int32(w8[p + i]) & 63, int32(w8[p + i + 4]) & 63
    s = (int32(w8[p + i + 4]) & 15) | ((int32(w8[p + i - 4]) >> 6) << 4)
    m = (int32(w8[p + i + 4]) >> 4) | ((int32(w8[p + i]) >> 6) << 4)
    return s, m


@cuda.jit(device=True)
def unpack_q4_k(w8, p, k0, out):
    """qs holds chunks of 2 * sub_elems elements: sub-block 2c in the low nibbles of chunk c's
    sub_elems bytes, sub-block 2c + 1 in the high ones. x = (d * sc) * q - dmin * m."""
    L = L4K
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    s = e // L.sub_elems
    sc, mn = k_scale_min(w8, b + L.scales, s)
    d0 = f16_at(w8, b + L.d) * float32(sc)
    dm0 = f16_at(w8, b + L.dmin) * float32(mn)
    q = b + L.qs + (s // 2) * L.sub_elems + e % L.sub_elems
    shift = 4 * (s % 2)
    for j in range(UNIT):
        out[j] = d0 * float32((int32(w8[q + j]) >> shift) & 15) - dm0


@cuda.jit(device=True)
def unpack_q2_k(w8, p, k0, out):
    """Element e = half * h + 32k + l: q from qs[32h + l] at bits 2k; sub-block s = e // 16 with
    scales[s] (sc the low nibble, m the high one). x = (d * sc) * q - dmin * m."""
    L = L2K
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    sm = int32(w8[b + L.scales + e // L.sub_elems])
    d0 = f16_at(w8, b + L.d) * float32(sm & 15)
    dm0 = f16_at(w8, b + L.dmin) * float32(sm >> 4)
    q = b + L.qs + 32 * (e // L.half) + e % 32
    shift = 2 * ((e % L.half) // 32)
    for j in range(UNIT):
        out[j] = d0 * float32((int32(w8[q + j]) >> shift) & 3) - dm0


@cuda.jit(device=True)
def unpack_q3_k(w8, p, k0, out):
    """Element e = half * h + 32k + l: ql from qs[32h + l] at bits 2k, hbit from hmask[l] at bit
    e // 32; sub-block s = e // 16 with its 6-bit scale. x = (d * (sc - 32)) * ((ql | 4 hbit) - 4)."""
    L = L3K
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    s, g, l0 = e // L.sub_elems, e // 32, e % 32
    lo = (int32(w8[b + L.scales + s % 8]) >> (4 * (s // 8))) & 15
    hi = (int32(w8[b + L.scales + 8 + s % 4]) >> (2 * (s // 4))) & 3
    ds = f16_at(w8, b + L.d) * float32((lo | (hi << 4)) - L.scale_zero)
    q = b + L.qs + 32 * (e // L.half) + l0
    shift = 2 * (g % 4)
    for j in range(UNIT):
        v = ((int32(w8[q + j]) >> shift) & 3) | (((int32(w8[b + L.hmask + l0 + j]) >> g) & 1) << 2)
        out[j] = ds * float32(v - L.zero)


@cuda.jit(device=True)
def unpack_q5_k(w8, p, k0, out):
    """As q4_k, element l of sub-block s with bit s of qh[l] as its 5th bit."""
    L = L5K
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    s = e // L.sub_elems
    sc, mn = k_scale_min(w8, b + L.scales, s)
    d0 = f16_at(w8, b + L.d) * float32(sc)
    dm0 = f16_at(w8, b + L.dmin) * float32(mn)
    q = b + L.qs + (s // 2) * L.sub_elems + e % L.sub_elems
    h = b + L.qh + e % L.sub_elems
    shift = 4 * (s % 2)
    for j in range(UNIT):
        v = ((int32(w8[q + j]) >> shift) & 15) | (((int32(w8[h + j]) >> s) & 1) << 4)
        out[j] = d0 * float32(v) - dm0


@cuda.jit(device=True)
def unpack_q6_k(w8, p, k0, out):
    """Two halves of `half` elements; in half h, element l + quarter * k (l < quarter, k < 4) takes
    its low 4 bits from ql[half/2 * h + l + quarter * (k & 1)] (low nibble for k < 2, high for
    k >= 2) and its top 2 bits from qh[quarter * h + l] at bit 2k. x = (d * scale) * (q - zero)."""
    L = L6K
    quarter = L.half // 4
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    h = e // L.half
    k = (e % L.half) // quarter
    l0 = e % quarter
    ql = b + L.ql + h * (L.half // 2) + l0 + quarter * (k & 1)
    qh = b + L.qh + h * quarter + l0
    lo_shift = 4 * (k >> 1)
    hi_shift = 2 * k
    sub = h * (L.half // L.sub_elems) + 2 * k + l0 // L.sub_elems
    ds = f16_at(w8, b + L.d) * float32(int8(w8[b + L.scales + sub]))
    for j in range(UNIT):
        v = ((int32(w8[ql + j]) >> lo_shift) & 15) | (((int32(w8[qh + j]) >> hi_shift) & 3) << 4)
        out[j] = ds * float32(v - L.zero)
