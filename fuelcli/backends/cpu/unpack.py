"""Per-format IR emitters: a stored block -> groups of 32 signed int16 weights and their f32 scale.

Every block format is a sequence of 32-element groups (ggml's QK8: the activation block), each
element `scale * w (+ min)` with w a small signed integer:

    q8_0  w = q (int8)            scale d
    q4_0  w = q - 8               scale d
    q4_1  w = q                   scale d,        min m
    q5_0  w = q - 16              scale d
    q4_k  w = q                   scale d*sc_i,   min -(dmin*m_i)   (sub-block i = group i)
    q6_k  w = (q - 32) * sc_s     scale d         (|w| <= 4096: the 16-element scales are folded in)

`block()` emits the unpacking of one format block (1 group, or 8 for the 256-element K-quants, so
their sub-block indices are compile-time constants) and returns each group's <32 x i16> w and the
scales and mins of all its groups as one vector (the K-quants' 6-bit scales are unpacked with
vector operations, not per group). The decode and prefill kernels dot w with int16 activations; the exact
row decode multiplies it out: every product here is exact in f32 (scale has at most 18 significant
bits, w at most 13), so `scale * w (+ min)` rounds like the numpy decode in formats/ (once, at the
min; q6_k gives its per-element scale for the sign of zeros). All sizes and offsets come from the
layouts in fuelcli/formats.
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from ...formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0
from .irgen import F32T, G, I8, I16, I32, I64, c64, const, load, splat, splat_c, vec

def f16(bd, base, off):
    """The little-endian f16 at byte `off` of base, widened to float (exact)."""
    return bd.fpext(bd.bitcast(load(bd, base, off, I16), ir.HalfType()), F32T)


def nibbles(bd, qs16):
    """<16 x i8> packed bytes -> <32 x i8>: low nibbles (elements 0..15), then high (16..31)."""
    lo = bd.and_(qs16, splat_c(I8, 15, 16))
    hi = bd.lshr(qs16, splat_c(I8, 4, 16))
    return bd.shuffle_vector(lo, hi, const(I32, range(32)))


class Block(NamedTuple):
    """One format block as n = block_elems / 32 groups."""

    w: list  # n x <32 x i16>: the signed integer weights of each group
    scale: ir.Value  # <n x float>: group j's scale in lane j
    min: ir.Value | None  # <n x float> (formats with a min) or None
    exact: list | None = None  # q6_k: n x (<32 x float> scales, <32 x i16> w) for the exact decode,
    # whose (d * sc) * (q - 32) keeps the sign of a zero q - 32 (d * ((q - 32) * sc) would not)


def _lanes(bd, *vals):
    """Scalars -> <n x float>."""
    v = ir.Constant(vec(F32T, len(vals)), ir.Undefined)
    for i, x in enumerate(vals):
        v = bd.insert_element(v, x, ir.Constant(I32, i))
    return v


def _f16_lanes(bd, row, offsets):
    """<n x float> of the f16 values at the byte offsets (i64) of row (an i8*, or a list of one per
    offset): gathered four at a time into 64-bit integers (integer loads, shifts and ors, none of
    the vector pipes' shuffles), then one conversion."""
    n = len(offsets)
    rows = row if isinstance(row, list) else [row] * n
    width = 16 * min(n, 4)
    quads = []
    for q in range(0, n, 4):
        v = None
        for i, (r, off) in enumerate(zip(rows[q:q + 4], offsets[q:q + 4])):
            h = bd.zext(load(bd, r, off, I16), ir.IntType(width))
            v = h if v is None else bd.or_(v, bd.shl(h, ir.Constant(ir.IntType(width), 16 * i)))
        quads.append(v)
    v = ir.Constant(vec(ir.IntType(width), len(quads)), ir.Undefined)
    for i, x in enumerate(quads):
        v = bd.insert_element(v, x, ir.Constant(I32, i))
    return bd.fpext(bd.bitcast(v, vec(ir.HalfType(), n)), vec(F32T, n))


# ------------------------------------------------------------------ 32-element formats


def _q8_0(bd, row, blk):
    L = Q8_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    w = bd.sext(load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G)), vec(I16, G))
    return Block([w], _lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


def _q4_0(bd, row, blk):
    L = Q4_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return Block([bd.sub(q, splat_c(I16, L.zero, G))], _lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


def _q4_1(bd, row, blk):
    L = Q4_1.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return Block([q], _lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), _lanes(bd, f16(bd, row, bd.add(p, c64(L.m)))))


def _q5_0(bd, row, blk):
    """qh is a 32-bit mask (bit j: the 5th bit of element j): w = nibble where it is set, else
    nibble - 16 (one masked subtract with AVX-512)."""
    L = Q5_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    high = bd.bitcast(load(bd, row, bd.add(p, c64(L.qh)), I32), vec(ir.IntType(1), G))
    nib = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    w = bd.select(high, nib, bd.sub(nib, splat_c(I16, L.zero, G)))
    return Block([w], _lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


# ------------------------------------------------------------------ K-quants (256-element blocks)


def _q4_k_scales(bd, blocks):
    """<8n x float> d * sc_i and -(dmin * m_i) of n blocks [(row, byte offset)], block after
    block. The 8 six-bit scales and mins come out of the 12 scale bytes in the byte domain, as
    ggml's get_scale_min_k4 (sub-block i < 4: the low 6 bits of bytes i and i+4; i >= 4: the
    nibbles of byte i+4 and the top 2 bits of bytes i-4 and i): two byte shuffles put each value's
    low and high bits in its place, masks and shifts of 16-bit lanes finish it, every block's bytes
    in one vector; then one widening and one conversion for all the scales, one for the mins."""
    L = Q4_K.layout
    n, m = L.sub_blocks, len(blocks)
    half = n // 2
    raws = [load(bd, row, bd.add(p, c64(L.scales)), vec(I8, 16)) for row, p in blocks]
    raw = raws[0] if m == 1 else bd.shuffle_vector(raws[0], raws[1], const(I32, range(32)))
    zero = 16 * m  # an index past raw: a zero byte
    # per block: [scales 0-7 | mins 0-7]; lows: sc_i<4 byte i, sc_i>=4 byte i+4, m_i<4 byte i+4,
    # m_i>=4 byte i+4 again (its high nibble); highs: the bytes whose top 2 bits go to bits 4-5
    low_idx = [*range(half), *range(2 * half, 3 * half), *range(half, 2 * half), *range(2 * half, 3 * half)]
    high_idx = [zero] * half + [*range(half)] + [zero] * half + [*range(half, 2 * half)]
    pick = lambda idx: bd.shuffle_vector(raw, splat_c(I8, 0, 16 * m), const(I32, [16 * b + i if i != zero else zero for b in range(m) for i in idx]))  # noqa: E731
    lows, highs = pick(low_idx), pick(high_idx)
    k8 = lambda vals: const(I8, list(vals) * m)  # noqa: E731
    low = bd.or_(bd.and_(lows, k8([63] * half + [15] * half + [63] * half + [0] * half)),
                 bd.and_(bd.lshr(lows, splat_c(I8, 4, 16 * m)), k8([0] * (3 * half) + [15] * half)))
    sm = bd.or_(low, bd.and_(bd.lshr(highs, splat_c(I8, 2, 16 * m)), splat_c(I8, 0x30, 16 * m)))
    sc = bd.shuffle_vector(sm, sm, const(I32, [16 * b + i for b in range(m) for i in range(n)]))
    mn = bd.shuffle_vector(sm, sm, const(I32, [16 * b + n + i for b in range(m) for i in range(n)]))

    # d and dmin of every block converted at once: [d_0, dmin_0, d_1, dmin_1]
    dd = _f16_lanes(bd, [row for row, _ in blocks for _ in range(2)],
                    [bd.add(p, c64(off)) for _, p in blocks for off in (L.d, L.dmin)])

    def per_block(j):  # <8n x float>: block b's d (j = 0) or dmin (j = 1) in its 8 lanes
        return bd.shuffle_vector(dd, dd, const(I32, [2 * b + j for b in range(m) for _ in range(n)]))

    scale = bd.fmul(per_block(0), bd.uitofp(sc, vec(F32T, n * m)))
    mins = bd.fneg(bd.fmul(per_block(1), bd.uitofp(mn, vec(F32T, n * m))))
    return scale, mins


def _concat(bd, parts):
    """Vectors of one length, end to end (two at most)."""
    if len(parts) == 1:
        return parts[0]
    k = parts[0].type.count
    return bd.shuffle_vector(parts[0], parts[1], const(I32, range(2 * k)))


def _q4_k(bd, row, blk):
    L = Q4_K.layout
    n = L.sub_blocks
    p = bd.mul(blk, c64(L.block_bytes))
    scale, mins = _q4_k_scales(bd, [(row, p)])
    w = []
    for i in range(n):  # sub-block i: chunk i // 2 of qs, low nibbles for even i, high for odd
        qs = load(bd, row, bd.add(p, c64(L.qs + (i // 2) * L.sub_elems)), vec(I8, G))
        q = bd.and_(qs, splat_c(I8, 15, G)) if i % 2 == 0 else bd.lshr(qs, splat_c(I8, 4, G))
        w.append(bd.zext(q, vec(I16, G)))
    return Block(w, scale, mins)


def _q6_k(bd, row, blk):
    L = Q6_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    quarter = L.half // 4  # 32 elements: the l of element l + quarter*k
    scs = bd.sext(load(bd, row, bd.add(p, c64(L.scales)), vec(I8, L.sub_blocks)), vec(I16, L.sub_blocks))
    w, exact = [], []
    for h in range(L.block_elems // L.half):
        qh = load(bd, row, bd.add(p, c64(L.qh + h * quarter)), vec(I8, G))
        for k in range(4):
            ql = load(bd, row, bd.add(p, c64(L.ql + h * L.half // 2 + quarter * (k & 1))), vec(I8, G))
            lo = bd.and_(ql, splat_c(I8, 15, G)) if k < 2 else bd.lshr(ql, splat_c(I8, 4, G))
            hi = bd.and_(bd.lshr(qh, splat_c(I8, 2 * k, G)), splat_c(I8, 3, G))
            q = bd.sub(bd.or_(lo, bd.shl(hi, splat_c(I8, 4, G))), splat_c(I8, L.zero, G))
            s0 = h * L.half // L.sub_elems + 2 * k  # sub-blocks s0 (l < 16) and s0 + 1
            scv = bd.shuffle_vector(scs, scs, const(I32, [s0] * (G // 2) + [s0 + 1] * (G // 2)))
            q16 = bd.sext(q, vec(I16, G))
            w.append(bd.mul(q16, scv))
            exact.append((bd.fmul(splat(bd, d, G), bd.sitofp(scv, vec(F32T, G))), q16))
    n = L.block_elems // G
    return Block(w, splat(bd, d, n), None, exact)


EMITTERS = {Q8_0.code: _q8_0, Q4_0.code: _q4_0, Q4_1.code: _q4_1, Q5_0.code: _q5_0, Q4_K.code: _q4_k,
            Q6_K.code: _q6_k}
BLOCK = {f.code: f.layout for f in (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)}
HAS_MIN = {Q4_1.code, Q4_K.code}


# ------------------------------------------------------------------ planes: u8 weights for vpdpbusd
#
# The planes decode kernels (kernels.py) dot unsigned weight bytes with the two int8 planes of the
# int16 activations, for one or two rows at a time, a chunk of 256 elements at a time (one K-quant
# block, eight 32-element blocks; a row's last blocks of a 32-element format in chunks of two and
# one). A chunk gives units of 64 consecutive elements (Q4_K: of the K-quant layout below); i32 lane
# i of a unit's dot sums elements 4i..4i+3 and is multiplied by its lane scale: the weights' scale
# there times the activations' block scale. The stored q is dotted as an unsigned byte: a zero
# point z (w = q - z) comes off afterwards with the activations' 16-element sums.

PLANES_UNIT = 64
_LANES = PLANES_UNIT // 4


class PlanesBlocks(NamedTuple):
    """A chunk of n rows for the planes decode kernel."""

    units: list  # [row][u] <64 x i8>: unsigned weight bytes of the chunk's elements 64u .. 64u + 63
    # (PLANES_KLAYOUT: of unit u of the K-quant layout)
    lane_scales: list  # [row][u] <16 x float> (PLANES_KLAYOUT: [row][0], shared by the block's units)
    min: ir.Value | None  # <g*n x float>: each row's min per 32-element group (times the group's sum of x)
    zero_scale: ir.Value | None  # <2g*n x float>: each row's scale x activation scale per 16 elements
    # (formats with a zero point: PLANES_ZERO)


def _nibble_units(bd, qs_parts, shift):
    """Units from 16-byte nibble groups (one per 32-element group, low nibbles its elements 0-15):
    each copied twice, the low half masked to the low nibble and the high half to the high nibble
    in place (16 * q: its lane scale carries 1 / 16) or, with `shift`, shifted down (q itself)."""
    units = []
    for j in range(0, len(qs_parts), 2):
        pair = qs_parts[j:j + 2]
        both = pair[0] if len(pair) == 1 else bd.shuffle_vector(pair[0], pair[1], const(I32, range(32)))
        n = len(pair)
        idx = [16 * b + t for b in range(n) for _ in range(2) for t in range(16)]
        v = bd.shuffle_vector(both, splat_c(I8, 0, 16 * n), const(I32, idx + [16 * n] * (64 - len(idx))))
        if shift:
            words = bd.lshr(bd.bitcast(v, vec(I16, 32)), const(I16, ([0] * 8 + [4] * 8) * 2))
            v = bd.and_(bd.bitcast(words, vec(I8, 64)), splat_c(I8, 15, 64))
        else:
            v = bd.and_(v, const(I8, ([15] * 16 + [0xF0 - 256] * 16) * 2))
        units.append(v)
    return units


def _legacy_planes(fmt):
    """The planes emitter of a 32-element format: `nblk` blocks from block b0 of each row."""
    L = fmt.layout
    code = fmt.code

    def emit(bd, rows, b0, nblk, xs):
        units, lane_scales, svs, mins = [], [], [], []
        for row in rows:
            base = bd.mul(b0, c64(L.block_bytes))
            at = lambda j, off: bd.add(base, c64(j * L.block_bytes + off))  # noqa: E731
            d = _f16_lanes(bd, row, [at(j, L.d) for j in range(nblk)])
            sv = bd.fmul(d, xs)
            svs.append(sv)
            if code == Q4_1.code:
                mins.append(_f16_lanes(bd, row, [at(j, L.m) for j in range(nblk)]))
            if code == Q8_0.code:  # q + 128 as the unsigned byte
                parts = [bd.xor(load(bd, row, at(j, L.qs), vec(I8, G)), splat_c(I8, -128, G)) for j in range(nblk)]
                us = []
                for j in range(0, nblk, 2):
                    pair = parts[j:j + 2] if j + 1 < nblk else [parts[j], splat_c(I8, 0, G)]
                    us.append(bd.shuffle_vector(pair[0], pair[1], const(I32, range(64))))
                scale = sv
            else:
                qs = [load(bd, row, at(j, L.qs), vec(I8, 16)) for j in range(nblk)]
                us = _nibble_units(bd, qs, shift=code == Q5_0.code)
                if code == Q5_0.code:  # the 5th bits: + 16 where set (qh bit j: element j)
                    for u in range(len(us)):
                        bits = [bd.zext(load(bd, row, at(j, L.qh), I32), I64) for j in range(2 * u, min(2 * u + 2, nblk))]
                        mask = bits[0] if len(bits) == 1 else bd.or_(bits[0], bd.shl(bits[1], c64(32)))
                        set_ = bd.bitcast(mask, vec(ir.IntType(1), 64))
                        us[u] = bd.select(set_, bd.or_(us[u], splat_c(I8, 16, 64)), us[u])
                    scale = sv
                else:  # the high nibbles' lanes: 1 / 16
                    scale = _concat(bd, [sv, bd.fmul(sv, splat_c(F32T, 1 / 16, nblk))])
            hi16 = code not in (Q8_0.code, Q5_0.code)
            ls = []
            for u in range(len(us)):
                idx = []
                for i in range(_LANES):
                    j = min(2 * u + i // 8, nblk - 1)  # lanes past the last block: weights 0
                    idx.append(j + nblk * (hi16 and (i // 4) % 2 == 1))
                ls.append(bd.shuffle_vector(scale, scale, const(I32, idx)))
            units.append(us)
            lane_scales.append(ls)
        zero_scale = None
        if code in PLANES_ZERO:
            per16 = [bd.shuffle_vector(sv, sv, const(I32, [s // 2 for s in range(2 * nblk)])) for sv in svs]
            zero_scale = _concat(bd, per16)
        return PlanesBlocks(units, lane_scales, _concat(bd, mins) if mins else None, zero_scale)

    return emit


# Q4_K's units read the activations' K-quant layout (core.py's quantize writes it): in each block of
# PLANES_KBLOCK elements, lane i of unit u holds elements 16i + 4u .. 16i + 4u + 3, so lane i of every
# unit lies in the block's 16-element row i (sub-block i // 2): the four units of a block share one
# lane map, their dots sum in one accumulator and are converted and scaled once a block, not once a
# unit (Zen 4, one thread, an 8960 x 1536 matrix from L3: 0.83-0.85x the time). Each unit's weights
# are gathered from the stored block with one permute of its dwords.
PLANES_KBLOCK = Q4_K.layout.block_elems
PLANES_KLAYOUT = {Q4_K.code}  # (Q6_K's 16 sub-blocks need 7 operations a unit to gather: slower)
KDW_Q4_K = [8 * (i // 4) + 4 * (i % 2) for i in range(_LANES)]  # qs dword of lane i, unit 0: chunk
# i // 4, its 16-byte half i % 2; unit u reads the dword u on


def _q4_k_planes(bd, rows, fb, nblk, xs8):
    """Unit u, lane i (the K-quant layout): qs dword KDW_Q4_K[i] + u, masked to its low nibbles
    (sub-block i // 2 even) or to its high nibbles in place (odd: 16 * q, whose scale carries the
    1 / 16): one permute and one AND a unit. One lane-scale vector a row: lane i, sub-block i // 2."""
    L = Q4_K.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    scale, mins = _q4_k_scales(bd, [(row, p) for row in rows])
    xs_odd = bd.fmul(xs8, const(F32T, [1.0 if j % 2 == 0 else 1 / 16 for j in range(n)]))
    sv = bd.fmul(scale, _concat(bd, [xs_odd] * len(rows)))
    mask = const(I32, [0x0F0F0F0F if (i // 2) % 2 == 0 else 0xF0F0F0F0 - (1 << 32) for i in range(_LANES)])
    units, lane_scales = [], []
    for r, row in enumerate(rows):
        q0, q1 = (load(bd, row, bd.add(p, c64(L.qs + 64 * h)), vec(I32, _LANES)) for h in range(2))
        units.append([bd.bitcast(bd.and_(bd.shuffle_vector(q0, q1, const(I32, [d + u for d in KDW_Q4_K])), mask),
                                 vec(I8, PLANES_UNIT)) for u in range(4)])
        lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [n * r + i // 2 for i in range(_LANES)]))])
    return PlanesBlocks(units, lane_scales, mins, None)


def _q6_k_planes(bd, rows, fb, nblk, xs8):
    """Unit u = 2h + kk (half h, k in {2kk, 2kk+1}): the low 4 bits are 64 consecutive bytes of ql
    (low nibbles for kk = 0, high for kk = 1), the top 2 bits those of qh[32h .. 32h+31] at bits
    2k, moved to bits 4-5 by one 16-bit shift per half (a shift across the byte boundary only moves
    bits that the 0x30 mask drops). Lane i of unit u lies in sub-block 4u + i // 4."""
    L = Q6_K.layout
    p = bd.mul(fb, c64(L.block_bytes))
    quarter = L.half // 4
    xs16 = bd.shuffle_vector(xs8, xs8, const(I32, [s // 2 for s in range(L.sub_blocks)]))
    units, lane_scales, svs = [], [], []
    for row in rows:
        d = f16(bd, row, bd.add(p, c64(L.d)))
        scs = bd.sitofp(load(bd, row, bd.add(p, c64(L.scales)), vec(I8, L.sub_blocks)), vec(F32T, L.sub_blocks))
        sv = bd.fmul(bd.fmul(splat(bd, d, L.sub_blocks), scs), xs16)
        svs.append(sv)
        lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [4 * u + i // 4 for i in range(_LANES)]))
                            for u in range(L.block_elems // PLANES_UNIT)])
        units.append([])
        for u in range(L.block_elems // PLANES_UNIT):
            h, kk = divmod(u, 2)
            ql = load(bd, row, bd.add(p, c64(L.ql + h * L.half // 2)), vec(I8, PLANES_UNIT))
            lo = bd.and_(bd.lshr(ql, splat_c(I8, 4, PLANES_UNIT)) if kk else ql, splat_c(I8, 15, PLANES_UNIT))
            qh = load(bd, row, bd.add(p, c64(L.qh + h * quarter)), vec(I8, quarter))
            words = bd.bitcast(bd.shuffle_vector(qh, qh, const(I32, [*range(quarter), *range(quarter)])),
                               vec(I16, PLANES_UNIT // 2))
            w = PLANES_UNIT // 4  # words per half
            if kk == 0:  # bits 0-1 (first half) and 2-3 (second) to bits 4-5
                words = bd.shl(words, const(I16, [4] * w + [2] * w))
            else:  # bits 4-5 stay, bits 6-7 to 4-5
                words = bd.lshr(words, const(I16, [0] * w + [2] * w))
            hi = bd.and_(bd.bitcast(words, vec(I8, PLANES_UNIT)), splat_c(I8, 0x30, PLANES_UNIT))
            units[-1].append(bd.or_(lo, hi))
    return PlanesBlocks(units, lane_scales, None, _concat(bd, svs))


# z of w = q - z as the planes kernels dot q (q8_0: q + 128, an unsigned byte)
PLANES_ZERO = {Q8_0.code: 128, Q4_0.code: Q4_0.layout.zero, Q5_0.code: Q5_0.layout.zero, Q6_K.code: Q6_K.layout.zero}
PLANES = {Q4_K.code: _q4_k_planes, Q6_K.code: _q6_k_planes,
          **{f.code: _legacy_planes(f) for f in (Q8_0, Q4_0, Q4_1, Q5_0)}}
PLANES_CHUNK = 256  # elements of a planes kernel's main-loop chunk


def planes_blocks(code: int, bd, rows, b0, nblk, xs) -> PlanesBlocks:
    """`nblk` format blocks from block b0 (i64) of 1 or 2 rows (i8* each) for the planes decode
    kernels; xs: the activations' scales of their 32-element groups (<nblk * block_elems / 32 x
    float>)."""
    return PLANES[code](bd, rows, b0, nblk, xs)


def block(code: int, bd, row, blk) -> Block:
    """Format block `blk` (i64) of the row at `row` (i8*), unpacked."""
    return EMITTERS[code](bd, row, blk)


def exact_values(bd, blk: Block, j: int):
    """<32 x float>: group j of the block decoded as the numpy decode rounds it (no fused
    multiply-add, no reassociation: the builder sets no fast-math flags)."""
    jj = ir.Constant(I32, j)
    sv, wv = blk.exact[j] if blk.exact is not None else (splat(bd, bd.extract_element(blk.scale, jj), G), blk.w[j])
    v = bd.fmul(sv, bd.sitofp(wv, vec(F32T, G)))
    if blk.min is not None:
        v = bd.fadd(v, splat(bd, bd.extract_element(blk.min, jj), G))
    return v


# ------------------------------------------------------------------ words: stored bytes for vpmaddwd
#
# The words decode kernels (kernels.py, every ISA without the int8 planes) read a 32-element group's
# stored bytes as 16 words and take the weights out of each word in place, with masks and shifts:
# word i yields the group's elements 2i (`even`) and 2i + 1 (`odd`), signed int16. Nothing widens
# bytes to words (vpmovzxbw, one pipe of a Zen 3 core, bounded the int16 decode kernels there at
# 4.8 GB/s per core). The activations are read in the same order (core.py: a token's words layout,
# each 32-element block's even elements, then its odd ones), so lane k of the two vpmaddwd sums
# elements 4k .. 4k+3 of the group. The kernels take WORD_CHUNK groups at a time: one K-quant
# block, or eight blocks of a 32-element format, with their scales as one vector.

WORD_CHUNK = 8  # groups of 32 elements per chunk
WORD_ROTATE = (0, 0, 0, 0, 4, 4, 4, 4)  # 16 nibble bytes in both halves: the high half's shifted down
# q6_k's sub-block sums come out of the kernels' reduction in this order (kernels._reduce_groups)
Q6_K_SUMS = (0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)


class WordChunk(NamedTuple):
    groups: list  # WORD_CHUNK x (even, odd): <16 x i16> each (fewer: a 32-element format's last blocks)
    scale: ir.Value  # <n x float>: group j's scale in lane j, or q6_k's 16 sub-block scales in
    # Q6_K_SUMS order
    min: ir.Value | None  # <n x float>: group j's min (formats with a min) or None


def _words(bd, v):
    return bd.bitcast(v, vec(I16, G // 2))


def _wsplat(v):
    return splat_c(I16, v, G // 2)


def _nibble_bytes(bd, row, off):
    """The 16 bytes of a 32-element format's nibbles at byte `off` -> <16 x i16> words whose bytes are
    the 32 elements in order: the bytes in both halves of a vector, the high half shifted down 4
    bits (vpsrlvd), each byte masked to its low nibble."""
    qs = load(bd, row, off, vec(I8, G // 2))
    both = bd.bitcast(bd.shuffle_vector(qs, qs, const(I32, list(range(16)) * 2)), vec(I32, 8))
    return bd.and_(_words(bd, bd.lshr(both, const(I32, WORD_ROTATE))), _wsplat(0x0F0F))


def _signed_bytes(bd, w):
    """Words of two signed bytes -> (even, odd): the low byte moved up and back, the high one down."""
    return bd.ashr(bd.shl(w, _wsplat(8)), _wsplat(8)), bd.ashr(w, _wsplat(8))


def _fifth_bits(bd, qh):
    """Q5_0's 32-bit qh -> <32 x i8>: its zero point, 16, where element m has its 5th bit (bit m of
    qh) clear, else 0 (so q - zero = nibble - this): byte m // 8 of qh in byte m (an in-lane
    shuffle), bit m % 8 of it tested."""
    qb = bd.bitcast(splat(bd, qh, 8), vec(I8, G))
    sel = bd.shuffle_vector(qb, qb, const(I32, [16 * (m // 16) + m // 8 for m in range(G)]))
    bit = const(I8, [1 << (m % 8) for m in range(G)])
    clear = bd.icmp_unsigned("==", bd.and_(sel, bit), splat_c(I8, 0, G))
    return bd.select(clear, splat_c(I8, Q5_0.layout.zero, G), splat_c(I8, 0, G))


def _legacy_groups(fmt, bd, row, p):
    """The (even, odd) words of the 32-element block at byte p of row."""
    L = fmt.layout
    if fmt.code == Q8_0.code:
        return _signed_bytes(bd, _words(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G))))
    q = _nibble_bytes(bd, row, bd.add(p, c64(L.qs)))
    if fmt.code == Q5_0.code:  # q - 16 as signed bytes, the 5th bits in
        z = _fifth_bits(bd, load(bd, row, bd.add(p, c64(L.qh)), I32))
        return _signed_bytes(bd, _words(bd, bd.sub(bd.bitcast(q, vec(I8, G)), z)))
    even, odd = bd.and_(q, _wsplat(0xFF)), bd.lshr(q, _wsplat(8))
    if fmt.code == Q4_0.code:
        return bd.sub(even, _wsplat(L.zero)), bd.sub(odd, _wsplat(L.zero))
    return even, odd


def _legacy_words(fmt):
    L = fmt.layout

    def emit(bd, row, b0, n):
        at = [bd.mul(bd.add(b0, c64(j)), c64(L.block_bytes)) for j in range(n)]
        groups = [_legacy_groups(fmt, bd, row, p) for p in at]
        d = _f16_lanes(bd, row, [bd.add(p, c64(L.d)) for p in at])
        mn = _f16_lanes(bd, row, [bd.add(p, c64(L.m)) for p in at]) if fmt.code == Q4_1.code else None
        return WordChunk(groups, d, mn)

    return emit


_KMASK = (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303)


def _q4_k_scale_bytes(bd, row, p):
    """The 8 six-bit scales and then the 8 mins of the block at byte p as <16 x i8>, unpacked with
    32-bit integer operations (llama.cpp's kmask trick: the integer pipes, not the vector ones)."""
    L = Q4_K.layout
    u = [load(bd, row, bd.add(p, c64(L.scales + 4 * i)), I32) for i in range(3)]
    k1, k2, k3 = (ir.Constant(I32, k) for k in _KMASK)
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    top = lambda v: bd.shl(bd.and_(bd.lshr(v, c(6)), k3), c(4))  # noqa: E731  (bits 6-7 of each byte -> 4-5)
    sc = [bd.and_(u[0], k1), bd.or_(bd.and_(u[2], k2), top(u[0]))]
    mn = [bd.and_(u[1], k1), bd.or_(bd.and_(bd.lshr(u[2], c(4)), k2), top(u[1]))]
    pair = lambda lo, hi: bd.or_(bd.zext(lo, I64), bd.shl(bd.zext(hi, I64), c64(32)))  # noqa: E731
    v = ir.Constant(vec(I64, 2), ir.Undefined)
    v = bd.insert_element(v, pair(*sc), ir.Constant(I32, 0))
    v = bd.insert_element(v, pair(*mn), ir.Constant(I32, 1))
    return bd.bitcast(v, vec(I8, 16))


def _q4_k_words(bd, row, b0, n):
    """Chunk c of qs (32 bytes, 16 words): group 2c in the low nibbles (bits 0-3 and 8-11 of each
    word), group 2c + 1 in the high ones (bits 4-7 and 12-15)."""
    L = Q4_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    raw = _q4_k_scale_bytes(bd, row, p)
    f = lambda idx: bd.uitofp(bd.shuffle_vector(raw, raw, const(I32, idx)), vec(F32T, 8))  # noqa: E731
    d = _f16_lanes(bd, row, [bd.add(p, c64(L.d)), bd.add(p, c64(L.dmin))])
    dd = lambda i: bd.shuffle_vector(d, d, const(I32, [i] * 8))  # noqa: E731
    scale = bd.fmul(dd(0), f(range(8)))
    mins = bd.fneg(bd.fmul(dd(1), f(range(8, 16))))
    groups = []
    m = _wsplat(15)
    for c in range(L.sub_blocks // 2):
        w = _words(bd, load(bd, row, bd.add(p, c64(L.qs + c * L.sub_elems)), vec(I8, G)))
        groups.append((bd.and_(w, m), bd.and_(bd.lshr(w, _wsplat(8)), m)))
        groups.append((bd.and_(bd.lshr(w, _wsplat(4)), m), bd.lshr(w, _wsplat(12))))
    return WordChunk(groups, scale, mins)


def _q6_k_words(bd, row, b0, n):
    """Group 4h + k (half h, quarter k): its low 4 bits from the words of ql[64h + 32(k & 1) ..]
    (the low nibbles for k < 2, the high ones for k >= 2), its top 2 bits from the words of
    qh[32h ..] at bits 2k of each byte, moved to bits 4-5; both bytes of a word at once, then split.
    The weights are q, not q - 32: the kernel takes 32 times the activations' 16-element sums off."""
    L = Q6_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    quarter = L.half // 4
    d = f16(bd, row, bd.add(p, c64(L.d)))
    scs = load(bd, row, bd.add(p, c64(L.scales)), vec(I8, L.sub_blocks))
    scs = bd.sitofp(bd.shuffle_vector(scs, scs, const(I32, Q6_K_SUMS)), vec(F32T, L.sub_blocks))
    scale = bd.fmul(splat(bd, d, L.sub_blocks), scs)

    def shift(v, n):  # v >> n, or v << -n
        return v if n == 0 else bd.lshr(v, _wsplat(n)) if n > 0 else bd.shl(v, _wsplat(-n))

    groups = []
    for h in range(L.block_elems // L.half):
        qh = _words(bd, load(bd, row, bd.add(p, c64(L.qh + h * quarter)), vec(I8, G)))
        for k in range(4):
            ql = _words(bd, load(bd, row, bd.add(p, c64(L.ql + h * L.half // 2 + quarter * (k & 1))), vec(I8, G)))
            q = bd.or_(bd.and_(shift(ql, 4 * (k // 2)), _wsplat(0x0F0F)), bd.and_(shift(qh, 2 * k - 4), _wsplat(0x3030)))
            groups.append((bd.and_(q, _wsplat(0xFF)), bd.lshr(q, _wsplat(8))))
    return WordChunk(groups, scale, None)


WORDS = {Q4_K.code: _q4_k_words, Q6_K.code: _q6_k_words,
         **{f.code: _legacy_words(f) for f in (Q8_0, Q4_0, Q4_1, Q5_0)}}


def word_chunk(code: int, bd, row, b0, n: int = 1) -> WordChunk:
    """Format blocks b0 .. b0 + n - 1 (b0 an i64) of the row at `row` (i8*) as groups of words: one
    K-quant block (n = 1), or n blocks of a 32-element format."""
    return WORDS[code](bd, row, b0, n)


# ------------------------------------------------------------------ float formats

FLOATS = {F32.code, F16.code, BF16.code}


def floats(code: int, bd, row, k, n: int, exact: bool = False):
    """<n x float> of elements k..k+n-1 (k an i64) of a float-format row at `row` (i8*)."""
    if code == F32.code:
        return load(bd, bd.bitcast(row, F32T.as_pointer()), k, vec(F32T, n))
    h = load(bd, bd.bitcast(row, I16.as_pointer()), k, vec(I16, n))
    if code == BF16.code:
        return bd.bitcast(bd.shl(bd.zext(h, vec(I32, n)), splat_c(I32, 16, n)), vec(F32T, n))
    if exact:
        return _f16_exact(bd, h, n)
    return bd.fpext(bd.bitcast(h, vec(ir.HalfType(), n)), vec(F32T, n))


def _f16_exact(bd, h, n):
    """Half bits -> float bits as numpy converts them, NaN payloads included (vcvtph2ps quiets a
    signalling NaN, numpy keeps its bits): normal and inf/NaN by moving the fields, subnormals as
    mantissa * 2^-24 (exact)."""
    u = bd.zext(h, vec(I32, n))
    c = lambda v: splat_c(I32, v, n)  # noqa: E731
    sign = bd.shl(bd.and_(u, c(0x8000)), c(16))
    e = bd.and_(bd.lshr(u, c(10)), c(0x1F))
    m = bd.and_(u, c(0x3FF))
    normal = bd.or_(bd.shl(bd.add(e, c(112)), c(23)), bd.shl(m, c(13)))
    special = bd.or_(c(0x7F800000), bd.shl(m, c(13)))
    sub = bd.bitcast(bd.fmul(bd.uitofp(m, vec(F32T, n)), splat_c(F32T, 2.0 ** -24, n)), vec(I32, n))
    mag = bd.select(bd.icmp_unsigned("==", e, c(0x1F)), special,
                    bd.select(bd.icmp_unsigned("==", e, c(0)), sub, normal))
    return bd.bitcast(bd.or_(sign, mag), vec(F32T, n))
