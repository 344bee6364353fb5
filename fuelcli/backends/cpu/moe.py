"""A MoE layer of the CPU forward by expert (llama.cpp's mul_mat_id): every row is routed first, the
(row, expert) pairs are grouped by expert, and each chosen expert's gate/up and down run once over
the rows that chose it, so that a prefill, a verify or a step of several sequences reads an expert's
weights once, however many rows chose it. All experts' gate/up run in one parallel loop, their downs
in another (matmul.batch).

The pairs' rows ("pair rows", act.ey, act.egate, act.eup) lie grouped by expert: first the pairs of
the forward's first n_dec rows (one-token sequences), each expert's on the decode kernels (B-wide
over its rows where the format has them), so that such a row's result is bit for bit a one-token
step's whatever rows run beside it; then the other rows' pairs, each expert's on the tiles, whose
rows do not depend on each other either. A group table says where (G_*): one row per (expert, kernel
kind) that has pairs. The block formats' pair rows are gathered already quantised (act.eqx, from h's
quantisation), the float formats' as f32 rows (act.ey). A one-token forward gathers nothing: every
expert reads h, prepared already. Where no expert is of a float format, act.ey lies over act.egate
and act.eup (activations.pair_rows): the downs write it only after the GLU's rows are quantised.
"""

import numpy as np

from ...formats import ACTIVATION_BLOCK as AB
from .activations import GROUP_COLS, Quantized
from .jit import helper
from .llvm import ptr
from .kernels_prefill import KC
from .kernels_prefill_bf16 import PAIRS_KC
from .matmul import (ACT_CLAMPED_SWIGLU, C_ROUND_BF16, C_SPLIT, K_QUANT, add_bias, batch, clamped_glu, describe_product,
                     glu, pack_rows, quantize_for, round_rows)

# the group table's columns: the expert, its first pair row, its rows, how many of them run the decode
# kernels (all or none), the row of the gate/up input they read from (their first pair row, or 0: h)
G_EXPERT, G_START, G_ROWS, G_DEC, G_IN = range(GROUP_COLS)
TAKEN = np.float32(-1.0)  # route's mark of a chosen expert: no probability (>= 0, or NaN) equals it
# a layer's routing and expert variants (forward.moe_extras): its softmax over the top-k only (gpt-oss),
# the addresses of its router's and experts' biases (0: none), its clamped SwiGLU's limit and alpha
X_TOPK_SOFTMAX, X_ROUTER_BIAS, X_GATE_BIAS, X_UP_BIAS, X_DOWN_BIAS, X_LIMIT, X_ALPHA = range(7)
# decode pairs up to this many (4 sequences' top-8) run their GLU and quantisation in the calling
# thread: a few thousand values, where a parallel loop's join waits for every thread, a descheduled one too
SERIAL_PAIRS = 32
_Z = np.int64(0)
NO_EXTRAS = (_Z, _Z, _Z, _Z, _Z, _Z, _Z)


@helper(fastmath=False)
def route(logits, k, renorm, experts, weights):
    """softmax over all experts in f32, take the top k (ties to the lower index, like torch.topk),
    renormalise only if asked; logits become the probabilities, the taken ones TAKEN. A NaN router
    logit makes every p NaN: the first untaken experts are then taken with NaN weights, so the NaN
    reaches the logits (model/finite.py names it)."""
    n = logits.shape[0]
    m = logits[0]
    for i in range(n):
        m = max(m, logits[i])
    s = np.float32(0.0)
    for i in range(n):
        logits[i] = np.exp(logits[i] - m)
        s += logits[i]
    for i in range(n):
        logits[i] /= s
    total = np.float32(0.0)
    for j in range(k):
        best, pbest = -1, np.float32(-1.0)
        for i in range(n):
            p = logits[i]
            if p != TAKEN and (best < 0 or p > pbest):
                best, pbest = i, p
        experts[j] = best
        weights[j] = pbest
        logits[best] = TAKEN
        total += pbest
    if renorm:
        for j in range(k):
            weights[j] /= total


@helper(fastmath=False)
def route_topk_softmax(logits, k, experts, weights):
    """the top k logits (ties to the lower index, like torch.topk), softmax over those k only in f32
    (gpt-oss's router)."""
    n = logits.shape[0]
    for j in range(k):
        best = -1
        for i in range(n):
            taken = False
            for jj in range(j):
                taken = taken or experts[jj] == i
            if not taken and (best < 0 or logits[i] > logits[best]):
                best = i
        experts[j] = best
    m = logits[experts[0]]
    s = np.float32(0.0)
    for j in range(k):
        weights[j] = np.exp(logits[experts[j]] - m)
        s += weights[j]
    for j in range(k):
        weights[j] /= s


