"""`fuel serve --parallel N`: continuous batching. In process, over a scripted engine of N slots (so
timing is the test's): requests generate together and a new one joins at the next step, a client
that goes away frees its slot at once, the queue and its 503 hold beyond N, long prompts enter in
chunks beside the generating rows, and each conversation's next turn lands on its own slot's cache.
Live, on a tiny checkpoint: each request's greedy answer served beside three others (eight clients on
four slots) is its answer served alone."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from serve_helpers import CHAT_TEMPLATE, ServerProcess, assert_error_shape, char_tokenizer, raw, with_tokenizer
from test_serve_worker import EOS, FIRST, N_PRINT, VOCAB, Served, chat, wait_for

from fuelcli.backends.base import Engine
from fuelcli.serve.errors import APIError
from fuelcli.serve.worker import EngineWorker
from fuelcli.text.tokenizer import Tokenizer


class SlottedEngine(Engine):
    """The scripted engine of test_serve_worker with `slots` sequences: next token = the printable
    character after each sequence's last one; records every step's (slot, tokens)."""

    def __init__(self, slots=4, n_ctx=256, delay_s=0.0):
        sizes = dict(num_layers=0, hidden_size=0, q_dim=0, kv_dim=0, head_dim=0, intermediate_size=0,
                     moe_intermediate_size=0, num_experts=0, blocks=())
        super().__init__(SimpleNamespace(max_position=n_ctx, vocab_size=VOCAB, **sizes), n_ctx, slots=slots)
        self.delay_s, self.steps = delay_s, []

    @property
    def kv_bytes(self):
        return 0

    def prefill(self, tokens, all_logits=False, hidden=False):
        return self.step([(0, tokens)])[0][None]

    def step(self, batch):
        ids = [self.check(t, slot).tolist() for slot, t in batch]
        self.steps.append([(slot, t) for (slot, _), t in zip(batch, ids)])
        time.sleep(self.delay_s)
        out = []
        for (slot, _), t in zip(batch, ids):
            self.positions[slot] += len(t)
            last = t[-1]
            logits = np.zeros(VOCAB, np.float32)
            logits[FIRST + ((last - FIRST + 1) % N_PRINT if FIRST <= last < FIRST + N_PRINT else 0)] = 10.0
            out.append(logits)
        return out


@pytest.fixture
def slotted():
    made = []

    def make(slots=4, delay_s=0.0, n_ctx=256, **kw):
        made.append(Served(SlottedEngine(slots, n_ctx, delay_s), **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def stream_texts(s, n, max_tokens, content="go"):
    """n streamed requests at once; returns their texts and the times of their first and last chunks."""
    out = [None] * n

    def one(i):
        t0, first, text = time.perf_counter(), None, ""
        for c in chat(s, f"{content}{i}", max_tokens=max_tokens, temperature=0, stream=True):
            piece = c.choices[0].delta.content or ""
            if piece and first is None:
                first = time.perf_counter() - t0
            text += piece
        out[i] = (text, first, time.perf_counter() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_requests_generate_together(slotted):
    """Four requests of 20 tokens on four slots take about the steps of one, not four times as many,
    and every step carries all four once they have started."""
    s = slotted(slots=4, delay_s=0.02)
    res = stream_texts(s, 4, 20)
    assert all(text == "".join(chr(32 + k) for k in range(20)) for text, _, _ in res)
    steps = s.engine.steps
    assert len(steps) < 2 * 21, len(steps)  # one job at a time would take 4 x 21 steps
    assert max(len(b) for b in steps) == 4 and all(len({slot for slot, _ in b}) == len(b) for b in steps)


def test_a_new_request_joins_at_the_next_step(slotted):
    s = slotted(slots=2, delay_s=0.02)
    long = chat(s, "a", max_tokens=200, temperature=0, stream=True)
    chunks = iter(long)
    for _ in range(5):
        next(chunks)
    t0 = time.perf_counter()
    short = chat(s, "b", max_tokens=3, temperature=0)
    assert time.perf_counter() - t0 < 1.0  # not after the 200 tokens (4 s) of the first
    assert short.choices[0].message.content == ' !"'
    long.close()


def test_a_client_that_goes_away_frees_its_slot_at_once(slotted):
    s = slotted(slots=2, delay_s=0.02)
    streams = [chat(s, f"s{i}", max_tokens=200, temperature=0, stream=True) for i in range(2)]
    its = [iter(x) for x in streams]
    for it in its:
        next(it)
        next(it)
    wait_for(lambda: len(s.worker.running) == 2)
    streams[0].close()
    t0 = time.perf_counter()
    third = chat(s, "c", max_tokens=3, temperature=0)
    assert time.perf_counter() - t0 < 1.5 and third.choices[0].finish_reason == "length"
    streams[1].close()
    wait_for(lambda: not s.worker.running)
    assert any("cancelled" in r.getMessage() for r in s.records)


def test_queue_and_503_beyond_the_slots(slotted):
    s = slotted(slots=2, delay_s=0.02, queue=1)
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}], "max_tokens": 200,
                       "stream": True})
    streams = [chat(s, f"r{i}", max_tokens=200, stream=True) for i in range(2)]
    for x in streams:
        next(iter(x))
    wait_for(lambda: len(s.worker.running) == 2)
    waiting = threading.Thread(target=raw, args=(s.port, "POST", "/v1/chat/completions", body))
    waiting.start()
    wait_for(lambda: s.worker.jobs.qsize() == 1)
    status, headers, data = raw(s.port, "POST", "/v1/chat/completions", body)
    assert_error_shape(status, data, 503, "busy", "--queue")
    assert int(headers["retry-after"]) >= 1
    for x in streams:
        x.close()
    waiting.join(30)


def test_free_slots_are_not_the_queue():
    """--queue counts the requests waiting for a slot: with the engine thread not yet taking jobs
    (mid-step, or not scheduled), as many as the free slots plus the queue are accepted, the next
    is refused. Control: the jobs held by the slots do not count as free ones."""
    tok = Tokenizer(char_tokenizer(), CHAT_TEMPLATE, "<s>", "</s>")
    worker = EngineWorker(SlottedEngine(slots=2), tok, {EOS}, queue_size=1)  # its thread not started
    for i in range(3):  # 2 free slots + 1 waiting
        worker.submit(SimpleNamespace(name=f"job{i}"))
    with pytest.raises(APIError) as refused:
        worker.submit(SimpleNamespace(name="job3"))
    assert refused.value.status == 503 and "1 requests are already waiting" in str(refused.value)
    busy = EngineWorker(SlottedEngine(slots=2), tok, {EOS}, queue_size=1)
    busy.running = {0: object(), 1: object()}  # both slots taken: only the queue is left
    busy.submit(SimpleNamespace(name="waits"))
    with pytest.raises(APIError):
        busy.submit(SimpleNamespace(name="refused"))


def test_long_prompts_enter_in_chunks_beside_the_generating_rows(slotted):
    s = slotted(slots=2, delay_s=0.01, prefill_chunk=16)
    gen = chat(s, "a", max_tokens=200, temperature=0, stream=True)
    it = iter(gen)
    for _ in range(3):
        next(it)
    r = chat(s, "y" * 80, max_tokens=2, temperature=0)
    assert r.choices[0].message.content == ' !'
    chunked = [b for b in s.engine.steps if any(slot == 1 and len(t) > 1 for slot, t in b)]  # the long prompt's
    assert len(chunked) >= 5 and all(sum(len(t) for _, t in b) <= 16 for b in s.engine.steps)
    assert all(len(b) == 2 and min(len(t) for _, t in b) == 1 for b in chunked)  # the generating row rode along
    gen.close()


def test_each_conversation_lands_on_its_own_slot(slotted):
    """Two clients' multi-turn chats interleaved on two slots: each second turn prefills only its own
    new messages (its slot kept its history), whatever the other did meanwhile."""
    s = slotted(slots=2)
    convs = [[{"role": "user", "content": f"hello {name}"}] for name in ("ann", "bob")]
    for turn in range(3):
        for c in convs:
            r = s.client.chat.completions.create(model="scripted", messages=c, max_tokens=4, temperature=0)
            if turn:
                assert r.usage.prompt_tokens_details.cached_tokens > r.usage.prompt_tokens / 2, turn
            c += [{"role": "assistant", "content": r.choices[0].message.content},
                  {"role": "user", "content": f"turn {turn}"}]


# --- live: the same answer alone and beside others -----------------------------------------------

# gpt-oss: sinks, windows, MoE rows; Gemma 4 E2B-style: shared KV, per-layer inputs
@pytest.fixture(scope="module", params=["qwen2_window", "gpt_oss", "gemma4_e2b"])
def checkpoint(tiny, tmp_path_factory, request):
    return request.param, with_tokenizer(tiny(request.param), tmp_path_factory.mktemp("parallel") / "tiny-chat")


# the tiny Gemma 4 answers every prompt with one token repeated; penalised, its answers differ
SAMPLING = {"gemma4_e2b": {"extra_body": {"repeat_penalty": 5.0}}}


def test_greedy_answers_do_not_depend_on_the_company(checkpoint):
    case, checkpoint = checkpoint
    server = ServerProcess(checkpoint, "--parallel", "4", "-c", "256")
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        prompts = ["Cats?", "2+2?", "A colour", "Sky blue?"]

        def ask(p, n=16):
            return client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": p}],
                                                  max_tokens=n, temperature=0,
                                                  **SAMPLING.get(case, {})).choices[0].message.content

        alone = [ask(p) for p in prompts]
        assert len(set(alone)) == len(prompts)  # answers that depend on the prompt and its cache
        together = [None] * 8
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, ask(prompts[i % 4])))
                   for i in range(8)]  # 8 clients on 4 slots: the queue takes the rest
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert together == alone + alone
        assert "4 slots of 64 tokens" in server.log
    finally:
        assert server.stop() == 130
    assert "Traceback" not in server.log
