"""Unit decoders of ggml's i-quants (iq4_nl, iq4_xs); layouts and the value table in
fuelcli/formats/i_quants.py. Same float operations in the same order as the numpy decode."""

import numpy as np
from numba import cuda, float32, int32

from ....formats import IQ4_NL, IQ4_XS
from ....formats.i_quants import KVALUES
from .common import UNIT, f16_at

LIQ4NL, LIQ4XS = IQ4_NL.layout, IQ4_XS.layout
KV = np.array(KVALUES, np.int32)  # a global array: a constant of the kernels


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
