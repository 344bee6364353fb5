"""IR building blocks for the kernels: loops, mutable values, vectors, the integer dot of each ISA.

Everything here emits llvmlite IR into the builder it is given; nothing is compiled here.
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import ACTIVATION_BLOCK
from .llvm import Isa

G = ACTIVATION_BLOCK  # elements per group (one activation block)
I8, I16, I32, I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
F32T = ir.FloatType()


def vec(t, n):
    return ir.VectorType(t, n)


def c64(v):
    return ir.Constant(I64, v)


def const(t, vals):
    return ir.Constant(vec(t, len(vals)), list(vals))


def splat(bd, val, n):
    vt = vec(val.type, n)
    v = bd.insert_element(ir.Constant(vt, ir.Undefined), val, ir.Constant(I32, 0))
    return bd.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(vec(I32, n), [0] * n))


def splat_c(t, v, n):
    return ir.Constant(vec(t, n), [v] * n)


def gep(bd, ptr, off):
    return bd.gep(ptr, [off if isinstance(off, ir.Value) else c64(off)])


def load(bd, ptr, off, ty, align=1):
    """Unaligned load of `ty` at element offset `off` of `ptr`."""
    return bd.load(bd.bitcast(gep(bd, ptr, off), ty.as_pointer()), align=align)


# ------------------------------------------------------------------ IR scaffolding


class Loop:
    """for i in range(start, stop, step) with i an i64 phi; `with Loop(bd, a, b) as i: ...`."""

    def __init__(self, bd, start, stop, step=1):
        self.bd, self.start, self.stop, self.step = bd, as_i64(start), as_i64(stop), step

    def __enter__(self):
        bd = self.bd
        self.pre = bd.block
        fn = bd.function
        self.head = fn.append_basic_block("loop")
        self.body = fn.append_basic_block("body")
        self.exit = fn.append_basic_block("endloop")
        bd.branch(self.head)
        bd.position_at_end(self.head)
        self.i = bd.phi(I64)
        self.i.add_incoming(self.start, self.pre)
        bd.cbranch(bd.icmp_signed("<", self.i, self.stop), self.body, self.exit)
        bd.position_at_end(self.body)
        return self.i

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        bd = self.bd
        nxt = bd.add(self.i, c64(self.step))
        self.i.add_incoming(nxt, bd.block)
        bd.branch(self.head)
        bd.position_at_end(self.exit)
        return False


def as_i64(x):
    return x if isinstance(x, ir.Value) else c64(x)


class Var:
    """A mutable value (an alloca; LLVM promotes it to registers)."""

    def __init__(self, bd, init):
        with bd.goto_entry_block():
            self.p = bd.alloca(init.type)
        bd.store(init, self.p)
        self.bd = bd

    def get(self):
        return self.bd.load(self.p)

    def set(self, v):
        self.bd.store(v, self.p)


def ptr_to(bd, arg, ty):
    return bd.inttoptr(arg, ty.as_pointer())


def call_intrinsic(bd, name, ret, args):
    mod = bd.module
    fn = mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), name)
    return bd.call(fn, args)


def prefetch(bd, p, locality=3):
    """Ask for the cache line at p (an i8 pointer) ahead of its use, for reading: locality 3 into
    every level (prefetcht0), 2 into L2 and below (prefetcht1)."""
    call_intrinsic(bd, "llvm.prefetch.p0", ir.VoidType(), [p, ir.Constant(I32, 0), ir.Constant(I32, locality),
                                                           ir.Constant(I32, 1)])


def gather(bd, table, idx):
    """<n x T>: table[idx[j]] in lane j (table: a global array of T, idx: <n x i32>), by
    llvm.masked.gather: LLVM makes it vpgather where the CPU's gathers are fast (AVX-512) and
    scalar loads where they are not."""
    n, ety = idx.type.count, table.type.pointee.element
    ptrs = bd.gep(table, [ir.Constant(I32, 0), idx], source_etype=table.type.pointee)
    ptrs.type = vec(ety.as_pointer(), n)  # a vector GEP (llvmlite types it as one pointer)
    return call_intrinsic(bd, f"llvm.masked.gather.v{n}i{ety.width}.v{n}p0", vec(ety, n),
                          [ptrs, ir.Constant(I32, ety.width // 8), splat_c(ir.IntType(1), 1, n),
                           ir.Constant(vec(ety, n), ir.Undefined)])


def transpose(bd, rows):
    """n <n x i32> rows (n a power of two) -> their transpose: swap the off-diagonal b x b blocks,
    b = n/2, ..., 2, 1 (n log n shuffles instead of n^2 element moves)."""
    v, n = list(rows), len(rows)
    b = n // 2
    while b:
        for i in range(n):
            if i & b:
                continue
            j = i + b
            lo = [c if c & b == 0 else n + c - b for c in range(n)]
            hi = [c + b if c & b == 0 else n + c for c in range(n)]
            v[i], v[j] = bd.shuffle_vector(v[i], v[j], const(I32, lo)), bd.shuffle_vector(v[i], v[j], const(I32, hi))
        b //= 2
    return v


def in_steps(bd, n, w, body):
    """body(i, w) for i = 0, w, 2w, ... while a whole step fits in n, then body(i, 1) for each of the
    last n % w: vectors of w lanes then single lanes, or groups of w rows then single rows."""
    whole = bd.mul(bd.udiv(n, c64(w)), c64(w))
    with Loop(bd, 0, whole, w) as i:
        body(i, w)
    with Loop(bd, whole, n) as i:
        body(i, 1)


def fmuladd(bd, a, b, c):
    return call_intrinsic(bd, f"llvm.fmuladd.v{a.type.count}f32" if isinstance(a.type, ir.VectorType)
                      else "llvm.fmuladd.f32", a.type, [a, b, c])


def hsum(bd, v):
    """The sum of a vector's lanes (float or integer), a tree of shuffles and adds."""
    add = bd.add if isinstance(v.type.element, ir.IntType) else bd.fadd
    n = v.type.count
    while n > 1:
        n //= 2
        v = add(bd.shuffle_vector(v, v, const(I32, range(n))), bd.shuffle_vector(v, v, const(I32, range(n, 2 * n))))
    return bd.extract_element(v, ir.Constant(I32, 0))


