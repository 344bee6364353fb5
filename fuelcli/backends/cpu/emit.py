"""What a weight format gives the CPU kernels: the record (`CpuFormat`), the three shapes its
emitters return, and the IR helpers they share. The emitters themselves live by kind beside the
format descriptions: emit_floats.py, emit_legacy.py, emit_k_quants.py, emit_iq.py; unpack.py
registers one record per format.

Every block format is a sequence of 32-element groups (ggml's QK8: the activation block), each
element `scale * w (+ min)` with w a small signed integer. A record's emitters:

  block   (bd, row, blk) -> Block: one format block as groups of 32 int16 w with their scales (and
          mins): the prefill panels, the exact row decode, the AMX panels
  words   (bd, row, b0, n) -> WordChunk: decode on every ISA without the int8 planes
          (kernels_decode._decode_words): a chunk of WORD_CHUNK groups taken out of the stored
          bytes read as words
  planes  (bd, rows, b0, nblk, xs) -> PlanesBlocks: decode on avx512vnni (_decode_planes): the
          stored bytes as unsigned bytes for vpdpbusd
  floats  (bd, row, k, n, exact) -> <n x float>: the float formats, all kernels
  lanes   (bd, dw) -> LaneBlock: n rows' super-blocks at once from their transposed dwords: the q8
          super-block panels of Q4_K and Q5_K (kernels_prefill_q8_ksum)

Every product here is exact in f32 (a scale has at most 18 significant bits, w at most 13), so
`scale * w (+ min)` rounds like the numpy decode in formats/ (once, at the min). All sizes and
offsets come from the layouts in fuelcli/formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import llvmlite.binding as llb
from llvmlite import ir

from ...formats.base import Format
from .irgen import F32T, G, I8, I16, I32, call_intrinsic, const, load, splat_c, vec

# the kernels are compiled for this process's machine (llvm.py): on x86 a 16-entry byte table is one
# pshufb per 16 bytes (SSSE3, which every x86 ISA fuel builds has), elsewhere a tree of selects
_X86 = llb.get_process_triple().startswith(("x86_64", "i686", "i386"))

QK_K = 256  # elements of a K-quant (and i-quant) super-block


@dataclass(frozen=True)
class CpuFormat:
    """Everything the CPU kernels know of one format (ggml-cpu's type_traits_cpu row)."""

    fmt: Format
    block: Callable | None = None  # block formats: the emitters above
    words: Callable | None = None
    planes: Callable | None = None
    floats: Callable | None = None  # float formats
    has_min: bool = False  # x = scale * w + min, one min per 32-element group (times the group's f32 sum of x)
    min_sub16: bool = False  # x = scale * w + min, one min per 16-element sub-block (times the sub-block's
    # sum of the int16 activations, xz, and their block scale: no f32 sums per 16 elements exist)
    planes_zero: int | None = None  # z of w = q - z as the planes kernels dot q (its sums come off with
    # the activations' 16-element sums; the planes' zero_scale)
    planes_klayout: bool = False  # the planes units read the activations' K-quant layout (PLANES_KBLOCK)
    planes_rows: int = 1  # rows the one-token planes kernel dots at once (kernels_decode.PLANES_ROWS):
    # 2 where the kernel's arithmetic, not the memory, bounds it (two rows share the activation loads)
    planes_chunks: bool = True  # else (plain units): the planes kernel transposes a full chunk's units
    # onto the K-quant layout; False where that made the one-token kernel >= 10% slower or the
    # four-token one no faster (kernels_decode._decode_planes)
    words_sub16: bool = False  # the words chunk's scale is per 16-element sub-block, in SUB16_ORDER
    words_zero: int = 0  # with words_sub16: z of w = q - z, taken off with the 16-element sums
    ksum: Callable | None = None  # K- and i-quants: (bd, row, blk) -> (d, isc), the block's f32 scale
    # and its integer sub-block scales (<n x i32>, n = 8 or 16 in group order; None where w carries
    # them: Q2_K), so that a group's scale is d * isc exactly (the q8 tiles' super-block sums,
    # kernels_prefill_q8_ksum)
    lanes: Callable | None = None  # Q4_K, Q5_K: (bd, dw) -> LaneBlock, a super-block of n rows from dw(i),
    # <n x i32> of the block's dword i in each row (the ksum panel's unpack: no per-row decode or
    # transpose of the decoded bytes)

    def __post_init__(self):
        kernels = (self.block, self.words, self.planes)
        assert (self.floats is None) == all(k is not None for k in kernels), f"{self.fmt.name}: incomplete CPU record"
        assert not self.min_sub16 or (self.words_sub16 and not self.has_min), f"{self.fmt.name}: one kind of min"

    @property
    def code(self) -> int:
        return self.fmt.code

    @property
    def layout(self):
        return self.fmt.layout

    @property
    def quant(self) -> bool:
        """A block format: its kernels take the int16 activations."""
        return self.floats is None

    @property
    def mins_per_group(self) -> int:
        """Mins per 32-element group: 0, 1 (has_min) or 2 (min_sub16)."""
        return 2 if self.min_sub16 else int(self.has_min)

    @property
    def driver_kind(self) -> str:
        """The prefill driver it shares with other formats (kernels.driver_module)."""
        return "float" if not self.quant else ("quant", "quant_min", "quant_min16")[self.mins_per_group]


# ------------------------------------------------------------------ block: groups of int16 weights


class Block(NamedTuple):
    """One format block as n = block_elems / 32 groups."""

    w: list  # n x <32 x i16>: the signed integer weights of each group
    scale: ir.Value  # <n x float>: group j's scale in lane j
    min: ir.Value | None  # <n x float> (formats with a min; min_sub16: <2n x float>, one per 16
    # elements) or None
    exact: list | None = None  # n x (<32 x float> scales, <32 x i16> w) for the exact decode where the
    # numpy decode's product order differs (q6_k: (d * sc) * (q - 32) keeps the sign of a zero
    # q - 32, d * ((q - 32) * sc) would not)


class LaneBlock(NamedTuple):
    """One super-block of n rows at once, row r in lane r (the q8 super-block tiles' panel,
    kernels_prefill_q8_ksum): each 32-element group's weights as signed-byte quads and its scales,
    as ksum's (d, isc) and the block's mins."""

    group: Callable  # j -> ([q] <n x i32>: elements 4q .. 4q + 3 of group j as bytes, <n x i32> its integer
    # scale, <n x float> its min -(dmin * m)), emitted where called: a group's values live only while
    # the caller stores them
    d: ir.Value  # <n x float>: the block's scale


# ------------------------------------------------------------------ planes: u8 weights for vpdpbusd
#
# The planes decode kernels (kernels_decode.py) dot unsigned weight bytes with the two int8 planes of the
# int16 activations, for one or two rows at a time, a chunk of 256 elements at a time (one K-quant
# block, eight 32-element blocks; a row's last blocks of a 32-element format in chunks of two and
# one). A chunk gives units of 64 consecutive elements (Q4_K: of the K-quant layout,
# emit_k_quants.py); i32 lane i of a unit's dot sums elements 4i..4i+3 and is multiplied by its
# lane scale: the weights' scale there times the activations' block scale. The stored q is dotted
# as an unsigned byte: a zero point z (w = q - z) comes off afterwards with the activations'
# 16-element sums.

PLANES_UNIT = 64
LANES = PLANES_UNIT // 4  # i32 lanes of a unit's dot
PLANES_CHUNK = 256  # elements of a planes kernel's main-loop chunk
PLANES_KBLOCK = QK_K  # the activations' K-quant layout: blocks of this many elements (core.py)


class PlanesBlocks(NamedTuple):
    """A chunk of n rows for the planes decode kernel."""

    units: list  # [row][u] <64 x i8>: unsigned weight bytes of the chunk's elements 64u .. 64u + 63
    # (planes_klayout: of unit u of the K-quant layout)
    lane_scales: list  # [row][u] <16 x float> (planes_klayout: [row][0], shared by the block's units)
    min: ir.Value | None  # <g*n x float>: each row's min per 32-element group (times the group's sum of x);
    # min_sub16: <2g*n x float>, its min per 16 elements times the activation scale (times xz there)
    zero_scale: ir.Value | None  # <2g*n x float>: each row's scale x activation scale per 16 elements
    # (formats with a zero point: planes_zero)


# ------------------------------------------------------------------ words: stored bytes for vpmaddwd
#
# The words decode kernels (kernels_decode.py, every ISA without the int8 planes) read a 32-element group's
# stored bytes as 16 words and take the weights out of each word in place, with masks and shifts:
# word i yields the group's elements 2i (`even`) and 2i + 1 (`odd`), signed int16. Nothing widens
# bytes to words (vpmovzxbw: on a core that runs it on one pipe it bounded the int16 decode kernels
# at 4.8 GB/s per core). The activations are read in the same order (core.py: a token's words layout,
# each 32-element block's even elements, then its odd ones), so lane k of the two vpmaddwd sums
# elements 4k .. 4k+3 of the group. The kernels take WORD_CHUNK groups at a time: one K-quant
# block, or eight blocks of a 32-element format, with their scales as one vector.

WORD_CHUNK = 8  # groups of 32 elements per chunk
WORD_ROTATE = (0, 0, 0, 0, 4, 4, 4, 4)  # 16 nibble bytes in both halves: the high half's shifted down
# a chunk's 16-element sums come out of the kernels' reduction in this order (kernels_decode._reduce_groups)
SUB16_ORDER = (0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)


class WordChunk(NamedTuple):
    groups: list  # WORD_CHUNK x (even, odd): <16 x i16> each (fewer: a 32-element format's last blocks)
    scale: ir.Value  # <n x float>: group j's scale in lane j, or (words_sub16) the 16 sub-block
    # scales in SUB16_ORDER
    min: ir.Value | None  # <n x float>: group j's min (formats with a min; min_sub16: the 16 sub-block
    # mins in SUB16_ORDER) or None


# ------------------------------------------------------------------ helpers


def f16(bd, base, off):
    """The little-endian f16 at byte `off` of base, widened to float (exact)."""
    return bd.fpext(bd.bitcast(load(bd, base, off, I16), ir.HalfType()), F32T)


def nibbles(bd, qs16):
    """<16 x i8> packed bytes -> <32 x i8>: low nibbles (elements 0..15), then high (16..31)."""
    lo = bd.and_(qs16, splat_c(I8, 15, 16))
    hi = bd.lshr(qs16, splat_c(I8, 4, 16))
    return bd.shuffle_vector(lo, hi, const(I32, range(32)))


def lanes(bd, *vals):
    """Scalars -> <n x float>."""
    v = ir.Constant(vec(F32T, len(vals)), ir.Undefined)
    for i, x in enumerate(vals):
        v = bd.insert_element(v, x, ir.Constant(I32, i))
    return v


def f16_lanes(bd, row, offsets):
    """<n x float> of the f16 values at the byte offsets (i64) of row (an i8*, or a list of one per
    offset): gathered four at a time into 64-bit integers (integer loads, shifts and ors, none of
    the vector pipes' shuffles), then one conversion."""
    n = len(offsets)
    rows = row if isinstance(row, list) else [row] * n
    width = 16 * min(n, 4)
    quads = []
    for q in range(0, n, 4):
        v = None
        for i, (r, off) in enumerate(zip(rows[q:q + 4], offsets[q:q + 4])):
            h = bd.zext(load(bd, r, off, I16), ir.IntType(width))
            v = h if v is None else bd.or_(v, bd.shl(h, ir.Constant(ir.IntType(width), 16 * i)))
        quads.append(v)
    v = ir.Constant(vec(ir.IntType(width), len(quads)), ir.Undefined)
    for i, x in enumerate(quads):
        v = bd.insert_element(v, x, ir.Constant(I32, i))
    return bd.fpext(bd.bitcast(v, vec(ir.HalfType(), n)), vec(F32T, n))


def concat(bd, parts):
    """Vectors of one length, end to end (two at most)."""
    if len(parts) == 1:
        return parts[0]
    k = parts[0].type.count
    return bd.shuffle_vector(parts[0], parts[1], const(I32, range(2 * k)))


def nibble_units(bd, qs_parts, shift):
    """Planes units from 16-byte nibble groups (one per 32-element group, low nibbles its elements
    0-15): each copied twice, the low half masked to the low nibble and the high half to the high
    nibble in place (16 * q: its lane scale carries 1 / 16) or, with `shift`, shifted down (q itself)."""
    units = []
    for j in range(0, len(qs_parts), 2):
        pair = qs_parts[j:j + 2]
        both = pair[0] if len(pair) == 1 else bd.shuffle_vector(pair[0], pair[1], const(I32, range(32)))
        n = len(pair)
        idx = [16 * b + t for b in range(n) for _ in range(2) for t in range(16)]
        v = bd.shuffle_vector(both, splat_c(I8, 0, 16 * n), const(I32, idx + [16 * n] * (64 - len(idx))))
        if shift:
            words = bd.lshr(bd.bitcast(v, vec(I16, 32)), const(I16, ([0] * 8 + [4] * 8) * 2))
            v = bd.and_(bd.bitcast(words, vec(I8, 64)), splat_c(I8, 15, 64))
        else:
            v = bd.and_(v, const(I8, ([15] * 16 + [0xF0 - 256] * 16) * 2))
        units.append(v)
    return units


def nibble_kunits(bd, qs):
    """A full chunk of a 32-element 4-bit format (8 blocks' 16 qs bytes: low nibbles its elements
    0-15, high 16-31) as the unsigned nibbles of units on the K-quant layout:
    unit u, lane 2b + h holds block b's elements 16h + 4u .. +3, the low (h = 0) or high nibbles of
    its qs dword u. Four blocks' qs a zmm (loads), then per unit one dword permute and the nibbles
    shifted down and masked: 3 vector operations a unit, where plain units and the kernel's
    transpose took 6."""
    quad = lambda a, b, c, d: concat(bd, [concat(bd, [a, b]), concat(bd, [c, d])])  # noqa: E731
    A, B = (bd.bitcast(quad(*qs[k:k + 4]), vec(I32, LANES)) for k in (0, 4))
    shift = const(I32, [4 * (i % 2) for i in range(LANES)])
    units = []
    for u in range(4):
        idx = [16 * (i // 8) + 4 * ((i // 2) % 4) + u for i in range(LANES)]
        dw = bd.shuffle_vector(A, B, const(I32, idx))
        units.append(bd.bitcast(bd.and_(bd.lshr(dw, shift), splat_c(I32, 0x0F0F0F0F, LANES)), vec(I8, 64)))
    return units


def table16(bd, idx, table):
    """<n x i8> indices 0..15 (n a multiple of 16) -> <n x i8> of table[idx], table 16 ints."""
    n = idx.type.count
    tab = const(I8, [t if t < 128 else t - 256 for t in table])
    if _X86:
        parts = [bd.shuffle_vector(idx, idx, const(I32, range(i, i + 16))) for i in range(0, n, 16)]
        parts = [call_intrinsic(bd, "llvm.x86.ssse3.pshuf.b.128", vec(I8, 16), [tab, p]) for p in parts]
        while len(parts) > 1:
            parts = [concat(bd, parts[i:i + 2]) for i in range(0, len(parts), 2)]
        return parts[0]
    level = [splat_c(I8, t if t < 128 else t - 256, n) for t in table]
    for bit in range(4):  # halve the candidates by one bit of the index at a time
        on = bd.icmp_unsigned("!=", bd.and_(idx, splat_c(I8, 1 << bit, n)), splat_c(I8, 0, n))
        level = [bd.select(on, level[i + 1], level[i]) for i in range(0, len(level), 2)]
    return level[0]


def words(bd, v):
    """<32 x i8> -> <16 x i16>."""
    return bd.bitcast(v, vec(I16, G // 2))


def wsplat(v):
    return splat_c(I16, v, G // 2)


def nibble_bytes(bd, row, off):
    """The 16 bytes of a 32-element format's nibbles at byte `off` -> <16 x i16> words whose bytes are
    the 32 elements in order: the bytes in both halves of a vector, the high half shifted down 4
    bits (vpsrlvd), each byte masked to its low nibble."""
    qs = load(bd, row, off, vec(I8, G // 2))
    both = bd.bitcast(bd.shuffle_vector(qs, qs, const(I32, list(range(16)) * 2)), vec(I32, 8))
    return bd.and_(words(bd, bd.lshr(both, const(I32, WORD_ROTATE))), wsplat(0x0F0F))


def signed_bytes(bd, w):
    """Words of two signed bytes -> (even, odd): the low byte moved up and back, the high one down."""
    return bd.ashr(bd.shl(w, wsplat(8)), wsplat(8)), bd.ashr(w, wsplat(8))
