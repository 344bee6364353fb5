"""The CPU emitters of the float formats (f32, f16, bf16): elements of a row as f32 lanes, for every
kernel (the f32 panels of prefill, the FMA decode, the exact row decode)."""

from __future__ import annotations

from llvmlite import ir

from ...formats import BF16, F16, F32
from .emit import CpuFormat
from .irgen import F32T, I16, I32, load, splat_c, vec


def _f32(bd, row, k, n: int, exact: bool = False):
    """<n x float> of elements k..k+n-1 (k an i64) of the row at `row` (i8*)."""
    return load(bd, bd.bitcast(row, F32T.as_pointer()), k, vec(F32T, n))


def _halves(bd, row, k, n):
    return load(bd, bd.bitcast(row, I16.as_pointer()), k, vec(I16, n))


def _bf16(bd, row, k, n: int, exact: bool = False):
    """bf16 is the top half of an f32: widen the bits."""
    h = _halves(bd, row, k, n)
    return bd.bitcast(bd.shl(bd.zext(h, vec(I32, n)), splat_c(I32, 16, n)), vec(F32T, n))


def _f16(bd, row, k, n: int, exact: bool = False):
    h = _halves(bd, row, k, n)
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


RECORDS = [CpuFormat(F32, floats=_f32), CpuFormat(F16, floats=_f16), CpuFormat(BF16, floats=_bf16)]
