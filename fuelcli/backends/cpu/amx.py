"""Prefill products on AMX tiles (CPUs with AMX-BF16), for the block formats.

One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 f32 sums: 8,192
multiply-adds, where the vector path's vpdpwssd does 32 (measured here: 1.1 T multiply-adds/s per
core, 7x the vector peak). bf16 keeps 8 significant bits, so each activation and each decoded weight
is split into a bf16 high part and a bf16 low part (the rounded rest): x = xh + xl, w = wh + wl, and
three products xh·wh + xh·wl + xl·wh keep ~16 significant bits of each (the dropped xl·wl is below
2^-18 of the product), sums in f32 — the precision of the int16 activations of the vector path
(matmul.py), with the weights decoded exactly (unpack.exact_values) instead of kept as integers.
Fewer planes would round the weights themselves to bf16 (a model converted to bf16). Float formats
(f32, f16, bf16) keep the vector path's f32 products: ~2^-17 per product moved the logits of the
tiny f32 test models by up to 8e-4 against transformers, four times the oracle tests' tolerance.

Layout (the activations are the tiles' A operand, the weights B, so C is [token][row] like `out`):
  planes   split(t, x, ldx, K, planes, T): row t of x -> bf16, Kp = K rounded up to 32 (zeros
           past K), stored as A tiles: [t / 16][k / 32][t % 16][32] (a tile is 1 KiB in one piece:
           25% faster than rows Kp apart, measured), the high parts first, the low parts
           Tpad * Kp further (Tpad = T rounded up to 16: a tile never reads outside its plane).
  panel    a task's 256 rows (16 groups of 16) over KCA elements of k, unpacked by the format's
           `unpack_amx` as B tiles: [kb][group][plane] 1 KiB tiles of [16 pairs of k][16 rows][2].
           Rows past the matrix are zeros.
  driver   for each chunk of k: unpack, then every 16-token tile accumulates 4 C tiles (one per
           group) over the chunk, for each quad of groups in turn: per 32 elements 2 A loads, 8 B
           loads, 12 products; meanwhile the next chunk's weights are fetched into the cache.
Tiles past the last token or row go through a stack scratch (a C tile store writes 16 rows).

The kernel needs the OS's permission for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, once per
process) and the CPU's amx-tile, amx-bf16 and avx512bf16; FUEL_AMX=0 keeps the vector path.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import lru_cache

from llvmlite import ir

from . import unpack as U
from .core import TASK_ARGS
from .irgen import (F32T, G, I8, I32, I64, Loop, c64, call_intrinsic, const, func, prefetch, ptr_to, splat, splat_c,
                    transpose, vec)
from .llvm import Isa, host_features

TILE = 16  # tokens (C rows) and weight rows (C columns) of one tile
KCA = 512  # elements of k per panel chunk: 16 x 16 x 2 tiles of 1 KiB = 512 KiB of stack (threads have MiBs)
QUAD = 4  # C tiles (groups of 16 rows) a token tile accumulates at once: tiles 0-3
ROWS = 4 * QUAD * TILE  # rows of one task. A task reads all of the activations, token tile by token
# tile: from L3 or memory for its first quad, mostly from L2 for the later ones, so a matrix of
# 4-quad tasks reads them half as often as one of 2-quad tasks (pp512 of the 1.5B-shape Q4_K_M
# file 190 against 166 t/s, 2 threads)
# a matrix input of fewer tokens takes the vector kernels: the panel unpack (exact decode, split,
# transpose) costs per weight what the tiles save per token, and the two paths ran even from 32 to
# 64 tokens (the Qwen demo's prefill; docs/performance.md)
AMX_MIN_TOKENS = 64
_NEEDS = ("amx-tile", "amx-bf16", "avx512bf16")


class _BFloat(ir.Type):
    """LLVM's bfloat (llvmlite has no such type): fptrunc to it is vcvtneps2bf16 (round to even)."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


BF16T = _BFloat()


