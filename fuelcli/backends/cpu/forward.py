"""The numba CPU forward: the whole decoder in one njit call.

Calling a parallel numba function from Python costs milliseconds of thread wake-up here, so the
engine makes one call per forward (prefill of T tokens or decode of one). Weight matrices stay where
they are (mmap'd files) in their stored format: `mats` is an int64 table of (address, rows,
row_bytes, format code) per matrix, viewed as uint8 [rows, row_bytes] inside the kernel. (A numba
typed List of arrays would do too, but building one compiles list code at every start: seconds.)
The matrix products call the per-format kernels by address (`kern`, matmul.py); an input that
meets block-format weights is quantised to int16 once (`prepare`). Norms and biases are f32 in one
flat array `vecs` with a (offset, length) table `vec_tab`.

Compile time is part of a first run: the code here avoids what makes numba slow to compile
(array expressions with broadcasting and their shape-error messages, sorting), and nothing in it
depends on a weight format.

Slot tables (built by engine.py) say which matrix/vector a layer reads:
  mat_idx[l, M_*] -> row of `mats` (-1 = absent); vec_idx[l, V_*] -> row of `vec_tab`.
  exp_idx[l, e, 0..2] -> gate/up/down matrix of expert e.
"""

import numpy as np
from numba import njit

from .jit import EXACT, FAST
from .matmul import attention, dequant_row, matmul, quantize_rows, silu_mul

M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_ROUTER = range(8)
N_MATS = 8
V_ATTN_NORM, V_FFN_NORM, V_QB, V_KB, V_VB, V_OB, V_QN, V_KN = range(8)
N_VECS = 8
# dims[] layout; D_QUANT: 1 when some matrix is a block format (its inputs get quantised)
D_NH, D_NKV, D_HD, D_TOPK, D_NORM_TOPK, D_QUANT = range(6)
N_DIMS = 6

@njit(**FAST)
def prepare(x, act, quant, core):
    """Quantise x for the block-format kernels (when the model has any)."""
    if quant:
        quantize_rows(x, act.xq, act.xs, act.xf, core)


@njit(**FAST)
def linear(x, act, mats, i, kern, out):
    """out = x @ W_i^T for matrix i of the table (x prepared)."""
    matmul(x, act.xq, act.xs, act.xf, mats[i, 0], mats[i, 1], mats[i, 2], mats[i, 3], kern, out)


@njit(**FAST)
def add_into(x, y):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += y[t, i]


@njit(**FAST)
def copy_into(dst, src):
    for t in range(src.shape[0]):
        for i in range(src.shape[1]):
            dst[t, i] = src[t, i]


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


@njit(**FAST)
def add_bias(x, bias):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += bias[i]


@njit(**FAST)
def swiglu(h, act, mats, ig, iu, idn, kern, core, quant, gate, up, out):
    """out = down(silu(gate(h)) * up(h)); h prepared."""
    linear(h, act, mats, ig, kern, gate)
    linear(h, act, mats, iu, kern, up)
    silu_mul(gate, up, core)
    prepare(gate, act, quant, core)
    linear(gate, act, mats, idn, kern, out)


@njit(**EXACT)
def route(logits, k, renorm, experts, weights):
    """softmax over all experts in f32, take the top k (ties to the lower index, like torch.topk),
    renormalise only if asked."""
    n = logits.shape[0]
    m = logits[0]
    for i in range(n):
        m = max(m, logits[i])
    s = np.float32(0.0)
    for i in range(n):
        s += np.exp(logits[i] - m)
    total = np.float32(0.0)
    for j in range(k):
        best, pbest = -1, np.float32(-1.0)
        for i in range(n):
            taken = False
            for jj in range(j):
                taken = taken or experts[jj] == i
            p = np.exp(logits[i] - m) / s
            if not taken and p > pbest:
                best, pbest = i, p
        experts[j] = best
        weights[j] = pbest
        total += pbest
    if renorm:
        for j in range(k):
            weights[j] /= total


