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
  bits, 0: 1/sqrt(head_dim)), the FFN activation (matmul.ACT_*) and a MoE layer's router rule and
  clamped SwiGLU (moe_extras). A layer's sink logits (vec_idx V_SINKS) join its softmax denominators.

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
from .delta_chunked import CHUNK, delta_rule_chunked
from .layer_kv import add_rows, copy_rows, kv_at, per_layer_rows, rows_of, scale_by
from .linear_mixer import add_gated, conv_silu, delta_rule, gate_rows, gather_columns, partial_rope
from .matmul import (add_bias, bias_norm_rope, C_KV_STORE, C_RMSNORM, C_ROUND_BF16, C_SPLIT, attention, batch, dequant_row,
                     describe_product, glu, matmul, quantize_for, round_rows, split_rows, tasks)
from .moe import NO_EXTRAS, moe

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
V_SINKS, V_ROUTER_BIAS, V_GATE_EXPS_BIAS, V_UP_EXPS_BIAS, V_DOWN_EXPS_BIAS = map(VECTORS.index, (
    "sinks", "router_bias", "gate_exps_bias", "up_exps_bias", "down_exps_bias"))
M_PLG, M_PLP = map(MATRICES.index, ("pl_gate", "pl_proj"))
V_PLN, V_LSCALAR, V_RSCALE, V_EXPSCALE, V_POST_FFN1, V_FFN_NORM2, V_POST_FFN2 = map(VECTORS.index, (
    "pl_norm", "layer_scalar", "router_scale", "per_expert_scale", "post_ffn_norm_1", "ffn_norm_2", "post_ffn_norm_2"))
N_VECS = len(VECTORS)
# L_LINEAR: 1 for a linear-attention layer; L_CACHE: the layer's index in the KV cache (attention) or
# in the recurrent state (linear); L_ROTARY: the leading dimensions of a head RoPE rotates (0: all);
# L_LOUT_ORDER: 1 when the linear layer's out_proj keeps its columns in act.lo_order
L_WINDOW, L_ROPE, L_QSCALE, L_ACT, L_LINEAR, L_CACHE, L_ROTARY, L_LOUT_ORDER = range(8)
# a MoE layer's softmax over its top-k logits only (1), its clamped SwiGLU's limit and alpha (f32 bits)
L_TOPK_SOFTMAX, L_SWIGLU_LIMIT, L_SWIGLU_ALPHA = range(8, 11)
# per-layer geometry (layer_kv.py, filled by engine_layers.py): the layer's head_dim, KV heads and
# dense FFN width; where its K and V lie in the cache (value offsets of slot 0, values a slot);
# its attention and combine kernels (0: the core table's); L_VNORM: the vector of ones its v is
# RMS-normed with (-1: none); L_VISK: v is k's projection; L_SHARED: it reads another layer's K/V
# (at its offsets) and stores none; L_MOE_BESIDE: Gemma 4's experts beside the dense FFN
(L_HD, L_NKV, L_WIDTH, L_KOFF, L_VOFF, L_KSLOT, L_VSLOT, L_ATT, L_COMB, L_VNORM, L_VISK, L_SHARED,
 L_MOE_BESIDE) = range(11, 24)
N_LAY = 24
SEG_SLOT, SEG_POS, SEG_ROWS = range(3)  # segs[] columns
# dims[] layout; D_QUANT: 1 when some matrix is a block format (its inputs get quantised);
# D_EMBED_SCALE, D_SOFTCAP: f32 bits of the embedding scale and the final logit softcap (0: none)
# D_LKH, D_LDK, D_LDV, D_LTAPS: the linear-attention layers' key heads, head sizes and conv taps
D_NH, D_NKV, D_HD, D_TOPK, D_NORM_TOPK, D_QUANT, D_EMBED_SCALE, D_SOFTCAP, D_LKH, D_LDK, D_LDV, D_LTAPS = range(12)
# Gemma 4's per-layer inputs: their width (0: none), the packed table's and the projection's rows of
# `mats`, the projection norm's of `vec_tab`
D_PL_WIDTH, D_PL_TABLE, D_PL_PROJ, D_PL_NORM = range(12, 16)
N_DIMS = 16


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
    none on the decode kernels), else quantised for the block-format kernels (when the model has any);
    rounded to bf16 chunks too where BF16 weights' q8 tiles will read them (core[C_ROUND_BF16] != 0)."""
    if n_dec == 0 and x.shape[0] >= AMX_MIN_TOKENS and core[C_SPLIT] != 0:
        split_rows(x, act.qx.xq, core)
    elif quant:
        quantize_for(x, act.qx, core, n_dec)
    if core[C_ROUND_BF16] != 0 and x.shape[0] > n_dec:
        round_rows(x, act.qx, core)


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
def moe_extras(vecs, vec_tab, vi, lay_l):
    """A MoE layer's variants as moe reads them (X_*): whether its softmax is over the top-k only,
    the addresses of its router's and experts' biases (0: none), its clamped SwiGLU's limit and
    alpha (f32 bits)."""
    return (lay_l[L_TOPK_SOFTMAX], vaddr(vecs, vec_tab, vi[V_ROUTER_BIAS]), vaddr(vecs, vec_tab, vi[V_GATE_EXPS_BIAS]),
            vaddr(vecs, vec_tab, vi[V_UP_EXPS_BIAS]), vaddr(vecs, vec_tab, vi[V_DOWN_EXPS_BIAS]),
            lay_l[L_SWIGLU_LIMIT], lay_l[L_SWIGLU_ALPHA])


