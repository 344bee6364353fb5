"""Prefill with 8-bit activations (`--activations q8`): on avx512vnni vpdpbusd, 64 multiply-adds an
instruction where the int16 tiles' vpdpwssd do 32; on avxvnni the same on ymm; on avx2 vpmaddubsw +
vpmaddwd (_dot). One description for every width: the lanes are the ISA's (16 or 8 rows a vector).

The same driver as the int16 tiles (kernels_prefill._panel_driver: a task's rows unpacked a chunk
of k at a time into a stack panel, token tiles of TT x RG groups of L rows over it) with another
panel and micro-kernel. The panel holds the format's block emitter's integer weights (the int16
tiles' own unpacking) as signed bytes, four consecutive k of a row in each i32 lane
(`panel[b][quad][lane]`), and per 32-block and row -128 times the sum of its weights. The
micro-kernel takes each token's 8-bit values (|q| <= 127) plus 128 (unsigned bytes: vpdpbusd
multiplies unsigned by signed): packed by chunks once per matrix input where `chunked`, else
converted from xq in the tile. So a block's sums start from -128 * sum(w): the integer dot of w
and q, exactly; then the scales and mins as the int16 tiles do.

Where a format's scales are per 16 elements (the record's words_sub16: Q3_K, Q6_K and the i-quants
with 16-element scales), the int16 tiles take weights with those scales folded in; here the panel
takes the exact decode's small weights and scales (Block.exact) instead, and the micro-kernel sums
and scales each 16-element half on its own (kind "quant16": the second scale where the mins go).
Q2_K (kind "quant_min16": a min per 16 elements) takes the int16 tiles' weights, its sub-block scales
folded in (q * sc <= 45 fits a byte), and its two mins a block times each half's activation sum (the
16-element sums of xq, xz, times the block's activation scale), as the int16 tiles do.
On q8_k activations (one scale per 256 elements) the K- and i-quants take kernels_prefill_q8_ksum's
tiles instead on avx512vnni and avxvnni: a super-block's integer sums, converted once.

vpmaddubsw (avx2) sums two u8 x s8 products into int16 with saturation: x + 128 (up to 255) against
|w| > 64 could pass 32767. So avx2 takes the q8 tiles only for the formats whose weights are small
enough for runs of MIN_RUN quads or more (run_of: their pair sums add up as int16 before one
vpmaddwd; kernels_prefill_q8_avx2's assembly; the IR tile, there only a matrix's edge, pair by
pair); the others (Q8_0, the IQ4s and IQ2s, Q5_K, Q6_K...) keep the int16 tiles on the 8-bit values
(the same integers). llama.cpp's sign trick (vpsignb / vpabsb: never saturated) was modelled at
0.85-1.05x the int16 tile and measured slower than it (docs/performance.md).
"""

from __future__ import annotations

from llvmlite import ir

from . import kernels_prefill_q8_avx2 as avx2
from . import unpack as U
from .irgen import (F32T, G, I8, I16, I32, Loop, Var, c64, const, dpb, dpb_run, fmuladd, func, load,
                    ptr_to, splat, splat_c, transpose, vec)
from .llvm import Isa
from .kernels_prefill import KC, TASK_ROWS, _load_out, _lane_mask, _panel_driver, _prefill_task, _store_out

QUADS = G // 4  # i32 lanes of four weights in a 32-block's row
SUPER = 256 // G  # 32-blocks of a K-quant super-block
KINDS = ("quant", "quant_min", "quant16", "quant_min16")  # a scale a 32-block; and a min; a scale per 16
# elements; a scale a 32-block and a min per 16 elements


def per_block(kind: str) -> int:
    """Panel vectors a 32-block: its quads, then -128 times the weights' sum (of each half: quant16)."""
    return QUADS + (2 if kind == "quant16" else 1)


