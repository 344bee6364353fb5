"""ggml's i-quants (ggml-common.h): a 4-bit index picks one of 16 int8 values (iq4), an 8- or
9-bit index picks 4 magnitudes of a grid (iq3), an 8- to 10-bit index 8 of them (iq2), with a sign
per element, or an 11-bit index 8 values of -1, 0, 1 (iq1), shifted by +-1/8 (grids in iq_grids.py).
Beside them MXFP4, stored as iq4_nl is (a 4-bit index into 16 int8 values, kvalues_mxfp4: FP4 E2M1
doubled) with a power-of-two scale from an E8M0 byte (halved, as ggml's GGML_E8M0_TO_FP32_HALF).

    iq4_nl  18 B  | d f16 | qs: 16 B |                                   x = d * KVALUES[q]
    mxfp4   17 B  | e u8  | qs: 16 B |                      x = e8m0_half(e) * KVALUES_MXFP4[q]
    iq4_xs 136 B  | d f16 | scales_h u16 | scales_l: 4 B | qs: 128 B |  x = (d * (ls_i - 32)) * KVALUES[q]
    iq3_xxs 98 B  | d f16 | qs: 64 B | aux: 8 x u32 |      x = (d * (0.5 + ls_i) * 0.5) * grid * sign
    iq3_s  110 B  | d f16 | qs: 64 B | qh: 8 B | signs: 32 B | scales: 4 B |   x = (d * (1 + 2 ls_i)) * grid * sign
    iq2_xxs 66 B  | d f16 | 8 x (idx: 4 B, aux: u32) |      x = (d * (0.5 + ls_i) * 0.25) * grid * sign
    iq2_xs  74 B  | d f16 | qs: 32 x u16 | scales: 8 B |    x = (d * (0.5 + ls_s) * 0.25) * grid * sign
    iq2_s   82 B  | d f16 | qs: 32 B | signs: 32 B | qh: 8 B | scales: 8 B |   (as iq2_xs)
    iq1_s   50 B  | d f16 | qs: 32 B | qh: 8 x u16 |          x = (d * (2 ls_i + 1)) * (grid + delta_i)
    iq1_m   56 B  | qs: 32 B | qh: 16 B | scales: 4 x u16 |   x = (d * (2 ls_s + 1)) * (grid + delta_t)

iq3: element e of a block is byte e % 4 of grid entry e // 4 (iq3_xxs: index qs[e // 4]; iq3_s:
qs[e // 4] plus bit (e // 4) % 8 of qh[e // 32] as its 9th bit); group i = elements 32i .. 32i + 31.
iq3_xxs's aux u32 of group i: ls_i in its top 4 bits, and 4 x 7 bits (bits 7k ..) whose KSIGNS entry
gives the signs of elements 8k .. 8k + 7 of the group (bit j: element 8k + j negative). iq3_s: bit
e % 8 of signs[e // 8] makes element e negative; ls_i the nibble i % 2 of scales[i // 2].
iq2_xxs: group i is 8 bytes from qs; element 8k + j of the group is byte j of grid entry idx[k], its
sign and ls_i from aux as iq3_xxs's. iq2_xs and iq2_s: element e is byte e % 8 of grid entry t = e // 8,
with a scale per 16 elements: ls_s of sub-block s = e // 16 the nibble s % 2 of scales[s // 2];
iq2_xs's u16 qs[t] holds the entry's 9-bit index and (bits 9..15) the KSIGNS index of its signs;
iq2_s's index is qs[t] plus bits 2(t % 4) .. of qh[t // 4] as bits 8-9, bit j of signs[t] the sign
of element 8t + j.
iq1: element e is byte e % 8 (int8) of grid entry t = e // 8, index qs[t] plus 3 more bits as bits
8-10; delta = +IQ1S_DELTA, or -IQ1S_DELTA where its sign bit is set. iq1_s: u16 qh[i] of group i
holds the bits of entry 4i + k at 3k, ls_i at bits 12-14, delta's sign at bit 15. iq1_m: the
nibble t % 2 of qh[t // 2] holds entry t's 3 bits and (bit 3) its delta's sign; the 3-bit ls_s of
16 elements s at bits 3(s % 4) of scales[s // 4]; the f16 d is the top nibbles of the 4 scale
words (scales[k] bits 12-15 as d's bits 4k .. 4k + 3).

Nibbles as the legacy formats': byte j of a 32-element group's 16 bytes holds element j in its low
nibble and element j + 16 in its high one (iq4_xs: group i at qs[16i ..]). iq4_xs's 6-bit ls_i of
group i: the nibble i % 2 of scales_l[i // 2], then bits 2i..2i+1 of scales_h as its top 2 bits.
The numpy decoders repeat gguf-py's float operations in its order (bit-exact).
"""

