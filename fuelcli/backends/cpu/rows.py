"""Numba row kernels for every weight format: decode a stored row, or dot it with an f32 vector.

`code` is `Format.code` (ints, so the njit layer functions dispatch without strings); every size and
offset comes from the format's layout (fuelcli/formats), a compile-time constant here. `row` is one
row's bytes: a C-contiguous uint8 1-D array, e.g. `t.data[i]` of a `Tensor`.

- `dequant_row` is exact: it repeats the numpy decode's float operations in the same order and is
  compiled without fastmath, so nothing is reassociated or fused into an FMA.
- `dot_row` is fused per block (the row is never materialised), fastmath so LLVM reassociates the
  per-block sums into vector lanes. Integers are cast to int32/float32 explicitly, because numba
  widens integer arithmetic to int64 and AVX2 cannot convert int64 vectors to float.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ...formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0
from .jit import EXACT, FAST

# layouts as module constants: numba folds their fields at compile time
LF32, LF16, LBF16 = F32.layout, F16.layout, BF16.layout
L8, L40, L41, L50 = Q8_0.layout, Q4_0.layout, Q4_1.layout, Q5_0.layout
L4K, L6K = Q4_K.layout, Q6_K.layout



@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret a uint32 as float32 (a bitcast; numba has no scalar view)."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(**EXACT)
def _f16_bits_to_f32_bits(h):
    """IEEE half bits -> float bits, exact for every input (subnormals, inf, NaN payloads), as numpy."""
    h = np.uint32(h)
    s = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == 0x1F:
        return np.uint32(s | np.uint32(0x7F800000) | (m << np.uint32(13)))
    if e != 0:
        return np.uint32(s | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13)))
    if m == 0:
        return np.uint32(s)
    e = np.uint32(113)  # subnormal: shift the mantissa up until its leading 1 is the implicit bit
    while (m & np.uint32(0x400)) == 0:
        m <<= np.uint32(1)
        e -= np.uint32(1)
    return np.uint32(s | (e << np.uint32(23)) | ((m & np.uint32(0x3FF)) << np.uint32(13)))


@njit(**EXACT)
def _f16_at(row, p):
    """The little-endian f16 at byte p of row, as float32 (block scales)."""
    return _f32_from_bits(_f16_bits_to_f32_bits(np.uint32(row[p]) | (np.uint32(row[p + 1]) << np.uint32(8))))


@intrinsic
def _f32_from_f16(typingctx, bits):
    """IEEE half bits (uint16) -> float32 by LLVM's fpext: exact for every input, inf and NaN included;
    one vcvtph2ps for 8 lanes where the CPU has F16C (every AVX2 CPU), a library call elsewhere."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@njit(**FAST)
def _f16_fast(h):
    """Half bits -> float32 for f16 weight rows and block scales: vectorises, and keeps inf and NaN
    (the exponent-rebasing trick used before made them finite, so a NaN weight vanished on the
    decode path while the reference saw it; fpext is also faster: 0.50 vs 0.64 ms per 2048² dot)."""
    return _f32_from_f16(np.uint16(h))


@njit(**FAST)
def _scale16(row, p):
    """Block scale at byte p for dot_row: branchless and exact; the branchy exact
    decoder, called once per 32-element block, cost 3x the whole q8_0 dot."""
    return _f16_fast(np.uint32(row[p]) | (np.uint32(row[p + 1]) << np.uint32(8)))


@njit(**EXACT)
def k_scale_min(row, p, i):
    """Q4_K sub-block i's 6-bit (scale, min) from the scale bytes at row[p:] (get_scale_min_k4)."""
    if i < 4:
        return np.int32(row[p + i]) & 63, np.int32(row[p + i + 4]) & 63
    s = (np.int32(row[p + i + 4]) & 15) | ((np.int32(row[p + i - 4]) >> 6) << 4)
    m = (np.int32(row[p + i + 4]) >> 4) | ((np.int32(row[p + i]) >> 6) << 4)
    return s, m


# ------------------------------------------------------------------ dequant_row (exact)


@njit(**EXACT)
def _dq_q8_0(row, out):
    L = L8
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        d = _f16_at(row, p + L.d)
        for j in range(L.block_elems):
            out[b * L.block_elems + j] = np.float32(np.int8(row[p + L.qs + j])) * d