@lru_cache(maxsize=None)
def permitted() -> bool:
    """Asks Linux for the tile data state (XFEATURE_XTILEDATA, 18) once per process: without it
    the first tile instruction faults (SIGILL)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0  # arch_prctl(REQ_XCOMP_PERM)
    except (OSError, AttributeError):
        return False


def available(isa: Isa) -> bool:
    """Whether prefill runs on AMX tiles: the host's own AVX-512 code, its AMX and the permission."""
    if os.environ.get("FUEL_AMX", "").strip() == "0" or isa.name != "avx512vnni":
        return False
    feats = host_features()
    return all(feats.get(f, False) for f in _NEEDS) and permitted()


# ------------------------------------------------------------------ tile instructions


def _t(n):
    return ir.Constant(I8, n)


def _tile(bd, op, *args):
    call_intrinsic(bd, f"llvm.x86.{op}", ir.VoidType(), list(args))


def _i8p(bd, addr):
    return bd.inttoptr(addr, I8.as_pointer()) if addr.type == I64 else bd.bitcast(addr, I8.as_pointer())


def _load(bd, tile, addr, stride):
    _tile(bd, "tileloadd64", _t(tile), _i8p(bd, addr), stride)


def _store(bd, tile, addr, stride):
    _tile(bd, "tilestored64", _t(tile), _i8p(bd, addr), stride)


