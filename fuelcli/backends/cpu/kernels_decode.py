"""The decode kernels (one token, or B tokens at once) and the exact row decode, generated as
LLVM IR for one instruction set; kernels.py puts them in modules and compiles them.

  decode(w, row_bytes, n_rows, K, x, xs, xf, out, xp, xz)
      out[r] = row r . x for one token. Block formats take x quantised to int16 per 32-element
      block (block scales xs, block sums xf, 16-element sums xz: matmul.quantize_rows), laid out
      in xp for their kernel: on avx512vnni as two int8 planes (_decode_planes, vpdpbusd on the
      stored bytes), elsewhere as int16 words in the order the stored bytes give the weights
      (_decode_words, vpmaddwd / vpdpwssd). Float formats take x as f32 and run FMAs.
      B-wide (B in DECODE_WIDTHS; wide_module, compiled at an engine's first step of several
      sequences): out[b, r] for tokens b < B, each token's x at the strides of the decode
      layouts (_tokens). A row's weights are unpacked once (unpack.word_chunk / planes_blocks) and
      dotted with every token's activations into that token's accumulators, each token's
      arithmetic in the one-token kernel's order: its results are the one-token kernel's, bit
      for bit, whatever tokens ride along. Decode here is bound by compute (the unpacking and the
      int16 dots), not by reading the weights, so what a wider kernel saves is the unpacking: a
      matrix's time for 4 tokens, one thread of an AVX2 core, against 4 one-token kernels: Q5_0
      0.52x, Q4_1 0.59x, Q4_K 0.68x, Q6_K 0.73x, Q8_0 0.78x (Q4_K's and Q8_0's unpacking is a few
      operations a group; the 16 vpmaddwd and the lane sums per 256 elements stay per token); the
      planes kernels of an AVX-512 Zen 5 (a hot 1536^2 matrix): Q5_0 0.46x, Q8_0 0.48x, Q6_K
      0.49x, Q4_K 0.63x (each token's work a 256-element chunk: 8 vpdpbusd and 5 more). 8
      tokens as one kernel ran no faster than 4 + 4 (its sums spill); 3 tokens on one kernel
      saved 27% over 2 + 1 on Q5_0, but a third width costs another 50% of compile. Float
      formats: 2 tokens a kernel (wide_widths).
  dequant(row, K, out)
      one row decoded to f32 exactly as the numpy decode in fuelcli/formats (embedding lookups).
"""

from __future__ import annotations

from llvmlite import ir

from . import emit as E
from . import unpack as U
from .core import TASK_ARGS
from .llvm import planes_isa
from .irgen import (F32T, G, I8, I16, I32, Loop, Var, func, ptr_to, c64, const, dpb, dpw, fmuladd, hadd, hsum,
                    in_steps, load, prefetch, splat, splat_c, vec)

DECODE_ROWS = 16  # rows of one decode task
DECODE_WIDTHS = (2, 4)  # tokens of the B-wide decode kernels (wide_widths: a format's)


# ------------------------------------------------------------------ block formats


# A decode kernel reads each weight once, and short rows (896 elements: 616 bytes of Q5_0) end before
# the hardware prefetcher ramps up: each step first asks for the same bytes PREFETCH_GROUPS groups of
# rows further on (a task's rows are contiguous), so they arrive while this group computes. Measured
# with 1 thread, CPU time per token: 1.74x decode on the Qwen demo (Q5_0), 1.54x on an f16 file; 1, 2
# or 4 groups ahead differ by less than the noise. Into L2 (prefetcht1): prefetcht0 held L1's few
# miss buffers; 2 threads, matrices from DRAM: avx512vnni Q4_K 17.6 -> 19.5 GB/s, bf16/f16/f32
# +5-10%, avx2 Q4_K / Q5_0 +6% / +5% (medians of interleaved runs; docs/performance.md).
PREFETCH_GROUPS = 2


# The words kernels go a row at a time and ask for the bytes WORD_AHEAD bytes on (a task's rows are
# contiguous). Matrices from DRAM, 2 threads, AVX2, best of 6 interleaved in one process: Q4_K
# 8960 x 1536 at 1 / 2 / 3 / 4 KiB ahead 14.4 / 15.2 / 15.2 / 16.9 GB/s, none 13.2; Q5_0 11.3 /
# 12.0 / 11.9 / 12.8, none 11.2; 4 to 12 KiB within 8% of each other
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


