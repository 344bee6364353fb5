"""`fuel serve` with a gpt-oss chat template, through the openai client: the harmony reply's analysis
as `reasoning_content`, final as `content`, a call to functions.NAME as `tool_calls`, whole and as
streamed deltas; reasoning_effort into the template; Anthropic's thinking and tool_use blocks and the
Responses API's reasoning and function_call items from the same parser. The engine is scripted (the
test_serve_worker.py way): it answers each prompt with harmony tokens chosen by the user's words,
through the real app, worker, tokenizer and gpt-oss's own template (test_harmony.py's fixture).

The last test serves the tiny random gpt-oss checkpoint itself, on the CPU engine."""

from __future__ import annotations

import json
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from serve_helpers import assert_error_shape, raw
from test_harmony import SPECIALS, WEATHER, gpt_oss_template, harmony_tokenizer  # noqa: F401 (a fixture)

from fuelcli.backends.base import Engine
from fuelcli.serve.jobs import ServedModel
from fuelcli.serve.server import bind, make_server, url
from fuelcli.serve.worker import EngineWorker
from fuelcli.text.harmony import turn_end_ids

N_CTX = 8192
REPLIES = {  # the user's word -> the model's reply (its turn-ending token is the EOS)
    "greet": "<|channel|>analysis<|message|>The user says hello. Reply kindly.<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
    "weather": "<|channel|>analysis<|message|>Need the weather: call the tool.<|end|>"
               "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
               '{"city": "Paris", "unit": "celsius"}<|call|>',
    "direct": "<|channel|>final<|message|>42<|return|>",
    "json": '<|channel|>analysis<|message|>Format it.<|end|><|start|>assistant<|channel|>final<|message|>'
            '{"answer": 42}<|return|>',
    "broken": '<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>commentary '
              'to=functions.get_weather <|constrain|>json<|message|>{"city": "Par',  # then max_tokens
}


class HarmonyEngine(Engine):
    """Answers the prompt with REPLIES[word] for the first word of REPLIES in its last message,
    one token a step; records each prompt it was given."""

    def __init__(self, tok):
        sizes = dict(num_layers=0, hidden_size=0, q_dim=0, kv_dim=0, head_dim=0, intermediate_size=0,
                     moe_intermediate_size=0, num_experts=0, blocks=())
        super().__init__(SimpleNamespace(max_position=N_CTX, vocab_size=256, **sizes), N_CTX)
        self.tok, self.seq, self.prompts, self.reply, self.at = tok, [], [], [0], 0

    @property
    def kv_bytes(self):
        return 0

    def prefill(self, tokens, all_logits=False, hidden=False):
        tokens = self.check(tokens).tolist()
        self.seq = self.seq[:self.pos] + tokens
        self.pos += len(tokens)
        if len(tokens) > 1:  # a prompt (the worker prefills in one chunk here): a new reply starts
            prompt = self.tok.decode(self.seq)
            self.prompts.append(prompt)
            last = prompt[prompt.rfind("<|start|>", 0, prompt.rfind("<|start|>")):]  # the last message
            user = last if last.startswith("<|start|>user") else ""  # after a tool's result: the answer
            word = next((w for w in REPLIES if w in user), "direct")
            self.reply, self.at = self.tok.encode(REPLIES[word], add_special_tokens=False), 0
        logits = np.zeros((1, 256), np.float32)
        logits[0, self.reply[min(self.at, len(self.reply) - 1)]] = 10.0
        self.at += 1
        return logits


class Served:
    def __init__(self, template: str):
        tok = harmony_tokenizer(template)
        self.engine = HarmonyEngine(tok)
        eos = turn_end_ids(tok)
        self.model = ServedModel("gpt-oss-scripted", {"gpt-oss-scripted"}, tok, N_CTX, 256, eos, 0)
        self.worker = EngineWorker(self.engine, tok, eos, queue_size=4, prefill_chunk=N_CTX)
        sock = bind("127.0.0.1", 0)
        self.url, self.port = url(sock), sock.getsockname()[1]
        self.server = make_server(self.model, self.worker, None, log_level="warning")
        self.worker.start()
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def close(self):
        self.worker.stop()
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.join(10)
        logging.getLogger("fuel.serve").handlers.clear()


@pytest.fixture(scope="module")
def served(gpt_oss_template):
    s = Served(gpt_oss_template)
    yield s
    s.close()


