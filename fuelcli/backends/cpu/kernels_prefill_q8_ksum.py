"""The K-quants' q8 prefill tiles on q8_k activations (one activation scale per 256 elements, the
K-quant super-block): a super-block's integer sums before one conversion, llama.cpp's way. On
avx512vnni and avxvnni (the same description at 16 or 8 lanes); avx2 keeps kernels_prefill_q8.

kernels_prefill_q8's tiles convert each 32-block's (Q6_K, Q3_K: each 16-element half's) integer dot
to f32 and scale it by d * sc and the activation scale: a conversion, a product and an FMA per
(token, group of rows) beside its 8 vpdpbusd, the product and the FMA in vpdpbusd's one slot a
cycle on Zen 4 (as vpmulld is: 10 slots a Q6_K block here against 12; docs/performance.md, "q8
tiles: a super-block's integer sums"). Here the panel keeps the integer sub-block scales sc
(CpuFormat.ksum) beside the weights, and each (token, group) sums sc * dot over the super-block in
int32 (vpmulld + vpaddd a sub-block; Q2_K, whose weights carry their scales, chains its vpdpbusd
through all 8 blocks), then converts once and scales once by d times the activation scale. The
mins (Q4_K, Q5_K: one per 32-block; Q2_K: per 16) stay f32 FMAs, as in the other tiles.

Panel, per 32-block b and row (P = QUADS + nsc + 1 i32 vectors of L lanes): its QUADS weight quads
(signed bytes: Q4_K/Q5_K q, Q6_K q - 32, Q3_K q - 4, Q2_K q * sc), its nsc integer scales (one, two
halves, or none: Q2_K), and in block 0 of each super-block -128 * sum over it of sc * sum(w) (the
activations go in as x + 128, unsigned bytes: the sums start there). scales: d in every block's slot;
mins as kernels_prefill_q8.

Exact in int32: the adds and vpmulld wrap modulo 2^32 and vpdpbusd does not saturate, so the true
sum must fit, and does: |x| <= 127 and per super-block
Q6_K 256 * 127 * 32 * 128 (|q - 32| <= 32, |sc| <= 128) = 1.33e8, Q5_K 256 * 127 * 31 * 63 = 6.3e7,
Q4_K 3.1e7, Q3_K 256 * 127 * 4 * 32 = 4.2e6, Q2_K 256 * 127 * 45 = 1.5e6; with the x + 128 form
the running sums reach at most twice 256 * 255 * |w| * |sc| (Q6_K 5.3e8), all below 2^31. Above
2^24 the one conversion rounds (once, where the other tiles round each block's): q8's results move
by float rounding only.
"""

from __future__ import annotations

from llvmlite import ir

from . import kernels_prefill_q8 as q8
from . import unpack as U
from .irgen import (F32T, G, I8, I16, I32, Loop, Var, c64, const, dpb, fmuladd, func, hsum, load, ptr_to, splat,
                    splat_c, transpose, vec)
from .kernels_prefill import KC, TASK_ROWS, _load_out, _lane_mask, _panel_driver, _prefill_task, _store_out
from .llvm import Isa

QUADS = q8.QUADS
SUPER = 256 // G  # 32-blocks of a super-block
ISAS = ("avx512vnni", "avxvnni")
KINDS = {"quant_min": "ksum_min", "quant16": "ksum16", "quant_min16": "ksum_min16"}  # by kernels_prefill_q8's kind
NSC = {"ksum_min": 1, "ksum16": 2, "ksum_min16": 0}  # integer scales a 32-block
MINS = {"ksum_min": 1, "ksum16": 0, "ksum_min16": 2}  # f32 mins a 32-block (kernels_prefill_q8.mins_of)


def takes(isa: Isa, code: int) -> bool:
    """Whether the ISA runs these tiles for the format on q8_k activations (a K-quant: CpuFormat.ksum)."""
    return isa.name in ISAS and U.record(code).ksum is not None


def kind_of(code: int) -> str:
    return KINDS[q8.kind_of(code)]


def per_block(kind: str) -> int:
    return QUADS + NSC[kind] + 1


