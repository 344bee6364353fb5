"""The CPU attention kernel (backends/cpu/attention.py) and the K/V store against a float64 numpy
attention: causal, sliding windows, GQA, prefill chunks and decode steps at several depths, stale
cache rows past the prefix (a rewind), NaN propagation; for every ISA the host runs.

Tolerance: the kernel is f32 throughout (scores, an exp within 2 ulp, sums over up to ~300 keys);
measured max |error| 3.5e-6 (every ISA, head size and case) on these unit-variance inputs, outputs of magnitude ~1. TOL = 2e-5 leaves
margin while an off-by-one window or a wrong GQA head (the negative controls) errs by > 1e-2.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fuelcli.backends.cpu import core
from fuelcli.backends.cpu.attention import HEADS_AT, KEY_BLOCK, part_stride
from fuelcli.backends.cpu.llvm import ISAS, supported
from fuelcli.backends.cpu.matmul import C_ATTENTION, C_COMBINE, C_KV_STORE
from fuelcli.backends.kv_cache import CACHE_TYPES, KVCache

TOL = 2e-5
FN = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * core.TASK_ARGS)
ISA_NAMES = [n for n in ISAS if supported(n)]


def _kernels(isa, hd, cache_type="f32"):
    addr = core.addresses(ISAS[isa], hd, cache_type)
    return FN(addr[C_KV_STORE]), FN(addr[C_ATTENTION])


def _combine(isa, hd):
    return FN(core.addresses(ISAS[isa], hd)[C_COMBINE])


def _p(a):
    return a.ctypes.data


def _call(fn, *args):
    fn(*(list(args) + [0] * (core.TASK_ARGS - len(args))))


def reference(q, k, v, pos0, window, group, kv_map=None):
    """float64: q [T, nh, hd], k/v [n_pos, nkv, hd] -> [T, nh, hd]."""
    T, nh, hd = q.shape
    out = np.empty((T, nh, hd))
    for t in range(T):
        p = pos0 + t
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(nh):
            kh = kv_map(h) if kv_map else h // group
            s = k[lo:p + 1, kh].astype(np.float64) @ q[t, h].astype(np.float64) / np.sqrt(hd)
            w = np.exp(s - s.max())
            out[t, h] = w @ v[lo:p + 1, kh].astype(np.float64) / w.sum()
    return out


def run(isa, q, k, v, pos0, window, nkv, stale=0, splits=1, cache_type="f32", heads=1):
    """Store k/v (positions 0..) into a fresh cache of cache_type values through kv_store, `stale`
    more rows of NaN after them (what a rewind leaves), then attention for q at pos0, its keys cut
    into `splits` runs (combined by the combine kernel), a task taking `heads` kv heads."""
    store, attend = _kernels(isa, q.shape[2], cache_type)
    T, nh, hd = q.shape
    n = k.shape[0]
    cache = KVCache(1, n + stale + 3, nkv, hd, key_block=KEY_BLOCK, cache_type=cache_type)
    kc, vc = cache.k[0], cache.v[0]
    rows_k = np.concatenate([k, np.full((stale, nkv, hd), np.nan, np.float32)]).reshape(n + stale, -1)
    rows_v = np.concatenate([v, np.full((stale, nkv, hd), np.nan, np.float32)]).reshape(n + stale, -1)
    rows_k, rows_v = np.ascontiguousarray(rows_k), np.ascontiguousarray(rows_v)
    for t in range(n + stale):
        _call(store, t, _p(rows_k), _p(rows_v), _p(kc), _p(vc), 0, nkv * hd)
    stored = CACHE_TYPES[cache_type]  # numpy rounds to f16 as the kernel does: to nearest, ties to even
    assert np.array_equal(cache.values(vc[:n]), v.astype(stored), equal_nan=True)
    assert np.array_equal(cache.values(kc).transpose(0, 3, 1, 2).reshape(-1, nkv, hd)[:n], k.astype(stored),
                          equal_nan=True)  # the blocked layout
    out = np.full((T, nh, hd), -7.0, np.float32)
    part = np.full(splits * T * nh * part_stride(hd), np.nan, np.float32)
    qc = np.ascontiguousarray(q)
    for task in range(-(-T // 16) * nkv // heads * splits):
        _call(attend, task, _p(qc), _p(kc), _p(vc), _p(out), pos0, window, nh, nkv, T,
              splits | (heads if heads > 1 else 0) << HEADS_AT, _p(part))
    if splits > 1:
        assert (out == -7.0).all()  # the runs write their shares into part only
        comb = _combine(isa, hd)
        for r in range(T * nh):
            _call(comb, r, _p(part), _p(out), splits, T * nh)
    return out


def _inputs(rng, T, pos0, nh, nkv, hd):
    n = pos0 + T
    return (rng.standard_normal((T, nh, hd)).astype(np.float32) * 2,
            rng.standard_normal((n, nkv, hd)).astype(np.float32),
            rng.standard_normal((n, nkv, hd)).astype(np.float32))


CASES = [  # (T, pos0, nh, nkv, window): prefill chunks at depth, decode steps, windows, GQA groups
    (1, 0, 4, 4, 0), (40, 0, 14, 2, 0), (16, 100, 9, 3, 0), (23, 37, 8, 1, 0), (1, 200, 14, 2, 0),
    (1, 77, 9, 3, 0), (33, 5, 4, 2, 7), (1, 150, 4, 2, 37), (20, 64, 16, 2, 16), (3, 30, 2, 2, 1),
]


@pytest.mark.parametrize("isa", ISA_NAMES)
@pytest.mark.parametrize("hd", [64, 128, 16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-pos{}-h{}-kv{}-w{}".format(*c))
def test_attention_matches_float64(isa, hd, case):
    T, pos0, nh, nkv, window = case
    rng = np.random.default_rng(hash(case) % 2**32 + hd)
    q, k, v = _inputs(rng, T, pos0, nh, nkv, hd)
    got = run(isa, q, k, v, pos0, window, nkv, stale=5)
    want = reference(q, k, v, pos0, window, nh // nkv)
    assert np.abs(got - want).max() < TOL
    # negative controls: the comparison sees a window off by one and a wrong GQA mapping
    if window > 1 or pos0 + T > window > 0:
        assert np.abs(got - reference(q, k, v, pos0, window + 1, nh // nkv)).max() > 100 * TOL
    if nkv > 1 and nh > nkv:
        assert np.abs(got - reference(q, k, v, pos0, window, nh // nkv, kv_map=lambda h: h % nkv)).max() > 100 * TOL


@pytest.mark.parametrize("isa", ISA_NAMES)
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-pos{}-h{}-kv{}-w{}".format(*c))
def test_f16_cache_matches_float64_over_its_rounded_values(isa, hd, case):
    """An f16 cache (--cache-type f16): the kernel attends over K and V rounded once to f16, within
    TOL of float64 over those rounded values; the float64 of the unrounded ones differs by ~1e-3
    (the negative control: 10 TOL apart at least, so the comparison sees that the cache rounds)."""
    T, pos0, nh, nkv, window = case
    rng = np.random.default_rng(hash(case) % 2**32 + hd)
    q, k, v = _inputs(rng, T, pos0, nh, nkv, hd)
    got = run(isa, q, k, v, pos0, window, nkv, stale=5, cache_type="f16")
    r16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    want = reference(q, r16(k), r16(v), pos0, window, nh // nkv)
    assert np.abs(got - want).max() < TOL
    assert np.abs(got - reference(q, k, v, pos0, window, nh // nkv)).max() > 10 * TOL
    if T == 1:  # a decode step in key runs
        assert np.abs(run(isa, q, k, v, pos0, window, nkv, splits=3, cache_type="f16") - want).max() < TOL


@pytest.mark.parametrize("hd", [64, 128])
def test_nan_in_q_k_v_reaches_the_queries_that_see_it(hd):
    isa = ISA_NAMES[0]
    T, pos0, nh, nkv = 24, 30, 6, 2
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, T, pos0, nh, nkv, hd)
    q[3, 4, 5] = np.nan  # token 3, head 4
    k[40, 1, 0] = np.nan  # kv head 1 (heads 3..5), position 40: tokens at p >= 40 see it
    v[45, 0, 9] = np.nan  # kv head 0 (heads 0..2), position 45
    got = run(isa, q, k, v, pos0, 0, nkv)
    p = pos0 + np.arange(T)
    assert np.isnan(got[3, 4]).all()
    assert np.isnan(got[p >= 40][:, 3:]).all()
    assert np.isnan(got[p >= 45][:, :3, 9]).all()
    # K NaN is masked exactly: queries before position 40 stay finite on kv head 1 (but token 3's q)
    early = got[(p < 40)][:, 3:]
    assert np.isfinite(np.delete(early, 3, axis=0)).all() and np.isfinite(early[3, [0, 2]]).all()
    clean = reference(np.nan_to_num(q), np.nan_to_num(k), np.nan_to_num(v), pos0, 0, nh // nkv)
    ok = np.isfinite(got)
    assert np.abs(got[ok] - clean[ok]).max() < TOL


SPLIT_CASES = [  # (pos0, nh, nkv, window, splits): one decode step's keys in runs; more runs than
    # key blocks (empty runs), windows that leave early runs with no visible key
    (200, 14, 2, 0, 2), (200, 9, 3, 0, 5), (77, 4, 4, 0, 16), (150, 4, 2, 37, 3), (300, 8, 1, 64, 7),
    (15, 2, 2, 0, 4),
]


@pytest.mark.parametrize("isa", ISA_NAMES)
@pytest.mark.parametrize("hd", [64, 16])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "pos{}-h{}-kv{}-w{}-s{}".format(*c))
def test_decode_in_key_runs_matches_float64(isa, hd, case):
    pos0, nh, nkv, window, splits = case
    rng = np.random.default_rng(hash(case) % 2**32 + hd)
    q, k, v = _inputs(rng, 1, pos0, nh, nkv, hd)
    q *= 2  # peakier weights: runs whose maxima differ by more than exp can ignore
    want = reference(q, k, v, pos0, window, nh // nkv)
    got = run(isa, q, k, v, pos0, window, nkv, stale=3, splits=splits)
    assert np.abs(got - want).max() < TOL
    assert np.abs(got - run(isa, q, k, v, pos0, window, nkv, stale=3)).max() < TOL  # one run alike
    # negative control: the runs' shares summed without their max rescaling are not the answer
    if splits <= pos0 // KEY_BLOCK + 1 and (window == 0 or window > 2 * KEY_BLOCK):
        assert np.abs(_unscaled_mean(isa, q, k, v, pos0, window, nkv, splits) - want).max() > 100 * TOL


HEADS_CASES = [  # (T, pos0, nh, nkv, window, splits, heads): decode steps in key runs as matmul.attention
    # asks them, every kv head or some a task, and prefill chunks whose slots, several kv heads', fill
    # more than one window of the task's state
    (1, 200, 14, 2, 0, 2, 2), (1, 200, 9, 3, 0, 5, 3), (1, 150, 4, 2, 37, 3, 2), (1, 300, 16, 8, 64, 1, 4),
    (1, 77, 8, 4, 0, 3, 2), (40, 30, 14, 2, 0, 1, 2), (20, 64, 48, 4, 16, 1, 4),
]


@pytest.mark.parametrize("isa", ISA_NAMES)
@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", HEADS_CASES, ids=lambda c: "T{}-pos{}-h{}-kv{}-w{}-s{}-x{}".format(*c))
def test_a_task_of_several_kv_heads_gives_the_per_head_tasks_bits(isa, cache_type, case):
    """HEADS_AT: the same chunks over the same blocks in the same order as one task a kv head, so the
    same outputs bit for bit (a decode step's logits do not depend on how many threads share it)."""
    T, pos0, nh, nkv, window, splits, heads = case
    hd = 64
    rng = np.random.default_rng(hash(case) % 2**32)
    q, k, v = _inputs(rng, T, pos0, nh, nkv, hd)
    per_head = run(isa, q, k, v, pos0, window, nkv, stale=3, splits=splits, cache_type=cache_type)
    got = run(isa, q, k, v, pos0, window, nkv, stale=3, splits=splits, cache_type=cache_type, heads=heads)
    assert np.array_equal(got, per_head)
    stored = CACHE_TYPES[cache_type]
    want = reference(q, k.astype(stored), v.astype(stored), pos0, window, nh // nkv)
    assert np.abs(got - want).max() < TOL
    # negative control: bit equality sees the same sums taken in another order (the keys in other runs)
    other = run(isa, q, k, v, pos0, window, nkv, stale=3, splits=1 if splits > 1 else 2, cache_type=cache_type,
                heads=heads)
    assert np.abs(other - want).max() < TOL and not np.array_equal(got, other)


def _unscaled_mean(isa, q, k, v, pos0, window, nkv, splits):
    """What a combine that forgot the runs' maxima would give: their outputs summed over their sums
    (runs that saw no key left out)."""
    store, attend = _kernels(isa, q.shape[2])
    _, nh, hd = q.shape
    n = k.shape[0]
    part = np.full(splits * nh * part_stride(hd), np.nan, np.float32)
    cache = KVCache(1, n + 3, nkv, hd, key_block=KEY_BLOCK)
    kc, vc = cache.k[0], cache.v[0]
    rows_k, rows_v = np.ascontiguousarray(k.reshape(n, -1)), np.ascontiguousarray(v.reshape(n, -1))
    for t in range(n):
        _call(store, t, _p(rows_k), _p(rows_v), _p(kc), _p(vc), 0, nkv * hd)
    qc = np.ascontiguousarray(q)
    for task in range(nkv * splits):
        _call(attend, task, _p(qc), _p(kc), _p(vc), 0, pos0, window, nh, nkv, 1, splits, _p(part))
    rows = part.reshape(splits, nh, part_stride(hd))
    rows = rows[np.isfinite(rows[:, 0, hd])]
    return (rows[:, :, :hd].sum(0) / rows[:, :, hd + 1].sum(0)[:, None])[None]


@pytest.mark.parametrize("splits", [2, 5])
def test_nan_in_one_run_reaches_the_output(splits):
    """A NaN in a V row of one run reaches the heads that see it, whatever the other runs' maxima;
    the other kv head's heads stay finite."""
    isa, hd, pos0, nh, nkv = ISA_NAMES[0], 64, 180, 6, 2
    rng = np.random.default_rng(splits)
    q, k, v = _inputs(rng, 1, pos0, nh, nkv, hd)
    v[3, 1, 7] = np.nan  # kv head 1 (heads 3..5), an early position: the first run
    got = run(isa, q, k, v, pos0, 0, nkv, splits=splits)
    assert np.isnan(got[0, 3:, 7]).all()
    assert np.isfinite(got[0, :3]).all()


def _with_sinks(isa, q, k, v, pos0, window, nkv, sinks, splits=1):
    """run()'s attention with each head's sink logit: in the attention kernel's denominator with one
    key run (SINKS in `splits`, the sinks where `part` goes), in the combine kernel's with several."""
    from fuelcli.backends.cpu.attention import SINKS

    store, attend = _kernels(isa, q.shape[2])
    T, nh, hd = q.shape
    n = k.shape[0]
    cache = KVCache(1, n + 3, nkv, hd, key_block=KEY_BLOCK)
    kc, vc = cache.k[0], cache.v[0]
    rows_k, rows_v = np.ascontiguousarray(k.reshape(n, -1)), np.ascontiguousarray(v.reshape(n, -1))
    for t in range(n):
        _call(store, t, _p(rows_k), _p(rows_v), _p(kc), _p(vc), 0, nkv * hd)
    out = np.full((T, nh, hd), -7.0, np.float32)
    part = np.full(splits * T * nh * part_stride(hd), np.nan, np.float32)
    qc = np.ascontiguousarray(q)
    for task in range(-(-T // 16) * nkv * splits):
        _call(attend, task, _p(qc), _p(kc), _p(vc), _p(out), pos0, window, nh, nkv, T,
              splits | SINKS if splits == 1 else splits, _p(sinks) if splits == 1 else _p(part))
    if splits > 1:
        comb = _combine(isa, hd)
        for r in range(T * nh):
            _call(comb, r, _p(part), _p(out), splits, T * nh, _p(sinks), nh)
    return out


def reference_with_sinks(q, k, v, pos0, window, group, sinks):
    """float64 as reference(), each head's sink logit joining its softmax's denominator (gpt-oss)."""
    T, nh, hd = q.shape
    out = np.empty((T, nh, hd))
    for t in range(T):
        p = pos0 + t
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(nh):
            s = k[lo:p + 1, h // group].astype(np.float64) @ q[t, h].astype(np.float64) / np.sqrt(hd)
            top = max(s.max(), float(sinks[h]))
            w = np.exp(s - top)
            out[t, h] = w @ v[lo:p + 1, h // group].astype(np.float64) / (w.sum() + np.exp(sinks[h] - top))
    return out


SINK_CASES = [  # (T, pos0, nh, nkv, window, splits): prefill chunks, decode steps, windows, key runs
    (40, 0, 4, 2, 8, 1), (23, 37, 8, 1, 0, 1), (1, 200, 4, 2, 0, 1), (1, 200, 4, 2, 0, 3), (1, 150, 8, 2, 37, 2),
    (16, 300, 4, 4, 128, 1),
]


@pytest.mark.parametrize("isa", ISA_NAMES)
@pytest.mark.parametrize("hd", [64, 16])
@pytest.mark.parametrize("case", SINK_CASES, ids=lambda c: "T{}-pos{}-h{}-kv{}-w{}-s{}".format(*c))
def test_sinks_match_float64(isa, hd, case):
    """Attention sinks (gpt-oss), with sink logits around the scores and well above them (a head
    whose weights all but vanish: max(scores, sink) keeps the exps finite). Negative control: the
    sinks left out of the denominator miss by > 100 TOL."""
    T, pos0, nh, nkv, window, splits = case
    rng = np.random.default_rng(hash(case) % 2**32 + hd)
    q, k, v = _inputs(rng, T, pos0, nh, nkv, hd)
    sinks = rng.standard_normal(nh).astype(np.float32) * 2
    sinks[0] = 60.0
    want = reference_with_sinks(q, k, v, pos0, window, nh // nkv, sinks)
    got = _with_sinks(isa, q, k, v, pos0, window, nkv, sinks, splits)
    assert np.abs(got - want).max() < TOL
    assert np.abs(got - reference(q, k, v, pos0, window, nh // nkv)).max() > 100 * TOL


def _fmax_tree(v, swap=False):
    """One row's fmax tree in numpy: halves, fmax(a, b) = b if a < b else a (swap: a if b < a else b)."""
    v = np.asarray(v, np.float32)
    while v.size > 1:
        a, b = v[: v.size // 2], v[v.size // 2:]
        v = np.where(b < a, a, b) if swap else np.where(a < b, b, a)
    return v[0]


@pytest.mark.parametrize("isa", ISA_NAMES)
def test_hmax_rows_is_each_rows_tree(isa):
    """irgen.hmax_rows (the attention's running maxima of a chunk's queries at once) gives each row's
    own fmax tree bit for bit, for 1 to 8 rows at once (and each row alone) of 16 lanes holding NaN,
    ±0, -inf and ties, where the order of the tree decides the result. Negative control: the tree
    with its operands swapped differs on these rows, so a different tree would be seen."""
    from llvmlite import ir

    from fuelcli.backends.cpu.irgen import F32T, c64, func, hmax_rows, ptr_to, vec

    R, B = 8, KEY_BLOCK
    mod = ir.Module(name=f"hmax_rows_{isa}")
    fn, bd = func(mod, f"hmax_rows_{isa}", 3)
    src, rows_out, one_out = (ptr_to(bd, a, F32T) for a in fn.args[:3])
    vt = vec(F32T, B)
    for k in range(1, R + 1):
        vs = [bd.load(bd.bitcast(bd.gep(src, [c64((k * R + i) * B)]), vt.as_pointer()), align=4) for i in range(k)]
        got = hmax_rows(bd, vs)
        for i in range(k):
            bd.store(bd.extract_element(got, ir.Constant(ir.IntType(32), i)), bd.gep(rows_out, [c64(k * R + i)]))
            bd.store(bd.extract_element(hmax_rows(bd, [vs[i]]), ir.Constant(ir.IntType(32), 0)),
                     bd.gep(one_out, [c64(k * R + i)]))
    bd.ret_void()
    from fuelcli.backends.cpu.llvm import compile_module

    (addr,) = compile_module(f"test-hmax-rows-{isa}", lambda: (mod, [f"hmax_rows_{isa}"]), ISAS[isa]).values()
    rng = np.random.default_rng(5)
    pool = np.array([np.nan, 0.0, -0.0, -np.inf, 1.5, -2.0, 1.5], np.float32)
    x = rng.choice(pool, size=((R + 1) * R, B)).astype(np.float32)
    x[::3] = rng.standard_normal((len(x[::3]), B)).astype(np.float32)
    rows_got, one_got = np.full((R + 1) * R, 7.0, np.float32), np.full((R + 1) * R, 7.0, np.float32)
    ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3)(addr)(_p(x), _p(rows_got), _p(one_got))
    used = [k * R + i for k in range(1, R + 1) for i in range(k)]
    want = np.array([_fmax_tree(x[r]) for r in used], np.float32)
    assert np.array_equal(rows_got[used].view(np.uint32), want.view(np.uint32))
    assert np.array_equal(one_got[used].view(np.uint32), want.view(np.uint32))
    swapped = np.array([_fmax_tree(x[r], swap=True) for r in used], np.float32)
    assert not np.array_equal(swapped.view(np.uint32), want.view(np.uint32))
