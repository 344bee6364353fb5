"""The CPU side of every weight format: one record per format (emit.CpuFormat), registered by its
code, and the calls the kernels make through it.

A record holds a format's emitters (emit_floats.py, emit_legacy.py, emit_k_quants.py,
emit_iq.py, emit_ternary.py) and the few facts the kernels need of it (a min per group, the zero
point the planes kernels take off, ...); the kernels (kernels_decode.py, kernels_prefill.py, amx.py) ask the
record, never a format's name. Adding a format: its description in fuelcli/formats, its emitters
and record in the emit module of its kind (listed below), its CUDA decoder (backends/cuda/kernels/); the check below catches a format the
registry has without a CPU record.
"""

from __future__ import annotations

from llvmlite import ir

from ...formats import BY_CODE
from . import emit_floats, emit_iq, emit_k_quants, emit_legacy, emit_ternary
from .emit import PLANES_KBLOCK, Block, CpuFormat, PlanesBlocks, WordChunk  # noqa: F401 (core.py's layout)
from .irgen import F32T, G, I32, const, splat, vec

CPU: dict[int, CpuFormat] = {r.code: r for m in (emit_floats, emit_legacy, emit_k_quants, emit_iq, emit_ternary)
                         for r in m.RECORDS}
assert set(CPU) == {f.code for f in BY_CODE}, "a format in fuelcli/formats has no CPU record"


def record(code: int) -> CpuFormat:
    return CPU[code]


def block(code: int, bd, row, blk) -> Block:
    """Format block `blk` (i64) of the row at `row` (i8*), unpacked."""
    return CPU[code].block(bd, row, blk)


def planes_blocks(code: int, bd, rows, b0, nblk, xs) -> PlanesBlocks:
    """`nblk` format blocks from block b0 (i64) of 1 or 2 rows (i8* each) for the planes decode
    kernels; xs: the activations' scales of their 32-element groups (<nblk * block_elems / 32 x
    float>)."""
    return CPU[code].planes(bd, rows, b0, nblk, xs)


def word_chunk(code: int, bd, row, b0, n: int = 1) -> WordChunk:
    """Format blocks b0 .. b0 + n - 1 (b0 an i64) of the row at `row` (i8*) as groups of words: one
    K-quant block (n = 1), or n blocks of a 32-element format."""
    return CPU[code].words(bd, row, b0, n)


def floats(code: int, bd, row, k, n: int, exact: bool = False):
    """<n x float> of elements k..k+n-1 (k an i64) of a float-format row at `row` (i8*); `exact`:
    as the numpy decode converts them (f16 NaN payloads)."""
    return CPU[code].floats(bd, row, k, n, exact)


def exact_values(bd, blk: Block, j: int):
    """<32 x float>: group j of the block decoded as the numpy decode rounds it (no fused
    multiply-add, no reassociation: the builder sets no fast-math flags)."""
    jj = ir.Constant(I32, j)
    sv, wv = blk.exact[j] if blk.exact is not None else (splat(bd, bd.extract_element(blk.scale, jj), G), blk.w[j])
    v = bd.fmul(sv, bd.sitofp(wv, vec(F32T, G)))
    if blk.min is not None:
        if blk.min.type.count == 2 * len(blk.w):  # a min per 16 elements (min_sub16)
            mv = bd.shuffle_vector(blk.min, blk.min, const(I32, [2 * j] * (G // 2) + [2 * j + 1] * (G // 2)))
        else:
            mv = splat(bd, bd.extract_element(blk.min, jj), G)
        v = bd.fadd(v, mv)
    return v
