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


# ------------------------------------------------------------------ 16-bit activation decode path
# For one token, `matmul` quantises x once per matvec to int16 per 32-element block (x ~= xq * xs[b],
# |xq| <= 32767; 16 bits keep the activations within ~1.5e-5 of f32) and keeps each block's f32
# sum (xf, for the formats with a min). Each row is then one LLVM loop written in IR below: a
# block's weights are unpacked to int16 lanes, multiplied with xq by vpmaddwd (16 x i16*i16 -> 8
# pair sums in i32, exact), the i32 lanes converted to f32 once per block (per 32 x-elements) and
# FMA'd into 8 f32 lanes by d_w * xs[b]. No int->float conversion per element, no float multiply
# per element. Integer ranges: |w| <= 128 (q8_0), |w*scale| <= 4096 (q6_k, scale folded in int16),
# so a block's i32 lane sum stays below 2^30.
#
# The x86 intrinsic is only emitted when the host has AVX2; otherwise `_pmaddwd` emits portable IR
# (sext, mul, even/odd add) so the functions still compile, but `matmul` then uses the f32
# `dot_row` (Q16 is False). FUEL_NO_Q16=1 forces that fallback at import; numba's cache does not
# see module globals, so flip it with a fresh NUMBA_CACHE_DIR (tests pass q16=False instead).

import os as _os

import llvmlite.binding as _llb
from numba.core import cgutils

HAVE_AVX2 = bool(_llb.get_host_cpu_features().get("avx2", False))
Q16 = HAVE_AVX2 and not _os.environ.get("FUEL_NO_Q16")

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_V16I8 = ir.VectorType(_I8, 16)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F32 = ir.VectorType(_F32, 8)


@njit(**_FAST)
def quantize_x16(x, xq, xs, xf):
    """x (f32, K multiple of 32) -> xq int16 (K), xs f32 block scales (K/32), xf f32 block sums."""
    for b in range(x.size // 32):
        o = b * 32
        amax = np.float32(0.0)
        s = np.float32(0.0)
        for j in range(32):
            v = x[o + j]
            amax = max(amax, abs(v))
            s += v
        xf[b] = s
        if amax == 0.0:
            xs[b] = np.float32(0.0)
            for j in range(32):
                xq[o + j] = np.int16(0)
        else:
            xs[b] = amax / np.float32(32767.0)
            inv = np.float32(32767.0) / amax
            for j in range(32):
                xq[o + j] = np.int16(np.int32(np.rint(x[o + j] * inv)))


def _splat(builder, val, n):
    vt = ir.VectorType(val.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _vconst(ty, vals):
    return ir.Constant(ir.VectorType(ty, len(vals)), list(vals))


def _load(builder, base, off, ty):
    """Unaligned load of ty at byte/element offset off (i64) from pointer base."""
    p = builder.gep(base, [off])
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)


def _pmaddwd(builder, a, b):
    """<16 x i16> a, b -> <8 x i32> (a[2i]*b[2i] + a[2i+1]*b[2i+1])."""
    if HAVE_AVX2:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8I32, [_V16I16, _V16I16]),
                                            "llvm.x86.avx2.pmadd.wd")
        return builder.call(fn, [a, b])
    p = builder.mul(builder.sext(a, ir.VectorType(_I32, 16)), builder.sext(b, ir.VectorType(_I32, 16)))
    ev = builder.shuffle_vector(p, p, _vconst(_I32, range(0, 16, 2)))
    od = builder.shuffle_vector(p, p, _vconst(_I32, range(1, 16, 2)))
    return builder.add(ev, od)


def _f16(builder, base, off):
    """The little-endian f16 at byte off of base, as float (fpext: exact; vcvtph2ps with F16C)."""
    h = _load(builder, base, off, _I16)
    return builder.fpext(builder.bitcast(h, ir.HalfType()), _F32)


def _c64(v):
    return ir.Constant(_I64, v)


