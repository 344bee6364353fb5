"""`fuel serve` with a Gemma 4 chat template, through the openai client: the thought channel as
`reasoning_content`, the answer as `content`, `<|tool_call>call:NAME{...}<tool_call|>` as
`tool_calls` (its arguments turned from Gemma's syntax into JSON), whole and as streamed deltas;
a cut or malformed call stays text (200); tool_choice required / named and response_format held
to Gemma's syntax by a grammar, strict tools refused in one line; Anthropic's thinking and tool_use
blocks and the Responses API's reasoning and function_call items from the same parser. The engine is
scripted (test_serve_harmony.py's way): it answers each prompt with Gemma 4 tokens chosen by the
user's words, through the real app, worker, the Gemma 4 GGUF vocabulary and its own template
(test_gemma4_chat.py's fixture).

The last serve test runs the tiny random Gemma 4 checkpoint itself, on the CPU engine."""

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
from test_gemma4_chat import TOOLS, gguf_tok, newer_template  # noqa: F401 (fixtures)
from test_harmony import gpt_oss_template  # noqa: F401 (a fixture)
from test_tokenizer_vectors import vocab_dir  # noqa: F401 (a fixture)

from fuelcli.backends.base import Engine
from fuelcli.serve.jobs import ServedModel
from fuelcli.serve.server import bind, make_server, url
from fuelcli.serve.worker import EngineWorker
from fuelcli.text.reply_formats import turn_end_ids

N_CTX = 8192
Q = '<|"|>'
WEATHER = TOOLS[0]
ARGS = {"city": "Paris", "units": "celsius"}
REPLIES = {  # the user's word -> the model's reply, ending at its turn-ending token (an EOS)
    "greet": "<|channel>thought\nThe user says hello. Reply kindly.<channel|>Hello! How can I help?<turn|>",
    "weather": f"<|channel>thought\nNeed the weather: call the tool.<channel|>"
               f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},units:{Q}celsius{Q}}}<tool_call|><|tool_response>",
    "two": f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
           f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}}}<tool_call|><|tool_response>",
    "json": '<|channel>thought\nFormat it.<channel|>{"answer": 42}<turn|>',
    "broken": f"<|channel>thought\nHmm.<channel|><|tool_call>call:get_weather{{city:{Q}Par",  # then max_tokens
    "garbled": '<|tool_call>call:get_weather{"city": "Paris"}<tool_call|><turn|>',  # JSON: not Gemma's syntax
    "direct": "42<turn|>",
}


class Gemma4Engine(Engine):
    """Answers the prompt with REPLIES[word] for the first word of REPLIES in its last user turn
    (after a tool's result: the answer), one token a step; records each prompt it was given."""

    def __init__(self, tok):
        sizes = {"num_layers": 0, "hidden_size": 0, "q_dim": 0, "kv_dim": 0, "head_dim": 0, "intermediate_size": 0,
                 "moe_intermediate_size": 0, "num_experts": 0, "blocks": ()}
        self.vocab = tok.vocab_size
        super().__init__(SimpleNamespace(max_position=N_CTX, vocab_size=self.vocab, **sizes), N_CTX)
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
            user = prompt[prompt.rfind("<|turn>user"):]
            user = "" if "<tool_response|>" in user else user  # after a tool's result: the answer
            word = next((w for w in REPLIES if w in user), "direct")
            self.reply, self.at = self.tok.encode(REPLIES[word], add_special_tokens=False), 0
        logits = np.zeros((1, self.vocab), np.float32)
        logits[0, self.reply[min(self.at, len(self.reply) - 1)]] = 50.0
        self.at += 1
        return logits


class Served:
    def __init__(self, tok):
        self.engine = Gemma4Engine(tok)
        eos = {tok.eos_token_id} | turn_end_ids(tok)
        self.model = ServedModel("gemma4-scripted", {"gemma4-scripted"}, tok, N_CTX, tok.vocab_size, eos, 0)
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
def served(gguf_tok):  # noqa: F811
    s = Served(gguf_tok)
    yield s
    s.close()