def half_sums(bd, v):
    """<2 x T>: the sums of a vector's first and second halves, one tree of shuffles and adds for
    both (the same IR twice is one after LLVM's CSE)."""
    n = v.type.count
    while n > 2:
        h, q = n // 2, n // 4
        pick = lambda o: const(I32, [a * h + o + j for a in (0, 1) for j in range(q)])  # noqa: E731
        v = (bd.add if isinstance(v.type.element, ir.IntType) else bd.fadd)(
            bd.shuffle_vector(v, v, pick(0)), bd.shuffle_vector(v, v, pick(q)))
        n = h
    return v


def hmax(bd, v):
    """The largest lane of a float vector (maxnum: a NaN lane loses to a number)."""
    n = v.type.count
    while n > 1:
        n //= 2
        a, b = bd.shuffle_vector(v, v, const(I32, range(n))), bd.shuffle_vector(v, v, const(I32, range(n, 2 * n)))
        v = call_intrinsic(bd, f"llvm.maxnum.v{n}f32", vec(F32T, n), [a, b])
    return bd.extract_element(v, ir.Constant(I32, 0))


_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def fmax(bd, a, b):
    """max(a, b) lane by lane, a when unordered: one vmaxps (llvm.maxnum costs two more ops on x86,
    to make a NaN lose)."""
    return bd.select(bd.fcmp_ordered("<", a, b), b, a)


