"""The attention kernel as IR: causal softmax(q k^T / sqrt(hd)) v over one layer's KV cache.

  attention(task, q, k, v, out, pos0, window, n_heads, n_kv, T, splits, part)
      task = (block of ATT_TOKENS tokens, kv head, split). Its queries (every token of the block
      times every query head of the kv head's group: "slots", token-major) go through the keys
      once, flash-attention style: for each block of KEY_BLOCK keys, every chunk of up to 8 slots
      (4 on AVX2) updates its running max, sum and output (kept on the stack), so a K/V block loaded
      once serves all the task's queries from L1. With splits > 1 (decode: matmul.attention) the key
      blocks the queries see are cut into `splits` runs, one a task, so that more tasks than kv
      heads share the work; a task then writes its slots' unnormalised output, max and sum into
      part (part_stride floats a slot, split-major) for the combine kernel. With h << HEADS_AT in
      `splits` a task takes h consecutive kv heads' slots (head-major; h divides n_kv), head by head
      at each key block: the same chunks in the same order, so the same sums, but its reads are
      whole stretches of the cache's rows, in order.

K is cached in blocks of KEY_BLOCK positions, d-major ([block, n_kv, hd, KEY_BLOCK]: KVCache's
key_block layout): the scores of a chunk's queries against a block are hd broadcast-FMAs per query
with the 16 keys in the lanes, each K vector feeding the whole chunk, and no horizontal sums.
V stays row-major ([n_ctx, n_kv, hd]); p·V is per key a broadcast of p times the V row, each V
vector again feeding the whole chunk. The cache holds f32 or f16 values (--cache-type), widened to
f32 as they load; everything after the loads is f32.

Masking: a key j counts for the query at position p when start <= j <= p (start from the sliding
window w > 0: p - w < j). Masked scores are -inf and their weights exactly 0; a chunk skips a key
block that none of its queries sees. V rows are read only at positions the task's queries can see
(between the first query's start and the last query's p), so a stale row past the prefix (a rewind)
never enters; a NaN in a seen row reaches every query of the chunk (0 * NaN), as in transformers'
masked matmul. A NaN score gives a NaN weight (vexp keeps a NaN).
"""

from __future__ import annotations

import math

from llvmlite import ir

from .irgen import (F32T, I8, I32, I64, Loop, Var, c64, call_intrinsic, const, fmax, fmuladd, func, hmax_rows, hsum,
                    prefetch, ptr_to, splat, splat_c, vec, vexp)

ATT_TOKENS = 16  # tokens of one attention task: its queries share every K/V block loaded
KEY_BLOCK = 16  # positions per K block of the cache, the lanes of a score vector
# by vector lanes: queries updated together per key block (the widest first; the rest of a task's
# slots take each smaller size at most once). 3 on AVX2: a decode step of a 3-query group (SmolLM2)
# in one pass, not 2 + 1: 0.18 -> 0.15 ms a layer at depth 2048 (1 thread, from L3).
CHUNKS = {16: (8, 4, 2, 1), 8: (4, 3, 2, 1)}
MAX_SPLITS = 16  # key runs of one decode step's attention at most (activations.part holds them)
MIN_SPLIT_BLOCKS = 8  # key blocks a run takes at least: shorter runs cost more to combine than they save


SINKS = 1 << 32  # in attention's `splits`: one run, and `part` holds the sink logits (the module's docstring)
HEADS_AT = 33  # in attention's `splits` from this bit: kv heads a task takes, 0 for one (the module's docstring)
PART_EXTRA = 2  # a slot's row of `part`: its unnormalised output (hd floats), then its max and sum


def part_stride(hd):
    """Floats per slot of `part`."""
    return hd + PART_EXTRA


def _width(hd):
    """The vector width over head_dim for p·V: the largest power of two up to 16 dividing hd."""
    w = 16
    while hd % w:
        w //= 2
    return w


