"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official
anthropic client, on the tiny random model with the Qwen3-shaped template of test_serve_agents.py:
an agent loop (a forced call, its tool_result, the final answer), streaming, the stop reasons,
thinking, x-api-key, a claude-style request, and malformed bodies (400 naming the field in
Anthropic's error shape, never a 500). The same request through /v1/chat/completions is the control:
the translation must give the same prompt and the same calls."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess, raw, with_tokenizer  # noqa: E402
from test_serve_agents import ADD, QWEN3_SHAPED, WEATHER  # noqa: E402

MODEL = "tiny-agent"
KEY = "anthropic-test-key"
NO_THINK = {"type": "disabled"}
TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"],
          **({"description": t["function"]["description"]} if "description" in t["function"] else {})}
         for t in (WEATHER, ADD)]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
GREEDY = {"temperature": 0}  # the anthropic client takes temperature in the body


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    d = with_tokenizer(tiny("llama2"), tmp_path_factory.mktemp("anthropic") / MODEL)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": QWEN3_SHAPED}))
    config = json.loads((d / "config.json").read_text())  # room for a claude-style prompt, a token a character
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return d


@pytest.fixture(scope="module")
def server(checkpoint):
    s = ServerProcess(checkpoint, "--api-key", KEY, "--metrics", "-c", "8192")
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def create(client, content="Tell me something.", **kw):
    kw = {"model": MODEL, "max_tokens": 200, "thinking": NO_THINK, "extra_body": GREEDY, **kw}
    messages = kw.pop("messages", [{"role": "user", "content": content}])
    return client.messages.create(messages=messages, **kw)


def check_tool_uses(msg, names=None):
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and all(b.type in ("text", "tool_use") for b in msg.content)
    for b in uses:
        assert b.id.startswith("toolu_") and (names is None or b.name in names)
        jsonschema.validate(b.input, SCHEMAS[b.name])
    return uses


# --- the agent loop ------------------------------------------------------------------------------

def test_agent_loop(client):
    """Two rounds of forced calls (tool_choice any) and their results, then a text answer; the
    client's own content blocks are sent back as they came."""
    messages = [{"role": "user", "content": "Weather in Lima and Paris, then add 2 and 3."}]
    for round_ in range(2):
        msg = create(client, messages=messages, tools=TOOLS, tool_choice={"type": "any"})
        uses = check_tool_uses(msg)
        assert msg.usage.output_tokens > 0 and msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0
        messages.append({"role": "assistant", "content": msg.content})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": json.dumps({"ok": round_})} for u in uses]})
    final = create(client, messages=messages, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=20)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in final.content] == ["text"] and final.content[0].text


def test_the_same_as_chat_completions(client, oai):
    """The translation: the same prompt (token count) and the same forced calls as the chat request."""
    msg = create(client, "What is the weather in Oslo?", tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"})
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Oslo?"}], max_tokens=200,
        temperature=0, tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    (use,) = check_tool_uses(msg, {"get_weather"})
    (call,) = chat.choices[0].message.tool_calls
    assert (use.name, use.input) == (call.function.name, json.loads(call.function.arguments))


def test_tool_choice_auto_without_a_call_is_text(client):
    msg = create(client, "Hi", tools=TOOLS, max_tokens=30)
    assert msg.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in msg.content)