def ask(s, content, **kw):
    return s.client.chat.completions.create(model="gpt-oss", messages=[{"role": "user", "content": content}],
                                            **{"max_tokens": 400, **kw})


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def joined(chunks):
    """A streamed reply put together as OpenAI's clients do: content, reasoning, calls by index."""
    content, reasoning, calls, finish, n = "", "", {}, None, 0
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        n += bool((d.model_extra or {}).get("reasoning_content"))
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += tc.id or ""
            call["name"] += (tc.function.name or "") if tc.function else ""
            call["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, n


def test_reasoning_and_content(served):
    r = ask(served, "greet me")
    msg = r.choices[0].message
    assert (msg.content, reasoning_of(msg)) == ("Hello! How can I help?", "The user says hello. Reply kindly.")
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    content, reasoning, calls, finish, n = joined(ask(served, "greet me again", stream=True))
    assert (content, reasoning, calls, finish) == (msg.content, reasoning_of(msg), [], "stop")
    assert n > 5  # the reasoning streams token by token, not at the message's end


def test_a_tool_call(served):
    r = ask(served, "weather in Paris?", tools=[WEATHER])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert reasoning_of(msg) == "Need the weather: call the tool."
    (call,) = msg.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "unit": "celsius"})
    prompt = served.engine.prompts[-1]
    assert "namespace functions {" in prompt and prompt.endswith("<|start|>user<|message|>weather in Paris?<|end|>"
                                                                 "<|start|>assistant")
    content, reasoning, calls, finish, _ = joined(ask(served, "weather in Paris, streamed?", tools=[WEATHER],
                                                      stream=True))
    assert (content, reasoning, finish) == ("", "Need the weather: call the tool.", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris",
                                                                                         "unit": "celsius"})]
    # the call and its result go back into the template: the call's analysis is kept, as gpt-oss expects
    history = [{"role": "user", "content": "weather in Paris?"}, {"role": "assistant", "content": None, "reasoning_content": reasoning_of(msg),
                                                              "tool_calls": [c.model_dump() for c in msg.tool_calls]},
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    final = served.client.chat.completions.create(model="gpt-oss", messages=history, tools=[WEATHER], max_tokens=50)
    assert final.choices[0].message.content == "42"
    assert ("<|channel|>analysis<|message|>Need the weather: call the tool.<|end|><|start|>assistant to=functions."
            'get_weather<|channel|>commentary json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>') in served.engine.prompts[-1]


def test_no_analysis_and_a_cut_call(served):
    r = ask(served, "direct question")
    assert (r.choices[0].message.content, reasoning_of(r.choices[0].message)) == ("42", None)
    # a call cut off by max_tokens is no call: its text stays, and the reply is 200
    text = REPLIES["broken"]
    r = ask(served, "broken call", tools=[WEATHER], max_tokens=len(served.engine.tok.encode(text, add_special_tokens=False)))
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and not msg.tool_calls and reasoning_of(msg) == "Hmm."
    assert msg.content.endswith('{"city": "Par') and "to=functions.get_weather" in msg.content


def test_reasoning_effort_reaches_the_template(served):
    ask(served, "greet low", reasoning_effort="low")
    assert "\nReasoning: low\n" in served.engine.prompts[-1]
    ask(served, "greet high", extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}})
    assert "\nReasoning: high\n" in served.engine.prompts[-1]
    ask(served, "greet default")
    assert "\nReasoning: medium\n" in served.engine.prompts[-1]
    status, _, body = raw(served.port, "POST", "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}))
    assert_error_shape(status, body, 400, "reasoning_effort")


def test_a_demanded_call_and_a_schema(served):
    """tool_choice required or named, a strict tool and response_format constrain a harmony reply
    through its special tokens (a grammar over <|channel|> and the rest, test_harmony.py checks what
    it refuses); the scripted replies keep to them, so they come back the same."""
    pytest.importorskip("llguidance")
    want = ("get_weather", {"city": "Paris", "unit": "celsius"})
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    for i, kw in enumerate(({"tools": [WEATHER], "tool_choice": "required"},
               {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
               {"tools": [strict]})):
        r = ask(served, f"weather, please ({i})", **kw)  # a new prompt each: the engine's script restarts
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and (call.function.name, json.loads(call.function.arguments)) == want
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    for i, rf in enumerate(({"type": "json_object"}, {"type": "json_schema", "json_schema": {
            "name": "a", "schema": schema, "strict": True}})):
        r = ask(served, f"json answer ({i})", response_format=rf)
        assert json.loads(r.choices[0].message.content) == {"answer": 42}
        assert reasoning_of(r.choices[0].message) == "Format it."


def test_reasoning_format_none_keeps_the_reply_as_written(served):
    r = ask(served, "greet raw", extra_body={"reasoning_format": "none"})
    assert r.choices[0].message.content == REPLIES["greet"].removesuffix("<|return|>")
    assert reasoning_of(r.choices[0].message) is None


def test_anthropic_messages(served):
    import anthropic

    client = anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0)
    m = client.messages.create(model="gpt-oss", max_tokens=400, messages=[{"role": "user", "content": "greet"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == \
        [("thinking", "The user says hello. Reply kindly."), ("text", "Hello! How can I help?")]
    tool = {"name": "get_weather", "description": "weather", "input_schema": WEATHER["function"]["parameters"]}
    m = client.messages.create(model="gpt-oss", max_tokens=400, tools=[tool],
                               messages=[{"role": "user", "content": "weather?"}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[1].input == {"city": "Paris", "unit": "celsius"}


def test_responses_api(served):
    r = served.client.responses.create(model="gpt-oss", input="greet", reasoning={"effort": "low"})
    assert "\nReasoning: low\n" in served.engine.prompts[-1]
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output_text == "Hello! How can I help?"
    assert r.output[0].content[0].text == "The user says hello. Reply kindly."
    tool = {"type": "function", **WEATHER["function"]}
    r = served.client.responses.create(model="gpt-oss", input="weather?", tools=[tool])
    assert [i.type for i in r.output] == ["reasoning", "function_call"]
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("get_weather", {"city": "Paris", "unit": "celsius"})


def test_the_tiny_gpt_oss_checkpoint(tiny, gpt_oss_template, tmp_path):
    """The tiny random gpt-oss with a harmony vocabulary and gpt-oss's template, served for real: a random
    model writes no harmony, so this checks the path (prompt, tokens with their specials, the parser
    on whatever comes) answers 200 with the OpenAI fields, whole and streamed."""
    from serve_helpers import ServerProcess, with_tokenizer

    d = with_tokenizer(tiny("gpt_oss"), tmp_path / "gpt_oss_harmony", ["<unk>"] + SPECIALS, gpt_oss_template)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "bos_token": "<|startoftext|>",
                                                         "eos_token": "<|return|>"}))
    conf = json.loads((d / "config.json").read_text())  # a char vocabulary makes the template's prompt ~600 tokens
    (d / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 2048}))
    s = ServerProcess(d, "-c", "2048")
    try:
        client = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=600)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=12,
                                           reasoning_effort="low", tools=[WEATHER])
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert isinstance(r.choices[0].message.content, str) or r.choices[0].message.tool_calls
        *_, finish, _ = joined(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=12, stream=True, temperature=0))
        assert finish in ("stop", "length", "tool_calls")
    finally:
        assert s.stop() == 130
    assert "Traceback" not in s.log


