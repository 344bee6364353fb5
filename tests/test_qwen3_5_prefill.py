"""The CPU engine's chunked delta rule (backends/cpu/delta_chunked.py: a prompt segment of CHUNK rows
or more) against its recurrence (linear_mixer.delta_rule: decode steps, short segments), and a
prompt whose state crosses from one form to the other: split into segments, prefilled over engine
batches, rewound to a checkpoint a chunked prefill took.

test_qwen3_5's 80-token prefill runs the chunked form (64 rows, then 16) against transformers.
Measured on an AMD EPYC Zen 4 (family 25 model 17), max|Δ| against transformers f32: the 80-token
prefill 5.9e-5 / 1.2e-3 / 1.8e-4 (qwen3_5 / qwen3_5_moe / qwen3_next), split 11 + 69 8.6e-5 /
1.3e-3 / 2.3e-4 (the MoE case within its bound, test_qwen3_5.LOOSER); the rewound turn 0.8e-5 to
1.8e-5 from a fresh prefill of the whole conversation.
"""

import numpy as np
import pytest
from test_qwen3_5 import CASES, SEQ, oracle, tol  # noqa: F401 (oracle: the fixture)

from fuelcli.backends import make_engine
from fuelcli.backends.cpu.delta_chunked import CHUNK, delta_rule_chunked
from fuelcli.backends.cpu.engine import CpuEngine
from fuelcli.backends.cpu.linear_mixer import delta_rule


def _inputs(rng, T, k_heads, v_heads, dk, dv):
    f = np.float32
    qkv = rng.standard_normal((T, 2 * k_heads * dk + v_heads * dv)).astype(f)
    z = rng.standard_normal((T, v_heads * dv)).astype(f)
    b, a = rng.standard_normal((2, T, v_heads)).astype(f)
    a_log = (0.5 * rng.standard_normal(v_heads)).astype(f)
    dt_bias = rng.standard_normal(v_heads).astype(f)
    norm_w = (1 + 0.1 * rng.standard_normal(dv)).astype(f)
    return qkv, z, b, a, a_log, dt_bias, norm_w


@pytest.mark.parametrize("T", [CHUNK, CHUNK + 1, 3 * CHUNK - 5])
@pytest.mark.parametrize("pos0", [0, 7])
def test_chunked_kernel_is_the_recurrence(T, pos0):
    """Output rows and final state, from a zero state (pos0 0: the kernel zeroes it) or a state a
    sequence holds; two value heads per key head."""
    rng = np.random.default_rng(T + pos0)
    k_heads, v_heads, dk, dv = 2, 4, 16, 24
    args = _inputs(rng, T, k_heads, v_heads, dk, dv)
    held = rng.standard_normal((v_heads, dk, dv)).astype(np.float32)
    results = []
    for rule in (delta_rule, delta_rule_chunked):
        state, out = held.copy(), np.empty((T, v_heads * dv), np.float32)
        rule(*args, state, pos0, k_heads, dk, dv, np.float32(1e-6), out)
        results.append((out, state))
    (o1, s1), (o2, s2) = results
    assert np.abs(o1 - o2).max() <= 1e-5 * np.abs(o1).max()
    assert np.abs(s1 - s2).max() <= 1e-5 * np.abs(s1).max()
    if pos0:  # the held state is read: a zero one gives other rows
        state, out = np.zeros_like(held), np.empty_like(o2)
        delta_rule_chunked(*args, state, pos0, k_heads, dk, dv, np.float32(1e-6), out)
        assert np.abs(out - o2).max() > 1e-2


@pytest.mark.parametrize("case", CASES)
def test_a_prompt_split_across_segments(oracle, case):
    """11 rows (the recurrence), then 69 (chunked, from the state the first left): every row as
    transformers; and a prefill in engine batches of 70 rows (each a segment: chunked 64 + 6, then
    the recurrence over 10) the same."""
    model, ids, ref = oracle(case)
    e = make_engine(model.cfg, model.weights, n_ctx=128)
    e.prefill(ids[:11])
    rest = e.prefill(ids[11:], all_logits=True)
    assert np.abs(rest - ref[11:]).max() <= tol(case)
    batched = CpuEngine(model.cfg, model.weights, n_ctx=128, n_batch=CHUNK + 6).prefill(ids, all_logits=True)
    assert np.abs(batched - ref).max() <= tol(case)


@pytest.mark.parametrize("case", CASES)
def test_a_rewind_into_a_chunked_prompt(oracle, case):
    """A turn after a chunked prompt and a rewind to its end (the checkpoint the prefill took):
    the conversation's logits as a fresh prefill of all of it gives them (the chunked form over
    80 rows against chunked 66 + recurrent 14: rounding apart)."""
    model, ids, _ = oracle(case)
    first, reply, second = ids[:66], ids[66:70], ids[70:SEQ]
    fresh = make_engine(model.cfg, model.weights, n_ctx=128).prefill(first + reply + second)[0]
    e = make_engine(model.cfg, model.weights, n_ctx=128)
    e.prefill(first)
    for t in reply:
        e.decode(t)
    kept = e.rewind(len(first) + 2)
    again = e.prefill((first + reply + second)[kept:])[0]
    assert kept == len(first) and np.abs(again - fresh).max() <= 1e-4
