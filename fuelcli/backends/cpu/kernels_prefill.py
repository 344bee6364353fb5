"""The prefill kernels: per format a panel unpack, per kind of format a driver that runs token tiles
over the panel, generated as LLVM IR for one instruction set; kernels.py puts them in modules and
compiles them.

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

Where the CPU has AMX, block-format prefill of amx.AMX_MIN_TOKENS tokens or more runs on its tiles
instead (amx.py: one driver, and per format a panel unpack built on the same block emitters).
"""

from __future__ import annotations

from llvmlite import ir

from . import amx
from . import unpack as U
from .core import TASK_ARGS
from .llvm import ISAS, Isa
from .irgen import (F32T, G, I8, I16, I32, I64, Loop, Var, func, call_intrinsic, ptr_to, as_i64, c64, const,
                    dpw, fmuladd, load, splat, splat_c, transpose, vec)

TASK_ROWS = 64  # rows of one prefill task (the driver splits a matrix into tasks of this many rows)
KC = 256  # elements of k unpacked at a time: TASK_ROWS * KC * 2 bytes = 32 KiB of stack panel
KC_FLOAT = 128  # the f32 panel: TASK_ROWS * KC_FLOAT * 4 bytes = 32 KiB
PAIRS = G // 2  # int16 pairs in a 32-element group


def tile_shape(isa: Isa, quant: bool) -> tuple[int, int]:
    """(tokens, groups of L rows) per micro-kernel pass: 2 accumulators each (int32 + f32) and a
    panel vector per group must fit the registers. On AVX-512, 3 tokens x 4 groups (28 registers)
    against 12 x 1: a panel load feeds 3 products and an activation broadcast 4, 7 loads per 12
    vpdpwssd instead of 13 (single-thread prefill of 512 tokens on a CPU with 2-cycle 512-bit ops:
    +4-17% by format)."""
    if isa.lanes == 16:  # f32: 8 tokens x 3 groups, a broadcast feeding 3 FMAs (Zen 4: 1.2-1.6x 24 x 1's rate)
        return (3, 4) if quant else (8, 3)
    if isa.name == "avx2":
        return ASM_TILE if quant else ASM_FLOAT_TILE
    return (5, 1) if quant else (10, 1)


# ------------------------------------------------------------------ block formats