def _unpack(isa, mod, code, name):
    """unpack(w, row_bytes, n_rows, k0, kc, panel, scales, mins): the panel above for rows [0, n_rows)
    of a task, elements [k0, k0 + kc) (whole super-blocks); lanes past n_rows get zeros."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    w_, row_bytes, n_rows, k0, kc, panel_, scales_, mins_ = fn.args
    rec = U.record(code)
    kind = kind_of(code)
    nsc, nm = NSC[kind], MINS[kind]
    P = per_block(kind)
    slots = nsc + 1  # i32 vectors after the quads
    wp = ptr_to(bd, w_, I8)
    panel, scales = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, scales_, F32T)
    mins = ptr_to(bd, mins_, F32T) if nm else None
    nb = bd.udiv(kc, c64(G))
    vq = vec(I32, QUADS)
    with bd.goto_entry_block():
        stage = bd.alloca(vq, c64(L * (KC // G)))  # [lane][b]
        ints = bd.alloca(I32, c64(slots * L * (KC // G)))  # [b][slot][lane]
    stage.align = ints.align = 64
    fb0 = bd.udiv(k0, c64(rec.layout.block_elems))
    zero32 = ir.Constant(I32, 0)
    with Loop(bd, 0, TASK_ROWS // L) as g:
        pg = bd.gep(panel, [bd.mul(g, c64(KC // G * P))])
        sg = bd.gep(scales, [bd.mul(g, c64(KC // G * L))])
        mg = bd.gep(mins, [bd.mul(g, c64(nm * KC // G * L))]) if mins is not None else None
        with Loop(bd, 0, L) as lane:
            rr = bd.add(bd.mul(g, c64(L)), lane)

            def put(b, w8, vals, scale, mns):
                bd.store(w8, bd.gep(stage, [bd.add(bd.mul(lane, c64(KC // G)), b)]), align=32)
                for s, v in enumerate(vals):
                    bd.store(v, bd.gep(ints, [bd.add(bd.mul(bd.add(bd.mul(b, c64(slots)), c64(s)), c64(L)), lane)]))
                bd.store(scale, bd.gep(sg, [bd.add(bd.mul(b, c64(L)), lane)]))
                for h, mn in enumerate(mns):  # [b * nm + h][lane]
                    bd.store(mn, bd.gep(mg, [bd.add(bd.mul(bd.add(bd.mul(b, c64(nm)), c64(h)), c64(L)), lane)]))

            def wsum(w, lo, hi):
                part = bd.shuffle_vector(w, w, const(I32, range(lo, hi)))
                return hsum(bd, bd.sext(part, vec(I32, hi - lo)))

            with bd.if_else(bd.icmp_signed("<", rr, n_rows)) as (then, otherwise):
                with then:
                    row = bd.gep(wp, [bd.mul(rr, row_bytes)])
                    with Loop(bd, 0, bd.udiv(kc, c64(SUPER * G))) as fbi:
                        fb = bd.add(fb0, fbi)
                        blk = U.block(code, bd, row, fb)
                        d, isc = rec.ksum(bd, row, fb)
                        init = zero32
                        for j in range(SUPER):
                            w = blk.exact[j][1] if blk.exact is not None else blk.w[j]
                            sc = [bd.extract_element(isc, ir.Constant(I32, nsc * j + h)) for h in range(nsc)]
                            halves = [(0, G)] if nsc < 2 else [(0, G // 2), (G // 2, G)]
                            for h, (lo, hi) in enumerate(halves):
                                ws = wsum(w, lo, hi)
                                init = bd.add(init, bd.mul(bd.mul(ws, sc[h]) if nsc else ws, ir.Constant(I32, -128)))
                            mns = [bd.extract_element(blk.min, ir.Constant(I32, nm * j + h)) for h in range(nm)]
                            put(bd.add(bd.mul(fbi, c64(SUPER)), c64(j)), bd.bitcast(bd.trunc(w, vec(I8, G)), vq),
                                sc + [zero32], d, mns)
                        at = bd.add(bd.mul(bd.mul(fbi, c64(SUPER * slots)), c64(L)), c64(nsc * L))
                        bd.store(init, bd.gep(ints, [bd.add(at, lane)]))
                with otherwise, Loop(bd, 0, nb) as b:
                    put(b, splat_c(I32, 0, QUADS), [zero32] * slots, ir.Constant(F32T, 0.0),
                        [ir.Constant(F32T, 0.0)] * nm)
        with Loop(bd, 0, nb) as b:
            rows = [bd.load(bd.gep(stage, [bd.add(c64(lane * (KC // G)), b)]), align=32) for lane in range(L)]
            parts = [transpose(bd, rows[i:i + QUADS]) for i in range(0, L, QUADS)]  # 8 x 8 quads each
            at = bd.mul(b, c64(P))
            for qd in range(QUADS):
                v = parts[0][qd] if L == QUADS else bd.shuffle_vector(parts[0][qd], parts[1][qd], const(I32, range(L)))
                bd.store(v, bd.gep(pg, [bd.add(at, c64(qd))]), align=4 * L)
            for s in range(slots):
                src = bd.gep(ints, [bd.mul(bd.add(bd.mul(b, c64(slots)), c64(s)), c64(L))])
                v = bd.load(bd.bitcast(src, vec(I32, L).as_pointer()), align=4 * L)
                bd.store(v, bd.gep(pg, [bd.add(at, c64(QUADS + s))]), align=4 * L)
    bd.ret_void()


def _micro(isa, mod, kind, TT, RG, name):
    """The token tile: TT tokens x RG groups of L rows over nb 32-blocks (whole super-blocks; the
    arguments of kernels_prefill._micro_quant). Per super-block each (token, group) starts its int32
    sum at the panel's -128 * sum(sc * w); per 32-block (half: ksum16) each token's values + 128 as
    bytes, each quad broadcast to RG vpdpbusd from zero, the sub-block's sum times its integer scale
    added in (ksum_min16: the vpdpbusd add straight into the sum); then one conversion, times d and
    the activation scale, into the f32 result in out, and the mins as kernels_prefill_q8's tile."""
    L = isa.lanes
    fn, bd = func(mod, name, 13)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, sc_, mn_, nb, xq_, ldx, xs_, xf_, ldxs, out_, ldo, first_, nvalid = fn.args
    panel, sc, mn = ptr_to(bd, panel_, vec(I32, L)), ptr_to(bd, sc_, vec(F32T, L)), ptr_to(bd, mn_, vec(F32T, L))
    xq, xs, xf = ptr_to(bd, xq_, I16), ptr_to(bd, xs_, F32T), ptr_to(bd, xf_, F32T)
    out = ptr_to(bd, out_, F32T)
    first = bd.icmp_signed("!=", first_, c64(0))
    gstride = KC // G
    nsc, nm = NSC[kind], MINS[kind]
    P = per_block(kind)
    masks = [_lane_mask(bd, bd.sub(nvalid, c64(r * L)), L) for r in range(RG)]
    outp = [[bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]) for r in range(RG)] for t in range(TT)]
    xrow = [bd.gep(xq, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    srow = [bd.mul(c64(t), ldxs) for t in range(TT)]
    hpb = 2 if nsc == 2 else 1  # sub-blocks a 32-block
    UQ = QUADS // hpb  # quads of a sub-block
    with bd.goto_entry_block():
        scratch = bd.alloca(vec(I32, UQ), c64(TT))  # each token's sub-block as unsigned bytes
    scratch.align = 32
    xs8 = [bd.bitcast(bd.gep(scratch, [c64(t)]), I32.as_pointer()) for t in range(TT)]
    # the broadcasts read scratch back from memory (vpbroadcastd m32: a load): without this barrier
    # LLVM forwards the stores and broadcasts from registers, two vector ops a broadcast
    barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [scratch.type]), "", "r,~{memory}", side_effect=True)
    zero = splat_c(I32, 0, L)
    with Loop(bd, 0, nb, SUPER) as b0:
        base = [bd.mul(bd.add(b0, c64(r * gstride)), c64(P)) for r in range(RG)]
        init = [bd.load(bd.gep(panel, [bd.add(base[r], c64(QUADS + nsc))]), align=4 * L) for r in range(RG)]
        acc = [[Var(bd, init[r]) for r in range(RG)] for _ in range(TT)]
        with Loop(bd, 0, SUPER * hpb) as u:  # a sub-block at a time: LLVM spilled the sums of unrolled ones
            sums = [[acc[t][r].get() for r in range(RG)] for t in range(TT)]
            k = bd.add(bd.mul(b0, c64(G)), bd.mul(u, c64(4 * UQ)))
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
            else:
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
                           MINS[kind], (tt, rg))
    _prefill_task(mod, driver, name)
    return [name]


def build_unpack(isa, mod, code, name):
    assert takes(isa, code)
    _unpack(isa, mod, code, name)
