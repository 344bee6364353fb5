"""`fuel serve`'s queue, cancellation, prompt cache, shutdown and failure handling, in process: the
real app and worker on uvicorn over a scripted engine (no numba), so timing is under the test's
control. The live server on real checkpoints is tested in test_serve_tiny.py / test_serve_smollm2.py."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import openai
import pytest

from fuelcli.backends.base import Engine
from fuelcli.serve.jobs import ServedModel
from fuelcli.serve.server import bind, make_server, url
from fuelcli.text.generate import common_prefix
from fuelcli.serve.worker import EngineWorker
from fuelcli.text.tokenizer import Tokenizer
from serve_helpers import CHAT_TEMPLATE, assert_error_shape, char_tokenizer, raw

VOCAB, EOS, FIRST, N_PRINT = 256, 2, 6, 95  # ids 6..100 are printable ASCII in the char vocabulary


class ScriptedEngine(Engine):
    """Next token = the printable character after the last one (so text runs " !\"#$%&..."), with an
    optional delay per forward; records what each prefill was given; can fail on a chosen call."""

    def __init__(self, n_ctx=256, delay_s=0.0, fail_on_call=None):
        sizes = dict(num_layers=0, hidden_size=0, q_dim=0, kv_dim=0, head_dim=0, intermediate_size=0,
                     moe_intermediate_size=0, num_experts=0, blocks=())  # nothing to allocate
        super().__init__(SimpleNamespace(max_position=n_ctx, vocab_size=VOCAB, **sizes), n_ctx)
        self.delay_s, self.fail_on_call = delay_s, fail_on_call
        self.prefills: list[list[int]] = []
        self.forwards = 0

    @property
    def kv_bytes(self):
        return 0

    def prefill(self, tokens, all_logits=False, hidden=False):
        tokens = self.check(tokens)
        self.forwards += 1
        if self.fail_on_call == self.forwards:
            raise RuntimeError("scripted failure")
        if len(tokens) > 1:
            self.prefills.append(tokens.tolist())
        time.sleep(self.delay_s)
        self.pos += len(tokens)
        last = int(tokens[-1])
        nxt = FIRST + ((last - FIRST + 1) % N_PRINT if FIRST <= last < FIRST + N_PRINT else 0)
        logits = np.zeros((1, VOCAB), np.float32)
        logits[0, nxt] = 10.0
        return logits


class Served:
    """The app + worker on a uvicorn thread at a free port."""

    def __init__(self, engine, queue=8, api_key=None, prefill_chunk=256, metrics=False):
        tok = Tokenizer(char_tokenizer(), CHAT_TEMPLATE, "<s>", "</s>")
        self.engine = engine
        self.model = ServedModel("scripted", {"scripted"}, tok, engine.n_ctx, VOCAB, {EOS}, 0)
        self.worker = EngineWorker(engine, tok, {EOS}, queue_size=queue, prefill_chunk=prefill_chunk)
        sock = bind("127.0.0.1", 0)
        self.url, self.port = url(sock), sock.getsockname()[1]
        self.server = make_server(self.model, self.worker, api_key, log_level="info", metrics=metrics)
        # fuel.serve's records (set up by make_server's logging config; it does not propagate to pytest's)
        self.records: list[logging.LogRecord] = []
        self._handler = logging.Handler()
        self._handler.emit = self.records.append
        logging.getLogger("fuel.serve").addHandler(self._handler)
        self.worker.start()
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or "none", max_retries=0)

    def close(self):
        self.worker.stop()
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.join(10)
        logging.getLogger("fuel.serve").removeHandler(self._handler)


@pytest.fixture
def served():
    made = []

    def make(**kw):
        engine_kw = {k: kw.pop(k) for k in ("delay_s", "fail_on_call", "n_ctx") if k in kw}
        made.append(Served(ScriptedEngine(**engine_kw), **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def chat(s, content, **kw):
    return s.client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": content}], **kw)


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_scripted_answers_and_usage(served):
    s = served()
    r = chat(s, "hi", max_tokens=5, temperature=0)
    assert r.choices[0].message.content == ' !"#$' and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5 and r.usage.prompt_tokens == len(s.engine.prefills[0])


class EosAfterHash(ScriptedEngine):
    """ScriptedEngine whose text ends at EOS after "#"."""

    def prefill(self, tokens, all_logits=False, hidden=False):
        logits = super().prefill(tokens, all_logits, hidden)
        if int(np.asarray(tokens)[-1]) == FIRST + ord("#") - ord(" "):
            logits[:] = 0.0
            logits[0, EOS] = 10.0
        return logits


def test_ignore_eos_generates_to_max_tokens():
    """ignore_eos (llama-server's and vLLM's extension, for load tests) feeds EOS on like any token:
    the same request stops at EOS without it (the negative control); a non-boolean is a 400."""
    s = Served(EosAfterHash())
    try:
        r = chat(s, "hi", max_tokens=8, temperature=0)
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (' !"#', "stop")
        r = chat(s, "hi", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (' !"# !"', "length")
        assert r.usage.completion_tokens == 8
        c = s.client.completions.create(model="scripted", prompt="hi", max_tokens=6, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 6
        with pytest.raises(openai.BadRequestError):
            chat(s, "hi", max_tokens=8, extra_body={"ignore_eos": "yes"})
    finally:
        s.close()


def test_stop_string_cuts_the_text_and_its_logprobs(served):
    """The tokens reported are those that start before the cut, streamed or not."""
    s = served()
    r = chat(s, "hi", max_tokens=20, temperature=0, stop=["#$", "zz"], logprobs=True, top_logprobs=1)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (' !"', "stop")
    assert [e.token for e in r.choices[0].logprobs.content] == [" ", "!", '"']
    chunks = list(chat(s, "hi", max_tokens=20, temperature=0, stop="#$", logprobs=True, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ' !"'
    assert [e.token for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content] == [" ", "!", '"']
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0 and common_prefix([5], [6]) == 0


def test_prompt_cache_prefills_only_what_is_new(served):
    """A multi-turn conversation: each turn prefills only the new messages; usage says how many were cached."""
    s = served()
    messages, prompts = [{"role": "user", "content": "hello"}], []
    for turn in range(4):
        r = s.client.chat.completions.create(model="scripted", messages=messages, max_tokens=6, temperature=0)
        ids = s.model.tokenizer.encode(s.model.tokenizer.render_chat(messages), add_special_tokens=False)
        prompts.append(ids)
        fed = s.engine.prefills[-1]
        if turn == 0:
            assert fed == ids and r.usage.prompt_tokens_details.cached_tokens == 0
        else:
            # the history, the previous answer included, was in the cache (but the answer's last
            # token: it was sampled, never fed to the engine)
            cached = r.usage.prompt_tokens_details.cached_tokens
            held = prompts[-2] + answer_ids[:-1]
            assert cached == common_prefix(held, ids) == len(held)
            assert fed == ids[cached:] and len(fed) < len(ids) / 2
        answer_ids = s.model.tokenizer.encode(r.choices[0].message.content, add_special_tokens=False)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"turn {turn}"}]
    # the same prompt again: everything but the last token comes from the cache
    again = chat(s, "hello", max_tokens=3, temperature=0)
    first = chat(s, "hello", max_tokens=3, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert first.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1


def test_long_prompt_is_prefilled_in_chunks_and_a_cancel_stops_it(served):
    s = served(delay_s=0.05, prefill_chunk=8)
    r = chat(s, "x" * 30, max_tokens=2, temperature=0)
    ids = s.model.tokenizer.encode(s.model.tokenizer.render_chat([{"role": "user", "content": "x" * 30}]),
                                   add_special_tokens=False)
    assert [len(p) for p in s.engine.prefills] == [8] * ((len(ids) - 1) // 8) + [(len(ids) - 1) % 8 + 1]
    assert sum(s.engine.prefills, []) == ids and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == ' !'
    # a client that gives up during a long prefill stops it between chunks
    quick = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=0.3)
    before = s.engine.forwards
    with pytest.raises(openai.APITimeoutError):
        chat(SimpleNamespace(client=quick), "y" * 200, max_tokens=5)  # 27 chunks of 50 ms
    wait_for(lambda: not s.worker.running)
    assert s.engine.forwards - before < 15
    # the worker frees the slot, then logs the job's end: under load the line can come a moment later
    wait_for(lambda: any("cancelled" in r.getMessage() for r in s.records))


def test_queue_overflow_is_503_with_retry_after(served):
    s = served(delay_s=0.02, queue=1)
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}], "max_tokens": 200,
                       "stream": True})
    running = s.client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "a"}],
                                               max_tokens=200, stream=True)
    next(iter(running))  # the engine is busy with this one
    wait_for(lambda: s.worker.running)
    waiting = threading.Thread(target=raw, args=(s.port, "POST", "/v1/chat/completions", body))
    waiting.start()
    wait_for(lambda: s.worker.jobs.qsize() == 1)
    status, headers, data = raw(s.port, "POST", "/v1/chat/completions", body)
    assert_error_shape(status, data, 503, "busy", "--queue")
    assert int(headers["retry-after"]) >= 1
    running.close()
    waiting.join(30)


def test_stream_disconnect_stops_generation(served):
    s = served(delay_s=0.01)
    stream = chat(s, "go", max_tokens=240, temperature=0, stream=True)
    chunks = iter(stream)
    for _ in range(4):
        next(chunks)
    stream.close()  # the client goes away
    wait_for(lambda: not s.worker.running)
    forwards = s.engine.forwards
    assert forwards < 60, forwards  # far fewer than the 240 asked for
    # the log line follows the slot's release on the worker's thread: wait for it as for the slot
    wait_for(lambda: any("cancelled" in r.getMessage() for r in s.records))
    time.sleep(0.2)
    assert s.engine.forwards == forwards  # and nothing runs after
    assert chat(s, "next", max_tokens=3, temperature=0).choices[0].finish_reason == "length"


def test_waiting_disconnect_stops_generation(served):
    """A non-streamed request whose client times out is cancelled too."""
    s = served(delay_s=0.01)
    quick = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        chat(SimpleNamespace(client=quick), "go", max_tokens=240, temperature=0)
    wait_for(lambda: not s.worker.running)
    assert s.engine.forwards < 100
    assert any("cancelled" in r.getMessage() for r in s.records)


def test_stop_cancels_the_running_and_the_waiting_requests(served):
    s = served(delay_s=0.02)
    stream = chat(s, "a", max_tokens=200, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "b"}], "max_tokens": 5})
    result = {}
    waiting = threading.Thread(target=lambda: result.update(r=raw(s.port, "POST", "/v1/chat/completions", body)))
    waiting.start()
    wait_for(lambda: s.worker.jobs.qsize() == 1)
    s.worker.stop()
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in stream:
            pass
    waiting.join(10)
    status, _, data = result["r"]
    assert_error_shape(status, data, 503, "shutting down")
    status, _, data = raw(s.port, "POST", "/v1/chat/completions", body)
    assert_error_shape(status, data, 503, "shutting down")


def test_engine_failure_is_one_log_line_and_a_500_then_the_server_recovers(served):
    s = served(fail_on_call=2)  # the first decode fails
    with pytest.raises(openai.InternalServerError, match="scripted failure"):
        chat(s, "a", max_tokens=5)
    errors = [r for r in s.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "scripted failure" in errors[0].getMessage() and errors[0].exc_info is None
    assert s.engine.pos == 0 and s.worker.cached == [[]]  # the cache was dropped with the failure
    assert chat(s, "a", max_tokens=3, temperature=0).choices[0].message.content == ' !"'


def test_api_key(served):
    s = served(api_key="sekrit")
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2})
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}, {"Authorization": "Basic sekrit"}):
        for method, path, data in (("POST", "/v1/chat/completions", body), ("GET", "/v1/models", None)):
            status, got, out = raw(s.port, method, path, data, headers)
            assert_error_shape(status, out, 401, "API key")
            assert got["www-authenticate"] == "Bearer"
    assert raw(s.port, "GET", "/health")[0] == 200  # health stays open, as llama-server's
    assert chat(s, "a", max_tokens=2).usage.completion_tokens == 2  # the client sends the right key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_port_in_use_is_a_one_line_error():
    from fuelcli.errors import InputError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(InputError, match=r"cannot listen on 127\.0\.0\.1:\d+"):
            bind("127.0.0.1", taken.getsockname()[1])


def test_a_steps_events_wake_the_event_loop_once():
    """A running job's events go out through the worker's outbox: one call_soon_threadsafe per flush
    (a step) for all the step's jobs, each job's events delivered in order. Control: a job without
    an outbox (waiting, or outside a worker) wakes the loop once per event."""
    from fuelcli.serve.jobs import Delta, Job, Outbox
    from fuelcli.text.generate import SamplerParams

    class Loop:  # counts the wake-ups, runs the callback at once
        calls = 0

        def call_soon_threadsafe(self, fn, *args):
            self.calls += 1
            fn(*args)

    def job(loop, outbox=None):
        return Job(kind="chat", prompt_ids=[1], max_tokens=4, params=SamplerParams(), stops=[], n_logprobs=None,
                   loop=loop, outbox=outbox)

    loop, box = Loop(), Outbox()
    jobs = [job(loop, box) for _ in range(3)]
    for text in ("a", "b"):
        for j in jobs:
            j.emit(Delta(text))
    assert loop.calls == 0
    box.flush()
    assert loop.calls == 1
    assert all([j.events.get_nowait().text for _ in range(2)] == ["a", "b"] for j in jobs)
    box.flush()
    assert loop.calls == 1  # nothing left to send
    alone = job(loop)
    alone.emit(Delta("a"))
    alone.emit(Delta("b"))
    assert loop.calls == 3


def test_greedy_argmax_without_the_float64_copy():
    """Greedy decoding without a grammar or a penalty takes the argmax of the float32 logits as they
    are: the same token as the chain's float64 scores, the first of tied maxima. Control: with a
    repetition penalty the chain's scores are used (the penalised token loses its lead)."""
    from fuelcli.text.generate import Sampler, SamplerParams

    rng = np.random.default_rng(3)
    for _ in range(50):
        x = rng.standard_normal(1000).astype(np.float32)
        x[rng.integers(0, 1000, 3)] = x.max()  # ties
        assert Sampler(SamplerParams(temp=0.0))(x, [5]) == int(np.argmax(x.astype(np.float64)))
    x = np.zeros(10, np.float32)
    x[4], x[7] = 2.0, 1.9
    assert Sampler(SamplerParams(temp=0.0))(x, [4]) == 4
    assert Sampler(SamplerParams(temp=0.0, repeat_penalty=1.5, repeat_last_n=64))(x, [4]) == 7
