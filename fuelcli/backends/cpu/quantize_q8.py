"""8-bit activations (`--activations q8`): the quantize kernels that write them, as llama.cpp's
quantize_row_q8_0 (x86) and quantize_row_q8_K do, into the buffers and layouts of the int16 path.

Both are core.py's quantize with another block quantisation (core._quantize's `block`), so every
kernel that reads the int16 activations reads these unchanged: the values (|q| <= 127) in xq, each
32-element block's scale in xs, the block's sum in xf, the 16-element sums of q in xz, and a
one-token row's decode layout (the int8 planes: the high one all 0, the low one q itself; or the
words, followed on an ISA with q8 decode kernels by the low plane alone). The planes decode
kernels' one-plane variant (kernels_decode: `one_plane`) dots the low plane only. What differs from
int16 is the arithmetic llama.cpp does: the integer dot of the stored weights with 8-bit values,
then the scales.

  q8_0  per 32 elements: d = amax / 127 rounded to f16 (llama.cpp stores it so), q = rint(x * 127
        / amax) (round half to even: _mm256_round_ps); xf = d * sum(q) (Q8_1's s).
  q8_k  per 256 elements (QK_K): max = the first x of the largest magnitude, iscale = -127 / max,
        q = min(127, rint(x * iscale)), d = 1 / iscale, written to each of its 32-blocks' xs;
        xf = d * sum(q) over the 32-block (llama.cpp's bsums times d).

A 32-element block with inf or NaN gets a NaN scale, as in the int16 path.
"""

from __future__ import annotations

import math
from functools import lru_cache

from llvmlite import ir

from .core import TASK_ARGS, QuantRow, _quantize
from .irgen import F32T, G, I8, I16, I32, Loop, Var, c64, call_intrinsic, func, half_sums, hmax, ptr_to, splat, splat_c, vec
from .kernels_prefill import KC
from .kernels_decode import q8_decode_isa
from .llvm import Isa, compile_module, planes_isa

QK_K = 256
KINDS = ("q8_0", "q8_k")
MODULE = "quantize-q8"  # the compiled module's cache name (llvm.compile_module)
_MAGIC = 12582912.0  # x + 1.5 * 2^23 - 1.5 * 2^23: x rounded half to even (ggml's nearest_int)


def _store_q(bd, row, k, q):
    bd.store(bd.trunc(q, vec(I16, G)), bd.bitcast(bd.gep(row.q, [k]), vec(I16, G).as_pointer()), align=2)


def _rint(bd, v, scale):
    magic = splat_c(F32T, _MAGIC, G)
    return bd.fptosi(bd.fsub(bd.fadd(bd.fmul(v, splat(bd, scale, G)), magic), magic), vec(I32, G))


def _finish(bd, row, b, v, q, d):
    """Block b's scale d (NaN where the block holds inf or NaN: x - x is 0 in every lane otherwise) and
    d * sum(q) (the halves' sums core._quantize stores in xz, added)."""
    lanes = bd.fcmp_ordered("==", bd.fsub(v, v), splat_c(F32T, 0.0, G))
    finite = bd.icmp_unsigned("==", bd.bitcast(lanes, I32), ir.Constant(I32, -1))
    d = bd.select(finite, d, ir.Constant(F32T, math.nan))
    at = bd.add(row.srow, b)
    bd.store(d, bd.gep(row.s, [at]))
    halves = half_sums(bd, q)
    total = bd.add(bd.extract_element(halves, ir.Constant(I32, 0)), bd.extract_element(halves, ir.Constant(I32, 1)))
    bd.store(bd.fmul(d, bd.sitofp(total, F32T)), bd.gep(row.f, [at]))


class Q8_0:
    """llama.cpp's quantize_row_q8_0 (its AVX2 code): a scale per 32 elements."""

    @staticmethod
    def prepare(bd, row: QuantRow):
        pass

    @staticmethod
    def quantize(bd, row: QuantRow, b, k, v):
        amax = hmax(bd, call_intrinsic(bd, f"llvm.fabs.v{G}f32", vec(F32T, G), [v]))
        zero = bd.fcmp_ordered("==", amax, ir.Constant(F32T, 0.0))
        d = bd.fdiv(amax, ir.Constant(F32T, 127.0))
        d = bd.fpext(bd.fptrunc(d, ir.HalfType()), F32T)
        inv = bd.select(zero, ir.Constant(F32T, 0.0), bd.fdiv(ir.Constant(F32T, 127.0), amax))
        q = _rint(bd, v, inv)
        _store_q(bd, row, k, q)
        _finish(bd, row, b, v, q, d)
        return q


