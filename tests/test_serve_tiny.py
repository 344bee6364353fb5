"""A live `fuel serve` on a tiny random Llama checkpoint (with a character tokenizer and a ChatML-like
template, tests/serve_helpers.py), spoken to with the official openai client, and raw HTTP for
malformed requests. One server for the module; the reference answers come from fuel's own
generate() on a fresh engine in this process (so the server's prompt cache is checked too)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest

from serve_helpers import SPECIALS, ServerProcess, assert_error_shape, raw, with_tokenizer

KEY = "test-key"
MODEL = "tiny-chat"
N_CTX = 256  # the tiny checkpoints' max_position_embeddings


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    return with_tokenizer(tiny("llama2"), tmp_path_factory.mktemp("serve") / MODEL)


@pytest.fixture(scope="module")
def server(checkpoint):
    s = ServerProcess(checkpoint, "--api-key", KEY)
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log and "Shutting down" in s.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference(checkpoint, server):  # after the server: it has compiled the kernels into the shared cache
    """fuel in this process: greedy answers on a fresh engine (no prompt cache) and full-prefix logits."""
    from fuelcli.backends import make_engine
    from fuelcli.assembly.loader import open_model
    from fuelcli.text.generate import Sampler, SamplerParams, Stats, generate

    m = open_model(str(checkpoint))
    tok = m.tokenizer
    engine = make_engine(m.cfg, m.weights, n_ctx=N_CTX)

    class Reference:
        tokenizer = tok

        def chat_ids(self, messages):
            return tok.encode(tok.render_chat(messages), add_special_tokens=False)

        def greedy(self, ids, max_tokens):
            engine.reset()  # every answer from an empty cache
            stats = Stats()
            text = "".join(generate(engine, tok, ids, max_tokens, Sampler(SamplerParams(temp=0)), m.eos_ids(), [], stats))
            return text, stats

        def logprobs(self, ids):
            """log-softmax of the logits at every position of one full prefill, [T, vocab] float64."""
            engine.reset()
            x = engine.prefill(ids, all_logits=True).astype(np.float64)
            return x - (x.max(1, keepdims=True) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)))

    return Reference()


def user(text, system=None):
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def fuel_run(checkpoint, *args):
    out = subprocess.run([sys.executable, "-m", "fuelcli", "run", str(checkpoint), *args, "--temp", "0", "-q"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.removesuffix("\n")


# --- the API ----------------------------------------------------------------------------------

def test_models_and_health(server, client):
    assert server.url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    status, _, body = raw(server.port, "GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}


def test_greedy_chat_equals_fuel_run(checkpoint, client):
    r = client.chat.completions.create(model=MODEL, messages=user("What is 2+2?", "Be brief."), temperature=0,
                                       max_tokens=24)
    assert r.choices[0].message.content == fuel_run(checkpoint, "What is 2+2?", "--system", "Be brief.", "-n", "24")


def test_greedy_completion_equals_fuel_run_without_template(checkpoint, client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=24)
    assert r.choices[0].text == fuel_run(checkpoint, "Once upon a time", "--no-chat-template", "-n", "24")


def test_answers_usage_and_finish_reason_match_a_fresh_engine(client, reference):
    for prompt, n in (("abc", 40), ("The quick brown fox", 12)):
        r = client.chat.completions.create(model=MODEL, messages=user(prompt), temperature=0, max_tokens=n)
        ids = reference.chat_ids(user(prompt))
        text, stats = reference.greedy(ids, n)
        assert r.choices[0].message.content == text
        assert r.choices[0].finish_reason == {"eos": "stop", "max tokens": "length"}[stats.stop_reason]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), stats.generated)
        assert r.usage.total_tokens == len(ids) + stats.generated


def test_streamed_equals_whole(server, client):
    kw = dict(model=MODEL, messages=user("stream me"), temperature=0, max_tokens=30)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1

    text = client.completions.create(model=MODEL, prompt="stream", temperature=0, max_tokens=20)
    parts = list(client.completions.create(model=MODEL, prompt="stream", temperature=0, max_tokens=20, stream=True))
    assert "".join(p.choices[0].text for p in parts) == text.choices[0].text
    assert parts[-1].choices[0].finish_reason == text.choices[0].finish_reason == "length"

    # the wire format: data: lines ending with [DONE]
    status, headers, body = raw(server.port, "POST", "/v1/completions", json.dumps(
        {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True}), {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    frames = body.decode().split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""] and all(f.startswith("data: ") for f in frames[:-1])


def _vocab(reference):
    return reference.tokenizer.backend.get_vocab()


def test_logprobs_are_the_models(client, reference):
    """Each reported logprob (chosen and top-5) equals log-softmax of the model's logits at that step,
    computed here by one full prefill of prompt + answer."""
    r = client.chat.completions.create(model=MODEL, messages=user("logprobs"), temperature=0, max_tokens=16,
                                       logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    vocab = _vocab(reference)
    answer = [vocab[e.token] for e in content]
    prompt = reference.chat_ids(user("logprobs"))
    ref = reference.logprobs(prompt + answer)[len(prompt) - 1:]
    # measured: decode vs full prefill on this f32 model differ by < 2e-6; 1e-4 leaves headroom
    tol = 1e-4
    for i, e in enumerate(content):
        assert abs(e.logprob - ref[i, answer[i]]) < tol
        assert e.top_logprobs[0].token == e.token  # greedy: the chosen token is the most likely
        top_ids = [vocab[t.token] for t in e.top_logprobs]
        assert top_ids == list(np.argsort(-ref[i], kind="stable")[:5])
        np.testing.assert_allclose([t.logprob for t in e.top_logprobs], ref[i, top_ids], atol=tol)
        assert e.bytes == list(e.token.encode())
    # negative control: one position off, the comparison fails
    assert max(abs(e.logprob - ref[i + 1, answer[i]]) for i, e in enumerate(content[:-1])) > 100 * tol


def test_completion_logprobs_shape(client):
    r = client.completions.create(model=MODEL, prompt="abc", temperature=0, max_tokens=10, logprobs=3)
    lp = r.choices[0].logprobs
    # special tokens (skipped in the text) are reported, and take no room in the text
    shown = ["" if t in SPECIALS else t for t in lp.tokens]
    assert "".join(shown) == r.choices[0].text and len(lp.token_logprobs) == 10
    assert lp.text_offset == [sum(len(t) for t in shown[:i]) for i in range(10)]
    for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and top[tok] == p and p == max(top.values())
    assert client.completions.create(model=MODEL, prompt="abc", max_tokens=3).choices[0].logprobs is None


def test_stop_strings(client):
    base = client.chat.completions.create(model=MODEL, messages=user("stops"), temperature=0, max_tokens=40)
    text = base.choices[0].message.content
    assert len(text) > 12, text
    stop = text[6:8]
    want = text[: text.find(stop)]
    for stops in (stop, [stop], ["never-there", stop], [text[9:11], stop]):
        r = client.chat.completions.create(model=MODEL, messages=user("stops"), temperature=0, max_tokens=40,
                                           stop=stops)
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (want, "stop"), stops
        streamed = client.chat.completions.create(model=MODEL, messages=user("stops"), temperature=0,
                                                  max_tokens=40, stop=stops, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == want
    r = client.chat.completions.create(model=MODEL, messages=user("stops"), temperature=0, max_tokens=40,
                                       stop="never-there")
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == base.choices[0].finish_reason
    completion = client.completions.create(model=MODEL, prompt="stops", temperature=0, max_tokens=30)
    t = completion.choices[0].text
    cut = client.completions.create(model=MODEL, prompt="stops", temperature=0, max_tokens=30, stop=t[4:6])
    assert cut.choices[0].text == t[: t.find(t[4:6])] and cut.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.chat.completions.create(model=MODEL, messages=user("dice"), temperature=1.0,
                                              max_tokens=20, seed=seed, extra_body={"top_k": 0}).choices[0].message.content

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_top_k_extension_greedy_equivalent(client):
    """top_k=1 (llama-server's extension field, sent through extra_body) samples the argmax."""
    greedy = client.chat.completions.create(model=MODEL, messages=user("k"), temperature=0, max_tokens=15)
    k1 = client.chat.completions.create(model=MODEL, messages=user("k"), temperature=1.5, max_tokens=15,
                                        extra_body={"top_k": 1}, seed=3)
    assert k1.choices[0].message.content == greedy.choices[0].message.content


# --- bad requests (raw HTTP) -------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


def _with(base, **changes):
    out = dict(base)
    for k, v in changes.items():
        if v is _DROP:
            out.pop(k)
        else:
            out[k] = v
    return json.dumps(out)


_DROP = object()
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _chat(**changes):
    return ("/v1/chat/completions", _with(CHAT, **changes))


def _turn(**message):
    return _chat(messages=[{"role": "user", "content": "hi"}, message])


# the fields of issue 32 (tools, structured output, reasoning, OpenAI's bookkeeping): a wrong type or
# value is a 400 naming the field
NEW_FIELDS = [
    ("store a string", *_chat(store="yes"), 400, "store"),
    ("metadata a list", *_chat(metadata=["a"]), 400, "metadata"),
    ("metadata value a number", *_chat(metadata={"k": 1}), 400, "metadata"),
    ("metadata too many pairs", *_chat(metadata={f"k{i}": "v" for i in range(17)}), 400, "metadata", "16"),
    ("metadata key too long", *_chat(metadata={"k" * 65: "v"}), 400, "metadata"),
    ("service_tier unknown", *_chat(service_tier="fast"), 400, "service_tier"),
    ("service_tier a number", *_chat(service_tier=1), 400, "service_tier"),
    ("prediction type", *_chat(prediction={"type": "text", "content": "x"}), 400, "prediction.type"),
    ("prediction content a number", *_chat(prediction={"type": "content", "content": 5}), 400, "prediction.content"),
    ("prediction unknown field", *_chat(prediction={"type": "content", "content": "x", "x": 1}), 400, "prediction.x"),
    ("message without content", *_chat(messages=[{"role": "user"}]), 400, "'messages[0].content'"),
    ("assistant null content without calls", *_turn(role="assistant", content=None), 400, "messages[1].content"),
    ("tool_calls arguments not JSON", *_turn(role="assistant", content=None, tool_calls=[
        {**CALL, "function": {"name": "f", "arguments": "{oops"}}]), 400, "messages[1].tool_calls[0].function.arguments"),
    ("tool_calls arguments an object", *_turn(role="assistant", content=None, tool_calls=[
        {**CALL, "function": {"name": "f", "arguments": {}}}]), 400, "arguments"),
    ("tool_calls type", *_turn(role="assistant", content=None, tool_calls=[{**CALL, "type": "call"}]), 400,
     "messages[1].tool_calls[0].type"),
    ("tool_calls without id", *_turn(role="assistant", content=None, tool_calls=[
        {k: v for k, v in CALL.items() if k != "id"}]), 400, "messages[1].tool_calls[0].id"),
    ("tool_calls on a user turn", *_turn(role="user", content="x", tool_calls=[CALL]), 400, "messages[1].tool_calls"),
    ("tool_call_id on a user turn", *_turn(role="user", content="x", tool_call_id="c1"), 400, "messages[1].tool_call_id"),
    ("tool_call_id a number", *_turn(role="tool", content="x", tool_call_id=1), 400, "messages[1].tool_call_id"),
    ("reasoning_content on a user turn", *_turn(role="user", content="x", reasoning_content="r"), 400,
     "reasoning_content"),
    ("tools an object", *_chat(tools=F), 400, "tools"),
    ("tool type", *_chat(tools=[{**F, "type": "retrieval"}]), 400, "tools[0].type"),
    ("tool name with a space", *_chat(tools=[{"type": "function", "function": {"name": "get weather"}}]), 400,
     "tools[0].function.name"),
    ("tool parameters a string", *_chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
     400, "tools[0].function.parameters"),
    ("tool strict a string", *_chat(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]), 400,
     "tools[0].function.strict"),
    ("two tools of one name", *_chat(tools=[F, F]), 400, "same name"),
    ("tool_choice unknown", *_chat(tools=[F], tool_choice="sometimes"), 400, "tool_choice"),
    ("tool_choice names no tool", *_chat(tools=[F], tool_choice={"type": "function", "function": {"name": "g"}}), 400,
     "not in tools"),
    ("tool_choice required without tools", *_chat(tool_choice="required"), 400, "tool_choice"),
    ("parallel_tool_calls a string", *_chat(parallel_tool_calls="yes"), 400, "parallel_tool_calls"),
    ("response_format type", *_chat(response_format={"type": "xml"}), 400, "response_format.type"),
    ("response_format a string", *_chat(response_format="json"), 400, "response_format"),
    ("json_schema missing", *_chat(response_format={"type": "json_schema"}), 400, "response_format.json_schema"),
    ("json_schema without a name", *_chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     400, "response_format.json_schema.name"),
    ("json_schema schema a string", *_chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": "object"}}), 400, "response_format.json_schema.schema"),
    ("json_schema not a schema", *_chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "strin"}}}), 400, "strin"),
    ("json_schema strict a string", *_chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": "yes"}}), 400, "response_format.json_schema.strict"),
    ("chat_template_kwargs a list", *_chat(chat_template_kwargs=["x"]), 400, "chat_template_kwargs"),
    ("chat_template_kwargs sets messages", *_chat(chat_template_kwargs={"messages": []}), 400, "messages"),
    ("reasoning_format unknown", *_chat(reasoning_format="xml"), 400, "reasoning_format"),
    ("reasoning_effort", *_chat(reasoning_effort="low"), 400, "reasoning_effort"),
    ("functions", *_chat(functions=[{"name": "f"}]), 400, "functions"),
]

