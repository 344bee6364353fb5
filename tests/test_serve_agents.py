"""What agents send to `fuel serve`: structured outputs, tool calls, reasoning, through the openai
client, on a tiny random model (a character tokenizer, tests/serve_helpers.py) with a chat template
of Qwen3's shape: tools in the system turn, <tool_call> blocks, <tool_response> turns, and a
generation prompt that opens <think> unless enable_thinking is false (as Qwen3-Thinking's and
DeepSeek-R1's do). The random model, left alone, writes prose (the negative controls); constrained,
its replies parse and validate. A real agent loop on Qwen2.5-Coder is in test_serve_qwen_tools.py."""

from __future__ import annotations

import json

import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess, with_tokenizer  # noqa: E402

MODEL = "tiny-agent"

QWEN3_SHAPED = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}{% for tc in m.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": -99, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["a", "b", "tags"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    "home": {"type": "object", "properties": {"floor": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["floor"], "additionalProperties": False}},
    "required": ["name", "age", "pets", "home"], "additionalProperties": False}


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    d = with_tokenizer(tiny("llama2"), tmp_path_factory.mktemp("agents") / MODEL)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": QWEN3_SHAPED}))
    config = json.loads((d / "config.json").read_text())  # room for the tools' system turn, a token a character
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return d


@pytest.fixture(scope="module")
def server(checkpoint):
    s = ServerProcess(checkpoint)
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


def ask(client, content="Tell me something.", **kw):
    kw = {"model": MODEL, "temperature": 0, "max_tokens": 300, **kw}
    return client.chat.completions.create(messages=[{"role": "user", "content": content}], **kw)


def joined(chunks):
    """A streamed reply put together as OpenAI's clients do: content, reasoning, calls by index."""
    content, reasoning, calls, finish = "", "", {}, None
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += tc.id or ""
            call["name"] += (tc.function.name or "") if tc.function else ""
            call["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def reasoning_of(message):
    return (message.model_extra or {}).get("reasoning_content")


# --- structured outputs ------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=5),
                                      dict(temperature=1.4, seed=9, top_p=1.0)], ids=["greedy", "t1", "t1.4"])
def test_json_schema_reply_validates(client, sampling):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = ask(client, "Describe a person.", response_format=rf, extra_body=NO_THINK, **sampling)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    streamed = joined(ask(client, "Describe a person.", response_format=rf, extra_body=NO_THINK, stream=True,
                          **sampling))
    if "seed" in sampling or sampling["temperature"] == 0:
        assert streamed[0] == r.choices[0].message.content


def test_without_response_format_the_model_writes_prose(client):
    r = ask(client, "Describe a person.", extra_body=NO_THINK)
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content)


def test_json_object_mode(client):
    ended = 0
    for seed in range(6):
        r = ask(client, "Give me JSON", response_format={"type": "json_object"}, extra_body={**NO_THINK,
                "repeat_penalty": 1.5}, temperature=1.0, seed=seed, max_tokens=200)
        text = r.choices[0].message.content
        assert text.startswith("{")
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
            ended += 1
    assert ended >= 1


def test_json_schema_after_the_reasoning(client):
    """The template opens <think>: the schema holds once the reasoning is over, which a random model
    never ends; so the whole reply is reasoning, unconstrained (a grammar from the first token would
    have forced `{`)."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = ask(client, "Describe a person.", response_format=rf, max_tokens=40)
    plain = ask(client, "Describe a person.", max_tokens=40)
    assert reasoning_of(r.choices[0].message) == reasoning_of(plain.choices[0].message) != ""


# --- tool calls --------------------------------------------------------------------------------

def check_calls(message, finish, names=None):
    assert finish == "tool_calls" and message.content is None and message.tool_calls
    for c in message.tool_calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return message.tool_calls


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_tool_choice_required_gives_valid_calls(client, seed):
    sampling = {} if seed is None else {"temperature": 1.0, "seed": seed}
    r = ask(client, "What is the weather in Oslo?", tools=[WEATHER, ADD], tool_choice="required",
            extra_body=NO_THINK, **sampling)
    check_calls(r.choices[0].message, r.choices[0].finish_reason)


def test_named_tool_choice_and_one_call(client):
    for name in ("add", "get_weather"):
        r = ask(client, "Go.", tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": name}},
                extra_body=NO_THINK, temperature=1.0, seed=3)
        calls = check_calls(r.choices[0].message, r.choices[0].finish_reason, {name})
        assert len(calls) == 1  # a named function is called once
    r = ask(client, "Go.", tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False,
            extra_body=NO_THINK, temperature=1.0, seed=4)
    assert len(check_calls(r.choices[0].message, r.choices[0].finish_reason)) == 1


def test_streamed_calls_equal_whole(client):
    kw = dict(tools=[WEATHER, ADD], tool_choice="required", extra_body=NO_THINK)
    whole = ask(client, "Weather?", **kw)
    content, reasoning, calls, finish = joined(ask(client, "Weather?", stream=True, **kw))
    assert finish == "tool_calls" and content == "" and reasoning == ""
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]


def test_tool_choice_auto_and_none(client):
    """auto without strict tools: nothing is constrained; the random model writes text, no call.
    none: the tools stay out of the prompt (as no tools at all)."""
    auto = ask(client, "Hi", tools=[WEATHER], extra_body=NO_THINK, max_tokens=30)
    none = ask(client, "Hi", tools=[WEATHER], tool_choice="none", extra_body=NO_THINK, max_tokens=30)
    bare = ask(client, "Hi", extra_body=NO_THINK, max_tokens=30)
    assert not auto.choices[0].message.tool_calls and auto.choices[0].finish_reason in ("stop", "length")
    assert auto.usage.prompt_tokens > bare.usage.prompt_tokens == none.usage.prompt_tokens
    assert none.choices[0].message.content == bare.choices[0].message.content


def greedy_unmasked(r) -> bool:
    """Whether every greedy token was the model's own argmax (its logprob the top one): no mask bit."""
    return all(t.logprob == t.top_logprobs[0].logprob for t in r.choices[0].logprobs.content)


