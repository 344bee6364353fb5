"""The per-format matrix kernels, generated as LLVM IR for one instruction set (llvm.py).

Three kernels per weight format, all `void f(i64, ...)` called by address from numba (matmul.py):

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
      operations a group; the 16 vpmaddwd and the lane sums per 256 elements stay per token). 8
      tokens as one kernel ran no faster than 4 + 4 (its sums spill); 3 tokens on one kernel
      saved 27% over 2 + 1 on Q5_0, but a third width costs another 50% of compile. Float
      formats: 2 tokens a kernel (wide_widths).
  prefill(w, row_bytes, n_rows, K, T, x, xs, xf, out, ldo)
      out[t, r] for T tokens (out row-major with row stride ldo). Rows sit in the lanes of a vector
      (16 on AVX-512, else 8): a task unpacks up to TASK_ROWS rows, KC elements at a time, into a
      stack panel of int16 pairs (`panel[k/2][lane]`), then runs every token over it: for each pair
      of k, one panel vector times the token's int16 pair broadcast, accumulated in int32
      (vpdpwssd: 32 multiply-adds per instruction), converted and scaled once per 32-block. TT
      tokens x RG groups of L rows at a time (tile_shape) keep TT*RG int32 and f32 accumulators in
      registers, so a panel load feeds TT instructions and an activation load RG (on AVX2 in
      inline assembly: _micro_quant_avx2). Float formats: an f32 panel and FMAs, the same tiles
      (on AVX2 in inline assembly too: _micro_float_avx2).
  dequant(row, K, out)
      one row decoded to f32 exactly as the numpy decode in fuelcli/formats (embedding lookups).

Where the CPU has AMX, block-format prefill of amx.AMX_MIN_TOKENS tokens or more runs on its tiles
instead (amx.py: one driver, and per format a panel unpack built on the same block emitters).

Integer ranges: |w| <= 4096 (q6_k with its scale folded in) and |xq| <= 32639, so a pair sum is
below 2^28 and a 32-element block sum below 2^31; the planes kernels' unit sums (q <= 255, 4
elements a lane) stay below 2^25; the words kernels' group sums stay below 2^24, so converting them
is exact (q8_0's, up to 2^27, round once there), q6_k's 16-element sums of q <= 63 below 2^25
before its zero point comes off; q4_k's block sums on the K-quant layout (16 elements a lane, 16 * q
<= 240) stay below 2^28 and round once when converted.
"""

from __future__ import annotations

from functools import lru_cache

from llvmlite import ir

from . import amx
from . import emit as E
from . import unpack as U
from .llvm import ISAS, Isa, compile_module, is_cached, planes_isa
from .core import TASK_ARGS
from .irgen import (F32T, G, I8, I16, I32, I64, Loop, Var, func, call_intrinsic, ptr_to, as_i64, c64, const,
                    dpb, dpw, fmuladd, hadd, hsum, in_steps, load, prefetch, splat, splat_c, transpose,
                    vec)

DECODE_ROWS = 16  # rows of one decode task
DECODE_WIDTHS = (2, 4)  # tokens of the B-wide decode kernels (wide_widths: a format's)
TASK_ROWS = 64  # rows of one prefill task (the driver splits a matrix into tasks of this many rows)
KC = 256  # elements of k unpacked at a time: TASK_ROWS * KC * 2 bytes = 32 KiB of stack panel
KC_FLOAT = 128  # the f32 panel: TASK_ROWS * KC_FLOAT * 4 bytes = 32 KiB
PAIRS = G // 2  # int16 pairs in a 32-element group


