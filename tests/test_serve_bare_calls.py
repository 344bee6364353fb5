"""Two things real clients send to /v1/chat/completions: a reply that is a bare JSON call (no
<tool_call> tags, as Qwen2.5-Coder wrote one) is a call when it names a declared tool with
arguments its schema accepts, and text otherwise; an assistant turn with content null and
tool_calls [] is empty content."""

from __future__ import annotations

import json

import pytest

from fuelcli.serve.jobs import Done, ServedModel, chat_job
from fuelcli.serve.json_check import satisfies
from fuelcli.serve.reply import ReplyParser, whole
from fuelcli.serve.responses import ChatFormat
from fuelcli.serve.schemas import ChatRequest, parse
from fuelcli.serve.tools import Function, Hermes, Llama3Json
from fuelcli.text.generate import Stats
from fuelcli.text.tokenizer import Tokenizer
from serve_helpers import CHAT_TEMPLATE, char_tokenizer

WEATHER = Function("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"], "additionalProperties": False}, False)
TIME = Function("get_time", {"type": "object", "properties": {}}, False)
FUNCTIONS = [WEATHER, TIME]
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

CALLS = [  # (id, reply) -> one call, get_weather(city=Paris)
    ("bare", PARIS),
    ("bare with spaces around", f"\n  {PARIS}  \n"),
    ("fenced json", f"```json\n{PARIS}\n```"),
    ("fenced", f"```\n{PARIS}\n```"),
    ("the parameters key", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
]
TEXTS = [  # (id, reply) -> text as written
    ("an undeclared tool", '{"name": "get_stock", "arguments": {"city": "Paris"}}'),
    ("arguments the schema refuses", '{"name": "get_weather", "arguments": {"city": 3}}'),
    ("a required argument missing", '{"name": "get_weather", "arguments": {}}'),
    ("an argument the schema does not have", '{"name": "get_weather", "arguments": {"city": "P", "x": 1}}'),
    ("a key beside name and arguments", '{"name": "get_weather", "arguments": {"city": "P"}, "id": 1}'),
    ("arguments not an object", '{"name": "get_weather", "arguments": "Paris"}'),
    ("text before it", f"Calling: {PARIS}"),
    ("text after it", f"{PARIS} and then"),
    ("text after the fence", f"```json\n{PARIS}\n```\nDone."),
    ("two objects", PARIS + PARIS),
    ("plain JSON data", '{"city": "Paris", "temp": 21}'),
    ("broken JSON", '{"name": "get_weather", "arguments": {"city": "Par'),
    ("prose", "It is sunny in Paris."),
    ("a code block", "```python\nprint(1)\n```"),
]


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _parts(parts):
    content = "".join(t for k, t in parts if k == "content")
    return content, _calls([c for k, c in parts if k == "tool_call"])


@pytest.mark.parametrize("text", [c[1] for c in CALLS], ids=[c[0] for c in CALLS])
def test_a_bare_call_of_a_declared_tool_is_a_call(text):
    content, reasoning, calls = whole(ReplyParser(Hermes(), functions=FUNCTIONS), text)
    assert content is None and reasoning is None
    assert _calls(calls) == [("get_weather", {"city": "Paris"})]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


@pytest.mark.parametrize("text", [c[1] for c in TEXTS], ids=[c[0] for c in TEXTS])
def test_anything_else_stays_text(text):
    assert whole(ReplyParser(Hermes(), functions=FUNCTIONS), text) == (text, None, [])


def test_without_declared_functions_a_bare_call_is_text():
    assert whole(ReplyParser(Hermes()), PARIS) == (PARIS, None, [])  # tool_choice required, named, or no tools
    assert whole(ReplyParser(), PARIS) == (PARIS, None, [])


def test_no_arguments_where_none_are_needed():
    _, _, calls = whole(ReplyParser(Hermes(), functions=FUNCTIONS), '{"name": "get_time"}')
    assert _calls(calls) == [("get_time", {})]


def test_after_reasoning_and_beside_tagged_calls():
    p = ReplyParser(Hermes(), reasoning=True, functions=FUNCTIONS)
    content, reasoning, calls = whole(p, f"<think>\nweather\n</think>\n\n{PARIS}")
    assert (content, reasoning, _calls(calls)) == (None, "weather\n", [("get_weather", {"city": "Paris"})])
    tagged = '{"x": 1}\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    content, _, calls = whole(ReplyParser(Hermes(), functions=FUNCTIONS), tagged)
    assert (content, _calls(calls)) == ('{"x": 1}\n', [("get_time", {})])  # read as before: text, then the call


def test_llama3_fenced_call():
    p = ReplyParser(Llama3Json(), functions=FUNCTIONS)
    assert _calls(whole(p, f"```json\n{PARIS}\n```")[2]) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("text", [c[1] for c in CALLS + TEXTS], ids=[c[0] for c in CALLS + TEXTS])
def test_streamed_in_any_cuts_equals_whole(text):
    p = ReplyParser(Hermes(), functions=FUNCTIONS)
    want = _parts(p.feed(text) + p.finish())
    for i in range(len(text) + 1):
        p = ReplyParser(Hermes(), functions=FUNCTIONS)
        assert _parts(p.feed(text[:i]) + p.feed(text[i:]) + p.finish()) == want, i
    p = ReplyParser(Hermes(), functions=FUNCTIONS)
    assert _parts([part for ch in text for part in p.feed(ch)] + p.finish()) == want


def test_prose_still_streams_at_once():
    p = ReplyParser(Hermes(), functions=FUNCTIONS)
    assert p.feed("It is") == [("content", "It is")]


def test_the_response_says_tool_calls():
    fmt = ChatFormat("m", None, ReplyParser(Hermes(), functions=FUNCTIONS))
    body = fmt.response(PARIS, [], Done("stop", Stats()))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert _calls(choice["message"]["tool_calls"]) == [("get_weather", {"city": "Paris"})]


def test_schema_check():
    s = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}, "u": {"enum": ["c", "f"]},
                                          "tags": {"type": "array", "items": {"type": "string"}},
                                          "r": {"$ref": "#/$defs/r"}},
         "$defs": {"r": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]+$"}]}}}
    assert satisfies({"n": 2, "u": "c", "tags": ["a"], "r": None}, s) and satisfies({"r": "ab"}, s)
    for bad in ({"n": 0}, {"n": True}, {"n": 1.5}, {"u": "k"}, {"tags": [1]}, {"r": "AB"}, []):
        assert not satisfies(bad, s), bad
    assert satisfies({"anything": 1}, {"type": "object", "x-unknown-keyword": 1})
    assert satisfies({}, True) and not satisfies({}, False)