def kind_of(code: int) -> str:
    rec = U.record(code)
    if rec.min_sub16:
        return "quant_min16"
    return "quant16" if rec.words_sub16 else KINDS[rec.mins_per_group]


def mins_of(kind: str) -> int:
    """Mins a 32-block (kernels_prefill._micro_quant's nm)."""
    return {"quant_min": 1, "quant_min16": 2}.get(kind, 0)


# the largest |w| of each format's panel weights where it is below 128 (Q8_0 and the IQ4s reach
# 128): the avx2 tile's form (run_of); test_q8_kernels checks each on its unpacked panel
W_MAX = {"q4_0": 8, "q4_1": 15, "q5_0": 16, "q5_1": 31, "q4_k": 15, "q5_k": 31, "q6_k": 32, "q3_k": 4, "q2_k": 45,
         "iq3_xxs": 62, "iq3_s": 15, "iq2_xxs": 43, "iq2_xs": 43, "iq2_s": 43, "iq1_s": 9, "iq1_m": 9,
         "tq2_0": 2, "tq1_0": 1, "mxfp4": 12}


def run_of(code: int) -> int:
    """Quads of a block (or half) whose pair sums of x + 128 and w add up as int16 on avx2
    (kernels_prefill_q8_avx2): 510 * |w| * run <= 32767, a power of two dividing the quads (0: even
    one pair sum could saturate)."""
    from ...formats import BY_CODE

    cap = 32767 // (510 * W_MAX.get(BY_CODE[code].name, 128))
    run = QUADS // (2 if kind_of(code) == "quant16" else 1)
    while run > cap:
        run //= 2
    return run


def driver_of(code: int, isa: Isa) -> str:
    """The q8 prefill driver a format takes on the ISA: its kind; on avx2 and its run (run_of)."""
    return kind_of(code) + (f"_run{run_of(code)}" if isa.name == "avx2" else "")


ISAS = ("avx512vnni", "avxvnni", "avx2")  # the ISAs with q8 tiles (generic: the int16 tiles on the values)
MIN_RUN = 4  # avx2: the shortest run that is not slower than the int16 tile on Zen 4 (Q6_K's runs of 2: 0.79-0.87x)


def tile(isa: Isa) -> tuple[int, int]:
    """Tokens x groups of L rows of the IR tile (avx2's assembly: kernels_prefill_q8_avx2.TILE):
    kernels_prefill.tile_shape's AVX-512 tile; on ymm 3 x 2 (6 int32 and 6 f32 sums, 2 weight vectors
    and a broadcast of the 16 registers)."""
    return (3, 4) if isa.lanes == 16 else (3, 2)


def chunked(isa: Isa) -> bool:
    """Whether the ISA's IR tiles read the activations as bytes by chunks (quantize_q8's pack_task:
    x + 128, chunk c's of row t at c * stride + t * KC) instead of converting each token's xq in
    every tile: avx512vnni and avxvnni. Each 64-row task reads all of the tokens' values, so
    converting them there cost Q4_K's tiles about a tenth of their rate (1.09-1.16x, one process,
    Zen 4)."""
    return isa.name in ISAS[:2]


def chunk_at(bd, x, stride, t0, k0):
    """The address of token t0's bytes of the chunk from k0 (the driver's x_at)."""
    return bd.add(bd.add(x, bd.mul(bd.udiv(k0, c64(KC)), stride)), bd.mul(t0, c64(KC)))


def takes(isa: Isa, code: int) -> bool:
    """Whether the ISA has q8 tiles for the format (avx2: run_of >= MIN_RUN)."""
    return isa.name in ISAS and U.record(code).quant and (isa.name != "avx2" or run_of(code) >= MIN_RUN)


def _dot(isa, bd, acc, xv, wv):
    """acc + quad sums of x + 128 (unsigned bytes) and w (<L x i32> each): vpdpbusd; on avx2
    vpmaddubsw (|w| <= 16 there, takes: a pair at most 8160), then vpmaddwd by ones (irgen.dpb)."""
    return dpb(isa, bd, acc, xv, wv)


