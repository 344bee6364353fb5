"""Gemma 4's reply parser (fuelcli/text/gemma4_reply.py): the thought channel as the reasoning, calls
in Gemma's syntax as calls, whatever does not fit as text; the same parts however the text is cut.
The reply forms are the ones the Gemma 4 template writes back (tests/test_gemma4_chat.py) and
llama.cpp's common/parsers/gemma4.cpp reads."""

from __future__ import annotations

import random

import pytest

from fuelcli.serve.reply import ReplyParser
from fuelcli.text.gemma4_reply import Gemma4Parser, parse_arguments

Q = '<|"|>'
CALL = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},units:{Q}celsius{Q}}}<tool_call|>"
REPLY = f"<|channel>thought\nThe user wants the weather.<channel|>Let me look.{CALL}"
PARTS = [("reasoning", "The user wants the weather."), ("content", "Let me look."),
         ("tool_call", {"name": "get_weather", "arguments": {"city": "Paris", "units": "celsius"}})]


def merged(parts):
    out = []
    for kind, value in parts:
        if out and out[-1][0] == kind != "tool_call":
            out[-1] = (kind, out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def parse(text, cuts=None, **kw):
    p = Gemma4Parser(**kw)
    parts, at = [], 0
    for cut in cuts or [len(text)]:
        parts += p.feed(text[at:cut])
        at = cut
    return merged(parts + p.finish())


def test_reasoning_content_and_a_call():
    assert parse(REPLY) == PARTS


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_gives_the_same_parts(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(REPLY)), 12)) + [len(REPLY)]
    assert parse(REPLY, cuts) == PARTS
    assert parse(REPLY, list(range(1, len(REPLY) + 1))) == PARTS  # a character at a time


def test_arguments_in_gemma_syntax():
    text = f"{{a:{Q}x, y{Q},n:-1.5e2,ok:true,none:null,list:[1,{Q}two{Q},[]],obj:{{k:{{}}}}}}"
    assert parse_arguments(text) == {"a": "x, y", "n": -150.0, "ok": True, "none": None,
                                     "list": [1, "two", []], "obj": {"k": {}}}
    assert parse_arguments("{ a : 1 , b : [ ] }") == {"a": 1, "b": []}
    assert parse_arguments("{}") == {}


@pytest.mark.parametrize("text", ["{city:Paris}", '{city:"Paris"}', f"{{city:{Q}Par", "{a:1,}", "{:1}", "{a:NaN}",
                                  "{a:}", "[1]", "{}x", "", "{a:1"])
def test_not_gemma_arguments(text):
    assert parse_arguments(text) is None


def test_a_call_that_does_not_parse_stays_text():
    cut = f"<|tool_call>call:get_weather{{city:{Q}Par"  # max_tokens ended it
    assert parse("Sure." + cut) == [("content", "Sure." + cut)]
    json_args = '<|tool_call>call:get_weather{"city": "Paris"}<tool_call|>'  # JSON is not Gemma's syntax
    assert parse(json_args + " then") == [("content", json_args + " then")]
    assert parse("<|tool_call>get_weather{}<tool_call|>") == [("content", "<|tool_call>get_weather{}<tool_call|>")]


def test_parallel_calls_and_no_thought():
    two = CALL + CALL.replace("Paris", "Rome")
    assert [k for k, _ in parse(two)] == ["tool_call", "tool_call"]
    assert parse(two)[1][1]["arguments"]["city"] == "Rome"
    assert parse("Just an answer.") == [("content", "Just an answer.")]


def test_channels_that_are_not_read():
    # reasoning off (reasoning_format none): the thought channel stays in the content as written
    raw = "<|channel>thought\nThe user wants the weather.<channel|>Let me look."
    assert parse(REPLY, reasoning=False)[:1] == [("content", raw)]
    other = "<|channel>notes\nx<channel|>answer"
    assert parse(other) == [("content", other)]
    # an empty thought and a stray end marker after the answer (Gemma 4 writes both; llama.cpp drops them)
    assert parse("<|channel>thought\n<channel|>Hi.<channel|>") == [("content", "Hi.")]
    # a thought cut off by max_tokens is reasoning
    p = Gemma4Parser()
    assert p.feed("<|channel>thought\nHmm") == [("reasoning", "Hmm")] and p.phase == "reasoning"


def test_negative_control_the_plain_parser_reads_none_of_it():
    """The parse discriminates: the plain reply parser (Qwen's <think>, hermes <tool_call>) finds no
    reasoning and no call in a Gemma 4 reply, and the Gemma 4 parser none in a hermes one."""
    from fuelcli.serve.tools import Hermes

    plain = ReplyParser(tools=Hermes(), reasoning=True)
    parts = plain.feed(REPLY) + plain.finish()
    assert {k for k, _ in parts} == {"content"} and "".join(v for _, v in parts) == REPLY
    hermes = '<think>x</think><tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    assert parse(hermes) == [("content", hermes)]
