"""Unit decoders of ggml's ternary types (tq2_0, tq1_0); layouts in fuelcli/formats/ternary.py.
Same integer and float operations as the numpy decode: x = d * float(q - 1)."""

from numba import cuda, float32, int32

from ....formats import TQ1_0, TQ2_0
from .common import UNIT, f16_at

LTQ2, LTQ1 = TQ2_0.layout, TQ1_0.layout


@cuda.jit(device=True)
def unpack_tq2_0(w8, p, k0, out):
    L = LTQ2
    b = p + (k0 // L.block_elems) * L.block_bytes
    e = k0 % L.block_elems
    q = b + L.qs + 32 * (e // 128) + e % 32
    shift = 2 * ((e % 128) // 32)
    d = f16_at(w8, b + L.d)
    for j in range(UNIT):
        out[j] = d * float32(((int32(w8[q + j]) >> shift) & 3) - 1)


@cuda.jit(device=True)
def unpack_tq1_0(w8, p, k0, out):
    """Element e: digit m of byte at, ((byte * 3^m mod 256) * 3) >> 8."""
    L = LTQ1
    b = p + (k0 // L.block_elems) * L.block_bytes
    d = f16_at(w8, b + L.d)
    for j in range(UNIT):
        e = k0 % L.block_elems + j
        if e < 160:
            at, m = L.qs + e % 32, e // 32
        elif e < 240:
            at, m = L.qs + 32 + (e - 160) % 16, (e - 160) // 16
        else:
            at, m = L.qh + (e - 240) % 4, (e - 240) // 4
        pw = 1
        for _ in range(m):
            pw *= 3
        q = (((int32(w8[b + at]) * pw) & 255) * 3) >> 8
        out[j] = d * float32(q - 1)