@njit(**EXACT)
def _dq_q4_0(row, out):
    L = L40
    half = L.block_elems // 2
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        o = b * L.block_elems
        d = _f16_at(row, p + L.d)
        for j in range(half):
            q = np.int32(row[p + L.qs + j])
            out[o + j] = d * np.float32((q & 15) - L.zero)
            out[o + j + half] = d * np.float32((q >> 4) - L.zero)


@njit(**EXACT)
def _dq_q4_1(row, out):
    L = L41
    half = L.block_elems // 2
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        o = b * L.block_elems
        d = _f16_at(row, p + L.d)
        m = _f16_at(row, p + L.m)
        for j in range(half):
            q = np.int32(row[p + L.qs + j])
            out[o + j] = d * np.float32(q & 15) + m
            out[o + j + half] = d * np.float32(q >> 4) + m


@njit(**EXACT)
def _dq_q5_0(row, out):
    L = L50
    half = L.block_elems // 2
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        o = b * L.block_elems
        d = _f16_at(row, p + L.d)
        qh = (np.int64(row[p + L.qh]) | (np.int64(row[p + L.qh + 1]) << 8) | (np.int64(row[p + L.qh + 2]) << 16)
              | (np.int64(row[p + L.qh + 3]) << 24))
        for j in range(half):
            q = np.int64(row[p + L.qs + j])
            lo = (q & 15) | (((qh >> j) & 1) << 4)
            hi = (q >> 4) | (((qh >> (j + half)) & 1) << 4)
            out[o + j] = d * np.float32(lo - L.zero)
            out[o + j + half] = d * np.float32(hi - L.zero)


