"""The K- and i-quants' q8 prefill tiles on q8_k activations (one activation scale per 256 elements,
their super-block): a super-block's integer sums before one conversion, llama.cpp's way. On
avx512vnni and avxvnni (the same description at 16 or 8 lanes); avx2 keeps kernels_prefill_q8.

kernels_prefill_q8's tiles convert each 32-block's (Q6_K, Q3_K: each 16-element half's) integer dot
to f32 and scale it by d * sc and the activation scale: a conversion, a product and an FMA per
(token, group of rows) beside its 8 vpdpbusd, the product and the FMA in vpdpbusd's one slot a
cycle on Zen 4 (as vpmulld is: 10 slots a Q6_K block here against 12; docs/performance.md, "q8
tiles: a super-block's integer sums"). Here the panel keeps the integer sub-block scales sc
(CpuFormat.ksum) beside the weights, and each (token, group) sums sc * dot over the super-block in
int32 (vpmulld + vpaddd a sub-block; Q2_K, whose weights carry their scales, chains its vpdpbusd
through all 8 blocks), then converts once and scales once by d times the activation scale. The
mins (Q4_K, Q5_K: one per 32-block; Q2_K: per 16) stay f32 FMAs, as in the other tiles. The
i-quants' scales are d times small integers (emit_iq: IQ4_XS ls - 32, IQ3_S 2 ls + 1; IQ3_XXS, IQ2_XXS
and IQ1_S 2 ls + 1 times d / 4, d / 8, d / 8 (their (d * (0.5 + ls)) * f, and IQ1_S's delta, already
in w = 8 grid +- 1); per 16 elements IQ2_XS, IQ2_S and IQ1_M 2 ls + 1 times d / 8), no mins.

Panel, per 32-block b and row (P = QUADS + nsc + 1 i32 vectors of L lanes): its QUADS weight quads
(signed bytes: Q4_K/Q5_K q, Q6_K q - 32, Q3_K q - 4, Q2_K q * sc, the i-quants' values), its nsc
integer scales (one, two halves, or none: Q2_K), and in block 0 of each super-block -128 * sum over
it of sc * sum(w) (the activations go in as x + 128, unsigned bytes: the sums start there). scales:
d in block 0's slot of each super-block (the tiles read no other); mins as kernels_prefill_q8.

Exact in int32: the adds and vpmulld wrap modulo 2^32 and vpdpbusd does not saturate, so the true
sum must fit, and does: |x| <= 127 and per super-block
Q6_K 256 * 127 * 32 * 128 (|q - 32| <= 32, |sc| <= 128) = 1.33e8, IQ4_XS 256 * 127 * 127 * 32 =
1.32e8, Q5_K 256 * 127 * 31 * 63 = 6.3e7, IQ3_XXS 256 * 127 * 62 * 31 = 6.2e7, IQ2_XXS/XS/S 256 *
127 * 43 * 31 = 4.3e7, Q4_K 3.1e7, IQ3_S 256 * 127 * 15 * 31 = 1.5e7, IQ1_S/M 256 * 127 * 9 * 15 =
4.4e6, Q3_K 256 * 127 * 4 * 32 = 4.2e6, Q2_K 256 * 127 * 45 = 1.5e6; with the x + 128 form
the running sums reach at most twice 256 * 255 * |w| * |sc| (Q6_K 5.3e8), all below 2^31. Above
2^24 the one conversion rounds (once, where the other tiles round each block's): q8's results move
by float rounding only.
"""

from __future__ import annotations

from llvmlite import ir

from . import kernels_prefill_q8 as q8
from . import unpack as U
from .irgen import (F32T, G, I8, I16, I32, Loop, Var, c64, const, dpb, dpb_run, fmuladd, func, load, prefetch, ptr_to,
                    splat, splat_c, transpose, vec)
from .kernels_prefill import KC, TASK_ROWS, _load_out, _panel_driver, _prefill_task, _store_out
from .llvm import Isa

QUADS = q8.QUADS
SUPER = q8.SUPER
ISAS = ("avx512vnni", "avxvnni")
KINDS = {"quant": "ksum", "quant_min": "ksum_min", "quant16": "ksum16", "quant_min16": "ksum_min16"}  # by
# kernels_prefill_q8's kind
NSC = {"ksum": 1, "ksum_min": 1, "ksum16": 2, "ksum_min16": 0}  # integer scales a 32-block
MINS = {"ksum": 0, "ksum_min": 1, "ksum16": 0, "ksum_min16": 2}  # f32 mins a 32-block (kernels_prefill_q8.mins_of)


