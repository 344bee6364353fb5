"""The sampler chain is llama.cpp's: penalties -> top-k -> top-p -> min-p -> temperature.

The whole distribution fuel draws from is pinned on fixed logits for several flag combinations,
against (1) numbers worked out by hand, (2) a literal re-implementation of llama.cpp's samplers
(src/llama-sampler.cpp) written here on sorted Python lists, and (3) where llama-cpp-python is
installed, llama.cpp's own sampler code run on the same logits. The negative control is the same
reference with the temperature applied first (transformers' order): it gives a different
distribution whenever top-p or min-p cut and the temperature is not 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fuelcli.text.generate import Sampler, SamplerParams


def fuel_dist(logits, history=(), **kw):
    return Sampler(SamplerParams(**kw)).probs(np.asarray(logits, np.float64), list(history))


def reference(logits, history=(), temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
              repeat_last_n=64, min_keep=0, temperature_first=False):
    """llama.cpp's chain, step by step on a list of (id, logit) candidates."""
    cur = [(i, float(v)) for i, v in enumerate(logits)]
    recent = set(history if repeat_last_n < 0 else history[-repeat_last_n:] if repeat_last_n else ())
    cur = [(i, (v / repeat_penalty if v > 0 else v * repeat_penalty) if i in recent else v) for i, v in cur]
    if temperature_first:
        cur = [(i, v / temp) for i, v in cur]
    cur.sort(key=lambda t: (-t[1], t[0]))  # llama.cpp sorts by logit, descending
    if top_k > 0:
        cur = cur[:top_k]
    if top_p < 1.0:  # softmax over the candidates, then the first prefix whose sum reaches p
        e = [math.exp(v - cur[0][1]) for _, v in cur]
        total, cum, keep = sum(e), 0.0, len(cur)
        for j, x in enumerate(e):
            cum += x / total
            if cum >= top_p and j + 1 >= min_keep:
                keep = j + 1
                break
        cur = cur[:keep]
    if min_p > 0.0:  # logit >= max logit + log(min_p), at least min_keep
        threshold = cur[0][1] + math.log(min_p)
        cur = [c for j, c in enumerate(cur) if c[1] >= threshold or j < min_keep]
    if not temperature_first:
        cur = [(i, v / temp) for i, v in cur]
    e = {i: math.exp(v - cur[0][1]) for i, v in cur}
    total = sum(e.values())
    out = np.zeros(len(logits))
    for i, x in e.items():
        out[i] = x / total
    return out


LOGITS = np.random.default_rng(11).standard_normal(200) * 2.5
HISTORY = [3, 17, 17, 42, 100, 150, 199, 0, 5]

CASES = {
    "llama-cli defaults": dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "hot, top-p only": dict(temp=1.7, top_k=0, top_p=0.6, min_p=0.0),
    "cold, min-p only": dict(temp=0.4, top_k=0, top_p=1.0, min_p=0.02),
    "hot, min-p only": dict(temp=2.5, top_k=0, top_p=1.0, min_p=0.1),
    "everything + penalty": dict(temp=1.3, top_k=30, top_p=0.8, min_p=0.03, repeat_penalty=1.5, repeat_last_n=6),
    "min_keep": dict(temp=1.8, top_k=0, top_p=0.3, min_p=0.0, min_keep=4),  # top-p alone would keep 2
}
ORDER_FREE = {"top-k only": dict(temp=1.9, top_k=12, top_p=1.0, min_p=0.0)}  # no cut that sees probabilities