class Q8_K:
    """llama.cpp's quantize_row_q8_K (quantize_row_q8_K_ref on x86): a scale per 256 elements,
    found first for every 256-element block of the row (a last, shorter one too) and kept in its
    32-blocks' xs (d) and xf (iscale) until quantize overwrites them."""

    @staticmethod
    def prepare(bd, row: QuantRow):
        """Each super-block's max and the first x of that magnitude by 32-element vectors, in two passes
        over its 1 KB: llama.cpp's scan goes element by element (a select chain a value: two thirds of
        this kernel's time)."""
        vt = vec(F32T, G)
        n_super = bd.udiv(bd.add(row.K, c64(QK_K - 1)), c64(QK_K))
        block = lambda b: bd.load(bd.bitcast(bd.gep(row.x, [bd.mul(b, c64(G))]), vt.as_pointer()), align=4)  # noqa: E731
        with Loop(bd, 0, n_super) as s:
            b0 = bd.mul(s, c64(QK_K // G))
            b1 = bd.add(b0, c64(QK_K // G))
            b1 = bd.select(bd.icmp_signed("<", b1, row.nb), b1, row.nb)
            top = Var(bd, splat_c(F32T, 0.0, G))
            with Loop(bd, b0, b1) as b:  # maxnum: NaN loses, as it never passes the scan's ">"
                mag = call_intrinsic(bd, f"llvm.fabs.v{G}f32", vt, [block(b)])
                top.set(call_intrinsic(bd, f"llvm.maxnum.v{G}f32", vt, [top.get(), mag]))
            amax = hmax(bd, top.get())
            mx, found = Var(bd, amax), Var(bd, ir.Constant(ir.IntType(1), 0))
            with Loop(bd, b0, b1) as b:  # the sign of the first x with |x| = amax: its lowest bit
                v = block(b)
                pos, neg = (bd.bitcast(bd.fcmp_ordered("==", v, splat(bd, a, G)), I32) for a in (amax, bd.fneg(amax)))
                hit = bd.or_(pos, neg)
                low = bd.and_(hit, bd.neg(hit))
                is_pos = bd.icmp_unsigned("!=", bd.and_(low, pos), ir.Constant(I32, 0))
                take = bd.and_(bd.not_(found.get()), bd.icmp_unsigned("!=", hit, ir.Constant(I32, 0)))
                mx.set(bd.select(take, bd.select(is_pos, amax, bd.fneg(amax)), mx.get()))
                found.set(bd.or_(found.get(), take))
            zero = bd.fcmp_ordered("==", amax, ir.Constant(F32T, 0.0))
            iscale = bd.select(zero, ir.Constant(F32T, 0.0), bd.fdiv(ir.Constant(F32T, -127.0), mx.get()))
            d = bd.select(zero, ir.Constant(F32T, 0.0), bd.fdiv(ir.Constant(F32T, 1.0), iscale))
            with Loop(bd, b0, b1) as b:
                at = bd.add(row.srow, b)
                bd.store(d, bd.gep(row.s, [at]))
                bd.store(iscale, bd.gep(row.f, [at]))

    @staticmethod
    def quantize(bd, row: QuantRow, b, k, v):
        at = bd.add(row.srow, b)
        d, iscale = bd.load(bd.gep(row.s, [at])), bd.load(bd.gep(row.f, [at]))
        q = _rint(bd, v, iscale)
        q = bd.select(bd.icmp_signed(">", q, splat_c(I32, 127, G)), splat_c(I32, 127, G), q)
        _store_q(bd, row, k, q)
        _finish(bd, row, b, v, q, d)
        return q


BLOCKS = {"q8_0": Q8_0, "q8_k": Q8_K}


def pack_task(mod, name):
    """pack(t, xq, K, x8, stride): row t of the values (xq, K a multiple of 32) as the bytes x + 128
    by chunks of KC, chunk c's at x8 + c * stride + t * KC (kernels_prefill_q8.chunked's tiles)."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, xq_, K, x8_, stride = fn.args[:5]
    xq = bd.gep(ptr_to(bd, xq_, I16), [bd.mul(t, K)])
    with Loop(bd, 0, bd.udiv(K, c64(G))) as b:
        q = bd.load(bd.bitcast(bd.gep(xq, [bd.mul(b, c64(G))]), vec(I16, G).as_pointer()), align=2)
        c, j = bd.udiv(b, c64(KC // G)), bd.urem(b, c64(KC // G))
        at = bd.add(bd.add(bd.mul(c, stride), bd.mul(t, c64(KC))), bd.mul(j, c64(G)))
        dst = bd.inttoptr(bd.add(x8_, at), vec(I8, G).as_pointer())
        bd.store(bd.trunc(bd.add(q, splat_c(I16, 128, G)), vec(I8, G)), dst, align=1)
    bd.ret_void()


def module(isa: Isa) -> tuple[ir.Module, list[str]]:
    mod = ir.Module(name=f"fuel_quantize_q8_{isa.name}")
    names = [f"fuel_quantize_{k}_{isa.name}" for k in KINDS]
    for kind, name in zip(KINDS, names):
        _quantize(isa, mod, name, BLOCKS[kind], q8_decode_isa(isa) and not planes_isa(isa))
    pack_task(mod, f"fuel_pack_q8_{isa.name}")
    return mod, names + [f"fuel_pack_q8_{isa.name}"]


@lru_cache(maxsize=None)
def addresses(isa: Isa) -> dict:
    """{kind: address} of the q8 quantize kernels for one ISA and of the pack ("pack"), compiled or
    loaded once."""
    got = compile_module(MODULE, lambda: module(isa), isa)
    return dict(zip(KINDS + ("pack",), got.values()))
