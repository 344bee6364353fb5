"""Format-independent kernels as IR: activation quantisation, SwiGLU's gate, attention.

Every kernel is a task kernel `void f(i64 task, i64 a0, ..., i64 a10)` (TASK_ARGS arguments): numba
runs `n` of them in one parallel loop (matmul.run_tasks) or calls one directly.

  quantize(t, x, ldx, K, xq, xs, xf)       row t of x -> int16 per 32-block (matmul.py says why)
  silu_mul(t, gate, up, n)                 gate[t] <- silu(gate[t]) * up[t]
  attention(task, q, k, v, out, pos0, window, n_heads, n_kv, T)
      task = (t, head): causal softmax(q k^T / sqrt(hd)) v over the cache of one layer
      ([n_ctx, n_kv, hd] each). Keys go by blocks of L: L dot products reduced into one vector of
      L scores, a blocked online softmax (rescale once per block), then v rows weighted into hd/L
      vector accumulators. head_dim is a compile-time constant (one module per head size).
"""

from __future__ import annotations

import math
from functools import lru_cache

from llvmlite import ir

from .irgen import (F32T, G, I16, I32, I64, Loop, Var, c64, call_intrinsic, const, fmuladd, func, hmax, hsum,
                    ptr_to, splat, splat_c, transpose_sums, vec, vexp)
from .llvm import Isa, compile_module

TASK_ARGS = 12


def _quantize(isa, mod, name):
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, ldx, K, xq_, xs_, xf_ = fn.args[:7]
    x, xq, xs, xf = ptr_to(bd, x_, F32T), ptr_to(bd, xq_, I16), ptr_to(bd, xs_, F32T), ptr_to(bd, xf_, F32T)
    nb = bd.udiv(K, c64(G))
    xrow = bd.gep(x, [bd.mul(t, ldx)])
    qrow = bd.gep(xq, [bd.mul(t, K)])
    srow = bd.mul(t, nb)
    vt = vec(F32T, G)
    c = lambda v: splat_c(F32T, v, G)  # noqa: E731
    with Loop(bd, 0, nb) as b:
        v = bd.load(bd.bitcast(bd.gep(xrow, [bd.mul(b, c64(G))]), vt.as_pointer()), align=4)
        amax = hmax(bd, call_intrinsic(bd, f"llvm.fabs.v{G}f32", vt, [v]))
        zero = bd.fcmp_ordered("==", amax, ir.Constant(F32T, 0.0))
        scale = bd.fdiv(amax, ir.Constant(F32T, 32767.0))
        inv = bd.select(zero, ir.Constant(F32T, 0.0), bd.fdiv(ir.Constant(F32T, 32767.0), amax))
        magic = c(12582912.0)  # x + 1.5*2^23 - 1.5*2^23: round half to even, as np.rint
        r = bd.fsub(bd.fadd(bd.fmul(v, splat(bd, inv, G)), magic), magic)
        bd.store(bd.fptosi(r, vec(I16, G)), bd.bitcast(bd.gep(qrow, [bd.mul(b, c64(G))]), vec(I16, G).as_pointer()),
                 align=2)
        # a block with inf or NaN (its sum is not finite: maxnum skips NaN) gets a NaN scale, so
        # every product it enters is NaN instead of a finite guess
        total = hsum(bd, v)
        finite = bd.fcmp_ordered("==", bd.fsub(total, total), ir.Constant(F32T, 0.0))
        scale = bd.select(finite, bd.select(zero, ir.Constant(F32T, 0.0), scale), ir.Constant(F32T, math.nan))
        bd.store(scale, bd.gep(xs, [bd.add(srow, b)]))
        bd.store(total, bd.gep(xf, [bd.add(srow, b)]))
    bd.ret_void()


def _silu_mul(isa, mod, name):
    fn, bd = func(mod, name, TASK_ARGS)
    t, g_, u_, n = fn.args[:4]
    L = isa.lanes
    g, u = bd.gep(ptr_to(bd, g_, F32T), [bd.mul(t, n)]), bd.gep(ptr_to(bd, u_, F32T), [bd.mul(t, n)])

    def step(i, w):
        vt = vec(F32T, w)
        gp, up = bd.bitcast(bd.gep(g, [i]), vt.as_pointer()), bd.bitcast(bd.gep(u, [i]), vt.as_pointer())
        gv = bd.load(gp, align=4)
        e = vexp(bd, bd.fsub(splat_c(F32T, 0.0, w), gv))
        bd.store(bd.fmul(bd.fdiv(gv, bd.fadd(splat_c(F32T, 1.0, w), e)), bd.load(up, align=4)), gp, align=4)

    nv = bd.mul(bd.udiv(n, c64(L)), c64(L))
    with Loop(bd, 0, nv, L) as i:
        step(i, L)
    with Loop(bd, nv, n) as i:
        step(i, 1)
    bd.ret_void()


