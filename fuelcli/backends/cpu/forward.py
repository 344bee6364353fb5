"""The numba CPU forward: the whole decoder in one njit call, orchestrating the IR kernels.

Calling a parallel numba function from Python costs milliseconds of thread wake-up here, so the
engine makes one call per forward (prefill of T tokens or decode of one). Every heavy step is an
IR kernel called by address (matmul.py, kernels.py, core.py); this file only says in which order
and on which buffers, so it is small and compiles in seconds on a first run, once for every
model (nothing in it depends on a weight format).

Weight matrices stay where they are (mmap'd files) in their stored format: `mats` is an int64
table of (address, rows, row_bytes, format code) per matrix. Norms and biases are f32 in one flat
array `vecs` with an (offset, length) table `vec_tab`. Slot tables (built by engine.py from the
weights and the blocks, model/block.py) say what a layer reads and does:
  mat_idx[l, M_*] -> row of `mats` (-1 = absent); vec_idx[l, V_*] -> row of `vec_tab` (-1 =
  absent: no bias, no QK-norm, no post-norms); exp_idx[l, e, 0..2] -> gate/up/down of expert e
  (the columns: the roles' places in the weight schema);
  lay[l, L_*]: the window, the RoPE table (-1: no RoPE), the attention scale folded into q (f32
  bits, 0: 1/sqrt(head_dim)) and the FFN activation (matmul.ACT_*).

NaN and inf in a weight or an activation reach the logits on every path, never an exception (jit.py:
numpy's error model, fast-math without nnan/ninf); the callers check the logits (model/finite.py).
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from ...families.schema import MATRICES, VECTORS
from .amx import AMX_MIN_TOKENS
from .jit import FAST, OWN_FLAGS, helper
from .llvm import args11, ptr
from .linear_mixer import add_gated, conv_silu, delta_rule, gate_rows, partial_rope
from .matmul import (C_KV_STORE, C_RMSNORM, C_ROPE, C_SPLIT, attention, batch, dequant_row, describe_product, glu,
                     matmul, quantize_for, split_rows, tasks)
from .moe import moe

# the slot tables' columns: a role's place in the schema's order (families/schema.py)
M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_ROUTER = map(MATRICES.index, ("q", "k", "v", "o", "gate", "up", "down",
                                                                        "router"))
M_QG, M_LQKV, M_LZ, M_LB, M_LA, M_LOUT, M_SG, M_SU, M_SD, M_SGATE = map(MATRICES.index, (
    "q_gate", "lin_qkv", "lin_z", "lin_b", "lin_a", "lin_out", "shared_gate", "shared_up", "shared_down",
    "shared_expert_gate"))
N_MATS = len(MATRICES)
V_ATTN_NORM, V_FFN_NORM, V_QB, V_KB, V_VB, V_OB, V_QN, V_KN, V_POST_ATTN, V_POST_FFN = map(VECTORS.index, (
    "attn_norm", "ffn_norm", "q_bias", "k_bias", "v_bias", "o_bias", "q_norm", "k_norm", "post_attn_norm",
    "post_ffn_norm"))
V_LCONV, V_LDT, V_LALOG, V_LNORM = map(VECTORS.index, ("lin_conv", "lin_dt_bias", "lin_a_log", "lin_norm"))
N_VECS = len(VECTORS)
# L_LINEAR: 1 for a linear-attention layer; L_CACHE: the layer's index in the KV cache (attention) or
# in the recurrent state (linear); L_ROTARY: the leading dimensions of a head RoPE rotates (0: all)
L_WINDOW, L_ROPE, L_QSCALE, L_ACT, L_LINEAR, L_CACHE, L_ROTARY = range(7)
N_LAY = 7
SEG_SLOT, SEG_POS, SEG_ROWS = range(3)  # segs[] columns
# dims[] layout; D_QUANT: 1 when some matrix is a block format (its inputs get quantised);
# D_EMBED_SCALE, D_SOFTCAP: f32 bits of the embedding scale and the final logit softcap (0: none)
# D_LKH, D_LDK, D_LDV, D_LTAPS: the linear-attention layers' key heads, head sizes and conv taps
D_NH, D_NKV, D_HD, D_TOPK, D_NORM_TOPK, D_QUANT, D_EMBED_SCALE, D_SOFTCAP, D_LKH, D_LDK, D_LDV, D_LTAPS = range(12)
N_DIMS = 12


@helper()
def vslice(vecs, vec_tab, i):
    """Vector i of the table as an array."""
    return vecs[vec_tab[i, 0]:vec_tab[i, 0] + vec_tab[i, 1]]


@helper()
def vaddr(vecs, vec_tab, i):
    """Address of vector i of the table, 0 when absent (i < 0)."""
    return np.int64(0) if i < 0 else ptr(vecs) + 4 * vec_tab[i, 0]


@helper()
def prepare(x, act, quant, core, n_dec):
    """x for the kernels (its first n_dec rows run the decode kernels, the rest the tiles: matmul.
    describe_product): split into bf16 planes for AMX prefill (core[C_SPLIT] != 0, enough tokens,
    none on the decode kernels), else quantised for the block-format kernels (when the model has any)."""
    if n_dec == 0 and x.shape[0] >= AMX_MIN_TOKENS and core[C_SPLIT] != 0:
        split_rows(x, act.qx.xq, core)
    elif quant:
        quantize_for(x, act.qx, core, n_dec)


@helper()
def linear(x, act, mats, i, kern, core, out, n_dec):
    """out = x @ W_i^T for matrix i of the table (x prepared)."""
    if n_dec == 1 and x.shape[0] == 1:  # one sequence's decode step: the kernel alone
        matmul(x, act.qx, mats[i, 0], mats[i, 1], mats[i, 2], mats[i, 3], kern, out)
    else:
        batch(act.desc, describe_linear(x, act, mats, i, kern, core, out, 0, 0, n_dec), core, x.shape[0] > n_dec)


@helper()
def describe_linear(x, act, mats, i, kern, core, out, r, m, n_dec):
    """out = x @ W_i^T into the batch from row r (x prepared; m: this product's decode table, 0..2);
    the next free row."""
    return describe_product(act.desc, r, x, act.qx, mats[i, 0], mats[i, 1], mats[i, 2], mats[i, 3], kern, core,
                            ptr(out), n_dec, act.ddesc[m])


@helper()
def rmsnorm(x, residual, weight, eps, out, core):
    """x += residual (when given: an array with rows), out = RMSNorm(x) * weight, row by row."""
    T, n = x.shape
    tasks(core[C_RMSNORM], T, args11(ptr(x), ptr(residual) if residual.shape[0] else 0, weight, ptr(out), n, eps))


@helper()
def bias_norm_rope(x, bias, norm, n_heads, head_dim, pos0, cos, sin, eps, scale, core):
    """x (+ bias) (per-head RMSNorm) (RoPE unless cos is 0 or head_dim is 0) (* scale unless 0), in
    place, row by row; cos/sin: table addresses. With head_dim 0 only the bias: add_bias."""
    tasks(core[C_ROPE], x.shape[0], args11(ptr(x), bias, norm, n_heads, head_dim, pos0, cos, sin, eps, scale))


@helper()
def add_bias(x, bias, core):
    """x += bias (a vector address) on every row, in place."""
    bias_norm_rope(x, bias, 0, x.shape[1], 0, 0, 0, 0, 0, 0, core)


@helper()
def f32_of(bits):
    return np.array([np.int32(bits)]).view(np.float32)[0]


@helper()
def scale_rows(x, bits):
    s = f32_of(bits)
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] *= s


@helper(fastmath=False)
def softcap(logits, bits):
    """logits <- c * tanh(logits / c) (a NaN stays NaN)."""
    c = f32_of(bits)
    for t in range(logits.shape[0]):
        for i in range(logits.shape[1]):
            logits[t, i] = np.tanh(logits[t, i] / c) * c


@helper()
def copy_into(dst, src):
    for t in range(src.shape[0]):
        for i in range(src.shape[1]):
            dst[t, i] = src[t, i]


@helper()
def gated(h, act, mats, ig, iu, idn, fn, kern, core, quant, gate, up, out, n_dec):
    """out = down(fn(gate(h)) * up(h)) (fn: matmul.ACT_*); h prepared. gate and up run in one
    parallel loop."""
    r = describe_linear(h, act, mats, ig, kern, core, gate, 0, 0, n_dec)
    r = describe_linear(h, act, mats, iu, kern, core, up, r, 1, n_dec)
    batch(act.desc, r, core, h.shape[0] > n_dec)
    glu(gate, up, fn, core)
    prepare(gate, act, quant, core, n_dec)
    linear(gate, act, mats, idn, kern, core, out, n_dec)


@helper()
def shared_expert(h, act, mats, mi, fn, kern, core, quant, out, n_dec):
    """out += sigmoid(h · shared_expert_gate) * the shared expert's GLU of h."""
    T = h.shape[0]
    prepare(h, act, quant, core, n_dec)  # the experts' products overwrote it
    linear(h, act, mats, mi[M_SGATE], kern, core, act.sgl[:T], n_dec)
    gated(h, act, mats, mi[M_SG], mi[M_SU], mi[M_SD], fn, kern, core, quant, act.sgate[:T], act.sup[:T],
          act.sy[:T], n_dec)
    add_gated(out, act.sy[:T], act.sgl[:T])


def ffn(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec):
    """The FFN of layer l (fn: its activation). exp_idx is None for a model without MoE layers: a
    type, so a dense model's forward holds no MoE code (and the call from Python stays on numba's
    fast path)."""


@overload(ffn, jit_options=OWN_FLAGS)
def _ffn(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec):
    if isinstance(exp_idx, types.NoneType):
        def dense(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec):
            gated(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], fn, kern, core, quant, gate, up, out, n_dec)
        return dense

    def sparse_or_dense(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec):
        if mi[M_ROUTER] >= 0:
            logits = act.router[:h.shape[0]]
            linear(h, act, mats, mi[M_ROUTER], kern, core, logits, n_dec)
            moe(h, logits, act, mats, exp_idx[l], dims[D_TOPK], dims[D_NORM_TOPK] != 0, fn, kern, core, quant, out,
                n_dec)
            if mi[M_SG] >= 0:
                shared_expert(h, act, mats, mi, fn, kern, core, quant, out, n_dec)
        else:
            gated(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], fn, kern, core, quant, gate, up, out, n_dec)
    return sparse_or_dense


