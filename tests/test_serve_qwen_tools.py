"""An agent loop end to end on the Qwen2.5-Coder demo GGUF (its own chat template with tools and
<tool_call> blocks) through the openai client: a demanded call, its result sent back as a tool
message, a text answer; a JSON schema answer. Left alone (tool_choice auto), this 0.5B coder writes
the call as a bare JSON object without <tool_call> tags, which is read as the call (issue 49); a
question no tool answers stays text, the negative control."""

from __future__ import annotations

import json

import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess  # noqa: E402
from test_serve_agents import joined  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}]


@pytest.fixture(scope="module")
def client(qwen_coder_gguf):
    s = ServerProcess(qwen_coder_gguf, "-c", "2048")
    yield openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=600)
    assert s.stop() == 130
    assert "Traceback" not in s.log


def ask(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **{"temperature": 0, "max_tokens": 100, **kw})


def test_agent_loop(client):
    free = ask(client, QUESTION, tools=[WEATHER])  # auto: the model's own choice, a bare JSON call
    assert free.choices[0].finish_reason == "tool_calls" and free.choices[0].message.content is None
    (bare,) = free.choices[0].message.tool_calls
    assert (bare.function.name, json.loads(bare.function.arguments)) == ("get_weather", {"city": "Paris",
                                                                                         "unit": "celsius"})
    prose = ask(client, [{"role": "user", "content": "Write one sentence about the sea."}], tools=[WEATHER])
    assert prose.choices[0].finish_reason == "stop" and not prose.choices[0].message.tool_calls
    assert prose.choices[0].message.content

    r = ask(client, QUESTION, tools=[WEATHER], tool_choice="required")
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) >= 1
    call = msg.tool_calls[0]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert call.function.name == "get_weather" and args["city"] == "Paris" and args["unit"] == "celsius"

    streamed = joined(ask(client, QUESTION, tools=[WEATHER], tool_choice="required", stream=True))
    assert streamed[3] == "tool_calls" and [(c["name"], c["arguments"]) for c in streamed[2]] == \
        [(c.function.name, c.function.arguments) for c in msg.tool_calls]

    history = QUESTION + [msg] + [{"role": "tool", "tool_call_id": c.id,
                                   "content": json.dumps({"temperature": 18, "sky": "sunny"})} for c in msg.tool_calls]
    final = ask(client, history, tools=[WEATHER])
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    assert final.usage.prompt_tokens_details.cached_tokens > 150  # the history's prefix came from the cache


def test_json_schema_answer(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "country": {"type": "string", "maxLength": 40},
                                               "population_millions": {"type": "number"},
                                               "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                             "maxItems": 3}},
              "required": ["city", "country", "population_millions", "landmarks"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    prompt = [{"role": "user", "content": "Tell me about Paris."}]
    prose = ask(client, prompt, max_tokens=40).choices[0].message.content
    with pytest.raises(ValueError):
        json.loads(prose)
    r = ask(client, prompt, response_format=rf, max_tokens=200)
    assert r.choices[0].finish_reason == "stop"
    answer = json.loads(r.choices[0].message.content)
    jsonschema.validate(answer, schema)
    assert answer["city"] == "Paris"
