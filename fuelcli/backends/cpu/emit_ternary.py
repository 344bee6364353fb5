"""The CPU emitters of ggml's ternary types (layouts: fuelcli/formats/ternary.py).

    tq2_0   w = q - 1                scale d (every group of the block)
    tq1_0   w = q - 1                scale d

Each 32-element group's int8 w through emit_iq.int8_groups (the blocks, words and planes kernels
from a group's int8 values and scales); the planes kernels dot w + 1 = q (zero point 1: with
emit_iq's 128 the zero point's sums cancel all but ~1/64 of the dot, and the avx512vnni decode
was off by up to 7.3e-6 of sum |w * x| against the int16 product, 6.6e-8 with 1). tq2_0's q are
2-bit fields of 32 consecutive bytes; tq1_0's base-3 digit m of a byte b is
((b * 3^m mod 256) * 3) >> 8: a group's 32 bytes (repeated from qs and qh as its elements take
them) times its 32 multipliers, wrapping in 8 bits, then widened.
"""

from __future__ import annotations

from ...formats import TQ1_0, TQ2_0
from ...formats.ternary import POW3
from .emit import f16
from .emit_iq import int8_groups
from .irgen import G, I8, I16, I32, c64, const, load, splat, splat_c, vec


def _d8(fmt):
    def scales(bd, row, p):
        return splat(bd, f16(bd, row, bd.add(p, c64(fmt.layout.d))), fmt.layout.sub_blocks)

    return scales


def _tq2_0_values(bd, row, p, g):
    """Group g = 4h + k: bits 2k of qs[32h ..], minus 1."""
    L = TQ2_0.layout
    h, k = divmod(g, 4)
    q = load(bd, row, bd.add(p, c64(L.qs + G * h)), vec(I8, G))
    return bd.sub(bd.and_(bd.lshr(q, splat_c(I8, 2 * k, G)), splat_c(I8, 3, G)), splat_c(I8, 1, G))


def _tq1_0_bytes(bd, row, p, g):
    """Group g's 32 stored bytes and their 32 multipliers 3^m (as i8 constants)."""
    L = TQ1_0.layout
    if g < 5:  # elements 32g .. 32g + 31: digit g of qs[0 .. 31]
        return load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G)), [POW3[g]] * G
    qs1 = load(bd, row, bd.add(p, c64(L.qs + 32)), vec(I8, 16))
    if g < 7:  # elements 160 + 16m + l, m = 2(g - 5) and the next
        m = 2 * (g - 5)
        return bd.shuffle_vector(qs1, qs1, const(I32, [*range(16)] * 2)), [POW3[m]] * 16 + [POW3[m + 1]] * 16
    qh = load(bd, row, bd.add(p, c64(L.qh)), vec(I8, 4))
    qh16 = bd.shuffle_vector(qh, qh, const(I32, [*range(4)] * 4))  # lane 4m + l: qh[l]
    both = bd.shuffle_vector(qs1, qh16, const(I32, range(G)))
    return both, [POW3[4]] * 16 + [POW3[lane // 4] for lane in range(16)]


def _tq1_0_values(bd, row, p, g):
    b, mult = _tq1_0_bytes(bd, row, p, g)
    prod = bd.mul(b, const(I8, [m if m < 128 else m - 256 for m in mult]))  # mod 256
    q = bd.lshr(bd.mul(bd.zext(prod, vec(I16, G)), splat_c(I16, 3, G)), splat_c(I16, 8, G))
    return bd.sub(bd.trunc(q, vec(I8, G)), splat_c(I8, 1, G))


ZERO = 1  # w = q - 1 >= -1

RECORDS = [int8_groups(TQ2_0, _tq2_0_values, _d8(TQ2_0), ZERO), int8_groups(TQ1_0, _tq1_0_values, _d8(TQ1_0), ZERO)]
