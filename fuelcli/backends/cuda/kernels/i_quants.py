"""Unit decoders of ggml's i-quants (iq4_nl, iq4_xs, iq3_xxs, iq3_s, iq2_xxs, iq2_xs, iq2_s, iq1_s,
iq1_m) and mxfp4; layouts in
fuelcli/formats/i_quants.py, tables in i_quants.py and iq_grids.py. Same float operations in the
same order as the numpy decode (a sign flip of a product is exact)."""

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from ....formats import IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4
from ....formats.i_quants import IQ1S_DELTA, KVALUES, KVALUES_MXFP4
from ....formats.iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS
from .common import UNIT, f16_at, f16_bits

LIQ4NL, LIQ4XS, LIQ3XXS, LIQ3S = IQ4_NL.layout, IQ4_XS.layout, IQ3_XXS.layout, IQ3_S.layout
LIQ2XXS, LIQ2XS, LIQ2S = IQ2_XXS.layout, IQ2_XS.layout, IQ2_S.layout
LIQ1S, LIQ1M, LMXFP4 = IQ1_S.layout, IQ1_M.layout, MXFP4.layout
# global arrays: constants of the kernels
KV, KVM = np.array(KVALUES, np.int32), np.array(KVALUES_MXFP4, np.int32)
G3XXS, G3S, KS = np.array(IQ3XXS_GRID, np.uint32), np.array(IQ3S_GRID, np.uint32), np.array(KSIGNS, np.int32)
G2XXS, G2XS, G2S = (np.array(g, np.uint64) for g in (IQ2XXS_GRID, IQ2XS_GRID, IQ2S_GRID))
G1S = np.array(IQ1S_GRID, np.uint64)