def unpack_panel(isa, mod, code, name, slots, nm, fill, sums=0, ksum=None):
    """unpack(w, row_bytes, n_rows, k0, kc, panel, scales, mins) into mod: rows [0, n_rows) of a task,
    elements [k0, k0 + kc): row g * L + lane's 32-block b to panel[g][b * P + i][lane] (P = QUADS +
    slots: its weight quads, quad q elements 4q .. 4q + 3 as signed bytes, then `slots` i32), its
    f32 scale to scales[g][b][lane] and nm f32 a block to mins (none: nm 0). The first `sums` slots
    are -128 times the sum of the block's weights (2: of each half), found here from the transposed
    quads (a vpdpbusd by ones a quad: a horizontal sum per row and block took a third of an 8-token
    prefill's time on Q4_0 and Q5_0). With ksum (the super-block tiles' nsc, kernels_prefill_q8_ksum),
    slot ksum of each super-block's first block is -128 times the sum over the super-block of each
    block's (each half's: nsc 2) sum of weights times its integer scale in slot h (nsc 0: none).
    fill(bd, row, fbi, fb, put) gives the stored block fb (the task's fbi-th): put(b, w8, ints,
    scale, mins) a 32-block's quads (bytes_), its slots after the sums, scale (None: not stored) and
    mins. Lanes past n_rows get zeros."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    w_, row_bytes, n_rows, k0, kc, panel_, scales_, mins_ = fn.args
    BL = U.record(code).layout
    P = QUADS + slots
    wp = ptr_to(bd, w_, I8)
    panel, scales = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, scales_, F32T)
    mins = ptr_to(bd, mins_, F32T) if nm else None
    nb = bd.udiv(kc, c64(G))
    vq = vec(I32, QUADS)
    with bd.goto_entry_block():
        stage = bd.alloca(vq, c64(L * (KC // G)))  # [lane][b]
        ints = bd.alloca(I32, c64(slots * L * (KC // G)))  # [b][slot][lane]
    stage.align = ints.align = 64
    fb0 = bd.udiv(k0, c64(BL.block_elems))
    with Loop(bd, 0, TASK_ROWS // L) as g:
        pg = bd.gep(panel, [bd.mul(g, c64(KC // G * P))])
        sg = bd.gep(scales, [bd.mul(g, c64(KC // G * L))])
        mg = bd.gep(mins, [bd.mul(g, c64(nm * KC // G * L))]) if mins is not None else None
        with Loop(bd, 0, L) as lane:
            rr = bd.add(bd.mul(g, c64(L)), lane)

            def slot(b, s, v):
                bd.store(v, bd.gep(ints, [bd.add(bd.mul(bd.add(bd.mul(b, c64(slots)), c64(s)), c64(L)), lane)]))

            def put(b, w8, vals, scale, mns):
                bd.store(w8, bd.gep(stage, [bd.add(bd.mul(lane, c64(KC // G)), b)]), align=32)
                at = bd.add(bd.mul(b, c64(L)), lane)
                for s, v in enumerate(vals):
                    slot(b, sums + s, v)
                if scale is not None:
                    bd.store(scale, bd.gep(sg, [at]))
                for h, mn in enumerate(mns):  # [b * nm + h][lane]
                    bd.store(mn, bd.gep(mg, [bd.add(bd.mul(bd.add(bd.mul(b, c64(nm)), c64(h)), c64(L)), lane)]))

            with bd.if_else(bd.icmp_signed("<", rr, n_rows)) as (then, otherwise):
                with then:
                    row = bd.gep(wp, [bd.mul(rr, row_bytes)])
                    with Loop(bd, 0, bd.udiv(kc, c64(BL.block_elems))) as fbi:
                        fill(bd, row, fbi, bd.add(fb0, fbi), put)
                with otherwise:
                    with Loop(bd, 0, nb) as b:
                        put(b, splat_c(I32, 0, QUADS), [ir.Constant(I32, 0)] * (slots - sums), ir.Constant(F32T, 0.0),
                            [ir.Constant(F32T, 0.0)] * nm)
        zero = splat_c(I32, 0, L)
        run = Var(bd, zero)  # ksum: the super-block's sum so far
        with Loop(bd, 0, nb) as b:
            rows = [bd.load(bd.gep(stage, [bd.add(c64(lane * (KC // G)), b)]), align=32) for lane in range(L)]
            parts = [transpose(bd, rows[i:i + QUADS]) for i in range(0, L, QUADS)]  # 8 x 8 quads each
            at = bd.mul(b, c64(P))
            quads = [parts[0][q] if L == QUADS else bd.shuffle_vector(parts[0][q], parts[1][q], const(I32, range(L)))
                     for q in range(QUADS)]
            for q, v in enumerate(quads):
                bd.store(v, bd.gep(pg, [bd.add(at, c64(q))]), align=4 * L)
            ones, times = splat_c(I32, 0x01010101, L), splat_c(I32, -128, L)

            def weight_sums(n):  # of each of n parts of the block, lane by lane
                per = QUADS // n
                return [dpb_run(isa, bd, zero, [(ones, w) for w in quads[h * per:(h + 1) * per]]) for h in range(n)]

            for h, v in enumerate(weight_sums(sums) if sums else []):
                bd.store(bd.mul(v, times), bd.gep(pg, [bd.add(at, c64(QUADS + h))]), align=4 * L)
            ints_of = {}
            for s in range(sums, slots):
                src = bd.gep(ints, [bd.mul(bd.add(bd.mul(b, c64(slots)), c64(s)), c64(L))])
                ints_of[s] = bd.load(bd.bitcast(src, vec(I32, L).as_pointer()), align=4 * L)
                bd.store(ints_of[s], bd.gep(pg, [bd.add(at, c64(QUADS + s))]), align=4 * L)
            if ksum is not None:
                terms = [bd.mul(v, ints_of[h]) if ksum else v for h, v in enumerate(weight_sums(max(ksum, 1)))]
                j = bd.urem(b, c64(SUPER))
                total = bd.select(bd.icmp_signed("==", j, c64(0)), zero, run.get())
                for v in terms:
                    total = bd.add(total, v)
                run.set(total)
                first = bd.add(bd.mul(bd.sub(b, j), c64(P)), c64(QUADS + ksum))
                bd.store(bd.mul(total, times), bd.gep(pg, [first]), align=4 * L)
    bd.ret_void()


def bytes_(bd, w):
    """A 32-block's weights (<32 x i16>, each a signed byte's) as the panel's QUADS quads."""
    return bd.bitcast(bd.trunc(w, vec(I8, G)), vec(I32, QUADS))