from typing import NamedTuple

import numpy as np

from .base import Format, f16_at, nibbles
from .iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # kvalues_iq4nl
_KV = np.array(KVALUES, np.int8)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # kvalues_mxfp4
_KVM = np.array(KVALUES_MXFP4, np.int8)
IQ1S_DELTA = 0.125  # ggml's IQ1S_DELTA: iq1's values are grid +- 1/8


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


class IQ3_XXSLayout(NamedTuple):
    code: int = 14
    block_elems: int = 256
    block_bytes: int = 98
    d: int = 0
    qs: int = 2
    aux: int = 66
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ3_SLayout(NamedTuple):
    code: int = 15
    block_elems: int = 256
    block_bytes: int = 110
    d: int = 0
    qs: int = 2
    qh: int = 66
    signs: int = 74
    scales: int = 106
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ2_XXSLayout(NamedTuple):
    code: int = 17
    block_elems: int = 256
    block_bytes: int = 66
    d: int = 0
    qs: int = 2  # group i: 4 grid indices at qs + 8i, its aux u32 at qs + 8i + 4
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ2_XSLayout(NamedTuple):
    code: int = 18
    block_elems: int = 256
    block_bytes: int = 74
    d: int = 0
    qs: int = 2
    scales: int = 66
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ2_SLayout(NamedTuple):
    code: int = 19
    block_elems: int = 256
    block_bytes: int = 82
    d: int = 0
    qs: int = 2
    signs: int = 34
    qh: int = 66
    scales: int = 74
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ1_SLayout(NamedTuple):
    code: int = 20
    block_elems: int = 256
    block_bytes: int = 50
    d: int = 0
    qs: int = 2
    qh: int = 34
    sub_blocks: int = 8
    sub_elems: int = 32


class IQ1_MLayout(NamedTuple):
    code: int = 21
    block_elems: int = 256
    block_bytes: int = 56
    qs: int = 0
    qh: int = 32
    scales: int = 48  # 4 x u16, d in their top nibbles (no field named d: no f16 at one offset)
    sub_blocks: int = 8
    sub_elems: int = 32


class MXFP4Layout(NamedTuple):
    code: int = 24
    block_elems: int = 32
    block_bytes: int = 17
    e: int = 0  # the E8M0 exponent byte (no f16 scale)
    qs: int = 1


LIQ4_NL, LIQ4_XS, LIQ3_XXS, LIQ3_S = IQ4_NLLayout(), IQ4_XSLayout(), IQ3_XXSLayout(), IQ3_SLayout()
LMXFP4 = MXFP4Layout()
LIQ2_XXS, LIQ2_XS, LIQ2_S = IQ2_XXSLayout(), IQ2_XSLayout(), IQ2_SLayout()
LIQ1_S, LIQ1_M = IQ1_SLayout(), IQ1_MLayout()


def _grid(entries, dtype="<u4") -> np.ndarray:
    """(n, 4) (uint32 entries) or (n, 8) (uint64) float32 values of a grid (its bytes as int8)."""
    return np.array(entries, dtype).view(np.int8).reshape(len(entries), -1).astype(np.float32)