@helper()
def shared_expert(h, act, mats, mi, fn, kern, core, quant, out, n_dec):
    """out += sigmoid(h · shared_expert_gate) * the shared expert's GLU of h."""
    T = h.shape[0]
    prepare(h, act, quant, core, n_dec)  # the experts' products overwrote it
    linear(h, act, mats, mi[M_SGATE], kern, core, act.sgl[:T], n_dec)
    gated(h, act, mats, mi[M_SG], mi[M_SU], mi[M_SD], fn, kern, core, quant, act.sgate[:T], act.sup[:T],
          act.sy[:T], n_dec)
    add_gated(out, act.sy[:T], act.sgl[:T])


def ffn(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec, ex):
    """The FFN of layer l (fn: its activation; ex: its MoE variants, moe_extras). exp_idx is None for
    a model without MoE layers: a type, so a dense model's forward holds no MoE code (and the call
    from Python stays on numba's fast path)."""


@overload(ffn, jit_options=OWN_FLAGS)
def _ffn(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec, ex):
    if isinstance(exp_idx, types.NoneType):
        def dense(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec, ex):
            gated(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], fn, kern, core, quant, gate, up, out, n_dec)
        return dense

    def sparse_or_dense(exp_idx, l, h, act, mats, mi, fn, dims, kern, core, quant, gate, up, out, n_dec, ex):
        if mi[M_ROUTER] >= 0:
            logits = act.router[:h.shape[0]]
            linear(h, act, mats, mi[M_ROUTER], kern, core, logits, n_dec)
            moe(h, logits, act, mats, exp_idx[l], dims[D_TOPK], dims[D_NORM_TOPK] != 0, fn, kern, core, quant, out,
                n_dec, ex, logits[0, :0])
            if mi[M_SG] >= 0:
                shared_expert(h, act, mats, mi, fn, kern, core, quant, out, n_dec)
        else:
            gated(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], fn, kern, core, quant, gate, up, out, n_dec)
    return sparse_or_dense


