"""The registry of weight formats: each one described once (block size, bytes, field offsets) in
floats.py, legacy.py, k_quants.py, i_quants.py or ternary.py, registered here by its dispatch code.

The numpy decode beside each layout is the readable reference (tests, the reference forward) and
equals `gguf.quants.dequantize` bit for bit. The CPU and CUDA kernels read `Format.layout`.

Adding a format: describe it (a layout NamedTuple with the next free code, its f16 scales in
fields named d, dmin or m, a numpy decode) in the module of its kind, add it to _ALL, then give
each backend its kernels: the CPU record and emitters (backends/cpu/unpack.py) and the CUDA unit
decoder (backends/cuda/kernels/unpack.py); both check at import that every format has one.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .base import Format
from .floats import BF16, F16, F32
from .i_quants import IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4
from .k_quants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .ternary import TQ1_0, TQ2_0

_ALL = (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K, Q5_1, Q5_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S,
        Q2_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ2_0, TQ1_0, MXFP4)
assert [f.code for f in _ALL] == list(range(len(_ALL))), "codes are the registry index"

FORMATS: dict[str, Format] = {f.name: f for f in _ALL}
BY_CODE: tuple = _ALL
BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in _ALL}

# Activations are quantised per 32 elements (ggml's QK8); every block format's block is a multiple.
ACTIVATION_BLOCK = 32
assert all(f.block_elems % ACTIVATION_BLOCK == 0 for f in _ALL if f.block_elems > 1)

# Names of the ggml types fuel does not read, for error messages only.
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}


def get_format(fmt: str) -> Format:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise InputError(f"unsupported weight format {fmt!r} (supported: {', '.join(FORMATS)})") from None


def row_bytes(fmt: str, ncols: int) -> int:
    f = get_format(fmt)
    if ncols % f.block_elems:
        raise InputError(f"row of {ncols} elements is not a multiple of the {fmt} block ({f.block_elems})")
    return ncols // f.block_elems * f.block_bytes


def dequantize_bytes(fmt: str, data: np.ndarray, shape: tuple) -> np.ndarray:
    """Raw bytes (any shape, C order) of a tensor with logical `shape` -> float32 `shape`."""
    f = get_format(fmt)
    raw = np.ascontiguousarray(data).reshape(-1, f.block_bytes)
    return f.decode(raw).reshape(shape)


def dequantize(t) -> np.ndarray:
    """A Tensor in any supported format -> float32 array of t.shape (a new array)."""
    return dequantize_bytes(t.fmt, t.data, tuple(t.shape))


def quantize(fmt: str, array: np.ndarray) -> np.ndarray:
    """float32 array -> uint8 bytes of shape shape[:-1] + (row_bytes,). For tests and tools.

    Float formats are done here; block formats use gguf.quants (which lacks K-quant quantizers).
    """
    a = np.ascontiguousarray(array, dtype=np.float32)
    rb = row_bytes(fmt, a.shape[-1])
    if fmt == "f32":
        raw = a.view(np.uint8)
    elif fmt == "f16":
        raw = a.astype(np.float16).view(np.uint8)
    elif fmt == "bf16":  # round to nearest even, as ggml_compute_fp32_to_bf16 (NaNs aside)
        u = a.view(np.uint32).astype(np.uint64)
        raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
    else:
        import gguf.quants  # optional: only tests and tools quantize

        raw = gguf.quants.quantize(a, gguf.GGMLQuantizationType(get_format(fmt).ggml_type))
    return np.ascontiguousarray(raw).reshape(a.shape[:-1] + (rb,))
