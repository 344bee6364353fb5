"""Format-independent kernels as IR: activation quantisation, norms, RoPE, SwiGLU's gate, attention.

Every kernel is a task kernel `void f(i64 task, i64 a0, ..., i64 a10)` (TASK_ARGS arguments): numba
runs `n` of them in one parallel loop (matmul.run_tasks) or calls one directly.

  quantize(t, x, ldx, K, xq, xs, xf, xp, xz, n_dec)   row t of x -> int16 per 32-block (matmul.py
                                           says why) and its 16-element sums; t < n_dec: also the
                                           layout the decode kernels read (int8 planes or int16 words)
  silu_mul(t, gate, up, n, limit, alpha)   gate[t] <- silu(gate[t]) * up[t]; limit != 0: gpt-oss's
                                           clamped SwiGLU (_glu)
  gelu_mul(t, gate, up, n)                 gate[t] <- gelu_tanh(gate[t]) * up[t]
  rmsnorm(t, x, y, w, out, n, eps)         x[t] += y[t] (the residual), out[t] = RMSNorm(x[t]) * w
  rope(t, x, bias, norm, nh, hd, pos0, cos, sin, eps, scale)   + bias, per-head RMSNorm, rotate-half
                                           RoPE, times an attention scale
  kv_store(t, k, v, kc, vc, pos0, n)       K and V rows into the cache (K in KEY_BLOCK blocks), f32 or
                                           rounded to f16 (module(cache=...): --cache-type)
  batch(task, desc, n)                     several task kernels in one parallel loop
  interleave(task, desc, n)                n task kernels of as many tasks, their tasks in turn
  attention(task, q, k, v, out, pos0, window, n_heads, n_kv, T, splits, part)   attention.py
  combine(task, part, out, splits, rows)   attention.py: a decode step's key runs into its output
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from llvmlite import ir

from .irgen import (F32T, G, I8, I16, I32, I64, Loop, Var, c64, call_intrinsic, const, fmuladd, func, hmax, in_steps,
                    half_sums, hsum, ptr_to, splat, splat_c, vec, vexp)
from .attention import KEY_BLOCK, attention, combine
from .llvm import Isa, compile_module, planes_isa
from .unpack import PLANES_KBLOCK as KB

TASK_ARGS = 12


# The int16 activations are at most Q_MAX = 127 * 256 + 127 in magnitude, so that each is exactly
# 256 * hi + lo with hi and lo both int8: the planes that vpdpbusd (u8 weights x s8 activations)
# reads (kernels_decode.py: the planes decode kernels).
Q_MAX = 32639.0


def _quantize(isa, mod, name, block=None, low_planes=False):
    """Row t -> xq = rint(x * Q_MAX / amax) per 32-block, xs = amax / Q_MAX, xf = the block's f32
    sum, and at xz + t * K/16, xz[j] = the sum of xq over elements 16j..16j+15 (exact in f32: below
    2^20), for the zero points of the formats whose stored q is offset and the mins per 16 elements
    (emit.CpuFormat.min_sub16, in prefill too). Rows t < n_dec (tokens that run the decode kernels)
    also get the layout those read, in xp + t * (4K + 64): on an ISA with the int8 planes
    (llvm.planes_isa), xp[k] = hi, xp[K + k] = lo with xq = 256 * hi + lo (hi = (xq + 128) >> 8),
    both planes again from xp[2K] in the K-quants' layout for each full block of theirs
    (unpack.PLANES_KBLOCK); elsewhere xp holds xq as int16 words, each 32-block's even elements and
    then its odd ones (the words kernels).

    `block`: another quantisation of the blocks (quantize_q8.py: 8-bit values and their scales)
    into the same buffers and layouts; with `low_planes` (8-bit values on a words ISA), the words
    are followed by the low plane alone, plain from xp[2K] and on the K-quant layout from xp[3K]."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, ldx, K, xq_, xs_, xf_, xp_, xz_, n_dec = fn.args[:10]
    x, xq, xs, xf = ptr_to(bd, x_, F32T), ptr_to(bd, xq_, I16), ptr_to(bd, xs_, F32T), ptr_to(bd, xf_, F32T)
    xp = bd.gep(ptr_to(bd, xp_, I8), [bd.mul(t, bd.add(bd.mul(K, c64(4)), c64(64)))])
    xz = bd.gep(ptr_to(bd, xz_, F32T), [bd.mul(t, bd.udiv(K, c64(16)))])
    one_token = bd.icmp_signed("<", t, n_dec)
    nb = bd.udiv(K, c64(G))
    xrow = bd.gep(x, [bd.mul(t, ldx)])
    qrow = bd.gep(xq, [bd.mul(t, K)])
    srow = bd.mul(t, nb)
    row = QuantRow(xrow, qrow, xs, xf, srow, K, nb)
    if block is not None:
        block.prepare(bd, row)
    vt = vec(F32T, G)
    with Loop(bd, 0, nb) as b:
        k = bd.mul(b, c64(G))
        v = bd.load(bd.bitcast(bd.gep(xrow, [k]), vt.as_pointer()), align=4)
        q = (block.quantize if block is not None else _int16_block)(bd, row, b, k, v)
        _decode_layouts(isa, bd, q, k, K, xp, one_token, low_planes)
        sums = bd.sitofp(half_sums(bd, q), vec(F32T, 2))
        bd.store(sums, bd.bitcast(bd.gep(xz, [bd.mul(b, c64(2))]), vec(F32T, 2).as_pointer()), align=4)
    bd.ret_void()


