"""Attention of T new tokens over the device KV cache.

`qkv` rows hold [q heads | k heads | v heads] of a token (one matmul/matvec launch wrote them, biases
included). A head is finished by QK-norm (Qwen3) and rotate-half RoPE at the token's position.
Attention runs one block per (token, query head): keys in chunks of blockDim with an online softmax
(running max and sum, the output rescaled per chunk), so the context length is bounded by the cache,
not by shared memory. GQA: query head h reads kv head h // (nh / nkv). A window w > 0 keeps keys j
with p - w < j <= p (transformers' direction).

Prefill: `rope_store` finishes every head and stores K and V, then `attend`. Decode: `attend_one`
does both in one launch: each block finishes its q head and its kv head's new k itself, takes the
new position's k and v from shared memory, and the first block of each kv group stores them.
"""

import math

from numba import cuda, float32

from .common import MAX_THREADS, block_sum

MAX_HEAD_DIM = 256


@cuda.jit(device=True)
def _finish_head(qkv, t, col, vecs, norm_off, eps, cos, sin, p, hd, v, red, tid, nthreads):
    """v[:hd] = RoPE at p of QK-norm(qkv[t, col:col + hd]) (no norm when norm_off < 0), rounded as
    the CPU does. v is shared; every thread of the block calls this."""
    for d in range(tid, hd, nthreads):
        v[d] = qkv[t, col + d]
    cuda.syncthreads()
    if norm_off >= 0:
        ss = float32(0.0)
        for d in range(tid, hd, nthreads):
            ss += v[d] * v[d]
        ss = block_sum(ss, red, tid, nthreads)
        inv = float32(1.0) / math.sqrt(ss / float32(hd) + eps)
        for d in range(tid, hd, nthreads):
            v[d] = vecs[norm_off + d] * (v[d] * inv)
        cuda.syncthreads()
    half = hd // 2
    for i in range(tid, half, nthreads):  # pairs (i, i + half): each thread owns its pairs
        a, b = v[i], v[half + i]
        v[i] = a * cos[p, i] - b * sin[p, i]
        v[half + i] = b * cos[p, i] + a * sin[p, i]
    cuda.syncthreads()


@cuda.jit(cache=True)
def rope_store(qkv, pos0, nh, nkv, hd, vecs, qn_off, kn_off, eps, cos, sin, kc, vc, layer):
    """Grid (T, nh + nkv): block (t, h) finishes q head h in place (h < nh), or k head h - nh into
    the cache, with v head h - nh. Threads over head_dim; blockDim a power of two."""
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    red = cuda.shared.array(MAX_THREADS, float32)
    v = cuda.shared.array(MAX_HEAD_DIM, float32)
    p = pos0 + t
    if h < nh:
        _finish_head(qkv, t, h * hd, vecs, qn_off, eps, cos, sin, p, hd, v, red, tid, nthreads)
        for d in range(tid, hd, nthreads):
            qkv[t, h * hd + d] = v[d]
    else:
        j = h - nh
        _finish_head(qkv, t, nh * hd + j * hd, vecs, kn_off, eps, cos, sin, p, hd, v, red, tid, nthreads)
        for d in range(tid, hd, nthreads):
            kc[layer, p, j, d] = v[d]
            vc[layer, p, j, d] = qkv[t, (nh + nkv) * hd + j * hd + d]