BAD = [
    # (id, path, body, status, words the message must contain)
    ("not json", "/v1/chat/completions", '{"model": ', 400, "not valid JSON"),
    ("empty body", "/v1/chat/completions", "", 400, "not valid JSON"),
    ("garbage", "/v1/completions", "\x00\xff nope", 400, "JSON"),
    ("array body", "/v1/chat/completions", "[]", 400, "JSON object"),
    ("null body", "/v1/completions", "null", 400, "JSON object"),
    ("NaN literal", "/v1/chat/completions", _with(CHAT).replace('"max_tokens": 2', '"temperature": NaN'), 400,
     "temperature"),
    ("missing messages", "/v1/chat/completions", _with(CHAT, messages=_DROP), 400, "'messages'"),
    ("missing prompt", "/v1/completions", _with(TEXT, prompt=_DROP), 400, "'prompt'"),
    ("model not a string", "/v1/chat/completions", _with(CHAT, model=5), 400, "model"),
    ("messages a string", "/v1/chat/completions", _with(CHAT, messages="hi"), 400, "messages"),
    ("messages empty", "/v1/chat/completions", _with(CHAT, messages=[]), 400, "messages"),
    ("message not an object", "/v1/chat/completions", _with(CHAT, messages=["hi"]), 400, "messages[0]"),
    ("unknown role", "/v1/chat/completions", _with(CHAT, messages=[{"role": "robot", "content": "x"}]), 400,
     "messages[0].role"),
    ("tool role without tool_call_id", "/v1/chat/completions", _with(CHAT, messages=[{"role": "tool", "content": "x"}]),
     400, "messages[0].tool_call_id"),
    ("content a number", "/v1/chat/completions", _with(CHAT, messages=[{"role": "user", "content": 5}]), 400,
     "messages[0].content"),
    ("content null", "/v1/chat/completions", _with(CHAT, messages=[{"role": "user", "content": None}]), 400,
     "messages[0].content"),
    ("image part", "/v1/chat/completions", _with(CHAT, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "only text parts"),
    ("unknown message field", "/v1/chat/completions", _with(CHAT, messages=[{"role": "user", "content": "x",
                                                                              "mood": 1}]), 400, "mood"),
    ("max_tokens a string", "/v1/chat/completions", _with(CHAT, max_tokens="10"), 400, "max_tokens"),
    ("max_tokens a float", "/v1/chat/completions", _with(CHAT, max_tokens=1.5), 400, "max_tokens"),
    ("max_tokens a bool", "/v1/chat/completions", _with(CHAT, max_tokens=True), 400, "max_tokens"),
    ("max_tokens zero", "/v1/chat/completions", _with(CHAT, max_tokens=0), 400, "max_tokens"),
    ("max_completion_tokens negative", "/v1/chat/completions", _with(CHAT, max_completion_tokens=-3), 400,
     "max_completion_tokens"),
    ("temperature a string", "/v1/chat/completions", _with(CHAT, temperature="hot"), 400, "temperature"),
    ("temperature negative", "/v1/completions", _with(TEXT, temperature=-1), 400, "temperature"),
    ("top_p zero", "/v1/chat/completions", _with(CHAT, top_p=0), 400, "top_p"),
    ("top_p above one", "/v1/completions", _with(TEXT, top_p=1.5), 400, "top_p"),
    ("seed negative", "/v1/chat/completions", _with(CHAT, seed=-1), 400, "seed"),
    ("seed a string", "/v1/chat/completions", _with(CHAT, seed="1"), 400, "seed"),
    ("stop a number", "/v1/chat/completions", _with(CHAT, stop=5), 400, "stop"),
    ("stop list of numbers", "/v1/completions", _with(TEXT, stop=[1]), 400, "stop"),
    ("stream a string", "/v1/chat/completions", _with(CHAT, stream="yes"), 400, "stream"),
    ("logprobs a string", "/v1/chat/completions", _with(CHAT, logprobs="yes"), 400, "logprobs"),
    ("top_logprobs too many", "/v1/chat/completions", _with(CHAT, logprobs=True, top_logprobs=21), 400,
     "top_logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", _with(CHAT, top_logprobs=2), 400, "logprobs"),
    ("completion logprobs too many", "/v1/completions", _with(TEXT, logprobs=21), 400, "logprobs"),
    ("completion logprobs a bool", "/v1/completions", _with(TEXT, logprobs=True), 400, "logprobs"),
    ("n two", "/v1/chat/completions", _with(CHAT, n=2), 400, "n must be 1"),
    ("presence_penalty", "/v1/chat/completions", _with(CHAT, presence_penalty=0.5), 400, "presence_penalty"),
    ("logit_bias", "/v1/completions", _with(TEXT, logit_bias={"5": 10}), 400, "logit_bias"),
    ("tools on a template without them", "/v1/chat/completions",
     _with(CHAT, tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tool-call format"),
    *NEW_FIELDS,
    ("echo", "/v1/completions", _with(TEXT, echo=True), 400, "echo"),
    ("best_of", "/v1/completions", _with(TEXT, best_of=3), 400, "best_of"),
    ("stream_options without stream", "/v1/chat/completions", _with(CHAT, stream_options={"include_usage": True}),
     400, "stream_options"),
    ("unknown field", "/v1/chat/completions", _with(CHAT, frobnicate=1), 400, "Unrecognized", "frobnicate"),
    ("unknown completions field", "/v1/completions", _with(TEXT, messages=[]), 400, "Unrecognized", "messages"),
    ("prompt a number", "/v1/completions", _with(TEXT, prompt=5), 400, "prompt"),
    ("prompt empty list", "/v1/completions", _with(TEXT, prompt=[]), 400, "prompt"),
    ("two prompts", "/v1/completions", _with(TEXT, prompt=["a", "b"]), 400, "one prompt per request"),
    ("mixed prompt list", "/v1/completions", _with(TEXT, prompt=[1, "a"]), 400, "prompt"),
    ("token id out of range", "/v1/completions", _with(TEXT, prompt=[1, 999999]), 400, "999999", "0..255"),
    ("negative token id", "/v1/completions", _with(TEXT, prompt=[-1]), 400, "-1"),
    ("empty prompt tokens", "/v1/completions", _with(TEXT, prompt=[[]]), 400, "prompt"),
    ("model not a string (completions)", "/v1/completions", _with(TEXT, model=["a"]), 400, "model"),
]


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT),
                                        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2})])