def ask(s, content, **kw):
    return s.client.chat.completions.create(model="gemma4", messages=[{"role": "user", "content": content}],
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


def test_both_templates_are_read_as_gemma_4_and_the_turn_ends_at_its_markers(gguf_tok, newer_template,  # noqa: F811
                                                                              gpt_oss_template):  # noqa: F811
    from serve_helpers import CHAT_TEMPLATE

    from fuelcli.text.reply_formats import GEMMA4, HARMONY, reply_format

    assert reply_format(gguf_tok.chat_template) is GEMMA4 and reply_format(newer_template) is GEMMA4
    assert reply_format(CHAT_TEMPLATE) is None and reply_format(None) is None
    assert reply_format(gpt_oss_template) is HARMONY
    ids = {gguf_tok.backend.token_to_id(t) for t in ("<turn|>", "<|tool_response>")}
    assert turn_end_ids(gguf_tok) == ids == {106, 50}


def test_reasoning_and_content(served):
    r = ask(served, "greet me", extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert "<|think|>" in served.engine.prompts[-1] and served.engine.prompts[-1].endswith("<|turn>model\n")
    msg = r.choices[0].message
    assert (msg.content, reasoning_of(msg)) == ("Hello! How can I help?", "The user says hello. Reply kindly.")
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    content, reasoning, calls, finish, n = joined(ask(served, "greet me again", stream=True))
    assert (content, reasoning, calls, finish) == (msg.content, reasoning_of(msg), [], "stop")
    assert n > 5  # the reasoning streams token by token, not at the channel's end


def test_a_tool_call(served):
    r = ask(served, "weather in Paris?", tools=[WEATHER])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert reasoning_of(msg) == "Need the weather: call the tool."
    (call,) = msg.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", ARGS)
    assert "<|tool>declaration:get_weather{" in served.engine.prompts[-1]
    content, reasoning, calls, finish, _ = joined(ask(served, "weather in Paris, streamed?", tools=[WEATHER],
                                                      stream=True))
    assert (content, reasoning, finish) == ("", "Need the weather: call the tool.", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", ARGS)]
    # the call and its result go back into the template in Gemma's syntax, the result on the calling turn
    history = [{"role": "user", "content": "weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in msg.tool_calls]},
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    final = served.client.chat.completions.create(model="gemma4", messages=history, tools=[WEATHER], max_tokens=50)
    assert final.choices[0].message.content == "42"
    assert (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},units:{Q}celsius{Q}}}<tool_call|>"
            "<|tool_response>response:get_weather{temperature:18}<tool_response|>") in served.engine.prompts[-1]


def test_parallel_calls(served):
    r = ask(served, "two cities", tools=[WEATHER])
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == ["Paris", "Rome"]
    assert len({c.id for c in r.choices[0].message.tool_calls}) == 2


def test_no_thought_a_cut_call_and_a_garbled_one(served):
    r = ask(served, "direct question")
    assert (r.choices[0].message.content, reasoning_of(r.choices[0].message)) == ("42", None)
    # a call cut off by max_tokens is no call: its text stays, and the reply is 200
    text = REPLIES["broken"]
    r = ask(served, "broken call", tools=[WEATHER], max_tokens=len(served.engine.tok.encode(text, add_special_tokens=False)))
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and not msg.tool_calls and reasoning_of(msg) == "Hmm."
    assert msg.content == f"<|tool_call>call:get_weather{{city:{Q}Par"
    # a call not in Gemma's syntax is text as written, whole and streamed
    want = REPLIES["garbled"].removesuffix("<turn|>")
    r = ask(served, "garbled call", tools=[WEATHER])
    assert (r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason) == \
        (want, None, "stop")
    content, _, calls, finish, _ = joined(ask(served, "garbled call, streamed", tools=[WEATHER], stream=True))
    assert (content, calls, finish) == (want, [], "stop")


def test_reasoning_format_none_keeps_the_reply_as_written(served):
    """The negative control in the server: with the parse off, the markers reach the content."""
    r = ask(served, "greet raw", extra_body={"reasoning_format": "none"})
    assert r.choices[0].message.content == REPLIES["greet"].removesuffix("<turn|>")
    assert reasoning_of(r.choices[0].message) is None


def test_a_demanded_call_and_a_schema(served):
    """tool_choice required or named and response_format constrain a Gemma 4 reply through its
    markers (a grammar over their token ids; test_grammar_refuses_what_gemma_would_not_write checks
    what it refuses); the scripted replies keep to them, so they come back the same."""
    pytest.importorskip("llguidance")
    for i, kw in enumerate(({"tool_choice": "required"},
                            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}})):
        r = ask(served, f"weather, please ({i})", tools=[WEATHER], **kw)  # a new prompt each: the script restarts
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", ARGS)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    for i, rf in enumerate(({"type": "json_object"}, {"type": "json_schema", "json_schema": {
            "name": "a", "schema": schema, "strict": True}})):
        r = ask(served, f"json answer ({i})", response_format=rf,
                extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert json.loads(r.choices[0].message.content) == {"answer": 42}
        assert reasoning_of(r.choices[0].message) == "Format it."


def test_strict_tools_are_refused_in_one_line(served):
    pytest.importorskip("llguidance")
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    for choice in ("auto", "required"):
        status, _, body = raw(served.port, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "weather"}], "tools": [strict], "tool_choice": choice}))
        assert_error_shape(status, body, 400, "strict tools are not supported with Gemma 4")


