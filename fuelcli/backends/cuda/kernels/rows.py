"""Row-wise kernels of the prefill path and the output: RMSNorm, SiLU(gate) * up, and the argmax of
the logits (greedy decoding returns one id, not the logits)."""

import math

from numba import cuda, float32, int32

from .common import MAX_THREADS, block_sum


@cuda.jit(cache=True)
def rmsnorm(x, vecs, w_off, eps, out):
    """out[r] = w * (x[r] * 1/rms(x[r])), w at vecs[w_off:]. Grid (rows,)."""
    r = cuda.blockIdx.x
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    red = cuda.shared.array(MAX_THREADS, float32)
    H = x.shape[1]
    ss = float32(0.0)
    for i in range(tid, H, nthreads):
        ss += x[r, i] * x[r, i]
    ss = block_sum(ss, red, tid, nthreads)
    inv = float32(1.0) / math.sqrt(ss / float32(H) + eps)
    for i in range(tid, H, nthreads):
        out[r, i] = vecs[w_off + i] * (x[r, i] * inv)


@cuda.jit(cache=True)
def silu_mul(gate, up, T):
    """gate[t] <- silu(gate[t]) * up[t] for t < T. Grid over T * width elements."""
    i = cuda.grid(1)
    n = gate.shape[1]
    if i < T * n:
        t, j = i // n, i % n
        g = gate[t, j]
        gate[t, j] = g / (float32(1.0) + math.exp(-g)) * up[t, j]


@cuda.jit(device=True)
def _better(v, i, bv, bi):
    """(v, i) beats (bv, bi) for argmax: NaN first (numpy's argmax returns the first NaN), then the
    larger value, then the lower index."""
    if v != v:
        return bv == bv or i < bi
    if bv != bv:
        return False
    return v > bv or (v == bv and i < bi)


@cuda.jit(cache=True)
def argmax(logits, row, out):
    """out[0] = np.argmax(logits[row]). One block."""
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    vals = cuda.shared.array(MAX_THREADS, float32)
    idx = cuda.shared.array(MAX_THREADS, int32)
    V = logits.shape[1]
    bv = logits[row, 0]
    bi = 0
    for i in range(tid, V, nthreads):
        if _better(logits[row, i], i, bv, bi):
            bv = logits[row, i]
            bi = i
    vals[tid] = bv
    idx[tid] = bi
    cuda.syncthreads()
    w = nthreads // 2
    while w > 0:
        if tid < w and _better(vals[tid + w], idx[tid + w], vals[tid], idx[tid]):
            vals[tid] = vals[tid + w]
            idx[tid] = idx[tid + w]
        cuda.syncthreads()
        w //= 2
    if tid == 0:
        out[0] = idx[0]
