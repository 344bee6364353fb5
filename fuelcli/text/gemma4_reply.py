"""Gemma 4's replies: the reasoning in a `thought` channel, tool calls in Gemma's own call syntax.

    <|channel>thought\\nThe user wants the weather.<channel|>
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

The markers are tokens that a decoder skipping special tokens may lose (a tokenizer.json marks them
special; llama.cpp's converter makes them user-defined so that they print), so a Gemma 4 reply is
decoded with them kept, as a harmony one is. A call's arguments are Gemma's syntax, not JSON: keys
bare, strings between <|"|> quotes, numbers, true, false and null as in JSON, nested {...} and [...]
(the template's format_argument; llama.cpp's common/parsers/gemma4.cpp and transformers' gemma4
response template read them so). The turn ends at <turn|>, or at <|tool_response>, after calls;
llama.cpp ends generation at both (and <eos>).

Gemma4Parser reads a reply as it streams, with the interface of serve's reply.ReplyParser (feed,
finish, calls, phase): a thought channel's text (the whitespace after `thought` dropped) is the
reasoning; a call whose arguments parse is a call, reported at <tool_call|> (or the reply's end);
all else is content. Whatever does not fit stays text, markers included: a call whose text does not
parse (cut off by max_tokens, or not Gemma's syntax), a channel not named `thought`, and with
reasoning off (serve's reasoning_format none) the thought channel too. A stray <channel|> (Gemma 4
may write one after its answer; llama.cpp stops there) is dropped. Text that could still become a
marker is held back until it cannot, so feed() and finish() give the same parts whichever way the
text is cut.
"""

from __future__ import annotations

import json
import re

from .stream_parser import StreamParser, held, marker_ids, plain_call

CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
CALL, CALL_END = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
THOUGHT = "thought"
TURN_ENDS = ("<turn|>", "<|tool_response>")  # with <eos>, the file's EOS: llama.cpp's end of generation
_MARKERS = (CHANNEL, CHANNEL_END, CALL)
_NAME = re.compile(r"call:([A-Za-z0-9_.\-]+)")  # then the arguments' `{`


def is_gemma4(template: str | None) -> bool:
    """Whether a chat template writes Gemma 4's format (llama.cpp detects it by the call's opening)."""
    return bool(template) and "'<|tool_call>call:'" in template and CHANNEL in template


def turn_end_ids(tokenizer) -> set[int]:
    """The ids of the tokens that end a Gemma 4 turn, for a tokenizer whose template is Gemma 4's."""
    if not is_gemma4(tokenizer.chat_template):
        return set()
    return marker_ids(tokenizer, TURN_ENDS)