def takes(isa: Isa, code: int) -> bool:
    """Whether the ISA runs these tiles for the format on q8_k activations (a K- or i-quant:
    CpuFormat.ksum)."""
    return isa.name in ISAS and U.record(code).ksum is not None


def kind_of(code: int) -> str:
    return KINDS[q8.kind_of(code)]


def per_block(kind: str) -> int:
    return QUADS + NSC[kind] + 1


def _unpack(isa, mod, code, name):
    """The panel (kernels_prefill_q8.unpack_panel) for whole super-blocks: each 32-block's weights,
    its nsc integer scales and a slot that in block 0 of each super-block holds -128 * sum over it
    of sc * sum(w) (0 in the others; unpack_panel's ksum); d in block 0's scale (the tiles read no
    other: storing it in every block's cost 4-7% of a 32-token Q4_K prefill), the mins as
    kernels_prefill_q8's."""
    rec = U.record(code)
    kind = kind_of(code)
    nsc, nm = NSC[kind], MINS[kind]
    zero32 = ir.Constant(I32, 0)

    def fill(bd, row, fbi, fb, put):
        blk = U.block(code, bd, row, fb)
        d, isc = rec.ksum(bd, row, fb)
        for j in range(SUPER):
            w = blk.exact[j][1] if blk.exact is not None else blk.w[j]
            sc = [bd.extract_element(isc, ir.Constant(I32, nsc * j + h)) for h in range(nsc)]
            put(bd.add(bd.mul(fbi, c64(SUPER)), c64(j)), q8.bytes_(bd, w), sc + [zero32], None if j else d,
                [bd.extract_element(blk.min, ir.Constant(I32, nm * j + h)) for h in range(nm)])

    q8.unpack_panel(isa, mod, code, name, nsc + 1, nm, fill, ksum=nsc)


