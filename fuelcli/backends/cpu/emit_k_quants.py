"""The CPU emitters of ggml's K-quants (layouts and bit drawings: fuelcli/formats/k_quants.py).

    q4_k  w = q                   scale d*sc_i,   min -(dmin*m_i)   (sub-block i = group i)
    q5_k  w = q (5 bits)          as q4_k         (the 5th bit of group i: bit i of qh's bytes)
    q6_k  w = (q - 32) * sc_s     scale d         (|w| <= 4096: the 16-element scales are folded in)
    q3_k  w = (q - 4) * sc_s      scale d         (sc_s the signed 6-bit scale: |w| <= 128)
    q2_k  w = q * sc_s            scale d,        min -(dmin*m_s) per 16 elements (min_sub16: |w| <= 45)

A K-quant block is 8 groups, so its sub-block indices are compile-time constants; the 6-bit scales
are unpacked a block at a time (_q4_k_scale_bytes), not per group.
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .emit import (LANES, PLANES_KBLOCK, PLANES_UNIT, SUB16_ORDER, Block, CpuFormat, LaneBlock, PlanesBlocks,
                   WordChunk, concat, f16, f16_lanes, words, wsplat)
from .irgen import F32T, G, I8, I16, I32, I64, c64, call_intrinsic, const, load, splat, splat_c, vec


# ------------------------------------------------------------------ block


def _q4_k_ints(bd, blocks, L=Q4_K.layout):
    """<8n x i8> the six-bit scales sc_i and mins m_i of n blocks [(row, byte offset)], block after
    block, out of each block's 12 scale bytes by 32-bit integer operations (_q4_k_scale_bytes: the
    integer pipes, idle in the planes kernels, where the vector ones are the bound: byte shuffles,
    masks and shifts there took 1.09x the one-token kernel's time on Zen 4). L: the layout (q4_k's
    or q5_k's: the same d, dmin and scales)."""
    n, m = L.sub_blocks, len(blocks)
    raws = [_q4_k_scale_bytes(bd, row, p, L) for row, p in blocks]
    sm = concat(bd, raws)  # per block: [scales 0-7 | mins 0-7]
    sc = bd.shuffle_vector(sm, sm, const(I32, [16 * b + i for b in range(m) for i in range(n)]))
    mn = bd.shuffle_vector(sm, sm, const(I32, [16 * b + n + i for b in range(m) for i in range(n)]))
    return sc, mn


def _q4_k_scales(bd, blocks, L=Q4_K.layout):
    """<8n x float> d * sc_i and -(dmin * m_i) of n blocks [(row, byte offset)], block after block
    (_q4_k_ints): one widening and one conversion for all the scales, one for the mins."""
    n, m = L.sub_blocks, len(blocks)
    sc, mn = _q4_k_ints(bd, blocks, L)

    # d and dmin of every block converted at once: [d_0, dmin_0, d_1, dmin_1]
    dd = f16_lanes(bd, [row for row, _ in blocks for _ in range(2)],
                    [bd.add(p, c64(off)) for _, p in blocks for off in (L.d, L.dmin)])

    def per_block(j):  # <8n x float>: block b's d (j = 0) or dmin (j = 1) in its 8 lanes
        return bd.shuffle_vector(dd, dd, const(I32, [2 * b + j for b in range(m) for _ in range(n)]))

    scale = bd.fmul(per_block(0), bd.uitofp(sc, vec(F32T, n * m)))
    mins = bd.fneg(bd.fmul(per_block(1), bd.uitofp(mn, vec(F32T, n * m))))
    return scale, mins


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


def _shift(bd, v, n, mask):
    """v >> n (v << -n where n < 0), masked: a bit moved into place in each byte of v's lanes."""
    t = v.type
    amount = lambda k: ir.Constant(t, [k] * t.count)  # noqa: E731
    s = v if n == 0 else bd.lshr(v, amount(n)) if n > 0 else bd.shl(v, amount(-n))
    return bd.and_(s, ir.Constant(t, [mask] * t.count))