def test_grammar_refuses_what_gemma_would_not_write(gguf_tok):  # noqa: F811
    """The demanded call's grammar accepts the scripted call and refuses another function, JSON
    arguments and plain text: it holds the reply to Gemma's syntax."""
    llg = pytest.importorskip("llguidance")
    from fuelcli.serve.gemma4 import Gemma4Tools
    from fuelcli.serve.tools import Function
    from fuelcli.text import grammar as g

    spec = Gemma4Tools(gguf_tok).grammar([Function("get_weather", WEATHER["function"]["parameters"], False)],
                                         parallel=True, lazy=False, strict=False).spec
    lt = g.ll_tokenizer(gguf_tok, gguf_tok.vocab_size, {1, 106, 50})

    def accepts(text):
        m = llg.LLMatcher(lt, spec, log_level=0)
        return all(m.consume_token(i) for i in gguf_tok.encode(text, add_special_tokens=False)) and m.is_accepting()

    ok = REPLIES["weather"].removesuffix("<|tool_response>")
    assert accepts(ok) and accepts(REPLIES["two"].removesuffix("<|tool_response>"))
    assert not accepts(ok.replace("get_weather", "get_time"))
    assert not accepts(REPLIES["garbled"].removesuffix("<turn|>"))
    assert not accepts("Hello! How can I help?")


