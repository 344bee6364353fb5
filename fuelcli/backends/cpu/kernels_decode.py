"""The decode kernels (one token, or B tokens at once) and the exact row decode, generated as
LLVM IR for one instruction set; kernels.py puts them in modules and compiles them.

  decode(w, row_bytes, n_rows, K, x, xs, xf, out, xp, xz)
      out[r] = row r . x for one token. Block formats take x quantised to int16 per 32-element
      block (block scales xs, block sums xf, 16-element sums xz: matmul.quantize_rows), laid out
      in xp for their kernel: on avx512vnni as two int8 planes (_decode_planes, vpdpbusd on the
      stored bytes), elsewhere as int16 words in the order the stored bytes give the weights
      (_decode_words, vpmaddwd / vpdpwssd). Float formats take x as f32 and run FMAs. 8-bit
      activations (build_decode_q8): the planes kernels on the low plane alone, on every ISA with
      q8 decode kernels (q8_decode_takes; a 16-lane unit as two ymm halves on avxvnni and avx2).
      B-wide (B in DECODE_WIDTHS; wide_module, compiled at an engine's first step of several
      sequences): out[b, r] for tokens b < B, each token's x at the strides of the decode
      layouts (_tokens). A row's weights are unpacked once (unpack.word_chunk / planes_blocks) and
      dotted with every token's activations into that token's accumulators, each token's
      arithmetic in the one-token kernel's order: its results are the one-token kernel's, bit
      for bit, whatever tokens ride along. Decode here is bound by compute (the unpacking and the
      int16 dots), not by reading the weights, so what a wider kernel saves is the unpacking (4
      tokens on one kernel take 0.46-0.78x the time of 4 one-token kernels). 8 tokens on one kernel
      ran no faster than 4 + 4 (its sums spill), and a third width would cost another 50% of
      compile. Float formats: 2 tokens a kernel (wide_widths).
  dequant(row, K, out)
      one row decoded to f32 exactly as the numpy decode in fuelcli/formats (embedding lookups).
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from . import emit as E
from . import unpack as U
from .core import TASK_ARGS
from .llvm import Isa, planes_isa
from .irgen import (F32T, G, I8, I16, I32, Loop, Var, func, ptr_to, c64, const, dpb, dpb_run, dpw, fmuladd, hadd, hsum,
                    in_steps, load, prefetch, splat, splat_c, vec)

DECODE_ROWS = 16  # rows of one decode task
DECODE_WIDTHS = (2, 4)  # tokens of the B-wide decode kernels (wide_widths: a format's)


# ------------------------------------------------------------------ block formats


# The float decode kernels read each weight once, and short rows (896 elements) end before the
# hardware prefetcher ramps up: each step first asks for the same bytes PREFETCH_GROUPS rows further
# on (a task's rows are contiguous), so they arrive while this row computes (1.54x decode on an f16
# file, one thread; 1, 2 or 4 rows ahead differ by less than the noise). Into L2 (prefetcht1):
# prefetcht0 held L1's few miss buffers.
PREFETCH_GROUPS = 2


# The words kernels go a row at a time and ask for the bytes WORD_AHEAD bytes on (a task's rows are
# contiguous): of 1 to 4 KiB ahead, 4 read fastest (AVX2, 2 threads, Q4_K from DRAM: 16.9 GB/s, 13.2
# without); 4 to 12 KiB are within 8% of each other.
WORD_AHEAD = 4096


def _reduce_groups(isa, bd, P, full=True):
    """The lane sums of the groups' dots P[j] (8 or 4 <8 x i32>) by vphaddd: full -> <n x i32>, lane
    j the sum of P[j]; else (a words_sub16 format, 8 groups) the two vectors after the second level, the sums of
    lanes 0-3 and 4-7 of each group in emit.SUB16_ORDER.
    (In-lane unpacks and adds instead measured the same on a core where vphaddd takes two cycles:
    the reduction is not what bounds these kernels.)"""
    n = len(P)
    h = [hadd(isa, bd, P[j], P[j + 1]) for j in range(0, n, 2)]
    q = [hadd(isa, bd, h[j], h[j + 1]) for j in range(0, len(h), 2)]
    if not full:
        return q
    if n == 4:  # [P0..P3 lanes 0-3 | lanes 4-7]
        lo, hi = (bd.shuffle_vector(q[0], q[0], const(I32, range(k, k + 4))) for k in (0, 4))
    else:
        lo = bd.shuffle_vector(q[0], q[1], const(I32, [0, 1, 2, 3, 8, 9, 10, 11]))
        hi = bd.shuffle_vector(q[0], q[1], const(I32, [4, 5, 6, 7, 12, 13, 14, 15]))
    return bd.add(lo, hi)


def _tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_):
    """Per token b < B, the i64 addresses (xs, xf, out, xp, xz) of its block scales, block sums,
    outputs and decode layout, from token 0's: the strides of matmul.decode_task (out: ldo floats,
    the matrix's rows). Token 0's are the arguments themselves."""
    nb = bd.udiv(K, c64(G))
    strides = (bd.mul(nb, c64(4)), bd.mul(nb, c64(4)), bd.mul(ldo, c64(4)), bd.add(bd.mul(K, c64(4)), c64(64)),
               bd.mul(bd.udiv(K, c64(16)), c64(4)))
    base = (xs_, xf_, out_, xp_, xz_)
    return [base if b == 0 else tuple(bd.add(a, bd.mul(s, c64(b))) for a, s in zip(base, strides)) for b in range(B)]


def _decode_words(isa, mod, code, name, B=1):
    """decode on the token's words layout (every ISA without the int8 planes), a row at a time and
    unpack.WORD_CHUNK groups at a time: each group's weights taken out of its stored words in place
    (unpack.word_chunk) and dotted with its even and odd activations by two vpmaddwd (vpdpwssd with
    VNNI); the chunk's dots summed across lanes into one vector (vphaddd), converted, times the
    groups' scales and activation scales in one FMA (the mins in another). A 32-element format's
    last blocks go four and then one at a time. B tokens (DECODE_WIDTHS): a chunk is unpacked once
    and dotted with each token's activations into that token's accumulator, each token's steps
    those of the one-token kernel in the same order."""
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    w, row_bytes, n_rows, K, _xq, xs_, xf_, out_, xw_, xz_, ldo = fn.args
    rec = U.record(code)
    BL = rec.layout
    per = BL.block_elems // G  # groups per format block
    chunk = E.WORD_CHUNK // per  # format blocks per chunk
    L = G // 4  # i32 lanes of a group's dot
    half = vec(I16, G // 2)
    wp = ptr_to(bd, w, I8)
    toks = [(ptr_to(bd, xs, F32T), ptr_to(bd, xf, F32T), ptr_to(bd, out, F32T), ptr_to(bd, xw, I16),
             ptr_to(bd, xz, F32T)) for xs, xf, out, xw, xz in _tokens(bd, B, K, ldo, xs_, xf_, out_, xw_, xz_)]
    nb = bd.udiv(K, c64(BL.block_elems))
    has_min = rec.has_min
    ahead = c64(WORD_AHEAD)

    def dot(xw, even, odd, g):  # <8 x i32>: group g's weights (even, odd) times its activations
        x0 = bd.mul(g, c64(G))
        p = dpw(isa, bd, splat_c(I32, 0, L), bd.bitcast(even, vec(I32, L)),
                bd.bitcast(load(bd, xw, x0, half), vec(I32, L)))
        return dpw(isa, bd, p, bd.bitcast(odd, vec(I32, L)),
                   bd.bitcast(load(bd, xw, bd.add(x0, c64(G // 2)), half), vec(I32, L)))

    def step(row, b0, nblk, accs):
        """Blocks b0 .. b0 + nblk - 1 into each token's acc (<8 x float>; its low lanes when fewer groups)."""
        for line in range(0, nblk * BL.block_bytes, 64):
            prefetch(bd, bd.gep(row, [bd.add(bd.add(bd.mul(b0, c64(BL.block_bytes)), c64(line)), ahead)]), 2)
        g0 = bd.mul(b0, c64(per))
        ch = U.word_chunk(code, bd, row, b0, nblk)
        dots = [[None] * len(ch.groups) for _ in toks]
        # group-major: a group's words feed every token while in registers (token-major spilled
        # them: Q5_0, 4 tokens, 1.09 against 0.84 ms a matrix)
        for j, (e, o) in enumerate(ch.groups):
            for t, tok in enumerate(toks):
                dots[t][j] = dot(tok[3], e, o, bd.add(g0, c64(j)))
        for (xs, xf, _out, xw, xz), acc, P in zip(toks, accs, dots):
            n = len(P)
            a = acc.get()
            widen = lambda v: v if n == L else bd.shuffle_vector(v, ir.Constant(v.type, None), const(I32, [*range(n), *[n] * (L - n)]))  # noqa: E731
            if n == 1:  # one group: its lanes times its scale
                sc = bd.fmul(bd.extract_element(ch.scale, ir.Constant(I32, 0)), bd.load(bd.gep(xs, [g0])))
                a = fmuladd(bd, bd.sitofp(P[0], vec(F32T, L)), splat(bd, sc, L), a)
            elif rec.words_sub16:  # a scale per 16 elements, in SUB16_ORDER
                xsv = load(bd, xs, g0, vec(F32T, n))
                xs16 = bd.shuffle_vector(xsv, xsv, const(I32, [s // 2 for s in E.SUB16_ORDER]))
                sv = bd.fmul(ch.scale, xs16)
                if rec.words_zero:  # the weights are q: the zero point times the activations'
                    # 16-element sums comes off, exactly
                    zs = bd.fptosi(load(bd, xz, bd.mul(g0, c64(2)), vec(F32T, 2 * n)), vec(I32, 2 * n))
                    zs = bd.mul(bd.shuffle_vector(zs, zs, const(I32, E.SUB16_ORDER)), splat_c(I32, rec.words_zero, 2 * n))
                if rec.min_sub16:  # the mins times the activations' 16-element sums and scales
                    zf = load(bd, xz, bd.mul(g0, c64(2)), vec(F32T, 2 * n))
                    zx = bd.fmul(bd.shuffle_vector(zf, zf, const(I32, E.SUB16_ORDER)), xs16)
                for q, part in enumerate(_reduce_groups(isa, bd, P, False)):
                    half = lambda v: bd.shuffle_vector(v, v, const(I32, range(8 * q, 8 * q + 8)))  # noqa: E731
                    if rec.words_zero:
                        part = bd.sub(part, half(zs))
                    a = fmuladd(bd, bd.sitofp(part, vec(F32T, L)), half(sv), a)
                    if rec.min_sub16:
                        a = fmuladd(bd, half(ch.min), half(zx), a)
            else:
                sums = bd.sitofp(_reduce_groups(isa, bd, P), vec(F32T, n))
                a = fmuladd(bd, widen(sums), widen(bd.fmul(ch.scale, load(bd, xs, g0, vec(F32T, n)))), a)
            if has_min:
                mins = ch.min if n > 1 else bd.shuffle_vector(ch.min, ch.min, const(I32, [0]))
                a = fmuladd(bd, widen(mins), widen(load(bd, xf, g0, vec(F32T, n))), a)
            acc.set(a)

    with Loop(bd, 0, n_rows) as r:
        row = bd.gep(wp, [bd.mul(r, row_bytes)])
        accs = [Var(bd, splat_c(F32T, 0.0, L)) for _ in toks]
        done = 0
        for nblk in (chunk, 4, 1) if chunk > 1 else (chunk,):  # a 32-element format's last blocks: 4, then 1
            start = done if isinstance(done, ir.Value) else c64(done)
            end = nb if nblk == 1 else bd.add(start, bd.mul(bd.udiv(bd.sub(nb, start), c64(nblk)), c64(nblk)))
            with Loop(bd, start, end, nblk) as b0:
                step(row, b0, nblk, accs)
            done = end
        for (_xs, _xf, out, _xw, _xz), acc in zip(toks, accs):
            bd.store(hsum(bd, acc.get()), bd.gep(out, [r]))
    bd.ret_void()
    return fn


# Rows a B-wide planes decode kernel dots at once: two rows share the activation loads. The
# one-token kernel takes its record's planes_rows instead: from DRAM two rows are two streams of
# loads, and one row at a time reads more (a 1.5B-shape Q8_0 file's tg64 at 2 threads: 1.19x),
# but the formats bound by their arithmetic lose the shared loads (IQ2_XXS 0.79x) and keep two.
PLANES_ROWS = 2
# Rows ahead whose bytes a planes kernel asks for, into L2 (prefetcht1): a Q4_K kernel read 33 GB/s
# from DRAM with 2 threads where prefetcht0 two row groups ahead, which filled L1's few miss
# buffers, read 17.6. The bytes are asked for in the order they lie, one stream whatever the rows at
# a time: two streams a row apart read less.
PLANES_AHEAD = 8


def _klayout_units(bd, units):
    """A 256-element chunk's four units (<64 x i8>, unit u: elements 64u .. 64u + 63) rearranged onto
    the activations' K-quant layout: unit u, lane i holds elements 16i + 4u .. 16i + 4u + 3, that is
    lane 4(i % 4) + u of plain unit i // 4 (a 4 x 4 transpose of dwords)."""
    d = [bd.bitcast(u, vec(I32, E.LANES)) for u in units]
    out = []
    for u in range(4):
        idx = const(I32, [16 * p + 4 * s + u for p in range(2) for s in range(4)])
        a, b = bd.shuffle_vector(d[0], d[1], idx), bd.shuffle_vector(d[2], d[3], idx)
        out.append(bd.bitcast(bd.shuffle_vector(a, b, const(I32, range(E.LANES))), vec(I8, E.PLANES_UNIT)))
    return out


def _klayout_scales(bd, scales):
    """Plain units' lane scales (each uniform over a 16-element run) -> the K-quant layout's one
    vector: lane i, the run 16i .. 16i + 15 (lane 4(i % 4) of plain unit i // 4)."""
    idx = const(I32, [16 * p + 4 * s for p in range(2) for s in range(4)])
    a, b = bd.shuffle_vector(scales[0], scales[1], idx), bd.shuffle_vector(scales[2], scales[3], idx)
    return bd.shuffle_vector(a, b, const(I32, range(E.LANES)))


class _PlanesKernel(NamedTuple):
    """What every step of one planes decode kernel builds with: its ISA, builder and format."""

    isa: Isa
    bd: ir.IRBuilder
    code: int
    rec: E.CpuFormat
    per: int  # 32-element groups per format block
    chunk: int  # format blocks per main-loop chunk (PLANES_CHUNK elements)
    tails: tuple  # block counts of a 32-element format's last steps: in pairs, then one
    one_plane: bool = False  # 8-bit activations (quantize_q8.py): the low plane is the value, the high one 0

    @property
    def native(self):  # the emitter's units are already on the K-quant layout
        return self.rec.planes_klayout

    @property
    def chunked(self):  # full chunks run on the K-quant layout
        return self.native or self.rec.planes_chunks

    @property
    def zero(self):
        return self.rec.planes_zero

    @property
    def per_group(self) -> dict:
        """Lanes per 32-element group of the side sums: a min per group (or per 16 elements:
        min_sub16), and the zero point per 16 elements where a unit goes at a time."""
        return {"min": self.rec.mins_per_group, "zero": 2 * (self.zero is not None)}


class _PlanesToken(NamedTuple):
    """One token's pointers in a planes kernel."""

    xs: ir.Value  # f32 block scales
    xf: ir.Value  # f32 block sums
    out: ir.Value  # f32 outputs
    xh: ir.Value  # the high and low int8 planes
    xl: ir.Value
    xz: ir.Value  # f32 16-element sums
    xkh: ir.Value  # the high and low planes on the K-quant layout
    xkl: ir.Value


def _planes_tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_, words=False):
    """Each token's _PlanesToken: its decode layout xp holds the two plain planes, then the two on
    the K-quant layout (core.py's quantize). `words` (8-bit activations on an ISA whose one-token
    layout is the words): the words, then the low plane plain and on the K-quant layout, no high one."""
    toks = []
    for xs, xf, out, xp, xz in _tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_):
        xh = ptr_to(bd, xp, I8)
        xk = bd.gep(xh, [bd.mul(K, c64(2))])
        floats = [ptr_to(bd, v, F32T) for v in (xs, xf, out)]
        xl = xk if words else bd.gep(xh, [K])
        toks.append(_PlanesToken(*floats, None if words else xh, xl, ptr_to(bd, xz, F32T), None if words else xk,
                                 bd.gep(xk, [K])))
    return toks


def _side_accumulators(k, R):
    """One token's float sums of the mins and zero points, by (kind, blocks a step): their lane
    counts differ with a step's blocks; the zero point comes off in the integer dot on the K-quant
    layout, so only the unit-at-a-time steps keep its sum."""
    sizes = {"min": (k.chunk, *k.tails), "zero": k.tails if k.chunked else (k.chunk, *k.tails)}
    return {(key, n): Var(k.bd, splat_c(F32T, 0.0, n * k.per * m * R))
            for key, m in k.per_group.items() if m for n in sorted(sizes[key])}


def _chunk_dot(k, planes, units, lo0):
    """A full chunk's int16 dot on the K-quant layout (<16 x i32>, lane i: the run 16i .. 16i + 15):
    its four units summed in two chains, the high plane's and the low one's from lo0 (one chain of
    eight vpdpbusd is ~40 cycles long)."""
    bd, L = k.bd, E.LANES
    if k.one_plane and k.isa.name == "avx2":  # runs of units' int16 pair sums (avx2_run)
        run = avx2_run(k.code)
        pairs = [(wu, pl) for (_ph, pl), wu in zip(planes, units)]
        for i in range(0, len(pairs), run):
            lo0 = dpb_run(k.isa, bd, lo0, pairs[i:i + run])
        return lo0
    if k.one_plane:  # the units in two chains still
        a, b = lo0, splat_c(I32, 0, L)
        for i, ((_ph, pl), wu) in enumerate(zip(planes, units)):
            a, b = (dpb(k.isa, bd, a, wu, pl), b) if i % 2 == 0 else (a, dpb(k.isa, bd, b, wu, pl))
        return bd.add(a, b)
    hi, lo = splat_c(I32, 0, L), lo0
    for (ph, pl), wu in zip(planes, units):
        hi, lo = dpb(k.isa, bd, hi, wu, ph), dpb(k.isa, bd, lo, wu, pl)
    return bd.add(bd.shl(hi, splat_c(I32, 8, L)), lo)


def _unit_dots(k, planes, units, lane_scales, acc):
    """acc plus each unit's int16 dot times its lane scales: one conversion and FMA a unit."""
    bd, L = k.bd, E.LANES
    for (ph, pl), wu, ls in zip(planes, units, lane_scales):
        if k.one_plane:
            isum = dpb(k.isa, bd, splat_c(I32, 0, L), wu, pl)
        else:
            hi = dpb(k.isa, bd, splat_c(I32, 0, L), wu, ph)
            isum = dpb(k.isa, bd, bd.shl(hi, splat_c(I32, 8, L)), wu, pl)
        acc = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), ls, acc)
    return acc


