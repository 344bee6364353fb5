"""Unit decoders of ggml's 32-element block formats (q8_0, q4_0, q4_1, q5_0, q5_1); layouts and bit
drawings in fuelcli/formats/legacy.py. Same float operations in the same order as the numpy decode
and the CPU's dequant_row (x = d * q, d * (q - zero), d * q + m).

A unit is UNIT consecutive elements k0.. of a row at byte `p`; it lies inside one block. Nibble
formats keep element j of a block in the low nibble of qs[j] and element j + half in its high one.
"""

from numba import cuda, float32, int8, int32, uint32

from ....formats import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .common import UNIT, f16_at

L8, L40, L41, L50, L51 = Q8_0.layout, Q4_0.layout, Q4_1.layout, Q5_0.layout, Q5_1.layout


@cuda.jit(device=True)
def unpack_q8_0(w8, p, k0, out):
    L = L8
    b = p + (k0 // L.block_elems) * L.block_bytes
    q = b + L.qs + k0 % L.block_elems
    d = f16_at(w8, b + L.d)
    for j in range(UNIT):
        out[j] = float32(int8(w8[q + j])) * d


@cuda.jit(device=True)
def unpack_q4_0(w8, p, k0, out):
    L = L40
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))  # the unit's nibbles: low in the first half, high in the second
    q = L.qs + j0 % (L.block_elems // 2)
    d = f16_at(w8, b + L.d)
    for j in range(UNIT):
        v = (int32(w8[b + q + j]) >> shift) & 15
        out[j] = d * float32(v - L.zero)


@cuda.jit(device=True)
def unpack_q4_1(w8, p, k0, out):
    L = L41
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))  # the unit's nibbles: low in the first half, high in the second
    q = L.qs + j0 % (L.block_elems // 2)
    d = f16_at(w8, b + L.d)
    m = f16_at(w8, b + L.m)
    for j in range(UNIT):
        v = (int32(w8[b + q + j]) >> shift) & 15
        out[j] = d * float32(v) + m


@cuda.jit(device=True)
def unpack_q5_0(w8, p, k0, out):
    L = L50
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))  # the unit's nibbles: low in the first half, high in the second
    q = L.qs + j0 % (L.block_elems // 2)
    d = f16_at(w8, b + L.d)
    h = b + L.qh
    qh = (uint32(w8[h]) | (uint32(w8[h + 1]) << uint32(8)) | (uint32(w8[h + 2]) << uint32(16))
          | (uint32(w8[h + 3]) << uint32(24)))
    for j in range(UNIT):
        v = ((int32(w8[b + q + j]) >> shift) & 15) | (int32((qh >> uint32(j0 + j)) & uint32(1)) << 4)
        out[j] = d * float32(v - L.zero)


@cuda.jit(device=True)
def unpack_q5_1(w8, p, k0, out):
    L = L51
    b = p + (k0 // L.block_elems) * L.block_bytes
    j0 = k0 % L.block_elems
    shift = 4 * (j0 // (L.block_elems // 2))  # the unit's nibbles: low in the first half, high in the second
    q = L.qs + j0 % (L.block_elems // 2)
    d = f16_at(w8, b + L.d)
    m = f16_at(w8, b + L.m)
    h = b + L.qh
    qh = (uint32(w8[h]) | (uint32(w8[h + 1]) << uint32(8)) | (uint32(w8[h + 2]) << uint32(16))
          | (uint32(w8[h + 3]) << uint32(24)))
    for j in range(UNIT):
        v = ((int32(w8[b + q + j]) >> shift) & 15) | (int32((qh >> uint32(j0 + j)) & uint32(1)) << 4)
        out[j] = d * float32(v) + m