def test_run_and_chat_show_the_reasoning_and_keep_the_answer(gpt_oss_template):
    """`fuel run` and `fuel chat` (generate with a reply_formats.Readable, ChatSession): the reasoning shown
    between <think> and </think>, then the answer; the conversation keeps the answer as the content and
    the analysis as `thinking`, so the next turn renders the earlier reply as gpt-oss's template wants."""
    from fuelcli.text.chat import ChatSession
    from fuelcli.text.generate import Sampler, SamplerParams, Stats

    tok = harmony_tokenizer(gpt_oss_template)
    engine = HarmonyEngine(tok)
    session = ChatSession(engine, tok, Sampler(SamplerParams(temp=0)), turn_end_ids(tok))
    shown = "".join(session.reply(session.prepare("greet"), Stats()))
    assert shown == "<think>\nThe user says hello. Reply kindly.\n</think>\n\nHello! How can I help?"
    assert session.messages[-1] == {"role": "assistant", "content": "Hello! How can I help?",
                                    "thinking": "The user says hello. Reply kindly."}
    shown = "".join(session.reply(session.prepare("and the weather?"), Stats()))
    assert shown == ('<think>\nNeed the weather: call the tool.\n</think>\n\n'
                     'get_weather({"city": "Paris", "unit": "celsius"})')
    assert ("<|start|>user<|message|>greet<|end|><|start|>assistant<|channel|>final<|message|>"
            "Hello! How can I help?<|end|><|start|>user<|message|>and the weather?") in engine.prompts[-1]
    assert "Reply kindly" not in engine.prompts[-1]  # earlier analysis is dropped by the template