class QuantRow(NamedTuple):
    """One row of a quantize kernel: its f32 input and int16 values (at the row's start), the block
    scales and block sums (block b of the row at srow + b), K and its 32-element blocks."""

    x: ir.Value
    q: ir.Value
    s: ir.Value
    f: ir.Value
    srow: ir.Value
    K: ir.Value
    nb: ir.Value


def _int16_block(bd, row, b, k, v):
    """Block b (its values v at element k): rint(v * Q_MAX / amax) into row.q, amax / Q_MAX into row.s,
    the f32 sum into row.f; returns the values (<32 x i32>)."""
    c = lambda v: splat_c(F32T, v, G)  # noqa: E731
    vt = vec(F32T, G)
    amax = hmax(bd, call_intrinsic(bd, f"llvm.fabs.v{G}f32", vt, [v]))
    zero = bd.fcmp_ordered("==", amax, ir.Constant(F32T, 0.0))
    scale = bd.fdiv(amax, ir.Constant(F32T, Q_MAX))
    inv = bd.select(zero, ir.Constant(F32T, 0.0), bd.fdiv(ir.Constant(F32T, Q_MAX), amax))
    magic = c(12582912.0)  # x + 1.5*2^23 - 1.5*2^23: round half to even, as np.rint
    r = bd.fsub(bd.fadd(bd.fmul(v, splat(bd, inv, G)), magic), magic)
    q = bd.fptosi(r, vec(I32, G))
    bd.store(bd.trunc(q, vec(I16, G)), bd.bitcast(bd.gep(row.q, [k]), vec(I16, G).as_pointer()), align=2)
    # a block with inf or NaN (its sum is not finite: maxnum skips NaN) gets a NaN scale, so
    # every product it enters is NaN instead of a finite guess
    total = hsum(bd, v)
    finite = bd.fcmp_ordered("==", bd.fsub(total, total), ir.Constant(F32T, 0.0))
    scale = bd.select(finite, bd.select(zero, ir.Constant(F32T, 0.0), scale), ir.Constant(F32T, math.nan))
    bd.store(scale, bd.gep(row.s, [bd.add(row.srow, b)]))
    bd.store(total, bd.gep(row.f, [bd.add(row.srow, b)]))
    return q