def test_stop_reasons(client):
    free = create(client, "Hi", max_tokens=30)
    assert free.stop_reason == "max_tokens" and free.usage.output_tokens == 30
    text = free.content[0].text
    stop = text[8:10]
    cut = create(client, "Hi", max_tokens=30, stop_sequences=["\x00never", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.find(stop)]


def test_thinking_block(client):
    """The template opens <think>; a model that never closes it thinks the whole reply."""
    msg = create(client, "Think.", max_tokens=40, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in msg.content] == ["thinking"] and msg.content[0].thinking
    streamed = []
    with client.messages.stream(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Think."}],
                                thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=GREEDY) as s:
        for event in s:
            streamed.append(event.type)
        final = s.get_final_message()
    assert final.content[0].thinking == msg.content[0].thinking
    assert "thinking" in streamed


# --- streaming -----------------------------------------------------------------------------------

def events(client, **kw):
    kw = {"model": MODEL, "max_tokens": 200, "thinking": NO_THINK, "extra_body": GREEDY, **kw}
    return list(client.messages.create(stream=True, **kw))


def test_stream_event_sequence_text(client):
    whole = create(client, "Hi", max_tokens=30)
    evs = events(client, messages=[{"role": "user", "content": "Hi"}], max_tokens=30)
    types = [e.type for e in evs]
    assert types[0] == "message_start" and types[1] == "content_block_start"
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert all(e.delta.type == "text_delta" for e in evs[2:-3])
    assert "".join(e.delta.text for e in evs[2:-3]) == whole.content[0].text
    assert evs[-2].delta.stop_reason == whole.stop_reason and evs[-2].usage.output_tokens == 30


def test_stream_tool_use_and_the_accumulated_message(client):
    kw = dict(tools=TOOLS, tool_choice={"type": "any"})
    whole = create(client, "Weather?", **kw)
    evs = events(client, messages=[{"role": "user", "content": "Weather?"}], **kw)
    starts = [e for e in evs if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == [b.type for b in whole.content]
    deltas = [e for e in evs if e.type == "content_block_delta"]
    assert deltas and all(d.delta.type == "input_json_delta" for d in deltas)
    assert [json.loads(d.delta.partial_json) for d in deltas] == [b.input for b in whole.content]
    with client.messages.stream(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Weather?"}],
                                thinking=NO_THINK, extra_body=GREEDY, **kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in whole.content]


def test_claude_style_request(client):
    """What Claude Code sends: a long system prompt in blocks with cache_control, many tools,
    metadata, streaming; then count_tokens of the same."""
    system = [{"type": "text", "text": "You are a coding agent. " * 60, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Be brief."}]
    tools = [{"name": f"tool_{i}", "description": f"Tool number {i}.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
             for i in range(16)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Read main.py", "cache_control": {"type": "ephemeral"}}]}]
    with client.messages.stream(model=MODEL, max_tokens=30, system=system, tools=tools, messages=messages,
                                metadata={"user_id": "u1"}, tool_choice={"type": "auto"},
                                extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = client.messages.count_tokens(model=MODEL, system=system, tools=tools, messages=messages)
    assert counted.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens > 1500


def test_count_tokens(client):
    msg = create(client, "Hi", max_tokens=1)
    n = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}], thinking=NO_THINK)
    assert n.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    more = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}], thinking=NO_THINK,
                                        tools=TOOLS)
    assert more.input_tokens > n.input_tokens


# --- keys, metrics -------------------------------------------------------------------------------

def test_keys(server):
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
    assert raw(server.port, "POST", "/v1/messages", body, {"x-api-key": KEY})[0] == 200
    assert raw(server.port, "POST", "/v1/messages", body, {"Authorization": f"Bearer {KEY}"})[0] == 200
    status, _, out = raw(server.port, "POST", "/v1/messages", body, {"x-api-key": "wrong"})
    assert status == 401 and json.loads(out)["error"]["type"] == "authentication_error"
    chat = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
    assert raw(server.port, "POST", "/v1/chat/completions", chat, {"x-api-key": KEY})[0] == 200
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])


def test_any_model_name_is_the_one_model(client):
    """Claude Code names its own models: the server's one model answers, and the reply names it."""
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
    assert reply.model == MODEL


def test_metrics_count_the_endpoint(client, server):
    create(client, "Hi", max_tokens=2)
    status, _, out = raw(server.port, "GET", "/metrics", headers={"x-api-key": KEY})
    assert status == 200 and 'fuel_requests_total{endpoint="messages",finish_reason="length"}' in out.decode()