@helper()
def group(groups, n, e, start, rows, dec, src):
    groups[n, G_EXPERT], groups[n, G_START], groups[n, G_ROWS] = e, start, rows
    groups[n, G_DEC], groups[n, G_IN] = dec, src
    return n + 1


@helper()
def plan_one(experts, groups, pos):
    """One row's k experts, each a group reading h's row (the forward prepared it), in the order the
    experts lie in the file, so that a thread's run of tasks reads its rows in address order: pos[0, i]
    <- the pair row of its i-th expert (scatter sums in routing order, so the bits are the same)."""
    k = experts.shape[1]
    for i in range(k):
        rank = 0
        for j in range(k):
            rank += experts[0, j] < experts[0, i]
        group(groups, rank, experts[0, i], rank, 1, 1, 0)
        pos[0, i] = rank
    return k


@helper()
def plan(experts, n_dec, count, groups, pos, src):
    """The pair rows of T routed rows (experts [T, k]): pos[t, i] <- the pair row of row t's i-th
    expert, src[p] <- the row of pair row p, the group table filled; the number of groups. count:
    scratch [experts, 2]."""
    T, k = experts.shape
    count[:] = 0
    for t in range(T):
        for i in range(k):
            count[experts[t, i], 0 if t < n_dec else 1] += 1
    n = np.int64(0)
    p = np.int64(0)
    for part in range(2):  # the decode kernels' pairs first
        for e in range(count.shape[0]):
            c = count[e, part]
            if c > 0:
                n = group(groups, n, e, p, c, c if part == 0 else 0, p)
                count[e, part] = p  # from here on: the group's next free pair row
                p += c
    for t in range(T):
        for i in range(k):
            part = 0 if t < n_dec else 1
            e = experts[t, i]
            q = count[e, part]
            count[e, part] = q + 1
            pos[t, i] = q
            src[q] = t
    return n


@helper()
def gather(h, src, x):
    """x's pair rows <- the rows of h they belong to (float-format experts read x itself)."""
    for p in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[p, j] = h[src[p], j]


@helper()
def gather_quantized(qx, src, n_dec, K, eq):
    """The pair rows' quantisation in eq <- their rows' in qx (quantize_for's layout: a row quantises
    alike wherever it lies); the first n_dec pair rows' decode layout too."""
    nb, nz, npl = K // AB, K // 16, 4 * K + 64
    for p in range(src.shape[0]):
        t = src[p]
        eq.xq[p * K:(p + 1) * K] = qx.xq[t * K:(t + 1) * K]
        eq.xs[p * nb:(p + 1) * nb] = qx.xs[t * nb:(t + 1) * nb]
        eq.xf[p * nb:(p + 1) * nb] = qx.xf[t * nb:(t + 1) * nb]
        eq.xz[p * nz:(p + 1) * nz] = qx.xz[t * nz:(t + 1) * nz]
        if p < n_dec:
            eq.xp[p * npl:(p + 1) * npl] = qx.xp[t * npl:(t + 1) * npl]


