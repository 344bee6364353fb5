"""Per-format IR emitters: a stored block -> groups of 32 signed int16 weights and their f32 scale.

Every block format is a sequence of 32-element groups (ggml's QK8: the activation block), each
element `scale * w (+ min)` with w a small signed integer:

    q8_0  w = q (int8)            scale d
    q4_0  w = q - 8               scale d
    q4_1  w = q                   scale d,        min m
    q5_0  w = q - 16              scale d
    q4_k  w = q                   scale d*sc_i,   min -(dmin*m_i)   (sub-block i = group i)
    q6_k  w = (q - 32) * sc_s     scale d         (|w| <= 4096: the 16-element scales are folded in)

`groups()` emits the unpacking of one format block (1 group, or 8 for the 256-element K-quants, so
their sub-block indices are compile-time constants) and returns, per group, a <32 x i16> of w, the
scale and the min (or None). The decode and prefill kernels dot w with int16 activations; the exact
row decode multiplies it out: every product here is exact in f32 (scale has at most 18 significant
bits, w at most 13), so `scale * w (+ min)` rounds like the numpy decode in formats/ (once, at the
min; q6_k gives its per-element scale for the sign of zeros). All sizes and offsets come from the
layouts in fuelcli/formats.
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from ...formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0
from .irgen import F32T, G, I8, I16, I32, c64, const, load, splat, splat_c, vec

def f16(bd, base, off):
    """The little-endian f16 at byte `off` of base, widened to float (exact)."""
    return bd.fpext(bd.bitcast(load(bd, base, off, I16), ir.HalfType()), F32T)


def u8(bd, base, off):
    return bd.zext(load(bd, base, off, I8), I32)


def nibbles(bd, qs16):
    """<16 x i8> packed bytes -> <32 x i8>: low nibbles (elements 0..15), then high (16..31)."""
    lo = bd.and_(qs16, splat_c(I8, 15, 16))
    hi = bd.lshr(qs16, splat_c(I8, 4, 16))
    return bd.shuffle_vector(lo, hi, const(I32, range(32)))


class Group(NamedTuple):
    w: ir.Value  # <32 x i16>
    scale: ir.Value  # float
    min: ir.Value | None  # float or None
    exact: tuple | None = None  # (<32 x float> scales, <32 x i16> w) when the exact decode must
    # round differently from scale * w: q6_k's (d * sc) * (q - 32) keeps the sign of a zero q - 32


# ------------------------------------------------------------------ 32-element formats


def _q8_0(bd, row, blk):
    L = Q8_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    w = bd.sext(load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G)), vec(I16, G))
    return [Group(w, f16(bd, row, bd.add(p, c64(L.d))), None)]


def _q4_0(bd, row, blk):
    L = Q4_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return [Group(bd.sub(q, splat_c(I16, L.zero, G)), f16(bd, row, bd.add(p, c64(L.d))), None)]


def _q4_1(bd, row, blk):
    L = Q4_1.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return [Group(q, f16(bd, row, bd.add(p, c64(L.d))), f16(bd, row, bd.add(p, c64(L.m))))]


_BYTEBIT = const(I8, [1 << (j % 8) if j % 8 < 7 else -128 for j in range(G)])


def _q5_0(bd, row, blk):
    """q - 16 == nibble | 0xF0 (as int8) where the 5th bit is clear, the nibble where it is set."""
    L = Q5_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    qh = bd.bitcast(load(bd, row, bd.add(p, c64(L.qh)), I32), vec(I8, 4))
    nib = nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2)))
    hb = bd.shuffle_vector(qh, qh, const(I32, [j // 8 for j in range(G)]))
    clear = bd.icmp_unsigned("==", bd.and_(hb, _BYTEBIT), splat_c(I8, 0, G))
    w8 = bd.or_(nib, bd.select(clear, splat_c(I8, -L.zero, G), splat_c(I8, 0, G)))
    return [Group(bd.sext(w8, vec(I16, G)), f16(bd, row, bd.add(p, c64(L.d))), None)]


# ------------------------------------------------------------------ K-quants (256-element blocks)


def _q4_k(bd, row, blk):
    L = Q4_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    dmin = f16(bd, row, bd.add(p, c64(L.dmin)))
    sb = [u8(bd, row, bd.add(p, c64(L.scales + i))) for i in range(L.qs - L.scales)]
    c63, c15, c4, c6 = (ir.Constant(I32, v) for v in (63, 15, 4, 6))
    out = []
    for i in range(L.sub_blocks):  # get_scale_min_k4
        if i < 4:
            s, m = bd.and_(sb[i], c63), bd.and_(sb[i + 4], c63)
        else:
            s = bd.or_(bd.and_(sb[i + 4], c15), bd.shl(bd.lshr(sb[i - 4], c6), c4))
            m = bd.or_(bd.lshr(sb[i + 4], c4), bd.shl(bd.lshr(sb[i], c6), c4))
        qs = load(bd, row, bd.add(p, c64(L.qs + (i // 2) * L.sub_elems)), vec(I8, G))
        q = bd.and_(qs, splat_c(I8, 15, G)) if i % 2 == 0 else bd.lshr(qs, splat_c(I8, 4, G))
        scale = bd.fmul(d, bd.sitofp(s, F32T))
        mn = bd.fneg(bd.fmul(dmin, bd.sitofp(m, F32T)))
        out.append(Group(bd.zext(q, vec(I16, G)), scale, mn))
    return out


def _q6_k(bd, row, blk):
    L = Q6_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    quarter = L.half // 4  # 32 elements: the l of element l + quarter*k
    out = []
    for h in range(L.block_elems // L.half):
        qh = load(bd, row, bd.add(p, c64(L.qh + h * quarter)), vec(I8, G))
        for k in range(4):
            ql = load(bd, row, bd.add(p, c64(L.ql + h * L.half // 2 + quarter * (k & 1))), vec(I8, G))
            lo = bd.and_(ql, splat_c(I8, 15, G)) if k < 2 else bd.lshr(ql, splat_c(I8, 4, G))
            hi = bd.and_(bd.lshr(qh, splat_c(I8, 2 * k, G)), splat_c(I8, 3, G))
            q = bd.sub(bd.or_(lo, bd.shl(hi, splat_c(I8, 4, G))), splat_c(I8, L.zero, G))
            s0 = h * L.half // L.sub_elems + 2 * k  # sub-blocks s0 (l < 16) and s0 + 1
            sc = [bd.sext(load(bd, row, bd.add(p, c64(L.scales + s0 + j)), I8), I16) for j in (0, 1)]
            scv = bd.shuffle_vector(splat(bd, sc[0], G // 2), splat(bd, sc[1], G // 2), const(I32, range(G)))
            q16 = bd.sext(q, vec(I16, G))
            exact = (bd.fmul(splat(bd, d, G), bd.sitofp(scv, vec(F32T, G))), q16)
            out.append(Group(bd.mul(q16, scv), d, None, exact))
    return out


EMITTERS = {Q8_0.code: _q8_0, Q4_0.code: _q4_0, Q4_1.code: _q4_1, Q5_0.code: _q5_0, Q4_K.code: _q4_k,
            Q6_K.code: _q6_k}
BLOCK = {f.code: f.layout for f in (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)}
HAS_MIN = {Q4_1.code, Q4_K.code}


def groups(code: int, bd, row, blk) -> list[Group]:
    """The groups of format block `blk` (i64) of the row at `row` (i8*)."""
    return EMITTERS[code](bd, row, blk)


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