# --- malformed bodies ----------------------------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]
CALLED = [{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}]}]
BAD = [  # (id, body fields over a good body, the field the message names)
    ("max_tokens a string", {"max_tokens": "5"}, "max_tokens"),
    ("max_tokens zero", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens missing", {"max_tokens": None}, "max_tokens"),
    ("model missing", {"model": None}, "model"),
    ("messages missing", {"messages": None}, "messages"),
    ("messages a string", {"messages": "Hi"}, "messages"),
    ("messages empty", {"messages": []}, "messages"),
    ("a role unknown", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ("content missing", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("content null", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("content a number", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ("content empty", {"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ("a block not an object", {"messages": [{"role": "user", "content": ["Hi"]}]}, "messages[0].content[0]"),
    ("an image block", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     "messages[0].content[0].type"),
    ("an unknown block type", {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type"),
    ("a block without a type", {"messages": [{"role": "user", "content": [{"text": "Hi"}]}]},
     "messages[0].content[0].type"),
    ("text missing", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ("text a number", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text"),
    ("an unknown block field", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     "messages[0].content[0].x"),
    ("tool_use in a user turn", {"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]}, "messages[0].content[0].type"),
    ("tool_use without an id", {"messages": [HI[0], {"role": "assistant", "content": [
        {"type": "tool_use", "name": "add", "input": {}}]}]}, "messages[1].content[0].id"),
    ("tool_use input not an object", {"messages": [HI[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "add", "input": "{}"}]}]}, "messages[1].content[0].input"),
    ("tool_result for an unknown id", {"messages": CALLED + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "5"}]}]}, "messages[2].content[0].tool_use_id"),
    ("tool_result without a call", {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]}]}, "messages[0].content[0].tool_use_id"),
    ("tool_result content a number", {"messages": CALLED + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": 5}]}]}, "messages[2].content[0].content"),
    ("tool_result holding an image", {"messages": CALLED + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0].type"),
    ("system a number", {"system": 3}, "system"),
    ("a system block of another type", {"system": [{"type": "image"}]}, "system[0].type"),
    ("temperature a string", {"temperature": "0.5"}, "temperature"),
    ("top_p out of range", {"top_p": 2}, "top_p"),
    ("stop_sequences a string", {"stop_sequences": "x"}, "stop_sequences"),
    ("stream a string", {"stream": "yes"}, "stream"),
    ("an unknown field", {"frequency_penalty": 1}, "frequency_penalty"),
    ("tools an object", {"tools": {"name": "a"}}, "tools"),
    ("a tool without input_schema", {"tools": [{"name": "a"}]}, "tools[0].input_schema"),
    ("input_schema a list", {"tools": [{"name": "a", "input_schema": []}]}, "tools[0].input_schema"),
    ("a tool name with spaces", {"tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
    ("a server tool", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ("tool_choice an unknown type", {"tools": TOOLS, "tool_choice": {"type": "all"}}, "tool_choice.type"),
    ("tool_choice tool without a name", {"tools": TOOLS, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ("tool_choice a tool not declared", {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice"),
    ("tool_choice any without tools", {"tool_choice": {"type": "any"}}, "tool_choice"),
    ("an assistant turn last (a prefill)", {"messages": HI + [{"role": "assistant", "content": "The"}]},
     "messages[1].role"),
    ("thinking an unknown type", {"thinking": {"type": "always"}}, "thinking.type"),
    ("metadata of another shape", {"metadata": {"user": 1}}, "metadata.user"),
]


def bad_request(server, body, path="/v1/messages", want=400):
    status, _, out = raw(server.port, "POST", path, body if isinstance(body, (str, bytes)) else json.dumps(body),
                         {"x-api-key": KEY})
    assert status == want, (status, out[:300])
    data = json.loads(out)
    assert set(data) == {"type", "error"} and data["type"] == "error" and set(data["error"]) == {"type", "message"}
    msg = data["error"]["message"]
    assert isinstance(msg, str) and msg and "\n" not in msg and "Traceback" not in msg, msg
    return data["error"]


@pytest.mark.parametrize("fields, field", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_bodies_name_the_field(server, fields, field):
    body = {"model": MODEL, "max_tokens": 5, "messages": HI, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    err = bad_request(server, body)
    assert err["type"] == "invalid_request_error" and field in err["message"], err
    if "max_tokens" not in fields:  # count_tokens takes the same conversation, and no max_tokens
        count = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature", "top_p", "stop_sequences",
                                                            "stream", "metadata")}
        if count != {"model": MODEL, "messages": HI}:
            assert field in bad_request(server, count, "/v1/messages/count_tokens")["message"]


def test_bodies_that_are_not_a_request(server):
    assert "JSON" in bad_request(server, "{not json")["message"]
    assert "object" in bad_request(server, "[1, 2]")["message"]
    nested = '{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": ' + "[" * 5000 + "]" * 5000 + "}]}"
    bad_request(server, nested)
    deep = {"model": MODEL, "max_tokens": 1, "messages": HI, "tools": [{"name": "a", "input_schema": {}}]}
    node: dict = {}
    deep["tools"][0]["input_schema"] = node
    for _ in range(200):  # a schema nested deep: refused or served, never a 500
        node["properties"] = {"x": {}}
        node = node["properties"]["x"]
    status, _, _ = raw(server.port, "POST", "/v1/messages", json.dumps(deep), {"x-api-key": KEY})
    assert status in (200, 400)
    status, _, out = raw(server.port, "GET", "/v1/messages", headers={"x-api-key": KEY})
    assert status == 405 and json.loads(out)["type"] == "error"
    huge = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x" * (17 * 2**20)}]})
    assert bad_request(server, huge, want=413)["type"] == "request_too_large"