@cuda.jit(device=True)
def _attend_head(q, knew, vnew, fresh, p, start, kc, vc, layer, kvh, hd, acc, e, tid, nthreads):
    """acc[:hd] = softmax over keys start..p of (q . k_j / sqrt(hd)) times v_j. Position p's k and v
    come from knew / vnew when `fresh` (decode: not yet read back from the cache), else from it."""
    for d in range(tid, hd, nthreads):
        acc[d] = float32(0.0)
    cuda.syncthreads()
    scale = float32(1.0 / math.sqrt(hd))
    m = float32(-math.inf)  # running max of the scores
    total = float32(0.0)  # running sum of exp(score - m)
    for c0 in range(start, p + 1, nthreads):
        n = min(nthreads, p + 1 - c0)
        j = c0 + tid
        s = float32(-math.inf)
        if tid < n:
            s = float32(0.0)
            if fresh and j == p:
                for d in range(hd):
                    s += q[d] * knew[d]
            else:
                for d in range(hd):
                    s += q[d] * kc[layer, j, kvh, d]
            s *= scale
        e[tid] = s
        cuda.syncthreads()
        m_new = m
        for i in range(n):
            m_new = max(m_new, e[i])
        cuda.syncthreads()  # everyone has the chunk's max before e is overwritten
        e[tid] = math.exp(s - m_new) if tid < n else float32(0.0)
        cuda.syncthreads()
        alpha = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        chunk = float32(0.0)
        for i in range(n):
            chunk += e[i]
        total = total * alpha + chunk
        last = n - 1 if fresh and c0 + n - 1 == p else n  # the new position, read from vnew
        for d in range(tid, hd, nthreads):
            a = acc[d] * alpha
            for i in range(last):
                a += e[i] * vc[layer, c0 + i, kvh, d]
            if last < n:
                a += e[last] * vnew[d]
            acc[d] = a
        m = m_new
        cuda.syncthreads()
    for d in range(tid, hd, nthreads):
        acc[d] /= total


@cuda.jit(cache=True)
def attend(qkv, pos0, window, nh, nkv, hd, kc, vc, layer, out):
    """out[t, h*hd:(h+1)*hd] = attention of finished query head h of token t over the cache.
    Grid (T, nh); blockDim keys per chunk (a power of two <= MAX_THREADS)."""
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    q = cuda.shared.array(MAX_HEAD_DIM, float32)
    acc = cuda.shared.array(MAX_HEAD_DIM, float32)
    e = cuda.shared.array(MAX_THREADS, float32)
    p = pos0 + t
    for d in range(tid, hd, nthreads):
        q[d] = qkv[t, h * hd + d]
    _attend_head(q, q, q, False, p, 0 if window <= 0 else max(0, p - window + 1), kc, vc, layer,
                 h // (nh // nkv), hd, acc, e, tid, nthreads)
    for d in range(tid, hd, nthreads):
        out[t, h * hd + d] = acc[d]


@cuda.jit(cache=True)
def attend_one(qkv, pos, window, nh, nkv, hd, vecs, qn_off, kn_off, eps, cos, sin, kc, vc, layer, out):
    """Decode: one token at `pos`, its qkv row 0 as the q|k|v matvec left it. Grid (nh,): block h
    finishes q head h and k head kvh, attends, and (first block of the group) stores k and v."""
    h = cuda.blockIdx.x
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    red = cuda.shared.array(MAX_THREADS, float32)
    q = cuda.shared.array(MAX_HEAD_DIM, float32)
    knew = cuda.shared.array(MAX_HEAD_DIM, float32)
    vnew = cuda.shared.array(MAX_HEAD_DIM, float32)
    acc = cuda.shared.array(MAX_HEAD_DIM, float32)
    e = cuda.shared.array(MAX_THREADS, float32)
    group = nh // nkv
    kvh = h // group
    _finish_head(qkv, 0, h * hd, vecs, qn_off, eps, cos, sin, pos, hd, q, red, tid, nthreads)
    _finish_head(qkv, 0, (nh + kvh) * hd, vecs, kn_off, eps, cos, sin, pos, hd, knew, red, tid, nthreads)
    for d in range(tid, hd, nthreads):
        vnew[d] = qkv[0, (nh + nkv + kvh) * hd + d]
        if h % group == 0:  # for the tokens after this one; this step reads knew / vnew
            kc[layer, pos, kvh, d] = knew[d]
            vc[layer, pos, kvh, d] = vnew[d]
    cuda.syncthreads()
    _attend_head(q, knew, vnew, True, pos, 0 if window <= 0 else max(0, pos - window + 1), kc, vc, layer, kvh,
                 hd, acc, e, tid, nthreads)
    for d in range(tid, hd, nthreads):
        out[0, h * hd + d] = acc[d]
