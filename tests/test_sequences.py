"""Sequences as a dimension of the CPU engine (base.Engine.step): several sequences, each on its own
slot of the KV cache at its own position, in one forward. Each sequence's logits are transformers'
for that sequence alone; a sequence's next token runs the decode kernels whatever rows run beside
it, so its logits are bit for bit those of the one-sequence engine (the negative control: the same
row on the tiles differs in the last bits); slots do not touch each other's caches; bad steps are
one-line errors."""

import numpy as np
import pytest
from hf_oracle import hf_logits
from test_decoder_oracle import TOL, tol

from fuelcli.backends import make_engine
from fuelcli.errors import InputError
from fuelcli.assembly.loader import open_model

LENGTHS = (9, 14, 6)  # three prompts of their own lengths: positions differ row by row


def prompts(vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in LENGTHS]


def interleaved(engine, seqs, tail=3):
    """Each sequence's logits at positions len-tail-1 .. len-2, all fed together: the prompts but
    their last `tail` tokens in one step, then tail-1 steps of one token per sequence, the order
    reversed every other step."""
    got = [[] for _ in seqs]
    outs = engine.step([(j, s[:-tail]) for j, s in enumerate(seqs)])
    for j, o in enumerate(outs):
        got[j].append(o)
    for k in range(tail - 1):
        order = list(range(len(seqs)))[::-1 if k % 2 else 1]
        outs = engine.step([(j, [seqs[j][-tail + k]]) for j in order])
        for j, o in zip(order, outs):
            got[j].append(o)
    return [np.stack(g) for g in got]


@pytest.mark.parametrize("case", ["qwen2_window", "gemma3", "qwen3_moe_norm_true", "smollm3"])
def test_each_sequence_is_transformers_alone(tiny, case):
    d = tiny(case)
    m = open_model(str(d))
    seqs = prompts(m.cfg.vocab_size)
    engine = make_engine(m.cfg, m.weights, n_ctx=16, slots=len(seqs))
    for j, got in enumerate(interleaved(engine, seqs)):
        ref = hf_logits(d, seqs[j])[-4:-1]
        assert float(np.abs(got - ref).max()) <= tol(case), (case, j)
        assert engine.positions[j] == LENGTHS[j] - 1


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return open_model(str(smollm2_gguf))


def test_a_row_is_the_one_sequence_engines_whatever_its_neighbours(smollm2):
    """Q4_1 and Q8_0 products: a sequence's next-token logits on the one-sequence engine, alone on a
    three-slot engine, and beside two others fed in another order (a prompt chunk among them), bit
    for bit equal."""
    seqs = prompts(smollm2.cfg.vocab_size, seed=1)
    one = make_engine(smollm2.cfg, smollm2.weights, n_ctx=32)
    one.prefill(seqs[0])
    ref = one.decode(5)
    e = make_engine(smollm2.cfg, smollm2.weights, n_ctx=32, slots=3)
    e.step([(0, seqs[0])])
    assert np.array_equal(e.step([(0, [5])])[0], ref)
    e.reset()
    e.step([(j, s) for j, s in enumerate(seqs[:2])])
    beside = e.step([(2, seqs[2]), (0, [5]), (1, [7])])  # seq 2's prompt chunk rides along
    assert np.array_equal(beside[1], ref)


def test_negative_control_the_same_row_on_the_tiles(smollm2):
    """The comparison sees a last-bit difference: the same token fed behind a prompt chunk, so that
    it runs the tile kernels (the engine puts one-token sequences first to avoid just that)."""
    seqs = prompts(smollm2.cfg.vocab_size, seed=1)
    e = make_engine(smollm2.cfg, smollm2.weights, n_ctx=32, slots=3)
    e.step([(0, seqs[0])])
    ref = e.step([(0, [5])])[0]
    e.reset()
    e.step([(0, seqs[0])])
    chunk = seqs[2]
    segs = e._segs([(2, 0, len(chunk)), (0, e.positions[0], 1)])  # the one-token row second: on the tiles
    logits = e._logits(2)
    e._forward(*e._args(np.array(chunk + [5], np.int64), segs, False, logits, np.empty((0, 1, 1), np.float32)))
    tiled = logits[1].copy()
    assert not np.array_equal(tiled, ref) and float(np.abs(tiled - ref).max()) < 1e-2


def test_slots_keep_their_own_caches(tiny):
    m = open_model(str(tiny("qwen2_window")))
    seqs = prompts(m.cfg.vocab_size, seed=2)
    e = make_engine(m.cfg, m.weights, n_ctx=16, slots=3)
    first = interleaved(e, seqs)
    e.rewind(3, slot=1)  # slot 1 back to its first 3 tokens; the others untouched
    assert e.positions == [LENGTHS[0] - 1, 3, LENGTHS[2] - 1]
    again = e.step([(1, seqs[1][3:-3])])[0]
    assert np.allclose(again, first[1][0], atol=TOL)
    e.reset(2)
    assert e.positions[2] == 0 and e.positions[0] == LENGTHS[0] - 1
    e.reset()
    assert e.positions == [0, 0, 0]


@pytest.mark.parametrize("batch, message", [
    ([], "a step takes each sequence at most once"),
    ([(0, [1]), (0, [2])], "a step takes each sequence at most once, got slots [0, 0]"),
    ([(3, [1])], "no sequence slot 3: the engine holds 3"),
    ([(-1, [1])], "no sequence slot -1"),
    ([(0, [])], "no tokens to run"),
    ([(1, list(range(17)))], "17 tokens exceed the context of 16"),
    ([(0, [300])], "token id out of range 0..255"),
])
def test_bad_steps(tiny, batch, message):
    m = open_model(str(tiny("llama2")))
    e = make_engine(m.cfg, m.weights, n_ctx=16, slots=3)
    with pytest.raises(InputError) as err:
        e.step(batch)
    assert message in str(err.value) and e.positions == [0, 0, 0]


def test_one_sequence_engines(tiny):
    """slots=1 is the commands' engine (decode kernels); zero slots and cuda's many are refused."""
    m = open_model(str(tiny("llama2")))
    e = make_engine(m.cfg, m.weights, n_ctx=16)
    assert e.slots == 1 and e.pos == 0
    with pytest.raises(InputError, match="at least one sequence"):
        make_engine(m.cfg, m.weights, n_ctx=16, slots=0)
    with pytest.raises(InputError, match="the cuda backend runs one sequence at a time, not 4"):
        make_engine(m.cfg, m.weights, n_ctx=16, device="cuda", slots=4)
