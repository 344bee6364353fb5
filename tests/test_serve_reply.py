"""Reading a chat reply back (fuelcli/serve/reply.py): fixed texts of Qwen3 (reasoning, <tool_call>
blocks) and Llama 3.1 (JSON calls), whole and cut at every pair of places as a stream cuts them; the
parts must be the same whichever way the text arrives."""

from __future__ import annotations

import json

import pytest

from fuelcli.serve.reply import ReplyParser, whole
from fuelcli.serve.tools import Hermes, Llama3Json, detect

CALL_F = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
CALL_G = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'

# (id, parser arguments, reply text, content, reasoning, [(name, arguments)])
CASES = [
    ("plain", {}, "Hello <b>world</b>", "Hello <b>world</b>", None, []),
    ("plain keeps leading space", {}, "  hi", "  hi", None, []),
    ("qwen3 thinking", {"reasoning": True}, "<think>\nLet me see.\n</think>\n\nParis.", "Paris.", "Let me see.\n", []),
    ("thinking not at the start", {"reasoning": True}, "So <think>x</think>", "So <think>x</think>", None, []),
    ("<thinking> is not <think>", {"reasoning": True}, "<thinking>x", "<thinking>x", None, []),
    ("unclosed reasoning", {"reasoning": True}, "<think>on and on", "", "on and on", []),
    ("opened by the template", {"reasoning": True, "in_reasoning": True}, "\nhmm</think>\n\nYes", "Yes", "hmm", []),
    ("reasoning off keeps tags", {}, "<think>x</think>y", "<think>x</think>y", None, []),
    ("hermes call", {"tools": Hermes()}, CALL_F, None, None, [("f", {"a": 1})]),
    ("hermes text then calls", {"tools": Hermes()}, "Sure.\n" + CALL_F + "\n" + CALL_G, "Sure.\n", None,
     [("f", {"a": 1}), ("g", {})]),
    ("think then call", {"tools": Hermes(), "reasoning": True}, "<think>\nplan\n</think>\n\n" + CALL_F, None,
     "plan\n", [("f", {"a": 1})]),
    ("unclosed call at the end", {"tools": Hermes()}, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}', None,
     None, [("f", {"a": 1})]),
    ("broken call stays text", {"tools": Hermes()}, "<tool_call>\n{oops}\n</tool_call> after",
     "<tool_call>\n{oops}\n</tool_call> after", None, []),
    ("a call without a name is text", {"tools": Hermes()}, '<tool_call>{"x": 1}</tool_call>',
     '<tool_call>{"x": 1}</tool_call>', None, []),
    ("no tools: the tag is text", {}, CALL_F, CALL_F, None, []),
    ("a lone < is text", {"tools": Hermes()}, "a < b <tool", "a < b <tool", None, []),
    ("llama3 call", {"tools": Llama3Json()}, ' {"name": "f", "parameters": {"a": "x"}}', None, None,
     [("f", {"a": "x"})]),
    ("llama3 python tag", {"tools": Llama3Json()}, '<|python_tag|>{"name": "f", "parameters": {}}', None, None,
     [("f", {})]),
    ("llama3 text", {"tools": Llama3Json()}, "It is sunny {not json}", "It is sunny {not json}", None, []),
    ("llama3 broken JSON is text", {"tools": Llama3Json()}, '{"name": "f", "parameters"', '{"name": "f", "parameters"',
     None, []),
]


def _expect(parts):
    content = "".join(t for k, t in parts if k == "content")
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for k, c in parts if k == "tool_call"]
    return content, reasoning, calls


@pytest.mark.parametrize("kw, text, content, reasoning, calls", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_whole_reply(kw, text, content, reasoning, calls):
    got_content, got_reasoning, got_calls = whole(ReplyParser(**kw), text)
    assert (got_content, got_reasoning) == (content, reasoning)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got_calls] == calls
    for c in got_calls:
        assert c["type"] == "function" and c["id"].startswith("call_") and isinstance(c["function"]["arguments"], str)


@pytest.mark.parametrize("kw, text", [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_streamed_in_any_cuts_equals_whole(kw, text):
    p = ReplyParser(**kw)
    want = _expect(p.feed(text) + p.finish())
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            p = ReplyParser(**kw)
            parts = p.feed(text[:i]) + p.feed(text[i:j]) + p.feed(text[j:]) + p.finish()
            assert _expect(parts) == want, (i, j)
    # one character at a time: a tag's text is never sent as content before it is known not to be one
    p = ReplyParser(**kw)
    parts = [part for ch in text for part in p.feed(ch)] + p.finish()
    assert _expect(parts) == want


def test_parts_are_sent_as_soon_as_known():
    p = ReplyParser(Hermes(), reasoning=True)
    assert p.feed("<thi") == []
    assert p.feed("nk>\nab") == [("reasoning", "ab")]
    assert p.feed("c</th") == [("reasoning", "c")]
    assert p.feed("ink>\n\nHi <tool") == [("content", "Hi ")]
    assert p.feed("_call>\n{") == []
    parts = p.feed('"name": "f", "arguments": {}}\n</tool_call>')
    assert [k for k, _ in parts] == ["tool_call"]


def test_format_detection():
    assert detect(None) is None and detect("{{ messages }}") is None
    assert detect("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    llama31 = ('{%- if tools %}<|start_header_id|>ipython<|end_header_id|>{{ "parameters" }}'
               '"parameters": <|python_tag|>{% endif %}')
    assert detect(llama31).name == "llama3_json"
    assert detect("{% if tools %}[TOOL_CALLS]{% endif %}") is None  # Mistral's: not known, refused by name