@njit(**EXACT)
def _dq_q4_k(row, out):
    L = L4K
    n = L.sub_elems
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        d = _f16_at(row, p + L.d)
        dmin = _f16_at(row, p + L.dmin)
        for c in range(L.sub_blocks // 2):  # n bytes -> sub-blocks 2c (low nibbles) and 2c+1 (high)
            s0, m0 = k_scale_min(row, p + L.scales, 2 * c)
            s1, m1 = k_scale_min(row, p + L.scales, 2 * c + 1)
            d0, dm0 = d * np.float32(s0), dmin * np.float32(m0)
            d1, dm1 = d * np.float32(s1), dmin * np.float32(m1)
            o = b * L.block_elems + c * 2 * n
            for l in range(n):
                q = np.int32(row[p + L.qs + c * n + l])
                out[o + l] = d0 * np.float32(q & 15) - dm0
                out[o + n + l] = d1 * np.float32(q >> 4) - dm1


@njit(**EXACT)
def _dq_q6_k(row, out):
    L = L6K
    quarter = L.half // 4  # 32: elements l + quarter*k of a half share their ql/qh bytes
    for b in range(out.size // L.block_elems):
        p = b * L.block_bytes
        d = _f16_at(row, p + L.d)
        for h in range(L.block_elems // L.half):
            ql = p + L.ql + h * L.half // 2
            qh = p + L.qh + h * quarter
            sc = p + L.scales + h * L.half // L.sub_elems
            o = b * L.block_elems + h * L.half
            for l in range(quarter):
                a = np.int32(row[ql + l])
                c = np.int32(row[ql + l + quarter])
                hb = np.int32(row[qh + l])
                g = l // L.sub_elems
                q1 = ((a & 15) | ((hb & 3) << 4)) - L.zero
                q2 = ((c & 15) | (((hb >> 2) & 3) << 4)) - L.zero
                q3 = ((a >> 4) | (((hb >> 4) & 3) << 4)) - L.zero
                q4 = ((c >> 4) | (((hb >> 6) & 3) << 4)) - L.zero
                out[o + l] = (d * np.float32(np.int8(row[sc + g]))) * np.float32(q1)
                out[o + l + quarter] = (d * np.float32(np.int8(row[sc + g + 2]))) * np.float32(q2)
                out[o + l + 2 * quarter] = (d * np.float32(np.int8(row[sc + g + 4]))) * np.float32(q3)
                out[o + l + 3 * quarter] = (d * np.float32(np.int8(row[sc + g + 6]))) * np.float32(q4)


@njit(**EXACT)
def dequant_row(code, row, out):
    """Decode one stored row (uint8, C-contiguous) into out (float32, ncols), exactly."""
    if code == LF32.code:
        out[:] = row.view(np.float32)
    elif code == LF16.code:
        h = row.view(np.uint16)
        o = out.view(np.uint32)
        for i in range(out.size):
            o[i] = _f16_bits_to_f32_bits(h[i])
    elif code == LBF16.code:
        h = row.view(np.uint16)
        o = out.view(np.uint32)
        for i in range(out.size):
            o[i] = np.uint32(h[i]) << np.uint32(16)
    elif code == L8.code:
        _dq_q8_0(row, out)
    elif code == L40.code:
        _dq_q4_0(row, out)
    elif code == L41.code:
        _dq_q4_1(row, out)
    elif code == L50.code:
        _dq_q5_0(row, out)
    elif code == L4K.code:
        _dq_q4_k(row, out)
    elif code == L6K.code:
        _dq_q6_k(row, out)
    else:
        raise ValueError("unknown weight format code")


# ------------------------------------------------------------------ dot_row (fused, fast)
# Pattern: per block, plain sums over a fixed trip count (LLVM turns them into vector lanes under
# fastmath), then one scalar multiply by the block scale. Sums of x are taken in the same pass for
# formats with an offset (q4_1 min, q4_k dmin) instead of dequantising q*d + m per element.


@njit(**FAST)
def _dot_f32(row, x):
    w = row.view(np.float32)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += w[i] * x[i]
    return acc


@njit(**FAST)
def _dot_f16(row, x):
    h = row.view(np.uint16)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += _f16_fast(h[i]) * x[i]
    return acc


@njit(**FAST)
def _dot_bf16(row, x):
    h = row.view(np.uint16)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += _f32_from_bits(np.uint32(h[i]) << np.uint32(16)) * x[i]
    return acc


@njit(**FAST)
def _dot_q8_0(row, x):
    L = L8
    lane = np.zeros(L.block_elems, np.float32)  # see _dot_q4_0
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes
        o = b * L.block_elems
        d = _scale16(row, p + L.d)
        for j in range(L.block_elems):
            lane[j] += d * np.float32(np.int8(row[p + L.qs + j])) * x[o + j]
    return lane.sum()


@njit(**FAST)
def _dot_q4_0(row, x):
    # Per-lane accumulators reduced once per row: for these 16-byte blocks this measured up to 2x
    # faster than a horizontal sum per block (one small heap array per row is negligible).
    # Nibbles are unpacked with uint8 ops and cast to int32 before float: an int64 intermediate
    # (numba's default for `q & 15` with an int literal) keeps the loop scalar.
    L = L40
    half = L.block_elems // 2
    lane = np.zeros(L.block_elems, np.float32)
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes + L.qs
        o = b * L.block_elems
        d = _scale16(row, b * L.block_bytes + L.d)
        for j in range(half):
            q = row[p + j]
            lane[j] += d * np.float32(np.int32(q & np.uint8(15)) - np.int32(L.zero)) * x[o + j]
            lane[j + half] += d * np.float32(np.int32(q >> np.uint8(4)) - np.int32(L.zero)) * x[o + j + half]
    return lane.sum()


@njit(**FAST)
def _dot_q4_1(row, x):
    L = L41
    half = L.block_elems // 2
    lane = np.zeros(L.block_elems, np.float32)  # see _dot_q4_0
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes + L.qs
        o = b * L.block_elems
        d = _scale16(row, b * L.block_bytes + L.d)
        m = _scale16(row, b * L.block_bytes + L.m)
        for j in range(half):
            q = row[p + j]
            lane[j] += (d * np.float32(np.int32(q & np.uint8(15))) + m) * x[o + j]
            lane[j + half] += (d * np.float32(np.int32(q >> np.uint8(4))) + m) * x[o + j + half]
    return lane.sum()


@njit(**FAST)
def _dot_q5_0(row, x):
    L = L50
    half = L.block_elems // 2
    acc = np.float32(0.0)
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes
        o = b * L.block_elems
        qh = (np.uint32(row[p + L.qh]) | (np.uint32(row[p + L.qh + 1]) << np.uint32(8))
              | (np.uint32(row[p + L.qh + 2]) << np.uint32(16)) | (np.uint32(row[p + L.qh + 3]) << np.uint32(24)))
        s = np.float32(0.0)
        for j in range(half):
            q = np.int32(row[p + L.qs + j])
            h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
            h1 = np.int32((qh >> np.uint32(j + half)) & np.uint32(1)) << 4
            s += (np.float32(((q & 15) | h0) - L.zero) * x[o + j]
                  + np.float32(((q >> 4) | h1) - L.zero) * x[o + j + half])
        acc += _scale16(row, p + L.d) * s
    return acc


@njit(**FAST)
def _dot_q4_k(row, x):
    # per-lane accumulators (see _dot_q4_0) with the sub-block scale and min folded in per element:
    # 1.5-1.7x the per-sub-block scalar sums it replaced
    L = L4K
    n = L.sub_elems
    lane = np.zeros(2 * n, np.float32)
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes
        d = _scale16(row, p + L.d)
        dmin = _scale16(row, p + L.dmin)
        for c in range(L.sub_blocks // 2):
            s0, m0 = k_scale_min(row, p + L.scales, 2 * c)
            s1, m1 = k_scale_min(row, p + L.scales, 2 * c + 1)
            d0 = d * np.float32(s0)
            d1 = d * np.float32(s1)
            dm0 = dmin * np.float32(m0)
            dm1 = dmin * np.float32(m1)
            o = b * L.block_elems + c * 2 * n
            q0 = p + L.qs + c * n
            for l in range(n):
                q = row[q0 + l]
                lane[l] += (d0 * np.float32(np.int32(q & np.uint8(15))) - dm0) * x[o + l]
                lane[n + l] += (d1 * np.float32(np.int32(q >> np.uint8(4))) - dm1) * x[o + n + l]
    return lane.sum()


@njit(**FAST)
def _dot_q6_k(row, x):
    L = L6K
    quarter = L.half // 4
    n = L.sub_elems
    lane = np.zeros(4 * n, np.float32)  # see _dot_q4_k
    u8 = np.uint8
    z = np.int32(L.zero)
    for b in range(x.size // L.block_elems):
        p = b * L.block_bytes
        d = _scale16(row, p + L.d)
        for h in range(L.block_elems // L.half):
            ql = p + L.ql + h * L.half // 2
            qh = p + L.qh + h * quarter
            sc = p + L.scales + h * L.half // n
            o = b * L.block_elems + h * L.half
            for g in range(quarter // n):  # n elements share a scale
                d1 = d * np.float32(np.int8(row[sc + g]))
                d2 = d * np.float32(np.int8(row[sc + g + 2]))
                d3 = d * np.float32(np.int8(row[sc + g + 4]))
                d4 = d * np.float32(np.int8(row[sc + g + 6]))
                for k in range(n):
                    l = n * g + k
                    a = row[ql + l]
                    c = row[ql + l + quarter]
                    hb = row[qh + l]
                    q1 = np.int32((a & u8(15)) | ((hb & u8(3)) << u8(4))) - z
                    q2 = np.int32((c & u8(15)) | (((hb >> u8(2)) & u8(3)) << u8(4))) - z
                    q3 = np.int32((a >> u8(4)) | (((hb >> u8(4)) & u8(3)) << u8(4))) - z
                    q4 = np.int32((c >> u8(4)) | ((hb >> u8(6)) << u8(4))) - z
                    lane[k] += d1 * np.float32(q1) * x[o + l]
                    lane[n + k] += d2 * np.float32(q2) * x[o + l + quarter]
                    lane[2 * n + k] += d3 * np.float32(q3) * x[o + l + 2 * quarter]
                    lane[3 * n + k] += d4 * np.float32(q4) * x[o + l + 3 * quarter]
    return lane.sum()


@njit(**FAST)
def dot_row(code, row, x):
    """Dot of one stored row (uint8, C-contiguous) with float32 x (ncols) -> float32."""
    if code == L4K.code:
        return _dot_q4_k(row, x)
    if code == L50.code:
        return _dot_q5_0(row, x)
    if code == L6K.code:
        return _dot_q6_k(row, x)
    if code == L8.code:
        return _dot_q8_0(row, x)
    if code == L41.code:
        return _dot_q4_1(row, x)
    if code == L40.code:
        return _dot_q4_0(row, x)
    if code == LBF16.code:
        return _dot_bf16(row, x)
    if code == LF16.code:
        return _dot_f16(row, x)
    if code == LF32.code:
        return _dot_f32(row, x)
    raise ValueError("unknown weight format code")


@njit(**FAST)
def matvec(code, w, x, out):
    """out[i] = dot(row i of w, x) for a 2-D stored matrix w (rows, row_bytes); single-threaded."""
    for i in range(w.shape[0]):
        out[i] = dot_row(code, w[i], x)