def tile_shape(isa: Isa, quant: bool) -> tuple[int, int]:
    """(tokens, groups of L rows) per micro-kernel pass: 2 accumulators each (int32 + f32) and a
    panel vector per group must fit the registers. On AVX-512, 3 tokens x 4 groups (28 registers)
    against 12 x 1: a panel load feeds 3 products and an activation broadcast 4, 7 loads per 12
    vpdpwssd instead of 13; single-thread prefill of 512 tokens on a CPU with 2-cycle 512-bit ops,
    Q4_K / Q6_K / Q5_0 / Q8_0 matrices +4 / +17 / +7 / +12% (medians of 3 interleaved runs)."""
    if isa.lanes == 16:  # f32: one group of rows (more measured no faster there: 80% of the FMA peak)
        return (3, 4) if quant else (24, 1)
    if isa.name == "avx2":
        return ASM_TILE if quant else ASM_FLOAT_TILE
    return (5, 1) if quant else (10, 1)


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
                sv = bd.fmul(ch.scale, bd.shuffle_vector(xsv, xsv, const(I32, [s // 2 for s in E.SUB16_ORDER])))
                if rec.words_zero:  # the weights are q: the zero point times the activations'
                    # 16-element sums comes off, exactly
                    zs = bd.fptosi(load(bd, xz, bd.mul(g0, c64(2)), vec(F32T, 2 * n)), vec(I32, 2 * n))
                    zs = bd.mul(bd.shuffle_vector(zs, zs, const(I32, E.SUB16_ORDER)), splat_c(I32, rec.words_zero, 2 * n))
                for q, part in enumerate(_reduce_groups(isa, bd, P, False)):
                    if rec.words_zero:
                        part = bd.sub(part, bd.shuffle_vector(zs, zs, const(I32, range(8 * q, 8 * q + 8))))
                    a = fmuladd(bd, bd.sitofp(part, vec(F32T, L)), bd.shuffle_vector(sv, sv, const(I32, range(8 * q, 8 * q + 8))), a)
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


PLANES_ROWS = 2  # rows a planes decode kernel dots at once
PLANES_AHEAD = 8  # rows ahead whose bytes a planes kernel asks for into L2 (see _decode_planes)


def _decode_planes(isa, mod, code, name, B=1):
    """decode on the activations' int8 planes (avx512vnni: each format's planes emitter).

    Each unit of 64 weights is dotted with both planes, 64 multiply-adds per vpdpbusd: the high
    plane's sums shifted left by 8 are the accumulator of the low plane's, the same int32 as the
    int16 dot. One conversion and one FMA per unit, with the lane's scale (unpack.planes_blocks), or
    per block where its units share one lane map (a record's planes_klayout: Q4_K, on the activations'
    K-quant layout); two rows at a time share the activation loads and the vector work of their
    scales. The zero point of q comes off at the end: z * sum over 16-element pieces of scale *
    (the activations' sums there). The bytes PLANES_AHEAD rows on are fetched into L2 (prefetcht1):
    a Q4_K kernel read 17.6 -> 33 GB/s from DRAM with 2 threads (docs/performance.md) where
    prefetcht0 two groups ahead filled L1's miss buffers (a C prototype, 16 matrices of 8960 x 1536
    cycled). B tokens (DECODE_WIDTHS): the first token's units serve every token; the emitter is
    asked again per token only for its lane scales (they hold the token's activation scales), and
    its unit work there is dead code; each token's steps are the one-token kernel's."""
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    w, row_bytes, n_rows, K, _xq, xs_, xf_, out_, xp_, xz_, ldo = fn.args
    rec = U.record(code)
    BL = rec.layout
    U8 = E.PLANES_UNIT
    L = U8 // 4  # i32 lanes of a unit's dot
    wp = ptr_to(bd, w, I8)
    shared = rec.planes_klayout  # a block's units share one lane map: the planes' K-quant layout
    toks = []
    for xs, xf, out, xp, xz in _tokens(bd, B, K, ldo, xs_, xf_, out_, xp_, xz_):
        xh = ptr_to(bd, xp, I8)
        if shared:
            xh = bd.gep(xh, [bd.mul(K, c64(2))])
        toks.append((ptr_to(bd, xs, F32T), ptr_to(bd, xf, F32T), ptr_to(bd, out, F32T), xh, bd.gep(xh, [K]),
                     ptr_to(bd, xz, F32T)))
    per = BL.block_elems // G  # 32-element groups per format block
    chunk = E.PLANES_CHUNK // BL.block_elems  # format blocks per main-loop chunk
    nb = bd.udiv(K, c64(BL.block_elems))
    n_main = bd.mul(bd.udiv(nb, c64(chunk)), c64(chunk))
    n_pairs = bd.add(n_main, bd.mul(bd.udiv(bd.sub(nb, n_main), c64(2)), c64(2)))

    def tile(v, n):
        return v if n == 1 else bd.shuffle_vector(v, v, const(I32, list(range(v.type.count)) * n))

    def rows(r0, R):
        row = [bd.gep(wp, [bd.mul(bd.add(r0, c64(i)), row_bytes)]) for i in range(R)]
        accs = [[Var(bd, splat_c(F32T, 0.0, L)) for _ in range(R)] for _ in toks]
        ahead = bd.mul(row_bytes, c64(PLANES_AHEAD))
        # the min and zero-point sums, one accumulator per chunk size (their lane counts differ)
        keys = [k for k, on in (("min", rec.has_min), ("zero", rec.planes_zero is not None)) if on]
        sums = [{(k, n): Var(bd, splat_c(F32T, 0.0, n * per * (2 if k == "zero" else 1) * R))
                 for k in keys for n in sorted({chunk, 2, 1} if chunk > 1 else {1})} for _ in toks]

        def step(b0, nblk):
            g = nblk * per  # 32-element groups of the chunk
            e0 = bd.mul(b0, c64(BL.block_elems))
            gi = bd.mul(b0, c64(per))
            nbytes = nblk * BL.block_bytes
            for i in range(R):
                for line in range(0, nbytes, 64):
                    prefetch(bd, bd.gep(row[i], [bd.add(bd.add(bd.mul(b0, c64(BL.block_bytes)), c64(line)), ahead)]), 2)
            units = None
            for (xs, xf, _out, xh, xl, xz), acc, sm in zip(toks, accs, sums):
                blk = U.planes_blocks(code, bd, row, b0, nblk, load(bd, xs, gi, vec(F32T, g)))
                units = units or blk.units
                planes = [(load(bd, xh, bd.add(e0, c64(u * U8)), vec(I8, U8)),
                           load(bd, xl, bd.add(e0, c64(u * U8)), vec(I8, U8))) for u in range(len(units[0]))]
                for i in range(R):
                    a = acc[i].get()
                    if shared:  # the block's units in one sum, converted and scaled once (two
                        # chains, high and low plane: one chain of eight vpdpbusd is ~40 cycles long)
                        hi, lo = splat_c(I32, 0, L), splat_c(I32, 0, L)
                        for (ph, pl), wu in zip(planes, units[i]):
                            hi, lo = dpb(isa, bd, hi, wu, ph), dpb(isa, bd, lo, wu, pl)
                        isum = bd.add(bd.shl(hi, splat_c(I32, 8, L)), lo)
                        a = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), blk.lane_scales[i][0], a)
                    else:
                        for (ph, pl), wu, ls in zip(planes, units[i], blk.lane_scales[i]):
                            hi = dpb(isa, bd, splat_c(I32, 0, L), wu, ph)
                            isum = dpb(isa, bd, bd.shl(hi, splat_c(I32, 8, L)), wu, pl)
                            a = fmuladd(bd, bd.sitofp(isum, vec(F32T, L)), ls, a)
                    acc[i].set(a)
                for key, v, x, n in (("min", blk.min, xf, g), ("zero", blk.zero_scale, xz, 2 * g)):
                    if v is not None:
                        xv = load(bd, x, bd.mul(b0, c64(n // nblk)), vec(F32T, n))
                        sm[key, nblk].set(fmuladd(bd, v, tile(xv, R), sm[key, nblk].get()))

        with Loop(bd, 0, n_main, chunk) as b0:
            step(b0, chunk)
        if chunk > 1:  # a 32-element format's last blocks: in pairs, then one
            with Loop(bd, n_main, n_pairs, 2) as b0:
                step(b0, 2)
            with Loop(bd, n_pairs, nb) as b0:
                step(b0, 1)
        for (_xs, _xf, out, _xh, _xl, _xz), acc, sm in zip(toks, accs, sums):
            for i in range(R):
                total = hsum(bd, acc[i].get())
                for (key, nblk), var in sm.items():
                    v, n = var.get(), var.get().type.count // R
                    part = hsum(bd, bd.shuffle_vector(v, v, const(I32, range(n * i, n * (i + 1)))))
                    zero = ir.Constant(F32T, float(rec.planes_zero or 0))
                    total = bd.fadd(total, part) if key == "min" else bd.fsub(total, bd.fmul(zero, part))
                bd.store(total, bd.gep(out, [bd.add(r0, c64(i))]))

    in_steps(bd, n_rows, PLANES_ROWS, rows)
    bd.ret_void()
    return fn


def _unpack_panel(isa, bd, code, wp, row_bytes, n_rows, k0, kc, panel, scales, mins):
    """Rows [0, n_rows) of the task, elements [k0, k0+kc): the int16 pairs of row g*L + lane to
    panel[g][(b*PAIRS + p)*L + lane] (b the 32-block in the chunk), scale/min to [g][b*L + lane].
    Each group of L rows is decoded row by row into a row-major stage, then transposed L x L with
    shuffles (storing one pair at a time took 40% of a 39-token prefill). Lanes past n_rows get
    zeros (their results are never stored)."""
    L, BL = isa.lanes, U.record(code).layout
    per = BL.block_elems // G
    nb = kc // G if isinstance(kc, int) else bd.udiv(kc, c64(G))
    ngroups = TASK_ROWS // L
    vp, vl = vec(I32, PAIRS), vec(I32, L)
    with bd.goto_entry_block():
        stage = bd.alloca(vp, c64(L * (KC // G)))  # [lane][b]
    stage.align = 64
    panel = bd.bitcast(panel, vl.as_pointer())
    fb0 = bd.udiv(k0, c64(BL.block_elems))
    with Loop(bd, 0, ngroups) as g:
        pg = bd.gep(panel, [bd.mul(g, c64(KC // G * PAIRS))])
        sg = bd.gep(scales, [bd.mul(g, c64(KC // G * L))])
        mg = bd.gep(mins, [bd.mul(g, c64(KC // G * L))]) if mins is not None else None
        with Loop(bd, 0, L) as lane:
            rr = bd.add(bd.mul(g, c64(L)), lane)
            srow = bd.mul(lane, c64(KC // G))

            def put(b, pairs, scale, mn):
                bd.store(pairs, bd.gep(stage, [bd.add(srow, b)]), align=64)
                at = bd.add(bd.mul(b, c64(L)), lane)
                bd.store(scale, bd.gep(sg, [at]))
                if mg is not None:
                    bd.store(mn, bd.gep(mg, [at]))

            with bd.if_else(bd.icmp_signed("<", rr, n_rows)) as (then, otherwise):
                with then:
                    row = bd.gep(wp, [bd.mul(rr, row_bytes)])
                    with Loop(bd, 0, bd.udiv(as_i64(kc), c64(BL.block_elems))) as fbi:
                        blk = U.block(code, bd, row, bd.add(fb0, fbi))
                        for j, w in enumerate(blk.w):
                            jj = ir.Constant(I32, j)
                            put(bd.add(bd.mul(fbi, c64(per)), c64(j)), bd.bitcast(w, vp),
                                bd.extract_element(blk.scale, jj),
                                bd.extract_element(blk.min, jj) if mg is not None else None)
                with otherwise:
                    with Loop(bd, 0, nb) as b:
                        put(b, splat_c(I32, 0, PAIRS), ir.Constant(F32T, 0.0), ir.Constant(F32T, 0.0))
        with Loop(bd, 0, nb) as b:
            rows = [bd.load(bd.gep(stage, [bd.add(c64(lane * (KC // G)), b)]), align=64) for lane in range(L)]
            # L x PAIRS -> PAIRS x L: one L x L transpose per L pairs
            cols = []
            for p0 in range(0, PAIRS, L):
                part = [r if L == PAIRS else bd.shuffle_vector(r, r, const(I32, range(p0, p0 + L))) for r in rows]
                cols += transpose(bd, part)
            for p, v in enumerate(cols):
                bd.store(v, bd.gep(pg, [bd.add(bd.mul(b, c64(PAIRS)), c64(p))]), align=4 * L)


def _lane_mask(bd, nvalid, L):
    return bd.icmp_signed("<", const(I64, range(L)), splat(bd, nvalid, L))


def _load_out(bd, out, mask, L, first):
    """The running sums of one token's L outputs (lanes past the matrix masked off): zero on the
    first chunk of k, else read back."""
    zero = splat_c(F32T, 0.0, L)
    vt = vec(F32T, L)
    got = call_intrinsic(bd, f"llvm.masked.load.v{L}f32.p0", vt,
                     [bd.bitcast(out, vt.as_pointer()), ir.Constant(I32, 4), mask, zero])
    return bd.select(first, zero, got)


def _store_out(bd, out, v, mask, L):
    vt = vec(F32T, L)
    call_intrinsic(bd, f"llvm.masked.store.v{L}f32.p0", ir.VoidType(),
               [v, bd.bitcast(out, vt.as_pointer()), ir.Constant(I32, 4), mask])


def _micro_quant(isa, mod, has_min, TT, RG, name):
    """The token-tile kernel: TT tokens x RG groups of L rows (consecutive panel groups) over nb
    32-blocks (has_min: each with a min times the activations' block sum). A panel load feeds TT
    products, an activation broadcast RG."""
    L = isa.lanes
    fn, bd = func(mod, name, 13)
    fn.linkage = "internal"
    fn.attributes.add("noinline")  # large: called from several places, never copied
    panel_, sc_, mn_, nb, xq_, ldx, xs_, xf_, ldxs, out_, ldo, first_, nvalid = fn.args
    panel, sc, mn = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, sc_, vec(F32T, L)), ptr_to(bd, mn_, vec(F32T, L))
    xq, xs, xf, out = ptr_to(bd, xq_, I16), ptr_to(bd, xs_, F32T), ptr_to(bd, xf_, F32T), ptr_to(bd, out_, F32T)
    first = bd.icmp_signed("!=", first_, c64(0))
    gstride = KC // G  # vectors of one group's panel pairs (x PAIRS) and scales
    masks = [_lane_mask(bd, bd.sub(nvalid, c64(r * L)), L) for r in range(RG)]
    outp = [[bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]) for r in range(RG)] for t in range(TT)]
    accs = [[Var(bd, _load_out(bd, outp[t][r], masks[r], L, first)) for r in range(RG)] for t in range(TT)]
    xrow = [bd.gep(xq, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    srow = [bd.mul(c64(t), ldxs) for t in range(TT)]
    with Loop(bd, 0, nb) as b:
        isums = [[splat_c(I32, 0, L)] * RG for _ in range(TT)]
        for p in range(PAIRS):
            wv = [bd.load(bd.gep(panel, [bd.add(bd.mul(bd.add(b, c64(r * gstride)), c64(PAIRS)), c64(p))]), align=4)
                  for r in range(RG)]
            k = bd.add(bd.mul(b, c64(G)), c64(2 * p))
            for t in range(TT):
                xv = splat(bd, load(bd, bd.bitcast(bd.gep(xrow[t], [k]), I32.as_pointer()), c64(0), I32, align=2), L)
                for r in range(RG):
                    isums[t][r] = dpw(isa, bd, isums[t][r], wv[r], xv)
        d = [bd.load(bd.gep(sc, [bd.add(b, c64(r * gstride))]), align=4) for r in range(RG)]
        m = [bd.load(bd.gep(mn, [bd.add(b, c64(r * gstride))]), align=4) for r in range(RG)] if has_min else None
        for t in range(TT):
            xst = splat(bd, bd.load(bd.gep(xs, [bd.add(srow[t], b)])), L)
            xft = splat(bd, bd.load(bd.gep(xf, [bd.add(srow[t], b)])), L) if has_min else None
            for r in range(RG):
                a = fmuladd(bd, bd.sitofp(isums[t][r], vec(F32T, L)), bd.fmul(d[r], xst), accs[t][r].get())
                if has_min:
                    a = fmuladd(bd, m[r], xft, a)
                accs[t][r].set(a)
    for t in range(TT):
        for r in range(RG):
            _store_out(bd, outp[t][r], accs[t][r].get(), masks[r], L)
    bd.ret_void()
    return fn


ASM_TILE = (3, 2)  # the AVX2 micro-kernel's tokens x groups of 8 rows (_micro_quant_avx2)


def _asm_tile_sums(bd, fn, masked, out_, ldo, first_, nvalid, TT, RG):
    """The start of an AVX2 assembly tile of TT tokens x RG groups of 8 rows: a tile with rows past
    the matrix goes to `masked`, the IR version (the same arguments), and returns; else -> (where the
    TT * RG f32 sums go, token-major; the sums: zero on the first chunk of k, else read back)."""
    L = ISAS["avx2"].lanes
    with bd.if_then(bd.icmp_signed("<", nvalid, c64(RG * L))):
        bd.call(masked, list(fn.args))
        bd.ret_void()
    out = ptr_to(bd, out_, F32T)
    vt = vec(F32T, L)
    first = bd.icmp_signed("!=", first_, c64(0))
    outp = [bd.bitcast(bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]), vt.as_pointer())
            for t in range(TT) for r in range(RG)]
    return outp, [Var(bd, bd.select(first, splat_c(F32T, 0.0, L), bd.load(p, align=4))) for p in outp]


def _asm_block(has_min):
    """The AT&T text of one 32-block of the AVX2 micro-kernel: 3 tokens x 2 groups of 8 rows.
    Operands: $0-$5 the f32 sums (token t, group r: $(2t + r); $6-$11 the same, tied), $12 the
    block's panel (group 1 PANEL_GROUP bytes on), $13 the token-0 activations (int16 pairs), $14
    their row stride in bytes, $15 / $16 the groups' scales / mins (group 1 SCALE_GROUP bytes on),
    $17 / $18 token 0's activation scale / sum, $19 their row stride in bytes. The int32 sums are
    ymm0-5, the panel vectors ymm6-7, the broadcast ymm8, a product ymm9."""
    x = ["($13)", "($13,$14)", "($13,$14,2)"]
    sx = lambda base, t: [f"({base})", f"({base},$19)", f"({base},$19,2)"][t]  # noqa: E731
    lines = []
    for p in range(PAIRS):
        lines += [f"vmovdqa {32 * p}($12), %ymm6", f"vmovdqa {PANEL_GROUP + 32 * p}($12), %ymm7"]
        for t in range(3):
            lines.append(f"vpbroadcastd {4 * p}{x[t]}, %ymm8")
            for r in range(2):
                acc = f"%ymm{2 * t + r}"
                if p == 0:  # the first pair starts the sums
                    lines.append(f"vpmaddwd %ymm8, %ymm{6 + r}, {acc}")
                else:
                    lines += [f"vpmaddwd %ymm8, %ymm{6 + r}, %ymm9", f"vpaddd %ymm9, {acc}, {acc}"]
    for t in range(3):  # f32 sum += int32 sum * (weight scale * activation scale) (+ min * activation sum)
        lines.append(f"vbroadcastss {sx('$17', t)}, %ymm8")
        for r in range(2):
            lines += [f"vcvtdq2ps %ymm{2 * t + r}, %ymm{2 * t + r}", f"vmulps {SCALE_GROUP * r}($15), %ymm8, %ymm6",
                      f"vfmadd231ps %ymm{2 * t + r}, %ymm6, ${2 * t + r}"]
        if has_min:
            lines.append(f"vbroadcastss {sx('$18', t)}, %ymm8")
            lines += [f"vfmadd231ps {SCALE_GROUP * r}($16), %ymm8, ${2 * t + r}" for r in range(2)]
    return "\n".join(lines)


def _micro_quant_avx2(mod, has_min, name, masked):
    """The AVX2 token-tile kernel, ASM_TILE, in inline assembly: LLVM reordered the IR version's
    steps and spilled its sums (16 vector registers hold 6 int32 and 6 f32 sums, 2 panel vectors,
    a broadcast and a product). Same arguments as _micro_quant; a tile with rows past the matrix
    goes to `masked`, the IR version."""
    isa = ISAS["avx2"]
    L = isa.lanes
    fn, bd = func(mod, name, 13)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, sc_, mn_, nb, xq_, ldx, xs_, xf_, ldxs, out_, ldo, first_, nvalid = fn.args
    outp, sums = _asm_tile_sums(bd, fn, masked, out_, ldo, first_, nvalid, *ASM_TILE)
    vt = vec(F32T, L)
    ty = ir.FunctionType(ir.LiteralStructType([vt] * 6), [vt] * 6 + [I64] * 8)
    clobbers = ",".join(f"~{{xmm{i}}}" for i in range(10))
    asm = ir.InlineAsm(ty, _asm_block(has_min), "=x,=x,=x,=x,=x,=x,0,1,2,3,4,5," + "r," * 8 + clobbers + ",~{memory}")
    with Loop(bd, 0, nb) as b:
        args = [bd.add(panel_, bd.mul(b, c64(PAIRS * L * 4))), bd.add(xq_, bd.mul(b, c64(2 * G))), bd.mul(ldx, c64(2)),
                bd.add(sc_, bd.mul(b, c64(4 * L))), bd.add(mn_, bd.mul(b, c64(4 * L))),
                bd.add(xs_, bd.mul(b, c64(4))), bd.add(xf_, bd.mul(b, c64(4))), bd.mul(ldxs, c64(4))]
        got = bd.call(asm, [v.get() for v in sums] + args)
        for i, v in enumerate(sums):
            v.set(bd.extract_value(got, i))
    for p, v in zip(outp, sums):
        bd.store(v.get(), p, align=4)
    bd.ret_void()
    return fn


PANEL_GROUP = KC // G * PAIRS * 8 * 4  # bytes between two 8-row groups of the panel (AVX2)
SCALE_GROUP = KC // G * 8 * 4  # bytes between their scales


def _unpack_quant(isa, mod, code, name):
    """unpack(w, row_bytes, n_rows, k0, kc, panel, scales, mins): one chunk of a task's panel."""
    fn, bd = func(mod, name, 8)
    w, row_bytes, n_rows, k0, kc, panel_, scales_, mins_ = fn.args
    mins = ptr_to(bd, mins_, F32T) if U.record(code).has_min else None
    _unpack_panel(isa, bd, code, ptr_to(bd, w, I8), row_bytes, n_rows, k0, kc, ptr_to(bd, panel_, I32),
                  ptr_to(bd, scales_, F32T), mins)
    bd.ret_void()


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


def _prefill_task(mod, driver, name, rows=TASK_ROWS):
    """prefill task: rows [task*rows, ...) of (unpack, w, n_rows, row_bytes, K, T, x, xs, xf, out)."""
    fn, bd = func(mod, name, TASK_ARGS)
    task, unpack, w, n_rows, row_bytes, K, T, x, xs, xf, out = fn.args[:11]
    r0 = bd.mul(task, c64(rows))
    nr = bd.sub(n_rows, r0)
    nr = bd.select(bd.icmp_signed(">", nr, c64(rows)), c64(rows), nr)
    bd.call(driver, [unpack, bd.add(w, bd.mul(r0, row_bytes)), row_bytes, nr, K, T, x, xs, xf,
                     bd.add(out, bd.mul(r0, c64(4))), n_rows])
    bd.ret_void()


def _panel_driver(isa, mod, name, kc_max, panel_ty, panel_elems, micro, quant):
    """prefill(unpack, w, row_bytes, n_rows, K, T, x, xs, xf, out, ldo): for each chunk of k, the
    format's `unpack` (called by address) fills the stack panel, then every token tile runs over it
    (micro[tokens, groups]: TT tokens x RG groups of rows, a task's last groups and tokens singly)."""
    L = isa.lanes
    TT, RG = tile_shape(isa, quant)
    fn, bd = func(mod, name, 11)
    fn.linkage = "internal"
    unpack_, w, row_bytes, n_rows, K, T, x_, xs_, xf_, out_, ldo = fn.args
    ngroups = TASK_ROWS // L
    nsc = kc_max // G * L  # scales of one group
    with bd.goto_entry_block():
        panel = bd.alloca(panel_ty, c64(ngroups * panel_elems))
        scales = bd.alloca(F32T, c64(ngroups * nsc))
        mins = bd.alloca(F32T, c64(ngroups * nsc))
    panel.align = scales.align = mins.align = 64
    unpack = bd.inttoptr(unpack_, ir.FunctionType(ir.VoidType(), [I64] * 8).as_pointer())
    nbk = bd.udiv(K, c64(G))  # row stride of xs / xf
    xbytes = 2 if quant else 4
    with Loop(bd, 0, K, kc_max) as k0:
        kc = bd.select(bd.icmp_signed("<", bd.sub(K, k0), c64(kc_max)), bd.sub(K, k0), c64(kc_max))
        bd.call(unpack, [w, row_bytes, n_rows, k0, kc, bd.ptrtoint(panel, I64), bd.ptrtoint(scales, I64),
                         bd.ptrtoint(mins, I64)])
        first = bd.zext(bd.icmp_signed("==", k0, c64(0)), I64)
        b0 = bd.udiv(k0, c64(G))

        ngv = bd.udiv(bd.add(n_rows, c64(L - 1)), c64(L))  # groups holding rows
        n_rg = bd.mul(bd.udiv(ngv, c64(RG)), c64(RG))

        def tile(t0, tt):
            def groups(g, rg):
                gl = bd.mul(g, c64(L))
                nvalid = bd.sub(n_rows, gl)
                nv = bd.select(bd.icmp_signed(">", nvalid, c64(L * rg)), c64(L * rg), nvalid)
                xp = bd.add(x_, bd.mul(bd.add(bd.mul(t0, K), k0), c64(xbytes)))
                op = bd.add(out_, bd.mul(bd.add(bd.mul(t0, ldo), gl), c64(4)))
                pp = bd.ptrtoint(bd.gep(panel, [bd.mul(g, c64(panel_elems))]), I64)
                if quant:
                    so = bd.mul(bd.add(bd.mul(t0, nbk), b0), c64(4))
                    args = [pp, bd.ptrtoint(bd.gep(scales, [bd.mul(g, c64(nsc))]), I64),
                            bd.ptrtoint(bd.gep(mins, [bd.mul(g, c64(nsc))]), I64), bd.udiv(kc, c64(G)),
                            xp, K, bd.add(xs_, so), bd.add(xf_, so), nbk, op, ldo, first, nv]
                else:
                    args = [pp, kc, xp, K, op, ldo, first, nv]
                bd.call(micro[tt, rg], args)

            with Loop(bd, 0, n_rg, RG) as g:
                groups(g, RG)
            if RG > 1:
                with Loop(bd, n_rg, ngv) as g:
                    groups(g, 1)

        n_main = bd.mul(bd.udiv(T, c64(TT)), c64(TT))
        with Loop(bd, 0, n_main, TT) as t0:
            tile(t0, TT)
        with Loop(bd, n_main, T) as t0:
            tile(t0, 1)
    bd.ret_void()
    return fn


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


def _micro_float(isa, mod, TT, RG, name):
    """The f32 token-tile kernel: TT tokens x RG groups of L rows (consecutive panel groups) over
    kc elements; a panel load feeds TT FMAs, a broadcast RG."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, kc, x_, ldx, out_, ldo, first_, nvalid = fn.args
    panel, x, out = ptr_to(bd, panel_, vec(F32T, L)), ptr_to(bd, x_, F32T), ptr_to(bd, out_, F32T)
    first = bd.icmp_signed("!=", first_, c64(0))
    masks = [_lane_mask(bd, bd.sub(nvalid, c64(r * L)), L) for r in range(RG)]
    outp = [[bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]) for r in range(RG)] for t in range(TT)]
    accs = [[Var(bd, _load_out(bd, outp[t][r], masks[r], L, first)) for r in range(RG)] for t in range(TT)]
    xrow = [bd.gep(x, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    with Loop(bd, 0, kc) as k:
        wv = [bd.load(bd.gep(panel, [bd.add(k, c64(r * KC_FLOAT))]), align=4) for r in range(RG)]
        for t in range(TT):
            xv = splat(bd, bd.load(bd.gep(xrow[t], [k])), L)
            for r in range(RG):
                accs[t][r].set(fmuladd(bd, wv[r], xv, accs[t][r].get()))
    for t in range(TT):
        for r in range(RG):
            _store_out(bd, outp[t][r], accs[t][r].get(), masks[r], L)
    bd.ret_void()
    return fn


ASM_FLOAT_TILE = (6, 2)  # the AVX2 f32 micro-kernel's tokens x groups of 8 rows (_micro_float_avx2)
ASM_FLOAT_STEPS = 4  # elements of k per pass of its assembly text
FLOAT_PANEL_GROUP = KC_FLOAT * 8 * 4  # bytes between two 8-row groups of the f32 panel (AVX2)


def _asm_float(steps):
    """The AT&T text of `steps` elements of k of the AVX2 f32 micro-kernel, 6 tokens x 2 groups of 8
    rows. Operands: $0-$11 the sums (token t, group r: $(2t + r); $12-$23 the same, tied), $24 the
    panel at k (group 1 FLOAT_PANEL_GROUP bytes on), $25 / $26 tokens 0 / 3 at k, $27 the tokens'
    row stride in bytes. The panel vectors are ymm13-14, the broadcast ymm15."""
    x = ["($25)", "($25,$27)", "($25,$27,2)", "($26)", "($26,$27)", "($26,$27,2)"]
    lines = []
    for u in range(steps):
        lines += [f"vmovaps {32 * u}($24), %ymm13", f"vmovaps {FLOAT_PANEL_GROUP + 32 * u}($24), %ymm14"]
        for t in range(6):
            lines.append(f"vbroadcastss {4 * u}{x[t]}, %ymm15")
            lines += [f"vfmadd231ps %ymm{13 + r}, %ymm15, ${2 * t + r}" for r in range(2)]
    return "\n".join(lines)


def _micro_float_avx2(mod, name, masked):
    """The AVX2 f32 token-tile kernel, ASM_FLOAT_TILE, in inline assembly: per element of k 2 panel
    loads, 6 broadcasts and 12 FMAs, the sums in registers. LLVM's code for the IR version (10 tokens
    x 1 group) ran a broadcast per FMA, register copies and an address computation per token: 26
    GMAC/s a thread of the core's 48 (two 256-bit FMAs a cycle). Same arguments as _micro_float, the
    same FMAs in the same order (so the same sums, bit for bit); a tile with rows past the matrix
    goes to `masked`, the IR version."""
    L = ISAS["avx2"].lanes
    fn, bd = func(mod, name, 8)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, kc, x_, ldx, out_, ldo, first_, nvalid = fn.args
    outp, sums = _asm_tile_sums(bd, fn, masked, out_, ldo, first_, nvalid, *ASM_FLOAT_TILE)
    vt = vec(F32T, L)
    n = len(sums)
    ty = ir.FunctionType(ir.LiteralStructType([vt] * n), [vt] * n + [I64] * 4)
    cons = ",".join(["=x"] * n + [str(i) for i in range(n)] + ["r"] * 4 + ["~{xmm13}", "~{xmm14}", "~{xmm15}", "~{memory}"])
    ldxb = bd.mul(ldx, c64(4))
    x3 = bd.add(x_, bd.mul(ldxb, c64(3)))

    def run(k, asm):
        kb = bd.mul(k, c64(4))
        got = bd.call(asm, [v.get() for v in sums] + [bd.add(panel_, bd.mul(kb, c64(L))), bd.add(x_, kb), bd.add(x3, kb), ldxb])
        for i, v in enumerate(sums):
            v.set(bd.extract_value(got, i))

    S = ASM_FLOAT_STEPS
    k_main = bd.mul(bd.udiv(kc, c64(S)), c64(S))
    with Loop(bd, 0, k_main, S) as k:
        run(k, ir.InlineAsm(ty, _asm_float(S), cons))
    with Loop(bd, k_main, kc) as k:
        run(k, ir.InlineAsm(ty, _asm_float(1), cons))
    for p, v in zip(outp, sums):
        bd.store(v.get(), p, align=4)
    bd.ret_void()
    return fn


def _unpack_float(isa, mod, code, name):
    """unpack(w, row_bytes, n_rows, k0, kc, panel, -, -): panel[g][k][lane] = W[g*L + lane, k0 + k],
    L elements of each of a group's L rows decoded at once and transposed with shuffles (the last
    kc % L one at a time); lanes past n_rows get zeros."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    w, row_bytes, n_rows, k0, kc, panel_, _s, _m = fn.args
    wp, panel = ptr_to(bd, w, I8), ptr_to(bd, panel_, F32T)
    vt = vec(F32T, L)
    kv = bd.mul(bd.udiv(kc, c64(L)), c64(L))
    with Loop(bd, 0, TASK_ROWS // L) as g:
        pg = bd.gep(panel, [bd.mul(g, c64(KC_FLOAT * L))])
        lanes = []
        for lane in range(L):
            rr = bd.add(bd.mul(g, c64(L)), c64(lane))
            valid = bd.icmp_signed("<", rr, n_rows)
            lanes.append((bd.gep(wp, [bd.mul(bd.select(valid, rr, c64(0)), row_bytes)]), valid))
        with Loop(bd, 0, kv, L) as k:
            rows = [bd.select(valid, U.floats(code, bd, row, bd.add(k0, k), L), splat_c(F32T, 0.0, L))
                    for row, valid in lanes]
            for j, v in enumerate(transpose(bd, rows)):
                bd.store(v, bd.bitcast(bd.gep(pg, [bd.mul(bd.add(k, c64(j)), c64(L))]), vt.as_pointer()), align=4 * L)
        with Loop(bd, kv, kc) as k:
            for lane, (row, valid) in enumerate(lanes):
                v = bd.extract_element(U.floats(code, bd, row, bd.add(k0, k), 1), ir.Constant(I32, 0))
                bd.store(bd.select(valid, v, ir.Constant(F32T, 0.0)), bd.gep(pg, [bd.add(bd.mul(k, c64(L)), c64(lane))]))
    bd.ret_void()


def _dequant_float(isa, mod, code, name):
    fn, bd = func(mod, name, 3)
    row_, K, out_ = fn.args
    row, out = ptr_to(bd, row_, I8), ptr_to(bd, out_, F32T)
    with Loop(bd, 0, K) as k:
        v = U.floats(code, bd, row, k, 1, exact=True)
        bd.store(bd.extract_element(v, ir.Constant(I32, 0)), bd.gep(out, [k]))
    bd.ret_void()


# ------------------------------------------------------------------ modules, compiled on demand

KINDS = ("decode", "unpack", "dequant")


def format_module(code: int, isa: Isa) -> tuple[ir.Module, list[str]]:
    """The IR module of one format's kernels for one ISA (decode, panel unpack, exact dequant)."""
    from ...formats import BY_CODE

    fmt = BY_CODE[code].name
    mod = ir.Module(name=f"fuel_{fmt}_{isa.name}")
    names = [f"fuel_{k}_{fmt}_{isa.name}" for k in KINDS]
    if not U.record(code).quant:
        _decode_task(mod, _decode_float(isa, mod, code, names[0] + "_rows"), names[0])
        _unpack_float(isa, mod, code, names[1])
        _dequant_float(isa, mod, code, names[2])
    else:
        decode = _decode_planes if planes_isa(isa) else _decode_words
        _decode_task(mod, decode(isa, mod, code, names[0] + "_rows"), names[0])
        _unpack_quant(isa, mod, code, names[1])
        _dequant_quant(isa, mod, code, names[2])
    return mod, names


def wide_module(code: int, isa: Isa, widths=None) -> tuple[ir.Module, list[str]]:
    """One format's B-wide decode task kernels, one per width of DECODE_WIDTHS: a module of its own,
    compiled only for engines that carry several sequences."""
    from ...formats import BY_CODE

    fmt = BY_CODE[code].name
    mod = ir.Module(name=f"fuel_wide_{fmt}_{isa.name}")
    decode = _decode_float if not U.record(code).quant else _decode_planes if planes_isa(isa) else _decode_words
    names = []
    for B in widths or wide_widths(code):
        names.append(f"fuel_decode{B}_{fmt}_{isa.name}")
        _decode_task(mod, decode(isa, mod, code, names[-1] + "_rows", B), names[-1])
    return mod, names


def amx_module(code: int, isa: Isa) -> tuple[ir.Module, list[str]]:
    """One format's AMX panel unpack (amx.py)."""
    from ...formats import BY_CODE

    name = f"fuel_unpack_amx_{BY_CODE[code].name}_{isa.name}"
    mod = ir.Module(name=name)
    amx.unpack_task(mod, code, name)
    return mod, [name]



def driver_module(kind: str, isa: Isa) -> tuple[ir.Module, list[str]]:
    """A prefill driver and its micro-kernels: shared by every format of its kind (the AMX driver
    module also holds the activation split)."""
    mod = ir.Module(name=f"fuel_prefill_{kind}_{isa.name}")
    name = f"fuel_prefill_{kind}_{isa.name}"
    if kind == "amx":
        _prefill_task(mod, amx.driver(mod, name + "_rows"), name, amx.ROWS)
        amx.split_task(mod, name + "_split")
        return mod, [name, name + "_split"]
    if kind == "float":
        tt, rg = tile_shape(isa, False)
        micro = {(n, g): _micro_float(isa, mod, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
        if isa.name == "avx2":
            micro[tt, rg] = _micro_float_avx2(mod, f"{name}_asm", micro[tt, rg])
        driver = _panel_driver(isa, mod, name + "_rows", KC_FLOAT, F32T, KC_FLOAT * isa.lanes, micro, False)
    else:
        has_min = kind == "quant_min"
        tt, rg = tile_shape(isa, True)
        micro = {(n, g): _micro_quant(isa, mod, has_min, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
        if isa.name == "avx2":
            micro[tt, rg] = _micro_quant_avx2(mod, has_min, f"{name}_asm", micro[tt, rg])
        driver = _panel_driver(isa, mod, name + "_rows", KC, I32, KC // 2 * isa.lanes, micro, True)
    _prefill_task(mod, driver, name)
    return mod, [name]


def driver_kind(code: int) -> str:
    return U.record(code).driver_kind


def _module_name(which: str, key) -> str:
    return f"{which}-{key}"


_BUILDERS = {"format": format_module, "driver": driver_module, "amx": amx_module, "wide": wide_module}


@lru_cache(maxsize=None)
def _compiled(which: str, key, isa: Isa) -> tuple:
    got = compile_module(_module_name(which, key), lambda: _BUILDERS[which](key, isa), isa)
    return tuple(got.values())


def addresses(code: int, isa: Isa) -> tuple[int, int, int, int]:
    """(decode, prefill driver, unpack, dequant) addresses for one format, compiled or loaded once."""
    decode, unpack, dequant = _compiled("format", code, isa)
    (prefill,) = _compiled("driver", driver_kind(code), isa)
    return decode, prefill, unpack, dequant


def wide_widths(code: int) -> tuple:
    """The widths of a format's B-wide decode kernels: a float format's 4 tokens keep 16 vectors
    of sums, which spill on AVX2 (one thread, a matrix's time for 4 tokens against 4
    one-token kernels: f16 / bf16 / f32 as 2 + 2 0.79x / 0.61x / 0.74x, on one kernel 0.68x /
    0.78x / 1.12x), so they run 2 at a time."""
    return DECODE_WIDTHS if U.record(code).quant else (2,)


def wide_addresses(code: int, isa: Isa) -> tuple:
    """A format's B-wide decode task kernels by DECODE_WIDTHS (0 for a width it has none of)."""
    got = dict(zip(wide_widths(code), _compiled("wide", code, isa)))
    return tuple(got.get(B, 0) for B in DECODE_WIDTHS)


def amx_addresses(code: int, isa: Isa) -> tuple[int, int]:
    """(AMX prefill driver, the block format's AMX panel unpack): amx.py."""
    assert amx.permitted(), "AMX kernels without the OS's permission"
    (unpack,) = _compiled("amx", code, isa)
    return _compiled("driver", "amx", isa)[0], unpack


def amx_split(isa: Isa) -> int:
    """The address of the AMX activation split (amx.split_task)."""
    assert amx.permitted(), "AMX kernels without the OS's permission"
    return _compiled("driver", "amx", isa)[1]


def cached(codes, isa: Isa, use_amx: bool = False) -> bool:
    """Whether every kernel module the formats in `codes` need is in the on-disk cache."""
    names = [_module_name("format", c) for c in codes]
    names += [_module_name("driver", k) for k in {driver_kind(c) for c in codes}]
    on_amx = {c for c in codes if use_amx and is_quant(c)}
    names += [_module_name("amx", c) for c in on_amx] + [_module_name("driver", "amx")] * bool(on_amx)
    return all(is_cached(n, isa) for n in names)


def is_quant(code: int) -> bool:
    return U.record(code).quant