class Gemma4Parser(StreamParser):
    """`call(name, arguments)` makes a call's part (serve: OpenAI's call dict with an id)."""

    def __init__(self, reasoning: bool = True, call=plain_call):
        self.reasoning, self.make_call = reasoning, call
        self.state = "content"  # "content" | "channel": after <|channel> | "thought" | "call": after <|tool_call>
        self.buf = ""
        self.strip = False  # drop the whitespace that opens the thought's text
        self.calls: list[dict] = []

    @property
    def phase(self) -> str:
        """"reasoning" while inside a thought channel (reply.whole reads it)."""
        return "reasoning" if self.state == "thought" else "content"

    def _where(self):
        return self.state

    def _step(self, out, final):
        getattr(self, f"_{self.state}")(out, final)

    def _content(self, out, final):
        found = [(self.buf.find(m), m) for m in _MARKERS]
        at, marker = min(((i, m) for i, m in found if i >= 0), default=(-1, ""))
        if at < 0:
            keep = 0 if final else held(self.buf, _MARKERS)
            out.append(("content", self.buf[: len(self.buf) - keep]))
            self.buf = self.buf[len(self.buf) - keep:]
            return
        out.append(("content", self.buf[:at]))
        self.buf = self.buf[at + len(marker):] if marker == CHANNEL_END else self.buf[at:]  # a stray end: dropped
        self.state = {CHANNEL: "channel", CALL: "call"}.get(marker, "content")

    def _channel(self, out, final):
        """At <|channel>: a thought channel is the reasoning; any other stays text as written."""
        rest = self.buf[len(CHANNEL):]
        if not final and THOUGHT.startswith(rest):
            return  # the name is still coming
        if self.reasoning and rest.startswith(THOUGHT):
            self.buf, self.state, self.strip = rest[len(THOUGHT):], "thought", True
            return
        end = self.buf.find(CHANNEL_END)  # not read: the channel as written, up to its end
        if end < 0 and not final:
            return
        upto = len(self.buf) if end < 0 else end + len(CHANNEL_END)
        out.append(("content", self.buf[:upto]))
        self.buf, self.state = self.buf[upto:], "content"

    def _thought(self, out, final):
        if self.strip:
            self.buf = self.buf.lstrip()
            if not self.buf and not final:
                return
            self.strip = False
        at = self.buf.find(CHANNEL_END)
        if at >= 0:
            out.append(("reasoning", self.buf[:at]))
            self.buf, self.state = self.buf[at + len(CHANNEL_END):], "content"
            return
        keep = 0 if final else held(self.buf, (CHANNEL_END,))
        out.append(("reasoning", self.buf[: len(self.buf) - keep]))
        self.buf = self.buf[len(self.buf) - keep:]
        if final:
            self.state = "content"

    def _call(self, out, final):
        end = self.buf.find(CALL_END)
        if end < 0 and not final:
            return
        upto = len(self.buf) if end < 0 else end + len(CALL_END)
        body = self.buf[len(CALL): end if end >= 0 else len(self.buf)]
        name = _NAME.match(body)
        arguments = parse_arguments(body[name.end():]) if name else None
        if arguments is None:  # not a call after all: text, as it was written
            out.append(("content", self.buf[:upto]))
        else:
            call = self.make_call(name.group(1), arguments)
            self.calls.append(call)
            out.append(("tool_call", call))
        self.buf, self.state = self.buf[upto:], "content"


def parse_arguments(text: str) -> dict | None:
    """A call's arguments in Gemma's syntax (`{city:<|"|>Paris<|"|>,days:3}`) as a dict, or None
    when the text is not one whole object in it."""
    try:
        value, at = _value(text, _space(text, 0))
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) and _space(text, at) == len(text) else None


# a number, true, false or null as JSON writes them
_SCALAR = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null")


def _space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def _value(text: str, at: int):
    """(the value starting at `at`, where it ends)."""
    if text.startswith(QUOTE, at):
        end = text.index(QUOTE, at + len(QUOTE))
        return text[at + len(QUOTE):end], end + len(QUOTE)
    if text[at] == "{":
        return _items(text, at + 1, "}", _pair, {})
    if text[at] == "[":
        return _items(text, at + 1, "]", _value, [])
    scalar = _SCALAR.match(text, at)
    if scalar is None:
        raise ValueError(at)
    return json.loads(scalar.group(0)), scalar.end()


def _pair(text: str, at: int):
    """key:value, the key bare (up to its colon) or <|"|> quoted."""
    if text.startswith(QUOTE, at):
        key, at = _value(text, at)
    else:
        colon = text.index(":", at)
        key, at = text[at:colon].strip(), colon
        if not key or "}" in key or "," in key:
            raise ValueError(key)
    if text[at] != ":":
        raise ValueError(at)
    value, at = _value(text, _space(text, at + 1))
    return (key, value), at


def _items(text: str, at: int, close: str, item, into):
    at = _space(text, at)
    if text[at] == close:
        return into, at + 1
    while True:
        got, at = item(text, at)
        if isinstance(into, dict):
            into[got[0]] = got[1]
        else:
            into.append(got)
        at = _space(text, at)
        if text[at] == close:
            return into, at + 1
        if text[at] != ",":
            raise ValueError(at)
        at = _space(text, at + 1)
