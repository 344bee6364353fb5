"""Prefill (many tokens): out[t, col0 + n] (+)= W[n] . x[t] (+ bias[n]), a shared-memory tiled GEMM
whose weight tile is decoded from the stored format as it is loaded.

Block (bx, by) threads; each thread owns an MT x MT micro-tile of rows x tokens, so a block covers
TN = by * MT rows and TT = bx * MT tokens. Per step of TK columns the block decodes its TN x TK weight
tile unit by unit (`unpack`) and copies its TT x TK slice of x into shared memory, then every
thread runs MT * MT FMAs per pair of shared loads. Rows and tokens a thread owns are strided by
by / bx so neighbouring threads read neighbouring shared rows (no bank conflicts on x).
"""

from numba import cuda, float32

from .common import UNIT
from .unpack import unpack

MT = 4  # micro-tile side
TK = 32  # columns per shared tile step; a multiple of UNIT
MAX_TILE = 64  # most rows (tokens) a block covers: shared arrays are sized for a 16 x 16 block
TK_PAD = TK + 1  # shared rows one float longer: the rows start in distinct banks
assert TK % UNIT == 0


@cuda.jit(cache=True)
def matmul(w8, mats, mi, x, T, vecs, bias_off, out, col0, accumulate):
    """x [>= T, K] f32; matrix mi of `mats` [N, K]; out [>= T, >= col0 + N]. Grid
    (ceil(N / TN), ceil(T / TT))."""
    tx, ty, bx, by = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    tid, nthreads = ty * bx + tx, bx * by
    TN, TT = by * MT, bx * MT
    n0, t0 = cuda.blockIdx.x * TN, cuda.blockIdx.y * TT
    base, N, row_bytes, code = mats[mi, 0], mats[mi, 1], mats[mi, 2], mats[mi, 3]
    K = x.shape[1]
    ws = cuda.shared.array((MAX_TILE, TK_PAD), float32)
    xs = cuda.shared.array((MAX_TILE, TK_PAD), float32)
    acc = cuda.local.array((MT, MT), float32)
    buf = cuda.local.array(UNIT, float32)
    wv = cuda.local.array(MT, float32)
    xv = cuda.local.array(MT, float32)
    for i in range(MT):
        for j in range(MT):
            acc[i, j] = float32(0.0)
    units = TK // UNIT
    for k0 in range(0, K, TK):
        for v in range(tid, TN * units, nthreads):
            r = v // units
            c = (v % units) * UNIT
            if n0 + r < N and k0 + c < K:
                unpack(code, w8, base + (n0 + r) * row_bytes, k0 + c, buf)
                for j in range(UNIT):
                    ws[r, c + j] = buf[j]
            else:
                for j in range(UNIT):
                    ws[r, c + j] = float32(0.0)
        for v in range(tid, TT * TK, nthreads):
            r = v // TK
            c = v % TK
            xs[r, c] = x[t0 + r, k0 + c] if t0 + r < T and k0 + c < K else float32(0.0)
        cuda.syncthreads()
        for kk in range(TK):
            for i in range(MT):
                wv[i] = ws[ty + i * by, kk]
                xv[i] = xs[tx + i * bx, kk]
            for i in range(MT):
                for j in range(MT):
                    acc[i, j] += wv[i] * xv[j]
        cuda.syncthreads()
    for i in range(MT):
        n = n0 + ty + i * by
        if n < N:
            b = vecs[bias_off + n] if bias_off >= 0 else float32(0.0)
            for j in range(MT):
                t = t0 + tx + j * bx
                if t < T:
                    if accumulate:
                        out[t, col0 + n] += acc[i, j] + b
                    else:
                        out[t, col0 + n] = acc[i, j] + b