@pytest.mark.parametrize("name", ["gpt-4o", None, _DROP], ids=["another name", "null", "absent"])
def test_any_model_name_or_none_is_the_one_model(server, path, body, name):
    """As llama-server: whatever `model` a request names, or none, the server's one model answers and
    the reply names it (issue 48). Its lookup, GET /v1/models/ID, still knows only its names."""
    body = _with(body, model=name)
    got, _, data = raw(server.port, "POST", path, body, {"Authorization": f"Bearer {KEY}"})
    assert got == 200, data
    assert json.loads(data)["model"] == MODEL


@pytest.mark.parametrize("path, body, status, words", [(p, b, s, w) for _, p, b, s, *w in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_request(server, path, body, status, words):
    got, _, data = raw(server.port, "POST", path, body, {"Authorization": f"Bearer {KEY}"})
    err = assert_error_shape(got, data, status, *words)
    assert err["type"] == "invalid_request_error"


def test_http_errors_in_openai_shape(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert_error_shape(*raw(server.port, "GET", "/v1/nothing", None, auth)[::2], 404, "/v1/nothing")
    assert_error_shape(*raw(server.port, "GET", "/v1/chat/completions", None, auth)[::2], 405, "GET")
    assert_error_shape(*raw(server.port, "GET", "/v1/models/other", None, auth)[::2], 404, "other")
    # a body announced over the limit is refused before it is read
    assert_error_shape(*raw(server.port, "POST", "/v1/completions", b"{}",
                            {**auth, "Content-Length": str(1 << 30)})[::2], 413, "MiB")


def test_broken_http_is_refused_and_the_server_carries_on(server, client, reference):
    """Garbage, TLS to a plain port, a body cut short: uvicorn's one-line warnings, no traceback (the
    module's teardown checks the whole log), and the next request is served."""
    import socket

    for payload in (b"GARBAGE\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\x00\x00",
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                    + b"\r\nContent-Length: 100\r\n\r\n{\"mo"):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(payload)
            s.settimeout(0.5)
            try:
                s.recv(100)
            except socket.timeout:
                pass  # the cut body: the server still waits for the rest; closing ends it
    # greedy, against a fresh engine: a sampled answer may end at EOS after one token
    r = client.completions.create(model=MODEL, prompt="ok", temperature=0, max_tokens=2)
    text, stats = reference.greedy(reference.tokenizer.encode("ok", add_special_tokens=True), 2)
    assert (r.choices[0].text, r.usage.completion_tokens) == (text, stats.generated)
    assert not server.wait_log(r"ERROR", timeout=1.0), server.log


def test_prompt_longer_than_the_context(server, client):
    auth = {"Authorization": f"Bearer {KEY}"}
    long_chat = _with(CHAT, messages=[{"role": "user", "content": "x" * 400}])
    err = assert_error_shape(*raw(server.port, "POST", "/v1/chat/completions", long_chat, auth)[::2], 400,
                             "context is 256 tokens")
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    for prompt in ("y" * 300, list(range(6, 6 + 95)) * 3):
        err = assert_error_shape(*raw(server.port, "POST", "/v1/completions", _with(TEXT, prompt=prompt), auth)[::2],
                                 400, "context is 256 tokens")
        assert err["code"] == "context_length_exceeded"
    # the longest prompt that fits: the context is full after two new tokens (the last one, sampled from
    # the logits at the last position, needs no cache slot), and the answer says "length"
    r = client.completions.create(model=MODEL, prompt=[7] * (N_CTX - 1), max_tokens=50, temperature=0)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (2, "length")
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL, prompt=[7] * N_CTX, max_tokens=5)


# --- load ---------------------------------------------------------------------------------------

def test_eight_clients_four_requests_each(server, reference):
    """8 clients x 4 requests at once, streamed and not, chat and completions: every answer is the one a
    fresh engine gives alone (the queue, the worker and the prompt cache keep requests apart)."""
    jobs = [(c, i) for c in range(8) for i in range(4)]
    prompt = {job: f"client {job[0]} asks question {job[1]}" for job in jobs}
    want = {}
    for job in jobs:
        ids = (reference.chat_ids(user(prompt[job])) if job[1] % 2 == 0
               else reference.tokenizer.encode(prompt[job], add_special_tokens=True))
        want[job] = reference.greedy(ids, 10)[0]
    got, errors = {}, []

    def run_client(c):
        client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)
        try:
            for i in range(4):
                stream = (c + i) % 2 == 1
                if i % 2 == 0:
                    r = client.chat.completions.create(model=MODEL, messages=user(prompt[c, i]), temperature=0,
                                                       max_tokens=10, stream=stream)
                    got[c, i] = ("".join(ch.choices[0].delta.content or "" for ch in r) if stream
                                 else r.choices[0].message.content)
                else:
                    r = client.completions.create(model=MODEL, prompt=prompt[c, i], temperature=0, max_tokens=10,
                                                  stream=stream)
                    got[c, i] = "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=run_client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "deadlock: clients still waiting"
    assert not errors, errors
    assert got == want


def test_memory_steady_over_200_requests(server, client):
    def burst(n):
        for i in range(n):
            if i % 2:
                client.chat.completions.create(model=MODEL, messages=user(f"memory {i}"), max_tokens=8, seed=i,
                                               logprobs=True, top_logprobs=2)
            else:
                list(client.completions.create(model=MODEL, prompt=f"memory {i}", max_tokens=8, stream=True))

    burst(20)  # warm: imports, the tokenizer's caches, allocator pools
    before = server.rss_bytes()
    burst(200)
    after = server.rss_bytes()
    assert after < 1.10 * before, (before, after)


@pytest.mark.parametrize("args, words", [
    (["-c", "100000"], ["-c 100000 exceeds the model's context of 256"]),
    (["-c", "-1"], ["-c must be >= 0"]),
    (["-t", "0"], ["-t/--threads must be from 1 to 512"]),
    (["--queue", "0"], ["--queue must be at least 1"]),
    (["--port", "70000"], ["cannot listen on 127.0.0.1:70000"]),
    (["--host", "no.such.host.invalid"], ["cannot listen on no.such.host.invalid"]),
    (["--log-level", "loud"], ["--log-level"]),
])
def test_cli_errors(checkpoint, args, words):
    from typer.testing import CliRunner

    from fuelcli.cli import app
    from fuelcli.errors import InputError

    result = CliRunner().invoke(app, ["serve", str(checkpoint), *args])
    assert isinstance(result.exception, InputError), result.output
    for w in words:
        assert w in str(result.exception)


def test_cli_error_is_one_line(checkpoint):
    r = subprocess.run([sys.executable, "-m", "fuelcli", "serve", str(checkpoint), "--port", "70000"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: cannot listen") and r.stderr.count("\n") == 1, r.stderr