def _unpack_q8(isa, mod, code, name):
    """The panel (unpack_panel): a 32-block's weights w, -128 * sum(w) after them (quant16: of each
    half); scales and mins as the int16 unpack (quant16: each half's scale in scales and mins)."""
    rec = U.record(code)
    kind = kind_of(code)
    per = rec.layout.block_elems // G
    nm = max(mins_of(kind), 1) if kind != "quant" else 0  # mins of a block in the panel's mins (quant16: the
    # second scale)

    def fill(bd, row, fbi, fb, put):
        blk = U.block(code, bd, row, fb)
        for j, w in enumerate(blk.w):
            jj = ir.Constant(I32, j)
            at = bd.add(bd.mul(fbi, c64(per)), c64(j))
            if kind == "quant16":  # the exact decode's weights and its scale of each half
                sv, w = blk.exact[j]
                put(at, bytes_(bd, w), [], bd.extract_element(sv, ir.Constant(I32, 0)),
                    [bd.extract_element(sv, ir.Constant(I32, 16))])
            else:
                put(at, bytes_(bd, w), [], bd.extract_element(blk.scale, jj),
                    [bd.extract_element(blk.min, ir.Constant(I32, nm * j + h)) for h in range(nm)])

    slots = per_block(kind) - QUADS
    unpack_panel(isa, mod, code, name, slots, nm, fill, slots)