def _split(bd, v):
    """<n x float> -> (high, low) as <n/2 x i32> bf16 pairs: high = bf16(v), low = bf16(v - high).
    NaN stays NaN in both; inf gives a NaN low part, so an inf input reaches the sums as NaN."""
    n = v.type.count
    hi = bd.fptrunc(v, vec(BF16T, n))
    lo = bd.fptrunc(bd.fsub(v, bd.fpext(hi, vec(F32T, n))), vec(BF16T, n))
    return bd.bitcast(hi, vec(I32, n // 2)), bd.bitcast(lo, vec(I32, n // 2))


def _round_up(bd, n, m):
    return bd.and_(bd.add(n, c64(m - 1)), c64(-m))


# ------------------------------------------------------------------ activations -> planes


def split_task(mod, name):
    """split(t, x, ldx, K, planes, T): row t of x into the high and low bf16 planes."""
    fn, bd = func(mod, name, TASK_ARGS)
    t, x_, ldx, K, planes_, T = fn.args[:6]
    Kp = _round_up(bd, K, G)
    x = bd.gep(ptr_to(bd, x_, F32T), [bd.mul(t, ldx)])
    planes = ptr_to(bd, planes_, vec(I32, G // 2))
    nkb = bd.udiv(Kp, c64(G))
    # in 64-byte vectors: row t of tile 0 of its token tile; the tiles along k are 16 apart
    hi_row = bd.add(bd.mul(bd.mul(bd.udiv(t, c64(TILE)), nkb), c64(TILE)), bd.urem(t, c64(TILE)))
    lo_row = bd.add(hi_row, bd.mul(_round_up(bd, T, TILE), nkb))
    vt = vec(F32T, G)
    with Loop(bd, 0, bd.udiv(Kp, c64(G))) as b:
        k = bd.mul(b, c64(G))
        mask = bd.icmp_signed("<", bd.add(splat(bd, k, G), const(I64, range(G))), splat(bd, K, G))
        v = call_intrinsic(bd, f"llvm.masked.load.v{G}f32.p0", vt, [bd.bitcast(bd.gep(x, [k]), vt.as_pointer()),
                                                                      ir.Constant(I32, 4), mask, splat_c(F32T, 0.0, G)])
        hi, lo = _split(bd, v)
        bd.store(hi, bd.gep(planes, [bd.add(hi_row, bd.mul(b, c64(TILE)))]), align=4)
        bd.store(lo, bd.gep(planes, [bd.add(lo_row, bd.mul(b, c64(TILE)))]), align=4)
    bd.ret_void()


# ------------------------------------------------------------------ weights -> panel (per format)


def _row_chunk(bd, code, row, k0, kc, emit):
    """emit(kb, <32 x float>) for each 32-group kb of elements [k0, k0 + kc) of one stored row."""
    BL = U.record(code).layout
    per = BL.block_elems // G
    fb0 = bd.udiv(k0, c64(BL.block_elems))
    with Loop(bd, 0, bd.udiv(kc, c64(BL.block_elems))) as fbi:
        blk = U.block(code, bd, row, bd.add(fb0, fbi))
        for j in range(per):
            emit(bd.add(bd.mul(fbi, c64(per)), c64(j)), U.exact_values(bd, blk, j))


def unpack_task(mod, code, name):
    """unpack_amx(w, row_bytes, n_rows, k0, kc, panel, -, -): rows [0, ROWS) of a task, elements
    [k0, k0 + kc) (kc a multiple of the format's block), as the panel's B tiles: each group of 16
    rows is decoded row by row into a row-major stage, then transposed 16 x 16."""
    fn, bd = func(mod, name, 8)
    w_, row_bytes, n_rows, k0, kc, panel_ = fn.args[:6]
    wp = ptr_to(bd, w_, I8)
    v16 = vec(I32, TILE)
    panel = ptr_to(bd, panel_, v16)
    nkb = KCA // G
    with bd.goto_entry_block():
        stage = bd.alloca(v16, c64(TILE * nkb * 2))  # [row][kb][plane]
    stage.align = 64
    zero = splat_c(I32, 0, TILE)
    with Loop(bd, 0, ROWS // TILE) as g:
        with Loop(bd, 0, TILE) as r:
            rr = bd.add(bd.mul(g, c64(TILE)), r)
            srow = bd.mul(r, c64(nkb * 2))

            def emit(kb, v):
                hi, lo = _split(bd, v)
                bd.store(hi, bd.gep(stage, [bd.add(srow, bd.mul(kb, c64(2)))]), align=64)
                bd.store(lo, bd.gep(stage, [bd.add(srow, bd.add(bd.mul(kb, c64(2)), c64(1)))]), align=64)

            with bd.if_else(bd.icmp_signed("<", rr, n_rows)) as (inside, past):
                with inside:
                    _row_chunk(bd, code, bd.gep(wp, [bd.mul(rr, row_bytes)]), k0, kc, emit)
                with past:
                    with Loop(bd, 0, c64(nkb * 2)) as i:
                        bd.store(zero, bd.gep(stage, [bd.add(srow, i)]), align=64)
        with Loop(bd, 0, bd.udiv(kc, c64(G))) as kb:
            for plane in (0, 1):
                rows = [bd.load(bd.gep(stage, [bd.add(c64(r * nkb * 2 + plane), bd.mul(kb, c64(2)))]), align=64)
                        for r in range(TILE)]
                tile = bd.mul(bd.add(bd.mul(bd.add(bd.mul(kb, c64(ROWS // TILE)), g), c64(2)), c64(plane)), c64(TILE))
                for p, v in enumerate(transpose(bd, rows)):
                    bd.store(v, bd.gep(panel, [bd.add(tile, c64(p))]), align=64)
    bd.ret_void()


# ------------------------------------------------------------------ the driver (every format)


def _copy_c(bd, out, ldo, cs, tv, n_rows, to_out):
    """Rows [0, tv) of a quad's C tiles between `out` ([token][ldo] f32) and the scratch cs
    ([group][16 rows] <16 x float>), columns past n_rows left alone."""
    vt = vec(F32T, TILE)
    with Loop(bd, 0, tv) as r:
        for g in range(QUAD):
            nv = bd.sub(n_rows, c64(g * TILE))
            mask = bd.icmp_signed("<", const(I64, range(TILE)), splat(bd, nv, TILE))
            o = bd.bitcast(bd.gep(out, [bd.add(bd.mul(r, ldo), c64(g * TILE))]), vt.as_pointer())
            s = bd.gep(cs, [bd.add(c64(g * TILE), r)])
            if to_out:
                call_intrinsic(bd, f"llvm.masked.store.v{TILE}f32.p0", ir.VoidType(),
                               [bd.load(s, align=64), o, ir.Constant(I32, 4), mask])
            else:
                bd.store(call_intrinsic(bd, f"llvm.masked.load.v{TILE}f32.p0", vt,
                                        [o, ir.Constant(I32, 4), mask, splat_c(F32T, 0.0, TILE)]), s, align=64)


def _products(bd, ah, al, tile):
    """C_g += A·B over one 32-element step for a quad's 4 groups: tiles 0-3 C, 4/5 the token tile's
    high and low A, 6/7 two groups' B in turn (high x high, low x high, high x low)."""
    _load(bd, 4, ah, c64(64))
    _load(bd, 5, al, c64(64))
    for g in (0, 2):
        _load(bd, 6, tile(g, 0), c64(64))
        _load(bd, 7, tile(g + 1, 0), c64(64))
        for a in (4, 5):
            _tile(bd, "tdpbf16ps", _t(g), _t(a), _t(6))
            _tile(bd, "tdpbf16ps", _t(g + 1), _t(a), _t(7))
        _load(bd, 6, tile(g, 1), c64(64))
        _load(bd, 7, tile(g + 1, 1), c64(64))
        _tile(bd, "tdpbf16ps", _t(g), _t(4), _t(6))
        _tile(bd, "tdpbf16ps", _t(g + 1), _t(4), _t(7))


def _quad(bd, q, first, direct, obase, ostride, ldo, cs, tv, nq, abase, lo_plane, kc, panel_addr):
    """One token tile x one quad over the chunk: C in (zero, from out, or through the scratch when
    the tile has fewer than 16 tokens or rows), the products, C out."""
    with bd.if_else(first) as (fresh, more):
        with fresh:
            for g in range(QUAD):
                _tile(bd, "tilezero", _t(g))
        with more:
            with bd.if_else(direct) as (whole, part):
                with whole:
                    for g in range(QUAD):
                        _load(bd, g, bd.gep(obase, [c64(g * TILE)]), ostride)
                with part:
                    _copy_c(bd, obase, ldo, cs, tv, nq, to_out=False)
                    for g in range(QUAD):
                        _load(bd, g, bd.gep(cs, [c64(g * TILE)]), c64(64))
    with Loop(bd, 0, bd.udiv(kc, c64(G))) as kb:
        ah = bd.add(abase, bd.mul(kb, c64(1024)))
        pb = bd.add(panel_addr, bd.mul(bd.add(bd.mul(kb, c64(ROWS // TILE)), bd.mul(q, c64(QUAD))), c64(2 * 1024)))
        _products(bd, ah, bd.add(ah, lo_plane), lambda g, plane: bd.add(pb, c64((g * 2 + plane) * 1024)))
    with bd.if_else(direct) as (whole, part):
        with whole:
            for g in range(QUAD):
                _store(bd, g, bd.gep(obase, [c64(g * TILE)]), ostride)
        with part:
            for g in range(QUAD):
                _store(bd, g, bd.gep(cs, [c64(g * TILE)]), c64(64))
            _copy_c(bd, obase, ldo, cs, tv, nq, to_out=True)


def prefetch_row(bd, wp, r, row_bytes, b0, b1, locality=3):
    """Bytes [b0, b1) of stored row r, a cache line at a time (irgen.prefetch's locality)."""
    with Loop(bd, b0, b1, 64) as off:
        prefetch(bd, bd.gep(wp, [bd.add(bd.mul(r, row_bytes), off)]), locality)


def driver(mod, name):
    """prefill(unpack, w, row_bytes, n_rows, K, T, planes, -, -, out, ldo, -) for the <= ROWS rows of a
    task (the same arguments as the vector drivers: kernels_prefill._prefill_task calls it)."""
    fn, bd = func(mod, name, 12)
    fn.linkage = "internal"
    unpack_, w, row_bytes, n_rows, K, T, x_, _xs, _xf, out_, ldo, _xz = fn.args
    v16 = vec(I32, TILE)
    nkb = KCA // G
    with bd.goto_entry_block():
        cfg = bd.alloca(vec(I8, 64))
        panel = bd.alloca(v16, c64(nkb * (ROWS // TILE) * 2 * TILE))
        cs = bd.alloca(vec(F32T, TILE), c64(QUAD * TILE))
    cfg.align = panel.align = cs.align = 64
    # palette 1; tiles 0-7 of 16 rows x 64 bytes
    bd.store(const(I8, [1] + [0] * 15 + [64, 0] * 8 + [0] * 16 + [TILE] * 8 + [0] * 8), cfg, align=64)
    _tile(bd, "ldtilecfg", bd.bitcast(cfg, I8.as_pointer()))
    Kp = _round_up(bd, K, G)
    lo_plane = bd.mul(bd.mul(_round_up(bd, T, TILE), Kp), c64(2))
    ostride = bd.mul(ldo, c64(4))
    out = ptr_to(bd, out_, F32T)
    unpack = bd.inttoptr(unpack_, ir.FunctionType(ir.VoidType(), [I64] * 8).as_pointer())
    panel_addr = bd.ptrtoint(panel, I64)
    wp = bd.inttoptr(w, I8.as_pointer())
    with Loop(bd, 0, Kp, KCA) as k0:
        kc = bd.select(bd.icmp_signed("<", bd.sub(Kp, k0), c64(KCA)), bd.sub(Kp, k0), c64(KCA))
        bd.call(unpack, [w, row_bytes, n_rows, k0, kc, panel_addr, c64(0), c64(0)])
        first = bd.icmp_signed("==", k0, c64(0))
        # the next chunk's weights, a few rows per token tile, so that the unpack finds them in
        # cache: reading row after row of blocks from memory, it waited (matrices with K = 8960
        # +6-9%, one thread; with K = 1536 the task's first of three chunks is not fetched ahead)
        nb0 = bd.udiv(bd.mul(bd.add(k0, c64(KCA)), row_bytes), K)
        nb1 = bd.udiv(bd.mul(bd.add(k0, c64(2 * KCA)), row_bytes), K)
        nb1 = bd.select(bd.icmp_signed("<", nb1, row_bytes), nb1, row_bytes)
        rp = bd.udiv(bd.add(c64(ROWS * TILE - 1), T), T)
        with Loop(bd, 0, T, TILE) as t0:
            r0 = bd.mul(bd.udiv(t0, c64(TILE)), rp)
            r1 = bd.add(r0, rp)
            with Loop(bd, r0, bd.select(bd.icmp_signed("<", r1, n_rows), r1, n_rows)) as r:
                prefetch_row(bd, wp, r, row_bytes, nb0, nb1)
            left = bd.sub(T, t0)
            tv = bd.select(bd.icmp_signed("<", left, c64(TILE)), left, c64(TILE))
            abase = bd.add(x_, bd.mul(bd.add(bd.mul(t0, Kp), bd.mul(k0, c64(TILE))), c64(2)))
            with Loop(bd, 0, ROWS // (QUAD * TILE)) as q:
                nq = bd.sub(n_rows, bd.mul(q, c64(QUAD * TILE)))  # the quad's rows in the matrix
                with bd.if_then(bd.icmp_signed(">", nq, c64(0))):
                    obase = bd.gep(out, [bd.add(bd.mul(t0, ldo), bd.mul(q, c64(QUAD * TILE)))])
                    direct = bd.and_(bd.icmp_signed(">=", nq, c64(QUAD * TILE)), bd.icmp_signed("==", tv, c64(TILE)))
                    _quad(bd, q, first, direct, obase, ostride, ldo, cs, tv, nq, abase, lo_plane, kc, panel_addr)
    _tile(bd, "tilerelease")
    bd.ret_void()
    return fn
