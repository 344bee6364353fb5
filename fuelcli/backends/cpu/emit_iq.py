"""The CPU emitters of ggml's i-quants (layouts and tables: fuelcli/formats/i_quants.py).

    iq4_nl  w = KVALUES[q]           scale d             (32-element blocks, q8_0's shape after the table)
    iq4_xs  w = KVALUES[q]           scale d*(ls_i - 32) (group i of a 256-element block)

A 4-bit index becomes its int8 value by a 16-entry byte table (emit.table16: pshufb on x86); the
planes kernels dot the table of value + 128, unsigned, and take the zero point 128 off with the
activations' 16-element sums, as q8_0's.
"""

from __future__ import annotations

from ...formats import IQ4_NL, IQ4_XS
from ...formats.i_quants import KVALUES
from .emit import (LANES, PLANES_UNIT, Block, CpuFormat, PlanesBlocks, WordChunk, concat, f16, f16_lanes, lanes,
                   nibble_bytes, nibbles, signed_bytes, table16, words)
from .irgen import F32T, G, I8, I16, I32, c64, const, load, splat, splat_c, vec

ZERO = 128  # the planes' unsigned bytes: value + ZERO
UNSIGNED = [v + ZERO for v in KVALUES]


def _values(bd, row, off, table=KVALUES):
    """The 32 elements of the nibble group at byte `off`, in order, through the table: <32 x i8>."""
    return table16(bd, nibbles(bd, load(bd, row, off, vec(I8, G // 2))), table)


def _word_values(bd, row, off):
    """The group at byte `off` as (even, odd) words (emit.nibble_bytes' order, then the table)."""
    idx = bd.bitcast(nibble_bytes(bd, row, off), vec(I8, G))
    return signed_bytes(bd, words(bd, table16(bd, idx, KVALUES)))


def _units(bd, parts):
    """Planes units: 32-byte groups, two to a unit (the last one alone: zeros after it)."""
    units = []
    for j in range(0, len(parts), 2):
        pair = parts[j:j + 2] if j + 1 < len(parts) else [parts[j], splat_c(I8, 0, G)]
        units.append(bd.shuffle_vector(pair[0], pair[1], const(I32, range(PLANES_UNIT))))
    return units


def _lane_scales(bd, sv, ngroups):
    """Lane i of unit u: group 2u + i // 8 (lanes past the last group: its scale, weights 0)."""
    return [bd.shuffle_vector(sv, sv, const(I32, [min(2 * u + i // 8, ngroups - 1) for i in range(LANES)]))
            for u in range(-(-ngroups // 2))]


def _per16(bd, sv, ngroups):
    return bd.shuffle_vector(sv, sv, const(I32, [s // 2 for s in range(2 * ngroups)]))


# ------------------------------------------------------------------ iq4_nl


def _iq4_nl(bd, row, blk):
    L = IQ4_NL.layout
    p = bd.mul(blk, c64(L.block_bytes))
    w = bd.sext(_values(bd, row, bd.add(p, c64(L.qs))), vec(I16, G))
    return Block([w], lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


def _iq4_nl_words(bd, row, b0, n):
    L = IQ4_NL.layout
    at = [bd.mul(bd.add(b0, c64(j)), c64(L.block_bytes)) for j in range(n)]
    groups = [_word_values(bd, row, bd.add(p, c64(L.qs))) for p in at]
    return WordChunk(groups, f16_lanes(bd, row, [bd.add(p, c64(L.d)) for p in at]), None)


def _iq4_nl_planes(bd, rows, b0, nblk, xs):
    L = IQ4_NL.layout
    units, lane_scales, svs = [], [], []
    base = bd.mul(b0, c64(L.block_bytes))
    at = lambda j, off: bd.add(base, c64(j * L.block_bytes + off))  # noqa: E731
    for row in rows:
        sv = bd.fmul(f16_lanes(bd, row, [at(j, L.d) for j in range(nblk)]), xs)
        svs.append(_per16(bd, sv, nblk))
        units.append(_units(bd, [_values(bd, row, at(j, L.qs), UNSIGNED) for j in range(nblk)]))
        lane_scales.append(_lane_scales(bd, sv, nblk))
    return PlanesBlocks(units, lane_scales, None, concat(bd, svs))


# ------------------------------------------------------------------ iq4_xs


def _iq4_xs_scales(bd, row, p):
    """<8 x float>: d * (ls_i - 32) of the iq4_xs block at byte p."""
    L = IQ4_XS.layout
    n = L.sub_blocks
    lo = load(bd, row, bd.add(p, c64(L.scales_l)), vec(I8, n // 2))
    lo = bd.shuffle_vector(lo, lo, const(I32, [i // 2 for i in range(n)]))
    lo = bd.and_(bd.lshr(lo, const(I8, [4 * (i % 2) for i in range(n)])), splat_c(I8, 15, n))
    sh = splat(bd, load(bd, row, bd.add(p, c64(L.scales_h)), I16), n)
    hi = bd.trunc(bd.and_(bd.lshr(sh, const(I16, [2 * i for i in range(n)])), splat_c(I16, 3, n)), vec(I8, n))
    ls = bd.sub(bd.or_(lo, bd.shl(hi, splat_c(I8, 4, n))), splat_c(I8, L.scale_zero, n))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    return bd.fmul(splat(bd, d, n), bd.sitofp(ls, vec(F32T, n)))


def _iq4_xs(bd, row, blk):
    L = IQ4_XS.layout
    p = bd.mul(blk, c64(L.block_bytes))
    w = [bd.sext(_values(bd, row, bd.add(p, c64(L.qs + 16 * i))), vec(I16, G)) for i in range(L.sub_blocks)]
    return Block(w, _iq4_xs_scales(bd, row, p), None)


def _iq4_xs_words(bd, row, b0, n):
    L = IQ4_XS.layout
    p = bd.mul(b0, c64(L.block_bytes))
    groups = [_word_values(bd, row, bd.add(p, c64(L.qs + 16 * i))) for i in range(L.sub_blocks)]
    return WordChunk(groups, _iq4_xs_scales(bd, row, p), None)


def _iq4_xs_planes(bd, rows, fb, nblk, xs8):
    L = IQ4_XS.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    units, lane_scales, svs = [], [], []
    for row in rows:
        sv = bd.fmul(_iq4_xs_scales(bd, row, p), xs8)
        svs.append(_per16(bd, sv, n))
        units.append(_units(bd, [_values(bd, row, bd.add(p, c64(L.qs + 16 * i)), UNSIGNED) for i in range(n)]))
        lane_scales.append(_lane_scales(bd, sv, n))
    return PlanesBlocks(units, lane_scales, None, concat(bd, svs))


RECORDS = [CpuFormat(IQ4_NL, block=_iq4_nl, words=_iq4_nl_words, planes=_iq4_nl_planes, planes_zero=ZERO),
           CpuFormat(IQ4_XS, block=_iq4_xs, words=_iq4_xs_words, planes=_iq4_xs_planes, planes_zero=ZERO)]