def _unpack_panel(isa, bd, code, wp, row_bytes, n_rows, k0, kc, panel, scales, mins):
    """Rows [0, n_rows) of the task, elements [k0, k0+kc): the int16 pairs of row g*L + lane to
    panel[g][(b*PAIRS + p)*L + lane] (b the 32-block in the chunk), scale to [g][b*L + lane], its
    m mins (the record's mins_per_group) to [g][(b*m + h)*L + lane].
    Each group of L rows is decoded row by row into a row-major stage, then transposed L x L with
    shuffles (storing one pair at a time took 40% of a 39-token prefill). Lanes past n_rows get
    zeros (their results are never stored)."""
    L, BL, nm = isa.lanes, U.record(code).layout, U.record(code).mins_per_group
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
        mg = bd.gep(mins, [bd.mul(g, c64(nm * KC // G * L))]) if mins is not None else None
        with Loop(bd, 0, L) as lane:
            rr = bd.add(bd.mul(g, c64(L)), lane)
            srow = bd.mul(lane, c64(KC // G))

            def put(b, pairs, scale, mns):
                bd.store(pairs, bd.gep(stage, [bd.add(srow, b)]), align=64)
                at = bd.add(bd.mul(b, c64(L)), lane)
                bd.store(scale, bd.gep(sg, [at]))
                for h, mn in enumerate(mns):  # [b * nm + h][lane]
                    mat = at if nm == 1 else bd.add(bd.mul(bd.add(bd.mul(b, c64(nm)), c64(h)), c64(L)), lane)
                    bd.store(mn, bd.gep(mg, [mat]))

            with bd.if_else(bd.icmp_signed("<", rr, n_rows)) as (then, otherwise):
                with then:
                    row = bd.gep(wp, [bd.mul(rr, row_bytes)])
                    with Loop(bd, 0, bd.udiv(as_i64(kc), c64(BL.block_elems))) as fbi:
                        blk = U.block(code, bd, row, bd.add(fb0, fbi))
                        for j, w in enumerate(blk.w):
                            jj = ir.Constant(I32, j)
                            put(bd.add(bd.mul(fbi, c64(per)), c64(j)), bd.bitcast(w, vp),
                                bd.extract_element(blk.scale, jj),
                                [bd.extract_element(blk.min, ir.Constant(I32, nm * j + h)) for h in range(nm)])
                with otherwise:
                    with Loop(bd, 0, nb) as b:
                        put(b, splat_c(I32, 0, PAIRS), ir.Constant(F32T, 0.0), [ir.Constant(F32T, 0.0)] * nm)
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


def _micro_quant(isa, mod, nm, TT, RG, name):
    """The token-tile kernel: TT tokens x RG groups of L rows (consecutive panel groups) over nb
    32-blocks, each with nm mins (driver_kind): 1, times the activations' block sum (xf); 2, each
    times the activations' 16-element sum of xq and their scale (xf is then xz). A panel load feeds
    TT products, an activation broadcast RG."""
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
        if nm == 1:
            m = [[bd.load(bd.gep(mn, [bd.add(b, c64(r * gstride))]), align=4)] for r in range(RG)]
        else:  # [b * nm + h] of each group's nm * gstride vectors
            m = [[bd.load(bd.gep(mn, [bd.add(bd.mul(b, c64(nm)), c64(h + r * nm * gstride))]), align=4)
                  for h in range(nm)] for r in range(RG)]
        for t in range(TT):
            xs1 = bd.load(bd.gep(xs, [bd.add(srow[t], b)]))
            xst = splat(bd, xs1, L)
            if nm == 1:
                xft = [splat(bd, bd.load(bd.gep(xf, [bd.add(srow[t], b)])), L)]
            elif nm == 2:  # xf is xz: each 16-element sum of xq times the activation scale
                zrow = bd.mul(bd.add(srow[t], b), c64(nm))
                xft = [splat(bd, bd.fmul(xs1, bd.load(bd.gep(xf, [bd.add(zrow, c64(h))]))), L) for h in range(nm)]
            else:
                xft = []
            for r in range(RG):
                a = fmuladd(bd, bd.sitofp(isums[t][r], vec(F32T, L)), bd.fmul(d[r], xst), accs[t][r].get())
                for mh, xh in zip(m[r], xft):
                    a = fmuladd(bd, mh, xh, a)
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


def _asm_block(nm):
    """The AT&T text of one 32-block of the AVX2 micro-kernel: 3 tokens x 2 groups of 8 rows, nm
    mins a block as _micro_quant. Operands: $0-$5 the f32 sums (token t, group r: $(2t + r); $6-$11
    the same, tied), $12 the block's panel (group 1 PANEL_GROUP bytes on), $13 the token-0
    activations (int16 pairs), $14 their row stride in bytes, $15 / $16 the groups' scales / mins
    (group 1 SCALE_GROUP / nm * SCALE_GROUP bytes on), $17 / $18 token 0's activation scale / sum
    (nm = 2: its two 16-element sums), $19 the scales' row stride in bytes (of the sums: nm times
    that). The int32 sums are ymm0-5, the panel vectors ymm6-7, the broadcast ymm8, a product ymm9."""
    x = ["($13)", "($13,$14)", "($13,$14,2)"]
    sx = lambda base, t: [f"({base})", f"({base},$19)", f"({base},$19,2)"][t]  # noqa: E731
    sz = ["($18)", "($18,$19,2)", "($18,$19,4)"]  # nm = 2: token t's 16-element sums
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
        if nm == 1:
            lines.append(f"vbroadcastss {sx('$18', t)}, %ymm8")
            lines += [f"vfmadd231ps {SCALE_GROUP * r}($16), %ymm8, ${2 * t + r}" for r in range(2)]
        elif nm == 2:  # + min h * (activation scale (ymm8) * 16-element sum h)
            for h in range(2):
                lines += [f"vbroadcastss {4 * h}{sz[t]}, %ymm9", "vmulps %ymm8, %ymm9, %ymm9"]
                lines += [f"vfmadd231ps {2 * SCALE_GROUP * r + 32 * h}($16), %ymm9, ${2 * t + r}" for r in range(2)]
    return "\n".join(lines)


def _micro_quant_avx2(mod, nm, name, masked):
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
    asm = ir.InlineAsm(ty, _asm_block(nm), "=x,=x,=x,=x,=x,=x,0,1,2,3,4,5," + "r," * 8 + clobbers + ",~{memory}")
    m = max(nm, 1)
    with Loop(bd, 0, nb) as b:
        args = [bd.add(panel_, bd.mul(b, c64(PAIRS * L * 4))), bd.add(xq_, bd.mul(b, c64(2 * G))), bd.mul(ldx, c64(2)),
                bd.add(sc_, bd.mul(b, c64(4 * L))), bd.add(mn_, bd.mul(b, c64(4 * L * m))),
                bd.add(xs_, bd.mul(b, c64(4))), bd.add(xf_, bd.mul(b, c64(4 * m))), bd.mul(ldxs, c64(4))]
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
    mins = ptr_to(bd, mins_, F32T) if U.record(code).mins_per_group else None
    _unpack_panel(isa, bd, code, ptr_to(bd, w, I8), row_bytes, n_rows, k0, kc, ptr_to(bd, panel_, I32),
                  ptr_to(bd, scales_, F32T), mins)
    bd.ret_void()


def _prefill_task(mod, driver, name, rows=TASK_ROWS):
    """prefill task: rows [task*rows, ...) of (unpack, w, n_rows, row_bytes, K, T, x, xs, xf, out, xz)."""
    fn, bd = func(mod, name, TASK_ARGS)
    task, unpack, w, n_rows, row_bytes, K, T, x, xs, xf, out, xz = fn.args
    r0 = bd.mul(task, c64(rows))
    nr = bd.sub(n_rows, r0)
    nr = bd.select(bd.icmp_signed(">", nr, c64(rows)), c64(rows), nr)
    bd.call(driver, [unpack, bd.add(w, bd.mul(r0, row_bytes)), row_bytes, nr, K, T, x, xs, xf,
                     bd.add(out, bd.mul(r0, c64(4))), n_rows, xz])
    bd.ret_void()


def _panel_driver(isa, mod, name, kc_max, panel_ty, panel_elems, micro, quant, nm=0, tile=None, x_at=None):
    """prefill(unpack, w, row_bytes, n_rows, K, T, x, xs, xf, out, ldo, xz): for each chunk of k, the
    format's `unpack` (called by address) fills the stack panel, then every token tile runs over it
    (micro[tokens, groups]: TT tokens x RG groups of rows, a task's last groups and tokens singly:
    `tile`, else tile_shape's); nm mins a 32-block (_micro_quant: with 2, the tiles read xz where the
    others read xf). x_at(bd, x, stride, t0, k0): the address of token t0's elements from k0 where x
    is in chunks of KC elements (kernels_prefill_bf16, kernels_prefill_q8: their chunk_at), the chunk
    stride in the argument the kind does not read: xz, or with nm 2 xf."""
    L = isa.lanes
    TT, RG = tile or tile_shape(isa, quant)
    fn, bd = func(mod, name, 12)
    fn.linkage = "internal"
    unpack_, w, row_bytes, n_rows, K, T, x_, xs_, xf_, out_, ldo, xz_ = fn.args
    ngroups = TASK_ROWS // L
    nsc = kc_max // G * L  # scales of one group
    nmn = max(nm, 1) * nsc  # mins of one group
    with bd.goto_entry_block():
        panel = bd.alloca(panel_ty, c64(ngroups * panel_elems))
        scales = bd.alloca(F32T, c64(ngroups * nsc))
        mins = bd.alloca(F32T, c64(ngroups * nmn))
    panel.align = scales.align = mins.align = 64
    unpack = bd.inttoptr(unpack_, ir.FunctionType(ir.VoidType(), [I64] * 8).as_pointer())
    wp = bd.inttoptr(w, I8.as_pointer())
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
                xp = (x_at(bd, x_, xf_ if nm == 2 else xz_, t0, k0) if x_at else
                      bd.add(x_, bd.mul(bd.add(bd.mul(t0, K), k0), c64(xbytes))))
                op = bd.add(out_, bd.mul(bd.add(bd.mul(t0, ldo), gl), c64(4)))
                pp = bd.ptrtoint(bd.gep(panel, [bd.mul(g, c64(panel_elems))]), I64)
                if quant:
                    so = bd.mul(bd.add(bd.mul(t0, nbk), b0), c64(4))
                    args = [pp, bd.ptrtoint(bd.gep(scales, [bd.mul(g, c64(nsc))]), I64),
                            bd.ptrtoint(bd.gep(mins, [bd.mul(g, c64(nmn))]), I64), bd.udiv(kc, c64(G)),
                            xp, K, bd.add(xs_, so), bd.add(xz_, bd.mul(so, c64(2))) if nm == 2 else bd.add(xf_, so),
                            nbk, op, ldo, first, nv]
                else:
                    args = [pp, kc, xp, K, op, ldo, first, nv]
                bd.call(micro[tt, rg], args)

            with Loop(bd, 0, n_rg, RG) as g:
                groups(g, RG)
            if RG > 1:
                with Loop(bd, n_rg, ngv) as g:
                    groups(g, 1)

        n_main = bd.mul(bd.udiv(T, c64(TT)), c64(TT))
        # the next chunk's weights (after the last, the next task's rows' first chunk), a few rows
        # per token tile, so that the unpack finds them in cache: a MoE expert's ~32 tokens leave
        # too little work a chunk to hide its reads from memory (q8, Q4_K 768 x 2048, 32 tokens, one
        # thread: 117.6 GMAC/s cached, 95.6 from memory before, 118.5 now)
        last = bd.icmp_signed(">=", bd.add(k0, c64(kc_max)), K)
        nxt = bd.select(last, c64(0), bd.add(k0, c64(kc_max)))
        pb0 = bd.udiv(bd.mul(nxt, row_bytes), K)
        pb1 = bd.udiv(bd.mul(bd.add(nxt, c64(kc_max)), row_bytes), K)
        pb1 = bd.select(bd.icmp_signed("<", pb1, row_bytes), pb1, row_bytes)
        roff = bd.select(last, c64(TASK_ROWS), c64(0))
        n_tiles = bd.udiv(T, c64(TT))
        n_tiles = bd.select(bd.icmp_signed(">", n_tiles, c64(0)), n_tiles, c64(1))
        rp = bd.udiv(bd.add(n_tiles, c64(TASK_ROWS - 1)), n_tiles)  # rows a token tile
        with Loop(bd, 0, n_main, TT) as t0:
            r0 = bd.add(roff, bd.mul(bd.udiv(t0, c64(TT)), rp))
            r1 = bd.add(r0, rp)
            r1 = bd.select(bd.icmp_signed("<", r1, bd.add(roff, c64(TASK_ROWS))), r1, bd.add(roff, c64(TASK_ROWS)))
            with Loop(bd, r0, r1) as r:
                amx.prefetch_row(bd, wp, r, row_bytes, pb0, pb1, 2)
            tile(t0, TT)
        with Loop(bd, n_main, T) as t0:
            tile(t0, 1)
    bd.ret_void()
    return fn


# ------------------------------------------------------------------ float formats (f32, f16, bf16)


def float_tile_fn(isa, mod, name, TT, RG, panel_lane):
    """A float token tile's function and builder (arguments panel, kc, x, ldx, out, ldo, first,
    nvalid), the panel as vectors of L panel_lane, kc, x and ldx, and `sums`: called where the
    tile's loop begins, it loads the TT x RG sums from out (zeros if first) and returns them with the
    function that stores them back and returns."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, kc, x_, ldx, out_, ldo, first_, nvalid = fn.args
    panel, x, out = ptr_to(bd, panel_, vec(panel_lane, L)), ptr_to(bd, x_, F32T), ptr_to(bd, out_, F32T)
    first = bd.icmp_signed("!=", first_, c64(0))

    def sums():
        masks = [_lane_mask(bd, bd.sub(nvalid, c64(r * L)), L) for r in range(RG)]
        outp = [[bd.gep(out, [bd.add(bd.mul(c64(t), ldo), c64(r * L))]) for r in range(RG)] for t in range(TT)]
        accs = [[Var(bd, _load_out(bd, outp[t][r], masks[r], L, first)) for r in range(RG)] for t in range(TT)]

        def store():
            for t in range(TT):
                for r in range(RG):
                    _store_out(bd, outp[t][r], accs[t][r].get(), masks[r], L)
            bd.ret_void()
        return accs, store
    return fn, bd, (panel, kc, x, ldx), sums


def _micro_float(isa, mod, TT, RG, name):
    """The f32 token-tile kernel: TT tokens x RG groups of L rows (consecutive panel groups) over
    kc elements; a panel load feeds TT FMAs, a broadcast RG."""
    L = isa.lanes
    fn, bd, (panel, kc, x, ldx), sums = float_tile_fn(isa, mod, name, TT, RG, F32T)
    accs, store_sums = sums()
    xrow = [bd.gep(x, [bd.mul(c64(t), ldx)]) for t in range(TT)]
    with Loop(bd, 0, kc) as k:
        wv = [bd.load(bd.gep(panel, [bd.add(k, c64(r * KC_FLOAT))]), align=4) for r in range(RG)]
        for t in range(TT):
            xv = splat(bd, bd.load(bd.gep(xrow[t], [k])), L)
            for r in range(RG):
                accs[t][r].set(fmuladd(bd, wv[r], xv, accs[t][r].get()))
    store_sums()
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


def build_unpack(isa, mod, code, name):
    """A format's panel unpack `name` into mod (the prefill driver calls it by address)."""
    (_unpack_quant if U.record(code).quant else _unpack_float)(isa, mod, code, name)


def build_driver(isa, mod, kind, name) -> list[str]:
    """The prefill driver of a kind of format (unpack.driver_kind, or "amx") and its micro-kernels into
    mod: the names of its entry points (the AMX driver's module also holds the activation split)."""
    if kind == "amx":
        _prefill_task(mod, amx.driver(mod, name + "_rows"), name, amx.ROWS)
        amx.split_task(mod, name + "_split")
        return [name, name + "_split"]
    if kind == "float":
        tt, rg = tile_shape(isa, False)
        micro = {(n, g): _micro_float(isa, mod, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
        if isa.name == "avx2":
            micro[tt, rg] = _micro_float_avx2(mod, f"{name}_asm", micro[tt, rg])
        driver = _panel_driver(isa, mod, name + "_rows", KC_FLOAT, F32T, KC_FLOAT * isa.lanes, micro, False)
    else:
        nm = ("quant", "quant_min", "quant_min16").index(kind)  # mins a 32-block (emit.CpuFormat.driver_kind)
        tt, rg = tile_shape(isa, True)
        micro = {(n, g): _micro_quant(isa, mod, nm, n, g, f"{name}_tile{n}x{g}") for n in {tt, 1} for g in {rg, 1}}
        if isa.name == "avx2":
            micro[tt, rg] = _micro_quant_avx2(mod, nm, f"{name}_asm", micro[tt, rg])
        driver = _panel_driver(isa, mod, name + "_rows", KC, I32, KC // 2 * isa.lanes, micro, True, nm)
    _prefill_task(mod, driver, name)
    return [name]