@helper()
def per_layer_inputs(tokens, x, act, mats, vecs, vec_tab, dims, kern, core, quant, n_dec, eps):
    """Gemma 4's per-layer inputs of the tokens into act.pli [L, T, P] (reference.per_layer_inputs): the
    normed projection of the scaled embedding x and the tokens' rows of the packed table, read in
    its stored format."""
    T, H = x.shape
    P, ti, pi = dims[D_PL_WIDTH], dims[D_PL_TABLE], dims[D_PL_PROJ]
    LP = mats[pi, 1]
    proj, own = rows_of(act.plt, T, LP), rows_of(act.plr, T, LP)
    prepare(x, act, quant, core, n_dec)
    linear(x, act, mats, pi, kern, core, proj, n_dec)
    scale_by(proj, np.float32(H ** -0.5))
    normed = proj.reshape(T * (LP // P), P)
    rmsnorm(normed, act.x[:0], vaddr(vecs, vec_tab, dims[D_PL_NORM]), eps, normed, core)
    for t in range(T):
        dequant_row(kern, mats[ti, 3], mats[ti, 0] + tokens[t] * mats[ti, 2], LP, own[t])
    per_layer_rows(own, proj, np.float32(P ** 0.5), act.pli[:, :T])


@helper()
def per_layer_input(x, act, mats, mi, vecs, vec_tab, vi, pl, fn, kern, core, quant, out, n_dec, eps):
    """What a layer adds from its input rows pl [T, P]: out = norm(proj(fn(gate(x)) * pl))."""
    g = act.plg[:x.shape[0]]
    prepare(x, act, quant, core, n_dec)
    linear(x, act, mats, mi[M_PLG], kern, core, g, n_dec)
    glu(g, pl, fn, core)
    prepare(g, act, quant, core, n_dec)
    linear(g, act, mats, mi[M_PLP], kern, core, out, n_dec)
    rmsnorm(out, act.x[:0], vaddr(vecs, vec_tab, vi[V_PLN]), eps, out, core)


def moe_beside(exp_idx, l, x, act, mats, mi, vecs, vec_tab, vi, fn, dims, kern, core, quant, out, n_dec, eps):
    """Gemma 4's experts beside the dense FFN of layer l: out += norm(experts(norm(x))) (reference.
    moe_beside); exp_idx None: a model without experts (nothing to compile)."""


@overload(moe_beside, jit_options=OWN_FLAGS)
def _moe_beside(exp_idx, l, x, act, mats, mi, vecs, vec_tab, vi, fn, dims, kern, core, quant, out, n_dec, eps):
    if isinstance(exp_idx, types.NoneType):
        def none(exp_idx, l, x, act, mats, mi, vecs, vec_tab, vi, fn, dims, kern, core, quant, out, n_dec, eps):
            pass
        return none

    def experts(exp_idx, l, x, act, mats, mi, vecs, vec_tab, vi, fn, dims, kern, core, quant, out, n_dec, eps):
        T, H = x.shape
        hr, he, y = act.h[:T], act.mb[:T], act.my[:T]
        # the router reads rmsnorm(x) * scale / sqrt(hidden): the engine folded both into V_RSCALE
        rmsnorm(x, act.x[:0], vaddr(vecs, vec_tab, vi[V_RSCALE]), eps, hr, core)
        logits = act.router[:T]
        prepare(hr, act, quant, core, n_dec)
        linear(hr, act, mats, mi[M_ROUTER], kern, core, logits, n_dec)
        rmsnorm(x, act.x[:0], vaddr(vecs, vec_tab, vi[V_FFN_NORM2]), eps, he, core)
        prepare(he, act, quant, core, n_dec)
        moe(he, logits, act, mats, exp_idx[l], dims[D_TOPK], True, fn, kern, core, quant, y, n_dec,
            NO_EXTRAS, vslice(vecs, vec_tab, vi[V_EXPSCALE]))
        rmsnorm(y, act.x[:0], vaddr(vecs, vec_tab, vi[V_POST_FFN2]), eps, y, core)
        add_rows(out, y)
    return experts


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
        if r1 - r0 >= CHUNK:  # a prompt: matrix products (delta_chunked.py); fewer rows: the recurrence
            delta_rule_chunked(act.lc[r0:r1], lz[r0:r1], lb[r0:r1], la[r0:r1], a_log, dt_bias, norm_w, rec[slot],
                               pos0, dims[D_LKH], dims[D_LDK], dims[D_LDV], f32_of(eps), act.lo[r0:r1])
        else:
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
    x, h, o = act.x[:T], act.h[:T], act.o[:T]  # q, k, v, att, gate, up: each layer's own widths
    none = act.x[:0]
    H = x.shape[1]
    for t in range(T):
        dequant_row(kern, mats[embed_i, 3], mats[embed_i, 0] + tokens[t] * mats[embed_i, 2], H, x[t])
    if dims[D_EMBED_SCALE] != 0:
        scale_rows(x, dims[D_EMBED_SCALE])
    keep_hidden = hidden_out.shape[0] > 0
    if keep_hidden:
        copy_into(hidden_out[0], x)
    if dims[D_PL_WIDTH] != 0:
        per_layer_inputs(tokens, x, act, mats, vecs, vec_tab, dims, kern, core, quant, n_dec, eps)
    rmsnorm(x, none, vaddr(vecs, vec_tab, vec_idx[0, V_ATTN_NORM]), eps, h, core)
    for l in range(L):
        mi = mat_idx[l]
        vi = vec_idx[l]
        ci = lay[l, L_CACHE]
        prepare(h, act, quant, core, n_dec)
        if lay[l, L_LINEAR] != 0:
            linear_mixer(h, segs, act, mats, mi, vecs, vec_tab, vi, dims, rec[ci], conv_win[ci], kern, core, quant,
                         n_dec, eps)
            if lay[l, L_LOUT_ORDER] != 0:
                gather_columns(act.lo[:T], act.lo_order, act.lc)
            prepare(act.lo[:T], act, quant, core, n_dec)
            linear(act.lo[:T], act, mats, mi[M_LOUT], kern, core, o, n_dec)
        else:
            ri = lay[l, L_ROPE]
            cs, sn = (np.int64(0), np.int64(0)) if ri < 0 else (ptr(cos[ri]), ptr(sin[ri]))
            rot = lay[l, L_ROTARY]
            if rot != 0:  # RoPE over part of each head: here, after the kernel's bias and norm
                cs, sn = np.int64(0), np.int64(0)
            hd, nkv, shared = lay[l, L_HD], lay[l, L_NKV], lay[l, L_SHARED] != 0
            q, att = rows_of(act.q, T, nh * hd), rows_of(act.att, T, nh * hd)
            k, v = rows_of(act.k, T, nkv * hd), rows_of(act.v, T, nkv * hd)
            r = describe_linear(h, act, mats, mi[M_Q], kern, core, q, 0, 0, n_dec)
            if mi[M_K] >= 0:
                r = describe_linear(h, act, mats, mi[M_K], kern, core, k, r, 1, n_dec)
            if mi[M_V] >= 0:
                r = describe_linear(h, act, mats, mi[M_V], kern, core, v, r, 2, n_dec)
            batch(act.desc, r, core, T > n_dec)
            if lay[l, L_VISK] != 0:  # v is k's projection, before k's norm and RoPE
                copy_rows(v, k)
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
                if lay[l, L_VNORM] >= 0:  # an RMSNorm without weight (a vector of ones) over each head of v
                    bias_norm_rope(vj, 0, vaddr(vecs, vec_tab, lay[l, L_VNORM]), nkv, hd, pos0, 0, 0, eps, 0, core)
                kc, vc = kv_at(k_cache, v_cache, lay[l, L_KOFF], lay[l, L_VOFF], lay[l, L_KSLOT], lay[l, L_VSLOT], slot)
                if not shared:  # a layer sharing another's K/V reads what that layer stored
                    tasks(core[C_KV_STORE], r1 - r0, args11(ptr(kj), ptr(vj), ptr(kc), ptr(vc), pos0, nkv * hd))
                attention(qj, kc, vc, pos0, lay[l, L_WINDOW], nh, nkv, att[r0:r1], act.part, core,
                          vaddr(vecs, vec_tab, vi[V_SINKS]), lay[l, L_ATT], lay[l, L_COMB])
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
        gate, up = rows_of(act.gate, T, lay[l, L_WIDTH]), rows_of(act.up, T, lay[l, L_WIDTH])
        if lay[l, L_MOE_BESIDE] != 0:
            gated(h, act, mats, mi[M_GATE], mi[M_UP], mi[M_DOWN], lay[l, L_ACT], kern, core, quant, gate, up, o, n_dec)
            rmsnorm(o, none, vaddr(vecs, vec_tab, vi[V_POST_FFN1]), eps, o, core)
            moe_beside(exp_idx, l, x, act, mats, mi, vecs, vec_tab, vi, lay[l, L_ACT], dims, kern, core, quant, o, n_dec,
                       eps)
        else:
            ffn(exp_idx, l, h, act, mats, mi, lay[l, L_ACT], dims, kern, core, quant, gate, up, o, n_dec,
                moe_extras(vecs, vec_tab, vi, lay[l]))
        if vi[V_POST_FFN] >= 0:
            rmsnorm(o, none, vaddr(vecs, vec_tab, vi[V_POST_FFN]), eps, o, core)
        nxt = vec_idx[l + 1, V_ATTN_NORM] if l + 1 < L else final_norm_i
        if mi[M_PLG] >= 0 or vi[V_LSCALAR] >= 0:
            add_rows(x, o)
            if mi[M_PLG] >= 0:
                per_layer_input(x, act, mats, mi, vecs, vec_tab, vi, act.pli[l, :T], lay[l, L_ACT], kern, core, quant,
                                o, n_dec, eps)
                add_rows(x, o)
            if vi[V_LSCALAR] >= 0:
                scale_by(x, vecs[vec_tab[vi[V_LSCALAR], 0]])
            rmsnorm(x, none, vaddr(vecs, vec_tab, nxt), eps, h, core)
        else:
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