def _unpack_lanes(isa, mod, code, name):
    """_unpack's panel, scales and mins for a format with a lanes emitter (Q4_K, Q5_K), a group's L
    rows a super-block at a time: their stored dwords transposed 8 x 8 (the way unpack_panel
    transposes decoded bytes) and decoded in lanes (emit.LaneBlock), each quad stored once, instead
    of a decode per row and a transpose of the decoded bytes (Q4_K 1.3-1.4x, Q5_K 1.15-1.2x the
    8-token prefill of a 768 x 2048 expert). Lanes past n_rows repeat the last row, and groups with
    no rows are left unwritten: the tiles' stores mask those rows off and the driver runs no tile
    over such groups."""
    rec = U.record(code)
    BL = rec.layout
    kind = kind_of(code)
    assert NSC[kind] == 1 and MINS[kind] == 1
    L = isa.lanes
    P = per_block(kind)
    nd = BL.block_bytes // 4
    fn, bd = func(mod, name, 8)
    w_, row_bytes, n_rows, k0, kc, panel_, scales_, mins_ = fn.args
    wp = ptr_to(bd, w_, I8)
    panel, scales, mins = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, scales_, F32T), ptr_to(bd, mins_, F32T)
    fb0 = bd.udiv(k0, c64(BL.block_elems))
    ones, times = splat_c(I32, 0x01010101, L), splat_c(I32, -128, L)
    last = bd.sub(n_rows, c64(1))
    for g in range(TASK_ROWS // L):
        pg = bd.gep(panel, [c64(g * (KC // G) * P)])
        sg = bd.gep(scales, [c64(g * (KC // G) * L)])
        mg = bd.gep(mins, [c64(g * (KC // G) * L)])
        rows = [bd.select(bd.icmp_signed("<", c64(g * L + r), n_rows), c64(g * L + r), last) for r in range(L)]
        nblk = bd.udiv(kc, c64(BL.block_elems))
        with bd.if_then(bd.icmp_signed("<", c64(g * L), n_rows)), Loop(bd, 0, nblk) as fbi:
            off = bd.mul(bd.add(fb0, fbi), c64(BL.block_bytes))
            at = [bd.gep(wp, [bd.add(bd.mul(rr, row_bytes), off)]) for rr in rows]
            chunks = {}

            def dw(i):
                c0 = min(8 * (i // 8), nd - 8)  # the last 32 bytes end at the block's end
                if c0 not in chunks:
                    got = [bd.load(bd.bitcast(bd.gep(a, [c64(4 * c0)]), vec(I32, 8).as_pointer()), align=1) for a in at]
                    parts = [transpose(bd, got[h:h + 8]) for h in range(0, L, 8)]
                    chunks[c0] = [p[0] if L == 8 else bd.shuffle_vector(*p, const(I32, range(L))) for p in zip(*parts)]
                return chunks[c0][i - c0]

            lb = rec.lanes(bd, dw)
            b0 = bd.mul(fbi, c64(SUPER))
            total = None
            for j in range(SUPER):
                b = bd.add(b0, c64(j))
                quads, isc, mn = lb.group(j)
                for q, v in enumerate(quads + [isc]):
                    bd.store(v, bd.gep(pg, [bd.add(bd.mul(b, c64(P)), c64(q))]), align=4 * L)
                bd.store(mn, bd.bitcast(bd.gep(mg, [bd.mul(b, c64(L))]), vec(F32T, L).as_pointer()), align=4 * L)
                term = bd.mul(dpb_run(isa, bd, splat_c(I32, 0, L), [(ones, v) for v in quads]), isc)
                total = term if total is None else bd.add(total, term)
            bd.store(lb.d, bd.bitcast(bd.gep(sg, [bd.mul(b0, c64(L))]), vec(F32T, L).as_pointer()), align=4 * L)
            bd.store(bd.mul(total, times), bd.gep(pg, [bd.add(bd.mul(b0, c64(P)), c64(QUADS + 1))]), align=4 * L)
    bd.ret_void()


def _micro(isa, mod, kind, TT, RG, name):
    """The token tile: TT tokens x RG groups of L rows over nb 32-blocks (whole super-blocks; the
    arguments of kernels_prefill._micro_quant). Per super-block each (token, group) starts its int32
    sum at the panel's -128 * sum(sc * w); per 32-block (half: ksum16) each token's values + 128 as
    bytes, each quad broadcast to RG vpdpbusd from zero, the sub-block's sum times its integer scale
    added in (ksum_min16: the vpdpbusd add straight into the sum); then one conversion, times d and
    the activation scale, into the f32 result in out, and the mins as kernels_prefill_q8's tile."""
    L = isa.lanes
    chunks = q8.chunked(isa)
    fn, bd, args, masks, outp = q8.tile_fn(isa, mod, name, TT, RG, chunks)
    panel, sc, mn, nb, xq, ldx, xs, xf, ldxs, first = args
    # out's lines into L1 while the integer sums run: read last a whole chunk of tokens ago, at rows
    # 4 N bytes apart, they came too late for the conversion after the loop (+3-16% on Q4_K and Q5_K
    # 8960 x 1536, one process)
    for t in range(TT):
        for r in range(RG):
            prefetch(bd, bd.bitcast(outp[t][r], I8.as_pointer()))
    gstride = KC // G
    nsc, nm = NSC[kind], MINS[kind]
    P = per_block(kind)
    xrow = [bd.gep(xq, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    srow = [bd.mul(c64(t), ldxs) for t in range(TT)]
    hpb = 2 if nsc == 2 else 1  # sub-blocks a 32-block
    UQ = QUADS // hpb  # quads of a sub-block
    if not chunks:
        with bd.goto_entry_block():
            scratch = bd.alloca(vec(I32, UQ), c64(TT))  # each token's sub-block as unsigned bytes
        scratch.align = 32
        xs8 = [bd.bitcast(bd.gep(scratch, [c64(t)]), I32.as_pointer()) for t in range(TT)]
        # the broadcasts read scratch back from memory (vpbroadcastd m32: a load): without this
        # barrier LLVM forwards the stores and broadcasts from registers, two vector ops a broadcast
        barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [scratch.type]), "", "r,~{memory}", side_effect=True)
    zero = splat_c(I32, 0, L)
    with Loop(bd, 0, nb, SUPER) as b0:
        base = [bd.mul(bd.add(b0, c64(r * gstride)), c64(P)) for r in range(RG)]
        init = [bd.load(bd.gep(panel, [bd.add(base[r], c64(QUADS + nsc))]), align=4 * L) for r in range(RG)]
        acc = [[Var(bd, init[r]) for r in range(RG)] for _ in range(TT)]
        with Loop(bd, 0, SUPER * hpb) as u:  # a sub-block at a time: LLVM spilled the sums of unrolled ones
            sums = [[acc[t][r].get() for r in range(RG)] for t in range(TT)]
            k = bd.add(bd.mul(b0, c64(G)), bd.mul(u, c64(4 * UQ)))
            if chunks:  # the stored bytes, x + 128 (quantize_q8.pack_task)
                xs8 = [bd.bitcast(bd.gep(xrow[t], [k]), I32.as_pointer()) for t in range(TT)]
            else:
                for t in range(TT):
                    q = load(bd, xrow[t], k, vec(I16, 4 * UQ), align=2)
                    v = bd.trunc(bd.add(q, splat_c(I16, 128, 4 * UQ)), vec(I8, 4 * UQ))
                    bd.store(bd.bitcast(v, vec(I32, UQ)), bd.gep(scratch, [c64(t)]), align=16)
                bd.call(barrier, [scratch])
            bj, h = bd.udiv(u, c64(hpb)), bd.urem(u, c64(hpb))
            blk = [bd.add(bd.add(base[r], bd.mul(bj, c64(P))), bd.mul(h, c64(UQ))) for r in range(RG)]
            part = [[zero] * RG for _ in range(TT)] if nsc else sums
            for qd in range(UQ):
                wv = [bd.load(bd.gep(panel, [bd.add(blk[r], c64(qd))]), align=4 * L) for r in range(RG)]
                for t in range(TT):
                    xv = splat(bd, bd.load(bd.gep(xs8[t], [c64(qd)]), align=4), L)
                    for r in range(RG):
                        part[t][r] = dpb(isa, bd, part[t][r], xv, wv[r])
            if nsc:  # the sub-block's scale sits QUADS + h on from its block, UQ * h on from blk
                at = [bd.add(bd.sub(blk[r], bd.mul(h, c64(UQ))), bd.add(c64(QUADS), h)) for r in range(RG)]
                scv = [bd.load(bd.gep(panel, [at[r]]), align=4 * L) for r in range(RG)]
                for t in range(TT):
                    for r in range(RG):
                        sums[t][r] = bd.add(sums[t][r], bd.mul(part[t][r], scv[r]))
            for t in range(TT):
                for r in range(RG):
                    acc[t][r].set(sums[t][r])
        d = [bd.load(bd.gep(sc, [bd.add(b0, c64(r * gstride))]), align=4) for r in range(RG)]
        start = bd.and_(first, bd.icmp_signed("==", b0, c64(0)))
        for t in range(TT):
            xs1 = bd.load(bd.gep(xs, [bd.add(srow[t], b0)]))
            xst = splat(bd, xs1, L)
            # the mins' activation terms of the super-block, once a token: xf (nm 1: the 32-block's
            # scaled sum) or its 16-element sums xz (nm 2), ahead of the masked stores
            if nm == 1:
                xm = [splat(bd, bd.load(bd.gep(xf, [bd.add(srow[t], bd.add(b0, c64(j)))])), L) for j in range(SUPER)]
            elif nm == 2:
                z0 = bd.mul(bd.add(srow[t], b0), c64(2))
                xm = [splat(bd, bd.load(bd.gep(xf, [bd.add(z0, c64(i))])), L) for i in range(nm * SUPER)]
            for r in range(RG):
                a = _load_out(bd, outp[t][r], masks[r], L, start)
                a = fmuladd(bd, bd.sitofp(acc[t][r].get(), vec(F32T, L)), bd.fmul(d[r], xst), a)
                if nm:  # sum of min * xm over the super-block's mins (nm 2: times the activation scale after)
                    m0 = bd.add(bd.mul(b0, c64(nm)), c64(r * nm * gstride))
                    ms = [bd.load(bd.gep(mn, [bd.add(m0, c64(i))]), align=4) for i in range(nm * SUPER)]
                    if nm == 1:
                        for mi, xi in zip(ms, xm):
                            a = fmuladd(bd, mi, xi, a)
                    else:
                        z = bd.fmul(ms[0], xm[0])
                        for mi, xi in zip(ms[1:], xm[1:]):
                            z = fmuladd(bd, mi, xi, z)
                        a = fmuladd(bd, z, xst, a)
                _store_out(bd, outp[t][r], a, masks[r], L)
    bd.ret_void()
    return fn


def build_driver(isa, mod, kind, name) -> list[str]:
    """The driver of a kind (kind_of) into mod: kernels_prefill_q8's tile shape, these tiles."""
    assert isa.name in ISAS and kind in NSC
    tt, rg = q8.tile(isa)
    micro = {(n, g): _micro(isa, mod, kind, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
    driver = _panel_driver(isa, mod, name + "_rows", KC, I32, KC // G * per_block(kind) * isa.lanes, micro, True,
                           MINS[kind], (tt, rg), q8.chunk_at if q8.chunked(isa) else None)
    _prefill_task(mod, driver, name)
    return [name]


def build_unpack(isa, mod, code, name):
    assert takes(isa, code)
    (_unpack_lanes if U.record(code).lanes is not None else _unpack)(isa, mod, code, name)
