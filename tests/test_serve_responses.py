"""OpenAI's Responses API (POST /v1/responses) through the openai client's responses.create, on the
tiny random model with the Qwen3-shaped template of test_serve_agents.py: text, reasoning items,
function calls and their outputs in a follow-up input, previous_response_id (and store false),
text.format json_schema, streaming, and malformed bodies (400 naming the field, never a 500). The
same request through /v1/chat/completions is the control."""

from __future__ import annotations

import json

import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess, assert_error_shape, raw, with_tokenizer  # noqa: E402
from test_serve_agents import ADD, PERSON, QWEN3_SHAPED, WEATHER  # noqa: E402

MODEL = "tiny-agent"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, ADD)]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    d = with_tokenizer(tiny("llama2"), tmp_path_factory.mktemp("responses") / MODEL)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": QWEN3_SHAPED}))
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return d


@pytest.fixture(scope="module")
def server(checkpoint):
    s = ServerProcess(checkpoint, "--metrics")
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


def create(client, input="Tell me something.", **kw):
    kw = {"model": MODEL, "temperature": 0, "max_output_tokens": 200, "extra_body": NO_THINK, **kw}
    return client.responses.create(input=input, **kw)


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body=NO_THINK, **kw)


def calls_of(r):
    calls = [o for o in r.output if o.type == "function_call"]
    for c in calls:
        assert c.call_id.startswith("call_") and c.id.startswith("fc_") and c.status == "completed"
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    return calls


def test_text_as_chat_completions(client):
    r = create(client, "Hi", instructions="Be brief.", max_output_tokens=30)
    c = chat(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], max_tokens=30)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output_text == c.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (c.usage.prompt_tokens, 30)
    assert r.instructions == "Be brief." and r.max_output_tokens == 30 and r.temperature == 0


def test_items_input_and_stop(client):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    r = create(client, items, max_output_tokens=30)
    assert r.output_text == create(client, "Hi", instructions="Be brief.", max_output_tokens=30).output_text


def test_reasoning_item(client):
    """The template opens <think>; the random model never closes it: the reply is one reasoning item."""
    r = create(client, "Think.", max_output_tokens=40, extra_body={})
    assert [o.type for o in r.output] == ["reasoning"] and r.output[0].content[0].type == "reasoning_text"
    assert r.output[0].content[0].text and r.output_text == ""


def test_function_calls_and_their_outputs(client):
    """A demanded call, its output in a follow-up input (the output items sent back as they came),
    then a text answer; the same follow-up through previous_response_id."""
    first = create(client, "Weather in Lima, then add 2 and 3.", tools=TOOLS, tool_choice="required",
                   parallel_tool_calls=False)
    calls = calls_of(first)
    assert calls and first.status == "completed"
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"ok": 1})} for c in calls]
    items = [{"role": "user", "content": "Weather in Lima, then add 2 and 3."}] + \
        [o.model_dump(exclude_none=True) for o in first.output] + outputs
    final = create(client, items, tools=TOOLS, tool_choice="none", max_output_tokens=20)
    assert final.output_text and not calls_of(final)
    chained = create(client, outputs, tools=TOOLS, tool_choice="none", max_output_tokens=20,
                     previous_response_id=first.id)
    assert chained.output_text == final.output_text and chained.previous_response_id == first.id
    assert chained.usage.input_tokens == final.usage.input_tokens
    named = create(client, "Go.", tools=TOOLS, tool_choice={"type": "function", "name": "add"})
    assert [c.name for c in calls_of(named)] == ["add"]


