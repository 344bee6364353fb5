"""Numba row kernels for every weight format: decode a stored row, or dot it with an f32 vector.

`code` is `fuelcli.weights.formats.FORMATS[fmt].code` (ints so the engine's njit layer functions
can dispatch without strings). `row` is one row's bytes: a C-contiguous uint8 1-D array, e.g.
`t.data[i]` (or `t.data[e, i]` for experts) of a `Tensor`.

- `dequant_row` is exact: it repeats formats.dequantize's float operations in the same order and is
  compiled without fastmath, so nothing is reassociated or fused into an FMA.
- `dot_row` is the decode hot path: fused per block (the row is never materialised), fastmath so
  LLVM reassociates the per-block sums into vector lanes. Integers are cast to int32/float32
  explicitly, because numba widens integer arithmetic to int64 and AVX2 cannot convert int64
  vectors to float.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K = range(9)  # == formats.FORMATS[*].code

_EXACT = dict(cache=True, fastmath=False)
_FAST = dict(cache=True, fastmath=True)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret a uint32 as float32 (a bitcast; numba has no scalar view)."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(**_EXACT)
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


@njit(**_EXACT)
def _f16_at(row, p):
    """The little-endian f16 at byte p of row, as float32 (block scales)."""
    return _f32_from_bits(_f16_bits_to_f32_bits(np.uint32(row[p]) | (np.uint32(row[p + 1]) << np.uint32(8))))


@njit(**_FAST)
def _f16_fast(h):
    """Half bits -> float32 without branches, for f16 weight rows (vectorises; inf/NaN not handled).

    Placing the 15 non-sign bits at float bit 13 and scaling by 2^112 rebases the exponent and
    handles subnormals too (half_to_float_fast, F. Giesen)."""
    v = _f32_from_bits(np.uint32((np.uint32(h) & np.uint32(0x7FFF)) << np.uint32(13))) * np.float32(5.192296858534828e33)
    return -v if (h & 0x8000) else v


@njit(**_FAST)
def _scale16(row, p):
    """Block scale at byte p for dot_row: branchless (exact for finite halves); the branchy exact
    decoder, called once per 32-element block, cost 3x the whole q8_0 dot."""
    return _f16_fast(np.uint32(row[p]) | (np.uint32(row[p + 1]) << np.uint32(8)))


# ------------------------------------------------------------------ dequant_row (exact)


@njit(**_EXACT)
def _dq_q8_0(row, out):
    for b in range(out.size // 32):
        p = b * 34
        d = _f16_at(row, p)
        for j in range(32):
            out[b * 32 + j] = np.float32(np.int8(row[p + 2 + j])) * d


@njit(**_EXACT)
def _dq_q4_0(row, out):
    for b in range(out.size // 32):
        p = b * 18
        d = _f16_at(row, p)
        for j in range(16):
            q = np.int32(row[p + 2 + j])
            out[b * 32 + j] = d * np.float32((q & 15) - 8)
            out[b * 32 + j + 16] = d * np.float32((q >> 4) - 8)


@njit(**_EXACT)
def _dq_q4_1(row, out):
    for b in range(out.size // 32):
        p = b * 20
        d = _f16_at(row, p)
        m = _f16_at(row, p + 2)
        for j in range(16):
            q = np.int32(row[p + 4 + j])
            out[b * 32 + j] = d * np.float32(q & 15) + m
            out[b * 32 + j + 16] = d * np.float32(q >> 4) + m


@njit(**_EXACT)
def _dq_q5_0(row, out):
    for b in range(out.size // 32):
        p = b * 22
        d = _f16_at(row, p)
        qh = np.int64(row[p + 2]) | (np.int64(row[p + 3]) << 8) | (np.int64(row[p + 4]) << 16) | (np.int64(row[p + 5]) << 24)
        for j in range(16):
            q = np.int64(row[p + 6 + j])
            lo = (q & 15) | (((qh >> j) & 1) << 4)
            hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
            out[b * 32 + j] = d * np.float32(lo - 16)
            out[b * 32 + j + 16] = d * np.float32(hi - 16)


@njit(**_EXACT)
def _k_scale_min(row, p, i):
    """Q4_K sub-block i's 6-bit (scale, min) from the 12 scale bytes at row[p:] (get_scale_min_k4)."""
    if i < 4:
        return np.int32(row[p + i]) & 63, np.int32(row[p + i + 4]) & 63
    s = (np.int32(row[p + i + 4]) & 15) | ((np.int32(row[p + i - 4]) >> 6) << 4)
    m = (np.int32(row[p + i + 4]) >> 4) | ((np.int32(row[p + i]) >> 6) << 4)
    return s, m