class _Ctx:
    """What a block emitter needs: the builder and base pointers, the block index b (i64)."""

    def __init__(self, builder, row, xq, xs, xf, b):
        self.builder, self.row, self.xq, self.xs, self.xf, self.b = builder, row, xq, xs, xf, b

    def off(self, scale, add=0):  # b * scale + add, i64
        return self.builder.add(self.builder.mul(self.b, _c64(scale)), _c64(add))

    def u8x16(self, off):  # 16 bytes at row + off, zero-extended to <16 x i16>
        return self.builder.zext(_load(self.builder, self.row, off, _V16I8), _V16I16)

    def xq16(self, off):  # <16 x i16> of xq at element offset off
        return _load(self.builder, self.xq, off, _V16I16)

    def xsb(self, k):  # xs[k], k an i64
        return _load(self.builder, self.xs, k, _F32)

    def xfb(self, k):
        return _load(self.builder, self.xf, k, _F32)


def _row_intrinsic(block_elems, emit_block):
    """An intrinsic (row, xq, xs, xf) -> float32 looping emit_block over the row's blocks.

    emit_block(ctx, acc) -> (acc', scalar or None): acc is the <8 x float> accumulator (FMA into it),
    scalar an f32 added to the result (min terms)."""

    @intrinsic
    def row_dot(typingctx, row, xq, xs, xf):
        sig = types.float32(row, xq, xs, xf)

        def codegen(context, builder, signature, args):
            arrs = [context.make_array(t)(context, builder, v) for t, v in zip(signature.args, args)]
            row_p = builder.bitcast(arrs[0].data, _I8.as_pointer())
            xq_p = builder.bitcast(arrs[1].data, _I16.as_pointer())
            xs_p = builder.bitcast(arrs[2].data, _F32.as_pointer())
            xf_p = builder.bitcast(arrs[3].data, _F32.as_pointer())
            n32 = cgutils.unpack_tuple(builder, arrs[2].shape, 1)[0]  # K / 32
            nb = builder.udiv(n32, ir.Constant(n32.type, block_elems // 32))
            acc_p = cgutils.alloca_once_value(builder, ir.Constant(_V8F32, [0.0] * 8))
            sc_p = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
            with cgutils.for_range(builder, nb) as loop:
                ctx = _Ctx(builder, row_p, xq_p, xs_p, xf_p, builder.sext(loop.index, _I64))
                acc, s = emit_block(ctx, builder.load(acc_p))
                builder.store(acc, acc_p)
                if s is not None:
                    builder.store(builder.fadd(builder.load(sc_p), s), sc_p)
            acc = builder.load(acc_p)
            tot = builder.load(sc_p)
            for i in range(8):
                tot = builder.fadd(tot, builder.extract_element(acc, ir.Constant(_I32, i)))
            return tot

        return sig, codegen

    return row_dot


def _fma_block(builder, acc, isum, scale):
    """acc + float(isum) * scale (isum <8 x i32>, scale f32)."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fma, [builder.sitofp(isum, _V8F32), _splat(builder, scale, 8), acc])


def _emit_q8_0(c, acc):
    bd = c.builder
    p = c.off(34)
    w0 = bd.sext(_load(bd, c.row, bd.add(p, _c64(2)), _V16I8), _V16I16)
    w1 = bd.sext(_load(bd, c.row, bd.add(p, _c64(18)), _V16I8), _V16I16)
    o = c.off(32)
    isum = bd.add(_pmaddwd(bd, w0, c.xq16(o)), _pmaddwd(bd, w1, c.xq16(bd.add(o, _c64(16)))))
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, p), c.xsb(c.b))), None


def _nibbles(c, off):
    q = c.u8x16(off)
    return c.builder.and_(q, _splat(c.builder, ir.Constant(_I16, 15), 16)), c.builder.lshr(q, _splat(c.builder, ir.Constant(_I16, 4), 16))


def _emit_q4_0(c, acc):
    bd = c.builder
    p = c.off(18)
    lo, hi = _nibbles(c, bd.add(p, _c64(2)))
    eight = _splat(bd, ir.Constant(_I16, 8), 16)
    o = c.off(32)
    isum = bd.add(_pmaddwd(bd, bd.sub(lo, eight), c.xq16(o)), _pmaddwd(bd, bd.sub(hi, eight), c.xq16(bd.add(o, _c64(16)))))
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, p), c.xsb(c.b))), None


def _emit_q4_1(c, acc):
    bd = c.builder
    p = c.off(20)
    lo, hi = _nibbles(c, bd.add(p, _c64(4)))
    o = c.off(32)
    isum = bd.add(_pmaddwd(bd, lo, c.xq16(o)), _pmaddwd(bd, hi, c.xq16(bd.add(o, _c64(16)))))
    acc = _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, p), c.xsb(c.b)))
    return acc, bd.fmul(_f16(bd, c.row, bd.add(p, _c64(2))), c.xfb(c.b))  # + m * sum(x)


def _u8(bd, base, off):
    return bd.zext(_load(bd, base, off, _I8), _I32)


def _emit_q4_k(c, acc):
    bd = c.builder
    p = c.off(144)
    d = _f16(bd, c.row, p)
    dmin = _f16(bd, c.row, bd.add(p, _c64(2)))
    sb = [_u8(bd, c.row, bd.add(p, _c64(4 + i))) for i in range(12)]
    c63, c15, c4, c6 = (ir.Constant(_I32, v) for v in (63, 15, 4, 6))
    mins = None
    for i in range(8):  # get_scale_min_k4
        if i < 4:
            s, m = bd.and_(sb[i], c63), bd.and_(sb[i + 4], c63)
        else:
            s = bd.or_(bd.and_(sb[i + 4], c15), bd.shl(bd.lshr(sb[i - 4], c6), c4))
            m = bd.or_(bd.lshr(sb[i + 4], c4), bd.shl(bd.lshr(sb[i], c6), c4))
        k = bd.add(bd.mul(c.b, _c64(8)), _c64(i))  # x block of sub-block i
        q0 = bd.add(p, _c64(16 + (i // 2) * 32))
        o = bd.mul(k, _c64(32))
        if i % 2 == 0:
            wa, _ = _nibbles(c, q0)
            wb, _ = _nibbles(c, bd.add(q0, _c64(16)))
        else:
            _, wa = _nibbles(c, q0)
            _, wb = _nibbles(c, bd.add(q0, _c64(16)))
        isum = bd.add(_pmaddwd(bd, wa, c.xq16(o)), _pmaddwd(bd, wb, c.xq16(bd.add(o, _c64(16)))))
        acc = _fma_block(bd, acc, isum, bd.fmul(bd.fmul(d, bd.sitofp(s, _F32)), c.xsb(k)))
        t = bd.fmul(bd.sitofp(m, _F32), c.xfb(k))
        mins = t if mins is None else bd.fadd(mins, t)
    return acc, bd.fmul(bd.fsub(ir.Constant(_F32, 0.0), dmin), mins)


def _emit_q6_k(c, acc):
    bd = c.builder
    p = c.off(210)
    d = _f16(bd, c.row, bd.add(p, _c64(208)))
    s16 = lambda v: _splat(bd, ir.Constant(_I16, v), 16)
    c15, c3, c4, c32 = s16(15), s16(3), s16(4), s16(32)
    for h in range(2):
        ql = bd.add(p, _c64(64 * h))
        qh = bd.add(p, _c64(128 + 32 * h))
        sc = bd.add(p, _c64(192 + 8 * h))
        parts = [[None, None] for _ in range(4)]  # parts[k][g]: i32 pair sums of sub-block (k, g)
        for g in range(2):
            a = c.u8x16(bd.add(ql, _c64(16 * g)))
            cc = c.u8x16(bd.add(ql, _c64(32 + 16 * g)))
            hb = c.u8x16(bd.add(qh, _c64(16 * g)))
            ws = [
                bd.or_(bd.and_(a, c15), bd.shl(bd.and_(hb, c3), c4)),
                bd.or_(bd.and_(cc, c15), bd.shl(bd.and_(bd.lshr(hb, s16(2)), c3), c4)),
                bd.or_(bd.lshr(a, c4), bd.shl(bd.and_(bd.lshr(hb, c4), c3), c4)),
                bd.or_(bd.lshr(cc, c4), bd.shl(bd.lshr(hb, s16(6)), c4)),
            ]
            for k in range(4):
                scale = bd.sext(_load(bd, c.row, bd.add(sc, _c64(g + 2 * k)), _I8), _I16)
                w = bd.mul(bd.sub(ws[k], c32), _splat(bd, scale, 16))  # |w| <= 32*128: fits i16
                xo = bd.add(c.off(256, 128 * h + 32 * k + 16 * g), _c64(0))
                parts[k][g] = _pmaddwd(bd, w, c.xq16(xo))
        for k in range(4):
            xb = c.off(8, 4 * h + k)
            isum = bd.add(parts[k][0], parts[k][1])
            acc = _fma_block(bd, acc, isum, bd.fmul(d, c.xsb(xb)))
    return acc, None


_V32I8 = ir.VectorType(_I8, 32)
_BYTEBIT = _vconst(_I8, [1 << (j % 8) if j % 8 < 7 else -128 for j in range(32)])


def _emit_q5_0(c, acc):
    """q5_0 unpacked in byte lanes (one 32-byte op per step: 8% faster than in int16 lanes),
    q - 16 == nibble | 0xF0 where the 5th bit is clear, then sign-extended to int16."""
    bd = c.builder
    p = c.off(22)
    qh = bd.bitcast(_load(bd, c.row, bd.add(p, _c64(2)), _I32), ir.VectorType(_I8, 4))
    qs = _load(bd, c.row, bd.add(p, _c64(6)), _V16I8)
    lo = bd.and_(qs, _splat(bd, ir.Constant(_I8, 15), 16))
    hi = bd.lshr(qs, _splat(bd, ir.Constant(_I8, 4), 16))
    nib = bd.shuffle_vector(lo, hi, _vconst(_I32, range(32)))
    hb = bd.shuffle_vector(qh, qh, _vconst(_I32, [j // 8 for j in range(32)]))
    clear = bd.icmp_unsigned("==", bd.and_(hb, _BYTEBIT), ir.Constant(_V32I8, [0] * 32))
    w8 = bd.or_(nib, bd.select(clear, _splat(bd, ir.Constant(_I8, -16), 32), ir.Constant(_V32I8, [0] * 32)))
    w0 = bd.sext(bd.shuffle_vector(w8, w8, _vconst(_I32, range(16))), _V16I16)
    w1 = bd.sext(bd.shuffle_vector(w8, w8, _vconst(_I32, range(16, 32))), _V16I16)
    o = c.off(32)
    isum = bd.add(_pmaddwd(bd, w0, c.xq16(o)), _pmaddwd(bd, w1, c.xq16(bd.add(o, _c64(16)))))
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, p), c.xsb(c.b))), None

_q16_q8_0 = _row_intrinsic(32, _emit_q8_0)
_q16_q4_0 = _row_intrinsic(32, _emit_q4_0)
_q16_q4_1 = _row_intrinsic(32, _emit_q4_1)
_q16_q5_0 = _row_intrinsic(32, _emit_q5_0)
_q16_q4_k = _row_intrinsic(256, _emit_q4_k)
_q16_q6_k = _row_intrinsic(256, _emit_q6_k)


@njit(**_FAST)
def dot_row_q16(code, row, xq, xs, xf):
    """Dot of one stored row with the int16-quantised x of `quantize_x16` -> float32.
    Only for the codes q16_supported accepts."""
    if code == Q5_0:
        return _q16_q5_0(row, xq, xs, xf)
    if code == Q8_0:
        return _q16_q8_0(row, xq, xs, xf)
    if code == Q4_K:
        return _q16_q4_k(row, xq, xs, xf)
    if code == Q6_K:
        return _q16_q6_k(row, xq, xs, xf)
    if code == Q4_1:
        return _q16_q4_1(row, xq, xs, xf)
    if code == Q4_0:
        return _q16_q4_0(row, xq, xs, xf)
    raise ValueError("no q16 dot for this weight format code")


@njit(**_FAST)
def q16_supported(code):
    return Q16 and (code == Q8_0 or code == Q4_0 or code == Q4_1 or code == Q5_0 or code == Q4_K or code == Q6_K)


@njit(**_FAST)
def matvec_q16(code, w, x, out):
    """`matvec` through the int16-activation path (single-threaded; benchmarks and tests)."""
    K = x.size
    xq = np.empty(K, np.int16)
    xs = np.empty(K // 32, np.float32)
    xf = np.empty(K // 32, np.float32)
    quantize_x16(x, xq, xs, xf)
    for i in range(w.shape[0]):
        out[i] = dot_row_q16(code, w[i], xq, xs, xf)