def _zero_start(k, xz, e0):
    """Where a chunk's low chain starts: -z times the activations' sums over each lane's 16
    elements, so the zero point comes off exactly in the integer dot (0 without one)."""
    bd, L = k.bd, E.LANES
    lo0 = splat_c(I32, 0, L)
    if k.zero is not None:
        sz = bd.fptosi(load(bd, xz, bd.udiv(e0, c64(16)), vec(F32T, L)), vec(I32, L))
        lo0 = bd.mul(sz, splat_c(I32, -k.zero, L))
    return lo0


def _add_side_sums(k, blk, tok, sm, b0, nblk, R):
    """The step's mins and (unit at a time) zero-point scales times the activations' sums, into the
    token's side sums (all R rows' lanes in one vector)."""
    bd = k.bd
    g = nblk * k.per
    for key, v, x in (("min", blk.min, tok.xz if k.rec.min_sub16 else tok.xf), ("zero", blk.zero_scale, tok.xz)):
        if v is not None and (key, nblk) in sm:
            n = g * k.per_group[key]
            xv = load(bd, x, bd.mul(b0, c64(n // nblk)), vec(F32T, n))
            xv = xv if R == 1 else bd.shuffle_vector(xv, xv, const(I32, list(range(n)) * R))
            sm[key, nblk].set(fmuladd(bd, v, xv, sm[key, nblk].get()))


def _planes_step(k, row, ahead, toks, accs, sums, b0, nblk):
    """Format blocks b0 .. b0 + nblk - 1 of the rows at `row` into every token's accumulators
    (accs[t][i]: token t, row i) and side sums: on the K-quant layout for a full chunk of a chunked
    format, else a unit at a time. The rows' units and weight scales are unpacked once for every
    token; the emitter is asked again per token for what holds the token's activation scales (its
    unit work there is dead code), so each token's steps are the one-token kernel's."""
    bd, L, BL = k.bd, E.LANES, k.rec.layout
    R = len(row)
    g = nblk * k.per  # 32-element groups of the step
    e0 = bd.mul(b0, c64(BL.block_elems))
    gi = bd.mul(b0, c64(k.per))
    kl = nblk == k.chunk and k.chunked
    seq = bd.add(bd.mul(b0, c64(R * BL.block_bytes)), ahead)
    for line in range(0, R * nblk * BL.block_bytes, 64):
        prefetch(bd, bd.gep(row[0], [bd.add(seq, c64(line))]), 2)
    if kl and not k.native:  # plain units transposed onto the layout, scales taken at activation scale 1
        base = U.planes_blocks(k.code, bd, row, b0, nblk, splat_c(F32T, 1.0, g))
        kunits = [_klayout_units(bd, base.units[i]) for i in range(R)]
        wscales = [_klayout_scales(bd, base.lane_scales[i]) for i in range(R)]
    units = None
    for tok, acc, sm in zip(toks, accs, sums):
        xsv = load(bd, tok.xs, gi, vec(F32T, g))
        blk = U.planes_blocks(k.code, bd, row, b0, nblk, xsv)
        units = units or (blk.units if k.native or not kl else kunits)
        ph_, pl_ = (tok.xkh, tok.xkl) if kl else (tok.xh, tok.xl)
        at = lambda u: bd.add(e0, c64(u * E.PLANES_UNIT))  # noqa: E731
        planes = [(None if k.one_plane else load(bd, ph_, at(u), vec(I8, E.PLANES_UNIT)),
                   load(bd, pl_, at(u), vec(I8, E.PLANES_UNIT)))
                  for u in range(len(units[0]))]
        if kl:
            lo0 = _zero_start(k, tok.xz, e0)
            if not k.native:
                xsk = bd.shuffle_vector(xsv, xsv, const(I32, [i // 2 for i in range(L)]))
        for i in range(R):
            a = acc[i].get()
            if kl:  # the chunk's units in one sum, converted and scaled once
                isum = _chunk_dot(k, planes, units[i], lo0)
                ls = blk.lane_scales[i][0] if k.native else bd.fmul(wscales[i], xsk)
                a = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), ls, a)
            else:
                a = _unit_dots(k, planes, units[i], blk.lane_scales[i], a)
            acc[i].set(a)
        _add_side_sums(k, blk, tok, sm, b0, nblk, R)


def _store_rows(k, toks, accs, sums, r0, R):
    """Each token's R outputs: its accumulators' lane sums, plus the mins' sums, less z times the
    zero point's."""
    bd = k.bd
    for tok, acc, sm in zip(toks, accs, sums):
        for i in range(R):
            total = hsum(bd, acc[i].get())
            for (key, _nblk), var in sm.items():
                v, n = var.get(), var.get().type.count // R
                part = hsum(bd, bd.shuffle_vector(v, v, const(I32, range(n * i, n * (i + 1)))))
                z = ir.Constant(F32T, float(k.zero or 0))
                total = bd.fadd(total, part) if key == "min" else bd.fsub(total, bd.fmul(z, part))
            bd.store(total, bd.gep(tok.out, [bd.add(r0, c64(i))]))


def _planes_rows(k, wp, row_bytes, toks, bounds, r0, R):
    """Rows r0 .. r0 + R - 1 for every token: full chunks, then a 32-element format's last blocks in
    pairs and then one at a time (bounds: the blocks where each of those loops ends)."""
    bd = k.bd
    row = [bd.gep(wp, [bd.mul(bd.add(r0, c64(i)), row_bytes)]) for i in range(R)]
    accs = [[Var(bd, splat_c(F32T, 0.0, E.LANES)) for _ in range(R)] for _ in toks]
    ahead = bd.mul(row_bytes, c64(PLANES_AHEAD))
    sums = [_side_accumulators(k, R) for _ in toks]
    n_main, n_pairs, nb = bounds
    with Loop(bd, 0, n_main, k.chunk) as b0:
        _planes_step(k, row, ahead, toks, accs, sums, b0, k.chunk)
    if k.tails:
        with Loop(bd, n_main, n_pairs, 2) as b0:
            _planes_step(k, row, ahead, toks, accs, sums, b0, 2)
        with Loop(bd, n_pairs, nb) as b0:
            _planes_step(k, row, ahead, toks, accs, sums, b0, 1)
    _store_rows(k, toks, accs, sums, r0, R)


def _decode_planes(isa, mod, code, name, B=1, one_plane=False):
    """decode on the activations' int8 planes (avx512vnni: each format's planes emitter).

    Each unit of 64 weights is dotted with both planes, 64 multiply-adds per vpdpbusd: the high
    plane's sums shifted left by 8 plus the low plane's are the int16 dot. A full chunk of 256
    elements runs on the activations' K-quant layout, where lane i of each of its four units holds
    elements of the run 16i .. 16i + 15, which one scale covers: the four units' dots sum in
    integers and are converted and scaled once a chunk (_chunk_dot), and a zero point comes off in
    the integer dot. A format whose emitter gives plain units (not planes_klayout) has them
    transposed onto that layout once a row (_klayout_units); where that made the one-token kernel
    slower (1.1x or more) or the B-wide one no faster, the format keeps a unit at a time
    (planes_chunks off). The other steps (a 32-element format's last blocks) go a unit at a time
    (_unit_dots), their zero point and mins taken off at the end with the activations' sums
    (_add_side_sums). R rows at a time: PLANES_ROWS for B tokens, the record's planes_rows for one.
    `one_plane`: the 8-bit activations (quantize_q8.py), one vpdpbusd a unit; the same integers.
    On an ISA of ymm registers (avxvnni, avx2: q8 only) the same IR, each 64-byte dot as two
    256-bit ones (irgen.dpb), the low plane read after the words (_planes_tokens): the results are
    avx512vnni's, bit for bit."""
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    w, row_bytes, n_rows, K, _xq, xs_, xf_, out_, xp_, xz_, ldo = fn.args
    rec = U.record(code)
    BL = rec.layout
    wp = ptr_to(bd, w, I8)
    toks = _planes_tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_, not planes_isa(isa))
    chunk = E.PLANES_CHUNK // BL.block_elems
    assert chunk * BL.block_elems == E.PLANES_KBLOCK
    k = _PlanesKernel(isa, bd, code, rec, BL.block_elems // G, chunk, (2, 1) if chunk > 1 else (), one_plane)
    nb = bd.udiv(K, c64(BL.block_elems))
    n_main = bd.mul(bd.udiv(nb, c64(chunk)), c64(chunk))
    n_pairs = bd.add(n_main, bd.mul(bd.udiv(bd.sub(nb, n_main), c64(2)), c64(2)))
    in_steps(bd, n_rows, PLANES_ROWS if B > 1 else rec.planes_rows,
             lambda r0, R: _planes_rows(k, wp, row_bytes, toks, (n_main, n_pairs, nb), r0, R))
    bd.ret_void()
    return fn


def _decode_task(mod, body, name):
    """decode task: rows [task*DECODE_ROWS, ...) of (w, n_rows, row_bytes, K, x, xs, xf, out, xp, xz),
    for one token or (a B-wide body) B tokens from this one on (_tokens)."""
    fn, bd = func(mod, name, TASK_ARGS)
    task, w, n_rows, row_bytes, K, x, xs, xf, out, xp, xz = fn.args[:11]
    r0 = bd.mul(task, c64(DECODE_ROWS))
    nr = bd.sub(n_rows, r0)
    nr = bd.select(bd.icmp_signed(">", nr, c64(DECODE_ROWS)), c64(DECODE_ROWS), nr)
    bd.call(body, [bd.add(w, bd.mul(r0, row_bytes)), row_bytes, nr, K, x, xs, xf, bd.add(out, bd.mul(r0, c64(4))),
                   xp, xz, n_rows])
    bd.ret_void()


def _dequant_quant(isa, mod, code, name):
    """Exact decode: scale * w (+ min) per element, no fused multiply-add, no reassociation."""
    fn, bd = func(mod, name, 3)
    row_, K, out_ = fn.args
    BL = U.record(code).layout
    row, out = ptr_to(bd, row_, I8), ptr_to(bd, out_, F32T)
    with Loop(bd, 0, bd.udiv(K, c64(BL.block_elems))) as fb:
        blk = U.block(code, bd, row, fb)
        for j in range(len(blk.w)):
            v = U.exact_values(bd, blk, j)
            o = bd.add(bd.mul(fb, c64(BL.block_elems)), c64(j * G))
            bd.store(v, bd.bitcast(bd.gep(out, [o]), vec(F32T, G).as_pointer()), align=4)
    bd.ret_void()


# ------------------------------------------------------------------ float formats (f32, f16, bf16)


def _elem_bytes(code):
    return U.record(code).layout.block_bytes


def _decode_float(isa, mod, code, name, B=1):
    """decode of a float format: 4 accumulators of L lanes a row, FMAs on the converted weights (the
    last K % 4L elements one at a time). B tokens: a row's weights converted once for all of them,
    each token's FMAs the one-token kernel's (token b's x 4K bytes after token b - 1's)."""
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    w, row_bytes, n_rows, K, x_, _xs, _xf, out_, _xp, _xz, ldo = fn.args
    L = isa.lanes
    U4 = 4 * L
    wp = ptr_to(bd, w, I8)
    toks = [(ptr_to(bd, bd.add(x_, bd.mul(K, c64(4 * b))), F32T), ptr_to(bd, bd.add(out_, bd.mul(ldo, c64(4 * b))), F32T))
            for b in range(B)]
    kv = bd.mul(bd.udiv(K, c64(U4)), c64(U4))
    with Loop(bd, 0, n_rows) as r:
        row = bd.gep(wp, [bd.mul(r, row_bytes)])
        accs = [[Var(bd, splat_c(F32T, 0.0, L)) for _ in range(4)] for _ in toks]
        ahead = bd.mul(row_bytes, c64(PREFETCH_GROUPS))
        with Loop(bd, 0, kv, U4) as k:
            for line in range(0, U4 * _elem_bytes(code), 64):  # the lines this step reads, PREFETCH_GROUPS rows on
                prefetch(bd, bd.gep(row, [bd.add(bd.add(bd.mul(k, c64(_elem_bytes(code))), c64(line)), ahead)]), 2)
            for u in range(4):
                ku = bd.add(k, c64(u * L))
                wv = U.floats(code, bd, row, ku, L)
                for (x, _out), acc in zip(toks, accs):
                    acc[u].set(fmuladd(bd, wv, load(bd, x, ku, vec(F32T, L)), acc[u].get()))
        tails = [Var(bd, ir.Constant(F32T, 0.0)) for _ in toks]
        with Loop(bd, kv, K) as k:
            wk = bd.extract_element(U.floats(code, bd, row, k, 1), ir.Constant(I32, 0))
            for (x, _out), tail in zip(toks, tails):
                tail.set(fmuladd(bd, wk, bd.load(bd.gep(x, [k])), tail.get()))
        for (_x, out), acc, tail in zip(toks, accs, tails):
            a = bd.fadd(bd.fadd(acc[0].get(), acc[1].get()), bd.fadd(acc[2].get(), acc[3].get()))
            bd.store(bd.fadd(hsum(bd, a), tail.get()), bd.gep(out, [r]))
    bd.ret_void()
    return fn


def _dequant_float(isa, mod, code, name):
    fn, bd = func(mod, name, 3)
    row_, K, out_ = fn.args
    row, out = ptr_to(bd, row_, I8), ptr_to(bd, out_, F32T)
    with Loop(bd, 0, K) as k:
        v = U.floats(code, bd, row, k, 1, exact=True)
        bd.store(bd.extract_element(v, ir.Constant(I32, 0)), bd.gep(out, [k]))
    bd.ret_void()


def wide_widths(code: int) -> tuple:
    """The widths of a format's B-wide decode kernels: a float format's 4 tokens keep 16 vectors
    of sums, which spill on AVX2 (f32: one kernel of 4 tokens took 1.12x the time of 4 one-token
    kernels, 2 + 2 0.74x), so they run 2 at a time."""
    return DECODE_WIDTHS if U.record(code).quant else (2,)


def build_decode(isa, mod, code, name, B=1):
    """A format's decode task kernel `name` for B tokens into mod, on the body its ISA reads: the
    int8 planes (avx512vnni), else the int16 words; a float format's FMAs."""
    body = _decode_float if not U.record(code).quant else _decode_planes if planes_isa(isa) else _decode_words
    _decode_task(mod, body(isa, mod, code, name + "_rows", B), name)


# The largest byte of each format's planes units (the stored q, 16 * q for the high nibbles of
# Q4_0, Q4_1 and Q4_K; test_q8_kernels measures it): avx2's vpmaddubsw sums two products of unit
# bytes and 8-bit activations (|q| <= 127) into int16 with saturation, so a format runs the q8
# decode kernels there only if 2 * 127 * UNIT_MAX <= 32767 (AVX2_UNIT_MAX).
UNIT_MAX = {"q8_0": 255, "q4_0": 240, "q4_1": 240, "q5_0": 31, "q4_k": 240, "q6_k": 63, "q5_1": 31, "q5_k": 31,
            "q3_k": 7, "iq4_nl": 241, "iq4_xs": 241, "iq3_xxs": 190, "iq3_s": 143, "q2_k": 192, "iq2_xxs": 171,
            "iq2_xs": 171, "iq2_s": 171, "iq1_s": 137, "iq1_m": 137, "tq2_0": 3, "tq1_0": 2, "mxfp4": 24}
AVX2_UNIT_MAX = 32767 // (2 * 127)


def avx2_run(code: int) -> int:
    """Units of a chunk whose pair sums add up as int16 before one vpmaddwd on avx2 (irgen.dpb_run):
    2 * 127 * UNIT_MAX * run <= 32767, a power of two up to a chunk's 4 units."""
    from ...formats import BY_CODE

    run = 4
    while run > 1 and 2 * 127 * UNIT_MAX[BY_CODE[code].name] * run > 32767:
        run //= 2
    return run


# The formats whose q8 decode kernels (the planes kernels on the low plane, a 16-lane unit as two
# ymm halves) run on the ISAs without the int8 planes: where they were not slower than the int16
# words kernels on the same values, one thread, in cache and from DRAM (docs/performance.md); the
# others run those words kernels (the same integers).
Q8_DECODE = {"avxvnni": frozenset(UNIT_MAX) - {"iq3_xxs", "iq3_s"},  # those two: 0.79-0.87x in cache
             "avx2": frozenset({"q5_1", "mxfp4"})}  # the rest 0.44-0.97x (the 64-lane unpacking on ymm)


def q8_decode_isa(isa) -> bool:
    """Whether the ISA has q8 decode kernels for any format."""
    return planes_isa(isa) or bool(Q8_DECODE.get(isa.name))


def q8_decode_takes(isa, code: int) -> bool:
    """Whether a block format decodes 8-bit activations on its own (one-plane) kernels on the ISA."""
    from ...formats import BY_CODE

    name = BY_CODE[code].name
    if not U.record(code).quant or not (planes_isa(isa) or name in Q8_DECODE.get(isa.name, ())):
        return False
    return isa.name != "avx2" or UNIT_MAX[name] <= AVX2_UNIT_MAX


def build_decode_q8(isa, mod, code, name, B=1):
    """A block format's planes decode task kernel for 8-bit activations (one plane: quantize_q8.py),
    where q8_decode_takes."""
    assert q8_decode_takes(isa, code)
    _decode_task(mod, _decode_planes(isa, mod, code, name + "_rows", B, one_plane=True), name)


def build_dequant(isa, mod, code, name):
    """A format's exact row decode `name` into mod."""
    (_dequant_quant if U.record(code).quant else _dequant_float)(isa, mod, code, name)