@cuda.jit(device=True)
def unpack_iq4_nl(w8, p, k0, out):
    L = LIQ4NL
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))
    q = b + L.qs + j0 % (L.block_elems // 2)
    d = f16_at(w8, b + L.d)
    for j in range(UNIT):
        out[j] = d * float32(KV[(int32(w8[q + j]) >> shift) & 15])


@cuda.jit(device=True)
def unpack_iq4_xs(w8, p, k0, out):
    L = LIQ4XS
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    i = e // L.sub_elems
    lo = (int32(w8[b + L.scales_l + i // 2]) >> (4 * (i % 2))) & 15
    sh = int32(w8[b + L.scales_h]) | (int32(w8[b + L.scales_h + 1]) << 8)
    ls = lo | (((sh >> (2 * i)) & 3) << 4)
    dl = f16_at(w8, b + L.d) * float32(ls - L.scale_zero)
    j0 = e % L.sub_elems
    shift = 4 * (j0 // (L.sub_elems // 2))
    q = b + L.qs + 16 * i + j0 % (L.sub_elems // 2)
    for j in range(UNIT):
        out[j] = dl * float32(KV[(int32(w8[q + j]) >> shift) & 15])


@cuda.jit(device=True)
def unpack_iq3_xxs(w8, p, k0, out):
    L = LIQ3XXS
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    a = b + L.aux + 4 * (e // L.sub_elems)
    aux = uint32(w8[a]) | (uint32(w8[a + 1]) << 8) | (uint32(w8[a + 2]) << 16) | (uint32(w8[a + 3]) << 24)
    db = (f16_at(w8, b + L.d) * (float32(0.5) + float32(aux >> 28))) * float32(0.5)
    sgn = KS[(aux >> uint32(7 * ((e % L.sub_elems) // 8))) & uint32(127)]
    for j in range(UNIT):
        m = (G3XXS[w8[b + L.qs + (e + j) // 4]] >> uint32(8 * ((e + j) % 4))) & uint32(255)
        v = db * float32(m)
        out[j] = -v if (sgn >> j) & 1 else v


@cuda.jit(device=True)
def unpack_iq3_s(w8, p, k0, out):
    L = LIQ3S
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    i = e // L.sub_elems
    ls = (int32(w8[b + L.scales + i // 2]) >> (4 * (i % 2))) & 15
    db = f16_at(w8, b + L.d) * float32(1 + 2 * ls)
    qh = int32(w8[b + L.qh + i])
    sgn = int32(w8[b + L.signs + e // 8])
    for j in range(UNIT):
        t = (e + j) // 4  # the grid entry in the block
        idx = int32(w8[b + L.qs + t]) | (((qh >> (t % 8)) & 1) << 8)
        m = (G3S[idx] >> uint32(8 * ((e + j) % 4))) & uint32(255)
        v = db * float32(m)
        out[j] = -v if (sgn >> j) & 1 else v


@cuda.jit(device=True)
def unpack_iq2_xxs(w8, p, k0, out):
    """UNIT = 8 elements: one grid entry."""
    L = LIQ2XXS
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    g = b + L.qs + 8 * (e // L.sub_elems)  # the group's 4 indices, then its aux
    aux = uint32(w8[g + 4]) | (uint32(w8[g + 5]) << 8) | (uint32(w8[g + 6]) << 16) | (uint32(w8[g + 7]) << 24)
    db = (f16_at(w8, b + L.d) * (float32(0.5) + float32(aux >> 28))) * float32(0.25)
    k = (e % L.sub_elems) // 8
    sgn = KS[(aux >> uint32(7 * k)) & uint32(127)]
    entry = G2XXS[w8[g + k]]
    for j in range(UNIT):
        v = db * float32((entry >> uint64(8 * j)) & uint64(255))
        out[j] = -v if (sgn >> j) & 1 else v


@cuda.jit(device=True)
def _iq2_scale(w8, b, L, t):
    """d * (0.5 + ls) * 0.25 of grid entry t's 16 elements (iq2_xs, iq2_s)."""
    ls = (int32(w8[b + L.scales + t // 4]) >> (4 * ((t // 2) % 2))) & 15
    return (f16_at(w8, b + L.d) * (float32(0.5) + float32(ls))) * float32(0.25)


@cuda.jit(device=True)
def unpack_iq2_xs(w8, p, k0, out):
    """UNIT = 8 elements: grid entry t, u16 q = qs[t]: index q & 511, KSIGNS[q >> 9]."""
    L = LIQ2XS
    b = p + (k0 // L.block_elems) * L.block_bytes
    t = (k0 % L.block_elems) // 8
    q = int32(w8[b + L.qs + 2 * t]) | (int32(w8[b + L.qs + 2 * t + 1]) << 8)
    db = _iq2_scale(w8, b, L, t)
    sgn = KS[q >> 9]
    entry = G2XS[q & 511]
    for j in range(UNIT):
        v = db * float32((entry >> uint64(8 * j)) & uint64(255))
        out[j] = -v if (sgn >> j) & 1 else v


@cuda.jit(device=True)
def unpack_iq2_s(w8, p, k0, out):
    """UNIT = 8 elements: grid entry t, index qs[t] | 2 bits of qh[t // 4] << 8, signs[t]."""
    L = LIQ2S
    b = p + (k0 // L.block_elems) * L.block_bytes
    t = (k0 % L.block_elems) // 8
    hi = (int32(w8[b + L.qh + t // 4]) >> (2 * (t % 4))) & 3
    db = _iq2_scale(w8, b, L, t)
    sgn = int32(w8[b + L.signs + t])
    entry = G2S[int32(w8[b + L.qs + t]) | (hi << 8)]
    for j in range(UNIT):
        v = db * float32((entry >> uint64(8 * j)) & uint64(255))
        out[j] = -v if (sgn >> j) & 1 else v


@cuda.jit(device=True)
def _iq1(entry, dl, neg, out):
    """out[j] = dl * (grid byte j (int8) + delta) of an iq1s_grid entry."""
    delta = -float32(IQ1S_DELTA) if neg else float32(IQ1S_DELTA)
    for j in range(UNIT):
        g = int32((entry >> uint64(8 * j)) & uint64(255))
        out[j] = dl * (float32(g - 256 if g >= 128 else g) + delta)


@cuda.jit(device=True)
def unpack_iq1_s(w8, p, k0, out):
    """UNIT = 8 elements: grid entry t = 4i + k of group i, qh[i]'s 3 bits at 3k, ls_i, delta."""
    L = LIQ1S
    b = p + (k0 // L.block_elems) * L.block_bytes
    t = (k0 % L.block_elems) // 8
    i = t // 4
    qh = int32(w8[b + L.qh + 2 * i]) | (int32(w8[b + L.qh + 2 * i + 1]) << 8)
    dl = f16_at(w8, b + L.d) * float32(2 * ((qh >> 12) & 7) + 1)
    _iq1(G1S[int32(w8[b + L.qs + t]) | (((qh >> (3 * (t % 4))) & 7) << 8)], dl, (qh & 0x8000) != 0, out)


@cuda.jit(device=True)
def unpack_iq1_m(w8, p, k0, out):
    """UNIT = 8 elements: grid entry t, the nibble t % 2 of qh[t // 2], ls of its 16 elements, d from
    the scale words' top nibbles."""
    L = LIQ1M
    b = p + (k0 // L.block_elems) * L.block_bytes
    t = (k0 % L.block_elems) // 8
    dbits = 0
    for k in range(4):
        dbits |= (int32(w8[b + L.scales + 2 * k + 1]) >> 4) << (4 * k)
    s = t // 2
    w = int32(w8[b + L.scales + 2 * (s // 4)]) | (int32(w8[b + L.scales + 2 * (s // 4) + 1]) << 8)
    dl = f16_bits(dbits) * float32(2 * ((w >> (3 * (s % 4))) & 7) + 1)
    nib = (int32(w8[b + L.qh + t // 2]) >> (4 * (t % 2))) & 15
    _iq1(G1S[int32(w8[b + L.qs + t]) | ((nib & 7) << 8)], dl, (nib & 8) != 0, out)


@cuda.jit(device=True)
def _e8m0_half(e):
    """2^(e - 128) as ggml's GGML_E8M0_TO_FP32_HALF builds its bits (e < 2: subnormals)."""
    a = cuda.local.array(1, uint32)
    a[0] = uint32(0x00200000) << uint32(e) if e < 2 else uint32(e - 1) << uint32(23)
    return a.view(np.float32)[0]


@cuda.jit(device=True)
def unpack_mxfp4(w8, p, k0, out):
    L = LMXFP4
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))
    q = b + L.qs + j0 % (L.block_elems // 2)
    d = _e8m0_half(int32(w8[b + L.e]))
    for j in range(UNIT):
        out[j] = d * float32(KVM[(int32(w8[q + j]) >> shift) & 15])