def test_strict_tool_under_auto_is_lazy(client):
    """A strict tool under tool_choice auto: the text stays free (every greedy token the model's own
    argmax), only a call, once opened, is held to the schema; the control, a demanded call, is masked."""
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    kw = dict(tools=[strict], extra_body=NO_THINK, max_tokens=30, logprobs=True, top_logprobs=1)
    free = ask(client, "Hi", **kw)
    assert not free.choices[0].message.tool_calls and greedy_unmasked(free)
    assert not greedy_unmasked(ask(client, "Hi", tool_choice="required", **kw))


def test_history_with_calls_and_results(client, checkpoint):
    """An assistant turn with tool_calls (content null) and role tool results are rendered by the
    template, as transformers renders them (arguments as objects)."""
    from fuelcli.assembly.loader import open_model

    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": '{"city": "Oslo", "unit": "C"}'}}
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                       max_tokens=5, extra_body=NO_THINK)
    tok = open_model(str(checkpoint)).tokenizer
    want = [messages[0], {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'}]
    text = tok.render_chat(want, template_kwargs={"enable_thinking": False}, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}' in text
    assert "<tool_response>\n{\"temp\": 3}\n</tool_response>" in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_agent_loop_with_the_openai_client(client):
    """Two rounds of calls and results, then a text answer: the client's own message objects are
    sent back as they came."""
    messages = [{"role": "user", "content": "Weather in Lima and Paris, then add 2 and 3."}]
    for round_ in range(2):
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, ADD], temperature=0,
                                           tool_choice="required", max_tokens=200, extra_body=NO_THINK)
        msg = r.choices[0].message
        check_calls(msg, r.choices[0].finish_reason)
        messages.append(msg)
        for c in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": round_})})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, ADD], temperature=0,
                                           tool_choice="none", max_tokens=20, extra_body=NO_THINK)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


# --- reasoning ---------------------------------------------------------------------------------

def test_reasoning_content_apart(client):
    """The template opens <think>: the whole reply of a model that never closes it is reasoning; with
    reasoning_format none it is the content instead, the same text."""
    r = ask(client, "Think.", max_tokens=40)
    raw = ask(client, "Think.", max_tokens=40, extra_body={"reasoning_format": "none"})
    text = raw.choices[0].message.content
    assert "</think>" not in text and reasoning_of(raw.choices[0].message) is None
    assert reasoning_of(r.choices[0].message) == text.lstrip() and r.choices[0].message.content == ""
    content, reasoning, calls, finish = joined(ask(client, "Think.", max_tokens=40, stream=True))
    assert (content, reasoning, calls, finish) == ("", text.lstrip(), [], r.choices[0].finish_reason)


def test_enable_thinking_false(client):
    off = ask(client, "Think.", max_tokens=40, extra_body=NO_THINK)
    on = ask(client, "Think.", max_tokens=40)
    assert reasoning_of(off.choices[0].message) is None and off.choices[0].message.content
    # the template wrote an empty <think>\n\n</think>\n\n instead of opening one
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + len("\n</think>\n\n")


def test_server_default_template_kwargs(checkpoint):
    s = ServerProcess(checkpoint, "--chat-template-kwargs", '{"enable_thinking": false}', "--reasoning-format", "none")
    try:
        c = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0)
        off = ask(c, "Think.", max_tokens=10)
        assert reasoning_of(off.choices[0].message) is None
        on = ask(c, "Think.", max_tokens=10, extra_body={"chat_template_kwargs": {"enable_thinking": True},
                                                         "reasoning_format": "auto"})
        assert on.usage.prompt_tokens < off.usage.prompt_tokens and reasoning_of(on.choices[0].message)
    finally:
        assert s.stop() == 130


# --- OpenAI's bookkeeping fields ----------------------------------------------------------------

def test_openai_known_fields_are_accepted(client):
    base = ask(client, "Hi", max_tokens=8, extra_body=NO_THINK)
    r = ask(client, "Hi", max_tokens=8, store=False, metadata={"user": "u1", "run": "7"}, service_tier="auto",
            prediction={"type": "content", "content": "Hello there"}, extra_body=NO_THINK)
    assert r.choices[0].message.content == base.choices[0].message.content  # without effect