def test_previous_response_id_and_store(client):
    first = create(client, "Hi", max_output_tokens=10)
    second = create(client, "Again", max_output_tokens=10, previous_response_id=first.id)
    whole = create(client, [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
                            {"role": "user", "content": "Again"}], max_output_tokens=10)
    assert second.output_text == whole.output_text and second.usage.input_tokens == whole.usage.input_tokens
    unstored = create(client, "Hi", max_output_tokens=10, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        create(client, "Again", previous_response_id=unstored.id)
    with pytest.raises(openai.NotFoundError) as e:
        create(client, "Again", previous_response_id="resp_unknown")
    assert e.value.body["param"] == "previous_response_id"


def test_json_schema_format(client):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    r = create(client, "Who?", text=fmt, max_output_tokens=300)
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema"


def test_streaming_text_and_calls(client):
    whole = create(client, "Hi", max_output_tokens=30)
    events = list(create(client, "Hi", max_output_tokens=30, stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output[0].content[0].text == whole.output_text

    kw = dict(tools=TOOLS, tool_choice="required")
    calls = calls_of(create(client, "Weather?", **kw))
    with client.responses.stream(model=MODEL, input="Weather?", temperature=0, max_output_tokens=200,
                                 extra_body=NO_THINK, **kw) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    assert [(c.name, c.arguments) for c in calls_of(final)] == [(c.name, c.arguments) for c in calls]


def test_streamed_reasoning(client):
    whole = create(client, "Think.", max_output_tokens=40, extra_body={})
    events = list(create(client, "Think.", max_output_tokens=40, extra_body={}, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == whole.output[0].content[0].text


def test_metrics_count_the_endpoint(client, server):
    create(client, "Hi", max_output_tokens=2)
    status, _, out = raw(server.port, "GET", "/metrics")
    assert status == 200 and 'fuel_requests_total{endpoint="responses",finish_reason="length"}' in out.decode()


CALLED = [{"role": "user", "content": "Hi"},
          {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{}"}]
BAD = [  # (id, body fields over a good body, the field the message names)
    ("input missing", {"input": None}, "input"),
    ("input a number", {"input": 3}, "input"),
    ("input empty", {"input": []}, "input"),
    ("an item not an object", {"input": ["Hi"]}, "input[0]"),
    ("an unknown item type", {"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ("an item without a type or role", {"input": [{"content": "Hi"}]}, "input[0].type"),
    ("a role unknown", {"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ("content missing", {"input": [{"role": "user"}]}, "input[0].content"),
    ("content a number", {"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    ("an image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ("output_text in a user turn", {"input": [{"role": "user", "content": [{"type": "output_text", "text": "a"}]}]},
     "input[0].content[0].type"),
    ("a part's text a number", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
     "input[0].content[0].text"),
    ("an unknown item field", {"input": [{"role": "user", "content": "a", "x": 1}]}, "input[0].x"),
    ("function_call without call_id", {"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]},
     "input[0].call_id"),
    ("function_call arguments an object", {"input": [{"type": "function_call", "call_id": "c", "name": "add",
                                                      "arguments": {}}]}, "input[0].arguments"),
    ("function_call arguments not JSON", {"input": [{"type": "function_call", "call_id": "c", "name": "add",
                                                     "arguments": "{oops"}]}, "input[0].arguments"),
    ("an output for an unknown call", {"input": CALLED + [{"type": "function_call_output", "call_id": "call_2",
                                                           "output": "5"}]}, "input[2].call_id"),
    ("an output without a call", {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "5"}]},
     "input[0].call_id"),
    ("an output a number", {"input": CALLED + [{"type": "function_call_output", "call_id": "call_1", "output": 5}]},
     "input[2].output"),
    ("instructions a list", {"instructions": ["a"]}, "instructions"),
    ("max_output_tokens a string", {"max_output_tokens": "5"}, "max_output_tokens"),
    ("max_output_tokens zero", {"max_output_tokens": 0}, "max_output_tokens"),
    ("temperature a string", {"temperature": "0"}, "temperature"),
    ("a tool of another type", {"tools": [{"type": "web_search"}]}, "tools[0]"),
    ("a tool without a name", {"tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ("tool_choice unknown", {"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
    ("tool_choice a function not declared", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "x"}},
     "tool_choice"),
    ("text.format unknown", {"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ("json_schema without a name", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ("reasoning effort", {"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ("store a string", {"store": "no"}, "store"),
    ("an unknown field", {"frequency_penalty": 1}, "frequency_penalty"),
]


@pytest.mark.parametrize("fields, field", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_bodies_name_the_field(server, fields, field):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 5, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    status, _, out = raw(server.port, "POST", "/v1/responses", json.dumps(body))
    err = assert_error_shape(status, out, 400)
    assert field in err["message"] or err["param"] == field, err


def test_bodies_that_are_not_a_request(server):
    assert_error_shape(*raw(server.port, "POST", "/v1/responses", "{not json")[::2], 400, "JSON")
    assert_error_shape(*raw(server.port, "POST", "/v1/responses", "[1]")[::2], 400, "object")
    nested = '{"model": "m", "input": ' + "[" * 5000 + "]" * 5000 + "}"
    assert_error_shape(*raw(server.port, "POST", "/v1/responses", nested)[::2], 400)
    huge = json.dumps({"model": MODEL, "input": "x" * (17 * 2**20)})
    assert_error_shape(*raw(server.port, "POST", "/v1/responses", huge)[::2], 413)