def _attention(isa, mod, name, hd):
    fn, bd = func(mod, name, TASK_ARGS)
    task, q_, k_, v_, out_, pos0, window, nh, nkv, T = fn.args[:10]
    L = isa.lanes
    ND = hd // L
    vt = vec(F32T, L)
    q, kc, vc, out = (ptr_to(bd, a, F32T) for a in (q_, k_, v_, out_))
    t, h = bd.udiv(task, nh), bd.urem(task, nh)
    kvh = bd.udiv(h, bd.udiv(nh, nkv))
    p = bd.add(pos0, t)
    from_window = bd.sub(bd.add(p, c64(1)), window)
    start = bd.select(bd.icmp_signed(">", window, c64(0)),
                      bd.select(bd.icmp_signed(">", from_window, c64(0)), from_window, c64(0)), c64(0))
    qrow = bd.gep(q, [bd.add(bd.mul(t, bd.mul(nh, c64(hd))), bd.mul(h, c64(hd)))])
    qv = [bd.load(bd.bitcast(bd.gep(qrow, [c64(c * L)]), vt.as_pointer()), align=4) for c in range(ND)]
    scale = splat_c(F32T, _f32(1.0 / math.sqrt(hd)), L)
    m = Var(bd, ir.Constant(F32T, -math.inf))
    lsum = Var(bd, ir.Constant(F32T, 0.0))
    acc = [Var(bd, splat_c(F32T, 0.0, L)) for _ in range(ND)]
    stride = bd.mul(nkv, c64(hd))  # floats between positions in the cache

    def row(base, j):
        jj = bd.select(bd.icmp_signed(">", j, p), p, j)  # lanes past p read row p, masked below
        return bd.gep(base, [bd.add(bd.mul(jj, stride), bd.mul(kvh, c64(hd)))])

    with Loop(bd, start, bd.add(p, c64(1)), L) as j0:
        parts = []
        for jj in range(L):
            kr = row(kc, bd.add(j0, c64(jj)))
            s = None
            for c in range(ND):
                kv = bd.load(bd.bitcast(bd.gep(kr, [c64(c * L)]), vt.as_pointer()), align=4)
                s = bd.fmul(qv[c], kv) if s is None else fmuladd(bd, qv[c], kv, s)
            parts.append(s)
        sc = bd.fmul(transpose_sums(bd, parts), scale)
        mask = bd.icmp_signed("<=", bd.add(splat(bd, j0, L), const(I64, range(L))), splat(bd, p, L))
        sc = bd.select(mask, sc, splat_c(F32T, -math.inf, L))
        m_new = call_intrinsic(bd, "llvm.maxnum.f32", F32T, [m.get(), hmax(bd, sc)])
        corr = bd.extract_element(vexp(bd, splat(bd, bd.fsub(m.get(), m_new), L)), ir.Constant(I32, 0))
        e = bd.select(mask, vexp(bd, bd.fsub(sc, splat(bd, m_new, L))), splat_c(F32T, 0.0, L))
        lsum.set(fmuladd(bd, lsum.get(), corr, hsum(bd, e)))
        a = [bd.fmul(acc[c].get(), splat(bd, corr, L)) for c in range(ND)]
        for jj in range(L):
            vr = row(vc, bd.add(j0, c64(jj)))
            ej = splat(bd, bd.extract_element(e, ir.Constant(I32, jj)), L)
            for c in range(ND):
                a[c] = fmuladd(bd, ej, bd.load(bd.bitcast(bd.gep(vr, [c64(c * L)]), vt.as_pointer()), align=4), a[c])
        for c in range(ND):
            acc[c].set(a[c])
        m.set(m_new)
    inv = splat(bd, bd.fdiv(ir.Constant(F32T, 1.0), lsum.get()), L)
    orow = bd.gep(out, [bd.add(bd.mul(t, bd.mul(nh, c64(hd))), bd.mul(h, c64(hd)))])
    for c in range(ND):
        bd.store(bd.fmul(acc[c].get(), inv), bd.bitcast(bd.gep(orow, [c64(c * L)]), vt.as_pointer()), align=4)
    bd.ret_void()


def _f32(x: float) -> float:
    import numpy as np

    return float(np.float32(x))


def attention_lanes(isa: Isa, head_dim: int) -> int:
    """The widest vector (a power of two, at most the ISA's) that divides head_dim."""
    lanes = isa.lanes
    while head_dim % lanes:
        lanes //= 2
    return lanes


@lru_cache(maxsize=None)
def addresses(isa: Isa, head_dim: int) -> tuple[int, int, int]:
    """(quantize, silu_mul, attention) for one ISA and head size, compiled or loaded once."""
    mod = ir.Module(name=f"fuel_core_{isa.name}_hd{head_dim}")
    names = [f"fuel_{k}_{isa.name}_hd{head_dim}" for k in ("quantize", "silu_mul", "attention")]
    _quantize(isa, mod, names[0])
    _silu_mul(isa, mod, names[1])
    _attention(isa._replace(lanes=attention_lanes(isa, head_dim)), mod, names[2], head_dim)
    got = compile_module(mod, isa, names)
    return tuple(got[n] for n in names)