_G3XXS, _G3S = _grid(IQ3XXS_GRID), _grid(IQ3S_GRID)
_G2XXS, _G2XS, _G2S, _G1S = (_grid(g, "<u8") for g in (IQ2XXS_GRID, IQ2XS_GRID, IQ2S_GRID, IQ1S_GRID))
_KSIGNS = np.array(KSIGNS, np.uint8)


def _sign_bits(bytes8) -> np.ndarray:
    """(..., k) sign bytes -> (..., 8k) float32 of +1 / -1 (bit j of byte b: element 8b + j)."""
    bits = (bytes8[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits == 0, np.float32(1), np.float32(-1)).reshape(*bytes8.shape[:-1], -1)


def _iq3_xxs(b):
    L, n = LIQ3_XXS, b.shape[0]
    aux = np.ascontiguousarray(b[:, L.aux : L.block_bytes]).view(np.uint32)  # (n, 8)
    db = (f16_at(b, L.d) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)).reshape(n, 8, 1)
    sidx = (aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F  # (n, 8, 4)
    signs = _sign_bits(_KSIGNS[sidx]).reshape(n, 8, 32)
    grid = _G3XXS[b[:, L.qs : L.aux]].reshape(n, 8, 32)
    return (db * grid * signs).reshape(n, L.block_elems)


def _iq3_s(b):
    L, n = LIQ3_S, b.shape[0]
    ls = (b[:, L.scales : L.block_bytes].reshape(n, 4, 1) >> np.array([0, 4], np.uint8)).reshape(n, 8) & 15
    db = (f16_at(b, L.d) * (1 + 2 * ls).astype(np.float32)).reshape(n, 8, 1)
    hi = ((b[:, L.qh : L.signs].reshape(n, 8, 1) >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, 64)
    idx = b[:, L.qs : L.qh].astype(np.uint16) | (hi.astype(np.uint16) << 8)
    grid = _G3S[idx].reshape(n, 8, 32)
    signs = _sign_bits(b[:, L.signs : L.scales]).reshape(n, 8, 32)
    return (db * grid * signs).reshape(n, L.block_elems)


def _iq2_xxs(b):
    L, n = LIQ2_XXS, b.shape[0]
    q = np.ascontiguousarray(b[:, L.qs : L.block_bytes]).view(np.uint32).reshape(n, 8, 2)
    aux = q[..., 1]
    db = (f16_at(b, L.d) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.25)).reshape(n, 8, 1)
    sidx = (aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F  # (n, 8, 4)
    signs = _sign_bits(_KSIGNS[sidx]).reshape(n, 8, 32)
    grid = _G2XXS[q[..., 0:1].view(np.uint8).reshape(n, 8, 4)].reshape(n, 8, 32)
    return (db * grid * signs).reshape(n, L.block_elems)


def iq2_scales(b, L) -> np.ndarray:
    """(n, 16) float32 of iq2_xs / iq2_s blocks: d * (0.5 + ls_s) * 0.25 of each 16 elements."""
    ls = (b[:, L.scales : L.scales + 8].reshape(-1, 8, 1) >> np.array([0, 4], np.uint8)).reshape(-1, 16) & 15
    return f16_at(b, L.d) * (np.float32(0.5) + ls.astype(np.float32)) * np.float32(0.25)


def _iq2_xs(b):
    L, n = LIQ2_XS, b.shape[0]
    q = np.ascontiguousarray(b[:, L.qs : L.scales]).view(np.uint16)  # (n, 32)
    signs = _sign_bits(_KSIGNS[q >> 9][..., None]).reshape(n, 16, 16)
    grid = _G2XS[q & 511].reshape(n, 16, 16)
    return (iq2_scales(b, L).reshape(n, 16, 1) * grid * signs).reshape(n, L.block_elems)


def _iq2_s(b):
    L, n = LIQ2_S, b.shape[0]
    hi = (b[:, L.qh : L.scales].reshape(n, 8, 1) >> np.array([0, 2, 4, 6], np.uint8)).reshape(n, 32) & 3
    idx = b[:, L.qs : L.signs].astype(np.uint16) | (hi.astype(np.uint16) << 8)
    signs = _sign_bits(b[:, L.signs : L.qh]).reshape(n, 16, 16)
    grid = _G2S[idx].reshape(n, 16, 16)
    return (iq2_scales(b, L).reshape(n, 16, 1) * grid * signs).reshape(n, L.block_elems)


def _delta(sign_bits) -> np.ndarray:
    return np.where(sign_bits == 0, np.float32(IQ1S_DELTA), np.float32(-IQ1S_DELTA))


def _iq1_s(b):
    L, n = LIQ1_S, b.shape[0]
    qh = np.ascontiguousarray(b[:, L.qh : L.block_bytes]).view(np.uint16)  # (n, 8)
    dl = (f16_at(b, L.d) * (2 * ((qh >> 12) & 7) + 1)).reshape(n, 8, 1)
    hi = ((qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 32)
    grid = _G1S[b[:, L.qs : L.qh].astype(np.uint16) | (hi << 8)].reshape(n, 8, 32)
    return (dl * (grid + _delta(qh & 0x8000).reshape(n, 8, 1))).reshape(n, L.block_elems)


def iq1_m_d(b) -> np.ndarray:
    """(n, 56) iq1_m blocks -> (n, 1) float32: the f16 d of the scale words' top nibbles."""
    L = LIQ1_M
    sc = np.ascontiguousarray(b[:, L.scales : L.block_bytes]).view(np.uint16)
    bits = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)
    return np.bitwise_or.reduce(bits, axis=-1).view(np.float16).astype(np.float32).reshape(-1, 1)


def _iq1_m(b):
    L, n = LIQ1_M, b.shape[0]
    sc = np.ascontiguousarray(b[:, L.scales : L.block_bytes]).view(np.uint16)
    ls = ((sc[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = (iq1_m_d(b) * (2 * ls + 1)).reshape(n, 16, 1)
    nib = (b[:, L.qh : L.scales].reshape(n, 16, 1) >> np.array([0, 4], np.uint8)).reshape(n, 32)
    grid = _G1S[b[:, L.qs : L.qh].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)]  # (n, 32, 8)
    return (dl * (grid + _delta(nib & 8)[..., None]).reshape(n, 16, 16)).reshape(n, L.block_elems)


def _iq4_nl(b):
    L = LIQ4_NL
    return f16_at(b, L.d) * _KV[nibbles(b[:, L.qs :])].astype(np.float32)


def e8m0_half(e) -> np.ndarray:
    """uint8 E8M0 exponents -> float32 2^(e - 128) (half the E8M0 value; e < 2: the subnormals
    2^-128, 2^-127), as ggml's GGML_E8M0_TO_FP32_HALF builds the bits."""
    e = np.asarray(e, np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(
        np.float32)


def _mxfp4(b):
    L = LMXFP4
    return e8m0_half(b[:, L.e : L.e + 1]) * _KVM[nibbles(b[:, L.qs :])].astype(np.float32)


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
IQ3_XXS = Format("iq3_xxs", 18, LIQ3_XXS, _iq3_xxs)
IQ3_S = Format("iq3_s", 21, LIQ3_S, _iq3_s)
IQ2_XXS = Format("iq2_xxs", 16, LIQ2_XXS, _iq2_xxs)
IQ2_XS = Format("iq2_xs", 17, LIQ2_XS, _iq2_xs)
IQ2_S = Format("iq2_s", 22, LIQ2_S, _iq2_s)
IQ1_S = Format("iq1_s", 19, LIQ1_S, _iq1_s)
IQ1_M = Format("iq1_m", 29, LIQ1_M, _iq1_m)
MXFP4 = Format("mxfp4", 39, LMXFP4, _mxfp4)