@helper()
def linear_mixer(h, segs, act, mats, mi, vecs, vec_tab, vi, dims, rec, conv_win, kern, core, quant, n_dec, eps):
    """A linear-attention layer's input projections of h (prepared) and its mixing per segment, into
    act.lo (linear_mixer.py; out_proj is the caller's)."""
    T = h.shape[0]
    lq, lz, lb, la = act.lq[:T], act.lz[:T], act.lb[:T], act.la[:T]
    r = describe_linear(h, act, mats, mi[M_LQKV], kern, core, lq, 0, 0, n_dec)
    r = describe_linear(h, act, mats, mi[M_LZ], kern, core, lz, r, 1, n_dec)
    r = describe_linear(h, act, mats, mi[M_LB], kern, core, lb, r, 2, n_dec)
    batch(act.desc, r, core, T > n_dec)
    linear(h, act, mats, mi[M_LA], kern, core, la, n_dec)
    conv_w, a_log = vslice(vecs, vec_tab, vi[V_LCONV]), vslice(vecs, vec_tab, vi[V_LALOG])
    dt_bias, norm_w = vslice(vecs, vec_tab, vi[V_LDT]), vslice(vecs, vec_tab, vi[V_LNORM])
    r0 = 0
    for j in range(segs.shape[0]):
        slot, pos0, r1 = segs[j, SEG_SLOT], segs[j, SEG_POS], r0 + segs[j, SEG_ROWS]
        conv_silu(lq[r0:r1], conv_w, dims[D_LTAPS], conv_win[slot], pos0, act.lc[r0:r1])
        delta_rule(act.lc[r0:r1], lz[r0:r1], lb[r0:r1], la[r0:r1], a_log, dt_bias, norm_w, rec[slot], pos0,
                   dims[D_LKH], dims[D_LDK], dims[D_LDV], f32_of(eps), act.lo[r0:r1])
        r0 = r1