# Rows a B-wide planes decode kernel dots at once (sharing the activation loads). The one-token
# kernel takes its record's planes_rows: one for most formats, since two rows at once are two
# streams of loads and from DRAM one row at a time read more (tg64 of 1.5B-shape files, 2 threads,
# 3 interleaved pairs in each memory mode: Q8_0 1.19x at 48 GB/s and 1.27x at 85, Q6_K 1.11x /
# 1.15x, Q4_K_M 1.10x / 1.08x, Q4_K 1.05x / 1.09x, Q5_0 0.97x / 1.02x; the Qwen demo 1.16x /
# 1.13x; Q5_1 1.06x, IQ4_NL 1.03x, Q3_K 1.02x, IQ4_XS 0.99x) though its hot rate fell (one thread,
# 2048^2, two runs: 0.99-1.15x the time); two for the formats bound by their arithmetic, which a
# row at a time slowed: IQ2_XXS 0.79x, IQ2_XS 0.84x, IQ2_S 0.89x, IQ1_M 0.89x, MXFP4 0.91x, Q2_K
# 0.91x, IQ3_XXS 0.91x, IQ3_S 0.93x, TQ1_0 0.96x (TQ2_0 0.99x, IQ1_S 1.02x: their families' choice).
PLANES_ROWS = 2
PLANES_AHEAD = 8  # rows ahead whose bytes a planes kernel asks for into L2 (see _decode_planes)


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


