"""The numba CPU forward: the whole decoder in one njit call.

Calling a parallel numba function from Python costs milliseconds of thread wake-up here, so the
engine makes one call per forward (prefill of T tokens or decode of one). Weight matrices stay where
they are (mmap'd files) in their stored format: `mats` is an int64 table of (address, rows,
row_bytes, format code) per matrix, viewed as uint8 [rows, row_bytes] inside the kernel. (A numba
typed List of arrays would do too, but building one compiles list code at every start: seconds.)
Rows are decoded on the fly (`quant.dot_row` fused for one token, tiles for many).
Norms and biases are f32 in one flat array `vecs` with a (offset, length) table `vec_tab`.

Slot tables (built by engine.py) say which matrix/vector a layer reads:
  mat_idx[l, M_*] -> row of `mats` (-1 = absent); vec_idx[l, V_*] -> row of `vec_tab`.
  exp_idx[l, e, 0..2] -> gate/up/down matrix of expert e.

NaN and inf in a weight or an activation reach the logits on every path, never an exception (jit.py:
numpy's error model, fast-math without nnan/ninf); the callers check the logits (finite.py).
"""

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from .jit import EXACT, FAST, PARALLEL
from .matmul import matmul
from .rows import dequant_row

M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_ROUTER = range(8)
N_MATS = 8
V_ATTN_NORM, V_FFN_NORM, V_QB, V_KB, V_VB, V_OB, V_QN, V_KN = range(8)
N_VECS = 8
# dims[] layout
D_NH, D_NKV, D_HD, D_TOPK, D_NORM_TOPK = range(5)
N_DIMS = 5

@intrinsic
def _u8_ptr(typingctx, addr):
    """An int64 address as a uint8 pointer, for carray."""
    sig = types.CPointer(types.uint8)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.IntType(8)))

    return sig, codegen


@njit(inline="always")
def mat(mats, i):
    """Matrix i of the table as uint8 [rows, row_bytes] (no copy)."""
    return carray(_u8_ptr(mats[i, 0]), (mats[i, 1], mats[i, 2]))


@njit(inline="always")
def vec(vecs, vec_tab, i):
    return vecs[vec_tab[i, 0] : vec_tab[i, 0] + vec_tab[i, 1]]


@njit(**FAST)
def rmsnorm(x, weight, eps, out):
    for t in range(x.shape[0]):
        ss = np.float32(0.0)
        for i in range(x.shape[1]):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[1]) + np.float32(eps))
        for i in range(x.shape[1]):
            out[t, i] = weight[i] * (x[t, i] * inv)


@njit(**FAST)
def head_rmsnorm(x, n_heads, head_dim, weight, eps):
    """In-place RMSNorm over each head's head_dim slice (Qwen3 q_norm / k_norm)."""
    for t in range(x.shape[0]):
        for h in range(n_heads):
            base = h * head_dim
            ss = np.float32(0.0)
            for i in range(head_dim):
                ss += x[t, base + i] * x[t, base + i]
            inv = np.float32(1.0) / np.sqrt(ss / np.float32(head_dim) + np.float32(eps))
            for i in range(head_dim):
                x[t, base + i] = weight[i] * (x[t, base + i] * inv)


@njit(**FAST)
def rope(x, n_heads, head_dim, pos0, cos, sin):
    """Rotate-half RoPE in place: dimension i pairs with i + head_dim/2."""
    half = head_dim // 2
    for t in range(x.shape[0]):
        p = pos0 + t
        for h in range(n_heads):
            base = h * head_dim
            for i in range(half):
                a = x[t, base + i]
                b = x[t, base + half + i]
                x[t, base + i] = a * cos[p, i] - b * sin[p, i]
                x[t, base + half + i] = b * cos[p, i] + a * sin[p, i]


@njit(**PARALLEL)
def attention(q, k_cache, v_cache, pos0, window, n_heads, n_kv, head_dim, out):
    """Causal attention of T queries at positions pos0.. over the cache; window w>0 keeps keys
    j with p - w < j <= p (transformers' sliding-window direction)."""
    T = q.shape[0]
    group = n_heads // n_kv
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for task in prange(T * n_heads):
        t = task // n_heads
        h = task % n_heads
        kvh = h // group
        p = pos0 + t
        start = 0 if window <= 0 else max(0, p - window + 1)
        n = p + 1 - start
        scores = np.empty(n, np.float32)
        qb = h * head_dim
        m = np.float32(-np.inf)
        for j in range(n):
            acc = np.float32(0.0)
            for d in range(head_dim):
                acc += q[t, qb + d] * k_cache[start + j, kvh, d]
            acc *= scale
            scores[j] = acc
            m = max(m, acc)
        total = np.float32(0.0)
        for j in range(n):
            e = np.exp(scores[j] - m)
            scores[j] = e
            total += e
        for d in range(head_dim):
            out[t, qb + d] = 0.0
        for j in range(n):
            pj = scores[j] / total
            for d in range(head_dim):
                out[t, qb + d] += pj * v_cache[start + j, kvh, d]


@njit(**FAST)
def add_bias(x, bias):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += bias[i]


