"""/v1/embeddings' inputs packed several to a forward (embed_job.py over the CPU engine's step with
hidden=True): the vectors are those of the inputs run one by one (bit for bit: each row runs the same
kernels whatever the rows beside it), and of the one-sequence engine's prefill (the path before
batching) within float noise, in fewer forwards. Float weights (a tiny Qwen3) and quantized ones
(SmolLM2's Q4_1/Q8_0)."""

import threading
import time

import numpy as np
import pytest

from fuelcli.assembly.loader import open_model
from fuelcli.backends import make_engine
from fuelcli.serve.embed_job import EmbedJob
from fuelcli.serve.pooling import Embedder, Pooling

LENGTHS = (5, 1, 12, 3, 9, 1, 7)  # one-token inputs run the decode kernels, the others the tiles
NEAR = 1e-6  # max |Δ| of a unit vector against the one-sequence engine's prefill


def inputs(vocab, lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def job(m, ids, mode="mean"):
    embedder = Embedder(m.weights.final_norm, m.cfg.rms_norm_eps, Pooling(mode, "test"), m.cfg.hidden_size)
    return EmbedJob(ids, embedder, loop=None)


def prefilled(m, ids, mode="mean"):
    """Each input through the one-sequence engine's prefill(hidden=True), as the job ran them before."""
    e = make_engine(m.cfg, m.weights, n_ctx=32)
    out = []
    for x in ids:
        e.reset(0)
        out.append(job(m, [x], mode).embedder.vector(e.prefill(x, hidden=True)[1][-1]))
    return np.stack(out)


@pytest.fixture(scope="module")
def qwen3(tiny):
    return open_model(str(tiny("qwen3_bias_headdim")))


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return open_model(str(smollm2_gguf))


@pytest.mark.parametrize("which", ["qwen3", "smollm2"])
@pytest.mark.parametrize("mode", ["mean", "last"])
def test_batched_vectors_are_the_one_by_one_vectors(request, which, mode):
    m = request.getfixturevalue(which)
    ids = inputs(m.cfg.vocab_size)
    e = make_engine(m.cfg, m.weights, n_ctx=32, slots=4)
    batched = job(m, ids, mode).run(e, [0, 1, 2, 3], 256)
    alone = job(m, ids, mode).run(e, [2], 256)
    assert batched.forwards == 2 and alone.forwards == len(ids)  # 4 inputs a forward, then the other 3
    assert batched.prompt_tokens == alone.prompt_tokens == sum(LENGTHS)
    np.testing.assert_array_equal(np.stack(batched.vectors), np.stack(alone.vectors))
    assert float(np.abs(np.stack(batched.vectors) - prefilled(m, ids, mode)).max()) <= NEAR
    assert e.positions == [0, 0, 0, 0]  # the slots are left empty


def test_chunks_of_a_long_input_beside_short_ones(qwen3):
    """A step budget smaller than an input: it enters over several steps while the short ones come and
    go on the other slots; its vector is still its prefill's."""
    ids = inputs(qwen3.cfg.vocab_size, lengths=(20, 2, 3, 1, 4))
    e = make_engine(qwen3.cfg, qwen3.weights, n_ctx=32, slots=3)
    out = job(qwen3, ids).run(e, [0, 1, 2], 6)
    assert out.forwards < len(ids) + 3  # one by one: 20 tokens in 4 steps of 6, then 4 more
    assert float(np.abs(np.stack(out.vectors) - prefilled(qwen3, ids)).max()) <= NEAR


def test_negative_control_a_shared_slot_mixes_the_inputs(qwen3):
    """The comparison sees a wrong cache: two inputs one after the other on a slot that is not emptied
    between them give the second another vector."""
    ids = inputs(qwen3.cfg.vocab_size, lengths=(5, 6))
    e = make_engine(qwen3.cfg, qwen3.weights, n_ctx=32, slots=2)
    e.step([(0, ids[0])])
    _, states = e.step([(0, ids[1])], hidden=True)[0]
    mixed = job(qwen3, ids).embedder.vector(states[-1])
    assert float(np.abs(mixed - prefilled(qwen3, ids)[1]).max()) > 1e-3


def test_cancelled_job_stops_and_empties_its_slots(qwen3):
    j = job(qwen3, inputs(qwen3.cfg.vocab_size))
    e = make_engine(qwen3.cfg, qwen3.weights, n_ctx=32, slots=2)
    e.step([(1, [1, 2, 3])])
    j.cancel()
    assert j.run(e, [0, 1], 256) is None
    assert e.positions == [0, 0]


# --- in the worker, over a scripted engine of several slots (test_serve_worker's harness) ------------


def slotted_engine(slots, delay_s=0.0):
    """test_serve_embeddings' scripted engine with sequences as a dimension: step runs each entry as
    that engine's prefill would on its own slot, and records the slots of each step."""
    from test_serve_embeddings import scripted_hidden_engine

    e = scripted_hidden_engine(delay_s=delay_s)
    e.slots, e.positions, e.steps = slots, [0] * slots, []

    def step(batch, hidden=False):
        e.steps.append([slot for slot, _ in batch])
        out, p = [], e.positions
        for slot, tokens in batch:
            p[0], p[slot] = p[slot], p[0]  # the slot's position where prefill reads and advances it
            got = type(e).prefill(e, tokens, hidden=hidden)
            p[0], p[slot] = p[slot], p[0]
            out.append((got[0][0], got[1]) if hidden else got[0])
        return out

    e.step = step
    return e


@pytest.fixture
def served_slots():
    from fuelcli.serve.pooling import Embedder, Pooling
    from test_serve_embeddings import H
    from test_serve_worker import Served

    made = []

    def make(slots, **kw):
        made.append(Served(slotted_engine(slots, **kw), metrics=True))
        made[-1].model.embedder = Embedder(np.ones(H, np.float32), 1e-6, Pooling("last", "test"), H)
        return made[-1]

    yield make
    for s in made:
        s.close()


def embedded(s, inputs):
    out = s.client.embeddings.create(model="scripted", input=inputs, encoding_format="float")
    return np.array([d.embedding for d in sorted(out.data, key=lambda d: d.index)])


def test_the_worker_packs_a_request_onto_the_free_slots(served_slots):
    """Five inputs on three idle slots: two forwards (three inputs, then two), every slot left empty;
    the vectors are those of the inputs sent one at a time."""
    s = served_slots(3)
    inputs = ["abc", "hello", [5, 6], "abc", "x"]
    got = embedded(s, inputs)
    assert [sorted(st) for st in s.engine.steps] == [[0, 1, 2], [0, 1]]
    assert s.engine.positions == [0, 0, 0]
    alone = np.concatenate([embedded(s, [x]) for x in inputs])
    np.testing.assert_array_equal(got, alone)
    assert any("5 inputs on 3 slots in 2 forwards" in r.getMessage() for r in s.records)


def test_a_generation_keeps_its_slot_while_embeddings_use_the_others(served_slots):
    """A chat generating on one slot of two: the embeddings request runs on the other at once (one
    input a forward there), between the chat's steps; the chat's reply is the one it gives alone."""
    s = served_slots(2, delay_s=0.02)
    replies = []
    t = threading.Thread(target=lambda: replies.append(s.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "hi"}], max_tokens=60, temperature=0)))
    t.start()
    while not s.worker.running:
        time.sleep(0.005)
    (chat_slot,) = s.worker.running
    got = embedded(s, ["abc", "abc", [5, 6]])
    still = bool(s.worker.running)
    t.join(30)
    np.testing.assert_array_equal(got[0], got[1])
    assert still  # answered while the chat was generating: it did not wait for the chat's slot
    embed_steps = [st for st in s.engine.steps if chat_slot not in st]
    assert embed_steps == [[1 - chat_slot]] * 3
    alone = s.client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=60, temperature=0)
    assert replies[0].choices[0].message.content == alone.choices[0].message.content
