"""The decode hot path for block formats: int16-quantised activations, integer dot products.

For one token, `matmul` quantises x once per matvec to int16 per ACTIVATION_BLOCK (32) elements
(x ~= xq * xs[b], |xq| <= 32767; 16 bits keep the activations within ~1.5e-5 of f32) and keeps each
block's f32 sum (xf, for the formats with a min). Each row is then one LLVM loop written in IR
below: a block's weights are unpacked to int16 lanes, multiplied with xq by vpmaddwd (16 x i16*i16
-> 8 pair sums in i32, exact), the i32 lanes converted to f32 once per activation block and FMA'd
into 8 f32 lanes by d_w * xs[b]. No int->float conversion per element, no float multiply per
element. Integer ranges: |w| <= 128 (q8_0), |w*scale| <= 4096 (q6_k, scale folded in int16), so a
block's i32 lane sum stays below 2^30. Offsets come from the formats' layouts.

The x86 intrinsic is only emitted when the host has AVX2; otherwise `_pmaddwd` emits portable IR
(sext, mul, even/odd add) so the functions still compile, but `matmul` then uses the f32 `dot_row`
(Q16 is False). FUEL_NO_Q16=1 forces that fallback at import; numba's cache does not see module
globals, so flip it with a fresh NUMBA_CACHE_DIR (tests pass q16=False instead).
"""

from __future__ import annotations

import os

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...formats import ACTIVATION_BLOCK, Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0
from .jit import FAST

L8, L40, L41, L50 = Q8_0.layout, Q4_0.layout, Q4_1.layout, Q5_0.layout
L4K, L6K = Q4_K.layout, Q6_K.layout
AB = ACTIVATION_BLOCK
HALF = AB // 2  # one <16 x i16> vector: half an activation block