@njit(**FAST)
def silu_mul(gate, up):
    """gate <- silu(gate) * up."""
    for t in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            g = gate[t, i]
            gate[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


@njit(**FAST)
def swiglu(h, wg, cg, wu, cu, wd, cd, gate, up, out):
    matmul(h, wg, cg, gate)
    matmul(h, wu, cu, up)
    silu_mul(gate, up)
    matmul(gate, wd, cd, out)


@njit(**EXACT)
def route(logits, k, renorm, experts, weights):
    """softmax over all experts in f32, take the top k, renormalise only if asked."""
    m = logits.max()
    p = np.exp(logits - m)
    p /= p.sum()
    order = np.argsort(-p, kind="mergesort")  # stable: ties go to the lower index, like torch.topk
    s = np.float32(0.0)
    for i in range(k):
        experts[i] = order[i]
        weights[i] = p[order[i]]
        s += p[order[i]]
    if renorm:
        for i in range(k):
            weights[i] /= s


@njit(**FAST)
def moe(h, router, router_code, mats, exp_idx_l, k, renorm, act, out):
    """Sparse FFN of one layer; act's router/expert buffers are the engine's, allocated once."""
    T, H = h.shape
    logits = act.router[:T]
    matmul(h, router, router_code, logits)
    experts, weights = act.experts, act.expert_w
    out[:, :] = 0.0
    for t in range(T):
        route(logits[t], k, renorm, experts, weights)
        ht = h[t : t + 1]
        for i in range(k):
            e = exp_idx_l[experts[i]]
            swiglu(ht, mat(mats, e[0]), mats[e[0], 3], mat(mats, e[1]), mats[e[1], 3], mat(mats, e[2]),
                   mats[e[2], 3], act.egate, act.eup, act.ey)
            for j in range(H):
                out[t, j] += weights[i] * act.ey[0, j]


@njit(**FAST)
def forward(tokens, pos0, mats, mat_idx, exp_idx, vecs, vec_tab, vec_idx, embed_i, out_i, final_norm_i,
            dims, eps, windows, cos, sin, k_cache, v_cache, act, all_logits, logits, hidden_out):
    """One forward over T new tokens at positions pos0..pos0+T-1, writing K/V into the cache.

    act: the engine's activations (activations.py), at least T rows each. logits: [T or 1, vocab]
    (all positions, or the last one). hidden_out: [L+1, T, H] residual stream after the embedding
    and after each layer, or an empty array to skip it.
    """
    T = tokens.shape[0]
    nh, nkv, hd = dims[D_NH], dims[D_NKV], dims[D_HD]
    L = mat_idx.shape[0]
    x, h, q, k, v = act.x[:T], act.h[:T], act.q[:T], act.k[:T], act.v[:T]
    att, o, gate, up = act.att[:T], act.o[:T], act.gate[:T], act.up[:T]
    embed = mat(mats, embed_i)
    for t in range(T):
        dequant_row(mats[embed_i, 3], embed[tokens[t]], x[t])
    keep_hidden = hidden_out.shape[0] > 0
    if keep_hidden:
        hidden_out[0] = x
    for l in range(L):
        mi = mat_idx[l]
        vi = vec_idx[l]
        rmsnorm(x, vec(vecs, vec_tab, vi[V_ATTN_NORM]), eps, h)
        matmul(h, mat(mats, mi[M_Q]), mats[mi[M_Q], 3], q)
        matmul(h, mat(mats, mi[M_K]), mats[mi[M_K], 3], k)
        matmul(h, mat(mats, mi[M_V]), mats[mi[M_V], 3], v)
        if vi[V_QB] >= 0:
            add_bias(q, vec(vecs, vec_tab, vi[V_QB]))
            add_bias(k, vec(vecs, vec_tab, vi[V_KB]))
            add_bias(v, vec(vecs, vec_tab, vi[V_VB]))
        if vi[V_QN] >= 0:
            head_rmsnorm(q, nh, hd, vec(vecs, vec_tab, vi[V_QN]), eps)
            head_rmsnorm(k, nkv, hd, vec(vecs, vec_tab, vi[V_KN]), eps)
        rope(q, nh, hd, pos0, cos, sin)
        rope(k, nkv, hd, pos0, cos, sin)
        for t in range(T):
            for j in range(nkv):
                for d in range(hd):
                    k_cache[l, pos0 + t, j, d] = k[t, j * hd + d]
                    v_cache[l, pos0 + t, j, d] = v[t, j * hd + d]
        attention(q, k_cache[l], v_cache[l], pos0, windows[l], nh, nkv, hd, att)
        matmul(att, mat(mats, mi[M_O]), mats[mi[M_O], 3], o)
        if vi[V_OB] >= 0:
            add_bias(o, vec(vecs, vec_tab, vi[V_OB]))
        x += o
        rmsnorm(x, vec(vecs, vec_tab, vi[V_FFN_NORM]), eps, h)
        if mi[M_ROUTER] >= 0:
            moe(h, mat(mats, mi[M_ROUTER]), mats[mi[M_ROUTER], 3], mats, exp_idx[l], dims[D_TOPK],
                dims[D_NORM_TOPK] != 0, act, o)
        else:
            swiglu(h, mat(mats, mi[M_GATE]), mats[mi[M_GATE], 3], mat(mats, mi[M_UP]), mats[mi[M_UP], 3],
                   mat(mats, mi[M_DOWN]), mats[mi[M_DOWN], 3], gate, up, o)
        x += o
        if keep_hidden:
            hidden_out[l + 1] = x
    rmsnorm(x, vec(vecs, vec_tab, final_norm_i), eps, h)
    out = mat(mats, out_i)
    if all_logits:
        matmul(h, out, mats[out_i, 3], logits)
    else:
        matmul(h[T - 1 : T], out, mats[out_i, 3], logits)
