"""Qwen3-MoE's sparse FFN: routing as the CPU's `route` (softmax over all experts in f32, the top k,
ties to the lower index as a stable sort, divided by their sum only if `renorm`), the chosen experts'
SwiGLU, and their weighted sum added to the residual stream.

Routing has no launch of its own: every block of `moe_swiglu` routes its token from the router
logits in shared memory (E exps and k scans in one thread, cheap next to a launch), and the first
block of each token writes the choice for `moe_down`. A decode step is 3 launches per MoE layer:
the router matvec and `moe_swiglu`, both with the RMSNorm fused, and `moe_down`.
"""

import math

from numba import cuda, float32, int32

from .common import MAX_THREADS, UNIT, block_sum, lane_sum
from .matvec import silu_times
from .unpack import unpack

MAX_EXPERTS = 512
MAX_TOPK = 32


# The experts' products decode through `unpack` (one kernel for every format: a token's experts may
# differ in format); the dense decode products are matvec.py's, one kernel per format.

@cuda.jit(device=True)
def rms_inv(x, xrow, vecs, norm_off, eps, red, tid, nthreads):
    """1 / rms(x[xrow]) for a fused RMSNorm, or 1 when there is none."""
    if norm_off < 0:
        return float32(1.0)
    K = x.shape[1]
    ss = float32(0.0)
    for k in range(tid, K, nthreads):
        ss += x[xrow, k] * x[xrow, k]
    ss = block_sum(ss, red, tid, nthreads)
    return float32(1.0) / math.sqrt(ss / float32(K) + eps)


@cuda.jit(device=True)
def row_dot(w8, p, code, x, xrow, lane, lanes, buf):
    """This lane's share of dot(row at byte p, x[xrow])."""
    acc = float32(0.0)
    for u in range(lane, x.shape[1] // UNIT, lanes):
        unpack(code, w8, p, u * UNIT, buf)
        k = u * UNIT
        for j in range(UNIT):
            acc += buf[j] * x[xrow, k + j]
    return acc


@cuda.jit(device=True)
def row_dot_normed(w8, p, code, x, xrow, vecs, norm_off, inv, lane, lanes, buf):
    """This lane's share of dot(row at byte p, rmsnorm(x[xrow])) with the norm weight at
    vecs[norm_off:] (none when norm_off < 0), as the CPU's rmsnorm rounds: w * (x * inv)."""
    if norm_off < 0:
        return row_dot(w8, p, code, x, xrow, lane, lanes, buf)
    acc = float32(0.0)
    for u in range(lane, x.shape[1] // UNIT, lanes):
        unpack(code, w8, p, u * UNIT, buf)
        k = u * UNIT
        for j in range(UNIT):
            acc += buf[j] * (vecs[norm_off + k + j] * (x[xrow, k + j] * inv))
    return acc


@cuda.jit(device=True)
def route_token(p, E, k, renorm, chosen, chosen_w):
    """p[:E]: the router logits of a token (overwritten) -> chosen[:k] experts and chosen_w[:k]."""
    m = p[0]
    for e in range(1, E):
        m = max(m, p[e])
    s = float32(0.0)
    for e in range(E):
        p[e] = math.exp(p[e] - m)
        s += p[e]
    for e in range(E):
        p[e] /= s
    picked = float32(0.0)
    for i in range(k):
        best = 0
        for e in range(1, E):
            if p[e] > p[best]:
                best = e
        chosen[i] = best
        chosen_w[i] = p[best]
        picked += p[best]
        p[best] = float32(-1.0)  # taken: below every probability
    if renorm:
        for i in range(k):
            chosen_w[i] /= picked


@cuda.jit(cache=True)
def moe_swiglu(w8, mats, etab, router, k, renorm, x, vecs, norm_off, eps, experts, weights, out):
    """out[t * k + i, n] = silu(G_e[n] . h) * (U_e[n] . h), h = rmsnorm(x[t]) (x itself when
    norm_off < 0), e the i-th expert routed from router[t]; experts / weights [T, k] get the
    routing. etab[e] = (gate, up, down) rows of mats. Grid (row blocks, k, T), block (lanes, rows)."""
    lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    tid, nthreads = row * lanes + lane, lanes * cuda.blockDim.y
    i, t = cuda.blockIdx.y, cuda.blockIdx.z
    red = cuda.shared.array(MAX_THREADS, float32)
    p = cuda.shared.array(MAX_EXPERTS, float32)
    chosen = cuda.shared.array(MAX_TOPK, int32)
    chosen_w = cuda.shared.array(MAX_TOPK, float32)
    buf = cuda.local.array(UNIT, float32)
    E = router.shape[1]
    for e in range(tid, E, nthreads):
        p[e] = router[t, e]
    cuda.syncthreads()
    if tid == 0:
        route_token(p, E, k, renorm, chosen, chosen_w)
    cuda.syncthreads()
    if cuda.blockIdx.x == 0 and i == 0:
        for j in range(tid, k, nthreads):
            experts[t, j] = chosen[j]
            weights[t, j] = chosen_w[j]
    inv = rms_inv(x, t, vecs, norm_off, eps, red, tid, nthreads)
    e = chosen[i]
    mg, mu = etab[e, 0], etab[e, 1]
    n = cuda.blockIdx.x * cuda.blockDim.y + row
    live = n < mats[mg, 1]
    g = float32(0.0)
    u = float32(0.0)
    if live:
        g = row_dot_normed(w8, mats[mg, 0] + n * mats[mg, 2], mats[mg, 3], x, t, vecs, norm_off, inv, lane, lanes,
                           buf)
        u = row_dot_normed(w8, mats[mu, 0] + n * mats[mu, 2], mats[mu, 3], x, t, vecs, norm_off, inv, lane, lanes,
                           buf)
    g = lane_sum(g, red, lane, row, lanes)
    u = lane_sum(u, red, lane, row, lanes)
    if live and lane == 0:
        out[t * k + i, n] = silu_times(g, u)


@cuda.jit(cache=True)
def moe_down(w8, mats, etab, experts, weights, eg, x):
    """x[t, n] += sum_i weights[t, i] * (D_e[n] . eg[t * k + i]): the experts' outputs, weighted, added
    to the residual stream. Grid (row blocks, T)."""
    lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    t = cuda.blockIdx.y
    red = cuda.shared.array(MAX_THREADS, float32)
    buf = cuda.local.array(UNIT, float32)
    k = experts.shape[1]
    n = cuda.blockIdx.x * cuda.blockDim.y + row
    live = n < x.shape[1]
    acc = float32(0.0)
    if live:
        for i in range(k):
            md = etab[experts[t, i], 2]
            acc += weights[t, i] * row_dot(w8, mats[md, 0] + n * mats[md, 2], mats[md, 3], eg, t * k + i, lane,
                                           lanes, buf)
    s = lane_sum(acc, red, lane, row, lanes)
    if live and lane == 0:
        x[t, n] += s