def tile_fn(isa, mod, name, TT, RG, chunks=False):
    """A token tile's function (kernels_prefill._micro_quant's arguments) and builder, its arguments
    (panel, sc, mn, nb, xq, ldx, xs, xf, ldxs, first) typed, the groups' lane masks and the out
    pointers of each (token, group). With chunks xq is the chunk's bytes (chunked) and ldx KC."""
    L = isa.lanes
    fn, bd = func(mod, name, 13)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, sc_, mn_, nb, xq_, ldx, xs_, xf_, ldxs, out_, ldo, first_, nvalid = fn.args
    panel, sc, mn = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, sc_, vec(F32T, L)), ptr_to(bd, mn_, vec(F32T, L))
    xq, xs, xf = ptr_to(bd, xq_, I8 if chunks else I16), ptr_to(bd, xs_, F32T), ptr_to(bd, xf_, F32T)
    ldx = c64(KC) if chunks else ldx
    out = ptr_to(bd, out_, F32T)
    first = bd.icmp_signed("!=", first_, c64(0))
    masks = [_lane_mask(bd, bd.sub(nvalid, c64(r * L)), L) for r in range(RG)]
    outp = [[bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]) for r in range(RG)] for t in range(TT)]
    return fn, bd, (panel, sc, mn, nb, xq, ldx, xs, xf, ldxs, first), masks, outp


