"""Unit decoders of the float formats (f32, f16, bf16): UNIT consecutive elements of a row -> f32.

`p` is the byte offset of the row in the device weight buffer `w8` (rows of float formats start at
a multiple of their element size: the buffer aligns every matrix), `k0` the first element.
"""

import numpy as np
from numba import cuda, uint16, uint32

from ....formats import BF16, F16, F32
from .common import UNIT, f16_bits

LF32, LF16, LBF16 = F32.layout, F16.layout, BF16.layout


@cuda.jit(device=True)
def unpack_f32(w8, p, k0, out):
    w = w8.view(np.float32)
    i = p // LF32.block_bytes + k0
    for j in range(UNIT):
        out[j] = w[i + j]


@cuda.jit(device=True)
def unpack_f16(w8, p, k0, out):
    w = w8.view(np.uint16)
    i = p // LF16.block_bytes + k0
    for j in range(UNIT):
        out[j] = f16_bits(w[i + j])


@cuda.jit(device=True)
def unpack_bf16(w8, p, k0, out):
    """bf16 is the top half of an f32: widen the bits, reinterpret."""
    w = w8.view(np.uint16)
    i = p // LBF16.block_bytes + k0
    bits = cuda.local.array(1, uint32)
    for j in range(UNIT):
        bits[0] = uint32(uint16(w[i + j])) << uint32(16)
        out[j] = bits.view(np.float32)[0]