def test_anthropic_messages(served):
    import anthropic

    client = anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0)
    m = client.messages.create(model="gemma4", max_tokens=400, messages=[{"role": "user", "content": "greet"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == \
        [("thinking", "The user says hello. Reply kindly."), ("text", "Hello! How can I help?")]
    tool = {"name": "get_weather", "description": "weather", "input_schema": WEATHER["function"]["parameters"]}
    m = client.messages.create(model="gemma4", max_tokens=400, tools=[tool],
                               messages=[{"role": "user", "content": "weather?"}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[1].input == ARGS
    with client.messages.stream(model="gemma4", max_tokens=400, tools=[tool],
                                messages=[{"role": "user", "content": "weather, streamed?"}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.content[1].input == ARGS


def test_responses_api(served):
    r = served.client.responses.create(model="gemma4", input="greet")
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output_text == "Hello! How can I help?"
    assert r.output[0].content[0].text == "The user says hello. Reply kindly."
    tool = {"type": "function", **WEATHER["function"]}
    r = served.client.responses.create(model="gemma4", input="weather?", tools=[tool])
    assert [i.type for i in r.output] == ["reasoning", "function_call"]
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("get_weather", ARGS)


GEMMA4_SPECIALS = ["<unk>", "<bos>", "<eos>", "<turn|>", "<|tool_response>", "<|turn>", "<|channel>", "<channel|>",
                   "<|tool_call>", "<tool_call|>", "<tool_response|>", Q, "<|tool>", "<tool|>", "<|think|>"]


def test_the_tiny_gemma4_checkpoint(tiny, gguf_tok, tmp_path):  # noqa: F811
    """The tiny random Gemma 4 (E2B-shaped) with a char vocabulary whose markers are special tokens
    (as a tokenizer.json has them) and Gemma 4's template, served for real: a random model writes no
    Gemma 4 syntax, so this checks the path (prompt, tokens with their specials, the parser on
    whatever comes) answers 200 with the OpenAI fields, whole and streamed."""
    from serve_helpers import ServerProcess, with_tokenizer

    d = with_tokenizer(tiny("gemma4_e2b"), tmp_path / "gemma4_chat", GEMMA4_SPECIALS, gguf_tok.chat_template)
    conf = json.loads((d / "config.json").read_text())  # a char vocabulary makes the tools' prompt ~400 tokens
    (d / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 2048}))
    from fuelcli.assembly.loader import open_model

    m = open_model(str(d))  # the turn ends at <turn|> and <|tool_response>, which the config does not name
    ends = {m.tokenizer.backend.token_to_id(t) for t in ("<turn|>", "<|tool_response>")}
    assert ends <= m.eos_ids() and 2 in m.eos_ids() and not ends & set(m.cfg.eos_token_ids)
    assert m.tokenizer.is_special(m.tokenizer.backend.token_to_id("<|channel>"))
    s = ServerProcess(d, "-c", "2048")
    try:
        client = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=600)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=12,
                                           tools=[WEATHER])
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert isinstance(r.choices[0].message.content, str) or r.choices[0].message.tool_calls
        *_, finish, _ = joined(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=12, stream=True, temperature=0))
        assert finish in ("stop", "length", "tool_calls")
    finally:
        assert s.stop() == 130
    assert "Traceback" not in s.log


def test_run_and_chat_show_the_reasoning_and_keep_the_answer(gguf_tok):  # noqa: F811
    """`fuel run` and `fuel chat` (generate with a reply_formats.Readable, ChatSession): the reasoning
    shown between <think> and </think>, then the answer; a call as NAME(ARGUMENTS); the conversation
    keeps the answer as the content and the reasoning as reasoning_content."""
    from fuelcli.text.chat import ChatSession
    from fuelcli.text.generate import Sampler, SamplerParams, Stats

    engine = Gemma4Engine(gguf_tok)
    session = ChatSession(engine, gguf_tok, Sampler(SamplerParams(temp=0)), {1} | turn_end_ids(gguf_tok))
    shown = "".join(session.reply(session.prepare("greet"), Stats()))
    assert shown == "<think>\nThe user says hello. Reply kindly.\n</think>\n\nHello! How can I help?"
    assert session.messages[-1] == {"role": "assistant", "content": "Hello! How can I help?",
                                    "reasoning_content": "The user says hello. Reply kindly."}
    shown = "".join(session.reply(session.prepare("and the weather?"), Stats()))
    assert shown == ('<think>\nNeed the weather: call the tool.\n</think>\n\n'
                     'get_weather({"city": "Paris", "units": "celsius"})')
    assert ("<|turn>user\ngreet<turn|>\n<|turn>model\nHello! How can I help?<turn|>\n"
            "<|turn>user\nand the weather?<turn|>") in engine.prompts[-1]