def _q5_k(bd, row, blk):
    L = Q5_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    scale, mins = _q4_k_scales(bd, [(row, p)], L)
    qh = load(bd, row, bd.add(p, c64(L.qh)), vec(I8, G))
    w = []
    for i in range(L.sub_blocks):  # as q4_k, with bit i of qh's bytes as bit 4
        qs = load(bd, row, bd.add(p, c64(L.qs + (i // 2) * L.sub_elems)), vec(I8, G))
        q = bd.and_(qs, splat_c(I8, 15, G)) if i % 2 == 0 else bd.lshr(qs, splat_c(I8, 4, G))
        w.append(bd.zext(bd.or_(q, _shift(bd, qh, i - 4, 0x10)), vec(I16, G)))
    return Block(w, scale, mins)


def _q2_k_scales(bd, row, p):
    """(sc, m): <16 x i8> each, the 4-bit scales (low nibbles) and mins (high nibbles) of the 16
    sub-blocks of the Q2_K block at byte p, and <2 x float> its d and dmin."""
    L = Q2_K.layout
    raw = load(bd, row, bd.add(p, c64(L.scales)), vec(I8, L.sub_blocks))
    dd = f16_lanes(bd, row, [bd.add(p, c64(L.d)), bd.add(p, c64(L.dmin))])
    return bd.and_(raw, splat_c(I8, 15, L.sub_blocks)), bd.lshr(raw, splat_c(I8, 4, L.sub_blocks)), dd


def _per_sub(bd, dd, j, v, order):
    """<16 x float>: dd[j] (d or dmin) times the 4-bit values v (<16 x i8>) in the lane order given."""
    n = len(order)
    return bd.fmul(bd.shuffle_vector(dd, dd, const(I32, [j] * n)),
                   bd.uitofp(bd.shuffle_vector(v, v, const(I32, order)), vec(F32T, n)))


def _q2_k(bd, row, blk):
    L = Q2_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    sc, mn, dd = _q2_k_scales(bd, row, p)
    scs = bd.zext(sc, vec(I16, L.sub_blocks))
    w = []
    for h in range(L.block_elems // L.half):
        qs = load(bd, row, bd.add(p, c64(L.qs + h * G)), vec(I8, G))
        for k in range(4):
            g = 4 * h + k  # group g: bits 2k of qs[32h ..], sub-blocks 2g and 2g + 1
            scv = bd.shuffle_vector(scs, scs, const(I32, [2 * g] * (G // 2) + [2 * g + 1] * (G // 2)))
            w.append(bd.mul(bd.zext(_shift(bd, qs, 2 * k, 3), vec(I16, G)), scv))
    mins = bd.fneg(_per_sub(bd, dd, 1, mn, range(L.sub_blocks)))
    return Block(w, bd.shuffle_vector(dd, dd, const(I32, [0] * (L.block_elems // G))), mins)


def _q3_k_scales(bd, row, p):
    """<16 x i8>: the 16 signed sub-block scales sc_s - 32 of the Q3_K block at byte p: the low 4
    bits from the nibbles of scales[0..7], the top 2 from scales[8..11] (formats/k_quants.py)."""
    L = Q3_K.layout
    n = L.sub_blocks
    lo8 = load(bd, row, bd.add(p, c64(L.scales)), vec(I8, 8))
    hi4 = load(bd, row, bd.add(p, c64(L.scales + 8)), vec(I8, 4))
    lo = bd.shuffle_vector(lo8, lo8, const(I32, [s % 8 for s in range(n)]))
    lo = bd.and_(bd.lshr(lo, const(I8, [4 * (s // 8) for s in range(n)])), splat_c(I8, 15, n))
    hi = bd.shuffle_vector(hi4, hi4, const(I32, [s % 4 for s in range(n)]))
    hi = bd.and_(bd.lshr(hi, const(I8, [2 * (s // 4) for s in range(n)])), splat_c(I8, 3, n))
    return bd.sub(bd.or_(lo, bd.shl(hi, splat_c(I8, 4, n))), splat_c(I8, L.scale_zero, n))


def _q3_k(bd, row, blk):
    L = Q3_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    scs = bd.sext(_q3_k_scales(bd, row, p), vec(I16, L.sub_blocks))
    hm = load(bd, row, bd.add(p, c64(L.hmask)), vec(I8, G))
    w, exact = [], []
    for h in range(L.block_elems // L.half):
        qs = load(bd, row, bd.add(p, c64(L.qs + h * G)), vec(I8, G))
        for k in range(4):
            g = 4 * h + k  # group g: bits 2k of qs[32h ..], bit g of hmask
            ql = bd.and_(bd.lshr(qs, splat_c(I8, 2 * k, G)), splat_c(I8, 3, G))
            q = bd.sub(bd.or_(ql, _shift(bd, hm, g - 2, 4)), splat_c(I8, L.zero, G))
            scv = bd.shuffle_vector(scs, scs, const(I32, [2 * g] * (G // 2) + [2 * g + 1] * (G // 2)))
            q16 = bd.sext(q, vec(I16, G))
            w.append(bd.mul(q16, scv))
            exact.append((bd.fmul(splat(bd, d, G), bd.sitofp(scv, vec(F32T, G))), q16))
    return Block(w, splat(bd, d, L.block_elems // G), None, exact)


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



# ------------------------------------------------------------------ ksum: d and the integer sub-block scales


def _q4_k_ksum(bd, row, blk, L=Q4_K.layout):
    p = bd.mul(blk, c64(L.block_bytes))
    sc, _ = _q4_k_ints(bd, [(row, p)], L)
    return f16(bd, row, bd.add(p, c64(L.d))), bd.zext(sc, vec(I32, L.sub_blocks))


def _q5_k_ksum(bd, row, blk):
    return _q4_k_ksum(bd, row, blk, Q5_K.layout)


def _q3_k_ksum(bd, row, blk):
    L = Q3_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    return f16(bd, row, bd.add(p, c64(L.d))), bd.sext(_q3_k_scales(bd, row, p), vec(I32, L.sub_blocks))


def _q6_k_ksum(bd, row, blk):
    L = Q6_K.layout
    p = bd.mul(blk, c64(L.block_bytes))
    isc = bd.sext(load(bd, row, bd.add(p, c64(L.scales)), vec(I8, L.sub_blocks)), vec(I32, L.sub_blocks))
    return f16(bd, row, bd.add(p, c64(L.d))), isc


def _q2_k_ksum(bd, row, blk):
    L = Q2_K.layout
    return f16(bd, row, bd.add(bd.mul(blk, c64(L.block_bytes)), c64(L.d))), None


# ------------------------------------------------------------------ planes


# Q4_K's units read the activations' K-quant layout (planes_klayout; core.py's quantize writes it): in each block of
# PLANES_KBLOCK elements, lane i of unit u holds elements 16i + 4u .. 16i + 4u + 3, so lane i of every
# unit lies in the block's 16-element row i (sub-block i // 2): the four units of a block share one
# lane map, their dots sum in one accumulator and are converted and scaled once a block, not once a
# unit (one thread, an 8960 x 1536 matrix from L3: 0.83-0.85x the time). Each unit's weights
# are gathered from the stored block with one permute of its dwords.
assert PLANES_KBLOCK == Q4_K.layout.block_elems
KDW_Q4_K = [8 * (i // 4) + 4 * (i % 2) for i in range(LANES)]  # qs dword of lane i, unit 0: chunk
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
    sv = bd.fmul(scale, concat(bd, [xs_odd] * len(rows)))
    mask = const(I32, [0x0F0F0F0F if (i // 2) % 2 == 0 else 0xF0F0F0F0 - (1 << 32) for i in range(LANES)])
    units, lane_scales = [], []
    for r, row in enumerate(rows):
        q0, q1 = (load(bd, row, bd.add(p, c64(L.qs + 64 * h)), vec(I32, LANES)) for h in range(2))
        units.append([bd.bitcast(bd.and_(bd.shuffle_vector(q0, q1, const(I32, [d + u for d in KDW_Q4_K])), mask),
                                 vec(I8, PLANES_UNIT)) for u in range(4)])
        lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [n * r + i // 2 for i in range(LANES)]))])
    return PlanesBlocks(units, lane_scales, mins, None)


_ODD = [(i // 2) % 2 for i in range(LANES)]  # 1 where lane i of the K-quant layout lies in an odd sub-block


def _q5_k_planes(bd, rows, fb, nblk, xs8):
    """On the K-quant layout (planes_klayout), as Q4_K's: unit u, lane i is qs dword KDW_Q4_K[i] + u
    shifted down to its nibble (the high one in an odd sub-block: 5 bits do not fit a byte as 16 * q),
    with qh dword 4 (i % 2) + u rotated to bring bit i // 2 (the sub-block's) of each byte to bit 4:
    two permutes, a shift, a rotate and two masks a unit (plain units transposed onto the layout by
    the kernel took 1.34x the one-token time on Zen 4). One lane-scale vector a row."""
    L = Q5_K.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    scale, mins = _q4_k_scales(bd, [(row, p) for row in rows], L)
    sv = bd.fmul(scale, concat(bd, [xs8] * len(rows)))
    lanes = vec(I32, LANES)
    down = const(I32, [4 * o for o in _ODD])
    rotate = const(I32, [(4 - i // 2) % 32 for i in range(LANES)])
    units, lane_scales = [], []
    for r, row in enumerate(rows):
        q0, q1 = (load(bd, row, bd.add(p, c64(L.qs + 64 * h)), lanes) for h in range(2))
        qh = load(bd, row, bd.add(p, c64(L.qh)), vec(I32, LANES // 2))
        units.append([])
        for u in range(4):
            lo = bd.lshr(bd.shuffle_vector(q0, q1, const(I32, [d + u for d in KDW_Q4_K])), down)
            h = bd.shuffle_vector(qh, qh, const(I32, [4 * (i % 2) + u for i in range(LANES)]))
            hb = call_intrinsic(bd, f"llvm.fshl.v{LANES}i32", lanes, [h, h, rotate])  # a rotate
            q = bd.or_(bd.and_(lo, splat_c(I32, 0x0F0F0F0F, LANES)), bd.and_(hb, splat_c(I32, 0x10101010, LANES)))
            units[-1].append(bd.bitcast(q, vec(I8, PLANES_UNIT)))
        lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [n * r + i // 2 for i in range(LANES)]))])
    return PlanesBlocks(units, lane_scales, mins, None)


KDW_Q2_K = [8 * (i // 8) + 4 * (i % 2) for i in range(LANES)]  # qs dword of lane i, unit 0: half
# i // 8, its 16-byte half i % 2; unit u reads the dword u on
_Q2_K_SHIFT = [2 * ((i // 2) % 4) for i in range(LANES)]  # lane i's bits 2k in its bytes


def _q2_k_planes(bd, rows, fb, nblk, xs8):
    """On the K-quant layout (planes_klayout) lane i of every unit lies in sub-block i: unit u, lane
    i is qs dword KDW_Q2_K[i] + u masked to the 2-bit fields at bits 2k, k = (i // 2) % 4, in place
    (4^k * q <= 192: the lane scale carries 4^-k), one permute and one AND a unit. The mins per 16
    elements times the activation scale, for the kernel's 16-element sums."""
    L = Q2_K.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    xs16 = bd.shuffle_vector(xs8, xs8, const(I32, [s // 2 for s in range(n)]))
    xsk = bd.fmul(xs16, const(F32T, [4.0 ** -(t // 2) for t in _Q2_K_SHIFT]))
    mask = const(I32, [m if m < 1 << 31 else m - (1 << 32) for m in (0x03030303 << t for t in _Q2_K_SHIFT)])
    units, lane_scales, mins = [], [], []
    for row in rows:
        sc, mn, dd = _q2_k_scales(bd, row, p)
        lane_scales.append([bd.fmul(_per_sub(bd, dd, 0, sc, range(n)), xsk)])
        mins.append(bd.fmul(bd.fneg(_per_sub(bd, dd, 1, mn, range(n))), xs16))
        qs = load(bd, row, bd.add(p, c64(L.qs)), vec(I32, LANES))
        units.append([bd.bitcast(bd.and_(bd.shuffle_vector(qs, qs, const(I32, [d + u for d in KDW_Q2_K])), mask),
                                 vec(I8, PLANES_UNIT)) for u in range(4)])
    return PlanesBlocks(units, lane_scales, concat(bd, mins), None)


_Q3_K_FIELD = [(i // 2) % 4 for i in range(LANES)]  # lane i's k (bits 2k of qs, bit 4h + k of hmask)
_Q3_K_DOWN = [2 * k for k in _Q3_K_FIELD]  # qs dword shifted right: the 2-bit field to bits 0-1
_Q3_K_ROTATE = [(2 - 4 * (i // 8) - k) % 32 for i, k in enumerate(_Q3_K_FIELD)]  # hmask dword rotated
# left: bit 4h + k of each byte to its bit 2 (no bit crosses a byte on the way to bit 2)


def _q3_k_planes(bd, rows, fb, nblk, xs8):
    """On the K-quant layout (planes_klayout) lane i of every unit lies in sub-block i, as Q2_K's: unit
    u, lane i is qs dword KDW_Q2_K[i] + u shifted down to its 2-bit fields, OR'd with hmask dword
    4 (i % 2) + u rotated to put each byte's high bit at bit 2: q = 0..7, the zero point 4 off in the
    integer dot. Two permutes, a shift, a rotate and the masks a unit; one lane-scale vector a row
    (d * sc_i * the activation scale, lane i)."""
    L = Q3_K.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    xs16 = bd.shuffle_vector(xs8, xs8, const(I32, [s // 2 for s in range(n)]))
    lanes = vec(I32, LANES)
    down, rotate = const(I32, _Q3_K_DOWN), const(I32, _Q3_K_ROTATE)
    units, lane_scales, svs = [], [], []
    for row in rows:
        d = f16(bd, row, bd.add(p, c64(L.d)))
        sv = bd.fmul(bd.fmul(splat(bd, d, n), bd.sitofp(_q3_k_scales(bd, row, p), vec(F32T, n))), xs16)
        svs.append(sv)
        lane_scales.append([sv])
        qs = load(bd, row, bd.add(p, c64(L.qs)), lanes)
        hm = load(bd, row, bd.add(p, c64(L.hmask)), vec(I32, LANES // 2))
        units.append([])
        for u in range(4):
            ql = bd.lshr(bd.shuffle_vector(qs, qs, const(I32, [dw + u for dw in KDW_Q2_K])), down)
            h = bd.shuffle_vector(hm, hm, const(I32, [4 * (i % 2) + u for i in range(LANES)]))
            hb = call_intrinsic(bd, f"llvm.fshl.v{LANES}i32", lanes, [h, h, rotate])  # a rotate
            q = bd.or_(bd.and_(ql, splat_c(I32, 0x03030303, LANES)), bd.and_(hb, splat_c(I32, 0x04040404, LANES)))
            units[-1].append(bd.bitcast(q, vec(I8, PLANES_UNIT)))
    return PlanesBlocks(units, lane_scales, None, concat(bd, svs))


_Q6_K_FIELD = [(i % 8) // 2 for i in range(LANES)]  # lane i's k: bits 2k of qh, ql's high nibble from 2


def _q6_k_planes(bd, rows, fb, nblk, xs8):
    """On the K-quant layout (planes_klayout) lane i of every unit lies in sub-block i: its element
    16i + 4u + j is 128h + 32k + l (h = i // 8, k = _Q6_K_FIELD[i], l = 16 (i % 2) + 4u + j), so
    unit u, lane i is ql dword 16h + 8 (k & 1) + 4 (i % 2) + u shifted down to its nibble (the high
    one from k = 2), with qh dword 8h + 4 (i % 2) + u rotated to bring bits 2k of each byte to bits
    4-5: q = 0..63, the zero point 32 off in the integer dot. Two permutes, a shift, a rotate and
    two masks a unit (plain units transposed onto the layout by the kernel took 1.33x the
    one-token time on Zen 4); one lane-scale vector a row (d * scale_i * the activation scale)."""
    L = Q6_K.layout
    n = L.sub_blocks
    p = bd.mul(fb, c64(L.block_bytes))
    xs16 = bd.shuffle_vector(xs8, xs8, const(I32, [s // 2 for s in range(n)]))
    lanes = vec(I32, LANES)
    down = const(I32, [4 * (k // 2) for k in _Q6_K_FIELD])
    rotate = const(I32, [(4 - 2 * k) % 32 for k in _Q6_K_FIELD])
    units, lane_scales, svs = [], [], []
    for row in rows:
        d = f16(bd, row, bd.add(p, c64(L.d)))
        scs = bd.sitofp(load(bd, row, bd.add(p, c64(L.scales)), vec(I8, n)), vec(F32T, n))
        sv = bd.fmul(bd.fmul(splat(bd, d, n), scs), xs16)
        svs.append(sv)
        lane_scales.append([sv])
        ql0, ql1 = (load(bd, row, bd.add(p, c64(L.ql + 64 * h)), lanes) for h in range(2))
        qh = load(bd, row, bd.add(p, c64(L.qh)), lanes)
        units.append([])
        for u in range(4):
            idx = [16 * (i // 8) + 8 * (k & 1) + 4 * (i % 2) + u for i, k in enumerate(_Q6_K_FIELD)]
            lo = bd.lshr(bd.shuffle_vector(ql0, ql1, const(I32, idx)), down)
            h = bd.shuffle_vector(qh, qh, const(I32, [8 * (i // 8) + 4 * (i % 2) + u for i in range(LANES)]))
            hb = call_intrinsic(bd, f"llvm.fshl.v{LANES}i32", lanes, [h, h, rotate])  # a rotate
            q = bd.or_(bd.and_(lo, splat_c(I32, 0x0F0F0F0F, LANES)), bd.and_(hb, splat_c(I32, 0x30303030, LANES)))
            units[-1].append(bd.bitcast(q, vec(I8, PLANES_UNIT)))
    return PlanesBlocks(units, lane_scales, None, concat(bd, svs))


# ------------------------------------------------------------------ lanes: n rows at once


def _q4_k_lanes(bd, dw, L=Q4_K.layout, qh=None):
    """Each lane a row's block (emit.LaneBlock): _q4_k_scale_bytes's kmask words and q4_k's nibbles
    on <n x i32> lanes; qh(j, q): q5_k's 5th bits of group j's quad q."""
    n = dw(0).type.count
    c = lambda v: splat_c(I32, v, n)  # noqa: E731
    k1, k2, k3 = (c(k) for k in _KMASK)
    u = [dw(L.scales // 4 + i) for i in range(3)]
    top = lambda v: bd.shl(bd.and_(bd.lshr(v, c(6)), k3), c(4))  # noqa: E731  (bits 6-7 of each byte -> 4-5)
    sc = [bd.and_(u[0], k1), bd.or_(bd.and_(u[2], k2), top(u[0]))]
    mn = [bd.and_(u[1], k1), bd.or_(bd.and_(bd.lshr(u[2], c(4)), k2), top(u[1]))]
    byte = lambda w, j: bd.and_(bd.lshr(w[j // 4], c(8 * (j % 4))), c(0xFF))  # noqa: E731
    assert L.dmin == L.d + 2 and L.d % 4 == 0
    halves = bd.bitcast(dw(L.d // 4), vec(ir.HalfType(), 2 * n))
    d, dmin = (bd.fpext(bd.shuffle_vector(halves, halves, const(I32, range(h, 2 * n, 2))), vec(F32T, n))
               for h in range(2))

    def group(j):  # chunk j // 2 of qs, low nibbles for even j, high for odd
        quads = []
        for q in range(L.sub_elems // 4):
            v = dw(L.qs // 4 + 8 * (j // 2) + q)
            v = bd.and_(v if j % 2 == 0 else bd.lshr(v, c(4)), c(0x0F0F0F0F))
            quads.append(v if qh is None else bd.or_(v, qh(j, q)))
        return quads, byte(sc, j), bd.fneg(bd.fmul(dmin, bd.uitofp(byte(mn, j), vec(F32T, n))))

    return LaneBlock(group, d)


def _q5_k_lanes(bd, dw):
    """As q4_k, with bit j of each of qh's bytes (quad q's four in dword q) as bit 4 of group j."""
    L = Q5_K.layout
    return _q4_k_lanes(bd, dw, L, lambda j, q: _shift(bd, dw(L.qh // 4 + q), j - 4, 0x10101010))


# ------------------------------------------------------------------ words


_KMASK = (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303)


def _q4_k_scale_bytes(bd, row, p, L=Q4_K.layout):
    """The 8 six-bit scales and then the 8 mins of the block at byte p as <16 x i8>, unpacked with
    32-bit integer operations (llama.cpp's kmask trick: the integer pipes, not the vector ones);
    L: q4_k's or q5_k's layout."""
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


def _q4_k_word_scales(bd, row, p, L):
    """(<8 x float> d * sc_i, <8 x float> -(dmin * m_i)) of the q4_k / q5_k block at byte p."""
    raw = _q4_k_scale_bytes(bd, row, p, L)
    f = lambda idx: bd.uitofp(bd.shuffle_vector(raw, raw, const(I32, idx)), vec(F32T, 8))  # noqa: E731
    d = f16_lanes(bd, row, [bd.add(p, c64(L.d)), bd.add(p, c64(L.dmin))])
    dd = lambda i: bd.shuffle_vector(d, d, const(I32, [i] * 8))  # noqa: E731
    return bd.fmul(dd(0), f(range(8))), bd.fneg(bd.fmul(dd(1), f(range(8, 16))))


def _q4_k_words(bd, row, b0, n):
    """Chunk c of qs (32 bytes, 16 words): group 2c in the low nibbles (bits 0-3 and 8-11 of each
    word), group 2c + 1 in the high ones (bits 4-7 and 12-15)."""
    L = Q4_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    scale, mins = _q4_k_word_scales(bd, row, p, L)
    groups = []
    m = wsplat(15)
    for c in range(L.sub_blocks // 2):
        w = words(bd, load(bd, row, bd.add(p, c64(L.qs + c * L.sub_elems)), vec(I8, G)))
        groups.append((bd.and_(w, m), bd.and_(bd.lshr(w, wsplat(8)), m)))
        groups.append((bd.and_(bd.lshr(w, wsplat(4)), m), bd.lshr(w, wsplat(12))))
    return WordChunk(groups, scale, mins)


def _q5_k_words(bd, row, b0, n):
    """As q4_k, each byte's nibble with bit i of the words of qh (its 32 bytes: element l of every
    group in byte l) moved to bit 4, both bytes of a word at once, then split."""
    L = Q5_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    scale, mins = _q4_k_word_scales(bd, row, p, L)
    qh = words(bd, load(bd, row, bd.add(p, c64(L.qh)), vec(I8, G)))
    groups = []
    for c in range(L.sub_blocks // 2):
        w = words(bd, load(bd, row, bd.add(p, c64(L.qs + c * L.sub_elems)), vec(I8, G)))
        for h in range(2):
            i = 2 * c + h
            q = bd.or_(_shift(bd, w, 4 * h, 0x0F0F), _shift(bd, qh, i - 4, 0x1010))
            groups.append((bd.and_(q, wsplat(0xFF)), bd.lshr(q, wsplat(8))))
    return WordChunk(groups, scale, mins)


def _q2_k_words(bd, row, b0, n):
    """Group g = 4h + k: q from the words of qs[32h ..] at bits 2k, both bytes of a word at once;
    the scales d * sc_s and mins -(dmin * m_s) per 16 elements, in SUB16_ORDER."""
    L = Q2_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    sc, mn, dd = _q2_k_scales(bd, row, p)
    groups = []
    for h in range(L.block_elems // L.half):
        qs = words(bd, load(bd, row, bd.add(p, c64(L.qs + h * G)), vec(I8, G)))
        for k in range(4):
            q = _shift(bd, qs, 2 * k, 0x0303)
            groups.append((bd.and_(q, wsplat(0xFF)), bd.lshr(q, wsplat(8))))
    return WordChunk(groups, _per_sub(bd, dd, 0, sc, SUB16_ORDER), bd.fneg(_per_sub(bd, dd, 1, mn, SUB16_ORDER)))


def _q3_k_words(bd, row, b0, n):
    """Group g = 4h + k: q = ql | 4 * hbit (0..7) from the words of qs[32h ..] at bits 2k and of
    hmask at bit g, both bytes of a word at once; the kernel takes 4 times the activations'
    16-element sums off (words_zero)."""
    L = Q3_K.layout
    p = bd.mul(b0, c64(L.block_bytes))
    d = f16(bd, row, bd.add(p, c64(L.d)))
    scs = _q3_k_scales(bd, row, p)
    scs = bd.sitofp(bd.shuffle_vector(scs, scs, const(I32, SUB16_ORDER)), vec(F32T, L.sub_blocks))
    scale = bd.fmul(splat(bd, d, L.sub_blocks), scs)
    hm = words(bd, load(bd, row, bd.add(p, c64(L.hmask)), vec(I8, G)))
    groups = []
    for h in range(L.block_elems // L.half):
        qs = words(bd, load(bd, row, bd.add(p, c64(L.qs + h * G)), vec(I8, G)))
        for k in range(4):
            q = bd.or_(_shift(bd, qs, 2 * k, 0x0303), _shift(bd, hm, 4 * h + k - 2, 0x0404))
            groups.append((bd.and_(q, wsplat(0xFF)), bd.lshr(q, wsplat(8))))
    return WordChunk(groups, scale, None)


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
    scs = bd.sitofp(bd.shuffle_vector(scs, scs, const(I32, SUB16_ORDER)), vec(F32T, L.sub_blocks))
    scale = bd.fmul(splat(bd, d, L.sub_blocks), scs)

    def shift(v, n):  # v >> n, or v << -n
        return v if n == 0 else bd.lshr(v, wsplat(n)) if n > 0 else bd.shl(v, wsplat(-n))

    groups = []
    for h in range(L.block_elems // L.half):
        qh = words(bd, load(bd, row, bd.add(p, c64(L.qh + h * quarter)), vec(I8, G)))
        for k in range(4):
            ql = words(bd, load(bd, row, bd.add(p, c64(L.ql + h * L.half // 2 + quarter * (k & 1))), vec(I8, G)))
            q = bd.or_(bd.and_(shift(ql, 4 * (k // 2)), wsplat(0x0F0F)), bd.and_(shift(qh, 2 * k - 4), wsplat(0x3030)))
            groups.append((bd.and_(q, wsplat(0xFF)), bd.lshr(q, wsplat(8))))
    return WordChunk(groups, scale, None)


RECORDS = [CpuFormat(Q4_K, block=_q4_k, words=_q4_k_words, planes=_q4_k_planes, has_min=True, planes_klayout=True,
                     ksum=_q4_k_ksum, lanes=_q4_k_lanes),
           CpuFormat(Q5_K, block=_q5_k, words=_q5_k_words, planes=_q5_k_planes, has_min=True, planes_klayout=True,
                     ksum=_q5_k_ksum, lanes=_q5_k_lanes),
           CpuFormat(Q2_K, block=_q2_k, words=_q2_k_words, planes=_q2_k_planes, planes_klayout=True,
                     words_sub16=True, min_sub16=True, planes_rows=2, ksum=_q2_k_ksum),
           CpuFormat(Q3_K, block=_q3_k, words=_q3_k_words, planes=_q3_k_planes, planes_zero=Q3_K.layout.zero,
                     planes_klayout=True, words_sub16=True, words_zero=Q3_K.layout.zero, ksum=_q3_k_ksum),
           CpuFormat(Q6_K, block=_q6_k, words=_q6_k_words, planes=_q6_k_planes, planes_zero=Q6_K.layout.zero,
                     planes_klayout=True, words_sub16=True, words_zero=Q6_K.layout.zero, ksum=_q6_k_ksum)]
