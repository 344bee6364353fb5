"""Llama 3.1's tool calls end to end (fuelcli/serve/tools.py Llama3Json) through the openai client:
a tiny random Llama-3.1 checkpoint (tests/tiny_models.py "llama31") whose character tokenizer has
Llama 3's header tokens, with a compact copy of the tool parts of Meta's Llama 3.1 chat template:
the functions as JSON in the first user turn, a call as the whole assistant turn `{"name": ...,
"parameters": {...}}`, a result as an `ipython` turn. A demanded call comes out parsed and valid
under the grammar; the negative controls: the random model left alone (tool_choice auto) writes no
call, and the Hermes parser finds none in the Llama-format reply."""

from __future__ import annotations

import json

import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from serve_helpers import ServerProcess, with_tokenizer  # noqa: E402
from test_serve_agents import ADD, SCHEMAS, WEATHER, joined  # noqa: E402

from fuelcli.serve.reply import ReplyParser, whole  # noqa: E402
from fuelcli.serve.tools import Hermes, Llama3Json  # noqa: E402

MODEL = "tiny-llama31"
LLAMA3_SPECIALS = ["<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|python_tag|>"]

# Meta's template (tokenizer_config.json of Llama-3.1-8B-Instruct) with tools_in_user_message's
# default (true) only, and without builtin_tools (brave_search, ...) and date_string: the rest as written
LLAMA31_TOOLS = """\
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: 26 Jul 2024\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    d = with_tokenizer(tiny("llama31"), tmp_path_factory.mktemp("llama-tools") / MODEL, LLAMA3_SPECIALS, LLAMA31_TOOLS)
    config = json.loads((d / "config.json").read_text())  # room for the tools' JSON, a token a character
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return d


@pytest.fixture(scope="module")
def client(checkpoint):
    s = ServerProcess(checkpoint)
    yield openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0)
    assert s.stop() == 130
    assert "Traceback" not in s.log


def ask(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages,
                                          **{"tools": [WEATHER, ADD], "temperature": 0, "max_tokens": 200, **kw})


def only_call(r, name=None):
    """The reply's one call, checked: OpenAI's shape, finish_reason tool_calls, arguments valid."""
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_") and (name is None or call.function.name == name)
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return call


@pytest.mark.parametrize("choice", ["required", "add", "get_weather"])
def test_a_demanded_call_is_parsed_and_valid(client, choice):
    named = choice != "required"
    tool_choice = {"type": "function", "function": {"name": choice}} if named else choice
    r = ask(client, QUESTION, tool_choice=tool_choice, logprobs=True)
    call = only_call(r, choice if named else None)
    # the reply as the model wrote it (its tokens): Llama's JSON call, which the Hermes parser leaves as text
    raw = "".join(t.token for t in r.choices[0].logprobs.content)
    assert list(json.loads(raw)) == ["name", "parameters"], raw
    assert whole(ReplyParser(tools=Hermes()), raw) == (raw, None, [])
    (parsed,) = whole(ReplyParser(tools=Llama3Json()), raw)[2]
    assert parsed["function"] | {"arguments": json.loads(parsed["function"]["arguments"])} == \
        {"name": call.function.name, "arguments": json.loads(call.function.arguments)}
    content, _, calls, finish = joined(ask(client, QUESTION, tool_choice=tool_choice, stream=True))
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_left_alone_the_model_writes_no_call(client):
    r = ask(client, QUESTION, max_tokens=40)
    text = r.choices[0].message.content
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length") and text
    with pytest.raises(ValueError):
        json.loads(text)


def test_agent_loop_call_result_then_text(client, checkpoint):
    """The call goes back as the assistant's turn (content null) with the tool's result; the template
    renders them as Llama 3.1 does (the call's JSON, an ipython turn), and the answer is text."""
    from fuelcli.assembly.loader import open_model

    msg = ask(client, QUESTION, tool_choice="required").choices[0].message
    call = msg.tool_calls[0]
    args = json.loads(call.function.arguments)
    history = QUESTION + [msg, {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
    final = ask(client, history, max_tokens=20)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    tok = open_model(str(checkpoint)).tokenizer
    text = tok.render_chat([QUESTION[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": args}}]},
        history[2]], tools=[WEATHER, ADD])
    want_call = json.dumps({"name": call.function.name, "parameters": args})
    assert f"<|start_header_id|>assistant<|end_header_id|>\n\n{want_call}<|eot_id|>" in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 3}"<|eot_id|>' in text  # tojson of a string
    assert final.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
