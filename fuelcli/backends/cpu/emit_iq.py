"""The CPU emitters of ggml's i-quants (layouts and tables: fuelcli/formats/i_quants.py).

    iq4_nl  w = KVALUES[q]           scale d             (32-element blocks, q8_0's shape after the table)
    mxfp4   w = KVALUES_MXFP4[q]     scale 2^(e - 128)   (iq4_nl's blocks; planes zero point 12)
    iq4_xs  w = KVALUES[q]           scale d*(ls_i - 32) (group i of a 256-element block)
    iq3_xxs w = +-grid               scale (d*(0.5 + ls_i))*0.5
    iq3_s   w = +-grid               scale d*(1 + 2 ls_i)
    iq2_xxs w = +-grid               scale (d*(0.5 + ls_i))*0.25
    iq2_xs  w = +-grid               scale (d*(0.5 + ls_s))*0.25 per 16 elements (iq2_s too)
    iq1_s   w = 8*grid +- 1          scale d*(2 ls_i + 1)/8      (grid + delta = w / 8)
    iq1_m   w = 8*grid +- 1          scale d*(2 ls_s + 1)/8 per 16 elements

A 4-bit index becomes its int8 value by a 16-entry byte table (emit.table16: pshufb on x86); the
planes kernels dot the table of value + 128, unsigned, and take the zero point 128 off with the
activations' 16-element sums, as q8_0's. The iq3 and iq2 grids are module constants: a group's 8
(iq3, uint32) or 4 (iq2, uint64) entries are scalar loads put into one vector (llama.cpp's AVX2
dot does the same; Zen 5's gathers were slower, but for IQ3_S's 9-bit indices, which vector
operations make), its signs a byte per 8 elements tested bit by bit; every emitter derives from
the group's int8 values and scales (int8_groups), or its int8 values and scales per 16 elements
(_int8_sub16).
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4
from ...formats.i_quants import IQ1S_DELTA, KVALUES, KVALUES_MXFP4
from ...formats.iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS
from .emit import (LANES, PLANES_KBLOCK, PLANES_UNIT, SUB16_ORDER, Block, CpuFormat, PlanesBlocks, WordChunk, concat,
                   f16, f16_lanes, lanes, nibble_bytes, nibble_kunits, nibbles, signed_bytes, table16, words)
from .irgen import F32T, G, I8, I16, I32, I64, c64, call_intrinsic, const, gather, load, splat, splat_c, vec

ZERO = 128  # the planes' unsigned bytes: value + ZERO
UNSIGNED = [v + ZERO for v in KVALUES]


def _values(bd, row, off, table=KVALUES):
    """The 32 elements of the nibble group at byte `off`, in order, through the table: <32 x i8>."""
    return table16(bd, nibbles(bd, load(bd, row, off, vec(I8, G // 2))), table)


def _word_values(bd, row, off, table=KVALUES):
    """The group at byte `off` as (even, odd) words (emit.nibble_bytes' order, then the table)."""
    idx = bd.bitcast(nibble_bytes(bd, row, off), vec(I8, G))
    return signed_bytes(bd, words(bd, table16(bd, idx, table)))


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


# ------------------------------------------------------------------ iq4_nl, mxfp4


def _table32(fmt, table, zero, block_scale, scale_lanes, scale_off, planes_rows=1):
    """The record of a 32-element format whose nibbles index a 16-value table (iq4_nl, mxfp4), with
    its scale per block: block_scale(bd, row, off) -> <1 x float> (the exact decode's),
    scale_lanes(bd, row, offsets) -> <n x float>; the planes kernels dot value + zero."""
    L = fmt.layout
    unsigned = [v + zero for v in table]

    def block(bd, row, blk):
        p = bd.mul(blk, c64(L.block_bytes))
        w = bd.sext(_values(bd, row, bd.add(p, c64(L.qs)), table), vec(I16, G))
        return Block([w], block_scale(bd, row, bd.add(p, c64(scale_off))), None)

    def words_(bd, row, b0, n):
        at = [bd.mul(bd.add(b0, c64(j)), c64(L.block_bytes)) for j in range(n)]
        groups = [_word_values(bd, row, bd.add(p, c64(L.qs)), table) for p in at]
        return WordChunk(groups, scale_lanes(bd, row, [bd.add(p, c64(scale_off)) for p in at]), None)

    def planes(bd, rows, b0, nblk, xs):
        units, lane_scales, svs = [], [], []
        base = bd.mul(b0, c64(L.block_bytes))
        at = lambda j, off: bd.add(base, c64(j * L.block_bytes + off))  # noqa: E731
        for row in rows:
            sv = bd.fmul(scale_lanes(bd, row, [at(j, scale_off) for j in range(nblk)]), xs)
            svs.append(_per16(bd, sv, nblk))
            if nblk * G == PLANES_KBLOCK:  # a full chunk, on the K-quant layout
                nib = nibble_kunits(bd, [load(bd, row, at(j, L.qs), vec(I8, G // 2)) for j in range(nblk)])
                units.append([table16(bd, u, unsigned) for u in nib])
                lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [i // 2 for i in range(LANES)]))])
                continue
            units.append(_units(bd, [_values(bd, row, at(j, L.qs), unsigned) for j in range(nblk)]))
            lane_scales.append(_lane_scales(bd, sv, nblk))
        return PlanesBlocks(units, lane_scales, None, concat(bd, svs))

    return CpuFormat(fmt, block=block, words=words_, planes=planes, planes_zero=zero, planes_klayout=True,
                     planes_rows=planes_rows)


# mxfp4's planes dot value + 12 (0..24): with 128 the zero point's sums would cancel most of a dot of
# values up to 12
ZERO_MXFP4 = 12


def _e8m0_lanes(bd, row, offsets):
    """<n x float> 2^(e - 128) of the E8M0 bytes e at the offsets (ggml's GGML_E8M0_TO_FP32_HALF:
    e < 2 gives the subnormals 2^-128, 2^-127)."""
    n = len(offsets)
    e = ir.Constant(vec(I32, n), ir.Undefined)
    for i, off in enumerate(offsets):
        e = bd.insert_element(e, _byte(bd, row, off), ir.Constant(I32, i))
    small = bd.icmp_unsigned("<", e, splat_c(I32, 2, n))
    bits = bd.select(small, bd.shl(splat_c(I32, 0x00200000, n), e),
                     bd.shl(bd.sub(e, splat_c(I32, 1, n)), splat_c(I32, 23, n)))
    return bd.bitcast(bits, vec(F32T, n))


# ------------------------------------------------------------------ iq4_xs


def _iq4_xs_ints(bd, row, p):
    """<8 x i8>: ls_i - 32 of the iq4_xs block at byte p."""
    L = IQ4_XS.layout
    n = L.sub_blocks
    lo = load(bd, row, bd.add(p, c64(L.scales_l)), vec(I8, n // 2))
    lo = bd.shuffle_vector(lo, lo, const(I32, [i // 2 for i in range(n)]))
    lo = bd.and_(bd.lshr(lo, const(I8, [4 * (i % 2) for i in range(n)])), splat_c(I8, 15, n))
    sh = splat(bd, load(bd, row, bd.add(p, c64(L.scales_h)), I16), n)
    hi = bd.trunc(bd.and_(bd.lshr(sh, const(I16, [2 * i for i in range(n)])), splat_c(I16, 3, n)), vec(I8, n))
    return bd.sub(bd.or_(lo, bd.shl(hi, splat_c(I8, 4, n))), splat_c(I8, L.scale_zero, n))


def _iq4_xs_scales(bd, row, p):
    """<8 x float>: d * (ls_i - 32) of the iq4_xs block at byte p."""
    L = IQ4_XS.layout
    ls = _iq4_xs_ints(bd, row, p)
    d = f16(bd, row, bd.add(p, c64(L.d)))
    return bd.fmul(splat(bd, d, L.sub_blocks), bd.sitofp(ls, vec(F32T, L.sub_blocks)))


def _iq4_xs_ksum(bd, row, p):
    return f16(bd, row, bd.add(p, c64(IQ4_XS.layout.d))), bd.sext(_iq4_xs_ints(bd, row, p), vec(I32, 8))


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
        # on the K-quant layout (planes_klayout): its 8 groups' nibbles lie as 8 IQ4_NL blocks' do
        qs = [load(bd, row, bd.add(p, c64(L.qs + 16 * i)), vec(I8, G // 2)) for i in range(n)]
        units.append([table16(bd, u, UNSIGNED) for u in nibble_kunits(bd, qs)])
        lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [i // 2 for i in range(LANES)]))])
    return PlanesBlocks(units, lane_scales, None, concat(bd, svs))


# ------------------------------------------------------------------ iq3, iq2: grids and signs


def _table(bd, name, ty, entries):
    """The module's constant array `name` (made once per module)."""
    g = bd.module.globals.get(name)
    if g is None:
        at = ir.ArrayType(ty, len(entries))
        g = ir.GlobalVariable(bd.module, at, name)
        top = 1 << ty.width  # entries as the signed ints of their width
        g.initializer = ir.Constant(at, [e - top if e >= top // 2 else e for e in entries])
        g.global_constant = True
        g.linkage = "internal"
    return g


def _signed(bd, mags, sign_bytes):
    """<32 x i8> magnitudes with element e negated where bit e % 8 of sign byte e // 8 is set."""
    sb = bd.shuffle_vector(sign_bytes, sign_bytes, const(I32, [e // 8 for e in range(G)]))
    neg = bd.icmp_unsigned("!=", bd.and_(sb, const(I8, [(1 << (e % 8)) - 256 * (e % 8 == 7) for e in range(G)])),
                           splat_c(I8, 0, G))
    return bd.select(neg, bd.sub(splat_c(I8, 0, G), mags), mags)


def _grid_values(bd, grid, idx):
    """8 (uint32 entries) or 4 (uint64) grid entries -> <32 x i8>: their magnitudes, in order.
    idx: a list of i32 (scalar loads put into a vector) or <n x i32> (one gather)."""
    if isinstance(idx, list):
        v = ir.Constant(vec(grid.type.pointee.element, len(idx)), ir.Undefined)
        for j, i in enumerate(idx):
            v = bd.insert_element(v, bd.load(bd.gep(grid, [ir.Constant(I32, 0), i])), ir.Constant(I32, j))
        return bd.bitcast(v, vec(I8, G))
    return bd.bitcast(gather(bd, grid, idx), vec(I8, G))


def _byte(bd, row, off):
    return bd.zext(load(bd, row, off, I8), I32)


# KSIGNS[k] is k with bit 7 set to the parity of k's 7 bits (an even count of minus signs)
assert list(KSIGNS) == [k | (bin(k).count("1") & 1) << 7 for k in range(128)]


def _ksigns(bd, fields, vector):
    """<4 x i8>: the KSIGNS bytes of four 7-bit fields: four table loads (fields: a list of i32),
    or (vector: fields <4 x i32>) from the fields' parity by a vector popcount, AVX-512's vpopcntd
    (the planes kernels: IQ3_XXS 0.82x the time; on AVX2 the popcount is an expansion of a dozen
    operations, 1.2x)."""
    if not vector:
        ks = _table(bd, "ksigns_iq2xs", I8, KSIGNS)
        sb = ir.Constant(vec(I8, 4), ir.Undefined)
        for k, f in enumerate(fields):
            sb = bd.insert_element(sb, bd.load(bd.gep(ks, [ir.Constant(I32, 0), f])), ir.Constant(I32, k))
        return sb
    odd = bd.and_(call_intrinsic(bd, "llvm.ctpop.v4i32", fields.type, [fields]), splat_c(I32, 1, 4))
    return bd.trunc(bd.or_(fields, bd.shl(odd, splat_c(I32, 7, 4))), vec(I8, 4))


def _aux_signs(bd, aux, vector):
    """The KSIGNS bytes of the 4 seven-bit fields at bits 0, 7, 14, 21 of aux (i32)."""
    if vector:
        return _ksigns(bd, bd.and_(bd.lshr(splat(bd, aux, 4), const(I32, [0, 7, 14, 21])), splat_c(I32, 127, 4)), True)
    return _ksigns(bd, [bd.and_(bd.lshr(aux, ir.Constant(I32, 7 * k)), ir.Constant(I32, 127)) for k in range(4)],
                   False)


def _iq3_xxs_values(bd, row, p, i, vector=False):
    L = IQ3_XXS.layout
    grid = _table(bd, "iq3xxs_grid", I32, IQ3XXS_GRID)
    mags = _grid_values(bd, grid, [_byte(bd, row, bd.add(p, c64(L.qs + 8 * i + j))) for j in range(8)])
    return _signed(bd, mags, _aux_signs(bd, load(bd, row, bd.add(p, c64(L.aux + 4 * i)), I32), vector))


def _iq3_xxs_ls(bd, row, p):
    """<8 x i32>: ls_i, the top 4 bits of group i's aux word."""
    return bd.lshr(load(bd, row, bd.add(p, c64(IQ3_XXS.layout.aux)), vec(I32, 8)), splat_c(I32, 28, 8))


def _iq3_xxs_scales(bd, row, p):
    L = IQ3_XXS.layout
    ls = bd.uitofp(_iq3_xxs_ls(bd, row, p), vec(F32T, 8))
    d = splat(bd, f16(bd, row, bd.add(p, c64(L.d))), 8)
    return bd.fmul(bd.fmul(d, bd.fadd(splat_c(F32T, 0.5, 8), ls)), splat_c(F32T, 0.5, 8))


def _iq3_s_values(bd, row, p, i, vector=False):
    """Entry j of group i: qs byte 8i + j plus bit j of qh[i] as bit 8. vector: the 9-bit indices
    by vector operations and one gather (on AVX-512, 0.7x the kernel's time of eight scalar index
    computations and loads; AVX2's gathers took 1.35x)."""
    L = IQ3_S.layout
    grid = _table(bd, "iq3s_grid", I32, IQ3S_GRID)
    qh = _byte(bd, row, bd.add(p, c64(L.qh + i)))
    if vector:
        lo = bd.zext(load(bd, row, bd.add(p, c64(L.qs + 8 * i)), vec(I8, 8)), vec(I32, 8))
        hi = bd.and_(bd.lshr(splat(bd, qh, 8), const(I32, range(8))), splat_c(I32, 1, 8))
        idx = bd.or_(lo, bd.shl(hi, splat_c(I32, 8, 8)))
    else:
        idx = [bd.or_(_byte(bd, row, bd.add(p, c64(L.qs + 8 * i + j))),
                      bd.shl(bd.and_(bd.lshr(qh, ir.Constant(I32, j)), ir.Constant(I32, 1)), ir.Constant(I32, 8)))
               for j in range(8)]
    return _signed(bd, _grid_values(bd, grid, idx), load(bd, row, bd.add(p, c64(L.signs + 4 * i)), vec(I8, 4)))


def _iq3_s_odd(bd, row, p):
    """<8 x i8>: 1 + 2 ls_i."""
    raw = load(bd, row, bd.add(p, c64(IQ3_S.layout.scales)), vec(I8, 4))
    ls = bd.shuffle_vector(raw, raw, const(I32, [i // 2 for i in range(8)]))
    ls = bd.and_(bd.lshr(ls, const(I8, [4 * (i % 2) for i in range(8)])), splat_c(I8, 15, 8))
    return bd.or_(bd.shl(ls, splat_c(I8, 1, 8)), splat_c(I8, 1, 8))


def _iq3_s_scales(bd, row, p):
    odd = _iq3_s_odd(bd, row, p)
    return bd.fmul(splat(bd, f16(bd, row, bd.add(p, c64(IQ3_S.layout.d))), 8), bd.uitofp(odd, vec(F32T, 8)))


def _iq3_s_ksum(bd, row, p):
    return f16(bd, row, bd.add(p, c64(IQ3_S.layout.d))), bd.zext(_iq3_s_odd(bd, row, p), vec(I32, 8))


def _iq2_xxs_values(bd, row, p, i, vector=False):
    L = IQ2_XXS.layout
    grid = _table(bd, "iq2xxs_grid", I64, IQ2XXS_GRID)
    mags = _grid_values(bd, grid, [_byte(bd, row, bd.add(p, c64(L.qs + 8 * i + j))) for j in range(4)])
    return _signed(bd, mags, _aux_signs(bd, load(bd, row, bd.add(p, c64(L.qs + 8 * i + 4)), I32), vector))


def _iq2_xxs_ls(bd, row, p):
    """<8 x i32>: ls_i, the top 4 bits of group i's second word."""
    q = load(bd, row, bd.add(p, c64(IQ2_XXS.layout.qs)), vec(I32, 16))
    aux = bd.shuffle_vector(q, q, const(I32, range(1, 16, 2)))
    return bd.lshr(aux, splat_c(I32, 28, 8))


def _iq2_xxs_scales(bd, row, p):
    L = IQ2_XXS.layout
    ls = bd.uitofp(_iq2_xxs_ls(bd, row, p), vec(F32T, 8))
    d = splat(bd, f16(bd, row, bd.add(p, c64(L.d))), 8)
    return bd.fmul(bd.fmul(d, bd.fadd(splat_c(F32T, 0.5, 8), ls)), splat_c(F32T, 0.25, 8))


def _odd_ksum(ls_of, d_at, f):
    """The ksum of a scale (d * (0.5 + ls_i)) * f: (d * f / 2, 2 ls_i + 1), the same product exactly
    (f a power of two, 2 ls_i + 1 <= 31)."""

    def ksum(bd, row, p):
        ls = ls_of(bd, row, p)
        d = f16(bd, row, bd.add(p, c64(d_at)))
        return bd.fmul(d, ir.Constant(F32T, f / 2)), bd.or_(bd.shl(ls, splat_c(I32, 1, 8)), splat_c(I32, 1, 8))

    return ksum


def _iq2_xs_values(bd, row, p, i, vector=False):
    """Entries 4i .. 4i + 3: u16 q, grid index q & 511, KSIGNS index q >> 9."""
    L = IQ2_XS.layout
    grid = _table(bd, "iq2xs_grid", I64, IQ2XS_GRID)
    qs = [bd.zext(load(bd, row, bd.add(p, c64(L.qs + 8 * i + 2 * k)), I16), I32) for k in range(4)]
    mags = _grid_values(bd, grid, [bd.and_(q, ir.Constant(I32, 511)) for q in qs])
    if vector:
        qv = bd.zext(load(bd, row, bd.add(p, c64(L.qs + 8 * i)), vec(I16, 4)), vec(I32, 4))
        return _signed(bd, mags, _ksigns(bd, bd.lshr(qv, splat_c(I32, 9, 4)), True))
    return _signed(bd, mags, _ksigns(bd, [bd.lshr(q, ir.Constant(I32, 9)) for q in qs], False))


def _iq2_s_values(bd, row, p, i):
    """Entries 4i .. 4i + 3: qs byte plus 2 bits of qh[i] as bits 8-9; their sign bytes as stored."""
    L = IQ2_S.layout
    grid = _table(bd, "iq2s_grid", I64, IQ2S_GRID)
    qh = _byte(bd, row, bd.add(p, c64(L.qh + i)))
    idx = [bd.or_(_byte(bd, row, bd.add(p, c64(L.qs + 4 * i + k))),
                  bd.shl(bd.and_(bd.lshr(qh, ir.Constant(I32, 2 * k)), ir.Constant(I32, 3)), ir.Constant(I32, 8)))
           for k in range(4)]
    return _signed(bd, _grid_values(bd, grid, idx), load(bd, row, bd.add(p, c64(L.signs + 4 * i)), vec(I8, 4)))


def _iq2_scales16(fmt):
    """iq2_xs / iq2_s: (2 ls_s + 1 as <16 x i16>, (d * (0.5 + ls_s)) * 0.25 as <16 x float>, d / 8)."""
    L = fmt.layout

    def scales(bd, row, p):
        raw = load(bd, row, bd.add(p, c64(L.scales)), vec(I8, 8))
        ls = bd.shuffle_vector(raw, raw, const(I32, [s // 2 for s in range(16)]))
        ls = bd.and_(bd.lshr(ls, const(I8, [4 * (s % 2) for s in range(16)])), splat_c(I8, 15, 16))
        d = f16(bd, row, bd.add(p, c64(L.d)))
        exact = bd.fmul(bd.fmul(splat(bd, d, 16), bd.fadd(splat_c(F32T, 0.5, 16), bd.uitofp(ls, vec(F32T, 16)))),
                        splat_c(F32T, 0.25, 16))
        odd = bd.or_(bd.shl(bd.zext(ls, vec(I16, 16)), splat_c(I16, 1, 16)), splat_c(I16, 1, 16))  # 2 ls + 1
        return odd, exact, bd.fmul(d, ir.Constant(F32T, 0.125))

    return scales


# iq1: w = 8 * grid + 1 - 2 * (delta's sign bit), so that grid + delta = w * IQ1S_DELTA exactly
assert IQ1S_DELTA == 1 / 8


def _iq1_grid_w(entry: int, neg: int) -> int:
    """An iq1s_grid entry's eight bytes g as 8 g + 1, or 8 g - 1 (neg), packed the same way."""
    out = 0
    for j in range(8):
        g = (entry >> 8 * j) & 0xFF
        out |= ((8 * (g - 256 * (g >= 128)) + (-1 if neg else 1)) & 0xFF) << 8 * j
    return out


# iq1's w = 8 grid +- 1 by one table load: entry idx | sign << 11, the sign the delta's (iq1_s: the
# group's, iq1_m: the entry's, the bit above its 3 index bits), where the grid's shift and the
# delta's add were vector operations a group: a hot 2048 x 2048 matrix's decode 1.2x (iq1_s) and
# 1.1-1.3x (iq1_m) faster, one thread.
IQ1_GRID_W = [_iq1_grid_w(e, neg) for neg in (0, 1) for e in IQ1S_GRID]


def _iq1_w(bd, idx):
    """4 iq1 entries (i32 indices with the delta's sign as bit 11) -> <32 x i8> w."""
    return _grid_values(bd, _table(bd, "iq1_grid_w", I64, IQ1_GRID_W), idx)


def _iq1_s_values(bd, row, p, i):
    """Entry k of group i: qs byte 4i + k plus bits 3k .. 3k + 2 of qh[i] as bits 8-10; the group's
    delta sign, qh's bit 15, as bit 11."""
    L = IQ1_S.layout
    qh = bd.zext(load(bd, row, bd.add(p, c64(L.qh + 2 * i)), I16), I32)
    neg = bd.and_(bd.lshr(qh, ir.Constant(I32, 4)), ir.Constant(I32, 0x800))
    return _iq1_w(bd, [bd.or_(bd.or_(_byte(bd, row, bd.add(p, c64(L.qs + 4 * i + k))), neg),
                              bd.shl(bd.and_(bd.lshr(qh, ir.Constant(I32, 3 * k)), ir.Constant(I32, 7)),
                                     ir.Constant(I32, 8)))
                       for k in range(4)])


def _iq1_s_odd(bd, row, p):
    """<8 x i16>: 2 ls_i + 1."""
    qh = load(bd, row, bd.add(p, c64(IQ1_S.layout.qh)), vec(I16, 8))
    return bd.or_(bd.and_(bd.lshr(qh, splat_c(I16, 11, 8)), splat_c(I16, 14, 8)), splat_c(I16, 1, 8))


def _iq1_s_scales(bd, row, p):
    """<8 x float>: d * (2 ls_i + 1) / 8."""
    L = IQ1_S.layout
    odd = _iq1_s_odd(bd, row, p)
    d = splat(bd, f16(bd, row, bd.add(p, c64(L.d))), 8)
    return bd.fmul(bd.fmul(d, bd.uitofp(odd, vec(F32T, 8))), splat_c(F32T, IQ1S_DELTA, 8))


def _iq1_s_ksum(bd, row, p):
    d = f16(bd, row, bd.add(p, c64(IQ1_S.layout.d)))
    return bd.fmul(d, ir.Constant(F32T, IQ1S_DELTA)), bd.zext(_iq1_s_odd(bd, row, p), vec(I32, 8))


def _iq1_m_values(bd, row, p, i):
    """Entry k of group i: qs byte 4i + k plus bits 4k .. 4k + 3 of the group's 16 qh bits as bits
    8-11 (3 index bits, then its delta's sign)."""
    L = IQ1_M.layout
    qh = bd.zext(load(bd, row, bd.add(p, c64(L.qh + 2 * i)), I16), I32)
    return _iq1_w(bd, [bd.or_(_byte(bd, row, bd.add(p, c64(L.qs + 4 * i + k))),
                              bd.shl(bd.and_(bd.lshr(qh, ir.Constant(I32, 4 * k)), ir.Constant(I32, 15)),
                                     ir.Constant(I32, 8)))
                       for k in range(4)])


def _iq1_m_scales16(bd, row, p):
    """(2 ls_s + 1 as <16 x i16>, d * (2 ls_s + 1) / 8 as <16 x float>, d / 8); d from the top
    nibbles of the 4 scale words."""
    L = IQ1_M.layout
    sc = load(bd, row, bd.add(p, c64(L.scales)), vec(I16, 4))
    top = bd.lshr(sc, splat_c(I16, 12, 4))
    dbits = None
    for k in range(4):
        part = bd.shl(bd.extract_element(top, ir.Constant(I32, k)), ir.Constant(I16, 4 * k))
        dbits = part if dbits is None else bd.or_(dbits, part)
    d = bd.fpext(bd.bitcast(dbits, ir.HalfType()), F32T)
    ls = bd.shuffle_vector(sc, sc, const(I32, [s // 4 for s in range(16)]))
    ls = bd.and_(bd.lshr(ls, const(I16, [3 * (s % 4) for s in range(16)])), splat_c(I16, 7, 16))
    odd = bd.or_(bd.shl(ls, splat_c(I16, 1, 16)), splat_c(I16, 1, 16))
    exact = bd.fmul(bd.fmul(splat(bd, d, 16), bd.uitofp(odd, vec(F32T, 16))), splat_c(F32T, IQ1S_DELTA, 16))
    return odd, exact, bd.fmul(d, ir.Constant(F32T, IQ1S_DELTA))


def _vector(values):
    """values(..., vector=True): a grid format's values on AVX-512's vector popcount and gathers."""
    return lambda bd, row, p, i: values(bd, row, p, i, vector=True)


def _by_block(fmt, ksum):
    """A record's ksum, (bd, row, blk), from one of the block's byte offset p."""
    return lambda bd, row, blk: ksum(bd, row, bd.mul(blk, c64(fmt.layout.block_bytes)))


def int8_groups(fmt, values, scales, zero=ZERO, chunks=True, planes_values=None, ksum=None):
    """The record of a 256-element format from its groups' int8 values and its <8 x float> scales;
    the planes kernels dot value + zero, unsigned (zero: at least minus the least value; a small
    zero for small values, emit_ternary's, kept the zero point's float sums from cancelling most of
    the dot's f32 bits; on the K-quant layout it comes off in the integer dot). chunks: the
    record's planes_chunks; planes_values: the values as the planes kernels (AVX-512) take them,
    when they have a faster way there (_vector); ksum (bd, row, p) -> (d, <8 x i32> isc) with
    scales = d * isc exactly: the record's (emit.CpuFormat.ksum) at byte p."""
    L = fmt.layout
    n = L.sub_blocks
    planes_values = planes_values or values

    def block(bd, row, blk):
        p = bd.mul(blk, c64(L.block_bytes))
        return Block([bd.sext(values(bd, row, p, i), vec(I16, G)) for i in range(n)], scales(bd, row, p), None)

    def words_(bd, row, b0, nb):
        p = bd.mul(b0, c64(L.block_bytes))
        groups = [signed_bytes(bd, words(bd, values(bd, row, p, i))) for i in range(n)]
        return WordChunk(groups, scales(bd, row, p), None)

    def planes(bd, rows, fb, nblk, xs8):
        p = bd.mul(fb, c64(L.block_bytes))
        units, lane_scales, svs = [], [], []
        for row in rows:
            sv = bd.fmul(scales(bd, row, p), xs8)
            svs.append(_per16(bd, sv, n))
            shift = (lambda v: bd.xor(v, splat_c(I8, -128, G))) if zero == ZERO else \
                (lambda v: bd.add(v, splat_c(I8, zero, G)))
            units.append(_units(bd, [shift(planes_values(bd, row, p, i)) for i in range(n)]))
            lane_scales.append(_lane_scales(bd, sv, n))
        return PlanesBlocks(units, lane_scales, None, concat(bd, svs))

    return CpuFormat(fmt, block=block, words=words_, planes=planes, planes_zero=zero, planes_chunks=chunks,
                     planes_rows=2, ksum=ksum and _by_block(fmt, ksum))


def _int8_sub16(fmt, values, scales16, planes_values=None):
    """The record of a 256-element format from its groups' int8 values v and, per 16 elements, an
    odd integer m, the scale s as the numpy decode computes it and a common base b with s = b * m
    exactly: the blocks' weights m * v (at most 31 * 43) with scale b, their exact decode s * v; the
    words and planes kernels dot v and take the scales s per 16 elements (words_sub16; lane i of
    planes unit u: 16 elements 4u + i // 4); the q8 super-block tiles (ksum) take v, m and b.
    planes_values: as int8_groups'."""
    L = fmt.layout
    n = L.sub_blocks
    planes_values = planes_values or values
    per_group = lambda i: const(I32, [2 * i] * (G // 2) + [2 * i + 1] * (G // 2))  # noqa: E731

    def block(bd, row, blk):
        p = bd.mul(blk, c64(L.block_bytes))
        mult, exact, base = scales16(bd, row, p)
        w, ex = [], []
        for i in range(n):
            v = bd.sext(values(bd, row, p, i), vec(I16, G))
            w.append(bd.mul(v, bd.shuffle_vector(mult, mult, per_group(i))))
            ex.append((bd.shuffle_vector(exact, exact, per_group(i)), v))
        return Block(w, splat(bd, base, n), None, ex)

    def words_(bd, row, b0, nb):
        p = bd.mul(b0, c64(L.block_bytes))
        _, exact, _ = scales16(bd, row, p)
        groups = [signed_bytes(bd, words(bd, values(bd, row, p, i))) for i in range(n)]
        return WordChunk(groups, bd.shuffle_vector(exact, exact, const(I32, SUB16_ORDER)), None)

    def planes(bd, rows, fb, nblk, xs8):
        p = bd.mul(fb, c64(L.block_bytes))
        xs16 = bd.shuffle_vector(xs8, xs8, const(I32, [s // 2 for s in range(2 * n)]))
        units, lane_scales, svs = [], [], []
        for row in rows:
            sv = bd.fmul(scales16(bd, row, p)[1], xs16)
            svs.append(sv)
            units.append(_units(bd, [bd.xor(planes_values(bd, row, p, i), splat_c(I8, -128, G)) for i in range(n)]))
            lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [4 * u + i // 4 for i in range(LANES)]))
                                for u in range(n // 2)])
        return PlanesBlocks(units, lane_scales, None, concat(bd, svs))

    def ksum(bd, row, p):
        mult, _, base = scales16(bd, row, p)
        return base, bd.zext(mult, vec(I32, 2 * n))

    return CpuFormat(fmt, block=block, words=words_, planes=planes, planes_zero=ZERO, words_sub16=True,
                     planes_chunks=False, planes_rows=2, ksum=_by_block(fmt, ksum))


RECORDS = [_table32(IQ4_NL, KVALUES, ZERO, lambda bd, row, off: lanes(bd, f16(bd, row, off)), f16_lanes,
                    IQ4_NL.layout.d),
           _table32(MXFP4, KVALUES_MXFP4, ZERO_MXFP4, lambda bd, row, off: _e8m0_lanes(bd, row, [off]), _e8m0_lanes,
                    MXFP4.layout.e, planes_rows=2),
           CpuFormat(IQ4_XS, block=_iq4_xs, words=_iq4_xs_words, planes=_iq4_xs_planes, planes_zero=ZERO,
                     planes_klayout=True, ksum=_by_block(IQ4_XS, _iq4_xs_ksum)),
           int8_groups(IQ3_XXS, _iq3_xxs_values, _iq3_xxs_scales, planes_values=_vector(_iq3_xxs_values),
                       ksum=_odd_ksum(_iq3_xxs_ls, IQ3_XXS.layout.d, 0.5)),
           int8_groups(IQ3_S, _iq3_s_values, _iq3_s_scales, planes_values=_vector(_iq3_s_values), ksum=_iq3_s_ksum),
           int8_groups(IQ2_XXS, _iq2_xxs_values, _iq2_xxs_scales, planes_values=_vector(_iq2_xxs_values),
                       ksum=_odd_ksum(_iq2_xxs_ls, IQ2_XXS.layout.d, 0.25)),
           _int8_sub16(IQ2_XS, _iq2_xs_values, _iq2_scales16(IQ2_XS), planes_values=_vector(_iq2_xs_values)),
           _int8_sub16(IQ2_S, _iq2_s_values, _iq2_scales16(IQ2_S)),
           int8_groups(IQ1_S, _iq1_s_values, _iq1_s_scales, chunks=False, ksum=_iq1_s_ksum),
           _int8_sub16(IQ1_M, _iq1_m_values, _iq1_m_scales16)]
# IQ2_XS, IQ2_S, IQ1_S and IQ1_M keep their units a unit at a time (planes_chunks): transposed onto
# the K-quant layout their one-token kernels took up to 1.18x the time (IQ2_S), and IQ1_S's and
# IQ1_M's four-token kernels gained nothing
