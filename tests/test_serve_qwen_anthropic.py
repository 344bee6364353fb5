"""An agent loop through the anthropic client on the Qwen2.5-Coder demo GGUF: a forced call
(tool_choice any), its tool_result, the answer; streamed the same; count_tokens agrees with usage."""

from __future__ import annotations

import json

import anthropic
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess  # noqa: E402
from test_serve_qwen_tools import MODEL, QUESTION, WEATHER  # noqa: E402

pytestmark = pytest.mark.slow
TOOLS = [{"name": "get_weather", "description": WEATHER["function"]["description"],
          "input_schema": WEATHER["function"]["parameters"]}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(qwen_coder_gguf):
    s = ServerProcess(qwen_coder_gguf, "-c", "2048")
    yield anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=600)
    assert s.stop() == 130
    assert "Traceback" not in s.log


def test_agent_loop(client):
    msg = client.messages.create(model=MODEL, max_tokens=100, messages=QUESTION, tools=TOOLS,
                                 tool_choice={"type": "any"}, extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    jsonschema.validate(use.input, TOOLS[0]["input_schema"])
    assert use.name == "get_weather" and use.input == {"city": "Paris", "unit": "celsius"}

    with client.messages.stream(model=MODEL, max_tokens=100, messages=QUESTION, tools=TOOLS,
                                tool_choice={"type": "any"}, extra_body=GREEDY) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content] == [(b.name, b.input) for b in msg.content]

    history = QUESTION + [{"role": "assistant", "content": msg.content},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                        "content": json.dumps({"temperature": 18, "sky": "sunny"})}]}]
    final = client.messages.create(model=MODEL, max_tokens=100, messages=history, tools=TOOLS, extra_body=GREEDY)
    assert final.stop_reason == "end_turn" and [b.type for b in final.content] == ["text"] and final.content[0].text
    assert final.usage.cache_read_input_tokens > 100  # the history's prefix came from the cache
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS)
    assert counted.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens
