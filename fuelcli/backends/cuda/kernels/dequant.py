"""Whole rows decoded with `unpack`: the embedding lookup, and the per-format check against the
CPU's exact dequant_row."""

import math

from numba import cuda, float32

from .common import MAX_THREADS, UNIT, block_sum
from .unpack import unpack


@cuda.jit(cache=True)
def take_rows(w8, p0, row_bytes, code, rows, row, out, vecs, norm_off, eps, outn):
    """out[i, :] = row `row` (when >= 0: a decode step passes its token id as a scalar, no copy) or
    row rows[i] of the matrix at byte p0 of w8; with norm_off >= 0 also outn[i] = RMSNorm(out[i]) *
    vecs[norm_off:] (a decode step's first product input). Grid (out rows,), threads over units."""
    i = cuda.blockIdx.x
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    buf = cuda.local.array(UNIT, float32)
    red = cuda.shared.array(MAX_THREADS, float32)
    p = p0 + (row if row >= 0 else rows[i]) * row_bytes
    ss = float32(0.0)
    for u in range(tid, out.shape[1] // UNIT, nthreads):
        unpack(code, w8, p, u * UNIT, buf)
        for j in range(UNIT):
            out[i, u * UNIT + j] = buf[j]
            ss += buf[j] * buf[j]
    if norm_off >= 0:
        H = out.shape[1]
        inv = float32(1.0) / math.sqrt(block_sum(ss, red, tid, nthreads) / float32(H) + eps)
        for k in range(tid, H, nthreads):  # this block wrote out[i]: visible after block_sum's barriers
            outn[i, k] = vecs[norm_off + k] * (out[i, k] * inv)