# --- an assistant turn with content null and tool_calls [] ---------------------------------------


@pytest.fixture
def model():
    tok = Tokenizer(char_tokenizer(), CHAT_TEMPLATE, "<s>", "</s>")
    return ServedModel("m", {"m"}, tok, 128, 256, {2}, 0)


def test_assistant_null_content_with_no_calls_is_empty_content(model):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user", "content": "again"}]
    req = parse(ChatRequest, json.dumps({"model": "m", "messages": messages}))
    assert req.messages[1].as_template_message() == {"role": "assistant", "content": ""}
    same = [{**m, "content": m["content"] or ""} for m in messages]
    same[1].pop("tool_calls")
    want = parse(ChatRequest, json.dumps({"model": "m", "messages": same}))
    assert chat_job(req, model, None).prompt_ids == chat_job(want, model, None).prompt_ids


def test_chat_job_reads_bare_calls_only_under_auto(model):
    tmpl = "{% if tools %}<tool_call>{% endif %}" + CHAT_TEMPLATE
    model.tokenizer = Tokenizer(char_tokenizer(), tmpl, "<s>", "</s>")
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    auto = chat_job(parse(ChatRequest, json.dumps(body)), model, None)
    assert [f.name for f in auto.reply["functions"]] == ["get_time"]
    none = chat_job(parse(ChatRequest, json.dumps({**body, "tool_choice": "none"})), model, None)
    assert not none.parser().functions
