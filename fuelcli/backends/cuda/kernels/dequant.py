"""Whole rows decoded with `unpack`: the embedding lookup, and the per-format check against the
CPU's exact dequant_row."""

from numba import cuda, float32

from .common import UNIT
from .unpack import unpack


@cuda.jit(cache=True)
def take_rows(w8, p0, row_bytes, code, rows, row, out):
    """out[i, :] = row `row` (when >= 0: a decode step passes its token id as a scalar, no copy) or
    row rows[i] of the matrix at byte p0 of w8. Grid (out rows,), threads over units."""
    i = cuda.blockIdx.x
    buf = cuda.local.array(UNIT, float32)
    p = p0 + (row if row >= 0 else rows[i]) * row_bytes
    for u in range(cuda.threadIdx.x, out.shape[1] // UNIT, cuda.blockDim.x):
        unpack(code, w8, p, u * UNIT, buf)
        for j in range(UNIT):
            out[i, u * UNIT + j] = buf[j]