@njit(**_EXACT)
def _dq_q4_k(row, out):
    for b in range(out.size // 256):
        p = b * 144
        d = _f16_at(row, p)
        dmin = _f16_at(row, p + 2)
        for c in range(4):  # 32 bytes -> sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
            s0, m0 = _k_scale_min(row, p + 4, 2 * c)
            s1, m1 = _k_scale_min(row, p + 4, 2 * c + 1)
            d0, dm0 = d * np.float32(s0), dmin * np.float32(m0)
            d1, dm1 = d * np.float32(s1), dmin * np.float32(m1)
            o = b * 256 + c * 64
            for l in range(32):
                q = np.int32(row[p + 16 + c * 32 + l])
                out[o + l] = d0 * np.float32(q & 15) - dm0
                out[o + 32 + l] = d1 * np.float32(q >> 4) - dm1


@njit(**_EXACT)
def _dq_q6_k(row, out):
    for b in range(out.size // 256):
        p = b * 210
        d = _f16_at(row, p + 208)
        for h in range(2):  # two halves of 128 elements
            ql = p + 64 * h
            qh = p + 128 + 32 * h
            sc = p + 192 + 8 * h
            o = b * 256 + 128 * h
            for l in range(32):
                a = np.int32(row[ql + l])
                c = np.int32(row[ql + l + 32])
                hb = np.int32(row[qh + l])
                g = l // 16
                q1 = ((a & 15) | ((hb & 3) << 4)) - 32
                q2 = ((c & 15) | (((hb >> 2) & 3) << 4)) - 32
                q3 = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32
                q4 = ((c >> 4) | (((hb >> 6) & 3) << 4)) - 32
                out[o + l] = (d * np.float32(np.int8(row[sc + g]))) * np.float32(q1)
                out[o + l + 32] = (d * np.float32(np.int8(row[sc + g + 2]))) * np.float32(q2)
                out[o + l + 64] = (d * np.float32(np.int8(row[sc + g + 4]))) * np.float32(q3)
                out[o + l + 96] = (d * np.float32(np.int8(row[sc + g + 6]))) * np.float32(q4)


@njit(**_EXACT)
def dequant_row(code, row, out):
    """Decode one stored row (uint8, C-contiguous) into out (float32, ncols), exactly."""
    if code == F32:
        out[:] = row.view(np.float32)
    elif code == F16:
        h = row.view(np.uint16)
        o = out.view(np.uint32)
        for i in range(out.size):
            o[i] = _f16_bits_to_f32_bits(h[i])
    elif code == BF16:
        h = row.view(np.uint16)
        o = out.view(np.uint32)
        for i in range(out.size):
            o[i] = np.uint32(h[i]) << np.uint32(16)
    elif code == Q8_0:
        _dq_q8_0(row, out)
    elif code == Q4_0:
        _dq_q4_0(row, out)
    elif code == Q4_1:
        _dq_q4_1(row, out)
    elif code == Q5_0:
        _dq_q5_0(row, out)
    elif code == Q4_K:
        _dq_q4_k(row, out)
    elif code == Q6_K:
        _dq_q6_k(row, out)
    else:
        raise ValueError("unknown weight format code")


# ------------------------------------------------------------------ dot_row (fused, fast)
# Pattern: per block, plain sums over a fixed trip count (LLVM turns them into vector lanes under
# fastmath), then one scalar multiply by the block scale. Sums of x are taken in the same pass for
# formats with an offset (q4_1 min, q4_k dmin) instead of dequantising q*d + m per element.


@njit(**_FAST)
def _dot_f32(row, x):
    w = row.view(np.float32)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += w[i] * x[i]
    return acc


@njit(**_FAST)
def _dot_f16(row, x):
    h = row.view(np.uint16)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += _f16_fast(h[i]) * x[i]
    return acc


@njit(**_FAST)
def _dot_bf16(row, x):
    h = row.view(np.uint16)
    acc = np.float32(0.0)
    for i in range(x.size):
        acc += _f32_from_bits(np.uint32(h[i]) << np.uint32(16)) * x[i]
    return acc


@njit(**_FAST)
def _dot_q8_0(row, x):
    lane = np.zeros(32, np.float32)  # see _dot_q4_0
    for b in range(x.size // 32):
        p = b * 34 + 2
        o = b * 32
        d = _scale16(row, p - 2)
        for j in range(32):
            lane[j] += d * np.float32(np.int8(row[p + j])) * x[o + j]
    return lane.sum()


@njit(**_FAST)
def _dot_q4_0(row, x):
    # 32 per-lane accumulators reduced once per row: for these 16-byte blocks this measured up to
    # 2x faster than a horizontal sum per block (one small heap array per row is negligible).
    # Nibbles are unpacked with uint8 ops and cast to int32 before float: an int64 intermediate
    # (numba's default for `q & 15` with an int literal) keeps the loop scalar.
    lane = np.zeros(32, np.float32)
    for b in range(x.size // 32):
        p = b * 18 + 2
        o = b * 32
        d = _scale16(row, p - 2)
        for j in range(16):
            q = row[p + j]
            lane[j] += d * np.float32(np.int32(q & np.uint8(15)) - np.int32(8)) * x[o + j]
            lane[j + 16] += d * np.float32(np.int32(q >> np.uint8(4)) - np.int32(8)) * x[o + j + 16]
    return lane.sum()


@njit(**_FAST)
def _dot_q4_1(row, x):
    lane = np.zeros(32, np.float32)  # see _dot_q4_0
    for b in range(x.size // 32):
        p = b * 20 + 4
        o = b * 32
        d = _scale16(row, p - 4)
        m = _scale16(row, p - 2)
        for j in range(16):
            q = row[p + j]
            lane[j] += (d * np.float32(np.int32(q & np.uint8(15))) + m) * x[o + j]
            lane[j + 16] += (d * np.float32(np.int32(q >> np.uint8(4))) + m) * x[o + j + 16]
    return lane.sum()


@njit(**_FAST)
def _dot_q5_0(row, x):
    acc = np.float32(0.0)
    for b in range(x.size // 32):
        p = b * 22
        o = b * 32
        qh = np.uint32(row[p + 2]) | (np.uint32(row[p + 3]) << np.uint32(8)) | (np.uint32(row[p + 4]) << np.uint32(16)) | (np.uint32(row[p + 5]) << np.uint32(24))
        s = np.float32(0.0)
        for j in range(16):
            q = np.int32(row[p + 6 + j])
            h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
            h1 = np.int32((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
            s += np.float32(((q & 15) | h0) - 16) * x[o + j] + np.float32(((q >> 4) | h1) - 16) * x[o + j + 16]
        acc += _scale16(row, p) * s
    return acc


@njit(**_FAST)
def _dot_q4_k(row, x):
    # per-lane accumulators (see _dot_q4_0) with the sub-block scale and min folded in per element:
    # 1.5-1.7x the per-sub-block scalar sums it replaced
    lane = np.zeros(64, np.float32)
    for b in range(x.size // 256):
        p = b * 144
        d = _scale16(row, p)
        dmin = _scale16(row, p + 2)
        for c in range(4):
            s0, m0 = _k_scale_min(row, p + 4, 2 * c)
            s1, m1 = _k_scale_min(row, p + 4, 2 * c + 1)
            d0 = d * np.float32(s0)
            d1 = d * np.float32(s1)
            dm0 = dmin * np.float32(m0)
            dm1 = dmin * np.float32(m1)
            o = b * 256 + c * 64
            q0 = p + 16 + c * 32
            for l in range(32):
                q = row[q0 + l]
                lane[l] += (d0 * np.float32(np.int32(q & np.uint8(15))) - dm0) * x[o + l]
                lane[32 + l] += (d1 * np.float32(np.int32(q >> np.uint8(4))) - dm1) * x[o + 32 + l]
    return lane.sum()


@njit(**_FAST)
def _dot_q6_k(row, x):
    lane = np.zeros(64, np.float32)  # see _dot_q4_k
    u8 = np.uint8
    for b in range(x.size // 256):
        p = b * 210
        d = _scale16(row, p + 208)
        for h in range(2):
            ql = p + 64 * h
            qh = p + 128 + 32 * h
            sc = p + 192 + 8 * h
            o = b * 256 + 128 * h
            for g in range(2):  # 16 elements share a scale
                d1 = d * np.float32(np.int8(row[sc + g]))
                d2 = d * np.float32(np.int8(row[sc + g + 2]))
                d3 = d * np.float32(np.int8(row[sc + g + 4]))
                d4 = d * np.float32(np.int8(row[sc + g + 6]))
                for k in range(16):
                    l = 16 * g + k
                    a = row[ql + l]
                    c = row[ql + l + 32]
                    hb = row[qh + l]
                    q1 = np.int32((a & u8(15)) | ((hb & u8(3)) << u8(4))) - np.int32(32)
                    q2 = np.int32((c & u8(15)) | (((hb >> u8(2)) & u8(3)) << u8(4))) - np.int32(32)
                    q3 = np.int32((a >> u8(4)) | (((hb >> u8(4)) & u8(3)) << u8(4))) - np.int32(32)
                    q4 = np.int32((c >> u8(4)) | ((hb >> u8(6)) << u8(4))) - np.int32(32)
                    lane[k] += d1 * np.float32(q1) * x[o + l]
                    lane[16 + k] += d2 * np.float32(q2) * x[o + l + 32]
                    lane[32 + k] += d3 * np.float32(q3) * x[o + l + 64]
                    lane[48 + k] += d4 * np.float32(q4) * x[o + l + 96]
    return lane.sum()


@njit(**_FAST)
def dot_row(code, row, x):
    """Dot of one stored row (uint8, C-contiguous) with float32 x (ncols) -> float32."""
    if code == Q4_K:
        return _dot_q4_k(row, x)
    if code == Q5_0:
        return _dot_q5_0(row, x)
    if code == Q6_K:
        return _dot_q6_k(row, x)
    if code == Q8_0:
        return _dot_q8_0(row, x)
    if code == Q4_1:
        return _dot_q4_1(row, x)
    if code == Q4_0:
        return _dot_q4_0(row, x)
    if code == BF16:
        return _dot_bf16(row, x)
    if code == F16:
        return _dot_f16(row, x)
    if code == F32:
        return _dot_f32(row, x)
    raise ValueError("unknown weight format code")


@njit(**_FAST)
def matvec(code, w, x, out):
    """out[i] = dot(row i of w, x) for a 2-D stored matrix w (rows, row_bytes); single-threaded."""
    for i in range(w.shape[0]):
        out[i] = dot_row(code, w[i], x)


@njit(**_FAST)
def tile_matmul(tile, nrows, x, out, n0):
    """out[t, n0 + r] = dot(tile[r], x[t]) for r < nrows: the prefill micro-kernel.

    tile holds dequantised f32 rows (>= nrows, K). Blocks of 4 rows x 2 tokens keep 8 vector
    accumulators live, so each loaded element of x and of the tile feeds 4 or 2 FMAs instead of one.
    """
    T, K = x.shape
    r = 0
    while r + 4 <= nrows:
        w0 = tile[r]
        w1 = tile[r + 1]
        w2 = tile[r + 2]
        w3 = tile[r + 3]
        t = 0
        while t + 2 <= T:
            xa = x[t]
            xb = x[t + 1]
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            b0 = np.float32(0.0)
            b1 = np.float32(0.0)
            b2 = np.float32(0.0)
            b3 = np.float32(0.0)
            for k in range(K):
                u = xa[k]
                v = xb[k]
                a0 += w0[k] * u
                a1 += w1[k] * u
                a2 += w2[k] * u
                a3 += w3[k] * u
                b0 += w0[k] * v
                b1 += w1[k] * v
                b2 += w2[k] * v
                b3 += w3[k] * v
            out[t, n0 + r] = a0
            out[t, n0 + r + 1] = a1
            out[t, n0 + r + 2] = a2
            out[t, n0 + r + 3] = a3
            out[t + 1, n0 + r] = b0
            out[t + 1, n0 + r + 1] = b1
            out[t + 1, n0 + r + 2] = b2
            out[t + 1, n0 + r + 3] = b3
            t += 2
        if t < T:
            xa = x[t]
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(K):
                u = xa[k]
                a0 += w0[k] * u
                a1 += w1[k] * u
                a2 += w2[k] * u
                a3 += w3[k] * u
            out[t, n0 + r] = a0
            out[t, n0 + r + 1] = a1
            out[t, n0 + r + 2] = a2
            out[t, n0 + r + 3] = a3
        r += 4
    while r < nrows:
        w0 = tile[r]
        for t in range(T):
            xa = x[t]
            a0 = np.float32(0.0)
            for k in range(K):
                a0 += w0[k] * xa[k]
            out[t, n0 + r] = a0
        r += 1