def _micro_q8(isa, mod, kind, TT, RG, name):
    """The token tile: TT tokens x RG groups of L rows over nb 32-blocks (kernels_prefill._micro_quant's
    arguments and arithmetic after the integer sums): per block, each token's 32 values + 128 as
    bytes (chunked: as stored; else converted from xq here), each quad broadcast to RG vpdpbusd with
    the groups' weight quads, from -128 * sum(w); quant16: each 16-element half so, scaled by its
    own scale (in mn); quant_min16: two mins a block times the tokens' 16-element sums (xf is xz);
    avx2: see _dot."""
    L = isa.lanes
    chunks = chunked(isa)
    fn, bd, args, masks, outp = tile_fn(isa, mod, name, TT, RG, chunks)
    panel, sc, mn, nb, xq, ldx, xs, xf, ldxs, first = args
    gstride = KC // G
    nm = mins_of(kind)
    halves = 2 if kind == "quant16" else 1
    P = per_block(kind)
    accs = [[Var(bd, _load_out(bd, outp[t][r], masks[r], L, first)) for r in range(RG)] for t in range(TT)]
    xrow = [bd.gep(xq, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    srow = [bd.mul(c64(t), ldxs) for t in range(TT)]
    if not chunks:
        with bd.goto_entry_block():
            scratch = bd.alloca(vec(I32, QUADS), c64(TT))  # each token's block as unsigned bytes
        scratch.align = 32
    with Loop(bd, 0, nb) as b:
        if chunks:
            xs8 = [bd.bitcast(bd.gep(xrow[t], [bd.mul(b, c64(G))]), I32.as_pointer()) for t in range(TT)]
        else:
            for t in range(TT):
                q = load(bd, xrow[t], bd.mul(b, c64(G)), vec(I16, G), align=2)
                u = bd.trunc(bd.add(q, splat_c(I16, 128, G)), vec(I8, G))
                bd.store(bd.bitcast(u, vec(I32, QUADS)), bd.gep(scratch, [c64(t)]), align=32)
            xs8 = [bd.bitcast(bd.gep(scratch, [c64(t)]), I32.as_pointer()) for t in range(TT)]
        blk = [bd.mul(bd.add(b, c64(r * gstride)), c64(P)) for r in range(RG)]
        d = [bd.load(bd.gep(sc, [bd.add(b, c64(r * gstride))]), align=4) for r in range(RG)]
        m = [bd.load(bd.gep(mn, [bd.add(b, c64(r * gstride))]), align=4) for r in range(RG)] \
            if kind in ("quant_min", "quant16") else None
        xst = [splat(bd, bd.load(bd.gep(xs, [bd.add(srow[t], b)])), L) for t in range(TT)]
        for h in range(halves):
            quads = range(QUADS) if halves == 1 else range(h * QUADS // 2, (h + 1) * QUADS // 2)
            isums = [[bd.load(bd.gep(panel, [bd.add(blk[r], c64(QUADS + h))]), align=4 * L) for r in range(RG)]
                     for _ in range(TT)]
            for qd in quads:
                wv = [bd.load(bd.gep(panel, [bd.add(blk[r], c64(qd))]), align=4 * L) for r in range(RG)]
                for t in range(TT):
                    xv = splat(bd, bd.load(bd.gep(xs8[t], [c64(qd)]), align=4), L)
                    for r in range(RG):
                        isums[t][r] = _dot(isa, bd, isums[t][r], xv, wv[r])
            scale = d if h == 0 else m  # quant16: the second half's scale where the mins go
            for t in range(TT):
                for r in range(RG):
                    a = fmuladd(bd, bd.sitofp(isums[t][r], vec(F32T, L)), bd.fmul(scale[r], xst[t]), accs[t][r].get())
                    accs[t][r].set(a)
        if nm == 1:
            for t in range(TT):
                xft = splat(bd, bd.load(bd.gep(xf, [bd.add(srow[t], b)])), L)
                for r in range(RG):
                    accs[t][r].set(fmuladd(bd, m[r], xft, accs[t][r].get()))
        elif nm == 2:  # xf is xz: min h times the activation scale times half h's sum of xq
            for t in range(TT):
                zrow = bd.mul(bd.add(srow[t], b), c64(2))
                for h in range(2):
                    xzt = splat(bd, bd.fmul(bd.load(bd.gep(xs, [bd.add(srow[t], b)])),
                                            bd.load(bd.gep(xf, [bd.add(zrow, c64(h))]))), L)
                    for r in range(RG):
                        mh = bd.load(bd.gep(mn, [bd.add(bd.mul(b, c64(2)), c64(h + r * 2 * gstride))]), align=4)
                        accs[t][r].set(fmuladd(bd, mh, xzt, accs[t][r].get()))
    for t in range(TT):
        for r in range(RG):
            _store_out(bd, outp[t][r], accs[t][r].get(), masks[r], L)
    bd.ret_void()
    return fn


def build_driver_q8(isa, mod, key, name) -> list[str]:
    """The q8 prefill driver of a kind of format (driver_of) into mod."""
    kind, _, run = key.partition("_run")
    assert isa.name in ISAS and kind in KINDS and bool(run) == (isa.name == "avx2")
    tt, rg = avx2.TILE if run else tile(isa)
    micro = {(n, g): _micro_q8(isa, mod, kind, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
    if run:
        micro[tt, rg] = avx2.micro(mod, 2 if kind == "quant16" else 1, mins_of(kind), int(run),
                                   per_block(kind), f"{name}_asm", micro[tt, rg])
    driver = _panel_driver(isa, mod, name + "_rows", KC, I32, KC // G * per_block(kind) * isa.lanes, micro, True,
                           mins_of(kind), (tt, rg), chunk_at if chunked(isa) else None)
    _prefill_task(mod, driver, name)
    return [name]


def build_unpack_q8(isa, mod, code, name):
    assert U.record(code).quant
    _unpack_q8(isa, mod, code, name)