def test_hand_computed():
    # logits 2, 1, 0, -1 at t=1: 0.644, 0.237, 0.087, 0.032. top-p 0.75 keeps the first two
    # (0.644 < 0.75 <= 0.881); t=2 then reshapes them to softmax(1, 0.5).
    p = fuel_dist([2.0, 1.0, 0.0, -1.0], temp=2.0, top_k=0, top_p=0.75, min_p=0.0)
    a = 1 / (1 + math.exp(-0.5))
    np.testing.assert_allclose(p, [a, 1 - a, 0, 0], rtol=1e-12)
    # temperature first: t=2 flattens to 0.455, 0.276, 0.167, 0.102 and top-p 0.75 keeps three
    # (0.731 < 0.75)
    t_first = reference([2.0, 1.0, 0.0, -1.0], temp=2.0, top_k=0, top_p=0.75, min_p=0.0, temperature_first=True)
    e = np.exp([1.0, 0.5, 0.0])
    np.testing.assert_allclose(t_first, [*(e / e.sum()), 0], rtol=1e-12)
    # min-p 0.3 keeps logits >= 2 + ln 0.3 = 0.796: ids 0 and 1, at any temperature
    p = fuel_dist([2.0, 1.0, 0.0, -1.0], temp=5.0, top_k=0, top_p=1.0, min_p=0.3)
    b = 1 / (1 + math.exp(-0.2))
    np.testing.assert_allclose(p, [b, 1 - b, 0, 0], rtol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_chain_matches_llama_cpp_order_and_not_temperature_first(case):
    kw = CASES[case]
    got = fuel_dist(LOGITS, HISTORY, **kw)
    want = reference(LOGITS, HISTORY, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-15)
    assert 1 < np.count_nonzero(got) < LOGITS.size  # the case cuts something and leaves a choice
    # negative control: transformers' order keeps another set of tokens, or other probabilities
    other = reference(LOGITS, HISTORY, temperature_first=True, **kw)
    assert np.abs(other - got).max() > 1e-3


@pytest.mark.parametrize("case", ORDER_FREE)
def test_top_k_alone_does_not_depend_on_the_order(case):
    kw = ORDER_FREE[case]
    got = fuel_dist(LOGITS, **kw)
    np.testing.assert_allclose(got, reference(LOGITS, **kw), rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(got, reference(LOGITS, temperature_first=True, **kw), rtol=1e-10, atol=1e-15)


def _llama_cpp_dist(logits, history, temp, top_k, top_p, min_p, repeat_penalty=1.0, repeat_last_n=64, min_keep=0):
    """llama.cpp's samplers (llama-cpp-python's bindings) on a candidate array: the survivors'
    logits after the chain, softmaxed as its dist sampler does."""
    import ctypes

    import llama_cpp as L

    n = len(logits)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    try:
        for s in (L.llama_sampler_init_penalties(n, repeat_last_n, repeat_penalty, 0.0, 0.0),
                  L.llama_sampler_init_top_k(top_k), L.llama_sampler_init_top_p(top_p, min_keep),
                  L.llama_sampler_init_min_p(min_p, min_keep), L.llama_sampler_init_temp(temp)):
            L.llama_sampler_chain_add(chain, s)
        for t in history:
            L.llama_sampler_accept(chain, t)
        data = (L.llama_token_data * n)(*(L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)))
        cur = L.llama_token_data_array(data, n, -1, False)
        L.llama_sampler_apply(chain, ctypes.byref(cur))
        ids = np.array([data[i].id for i in range(cur.size)])
        v = np.array([data[i].logit for i in range(cur.size)], np.float64)
    finally:
        L.llama_sampler_free(chain)
    out = np.zeros(n)
    out[ids] = np.exp(v - v.max()) / np.exp(v - v.max()).sum()
    return out


@pytest.mark.parametrize("case", {**CASES, **ORDER_FREE})
def test_chain_matches_llama_cpp_itself(case):
    """llama.cpp computes in float32: the same survivors, probabilities within 1e-6."""
    pytest.importorskip("llama_cpp")
    kw = {**CASES, **ORDER_FREE}[case]
    got = fuel_dist(LOGITS, HISTORY, **kw)
    theirs = _llama_cpp_dist(LOGITS.astype(np.float32), HISTORY, **kw)
    assert set(np.flatnonzero(got)) == set(np.flatnonzero(theirs))
    np.testing.assert_allclose(got, theirs, atol=1e-6)
