"""The AVX2 q8 token tile (kernels_prefill_q8) in inline assembly, as the int16 one
(kernels_prefill._micro_quant_avx2): LLVM hoisted the IR version's loads and spilled its sums (0.56x
the int16 tile's rate on Zen 4).

vpmaddubsw multiplies x + 128 (unsigned bytes) by w as the panel holds it (signed, the weight
operand read from memory) and sums each pair into int16 with saturation; the sums start from the
panel's -128 * sum(w). A run of r quads' pair sums (kernels_prefill_q8.run_of: 510 * |w| * r <=
32767) adds up as int16 (vpaddw) before one vpmaddwd by ones: with r = 4 (|w| <= 16), 5 multiplies
per 4 quads where the int16 tile's vpmaddwd take 8. 2 tokens x 2 groups of 8 rows: 4 int32 and 4
int16 sums, a broadcast and a product in ymm0-9, the f32 sums in the others.
"""

from __future__ import annotations

from llvmlite import ir

from .irgen import F32T, I8, I16, I64, G, Loop, c64, func, load, ptr_to, splat_c, vec
from .kernels_prefill import KC, _asm_tile_sums

L = 8
QUADS = G // 4
SCALE_GROUP = KC // G * L * 4  # bytes between two groups' scales (and mins)


TILE = (2, 2)  # tokens x groups of 8 rows


def _asm_block(halves, nm, run):
    """The AT&T text of one 32-block of the tile, runs of `run` quads. Operands (n = TT * RG): $0.. the
    n f32 sums (token t, group r: $(RG * t + r); the next n the same, tied), then from $2n: the
    block's panel (group 1 $(2n + 8) bytes on), the tokens' bytes (32 each: x + 128),
    int16 ones, the groups' scales / mins (group 1 SCALE_GROUP bytes on, nm * that for the mins;
    halves 2: the second half's scale in the mins), token 0's activation scale / sum (nm 2: its two
    16-element sums of xq), the scales' row stride in bytes (of those sums: twice that), the bytes
    between the groups' panels."""
    TT, RG = TILE
    n = TT * RG
    a = lambda i: f"${2 * n + i}"
    pan, xb, ones, sc, mn, xs, xf, ld, pg = (a(i) for i in range(9))
    sx = lambda base, t: [f"({base})", f"({base},{ld})"][t]
    sz = lambda t: [f"({xf})", f"({xf},{ld},2)"][t]
    wq = lambda q, r: f"{32 * q}({pan})" if r == 0 else f"{32 * q}({pan},{pg})"
    lines = []
    per = QUADS // halves
    for h in range(halves):
        quads = range(h * per, (h + 1) * per)
        # x + 128 against w from -128 * sum(w) (the panel's vector after the quads): `run` quads'
        # pair sums as int16 (ymm4-7), then to int32 (ymm0-3)
        for t in range(TT):
            for r in range(RG):
                lines.append(f"vmovdqa {wq(QUADS + h, r)}, %ymm{RG * t + r}")
        for q in quads:
            for t in range(TT):
                lines.append(f"vpbroadcastd {32 * t + 4 * q}({xb}), %ymm8")
                for r in range(RG):
                    i16 = f"%ymm{4 + RG * t + r}"
                    if (q - quads[0]) % run == 0:
                        lines.append(f"vpmaddubsw {wq(q, r)}, %ymm8, {i16}")
                    else:
                        lines += [f"vpmaddubsw {wq(q, r)}, %ymm8, %ymm9", f"vpaddw %ymm9, {i16}, {i16}"]
            if (q - quads[0]) % run == run - 1:
                for i in range(n):
                    lines += [f"vpmaddwd ({ones}), %ymm{4 + i}, %ymm9", f"vpaddd %ymm9, %ymm{i}, %ymm{i}"]
        scale = sc if h == 0 else mn
        for t in range(TT):  # f32 sum += int32 sum * (weight scale * activation scale) (+ min * activation sum)
            lines.append(f"vbroadcastss {sx(xs, t)}, %ymm8")
            for r in range(RG):
                i = RG * t + r
                lines += [f"vcvtdq2ps %ymm{i}, %ymm{i}", f"vmulps {SCALE_GROUP * r}({scale}), %ymm8, %ymm9",
                          f"vfmadd231ps %ymm{i}, %ymm9, ${i}"]
            if nm == 1:
                lines.append(f"vbroadcastss {sx(xf, t)}, %ymm8")
                lines += [f"vfmadd231ps {SCALE_GROUP * r}({mn}), %ymm8, ${RG * t + r}" for r in range(RG)]
            elif nm == 2:  # + min h * (activation scale (ymm8) * 16-element sum h): xz rows twice as long
                for k in range(2):
                    lines += [f"vbroadcastss {4 * k}{sz(t)}, %ymm9", "vmulps %ymm8, %ymm9, %ymm9"]
                    lines += [f"vfmadd231ps {2 * SCALE_GROUP * r + 32 * k}({mn}), %ymm9, ${RG * t + r}"
                              for r in range(RG)]
    return "\n".join(lines)


def micro(mod, halves, nm, run, P, name, masked):
    """The tile, the q8 micro-kernel's arguments (P panel vectors a 32-block; run: quads whose pair
    sums add up as int16); a tile with rows past the matrix goes to `masked`, the IR version."""
    TT, RG = TILE
    n = TT * RG
    fn, bd = func(mod, name, 13)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    panel_, sc_, mn_, nb, xq_, ldx, xs_, xf_, ldxs, out_, ldo, first_, nvalid = fn.args
    outp, sums = _asm_tile_sums(bd, fn, masked, out_, ldo, first_, nvalid, TT, RG)
    vt = vec(F32T, L)
    ty = ir.FunctionType(ir.LiteralStructType([vt] * n), [vt] * n + [I64] * 9)
    clobbers = ",".join(f"~{{xmm{i}}}" for i in range(10))
    cons = ",".join(["=x"] * n + [str(i) for i in range(n)]) + "," + "r," * 9 + clobbers + ",~{memory}"
    asm = ir.InlineAsm(ty, _asm_block(halves, nm, run), cons)
    xq = ptr_to(bd, xq_, I16)
    m = max(nm, 1)
    with bd.goto_entry_block():
        scratch = bd.alloca(vec(I8, G), c64(TT))  # the tokens' block as bytes
        ones = bd.alloca(vec(I16, 16))
    scratch.align = ones.align = 32
    bd.store(splat_c(I16, 1, 16), ones)
    with Loop(bd, 0, nb) as b:
        for t in range(TT):
            q = load(bd, xq, bd.add(bd.mul(c64(t), ldx), bd.mul(b, c64(G))), vec(I16, G), align=2)
            bd.store(bd.trunc(bd.add(q, splat_c(I16, 128, G)), vec(I8, G)), bd.gep(scratch, [c64(t)]), align=32)
        args = [bd.add(panel_, bd.mul(b, c64(P * L * 4))), bd.ptrtoint(scratch, I64), bd.ptrtoint(ones, I64),
                bd.add(sc_, bd.mul(b, c64(4 * L))), bd.add(mn_, bd.mul(b, c64(4 * L * m))),
                bd.add(xs_, bd.mul(b, c64(4))), bd.add(xf_, bd.mul(b, c64(4 * m))), bd.mul(ldxs, c64(4)),
                c64(KC // G * P * L * 4)]
        got = bd.call(asm, [v.get() for v in sums] + args)
        for i, v in enumerate(sums):
            v.set(bd.extract_value(got, i))
    for p, v in zip(outp, sums):
        bd.store(v.get(), p, align=4)
    bd.ret_void()
    return fn

