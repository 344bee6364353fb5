"""BF16 weights' prefill with `--activations q8` on CPUs with AVX512_BF16: vdpbf16ps, 32 multiply-adds
an instruction where the f32 tiles' FMA does 16 (llama.cpp's tinyBLAS does the same for BF16 weights).

The activations are rounded to bf16 (to nearest even: vcvtne2ps2bf16, as llama.cpp's
ggml_cpu_fp32_to_bf16) and each product of two bf16 is exact in f32: vdpbf16ps adds a pair's two
products to the f32 sum, the odd element's first. So the sums differ from the f32 tiles' by the
activations' rounding (8 significant bits) and the summation's f32 rounding; the int16 path never
takes these kernels.

The same driver as the f32 tiles (kernels_prefill._panel_driver: a task's rows unpacked a chunk of k
at a time into a stack panel, token tiles of TT x RG groups of 16 rows over it) with another panel
and micro-kernel. The panel keeps the stored bf16 pairs (`panel[g][p][lane]`: row g * 16 + lane's
elements 2p and 2p + 1, an i32 lane), 32 KiB for KC elements where the f32 panel holds half as many.
The activations are rounded once per matrix input (round_task, from forward.prepare), into chunks
of KC elements with a chunk's pairs of consecutive tokens together: every 64-row task reads all of
them, and as f32 rows rounded in each tile the down projection's (K = 8960, 18 MiB at 512 tokens)
ran at 132 GMAC/s on two threads where these reach 183.
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import BF16
from .amx import BF16T
from .core import TASK_ARGS
from .irgen import F32T, G, I16, I32, Loop, c64, call_intrinsic, const, func, ptr_to, splat, splat_c, transpose, vec
from .kernels_prefill import KC, TASK_ROWS, _panel_driver, _prefill_task, float_tile_fn
from .llvm import Isa, host_features

PAIRS_KC = KC // 2  # bf16 pairs of a chunk of k: a group's panel vectors
TILE = (6, 4)  # tokens x groups of 16 rows: 24 sums, 4 panel vectors and a broadcast of the 32 zmm


def takes(isa: Isa, code: int) -> bool:
    """Whether q8 runs BF16 weights' prefill on these tiles: the host's own AVX-512 code (the ISA
    compiles for the host's CPU) with AVX512_BF16."""
    return (code == BF16.code and isa.name == "avx512vnni" and not isa.emulated
            and host_features().get("avx512bf16", False))


def _dot(bd, acc, w, x):
    """acc + lane i's pair products: w, x <16 x i32> of bf16 pairs."""
    bt = vec(BF16T, 32)
    return call_intrinsic(bd, "llvm.x86.avx512bf16.dpbf16ps.512", acc.type, [acc, bd.bitcast(w, bt), bd.bitcast(x, bt)])


def _round_block(bd, v):
    """<32 x float> -> its 16 bf16 pairs (<16 x i32>), rounded to nearest even: one vcvtne2ps2bf16
    (its second operand's values go to the low half; fptrunc made two vcvtneps2bf16 and an insert)."""
    lo, hi = (bd.shuffle_vector(v, v, const(I32, range(h, h + G // 2))) for h in (0, G // 2))
    got = call_intrinsic(bd, "llvm.x86.avx512bf16.cvtne2ps2bf16.512", vec(BF16T, G), [hi, lo])
    return bd.bitcast(got, vec(I32, G // 2))


def _micro(isa, mod, TT, RG, name):
    """The token-tile kernel, kernels_prefill._micro_float's arguments: TT tokens x RG groups of L
    rows (consecutive panel groups) over kc elements; x points at the first token's pairs of the
    chunk, the next token's PAIRS_KC further (chunk_at; zeros past K, as the panel's)."""
    L = isa.lanes
    fn, bd, (panel, kc, x, _ldx), sums = float_tile_fn(isa, mod, name, TT, RG, I32)
    xs = bd.bitcast(x, I32.as_pointer())
    accs, store_sums = sums()
    with Loop(bd, 0, bd.udiv(bd.add(kc, c64(1)), c64(2))) as p:
        wv = [bd.load(bd.gep(panel, [bd.add(p, c64(r * PAIRS_KC))]), align=64) for r in range(RG)]
        for t in range(TT):
            xv = splat(bd, bd.load(bd.gep(xs, [bd.add(p, c64(t * PAIRS_KC))])), L)
            for r in range(RG):
                accs[t][r].set(_dot(bd, accs[t][r].get(), wv[r], xv))
    store_sums()
    return fn


def chunk_at(bd, x, stride, t0, k0):
    """The address of token t0's pairs of the chunk from k0 in the chunked activations (round_task):
    the driver's x_at, the chunk stride in bytes in its xz argument."""
    return bd.add(bd.add(x, bd.mul(bd.udiv(k0, c64(KC)), stride)), bd.mul(t0, c64(PAIRS_KC * 4)))


def _round_task(mod, name):
    """round(t, x, K, xb, stride): row t of x [T, K] f32 to bf16 pairs, chunk c's at xb + c * stride
    + t * PAIRS_KC * 4 bytes (zeros past K): a chunk's pairs of consecutive tokens lie together, so a
    task's pass over a chunk reads one run of memory."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, K, xb_, stride = fn.args[:5]
    x = bd.gep(ptr_to(bd, x_, F32T), [bd.mul(t, K)])
    vt = vec(F32T, G)
    with Loop(bd, 0, bd.udiv(bd.add(K, c64(KC - 1)), c64(KC))) as c:
        dst = bd.inttoptr(bd.add(bd.add(xb_, bd.mul(c, stride)), bd.mul(t, c64(PAIRS_KC * 4))),
                          vec(I32, G // 2).as_pointer())
        for b in range(KC // G):
            k = bd.add(bd.mul(c, c64(KC)), c64(b * G))
            mask = bd.icmp_signed("<", bd.add(splat(bd, k, G), const(ir.IntType(64), range(G))), splat(bd, K, G))
            v = call_intrinsic(bd, f"llvm.masked.load.v{G}f32.p0", vt, [bd.bitcast(bd.gep(x, [k]), vt.as_pointer()),
                                                                          ir.Constant(I32, 4), mask, splat_c(F32T, 0.0, G)])
            bd.store(_round_block(bd, v), bd.gep(dst, [c64(b)]), align=4)
    bd.ret_void()


def _unpack(isa, mod, name):
    """unpack(w, row_bytes, n_rows, k0, kc, panel, -, -): panel[g][p][lane] = the pair of elements
    k0 + 2p, k0 + 2p + 1 of row g * L + lane: L pairs of each of a group's L rows loaded at once and
    transposed with shuffles, the last kc % 2L pair by pair (an element past kc as zero); lanes past
    n_rows get zeros."""
    L = isa.lanes
    fn, bd = func(mod, name, 8)
    w, row_bytes, n_rows, k0, kc, panel_, _s, _m = fn.args
    wp, panel = ptr_to(bd, w, I16), ptr_to(bd, panel_, I32)
    vt = vec(I32, L)
    stride = bd.udiv(row_bytes, c64(2))  # elements
    kv = bd.mul(bd.udiv(kc, c64(2 * L)), c64(2 * L))
    with Loop(bd, 0, TASK_ROWS // L) as g:
        pg = bd.gep(panel, [bd.mul(g, c64(PAIRS_KC * L))])
        lanes = []
        for lane in range(L):
            rr = bd.add(bd.mul(g, c64(L)), c64(lane))
            valid = bd.icmp_signed("<", rr, n_rows)
            lanes.append((bd.gep(wp, [bd.add(bd.mul(bd.select(valid, rr, c64(0)), stride), k0)]), valid))
        with Loop(bd, 0, kv, 2 * L) as k:
            rows = [bd.select(valid, bd.load(bd.bitcast(bd.gep(row, [k]), vt.as_pointer()), align=2), splat_c(I32, 0, L))
                    for row, valid in lanes]
            for j, v in enumerate(transpose(bd, rows)):
                at = bd.mul(bd.add(bd.udiv(k, c64(2)), c64(j)), c64(L))
                bd.store(v, bd.bitcast(bd.gep(pg, [at]), vt.as_pointer()), align=64)
        with Loop(bd, kv, kc, 2) as k:
            has_odd = bd.icmp_signed("<", bd.add(k, c64(1)), kc)
            for lane, (row, valid) in enumerate(lanes):
                lo = bd.zext(bd.load(bd.gep(row, [k])), I32)
                hi = bd.select(has_odd, bd.zext(bd.load(bd.gep(row, [bd.add(k, c64(1))])), I32), ir.Constant(I32, 0))
                pair = bd.select(valid, bd.or_(lo, bd.shl(hi, ir.Constant(I32, 16))), ir.Constant(I32, 0))
                bd.store(pair, bd.gep(pg, [bd.add(bd.mul(bd.udiv(k, c64(2)), c64(L)), c64(lane))]))
    bd.ret_void()


def build(isa, mod, name) -> list[str]:
    """The driver, its micro-kernels, the panel unpack and the rounding into mod: [prefill task,
    unpack, round]."""
    tt, rg = TILE
    micro = {(n, g): _micro(isa, mod, n, g, f"{name}_tile{n}x{g}") for n in (tt, 1) for g in (rg, 1)}
    driver = _panel_driver(isa, mod, name + "_rows", KC, I32, PAIRS_KC * isa.lanes, micro, False, tile=TILE,
                           x_at=chunk_at)
    _prefill_task(mod, driver, name)
    _unpack(isa, mod, name + "_unpack")
    _round_task(mod, name + "_round")
    return [name, name + "_unpack", name + "_round"]