@njit(**FAST)
def forward(tokens, segs, mats, mat_idx, exp_idx, vecs, vec_tab, vec_idx, embed_i, out_i, final_norm_i,
            dims, eps, lay, cos, sin, k_cache, v_cache, rec, conv_win, kern, core, act, all_logits, logits,
            hidden_out):
    """The entry point from Python (forward_body's docstring says what it does). Its body is a helper
    too: numba keys a helper's compiled code by its caller's flags as well, and an entry point's
    differ from a helper's, so helpers called from both would compile twice (prepare, linear,
    describe_linear and batch, from the forward and from the FFN)."""
    forward_body(tokens, segs, mats, mat_idx, exp_idx, vecs, vec_tab, vec_idx, embed_i, out_i, final_norm_i,
                 dims, eps, lay, cos, sin, k_cache, v_cache, rec, conv_win, kern, core, act, all_logits, logits,
                 hidden_out)


@helper()
def forward_body(tokens, segs, mats, mat_idx, exp_idx, vecs, vec_tab, vec_idx, embed_i, out_i, final_norm_i,
                 dims, eps, lay, cos, sin, k_cache, v_cache, rec, conv_win, kern, core, act, all_logits, logits,
                 hidden_out):
    """One forward over T new tokens of one or more sequences, writing their K/V into the cache.

    segs: int64 [n, 3], one row per sequence in the step (SEG_SLOT, SEG_POS, SEG_ROWS): its cache
    slot, the position of its first new token, its number of tokens; the tokens are the segments'
    rows one after the other. Every product runs over all T rows; RoPE, the cache store and the
    attention run per segment, on its slot's cache (k_cache, v_cache: [attention layers, slots, ...]);
    a linear-attention layer's conv window and recurrent state likewise (conv_win [linear layers,
    slots, taps - 1, conv channels], rec [linear layers, slots, v_heads, dk, dv]).
    eps: the RMSNorm epsilon as the bits of an f32. cos, sin: [RoPE tables, n_ctx, head_dim/2].
    act: the engine's activations (activations.py), at least T rows each. logits: [T, vocab] (every
    row) or [n, vocab] (each segment's last). hidden_out: [L+1, T, H] residual stream after the
    embedding and after each layer, or an empty array to skip it. exp_idx: None when no layer is MoE.
    """
    T = tokens.shape[0]
    n_seg = segs.shape[0]
    n_dec = 0  # the leading one-token segments' rows: on the decode kernels (matmul.describe_product)
    while n_dec < n_seg and segs[n_dec, SEG_ROWS] == 1:
        n_dec += 1
    nh, nkv, hd = dims[D_NH], dims[D_NKV], dims[D_HD]
    quant = dims[D_QUANT] != 0
    L = mat_idx.shape[0]
    x, h, q, k, v = act.x[:T], act.h[:T], act.q[:T], act.k[:T], act.v[:T]
    att, o, gate, up = act.att[:T], act.o[:T], act.gate[:T], act.up[:T]
    none = act.x[:0]
    H = x.shape[1]
    for t in range(T):
        dequant_row(kern, mats[embed_i, 3], mats[embed_i, 0] + tokens[t] * mats[embed_i, 2], H, x[t])
    if dims[D_EMBED_SCALE] != 0:
        scale_rows(x, dims[D_EMBED_SCALE])
    keep_hidden = hidden_out.shape[0] > 0
    if keep_hidden:
        copy_into(hidden_out[0], x)
    rmsnorm(x, none, vaddr(vecs, vec_tab, vec_idx[0, V_ATTN_NORM]), eps, h, core)
    for l in range(L):
        mi = mat_idx[l]
        vi = vec_idx[l]
        ci = lay[l, L_CACHE]
        prepare(h, act, quant, core, n_dec)
        if lay[l, L_LINEAR] != 0:
            linear_mixer(h, segs, act, mats, mi, vecs, vec_tab, vi, dims, rec[ci], conv_win[ci], kern, core, quant,
                         n_dec, eps)
            prepare(act.lo[:T], act, quant, core, n_dec)
            linear(act.lo[:T], act, mats, mi[M_LOUT], kern, core, o, n_dec)
        else:
            ri = lay[l, L_ROPE]
            cs, sn = (np.int64(0), np.int64(0)) if ri < 0 else (ptr(cos[ri]), ptr(sin[ri]))
            rot = lay[l, L_ROTARY]
            if rot != 0:  # RoPE over part of each head: here, after the kernel's bias and norm
                cs, sn = np.int64(0), np.int64(0)
            r = describe_linear(h, act, mats, mi[M_Q], kern, core, q, 0, 0, n_dec)
            r = describe_linear(h, act, mats, mi[M_K], kern, core, k, r, 1, n_dec)
            r = describe_linear(h, act, mats, mi[M_V], kern, core, v, r, 2, n_dec)
            batch(act.desc, r, core, T > n_dec)
            if mi[M_QG] >= 0:
                linear(h, act, mats, mi[M_QG], kern, core, act.qg[:T], n_dec)
            r0 = 0
            for j in range(n_seg):
                slot, pos0, r1 = segs[j, SEG_SLOT], segs[j, SEG_POS], r0 + segs[j, SEG_ROWS]
                qj, kj, vj = q[r0:r1], k[r0:r1], v[r0:r1]
                bias_norm_rope(qj, vaddr(vecs, vec_tab, vi[V_QB]), vaddr(vecs, vec_tab, vi[V_QN]), nh, hd, pos0, cs,
                               sn, eps, lay[l, L_QSCALE], core)
                bias_norm_rope(kj, vaddr(vecs, vec_tab, vi[V_KB]), vaddr(vecs, vec_tab, vi[V_KN]), nkv, hd, pos0, cs,
                               sn, eps, 0, core)
                if rot != 0:
                    partial_rope(qj, nh, hd, rot, pos0, cos[ri], sin[ri])
                    partial_rope(kj, nkv, hd, rot, pos0, cos[ri], sin[ri])
                if vi[V_VB] >= 0:
                    add_bias(vj, vaddr(vecs, vec_tab, vi[V_VB]), core)
                kc, vc = k_cache[ci, slot], v_cache[ci, slot]
                tasks(core[C_KV_STORE], r1 - r0, args11(ptr(kj), ptr(vj), ptr(kc), ptr(vc), pos0, nkv * hd))
                attention(qj, kc, vc, pos0, lay[l, L_WINDOW], nh, nkv, att[r0:r1], act.part, core)
                r0 = r1
            if mi[M_QG] >= 0:
                gate_rows(att, act.qg[:T])
            prepare(att, act, quant, core, n_dec)
            linear(att, act, mats, mi[M_O], kern, core, o, n_dec)
        if vi[V_OB] >= 0:
            add_bias(o, vaddr(vecs, vec_tab, vi[V_OB]), core)
        if vi[V_POST_ATTN] >= 0:
            rmsnorm(o, none, vaddr(vecs, vec_tab, vi[V_POST_ATTN]), eps, o, core)
        rmsnorm(x, o, vaddr(vecs, vec_tab, vi[V_FFN_NORM]), eps, h, core)
        prepare(h, act, quant, core, n_dec)
        ffn(exp_idx, l, h, act, mats, mi, lay[l, L_ACT], dims, kern, core, quant, gate, up, o, n_dec)
        if vi[V_POST_FFN] >= 0:
            rmsnorm(o, none, vaddr(vecs, vec_tab, vi[V_POST_FFN]), eps, o, core)
        nxt = vec_idx[l + 1, V_ATTN_NORM] if l + 1 < L else final_norm_i
        rmsnorm(x, o, vaddr(vecs, vec_tab, nxt), eps, h, core)  # x += o; h = the next norm of x
        if keep_hidden:
            copy_into(hidden_out[l + 1], x)
    if all_logits:
        prepare(h, act, quant, core, n_dec)
        linear(h, act, mats, out_i, kern, core, logits, n_dec)
    else:  # each segment's last row on the decode kernels, as one sequence's (one segment: the view)
        last = h[T - 1 : T]
        if n_seg > 1:
            last = act.last[:n_seg]
            r1 = 0
            for j in range(n_seg):
                r1 += segs[j, SEG_ROWS]
                for i in range(H):
                    last[j, i] = h[r1 - 1, i]
        prepare(last, act, quant, core, last.shape[0])
        linear(last, act, mats, out_i, kern, core, logits, last.shape[0])
    if dims[D_SOFTCAP] != 0:
        softcap(logits, dims[D_SOFTCAP])