HAVE_AVX2 = bool(llb.get_host_cpu_features().get("avx2", False))
Q16 = HAVE_AVX2 and not os.environ.get("FUEL_NO_Q16")

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_V16I8 = ir.VectorType(_I8, HALF)
_V16I16 = ir.VectorType(_I16, HALF)
_V8I32 = ir.VectorType(_I32, HALF // 2)
_V8F32 = ir.VectorType(_F32, HALF // 2)


@njit(**FAST)
def quantize_x16(x, xq, xs, xf):
    """x (f32, K multiple of AB) -> xq int16 (K), xs f32 block scales (K/AB), xf f32 block sums."""
    for b in range(x.size // AB):
        o = b * AB
        amax = np.float32(0.0)
        s = np.float32(0.0)
        for j in range(AB):
            v = x[o + j]
            amax = max(amax, abs(v))
            s += v
        xf[b] = s
        # NaN or inf in the block: max() skips a NaN, so carry it in the scale (s != s, not np.isfinite:
        # under reassoc + nsz numba's isfinite folds to true)
        if s != s or abs(s) == np.inf:
            xs[b] = np.float32(np.nan)
            for j in range(AB):
                xq[o + j] = np.int16(0)
        elif amax == 0.0:
            xs[b] = np.float32(0.0)
            for j in range(AB):
                xq[o + j] = np.int16(0)
        else:
            xs[b] = amax / np.float32(32767.0)
            inv = np.float32(32767.0) / amax
            for j in range(AB):
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
    p = builder.mul(builder.sext(a, ir.VectorType(_I32, HALF)), builder.sext(b, ir.VectorType(_I32, HALF)))
    ev = builder.shuffle_vector(p, p, _vconst(_I32, range(0, HALF, 2)))
    od = builder.shuffle_vector(p, p, _vconst(_I32, range(1, HALF, 2)))
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

    def at(self, base, add):  # base + add (i64)
        return self.builder.add(base, _c64(add))

    def u8x16(self, off):  # HALF bytes at row + off, zero-extended to <16 x i16>
        return self.builder.zext(_load(self.builder, self.row, off, _V16I8), _V16I16)

    def xq16(self, off):  # <16 x i16> of xq at element offset off
        return _load(self.builder, self.xq, off, _V16I16)

    def xsb(self, k):  # xs[k], k an i64
        return _load(self.builder, self.xs, k, _F32)

    def xfb(self, k):
        return _load(self.builder, self.xf, k, _F32)

    def xblock(self, o, w0, w1):
        """pair sums <8 x i32> of one activation block at element o with weights w0 | w1 (<16 x i16>)."""
        bd = self.builder
        return bd.add(_pmaddwd(bd, w0, self.xq16(o)), _pmaddwd(bd, w1, self.xq16(self.at(o, HALF))))


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
            n_ab = cgutils.unpack_tuple(builder, arrs[2].shape, 1)[0]  # K / AB
            nb = builder.udiv(n_ab, ir.Constant(n_ab.type, block_elems // AB))
            acc_p = cgutils.alloca_once_value(builder, ir.Constant(_V8F32, [0.0] * (HALF // 2)))
            sc_p = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
            with cgutils.for_range(builder, nb) as loop:
                ctx = _Ctx(builder, row_p, xq_p, xs_p, xf_p, builder.sext(loop.index, _I64))
                acc, s = emit_block(ctx, builder.load(acc_p))
                builder.store(acc, acc_p)
                if s is not None:
                    builder.store(builder.fadd(builder.load(sc_p), s), sc_p)
            acc = builder.load(acc_p)
            tot = builder.load(sc_p)
            for i in range(HALF // 2):
                tot = builder.fadd(tot, builder.extract_element(acc, ir.Constant(_I32, i)))
            return tot

        return sig, codegen

    return row_dot


def _fma_block(builder, acc, isum, scale):
    """acc + float(isum) * scale (isum <8 x i32>, scale f32)."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fma, [builder.sitofp(isum, _V8F32), _splat(builder, scale, HALF // 2), acc])


def _nibbles(c, off):
    q = c.u8x16(off)
    return c.builder.and_(q, _splat(c.builder, ir.Constant(_I16, 15), HALF)), c.builder.lshr(q, _splat(c.builder, ir.Constant(_I16, 4), HALF))


def _emit_q8_0(c, acc):
    bd, L = c.builder, L8
    p = c.off(L.block_bytes)
    w0 = bd.sext(_load(bd, c.row, c.at(p, L.qs), _V16I8), _V16I16)
    w1 = bd.sext(_load(bd, c.row, c.at(p, L.qs + HALF), _V16I8), _V16I16)
    isum = c.xblock(c.off(L.block_elems), w0, w1)
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, c.at(p, L.d)), c.xsb(c.b))), None


def _emit_q4_0(c, acc):
    bd, L = c.builder, L40
    p = c.off(L.block_bytes)
    lo, hi = _nibbles(c, c.at(p, L.qs))
    zero = _splat(bd, ir.Constant(_I16, L.zero), HALF)
    isum = c.xblock(c.off(L.block_elems), bd.sub(lo, zero), bd.sub(hi, zero))
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, c.at(p, L.d)), c.xsb(c.b))), None


def _emit_q4_1(c, acc):
    bd, L = c.builder, L41
    p = c.off(L.block_bytes)
    lo, hi = _nibbles(c, c.at(p, L.qs))
    isum = c.xblock(c.off(L.block_elems), lo, hi)
    acc = _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, c.at(p, L.d)), c.xsb(c.b)))
    return acc, bd.fmul(_f16(bd, c.row, c.at(p, L.m)), c.xfb(c.b))  # + m * sum(x)


def _u8(bd, base, off):
    return bd.zext(_load(bd, base, off, _I8), _I32)


def _emit_q4_k(c, acc):
    bd, L = c.builder, L4K
    p = c.off(L.block_bytes)
    d = _f16(bd, c.row, c.at(p, L.d))
    dmin = _f16(bd, c.row, c.at(p, L.dmin))
    sb = [_u8(bd, c.row, c.at(p, L.scales + i)) for i in range(L.qs - L.scales)]
    c63, c15, c4, c6 = (ir.Constant(_I32, v) for v in (63, 15, 4, 6))
    mins = None
    per_block = L.block_elems // AB
    for i in range(L.sub_blocks):  # get_scale_min_k4
        if i < 4:
            s, m = bd.and_(sb[i], c63), bd.and_(sb[i + 4], c63)
        else:
            s = bd.or_(bd.and_(sb[i + 4], c15), bd.shl(bd.lshr(sb[i - 4], c6), c4))
            m = bd.or_(bd.lshr(sb[i + 4], c4), bd.shl(bd.lshr(sb[i], c6), c4))
        k = c.off(per_block, i * L.sub_elems // AB)  # the activation block of sub-block i
        q0 = c.at(p, L.qs + (i // 2) * L.sub_elems)
        o = bd.mul(k, _c64(AB))
        pick = i % 2  # even sub-blocks in the low nibbles, odd ones in the high
        wa = _nibbles(c, q0)[pick]
        wb = _nibbles(c, bd.add(q0, _c64(HALF)))[pick]
        isum = c.xblock(o, wa, wb)
        acc = _fma_block(bd, acc, isum, bd.fmul(bd.fmul(d, bd.sitofp(s, _F32)), c.xsb(k)))
        t = bd.fmul(bd.sitofp(m, _F32), c.xfb(k))
        mins = t if mins is None else bd.fadd(mins, t)
    return acc, bd.fmul(bd.fsub(ir.Constant(_F32, 0.0), dmin), mins)


def _emit_q6_k(c, acc):
    bd, L = c.builder, L6K
    p = c.off(L.block_bytes)
    d = _f16(bd, c.row, c.at(p, L.d))
    s16 = lambda v: _splat(bd, ir.Constant(_I16, v), HALF)  # noqa: E731
    c15, c3, c4, zero = s16(15), s16(3), s16(4), s16(L.zero)
    quarter = L.half // 4
    per_block = L.block_elems // AB
    for h in range(L.block_elems // L.half):
        ql = c.at(p, L.ql + h * L.half // 2)
        qh = c.at(p, L.qh + h * quarter)
        sc = c.at(p, L.scales + h * L.half // L.sub_elems)
        parts = [[None, None] for _ in range(4)]  # parts[k][g]: i32 pair sums of sub-block (k, g)
        for g in range(quarter // L.sub_elems):
            a = c.u8x16(bd.add(ql, _c64(L.sub_elems * g)))
            cc = c.u8x16(bd.add(ql, _c64(quarter + L.sub_elems * g)))
            hb = c.u8x16(bd.add(qh, _c64(L.sub_elems * g)))
            ws = [
                bd.or_(bd.and_(a, c15), bd.shl(bd.and_(hb, c3), c4)),
                bd.or_(bd.and_(cc, c15), bd.shl(bd.and_(bd.lshr(hb, s16(2)), c3), c4)),
                bd.or_(bd.lshr(a, c4), bd.shl(bd.and_(bd.lshr(hb, c4), c3), c4)),
                bd.or_(bd.lshr(cc, c4), bd.shl(bd.lshr(hb, s16(6)), c4)),
            ]
            for k in range(4):
                scale = bd.sext(_load(bd, c.row, bd.add(sc, _c64(g + 2 * k)), _I8), _I16)
                w = bd.mul(bd.sub(ws[k], zero), _splat(bd, scale, HALF))  # |w| <= 32*128: fits i16
                xo = c.off(L.block_elems, h * L.half + quarter * k + L.sub_elems * g)
                parts[k][g] = _pmaddwd(bd, w, c.xq16(xo))
        for k in range(4):
            xb = c.off(per_block, (h * L.half + quarter * k) // AB)
            acc = _fma_block(bd, acc, bd.add(parts[k][0], parts[k][1]), bd.fmul(d, c.xsb(xb)))
    return acc, None


_V32I8 = ir.VectorType(_I8, AB)
_BYTEBIT = _vconst(_I8, [1 << (j % 8) if j % 8 < 7 else -128 for j in range(AB)])


def _emit_q5_0(c, acc):
    """q5_0 unpacked in byte lanes (one 32-byte op per step: 8% faster than in int16 lanes),
    q - 16 == nibble | 0xF0 where the 5th bit is clear, then sign-extended to int16."""
    bd, L = c.builder, L50
    p = c.off(L.block_bytes)
    qh = bd.bitcast(_load(bd, c.row, c.at(p, L.qh), _I32), ir.VectorType(_I8, 4))
    qs = _load(bd, c.row, c.at(p, L.qs), _V16I8)
    lo = bd.and_(qs, _splat(bd, ir.Constant(_I8, 15), HALF))
    hi = bd.lshr(qs, _splat(bd, ir.Constant(_I8, 4), HALF))
    nib = bd.shuffle_vector(lo, hi, _vconst(_I32, range(AB)))
    hb = bd.shuffle_vector(qh, qh, _vconst(_I32, [j // 8 for j in range(AB)]))
    clear = bd.icmp_unsigned("==", bd.and_(hb, _BYTEBIT), ir.Constant(_V32I8, [0] * AB))
    w8 = bd.or_(nib, bd.select(clear, _splat(bd, ir.Constant(_I8, -L.zero), AB), ir.Constant(_V32I8, [0] * AB)))
    w0 = bd.sext(bd.shuffle_vector(w8, w8, _vconst(_I32, range(HALF))), _V16I16)
    w1 = bd.sext(bd.shuffle_vector(w8, w8, _vconst(_I32, range(HALF, AB))), _V16I16)
    isum = c.xblock(c.off(L.block_elems), w0, w1)
    return _fma_block(bd, acc, isum, bd.fmul(_f16(bd, c.row, c.at(p, L.d)), c.xsb(c.b))), None


_q16_q8_0 = _row_intrinsic(L8.block_elems, _emit_q8_0)
_q16_q4_0 = _row_intrinsic(L40.block_elems, _emit_q4_0)
_q16_q4_1 = _row_intrinsic(L41.block_elems, _emit_q4_1)
_q16_q5_0 = _row_intrinsic(L50.block_elems, _emit_q5_0)
_q16_q4_k = _row_intrinsic(L4K.block_elems, _emit_q4_k)
_q16_q6_k = _row_intrinsic(L6K.block_elems, _emit_q6_k)


@njit(**FAST)
def dot_row_q16(code, row, xq, xs, xf):
    """Dot of one stored row with the int16-quantised x of `quantize_x16` -> float32.
    Only for the codes q16_supported accepts."""
    if code == L50.code:
        return _q16_q5_0(row, xq, xs, xf)
    if code == L8.code:
        return _q16_q8_0(row, xq, xs, xf)
    if code == L4K.code:
        return _q16_q4_k(row, xq, xs, xf)
    if code == L6K.code:
        return _q16_q6_k(row, xq, xs, xf)
    if code == L41.code:
        return _q16_q4_1(row, xq, xs, xf)
    if code == L40.code:
        return _q16_q4_0(row, xq, xs, xf)
    raise ValueError("no q16 dot for this weight format code")


@njit(**FAST)
def q16_supported(code):
    return Q16 and (code == L8.code or code == L40.code or code == L41.code or code == L50.code
                    or code == L4K.code or code == L6K.code)


@njit(**FAST)
def matvec_q16(code, w, x, out):
    """`matvec` through the int16-activation path (single-threaded; benchmarks and tests)."""
    K = x.size
    xq = np.empty(K, np.int16)
    xs = np.empty(K // AB, np.float32)
    xf = np.empty(K // AB, np.float32)
    quantize_x16(x, xq, xs, xf)
    for i in range(w.shape[0]):
        out[i] = dot_row_q16(code, w[i], xq, xs, xf)