def _decode_planes(isa, mod, code, name, B=1):
    """decode on the activations' int8 planes (avx512vnni: each format's planes emitter).

    Each unit of 64 weights is dotted with both planes, 64 multiply-adds per vpdpbusd: the high
    plane's sums shifted left by 8 plus the low plane's are the int16 dot. A chunk of 256 elements
    (one K-quant block, eight 32-element blocks) runs on the activations' K-quant layout (core.py's
    quantize writes it for every full chunk): lane i of each of its four units holds elements of
    the run 16i .. 16i + 15, which one scale covers, so the four units' dots sum in two int32
    chains (high and low plane) and are converted and scaled once a chunk with one lane-scale
    vector. A format whose emitter gives plain units (64 consecutive elements; all but
    planes_klayout's Q4_K, Q2_K, Q3_K, Q4_0, Q4_1, IQ4_NL, MXFP4, IQ4_XS) has them transposed onto that layout
    (_klayout_units: ~12 permutes a row and chunk, shared by every token of a B-wide kernel), its
    lane scales taken with the activation scales at 1 (weights only) and multiplied by each
    token's. A zero point z of q comes off in the integer dot there: the low chain starts from -z
    times the activations' 16-element sums (exact). One thread, a hot 1536^2 matrix, against a
    unit at a time: four tokens 0.61-0.97x the time (IQ4_XS 0.61x; Q4_0, IQ4_NL, Q6_K, MXFP4,
    TQ2_0 0.70-0.77x; the IQ3 grids 0.93-0.97x), one token 0.67-1.09x (IQ4_XS 0.67x, IQ4_NL and
    MXFP4 0.81-0.83x; docs/performance.md); the formats whose one token took >= 1.1x (Q5_1,
    IQ2_XS, IQ2_S, IQ1_M) or whose four gained nothing (IQ1_S) keep a unit at a time
    (planes_chunks off). Decode of the Qwen demo (2 threads): tg128 the same, four sequences
    1.17x. The other chunks (a 32-element format's last blocks, in pairs then one) go a unit at a
    time: one conversion and FMA per unit, the zero point off at the end with the activations'
    16-element sums times each 16 elements' scale. Mins (mins_per_group) come on at the end the
    same way. A B-wide kernel takes PLANES_ROWS rows at a time (they share the activation loads),
    the one-token kernel its record's planes_rows. The bytes PLANES_AHEAD rows on are fetched into L2 (prefetcht1): a
    Q4_K kernel read 17.6 -> 33 GB/s from DRAM with 2 threads (docs/performance.md) where
    prefetcht0 two groups ahead filled L1's miss buffers (a C prototype, 16 matrices of 8960 x 1536
    cycled). They are asked for in the order they lie, one stream: two rows' chunks each at its
    own row (two streams a row apart) had a 1.5B-shape file's tg64 at 0.85x (Q4_K; IQ4_XS 0.85x,
    Q4_0 0.91x, Q6_K 0.93x, Q5_0 0.94x, Q8_0 1.0x; two rows at a time then). B tokens
    (DECODE_WIDTHS): one row's units and weight scales serve every token; the emitter is asked
    again per token for what holds the token's activation scales (its unit work there is dead
    code); each token's steps are the one-token kernel's."""
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    w, row_bytes, n_rows, K, _xq, xs_, xf_, out_, xp_, xz_, ldo = fn.args
    rec = U.record(code)
    BL = rec.layout
    U8 = E.PLANES_UNIT
    L = U8 // 4  # i32 lanes of a unit's dot
    wp = ptr_to(bd, w, I8)
    native = rec.planes_klayout  # the emitter's units are already on the K-quant layout
    chunked = native or rec.planes_chunks  # full chunks on the K-quant layout
    toks = []
    for xs, xf, out, xp, xz in _tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_):
        xh = ptr_to(bd, xp, I8)
        xk = bd.gep(xh, [bd.mul(K, c64(2))])  # the K-quant layout's planes
        toks.append((ptr_to(bd, xs, F32T), ptr_to(bd, xf, F32T), ptr_to(bd, out, F32T), xh, bd.gep(xh, [K]),
                     ptr_to(bd, xz, F32T), xk, bd.gep(xk, [K])))
    per = BL.block_elems // G  # 32-element groups per format block
    chunk = E.PLANES_CHUNK // BL.block_elems  # format blocks per main-loop chunk
    assert chunk * BL.block_elems == E.PLANES_KBLOCK
    nb = bd.udiv(K, c64(BL.block_elems))
    n_main = bd.mul(bd.udiv(nb, c64(chunk)), c64(chunk))
    n_pairs = bd.add(n_main, bd.mul(bd.udiv(bd.sub(nb, n_main), c64(2)), c64(2)))
    tails = (2, 1) if chunk > 1 else ()
    zero = rec.planes_zero

    def tile(v, n):
        return v if n == 1 else bd.shuffle_vector(v, v, const(I32, list(range(v.type.count)) * n))

    def rows(r0, R):
        row = [bd.gep(wp, [bd.mul(bd.add(r0, c64(i)), row_bytes)]) for i in range(R)]
        accs = [[Var(bd, splat_c(F32T, 0.0, L)) for _ in range(R)] for _ in toks]
        ahead = bd.mul(row_bytes, c64(PLANES_AHEAD))
        # the min and zero-point sums, one accumulator per chunk size (their lane counts differ): a
        # lane per group (min) or per 16 elements (min_sub16, zero: where a unit goes at a time)
        per_group = {"min": rec.mins_per_group, "zero": 2 * (zero is not None)}
        sizes = {"min": (chunk, *tails), "zero": tails if chunked else (chunk, *tails)}
        sums = [{(k, n): Var(bd, splat_c(F32T, 0.0, n * per * m * R))
                 for k, m in per_group.items() if m for n in sorted(sizes[k])} for _ in toks]

        def step(b0, nblk):
            g = nblk * per  # 32-element groups of the chunk
            e0 = bd.mul(b0, c64(BL.block_elems))
            gi = bd.mul(b0, c64(per))
            nbytes = nblk * BL.block_bytes
            kl = nblk == chunk and chunked  # a full chunk on the K-quant layout
            # the R rows' bytes PLANES_AHEAD rows on, in the order they lie (one stream, not R)
            seq = bd.add(bd.mul(b0, c64(R * BL.block_bytes)), ahead)
            for line in range(0, R * nbytes, 64):
                prefetch(bd, bd.gep(row[0], [bd.add(seq, c64(line))]), 2)
            if kl and not native:  # the rows' units and weight scales, once for every token
                base = U.planes_blocks(code, bd, row, b0, nblk, splat_c(F32T, 1.0, g))
                kunits = [_klayout_units(bd, base.units[i]) for i in range(R)]
                wscales = [_klayout_scales(bd, base.lane_scales[i]) for i in range(R)]
            units = None
            for (xs, xf, _out, xh, xl, xz, xkh, xkl), acc, sm in zip(toks, accs, sums):
                xsv = load(bd, xs, gi, vec(F32T, g))
                blk = U.planes_blocks(code, bd, row, b0, nblk, xsv)
                units = units or (blk.units if native or not kl else kunits)
                ph_, pl_ = (xkh, xkl) if kl else (xh, xl)
                planes = [(load(bd, ph_, bd.add(e0, c64(u * U8)), vec(I8, U8)),
                           load(bd, pl_, bd.add(e0, c64(u * U8)), vec(I8, U8))) for u in range(len(units[0]))]
                if kl:
                    lo0 = splat_c(I32, 0, L)
                    if zero is not None:  # -z * (the activations' sums over each lane's 16 elements)
                        sz = bd.fptosi(load(bd, xz, bd.udiv(e0, c64(16)), vec(F32T, L)), vec(I32, L))
                        lo0 = bd.mul(sz, splat_c(I32, -zero, L))
                    if not native:
                        xsk = bd.shuffle_vector(xsv, xsv, const(I32, [i // 2 for i in range(L)]))
                for i in range(R):
                    a = acc[i].get()
                    if kl:  # the chunk's units in one sum, converted and scaled once (two chains,
                        # high and low plane: one chain of eight vpdpbusd is ~40 cycles long)
                        hi, lo = splat_c(I32, 0, L), lo0
                        for (ph, pl), wu in zip(planes, units[i]):
                            hi, lo = dpb(isa, bd, hi, wu, ph), dpb(isa, bd, lo, wu, pl)
                        isum = bd.add(bd.shl(hi, splat_c(I32, 8, L)), lo)
                        ls = blk.lane_scales[i][0] if native else bd.fmul(wscales[i], xsk)
                        a = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), ls, a)
                    else:
                        for (ph, pl), wu, ls in zip(planes, units[i], blk.lane_scales[i]):
                            hi = dpb(isa, bd, splat_c(I32, 0, L), wu, ph)
                            isum = dpb(isa, bd, bd.shl(hi, splat_c(I32, 8, L)), wu, pl)
                            a = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), ls, a)
                    acc[i].set(a)
                for key, v, x in (("min", blk.min, xz if rec.min_sub16 else xf), ("zero", blk.zero_scale, xz)):
                    if v is not None and (key, nblk) in sm:
                        n = g * per_group[key]
                        xv = load(bd, x, bd.mul(b0, c64(n // nblk)), vec(F32T, n))
                        sm[key, nblk].set(fmuladd(bd, v, tile(xv, R), sm[key, nblk].get()))

        with Loop(bd, 0, n_main, chunk) as b0:
            step(b0, chunk)
        if tails:  # a 32-element format's last blocks: in pairs, then one
            with Loop(bd, n_main, n_pairs, 2) as b0:
                step(b0, 2)
            with Loop(bd, n_pairs, nb) as b0:
                step(b0, 1)
        for (_xs, _xf, out, *_), acc, sm in zip(toks, accs, sums):
            for i in range(R):
                total = hsum(bd, acc[i].get())
                for (key, nblk), var in sm.items():
                    v, n = var.get(), var.get().type.count // R
                    part = hsum(bd, bd.shuffle_vector(v, v, const(I32, range(n * i, n * (i + 1)))))
                    z = ir.Constant(F32T, float(zero or 0))
                    total = bd.fadd(total, part) if key == "min" else bd.fsub(total, bd.fmul(z, part))
                bd.store(total, bd.gep(out, [bd.add(r0, c64(i))]))

    in_steps(bd, n_rows, PLANES_ROWS if B > 1 else rec.planes_rows, rows)
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
    of sums, which spill on AVX2 (one thread, a matrix's time for 4 tokens against 4
    one-token kernels: f16 / bf16 / f32 as 2 + 2 0.79x / 0.61x / 0.74x, on one kernel 0.68x /
    0.78x / 1.12x), so they run 2 at a time."""
    return DECODE_WIDTHS if U.record(code).quant else (2,)


def build_decode(isa, mod, code, name, B=1):
    """A format's decode task kernel `name` for B tokens into mod, on the body its ISA reads: the
    int8 planes (avx512vnni), else the int16 words; a float format's FMAs."""
    body = _decode_float if not U.record(code).quant else _decode_planes if planes_isa(isa) else _decode_words
    _decode_task(mod, body(isa, mod, code, name + "_rows", B), name)


def build_dequant(isa, mod, code, name):
    """A format's exact row decode `name` into mod."""
    (_dequant_quant if U.record(code).quant else _dequant_float)(isa, mod, code, name)
