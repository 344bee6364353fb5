"""The CPU emitters of ggml's 32-element block formats (layouts: fuelcli/formats/legacy.py).

    q8_0  w = q (int8)            scale d
    q4_0  w = q - 8               scale d
    q4_1  w = q                   scale d,        min m
    q5_0  w = q - 16              scale d         (q: a nibble and a 5th bit from qh)
    q5_1  w = q                   scale d,        min m

One family: what a format is made of is read off its layout (an `m` field: a min; a `qh` field:
5th bits; 32 bytes of qs: int8 values, else nibbles).
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .emit import (LANES, PLANES_KBLOCK, Block, CpuFormat, PlanesBlocks, WordChunk, concat, f16, f16_lanes, lanes,
                   nibble_bytes, nibble_kunits, nibble_units, nibbles, signed_bytes, words, wsplat)
from .irgen import F32T, G, I8, I16, I32, I64, c64, const, load, splat, splat_c, vec


def _parts(fmt):
    """(int8 values, 5th bits, a min) of a 32-element format, from its layout."""
    L = fmt.layout
    return L.block_bytes - L.qs == L.block_elems, hasattr(L, "qh"), hasattr(L, "m")


# ------------------------------------------------------------------ block


def _q8_0(bd, row, blk):
    L = Q8_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    w = bd.sext(load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G)), vec(I16, G))
    return Block([w], lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


def _q4_0(bd, row, blk):
    L = Q4_0.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return Block([bd.sub(q, splat_c(I16, L.zero, G))], lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), None)


def _q4_1(bd, row, blk):
    L = Q4_1.layout
    p = bd.mul(blk, c64(L.block_bytes))
    q = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
    return Block([q], lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), lanes(bd, f16(bd, row, bd.add(p, c64(L.m)))))


def _fifth(fmt):
    """q5_0 / q5_1: qh is a 32-bit mask (bit j: the 5th bit of element j); q5_0's w = nibble where
    it is set, else nibble - 16 (one masked subtract with AVX-512); q5_1's w = nibble + 16 where set."""
    L = fmt.layout
    has_min = hasattr(L, "m")

    def emit(bd, row, blk):
        p = bd.mul(blk, c64(L.block_bytes))
        high = bd.bitcast(load(bd, row, bd.add(p, c64(L.qh)), I32), vec(ir.IntType(1), G))
        nib = bd.zext(nibbles(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G // 2))), vec(I16, G))
        if has_min:
            w = bd.select(high, bd.or_(nib, splat_c(I16, 16, G)), nib)
            mn = lanes(bd, f16(bd, row, bd.add(p, c64(L.m))))
        else:
            w = bd.select(high, nib, bd.sub(nib, splat_c(I16, L.zero, G)))
            mn = None
        return Block([w], lanes(bd, f16(bd, row, bd.add(p, c64(L.d)))), mn)

    return emit


# ------------------------------------------------------------------ planes


def _planes(fmt):
    """The planes emitter of a 32-element format: `nblk` blocks from block b0 of each row."""
    L = fmt.layout
    int8, fifth, has_min = _parts(fmt)
    zero = getattr(L, "zero", None) if not int8 else 128

    def emit(bd, rows, b0, nblk, xs):
        units, lane_scales, svs, mins = [], [], [], []
        for row in rows:
            base = bd.mul(b0, c64(L.block_bytes))
            at = lambda j, off: bd.add(base, c64(j * L.block_bytes + off))  # noqa: E731
            d = f16_lanes(bd, row, [at(j, L.d) for j in range(nblk)])
            sv = bd.fmul(d, xs)
            svs.append(sv)
            if has_min:
                mins.append(f16_lanes(bd, row, [at(j, L.m) for j in range(nblk)]))
            if not (int8 or fifth) and nblk * G == PLANES_KBLOCK:  # a full chunk, on the K-quant layout
                units.append(nibble_kunits(bd, [load(bd, row, at(j, L.qs), vec(I8, 16)) for j in range(nblk)]))
                lane_scales.append([bd.shuffle_vector(sv, sv, const(I32, [i // 2 for i in range(LANES)]))])
                continue
            if int8:  # q + 128 as the unsigned byte
                parts = [bd.xor(load(bd, row, at(j, L.qs), vec(I8, G)), splat_c(I8, -128, G)) for j in range(nblk)]
                us = []
                for j in range(0, nblk, 2):
                    pair = parts[j:j + 2] if j + 1 < nblk else [parts[j], splat_c(I8, 0, G)]
                    us.append(bd.shuffle_vector(pair[0], pair[1], const(I32, range(64))))
                scale = sv
            else:
                qs = [load(bd, row, at(j, L.qs), vec(I8, 16)) for j in range(nblk)]
                us = nibble_units(bd, qs, shift=fifth)
                if fifth:  # the 5th bits: + 16 where set (qh bit j: element j)
                    for u in range(len(us)):
                        bits = [bd.zext(load(bd, row, at(j, L.qh), I32), I64) for j in range(2 * u, min(2 * u + 2, nblk))]
                        mask = bits[0] if len(bits) == 1 else bd.or_(bits[0], bd.shl(bits[1], c64(32)))
                        set_ = bd.bitcast(mask, vec(ir.IntType(1), 64))
                        us[u] = bd.select(set_, bd.or_(us[u], splat_c(I8, 16, 64)), us[u])
                    scale = sv
                else:  # the high nibbles' lanes: 1 / 16
                    scale = concat(bd, [sv, bd.fmul(sv, splat_c(F32T, 1 / 16, nblk))])
            hi16 = not (int8 or fifth)
            ls = []
            for u in range(len(us)):
                idx = []
                for i in range(LANES):
                    j = min(2 * u + i // 8, nblk - 1)  # lanes past the last block: weights 0
                    idx.append(j + nblk * (hi16 and (i // 4) % 2 == 1))
                ls.append(bd.shuffle_vector(scale, scale, const(I32, idx)))
            units.append(us)
            lane_scales.append(ls)
        zero_scale = None
        if zero is not None:
            per16 = [bd.shuffle_vector(sv, sv, const(I32, [s // 2 for s in range(2 * nblk)])) for sv in svs]
            zero_scale = concat(bd, per16)
        return PlanesBlocks(units, lane_scales, concat(bd, mins) if mins else None, zero_scale)

    return emit, zero


# ------------------------------------------------------------------ words


def _fifth_bits(bd, qh):
    """The 32-bit qh -> <32 x i8>: 16 where element m has its 5th bit (bit m of qh) clear, else 0
    (so q - 16 = nibble - this): byte m // 8 of qh in byte m (an in-lane shuffle), bit m % 8 of it
    tested."""
    qb = bd.bitcast(splat(bd, qh, 8), vec(I8, G))
    sel = bd.shuffle_vector(qb, qb, const(I32, [16 * (m // 16) + m // 8 for m in range(G)]))
    bit = const(I8, [1 << (m % 8) for m in range(G)])
    clear = bd.icmp_unsigned("==", bd.and_(sel, bit), splat_c(I8, 0, G))
    return bd.select(clear, splat_c(I8, 16, G), splat_c(I8, 0, G))


def _groups(fmt, bd, row, p):
    """The (even, odd) words of the 32-element block at byte p of row."""
    L = fmt.layout
    int8, fifth, has_min = _parts(fmt)
    if int8:
        return signed_bytes(bd, words(bd, load(bd, row, bd.add(p, c64(L.qs)), vec(I8, G))))
    q = nibble_bytes(bd, row, bd.add(p, c64(L.qs)))
    if fifth:  # q - 16 (the 5th bits in) as signed bytes; with a min, q itself: nibble | 16 - that
        z = _fifth_bits(bd, load(bd, row, bd.add(p, c64(L.qh)), I32))
        if not has_min:
            return signed_bytes(bd, words(bd, bd.sub(bd.bitcast(q, vec(I8, G)), z)))
        q = words(bd, bd.sub(bd.or_(bd.bitcast(q, vec(I8, G)), splat_c(I8, 16, G)), z))
    even, odd = bd.and_(q, wsplat(0xFF)), bd.lshr(q, wsplat(8))
    if hasattr(L, "zero") and not fifth:
        return bd.sub(even, wsplat(L.zero)), bd.sub(odd, wsplat(L.zero))
    return even, odd


def _words(fmt):
    L = fmt.layout
    has_min = hasattr(L, "m")

    def emit(bd, row, b0, n):
        at = [bd.mul(bd.add(b0, c64(j)), c64(L.block_bytes)) for j in range(n)]
        groups = [_groups(fmt, bd, row, p) for p in at]
        d = f16_lanes(bd, row, [bd.add(p, c64(L.d)) for p in at])
        mn = f16_lanes(bd, row, [bd.add(p, c64(L.m)) for p in at]) if has_min else None
        return WordChunk(groups, d, mn)

    return emit


def _record(fmt, block, chunks=True):
    planes, zero = _planes(fmt)
    int8, fifth, has_min = _parts(fmt)
    return CpuFormat(fmt, block=block, words=_words(fmt), planes=planes, has_min=has_min, planes_zero=zero,
                     planes_chunks=chunks, planes_klayout=not (int8 or fifth))


# Q4_0 and Q4_1 unpack straight onto the K-quant layout (nibble_kunits; planes_klayout): transposed
# plain units had made their one-token kernels slower (1.14x Q4_0), straight ones do not. Q8_0's
# and Q5_0's plain units are transposed (planes_chunks); Q5_1's one-token kernel took 1.17x that
# way, so it keeps a unit at a time.
RECORDS = [_record(Q8_0, _q8_0), _record(Q4_0, _q4_0), _record(Q4_1, _q4_1),
           _record(Q5_0, _fifth(Q5_0)), _record(Q5_1, _fifth(Q5_1), False)]
