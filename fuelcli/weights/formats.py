"""Every weight format fuel supports: block layout, byte sizes and a numpy dequantize.

The numpy dequantize is the readable reference (tests, reference forward) and equals
`gguf.quants.dequantize` bit for bit: each format repeats ggml's float operations in the same
order (e.g. Q4_K is (d*sc)*q - dmin*m, not d*(sc*q) - ...), because f32 rounding depends on it.
Block layouts follow ggml-common.h; all multi-byte fields are little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fuelcli.errors import InputError
from fuelcli.weights.tensor import Tensor


@dataclass(frozen=True)
class Format:
    name: str
    code: int  # small stable int used by the numba kernels to dispatch
    block_elems: int  # elements per block (1 for plain float formats)
    block_bytes: int  # bytes per block
    ggml_type: int  # ggml_type id (ggml.h), as stored in GGUF tensor infos


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("f32", 0, 1, 4, 0),
        Format("f16", 1, 1, 2, 1),
        Format("bf16", 2, 1, 2, 30),
        Format("q8_0", 3, 32, 34, 8),
        Format("q4_0", 4, 32, 18, 2),
        Format("q4_1", 5, 32, 20, 3),
        Format("q5_0", 6, 32, 22, 6),
        Format("q4_k", 7, 256, 144, 12),
        Format("q6_k", 8, 256, 210, 14),
    )
}
BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in FORMATS.values()}

# Names of the ggml types fuel does not support, for error messages only.
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


# ---------------------------------------------------------------- per-format block decoders
# Each takes uint8 blocks (n, block_bytes) and returns float32 (n, block_elems).


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n, 1) float32: a block's f16 scale."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) packed bytes -> (n, 32) uint8: low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b[:, :2])


def _q4_0(b):
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return _f16(b[:, :2]) * q.astype(np.float32)


def _q4_1(b):
    q = _nibbles(b[:, 4:]).astype(np.float32)
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5_0(b):
    qh = np.ascontiguousarray(b[:, 2:6]).view(np.uint32)  # bit j = 5th bit of element j
    hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    q = (_nibbles(b[:, 6:]) | (hi << 4)).astype(np.int8) - np.int8(16)
    return _f16(b[:, :2]) * q.astype(np.float32)


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K's 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks -> two (n, 8) uint8.

    Sub-blocks 0..3 use the low 6 bits of bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 take
    their low 4 bits from bytes 8..11 and their top 2 bits from the spare top bits of bytes 0..7
    (get_scale_min_k4 in ggml-quants.c).
    """
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scale_min(b[:, 4:16])
    ds = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (dmin * mn.astype(np.float32)).reshape(n, 8, 1)
    # 4 chunks of 32 bytes; each chunk holds sub-block 2c in low nibbles and 2c+1 in high nibbles
    qs = b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32).astype(np.float32)
    return (ds * q - dm).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql, qh = b[:, 0:128], b[:, 128:192]
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    ds = (d * scales).reshape(n, 16, 1)
    # Two halves of 128 elements; in half h, element l + 32*k (k=0..3) takes: low 4 bits from
    # ql[64h + l + 32*(k&1)] (low nibble for k<2, high for k>=2), high 2 bits from qh[32h + l]
    # at bit 2k.
    lo = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    lo = (lo & 0x0F).reshape(n, 2, 4, 32)
    hi = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    hi = (hi & 0x03).reshape(n, 2, 4, 32)
    q = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    return (ds * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


_BLOCK_DECODERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q4_k": _q4_k, "q6_k": _q6_k}


def dequantize_bytes(fmt: str, data: np.ndarray, shape: tuple) -> np.ndarray:
    """Raw bytes (any shape, C order) of a tensor with logical `shape` -> float32 `shape`."""
    f = get_format(fmt)
    raw = np.ascontiguousarray(data).reshape(-1)
    if fmt == "f32":
        out = raw.view(np.float32).copy()
    elif fmt == "f16":
        out = raw.view(np.float16).astype(np.float32)
    elif fmt == "bf16":
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        out = _BLOCK_DECODERS[fmt](raw.reshape(-1, f.block_bytes))
    return out.reshape(shape)


def dequantize(t: Tensor) -> np.ndarray:
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
