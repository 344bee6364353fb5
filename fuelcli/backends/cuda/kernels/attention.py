"""Attention of T new tokens over the device KV cache.

`qkv` rows hold [q heads | k heads | v heads] of a token (one matmul/matvec launch wrote them, biases
included). `rope_store` finishes them: QK-norm, rotate-half RoPE at the token's position, K and V
into the cache. `attend` then runs one block per (token, query head): keys in chunks of blockDim
with an online softmax (running max and sum, the output rescaled per chunk), so the context length
is bounded by the cache, not by shared memory. GQA: query head h reads kv head h // (nh / nkv).
A window w > 0 keeps keys j with p - w < j <= p (transformers' direction).
"""

import math

from numba import cuda, float32

from .common import MAX_THREADS, block_sum

MAX_HEAD_DIM = 256


@cuda.jit(cache=True)
def rope_store(qkv, pos0, nh, nkv, hd, vecs, qn_off, kn_off, eps, cos, sin, kc, vc, layer):
    """Grid (T, nh + nkv): block (t, h) finishes q head h (h < nh) or k head h - nh, which also copies
    v head h - nh into the cache. Threads over head_dim; blockDim a power of two."""
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    red = cuda.shared.array(MAX_THREADS, float32)
    v = cuda.shared.array(MAX_HEAD_DIM, float32)
    is_q = h < nh
    col = h * hd if is_q else nh * hd + (h - nh) * hd
    norm_off = qn_off if is_q else kn_off
    for d in range(tid, hd, nthreads):
        v[d] = qkv[t, col + d]
    cuda.syncthreads()
    if norm_off >= 0:  # QK-norm (Qwen3): RMSNorm over the head's head_dim, as the CPU rounds it
        ss = float32(0.0)
        for d in range(tid, hd, nthreads):
            ss += v[d] * v[d]
        ss = block_sum(ss, red, tid, nthreads)
        inv = float32(1.0) / math.sqrt(ss / float32(hd) + eps)
        for d in range(tid, hd, nthreads):
            v[d] = vecs[norm_off + d] * (v[d] * inv)
        cuda.syncthreads()
    p = pos0 + t
    half = hd // 2
    for i in range(tid, half, nthreads):
        a, b = v[i], v[half + i]
        ra = a * cos[p, i] - b * sin[p, i]
        rb = b * cos[p, i] + a * sin[p, i]
        if is_q:
            qkv[t, col + i] = ra
            qkv[t, col + half + i] = rb
        else:
            kc[layer, p, h - nh, i] = ra
            kc[layer, p, h - nh, half + i] = rb
    if not is_q:
        vcol = (nh + nkv) * hd + (h - nh) * hd
        for d in range(tid, hd, nthreads):
            vc[layer, p, h - nh, d] = qkv[t, vcol + d]


@cuda.jit(cache=True)
def attend(qkv, pos0, window, nh, nkv, hd, kc, vc, layer, out):
    """out[t, h*hd:(h+1)*hd] = softmax(q k^T / sqrt(hd)) v for query head h of token t. Grid (T, nh);
    blockDim keys per chunk (<= MAX_THREADS)."""
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    q = cuda.shared.array(MAX_HEAD_DIM, float32)
    acc = cuda.shared.array(MAX_HEAD_DIM, float32)
    e = cuda.shared.array(MAX_THREADS, float32)
    kvh = h // (nh // nkv)
    p = pos0 + t
    start = 0 if window <= 0 else max(0, p - window + 1)
    for d in range(tid, hd, nthreads):
        q[d] = qkv[t, h * hd + d]
        acc[d] = float32(0.0)
    cuda.syncthreads()
    scale = float32(1.0 / math.sqrt(hd))
    m = float32(-math.inf)  # running max of the scores
    total = float32(0.0)  # running sum of exp(score - m)
    for c0 in range(start, p + 1, nthreads):
        n = min(nthreads, p + 1 - c0)
        s = float32(-math.inf)
        if tid < n:
            s = float32(0.0)
            for d in range(hd):
                s += q[d] * kc[layer, c0 + tid, kvh, d]
            s *= scale
        e[tid] = s
        cuda.syncthreads()
        m_new = m
        for j in range(n):
            m_new = max(m_new, e[j])
        cuda.syncthreads()  # everyone has the chunk's max before e is overwritten
        e[tid] = math.exp(s - m_new) if tid < n else float32(0.0)
        cuda.syncthreads()
        alpha = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        chunk = float32(0.0)
        for j in range(n):
            chunk += e[j]
        total = total * alpha + chunk
        for d in range(tid, hd, nthreads):
            a = acc[d] * alpha
            for j in range(n):
                a += e[j] * vc[layer, c0 + j, kvh, d]
            acc[d] = a
        m = m_new
        cuda.syncthreads()
    for d in range(tid, hd, nthreads):
        out[t, h * hd + d] = acc[d] / total