def hmax_rows(bd, vs):
    """The largest lane of each float vector in vs by fmax (with a NaN lane: NaN or a number), as one
    vector of len(vs) lanes. A row's tree fmaxes its lanes' halves, then the halves' halves, as one
    vector's would; the rows' trees share their shuffles: a level takes pairs of vectors and keeps
    both vectors' rows in one (8 rows of 16: 21 shuffles and maxima where a tree a row takes 64)."""
    k, n = len(vs), vs[0].type.count
    rows = 1 << (k - 1).bit_length()
    assert n % rows == 0 and all(v.type.count == n for v in vs)
    vs = list(vs) + [vs[-1]] * (rows - k)  # padding rows, dropped at the end
    w = n  # lanes a row has in each vector; rows keep their order

    def halves(a, b, g):  # a's g rows then b's (b=None: a's again), each the fmax of its halves
        lo = [r * w + j for r in range(g) for j in range(w // 2)]
        lo += [x + n for x in lo] if b is not None else lo
        b = a if b is None else b
        return fmax(bd, bd.shuffle_vector(a, b, const(I32, lo)),
                    bd.shuffle_vector(a, b, const(I32, [x + w // 2 for x in lo])))

    while len(vs) > 1:
        vs, w = [halves(a, b, n // w) for a, b in zip(vs[0::2], vs[1::2])], w // 2
    v = vs[0]
    while w > 1:  # one vector of rows * w lanes: halve each row's lanes, the upper half of v unused
        v, w = halves(v, None, rows), w // 2
    return bd.shuffle_vector(v, v, const(I32, range(k)))


def vexp(bd, x):
    """exp of a float vector or a float (Cephes expf: within 2 ulp; inputs clamped to [-87.3, 88.4], a
    NaN stays NaN). 2^k comes from the bits of the rounded k + 1.5 * 2^23 (no fptosi: NaN is poison
    there)."""
    n = x.type.count if isinstance(x.type, ir.VectorType) else 0
    c = (lambda v: splat_c(F32T, v, n)) if n else (lambda v: ir.Constant(F32T, v))
    ci = (lambda v: splat_c(I32, v, n)) if n else (lambda v: ir.Constant(I32, v))
    x = fmax(bd, bd.select(bd.fcmp_ordered(">", x, c(88.3762626647949)), c(88.3762626647949), x), c(-87.33654475))
    magic = c(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
    kb = bd.fadd(bd.fmul(x, c(1.44269504088896341)), magic)
    k = bd.fsub(kb, magic)
    r = bd.fsub(bd.fsub(x, bd.fmul(k, c(_LN2_HI))), bd.fmul(k, c(_LN2_LO)))
    p = c(_EXP_POLY[0])
    for a in _EXP_POLY[1:]:
        p = fmuladd(bd, p, r, c(a))
    p = fmuladd(bd, p, bd.fmul(r, r), bd.fadd(r, c(1.0)))
    e = bd.shl(bd.add(bd.bitcast(kb, vec(I32, n) if n else I32), ci(127)), ci(23))  # k's bits
    return bd.fmul(p, bd.bitcast(e, x.type))


def func(mod, name, nargs):
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I64] * nargs), name)
    fn.attributes.add("nounwind")
    bd = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, bd


# ------------------------------------------------------------------ the integer dot of each ISA


def dpw(isa: Isa, bd, acc, a, b):
    """acc + pair sums: lane i += a16[2i]*b16[2i] + a16[2i+1]*b16[2i+1] (a, b, acc <L x i32>)."""
    L = isa.lanes
    if isa.name == "avx512vnni" and not isa.emulated:
        return call_intrinsic(bd, "llvm.x86.avx512.vpdpwssd.512", acc.type, [acc, a, b])
    if isa.name == "avxvnni" and not isa.emulated:
        return call_intrinsic(bd, "llvm.x86.avx512.vpdpwssd.256", acc.type, [acc, a, b])
    a16, b16 = bd.bitcast(a, vec(I16, 2 * L)), bd.bitcast(b, vec(I16, 2 * L))
    if isa.name == "avx2":
        return bd.add(acc, call_intrinsic(bd, "llvm.x86.avx2.pmadd.wd", acc.type, [a16, b16]))
    p = bd.mul(bd.sext(a16, vec(I32, 2 * L)), bd.sext(b16, vec(I32, 2 * L)))
    ev = bd.shuffle_vector(p, p, const(I32, range(0, 2 * L, 2)))
    od = bd.shuffle_vector(p, p, const(I32, range(1, 2 * L, 2)))
    return bd.add(acc, bd.add(ev, od))


def dpb(isa: Isa, bd, acc, w, x):
    """acc + quad sums (vpdpbusd): lane i += sum_j w[4i+j] * x[4i+j], w unsigned and x signed bytes
    (<4L x i8>), acc <L x i32>. avx2: vpmaddubsw, then vpmaddwd by ones (dpb_run)."""
    return dpb_run(isa, bd, acc, [(w, x)])


def dpb_run(isa: Isa, bd, acc, pairs):
    """acc + the quad sums of every (w, x) of pairs (dpb). Wider than the ISA's registers (a 16-lane
    planes kernel on ymm): a register's lanes at a time. avx2: the pairs' vpmaddubsw pair sums add
    up as int16 (vpaddw) before one vpmaddwd by ones, with saturation: the caller bounds them
    (2 * len(pairs) * max w * max |x| <= 32767)."""
    L = acc.type.count
    if not isa.emulated and L > isa.lanes:
        n = isa.lanes
        part = lambda v, h: bd.shuffle_vector(v, v, const(I32, range(h * n, h * n + n)))
        i32 = lambda v: bd.bitcast(v, vec(I32, L))
        halves = [dpb_run(isa, bd, part(acc, h), [(part(i32(w), h), part(i32(x), h)) for w, x in pairs])
                  for h in range(L // n)]
        while len(halves) > 1:
            halves = [bd.shuffle_vector(a, b, const(I32, range(2 * a.type.count))) for a, b in zip(halves[::2], halves[1::2])]
        return halves[0]
    if isa.name == "avx2" and not isa.emulated:
        b8 = vec(I8, 4 * L)
        p16 = None
        for w, x in pairs:
            p = call_intrinsic(bd, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 2 * L), [bd.bitcast(w, b8), bd.bitcast(x, b8)])
            p16 = p if p16 is None else bd.add(p16, p)
        return bd.add(acc, call_intrinsic(bd, "llvm.x86.avx2.pmadd.wd", acc.type, [p16, splat_c(I16, 1, 2 * L)]))
    for w, x in pairs:
        w32, x32 = bd.bitcast(w, vec(I32, L)), bd.bitcast(x, vec(I32, L))
        if isa.emulated:  # byte j of each lane: shifted out in place (fewer, narrower ops than widening
            # the bytes to 4L lanes: a B-wide planes kernel compiles ~3x faster)
            c = lambda v: splat_c(I32, v, L)  # noqa: E731
            parts = [bd.mul(bd.and_(bd.lshr(w32, c(8 * j)), c(255)), bd.ashr(bd.shl(x32, c(24 - 8 * j)), c(24)))
                     for j in range(4)]
            acc = bd.add(acc, bd.add(bd.add(parts[0], parts[1]), bd.add(parts[2], parts[3])))
        else:
            acc = call_intrinsic(bd, f"llvm.x86.avx512.vpdpbusd.{32 * L}", acc.type, [acc, w32, x32])
    return acc


def hadd(isa: Isa, bd, a, b):
    """vphaddd: [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7] of two <8 x i32>."""
    if isa.name in ("avx2", "avxvnni"):
        return call_intrinsic(bd, "llvm.x86.avx2.phadd.d", a.type, [a, b])
    even, odd = [0, 2, 8, 10, 4, 6, 12, 14], [1, 3, 9, 11, 5, 7, 13, 15]
    return bd.add(bd.shuffle_vector(a, b, const(I32, even)), bd.shuffle_vector(a, b, const(I32, odd)))