def _slots(hd):
    """Queries a task keeps state for at once (output, max, sum: ~32 KiB of stack at hd 64)."""
    return max(8, min(128, 8192 // hd // 8 * 8))


def _chains(Q, L):
    """Score sums per query (independent FMA chains, shorter sums): 8 or more chains in flight, in
    the registers. On AVX2 (16 registers) a score row of KEY_BLOCK keys is 2 vectors: 8 sums at most;
    with more (the 8-query chunk, 2 chains each) half the chunk's steps were spills. With the softmax a
    query at a time: prefill of 512 tokens after 2048, SmolLM2's heads, 1 thread, 82 -> 48 ms a
    layer."""
    return max(2, 8 // Q) if L == 16 else max(1, 4 // Q)


def _pv_columns(hd, Q, L):
    """Column vectors of p·V a query updates together: Q of them alone are Q chains of KEY_BLOCK
    dependent FMAs, fewer than the FMA pipes' latency hides; as many more as the registers hold
    (half of them: 16 of 32 on AVX-512, 8 of 16 on AVX2). Each sum keeps its order (bit for bit);
    8 queries by 2 columns: attention at 3584 + 512 tokens, Qwen2-1.5B's heads, 1.08-1.15x (Zen 5)."""
    per = max(1, _width(hd) // L)  # registers a column vector takes
    G = hd // _width(hd)
    while G > 1 and (hd // _width(hd) % G or Q * G * per > (16 if L == 16 else 8)):
        G -= 1
    return G


def _tree_sum(bd, vs):
    while len(vs) > 1:
        vs = [bd.fadd(a, b) for a, b in zip(vs[0::2], vs[1::2])] + vs[len(vs) // 2 * 2:]
    return vs[0]


def _chunk(mod, name, hd, Q, L, E, ahead=False):
    """Q queries against one key block: scores, online-softmax update, p·V into the accumulators.

    (kb, vb, vstride, j0, vlo, vhi, q, qoff, lo, hi, m, l, acc, pb, ka, ja): kb the K block of the kv head
    [hd, B]; vb V at position 0 of the kv head, vstride floats between positions; j0 the block's
    first position; V rows clamped to [vlo, vhi]; per query: q + qoff[i] its row, lo/hi its
    visible keys, m its running max, l[i*B..] its running sums (by lane), acc[i*hd..] its output;
    pb scratch for the weights [Q, B]; ka and ja the K block and first position the task reads next,
    whose lines the `ahead` variant (a block's first chunk) prefetches beside its own loads (a prefetch
    never faults: the rows past the cache's end that the last block names are harmless)."""
    B = KEY_BLOCK
    W = _width(hd)
    F32P, I64P, EP = F32T.as_pointer(), I64.as_pointer(), E.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [EP, EP, I64, I64, I64, I64, F32P, I64P, I64P, I64P, F32P, F32P,
                                           F32P, F32P, EP, I64])
    fn = ir.Function(mod, fnty, name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")  # inlined into the key loop, its values spilled more
    kb, vb, vstride, j0, vlo, vhi, q, qoff, lo, hi, m, l, acc, pb, ka, ja = fn.args
    esize = 4 if E == F32T else 2

    def fetch(p, i, n):  # the lines of n cached values from p + i, into L2
        base = bd.bitcast(at(p, i), I8.as_pointer())
        for off in range(0, n * esize, 64):
            prefetch(bd, bd.gep(base, [c64(off)]), 2)

    for a in fn.args:
        if isinstance(a.type, ir.PointerType):
            a.add_attribute("noalias")
    bd = ir.IRBuilder(fn.append_basic_block("entry"))
    vt, wt = vec(F32T, B), vec(F32T, W)

    def at(p, i):
        return bd.gep(p, [i if isinstance(i, ir.Value) else c64(i)])

    def vload(p, i, t):
        return bd.load(bd.bitcast(at(p, i), t.as_pointer()), align=4)

    def kvload(p, i, n):  # n cached values, as floats
        v = bd.load(bd.bitcast(at(p, i), vec(E, n).as_pointer()), align=4 if E == F32T else 2)
        return v if E == F32T else bd.fpext(v, vec(F32T, n))

    def vstore(v, p, i):
        bd.store(v, bd.bitcast(at(p, i), v.type.as_pointer()), align=4)

    # scores: S[i] lane j = q_i . k_{j0+j}
    qrows = [at(q, bd.load(at(qoff, i))) for i in range(Q)]
    U = next(u for u in (8, 4, 2, 1) if hd % u == 0)
    A = min(U, _chains(Q, L))
    S = [[Var(bd, splat_c(F32T, 0.0, B)) for _ in range(A)] for _ in range(Q)]
    with Loop(bd, 0, hd, U) as d0:
        s = [[S[i][a].get() for a in range(A)] for i in range(Q)]
        for u in range(U):
            d = bd.add(d0, c64(u))
            kv = kvload(kb, bd.mul(d, c64(B)), B)
            if ahead and u * B * esize % 64 == 0:
                fetch(ka, bd.mul(d, c64(B)), B)
            for i in range(Q):
                s[i][u % A] = fmuladd(bd, splat(bd, bd.load(at(qrows[i], d)), B), kv, s[i][u % A])
        for i in range(Q):
            for a in range(A):
                S[i][a].set(s[i][a])
    scale = splat_c(F32T, _f32(1.0 / math.sqrt(hd)), B)
    for i in range(Q):
        vstore(bd.fmul(_tree_sum(bd, [S[i][a].get() for a in range(A)]), scale), pb, i * B)

    # online softmax: the Q running maxima together (hmax_rows), then the weights a query at a time
    # through pb (the barriers keep LLVM from interleaving all Q, which spilled): e = exp(s - m_new)
    # for visible keys, corrections exp(m_old - m_new)
    barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [pb.type]), "", "r,~{memory}", side_effect=True)
    jv = bd.add(splat(bd, bd.trunc(j0, I32), B), const(I32, range(B)))
    masks = [bd.and_(bd.icmp_signed(">=", jv, splat(bd, bd.trunc(bd.load(at(lo, i)), I32), B)),
                     bd.icmp_signed("<=", jv, splat(bd, bd.trunc(bd.load(at(hi, i)), I32), B))) for i in range(Q)]

    def scores(i):
        return bd.select(masks[i], vload(pb, i * B, vt), splat_c(F32T, -math.inf, B))

    m_old = ir.Constant(vec(F32T, Q), None)
    for i in range(Q):
        m_old = bd.insert_element(m_old, bd.load(at(m, i)), ir.Constant(I32, i))
    m_new = fmax(bd, m_old, hmax_rows(bd, [scores(i) for i in range(Q)]))  # a NaN score never becomes the max
    m_use = bd.select(bd.fcmp_ordered("==", m_new, splat_c(F32T, -math.inf, Q)), splat_c(F32T, 0.0, Q),
                      m_new)  # nothing seen yet
    dm = bd.fsub(m_old, m_use)
    for i in range(Q):
        bd.call(barrier, [pb])
        bd.store(bd.extract_element(m_new, ir.Constant(I32, i)), at(m, i))
        e = vexp(bd, bd.fsub(scores(i), splat(bd, bd.extract_element(m_use, ir.Constant(I32, i)), B)))
        vstore(bd.select(masks[i], e, splat_c(F32T, 0.0, B)), pb, i * B)
    bd.call(barrier, [pb])
    corr = vexp(bd, dm)
    cs = [bd.extract_element(corr, ir.Constant(ir.IntType(32), i)) for i in range(Q)]
    for i in range(Q):
        vstore(fmuladd(bd, vload(l, i * B, vt), splat(bd, cs[i], B), vload(pb, i * B, vt)), l, i * B)

    # acc_i = acc_i * corr_i + sum_j e_i[j] v_{j0+j}
    rows = []
    for j in range(B):
        r = bd.add(j0, c64(j))
        r = bd.select(bd.icmp_signed(">", r, vhi), vhi, r)
        r = bd.select(bd.icmp_signed("<", r, vlo), vlo, r)
        rows.append(at(vb, bd.mul(r, vstride)))
    # The weights are broadcast from pb by each FMA's memory operand. Without the barriers (pb might
    # change there), LLVM forwards them from the registers they were stored from, broadcasts all
    # Q * B of them up front and spills the broadcasts to the stack (a full-vector store and load).
    bd.call(barrier, [pb])
    G = _pv_columns(hd, Q, L)
    for c in range(0, hd, W * G):
        cols = [c + g * W for g in range(G)]
        a = [[bd.fmul(vload(acc, cc + i * hd, wt), splat(bd, cs[i], W)) for cc in cols] for i in range(Q)]
        for j in range(B):
            v = [kvload(rows[j], cc, W) for cc in cols]
            if ahead:
                fetch(at(vb, bd.mul(bd.add(ja, c64(j)), vstride)), cols[0], len(cols) * W)
            for i in range(Q):
                p = splat(bd, bd.load(at(pb, i * B + j)), W)
                for g in range(G):
                    a[i][g] = fmuladd(bd, p, v[g], a[i][g])
        for i in range(Q):
            for g, cc in enumerate(cols):
                vstore(a[i][g], acc, cc + i * hd)
        bd.call(barrier, [pb])
    bd.ret_void()
    return fn


def attention(mod, name, hd, task_args, L, E=F32T):
    """attention(task, q, k, v, out, pos0, window, nh, nkv, T, splits, part), as described above, for
    vectors of L lanes over a cache of E (float or half) values."""
    chunks = CHUNKS[L]
    chunk = {Q: _chunk(mod, f"{name}_q{Q}", hd, Q, L, E) for Q in chunks}
    chunk_ahead = {Q: _chunk(mod, f"{name}_q{Q}_ahead", hd, Q, L, E, True) for Q in chunks}
    B, W, SM = KEY_BLOCK, _width(hd), _slots(hd)
    fn, bd = func(mod, name, task_args)
    task, q_, k_, v_, out_, pos0, window, nh, nkv, T, splits_arg, part_ = fn.args[:12]
    splits = bd.and_(splits_arg, c64(SINKS - 1))
    has_sinks = bd.icmp_unsigned("!=", bd.and_(splits_arg, c64(SINKS)), c64(0))
    q, out, part = (ptr_to(bd, a, F32T) for a in (q_, out_, part_))
    kc, vc = ptr_to(bd, k_, E), ptr_to(bd, v_, E)
    with bd.goto_entry_block():
        qoff, lo, hi = (bd.alloca(I64, size=c64(SM)) for _ in range(3))
        m = bd.alloca(F32T, size=c64(SM))
        lsum = bd.alloca(F32T, size=c64(SM * B))
        acc = bd.alloca(F32T, size=c64(SM * hd))
        pb = bd.alloca(F32T, size=c64(max(chunks) * B))
    wt = vec(F32T, W)

    def imin(a, b):
        return bd.select(bd.icmp_signed("<", a, b), a, b)

    def imax(a, b):
        return bd.select(bd.icmp_signed(">", a, b), a, b)

    # split-major: a decode step's tasks in order cover its kv heads' keys of one run, then the next
    # run's, so a thread's region of tasks reads one stretch of the cache (the heads' K blocks and V
    # rows lie interleaved there), not every other block of it; a task of several kv heads reads their
    # share of each block whole, in order
    hpt = imax(bd.lshr(splits_arg, c64(HEADS_AT)), c64(1))
    head_groups = bd.udiv(nkv, hpt)
    head_tasks = bd.mul(bd.udiv(bd.add(T, c64(ATT_TOKENS - 1)), c64(ATT_TOKENS)), head_groups)
    split, head_task = bd.udiv(task, head_tasks), bd.urem(task, head_tasks)
    tb, kvh = bd.udiv(head_task, head_groups), bd.mul(bd.urem(head_task, head_groups), hpt)
    group = bd.udiv(nh, nkv)
    t0 = bd.mul(tb, c64(ATT_TOKENS))
    per = bd.mul(bd.sub(imin(bd.add(t0, c64(ATT_TOKENS)), T), t0), group)  # slots of one kv head
    nslots = bd.mul(per, hpt)
    vstride = bd.mul(nkv, c64(hd))
    kstride = bd.mul(vstride, c64(B))  # floats per K block (all kv heads)
    with Loop(bd, 0, nslots, SM) as s0:
        n = imin(c64(SM), bd.sub(nslots, s0))
        kfirst, plast = Var(bd, c64(2 ** 62)), Var(bd, c64(-1))  # the window's earliest key and latest query
        with Loop(bd, 0, n) as i:
            s = bd.add(s0, i)
            hh, r = bd.udiv(s, per), bd.urem(s, per)  # slots: head-major, then token-major
            t = bd.add(t0, bd.udiv(r, group))
            h = bd.add(bd.mul(bd.add(kvh, hh), group), bd.urem(r, group))
            bd.store(bd.mul(bd.add(bd.mul(t, nh), h), c64(hd)), bd.gep(qoff, [i]))
            p = bd.add(pos0, t)
            from_window = bd.sub(bd.add(p, c64(1)), window)
            start = bd.select(bd.icmp_signed(">", window, c64(0)),
                              bd.select(bd.icmp_signed(">", from_window, c64(0)), from_window, c64(0)), c64(0))
            bd.store(start, bd.gep(lo, [i]))
            bd.store(p, bd.gep(hi, [i]))
            kfirst.set(imin(kfirst.get(), start))
            plast.set(bd.select(bd.icmp_signed(">", p, plast.get()), p, plast.get()))
            bd.store(ir.Constant(F32T, -math.inf), bd.gep(m, [i]))
            bd.store(splat_c(F32T, 0.0, B), bd.bitcast(bd.gep(lsum, [bd.mul(i, c64(B))]), vec(F32T, B).as_pointer()),
                     align=4)
            with Loop(bd, 0, hd, W) as c:
                bd.store(splat_c(F32T, 0.0, W), bd.bitcast(bd.gep(acc, [bd.add(bd.mul(i, c64(hd)), c)]),
                                                            wt.as_pointer()), align=4)
        kfirst, plast = kfirst.get(), plast.get()
        b_first, b_end = bd.udiv(kfirst, c64(B)), bd.add(bd.udiv(plast, c64(B)), c64(1))
        per_run = bd.udiv(bd.add(bd.sub(b_end, b_first), bd.sub(splits, c64(1))), splits)  # blocks a run
        b_lo = imin(bd.add(b_first, bd.mul(split, per_run)), b_end)
        b_stop = imin(bd.add(b_lo, per_run), b_end)
        with Loop(bd, b_lo, b_stop) as b:
            j0 = bd.mul(b, c64(B))
            # the next block's lines are fetched while this one computes: left to the hardware, a
            # decode step's reads and arithmetic took turns (21 -> 30 GB/s of cache at depth 8192)
            nxt = imin(bd.add(b, c64(1)), bd.sub(b_stop, c64(1)))
            ja = bd.mul(nxt, c64(B))
            with Loop(bd, 0, hpt) as hh:  # the window's slots of each kv head: a chunk is of one head
                first_slot = imax(bd.sub(bd.mul(hh, per), s0), c64(0))
                end_slot = imin(bd.sub(bd.mul(bd.add(hh, c64(1)), per), s0), n)
                with bd.if_then(bd.icmp_signed("<", first_slot, end_slot)):
                    head = bd.add(kvh, hh)
                    kbase = bd.gep(kc, [bd.mul(head, c64(hd * B))])
                    kb, ka = bd.gep(kbase, [bd.mul(b, kstride)]), bd.gep(kbase, [bd.mul(nxt, kstride)])
                    vb = bd.gep(vc, [bd.mul(head, c64(hd))])

                    def run(Q, cur):
                        first = bd.load(bd.gep(lo, [cur]))
                        last = bd.load(bd.gep(hi, [bd.add(cur, c64(Q - 1))]))
                        seen = bd.and_(bd.icmp_signed("<=", j0, last),
                                       bd.icmp_signed(">=", bd.add(j0, c64(B - 1)), first))
                        args = [kb, vb, vstride, j0, kfirst, plast, q, bd.gep(qoff, [cur]), bd.gep(lo, [cur]),
                                bd.gep(hi, [cur]), bd.gep(m, [cur]), bd.gep(lsum, [bd.mul(cur, c64(B))]),
                                bd.gep(acc, [bd.mul(cur, c64(hd))]), pb, ka, ja]
                        with bd.if_then(seen):
                            with bd.if_else(bd.icmp_signed("==", cur, first_slot)) as (lead, rest):
                                with lead:
                                    bd.call(chunk_ahead[Q], args)
                                with rest:
                                    bd.call(chunk[Q], args)

                    top = max(chunks)
                    n_full = bd.add(first_slot, bd.mul(bd.udiv(bd.sub(end_slot, first_slot), c64(top)), c64(top)))
                    with Loop(bd, first_slot, n_full, top) as cur:
                        run(top, cur)
                    cur = n_full
                    for Q in chunks[1:]:  # the rest (< top), greedily
                        has = bd.icmp_signed(">=", bd.sub(end_slot, cur), c64(Q))
                        with bd.if_then(has):
                            run(Q, cur)
                        cur = bd.add(cur, bd.select(has, c64(Q), c64(0)))
        whole = bd.icmp_signed("==", splits, c64(1))
        with Loop(bd, 0, n) as i:
            ls = bd.load(bd.bitcast(bd.gep(lsum, [bd.mul(i, c64(B))]), vec(F32T, B).as_pointer()), align=4)
            total = hsum(bd, ls)
            row = bd.udiv(bd.load(bd.gep(qoff, [i])), c64(hd))  # the slot's (token, head) row
            # one run: the normalised output; several: this run's share, normalised by the combine kernel
            one = bd.fdiv(ir.Constant(F32T, 1.0), total)
            sunk = _with_sink(bd, bd.load(bd.gep(m, [i])), total, bd.gep(part, [bd.urem(row, nh)]), has_sinks)
            inv = splat(bd, bd.select(whole, bd.select(has_sinks, sunk, one), ir.Constant(F32T, 1.0)), W)
            prow = bd.gep(part, [bd.mul(bd.add(bd.mul(split, bd.mul(T, nh)), row), c64(part_stride(hd)))])
            orow = bd.select(whole, bd.gep(out, [bd.mul(row, c64(hd))]), prow)
            with Loop(bd, 0, hd, W) as c:
                a = bd.load(bd.bitcast(bd.gep(acc, [bd.add(bd.mul(i, c64(hd)), c)]), wt.as_pointer()), align=4)
                bd.store(bd.fmul(a, inv), bd.bitcast(bd.gep(orow, [c]), wt.as_pointer()), align=4)
            with bd.if_then(bd.not_(whole)):
                bd.store(bd.load(bd.gep(m, [i])), bd.gep(prow, [c64(hd)]))
                bd.store(total, bd.gep(prow, [c64(hd + 1)]))
    bd.ret_void()


def _with_sink(bd, m, total, sink_at, has_sinks):
    """1 / the denominator of a query whose keys' weights e^(s - m) sum to `total`, with the head's sink
    logit (at sink_at, read when has_sinks) joining it, relative to max(m, sink) so that neither exp
    overflows: exp(m - M) / (total exp(m - M) + exp(sink - M))."""
    sink = Var(bd, ir.Constant(F32T, -math.inf))
    with bd.if_then(has_sinks):
        sink.set(bd.load(sink_at))
    top = fmax(bd, m, sink.get())
    e = vexp(bd, bd.insert_element(bd.insert_element(ir.Constant(vec(F32T, 2), None), bd.fsub(m, top),
                                                     ir.Constant(I32, 0)), bd.fsub(sink.get(), top),
                                   ir.Constant(I32, 1)))
    scale, sink_w = (bd.extract_element(e, ir.Constant(I32, j)) for j in range(2))
    return bd.fdiv(scale, fmuladd(bd, total, scale, sink_w))


def combine(mod, name, hd, task_args):
    """combine(task, part, out, splits, rows, sinks, n_heads): row `task` of out (rows = T * n_heads
    rows of hd, the attention's output) from its runs' rows in part: each run's share scaled by
    exp(its max - the largest), over their scaled sums. A run that saw no key (max -inf, sum 0) adds
    0; a NaN in any run reaches out (0 * NaN). sinks != 0: the address of the heads' sink logits
    (f32 [n_heads]); the row's head's joins the largest and the sum."""
    W = _width(hd)
    fn, bd = func(mod, name, task_args)
    r, part_, out_, splits, rows, sinks_, nh = fn.args[:7]
    part, out = ptr_to(bd, part_, F32T), ptr_to(bd, out_, F32T)
    wt = vec(F32T, W)
    orow = bd.gep(out, [bd.mul(r, c64(hd))])

    def prow(s):
        return bd.gep(part, [bd.mul(bd.add(bd.mul(s, rows), r), c64(part_stride(hd)))])

    mx = Var(bd, ir.Constant(F32T, -math.inf))
    with Loop(bd, 0, splits) as s:
        mx.set(call_intrinsic(bd, "llvm.maxnum.f32", F32T, [mx.get(), bd.load(bd.gep(prow(s), [c64(hd)]))]))
    den = Var(bd, ir.Constant(F32T, 0.0))
    with bd.if_then(bd.icmp_signed("!=", sinks_, c64(0))):
        sink = bd.load(bd.gep(ptr_to(bd, sinks_, F32T), [bd.urem(r, nh)]))
        mx.set(call_intrinsic(bd, "llvm.maxnum.f32", F32T, [mx.get(), sink]))
        den.set(bd.extract_element(vexp(bd, splat(bd, bd.fsub(sink, mx.get()), W)), ir.Constant(ir.IntType(32), 0)))
    accs = [Var(bd, splat_c(F32T, 0.0, W)) for _ in range(hd // W)]
    with Loop(bd, 0, splits) as s:
        p = prow(s)
        ms = bd.load(bd.gep(p, [c64(hd)]))
        e = bd.extract_element(vexp(bd, splat(bd, bd.fsub(ms, mx.get()), W)), ir.Constant(ir.IntType(32), 0))
        w = bd.select(bd.fcmp_ordered("==", ms, ir.Constant(F32T, -math.inf)), ir.Constant(F32T, 0.0), e)
        den.set(fmuladd(bd, w, bd.load(bd.gep(p, [c64(hd + 1)])), den.get()))
        for j, a in enumerate(accs):
            v = bd.load(bd.bitcast(bd.gep(p, [c64(j * W)]), wt.as_pointer()), align=4)
            a.set(fmuladd(bd, splat(bd, w, W), v, a.get()))
    inv = splat(bd, bd.fdiv(ir.Constant(F32T, 1.0), den.get()), W)
    for j, a in enumerate(accs):
        bd.store(bd.fmul(a.get(), inv), bd.bitcast(bd.gep(orow, [c64(j * W)]), wt.as_pointer()), align=4)
    bd.ret_void()


def _f32(x: float) -> float:
    import numpy as np

    return float(np.float32(x))