def _decode_layouts(isa, bd, q, k, K, xp, one_token, low_planes=False):
    """A one-token row's block of values q (<32 x i32>, at element k) into the layout its decode
    kernels read (_quantize says which)."""
    with bd.if_then(one_token):
        if planes_isa(isa) or low_planes:
            hi = bd.ashr(bd.add(q, splat_c(I32, 128, G)), splat_c(I32, 8, G))
            lo = bd.sub(q, bd.shl(hi, splat_c(I32, 8, G)))
            # low_planes: |q| <= 127, so hi is 0 and lo is q
            planes = ((lo, bd.add(bd.mul(K, c64(2)), k)),) if low_planes else ((hi, k), (lo, bd.add(K, k)))
            for plane, off in planes:
                bd.store(bd.trunc(plane, vec(I8, G)), bd.bitcast(bd.gep(xp, [off]), vec(I8, G).as_pointer()), align=1)
            # then both planes again in the K-quants' layout (unpack.PLANES_KBLOCK elements a
            # block): unit u, lane i of a block holds its elements 16i + 4u .. 16i + 4u + 3;
            # every full block of K (a 32-element format's last K % KB run the plain planes)
            with bd.if_then(bd.icmp_unsigned("<", k, bd.sub(K, bd.urem(K, c64(KB))))):
                blk0 = bd.sub(k, bd.urem(k, c64(KB)))
                row0 = bd.udiv(bd.urem(k, c64(KB)), c64(16))  # this 32-block's first row of 16
                for p, plane in enumerate((hi, lo)):
                    if low_planes and p == 0:
                        continue
                    pieces = bd.bitcast(bd.trunc(plane, vec(I8, G)), vec(I32, G // 4))
                    base = bd.add(bd.mul(K, c64(2 + p)), blk0)
                    for j in range(G // 4):  # piece j: row row0 + j // 4, unit j % 4
                        at = bd.add(base, bd.add(c64(64 * (j % 4)), bd.mul(bd.add(row0, c64(j // 4)), c64(4))))
                        bd.store(bd.extract_element(pieces, ir.Constant(I32, j)),
                                 bd.bitcast(bd.gep(xp, [at]), I32.as_pointer()), align=1)
        if not planes_isa(isa):
            words = bd.shuffle_vector(q, q, const(I32, [*range(0, G, 2), *range(1, G, 2)]))
            dst = bd.gep(bd.bitcast(xp, I16.as_pointer()), [k])
            bd.store(bd.trunc(words, vec(I16, G)), bd.bitcast(dst, vec(I16, G).as_pointer()), align=2)


def _glu(isa, mod, name, act):
    """glu(t, gate, up, n): gate[t] <- act(gate[t]) * up[t]; act silu: g / (1 + e^-g), gelu_tanh:
    g / (1 + e^-2y) with y = sqrt(2/pi) (g + 0.044715 g^3) (that is 0.5 g (1 + tanh y), exactly).
    silu's kernel also takes (limit, alpha) as f32 bits: limit != 0 makes it gpt-oss's clamped
    SwiGLU, g = min(gate, limit), u = clip(up, ±limit), gate <- (u + 1) · g / (1 + e^(-alpha g))."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, g_, u_, n, limit_bits, alpha_bits = fn.args[:6]
    L = isa.lanes
    g, u = bd.gep(ptr_to(bd, g_, F32T), [bd.mul(t, n)]), bd.gep(ptr_to(bd, u_, F32T), [bd.mul(t, n)])

    def step(i, w, clamped):
        vt = vec(F32T, w)
        gp, up = bd.bitcast(bd.gep(g, [i]), vt.as_pointer()), bd.bitcast(bd.gep(u, [i]), vt.as_pointer())
        gv, uv = bd.load(gp, align=4), bd.load(up, align=4)
        if clamped:  # a NaN passes both clamps (torch's clamp and min propagate it)
            lim = splat(bd, _eps(bd, limit_bits), w)
            gv = bd.select(bd.fcmp_ordered(">", gv, lim), lim, gv)
            uv = bd.select(bd.fcmp_ordered(">", uv, lim), lim, uv)
            neg = bd.fsub(splat_c(F32T, 0.0, w), lim)
            uv = bd.fadd(bd.select(bd.fcmp_ordered("<", uv, neg), neg, uv), splat_c(F32T, 1.0, w))
            arg = bd.fmul(gv, splat(bd, _eps(bd, alpha_bits), w))
        elif act == "silu":
            arg = gv
        else:
            cube = bd.fmul(bd.fmul(gv, gv), gv)
            inner = fmuladd(bd, cube, splat_c(F32T, 0.044715, w), gv)
            arg = bd.fmul(inner, splat_c(F32T, 2 * math.sqrt(2 / math.pi), w))
        e = vexp(bd, bd.fsub(splat_c(F32T, 0.0, w), arg))
        bd.store(bd.fmul(bd.fdiv(gv, bd.fadd(splat_c(F32T, 1.0, w), e)), uv), gp, align=4)

    def loops(clamped):
        nv = bd.mul(bd.udiv(n, c64(L)), c64(L))
        with Loop(bd, 0, nv, L) as i:
            step(i, L, clamped)
        with Loop(bd, nv, n) as i:
            step(i, 1, clamped)

    if act == "silu":
        with bd.if_else(bd.icmp_signed("!=", limit_bits, c64(0))) as (clamp, plain):
            with clamp:
                loops(True)
            with plain:
                loops(False)
    else:
        loops(False)
    bd.ret_void()


def _vload(bd, p, i, w):
    return bd.load(bd.bitcast(bd.gep(p, [i]), vec(F32T, w).as_pointer()), align=4)


def _vstore(bd, v, p, i):
    bd.store(v, bd.bitcast(bd.gep(p, [i]), v.type.as_pointer()), align=4)


def _sum_squares(bd, x, n, L):
    acc = Var(bd, splat_c(F32T, 0.0, L))
    tail = Var(bd, ir.Constant(F32T, 0.0))

    def step(i, w):
        v = _vload(bd, x, i, w)
        if w == L:
            acc.set(fmuladd(bd, v, v, acc.get()))
        else:
            e = bd.extract_element(v, ir.Constant(I32, 0))
            tail.set(fmuladd(bd, e, e, tail.get()))

    in_steps(bd, n, L, step)
    return bd.fadd(hsum(bd, acc.get()), tail.get())


def _inv_rms(bd, ss, n, eps):
    """1 / sqrt(ss / n + eps), f32."""
    mean = bd.fdiv(ss, bd.uitofp(n, F32T))
    root = call_intrinsic(bd, "llvm.sqrt.f32", F32T, [bd.fadd(mean, eps)])
    return bd.fdiv(ir.Constant(F32T, 1.0), root)


def _eps(bd, bits):
    return bd.bitcast(bd.trunc(bits, I32), F32T)


def _rmsnorm(isa, mod, name):
    """rmsnorm(t, x, y, w, out, n, eps): x[t] += y[t] (y != 0: the residual add), then
    out[t] = w * (x[t] / rms(x[t])); eps as f32 bits."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, y_, w_, out_, n, eps_bits = fn.args[:7]
    L = isa.lanes
    x = bd.gep(ptr_to(bd, x_, F32T), [bd.mul(t, n)])
    out = bd.gep(ptr_to(bd, out_, F32T), [bd.mul(t, n)])
    w = ptr_to(bd, w_, F32T)
    with bd.if_then(bd.icmp_signed("!=", y_, c64(0))):
        y = bd.gep(ptr_to(bd, y_, F32T), [bd.mul(t, n)])
        in_steps(bd, n, L, lambda i, k: _vstore(bd, bd.fadd(_vload(bd, x, i, k), _vload(bd, y, i, k)), x, i))
    inv = _inv_rms(bd, _sum_squares(bd, x, n, L), n, _eps(bd, eps_bits))
    in_steps(bd, n, L, lambda i, k: _vstore(
        bd, bd.fmul(_vload(bd, w, i, k), bd.fmul(_vload(bd, x, i, k), splat(bd, inv, k))), out, i))
    bd.ret_void()


def _rope(isa, mod, name):
    """rope(t, x, bias, norm, n_heads, hd, pos0, cos, sin, eps, scale): on row t of x [T, n_heads*hd]:
    + bias (bias != 0), RMSNorm over each head's hd with weight `norm` (norm != 0: QK-norm), then
    rotate-half RoPE at position pos0 + t (cos/sin: [n_ctx, hd/2]; cos = 0: a layer without RoPE),
    then times `scale` (f32 bits; 0: none: an attention scale folded into q). hd = 0: x is one flat
    vector of n_heads values (a bias add only)."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, b_, nw_, nh, hd, pos0, cos_, sin_, eps_bits, scale_bits = fn.args[:11]
    L = isa.lanes
    hd_ = bd.select(bd.icmp_signed("==", hd, c64(0)), c64(1), hd)
    n = bd.mul(nh, hd_)
    x = bd.gep(ptr_to(bd, x_, F32T), [bd.mul(t, n)])
    with bd.if_then(bd.icmp_signed("!=", b_, c64(0))):
        b = ptr_to(bd, b_, F32T)
        in_steps(bd, n, L, lambda i, k: _vstore(bd, bd.fadd(_vload(bd, x, i, k), _vload(bd, b, i, k)), x, i))
    with bd.if_then(bd.icmp_signed("!=", nw_, c64(0))):
        nw = ptr_to(bd, nw_, F32T)
        with Loop(bd, 0, nh) as h:
            xh = bd.gep(x, [bd.mul(h, hd)])
            inv = _inv_rms(bd, _sum_squares(bd, xh, hd, L), hd, _eps(bd, eps_bits))
            in_steps(bd, hd, L, lambda i, k: _vstore(
                bd, bd.fmul(_vload(bd, nw, i, k), bd.fmul(_vload(bd, xh, i, k), splat(bd, inv, k))), xh, i))
    rotate = bd.and_(bd.icmp_signed("!=", hd, c64(0)), bd.icmp_signed("!=", cos_, c64(0)))
    with bd.if_then(rotate):
        half = bd.udiv(hd, c64(2))
        p = bd.add(pos0, t)
        cs = bd.gep(ptr_to(bd, cos_, F32T), [bd.mul(p, half)])
        sn = bd.gep(ptr_to(bd, sin_, F32T), [bd.mul(p, half)])
        with Loop(bd, 0, nh) as h:
            lo = bd.gep(x, [bd.mul(h, hd)])
            hi = bd.gep(lo, [half])

            def step(i, k):
                a, b2 = _vload(bd, lo, i, k), _vload(bd, hi, i, k)
                c, s2 = _vload(bd, cs, i, k), _vload(bd, sn, i, k)
                _vstore(bd, bd.fsub(bd.fmul(a, c), bd.fmul(b2, s2)), lo, i)
                _vstore(bd, bd.fadd(bd.fmul(b2, c), bd.fmul(a, s2)), hi, i)

            in_steps(bd, half, L, step)
    with bd.if_then(bd.icmp_signed("!=", scale_bits, c64(0))):
        scale = _eps(bd, scale_bits)
        in_steps(bd, n, L, lambda i, k: _vstore(bd, bd.fmul(_vload(bd, x, i, k), splat(bd, scale, k)), x, i))
    bd.ret_void()


def _kv_store(isa, mod, name, E):
    """kv_store(t, k, v, kc, vc, pos0, n): rows t of k and v (n = n_kv * hd floats) to cache position
    p = pos0 + t as E values (float, or half rounded to nearest even): V row-major, K into lane
    p % KEY_BLOCK of block p // KEY_BLOCK ([n, KEY_BLOCK])."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, k_, v_, kc_, vc_, pos0, n = fn.args[:7]
    L = isa.lanes

    def cast(v):
        return v if E == F32T else bd.fptrunc(v, vec(E, v.type.count) if isinstance(v.type, ir.VectorType) else E)

    p = bd.add(pos0, t)
    src = bd.gep(ptr_to(bd, v_, F32T), [bd.mul(t, n)])
    cache = bd.gep(ptr_to(bd, vc_, E), [bd.mul(p, n)])
    in_steps(bd, n, L, lambda i, k: bd.store(cast(_vload(bd, src, i, k)),
                                             bd.bitcast(bd.gep(cache, [i]), vec(E, k).as_pointer()),
                                             align=4 if E == F32T else 2))
    B = c64(KEY_BLOCK)
    src = bd.gep(ptr_to(bd, k_, F32T), [bd.mul(t, n)])
    cache = bd.gep(ptr_to(bd, kc_, E), [bd.add(bd.mul(bd.mul(bd.udiv(p, B), n), B), bd.urem(p, B))])
    with Loop(bd, 0, n) as i:
        bd.store(cast(bd.load(bd.gep(src, [i]))), bd.gep(cache, [bd.mul(i, B)]))
    bd.ret_void()


def _batch(isa, mod, name):
    """batch(task, desc, n): one parallel loop over several task kernels. desc is int64 [n, 13]:
    (kernel address, its number of tasks, its 11 arguments); task i runs row r's kernel with the
    task index i minus the tasks of the rows before r."""
    fn, bd = func(mod, name, TASK_ARGS)
    task, desc_, n = fn.args[:3]
    desc = ptr_to(bd, desc_, I64)
    kty = ir.FunctionType(ir.VoidType(), [I64] * TASK_ARGS).as_pointer()
    done = fn.append_basic_block("done")
    rem = Var(bd, task)
    with Loop(bd, 0, n) as r:
        row = bd.gep(desc, [bd.mul(r, c64(TASK_ARGS + 1))])
        fields = [bd.load(bd.gep(row, [c64(i)])) for i in range(TASK_ARGS + 1)]
        cur = rem.get()
        call, skip = fn.append_basic_block("call"), fn.append_basic_block("skip")
        bd.cbranch(bd.icmp_signed("<", cur, fields[1]), call, skip)
        bd.position_at_end(call)
        bd.call(bd.inttoptr(fields[0], kty), [cur] + fields[2:])
        bd.branch(done)
        bd.position_at_end(skip)
        rem.set(bd.sub(cur, fields[1]))
    bd.branch(done)
    bd.position_at_end(done)
    bd.ret_void()


def _interleave(isa, mod, name):
    """interleave(task, desc, n): the tasks of n task kernels with as many tasks each (desc as
    batch's), taken in turn: task i runs row i % n's kernel with task index i // n. One matrix's
    decode kernels for n tokens or groups of tokens (matmul.describe_product): a thread's run of
    tasks reads a group of weight rows once from memory and for the other kernels from its cache."""
    fn, bd = func(mod, name, TASK_ARGS)
    task, desc_, n = fn.args[:3]
    desc = ptr_to(bd, desc_, I64)
    kty = ir.FunctionType(ir.VoidType(), [I64] * TASK_ARGS).as_pointer()
    row = bd.gep(desc, [bd.mul(bd.urem(task, n), c64(TASK_ARGS + 1))])
    fields = [bd.load(bd.gep(row, [c64(i)])) for i in range(TASK_ARGS + 1)]
    bd.call(bd.inttoptr(fields[0], kty), [bd.udiv(task, n)] + fields[2:])
    bd.ret_void()


CORE = ("quantize", "silu_mul", "attention", "rmsnorm", "rope", "kv_store", "batch", "combine", "gelu_mul",
        "interleave")


CACHE_ELEMENTS = {"f32": F32T, "f16": ir.HalfType()}  # the KV cache's element type (kv_cache.CACHE_TYPES)


def module(isa: Isa, head_dim: int, cache: str = "f32") -> tuple[ir.Module, list[str]]:
    """The CORE kernels; kv_store and attention for a KV cache of `cache` values."""
    tag = f"{isa.name}_hd{head_dim}" + ("" if cache == "f32" else f"_{cache}")
    mod = ir.Module(name=f"fuel_core_{tag}")
    names = [f"fuel_{k}_{tag}" for k in CORE]
    E = CACHE_ELEMENTS[cache]
    _quantize(isa, mod, names[0])
    _glu(isa, mod, names[1], "silu")
    attention(mod, names[2], head_dim, TASK_ARGS, isa.lanes, E)
    _rmsnorm(isa, mod, names[3])
    _rope(isa, mod, names[4])
    _kv_store(isa, mod, names[5], E)
    _batch(isa, mod, names[6])
    combine(mod, names[7], head_dim, TASK_ARGS)
    _glu(isa, mod, names[8], "gelu_tanh")
    _interleave(isa, mod, names[9])
    return mod, names


def module_name(head_dim: int, cache: str = "f32") -> str:
    return f"core-hd{head_dim}" + ("" if cache == "f32" else f"-{cache}")


@lru_cache(maxsize=None)
def addresses(isa: Isa, head_dim: int, cache: str = "f32") -> tuple:
    """The CORE kernels' addresses for one ISA, head size and KV cache type, compiled or loaded once."""
    got = compile_module(module_name(head_dim, cache), lambda: module(isa, head_dim, cache), isa)
    return tuple(got.values())