@helper()
def qx_rows(qx, r, K):
    """qx's quantisation of rows r.. of a [rows, K] input (matmul.quantize_for's layout), as its own."""
    nb = K // AB
    return Quantized(qx.xq[r * K:], qx.xs[r * nb:], qx.xf[r * nb:], qx.xp[r * (4 * K + 64):], qx.xz[r * (K // 16):],
                     qx.xb[r * PAIRS_KC:], qx.xbs, qx.x8[r * KC:], qx.x8s)


@helper()
def describe_experts(x, qx, in_col, groups, n, role, exp_idx_l, mats, kern, core, out, desc, r, ddesc):
    """out's pair rows = x's rows (from the group's in_col row) @ each group's expert's matrix `role`
    (0..2: gate, up, down), one desc row per group from row r, their decode tables in ddesc; the next
    free desc row and the ddesc rows used."""
    K, N = x.shape[1], out.shape[1]
    d = np.int64(0)
    for g in range(n):
        s, rows, nd, i0 = groups[g, G_START], groups[g, G_ROWS], groups[g, G_DEC], groups[g, in_col]
        m = exp_idx_l[groups[g, G_EXPERT], role]
        r = describe_product(desc, r, x[i0:i0 + rows], qx_rows(qx, i0, K), mats[m, 0], mats[m, 1], mats[m, 2],
                             mats[m, 3], kern, core, ptr(out) + 4 * s * N, nd, ddesc[d:], False)
        d += nd
    return r, d


@helper()
def expert_biases(x, groups, n, bias, core):
    """Each group's pair rows of x += its expert's bias (bias: the address of the [experts, width] biases)."""
    width = x.shape[1]
    for g in range(n):
        s, rows = groups[g, G_START], groups[g, G_ROWS]
        add_bias(x[s:s + rows], bias + 4 * groups[g, G_EXPERT] * width, core)


@helper()
def expert_glu(gate, up, fn, ex, core):
    """gate <- fn(gate) * up on every pair row (fn: matmul.ACT_*; the clamped SwiGLU's limit and alpha
    in ex)."""
    if fn == ACT_CLAMPED_SWIGLU:
        clamped_glu(gate, up, ex[X_LIMIT], ex[X_ALPHA], core)
    else:
        glu(gate, up, fn, core)


@helper()
def scatter(y, pos, weights, out):
    """out[t] = the sum over row t's experts, in their routing order, of weight * its expert's output."""
    T, k = pos.shape
    for t in range(T):
        for j in range(out.shape[1]):
            out[t, j] = 0.0
        for i in range(k):
            w, p = weights[t, i], pos[t, i]
            for j in range(out.shape[1]):
                out[t, j] += w * y[p, j]


@helper()
def moe(h, logits, act, mats, exp_idx_l, k, renorm, fn, kern, core, quant, out, n_dec, ex, scales):
    """Sparse FFN of one layer: out = each row's experts' GLUs of h, weighted (module docstring). h is
    prepared (forward.prepare); logits: its router logits [T, experts] (overwritten); act's expert
    buffers are the engine's (activations.py); ex: the layer's variants (X_*, NO_EXTRAS); scales: each
    expert's weight scale (Gemma 4's per_expert_scale; empty: none)."""
    T = h.shape[0]
    P = T * k
    experts, weights, pos = act.experts[:T], act.expert_w[:T], act.epos[:T]
    if ex[X_ROUTER_BIAS] != 0:
        add_bias(logits, ex[X_ROUTER_BIAS], core)
    for t in range(T):
        if ex[X_TOPK_SOFTMAX] != 0:
            route_topk_softmax(logits[t], k, experts[t], weights[t])
        else:
            route(logits[t], k, renorm, experts[t], weights[t])
        if scales.shape[0] != 0:
            for i in range(k):
                weights[t, i] *= scales[experts[t, i]]
    groups, gate, up, y = act.egroups, act.egate[:P], act.eup[:P], act.ey[:P]
    if T == 1:
        n = plan_one(experts, groups, pos)
        x, qx, in_col, dec = h, act.qx, G_IN, np.int64(k)
    else:
        n = plan(experts, n_dec, act.ecount, groups, pos, act.esrc)
        dec = n_dec * k
        src = act.esrc[:P]
        g, u = exp_idx_l[0, 0], exp_idx_l[0, 1]
        if not quant or kern[mats[g, 3], K_QUANT] == 0 or kern[mats[u, 3], K_QUANT] == 0:  # x read as f32
            gather(h, src, y)
            if core[C_ROUND_BF16] != 0 and P > dec:  # or as bf16 chunks (BF16 experts' q8 tiles)
                round_rows(y, act.eqx, core)
        if quant:
            if core[C_SPLIT] != 0:  # AMX: h holds bf16 planes (forward.prepare), the experts want int16
                quantize_for(h, act.qx, core, n_dec)
            gather_quantized(act.qx, src, dec, h.shape[1], act.eqx)
            if P > dec:
                pack_rows(act.eqx, P, h.shape[1], core)
        x, qx, in_col = y, act.eqx, G_START
    r, d = describe_experts(x, qx, in_col, groups, n, 0, exp_idx_l, mats, kern, core, gate, act.edesc, 0,
                            act.eddesc)
    r, _ = describe_experts(x, qx, in_col, groups, n, 1, exp_idx_l, mats, kern, core, up, act.edesc, r,
                            act.eddesc[d:])
    batch(act.edesc, r, core, P > dec)
    if ex[X_GATE_BIAS] != 0:
        expert_biases(gate, groups, n, ex[X_GATE_BIAS], core)
    if ex[X_UP_BIAS] != 0:
        expert_biases(up, groups, n, ex[X_UP_BIAS], core)
    if P == dec and P <= SERIAL_PAIRS:
        for i in range(P):  # here, row by row: two parallel loops fewer (the same kernels, the same bits)
            expert_glu(gate[i:i + 1], up[i:i + 1], fn, ex, core)
            if quant:
                quantize_for(gate[i:i + 1], qx_rows(act.eqx, i, gate.shape[1]), core, np.int64(1))
    else:
        expert_glu(gate, up, fn, ex, core)
        if quant:
            quantize_for(gate, act.eqx, core, dec)
        if core[C_ROUND_BF16] != 0 and P > dec:
            round_rows(gate, act.eqx, core)
    r, _ = describe_experts(gate, act.eqx, G_START, groups, n, 2, exp_idx_l, mats, kern, core, y, act.edesc, 0,
                            act.eddesc)
    batch(act.edesc, r, core, P > dec)
    if ex[X_DOWN_BIAS] != 0:
        expert_biases(y, groups, n, ex[X_DOWN_BIAS], core)
    scatter(y, pos, weights, out)
