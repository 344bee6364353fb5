"""`--activations q8`: an engine's kernel tables with 8-bit activations (quantize_q8.py).

The matrix inputs are quantised to 8 bits per block as llama.cpp does: per 256 elements (its Q8_K)
where every block format of the model has 256-element blocks (the K- and i-quants), else per 32
(Q8_0), and written in the int16 path's buffers and layouts. So every block-format kernel computes
the q8 arithmetic (the exact integer dot of the stored weights with the 8-bit values, then the
scales): on avx512vnni the one-token and B-wide decode kernels dot one int8 plane instead of two
(kernels_decode: one_plane), half the vpdpbusd, and so do avxvnni's and avx2's for the formats
where that was not slower than their int16 words kernels (kernels_decode.q8_decode_takes);
prefill runs the 8-bit tiles (kernels_prefill_q8: vpdpbusd on avx512vnni and avxvnni, vpmaddubsw
on avx2 for the formats of small weights; with q8_k blocks the K- and i-quants' super-block tiles,
kernels_prefill_q8_ksum; on avx512vnni and avxvnni they read the values packed as bytes by chunks,
byte_chunks); the rest (every kernel on generic) run the int16 kernels on the 8-bit
values (the same integers, the int16 path's speed). Float formats take x as f32 either way; BF16
weights' prefill on AVX512_BF16 reads it rounded to bf16 once per matrix input, for vdpbf16ps
(kernels_prefill_bf16.py).
"""

from __future__ import annotations

import numpy as np

from .kernels_decode import DECODE_WIDTHS, q8_decode_takes
from .llvm import Isa
from .unpack import record

ACTIVATIONS = ("int16", "q8")


def block_kind(codes) -> str:
    """The activation blocks of the model's formats (quantize_q8.KINDS)."""
    quant = [c for c in codes if record(c).quant]
    return "q8_k" if quant and all(record(c).layout.block_elems == 256 for c in quant) else "q8_0"


def apply(kern: np.ndarray, core: np.ndarray, codes, isa: Isa) -> None:
    """The q8 quantize kernel into the core table and the one-plane decode kernels (the formats
    q8_decode_takes) and q8 tiles into the kernel table (matmul.kernel_table, core_table)."""
    from . import kernels_prefill_bf16 as bf16
    from .kernels import q8_addresses, q8_bf16_addresses, q8_prefill_addresses
    from .kernels_prefill_q8 import takes
    from .matmul import C_PACK8, C_QUANTIZE, C_ROUND_BF16, CHUNKS_BF16, K_CHUNKS, K_DECODE, K_PREFILL, K_UNPACK
    from .quantize_q8 import addresses

    kind = block_kind(codes)
    core[C_QUANTIZE] = addresses(isa)[kind]
    for code in sorted({int(c) for c in codes}):
        if q8_decode_takes(isa, code):
            kern[code, K_DECODE] = q8_addresses(code, isa)
        if takes(isa, code):
            kern[code, K_PREFILL], kern[code, K_UNPACK] = q8_prefill_addresses(code, isa, kind == "q8_k")
            chunks = byte_chunks(code, isa)
            if chunks:
                kern[code, K_CHUNKS], core[C_PACK8] = chunks, addresses(isa)["pack"]
        elif bf16.takes(isa, code):
            kern[code, K_PREFILL], kern[code, K_UNPACK], core[C_ROUND_BF16] = q8_bf16_addresses(isa)
            kern[code, K_CHUNKS] = CHUNKS_BF16


def byte_chunks(code: int, isa: Isa) -> int:
    """The K_CHUNKS of the format's q8 tiles where they read x's bytes by chunks
    (kernels_prefill_q8.chunked): CHUNKS_BYTES_XZ where they read xz (mins per 16 elements), else
    CHUNKS_BYTES; 0 where they do not."""
    from .kernels_prefill_q8 import chunked, kind_of, mins_of
    from .matmul import CHUNKS_BYTES, CHUNKS_BYTES_XZ

    if not chunked(isa):
        return 0
    return CHUNKS_BYTES_XZ if mins_of(kind_of(code)) == 2 else CHUNKS_BYTES


def cached(codes, isa: Isa) -> bool:
    """Whether the modules apply() loads are in the on-disk cache (kernels.py's module names)."""
    from . import kernels_prefill_bf16 as bf16
    from . import kernels_prefill_q8_ksum as ksum
    from .kernels import _module_name
    from .kernels_prefill_q8 import driver_of, takes
    from .llvm import is_cached
    from .quantize_q8 import MODULE

    names = [MODULE]
    quant = [c for c in codes if record(c).quant]
    names += [_module_name("q8", c) for c in quant if q8_decode_takes(isa, c)]
    on_tiles = [c for c in quant if takes(isa, c)]
    sums = [c for c in on_tiles if block_kind(codes) == "q8_k" and ksum.takes(isa, c)]
    names += [_module_name("q8ksum", k) for k in sums + list({ksum.kind_of(c) for c in sums})]
    on_tiles = [c for c in on_tiles if c not in sums]
    names += [_module_name("q8prefill", c) for c in on_tiles]
    names += [_module_name("q8prefill", k) for k in {driver_of(c, isa) for c in on_tiles}]
    names += [_module_name("q8bf16", "bf16")] * any(bf16.takes(isa, c) for c in codes)
    return all(is_cached(n, isa) for n in names)


def apply_wide(kern: np.ndarray, codes, isa: Isa) -> None:
    """The one-plane B-wide decode kernels over matmul.add_wide's (the formats q8_decode_takes)."""
    from .kernels import q8_wide_addresses
    from .matmul import K_WIDE

    for code in sorted(set(int(c) for c in codes)):
        if q8_decode_takes(isa, code):
            kern[code, K_WIDE:K_WIDE + len(DECODE_WIDTHS)] = q8_wide_addresses(code, isa)
