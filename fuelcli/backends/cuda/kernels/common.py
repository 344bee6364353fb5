"""Small device helpers shared by every CUDA kernel.

UNIT is the kernels' work item: a lane (decode) or a tile loader (prefill) decodes UNIT consecutive
elements of a row at a time. Every block of a block format, and every K-quant sub-block, is a
multiple of it (checked below against the format registry), so a unit never straddles two scales.
"""

import numpy as np
from numba import cuda, float32, uint16

from ....formats import BY_CODE

UNIT = 8

for _f in BY_CODE:
    assert _f.block_elems == 1 or _f.block_elems % UNIT == 0, _f.name
    assert getattr(_f.layout, "sub_elems", UNIT) % UNIT == 0, _f.name

MAX_THREADS = 1024  # shared reduction buffers hold one slot per thread of a block


@cuda.jit(device=True)
def f16_bits(h):
    """IEEE half bits (any unsigned int) -> float32, exactly (subnormals, inf and NaN too)."""
    a = cuda.local.array(1, uint16)
    a[0] = uint16(h)
    return float32(a.view(np.float16)[0])


@cuda.jit(device=True)
def f16_at(w8, p):
    """The little-endian f16 at byte p of w8, as float32 (block scales)."""
    return f16_bits(uint16(w8[p]) | (uint16(w8[p + 1]) << uint16(8)))


@cuda.jit(device=True)
def block_sum(v, red, tid, nthreads):
    """Sum of v over the nthreads (a power of two) threads of the block; every thread gets it.
    Every thread of the block must call it (it synchronises)."""
    red[tid] = v
    cuda.syncthreads()
    w = nthreads // 2
    while w > 0:
        if tid < w:
            red[tid] += red[tid + w]
        cuda.syncthreads()
        w //= 2
    s = red[0]
    cuda.syncthreads()  # red may be reused by the caller
    return s


@cuda.jit(device=True)
def lane_sum(v, red, lane, row, lanes):
    """Sum of v over the `lanes` threads (a power of two) that share `row` in a (lanes, rows) block;
    every lane gets it. Every thread of the block must call it."""
    i = row * lanes + lane
    red[i] = v
    cuda.syncthreads()
    w = lanes // 2
    while w > 0:
        if lane < w:
            red[i] += red[i + w]
        cuda.syncthreads()
        w //= 2
    s = red[row * lanes]
    cuda.syncthreads()
    return s