@njit(**FAST)
def moe(h, act, mats, router_i, exp_idx_l, k, renorm, kern, core, quant, out):
    """Sparse FFN of one layer, token by token; act's router/expert buffers are the engine's."""
    T, H = h.shape
    logits = act.router[:T]
    linear(h, act, mats, router_i, kern, logits)
    experts, weights = act.experts, act.expert_w
    for t in range(T):
        for j in range(H):
            out[t, j] = 0.0
        route(logits[t], k, renorm, experts, weights)
        ht = h[t : t + 1]
        for i in range(k):
            prepare(ht, act, quant, core)  # the previous expert's down projection overwrote it
            e = exp_idx_l[experts[i]]
            swiglu(ht, act, mats, e[0], e[1], e[2], kern, core, quant, act.egate, act.eup, act.ey)
            for j in range(H):
                out[t, j] += weights[i] * act.ey[0, j]


@njit(**FAST)
def forward(tokens, pos0, mats, mat_idx, exp_idx, vecs, vec_tab, vec_idx, embed_i, out_i, final_norm_i,
            dims, eps, windows, cos, sin, k_cache, v_cache, kern, core, act, all_logits, logits, hidden_out):
    """One forward over T new tokens at positions pos0..pos0+T-1, writing K/V into the cache.

    act: the engine's activations (activations.py), at least T rows each. logits: [T or 1, vocab]
    (all positions, or the last one). hidden_out: [L+1, T, H] residual stream after the embedding
    and after each layer, or an empty array to skip it.
    """
    T = tokens.shape[0]
    nh, nkv, hd = dims[D_NH], dims[D_NKV], dims[D_HD]
    quant = dims[D_QUANT] != 0
    L = mat_idx.shape[0]
    x, h, q, k, v = act.x[:T], act.h[:T], act.q[:T], act.k[:T], act.v[:T]
    att, o, gate, up = act.att[:T], act.o[:T], act.gate[:T], act.up[:T]
    for t in range(T):
        dequant_row(kern, mats[embed_i, 3], mats[embed_i, 0] + tokens[t] * mats[embed_i, 2], x.shape[1], x[t])
    keep_hidden = hidden_out.shape[0] > 0
    if keep_hidden:
        copy_into(hidden_out[0], x)
    for l in range(L):
        mi = mat_idx[l]
        vi = vec_idx[l]
        rmsnorm(x, vec(vecs, vec_tab, vi[V_ATTN_NORM]), eps, h)
        prepare(h, act, quant, core)
        linear(h, act, mats, mi[M_Q], kern, q)
        linear(h, act, mats, mi[M_K], kern, k)
        linear(h, act, mats, mi[M_V], kern, v)
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
        attention(q, k_cache[l], v_cache[l], pos0, windows[l], nh, nkv, att, core)
        prepare(att, act, quant, core)
        linear(att, act, mats, mi[M_O], kern, o)
        if vi[V_OB] >= 0:
            add_bias(o, vec(vecs, vec_tab, vi[V_OB]))
        add_into(x, o)
        rmsnorm(x, vec(vecs, vec_tab, vi[V_FFN_NORM]), eps, h)
        prepare(h, act, quant, core)
        if mi[M_ROUTER] >= 0:
            moe(h, act, mats, mi[M_ROUTER], exp_idx[l], dims[D_TOPK], dims[D_NORM_TOPK] != 0, kern, core, quant, o)
        else:
            swiglu(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], kern, core, quant, gate, up, o)
        add_into(x, o)
        if keep_hidden:
            copy_into(hidden_out[l + 1], x)
    rmsnorm(x, vec(vecs, vec_tab, final_norm_i), eps, h)
    if all_logits:
        prepare(h, act, quant, core)
        linear(h, act, mats, out_i, kern, logits)
    else:
        last = h[T - 1 : T]
        prepare(last, act, quant, core)
        linear(last, act, mats, out_i, kern, logits)
