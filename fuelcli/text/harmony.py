"""OpenAI's harmony chat format (gpt-oss): what marks it, and the tokens that end the model's turn.

A reply is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

The markers are special tokens: a decoder that skips special tokens loses them, so a harmony reply is
decoded with them kept (the serve worker, run and chat do so for a harmony template).

HarmonyParser reads a reply as it streams: the `analysis` channel is the reasoning; `final` (and
`commentary` addressed to no one: a preamble for the user) is the content; a message addressed
`to=functions.NAME` is a call of NAME with its body as the arguments (`<|constrain|>json`), reported
once the body has ended (at <|call|>, <|end|> or the end of the reply) and only if the body is a JSON
object. Whatever does not fit stays text: a reply without harmony headers is content; a header that
never reaches <|message|>, a call whose body is not JSON (cut off by max_tokens) and a message to a
built-in tool (browser, python) are content as the model wrote them, markers included. With reasoning
off (serve's reasoning_format none) every message but a call is content as written, markers included.
Same interface as serve's reply.ReplyParser (feed, finish, calls, phase); text that could still become
a marker is held back until it cannot, so feed() and finish() give the same parts whichever way the
text is cut.
"""

from __future__ import annotations

import json
import re

from .stream_parser import StreamParser, held, marker_ids, plain_call

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
# what ends a message's body: <|start|> too, for a model that opens the next message without <|end|>
BODY_ENDS = (END, RETURN, CALL, START)
# the turn is over at <|return|> (the answer) and <|call|> (a tool call, whose result comes next);
# gpt-oss's generation_config.json names both, a GGUF only its eos_token_id (llama.cpp adds them)
TURN_ENDS = (RETURN, CALL)


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's does)."""
    return bool(template) and CHANNEL in template and MESSAGE in template and START in template


def turn_end_ids(tokenizer) -> set[int]:
    """The ids of the tokens that end a harmony turn, for a tokenizer whose template writes harmony."""
    if not is_harmony(tokenizer.chat_template):
        return set()
    return marker_ids(tokenizer, TURN_ENDS)


HEADER_MAX = 256  # characters before <|message|>: past this the text is no header
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class HarmonyParser(StreamParser):
    """`call(name, arguments)` makes a call's part (serve: OpenAI's call dict with an id)."""

    def __init__(self, reasoning: bool = True, call=plain_call):
        self.reasoning, self.make_call = reasoning, call
        self.state = "header"  # "header": reading up to <|message|>; "body": a message's text
        self.buf = ""
        self.header = ""  # the current message's header, as written
        self.kind = "content"  # the body's: "reasoning" | "content" | "call" | "raw" (content, markers kept)
        self.name = ""  # the function a call body is for
        self.skip_first = False  # the body opens at a marker that does not end it
        self.calls: list[dict] = []

    @property
    def phase(self) -> str:
        """"reasoning" while inside an analysis message (reply.whole reads it)."""
        return "reasoning" if self.state == "body" and self.kind == "reasoning" else "content"

    def _where(self):
        return self.state

    def _step(self, out, final):
        (self._header if self.state == "header" else self._body)(out, final)

    def _header(self, out, final):
        s = self.buf.lstrip()
        could_be = s.startswith("<|") or "<|".startswith(s)  # a header opens with a marker
        at = self.buf.find(MESSAGE)
        if could_be and 0 <= at <= HEADER_MAX:
            self.header, self.buf = self.buf[:at + len(MESSAGE)], self.buf[at + len(MESSAGE):]
            self._open(out)
            return
        if could_be and not final and len(self.buf) <= HEADER_MAX:
            return  # a header still coming (or nothing yet)
        # no header: the text (if any) is content as written, up to the next message; a marker it
        # opens with (a cut-off header's) ends nothing there
        self.header, self.kind, self.state, self.skip_first = "", "raw", "body", True

    def _open(self, out):
        channel = _CHANNEL.search(self.header)
        to = _RECIPIENT.search(self.header)
        self.state = "body"
        if to is not None and to.group(1).startswith("functions."):
            self.kind, self.name = "call", to.group(1).removeprefix("functions.")
        elif to is None and self.reasoning and channel is not None and channel.group(1) == "analysis":
            self.kind = "reasoning"
        elif to is None and self.reasoning:
            self.kind = "content"
        else:
            self.kind = "raw"
            out.append(("content", self.header))

    def _body(self, out, final):
        first, self.skip_first = int(self.skip_first), False
        ends = [(self.buf.find(m, first), m) for m in BODY_ENDS]
        at, marker = min(((i, m) for i, m in ends if i >= 0), default=(-1, ""))
        if self.kind == "call":
            if at < 0 and not final:
                return
            body = self.buf if at < 0 else self.buf[:at]
            self._call(out, body, marker)
        elif at >= 0:
            out.append((self._part(), self.buf[:at] + (self._written(marker) if self.kind == "raw" else "")))
        else:
            keep = 0 if final else held(self.buf, BODY_ENDS)
            out.append((self._part(), self.buf[: len(self.buf) - keep]))
            self.buf = self.buf[len(self.buf) - keep:]
            return
        # the message has ended: <|start|> opens the next one and stays for its header
        self.buf = "" if at < 0 else self.buf[at + len(self._written(marker)):]
        self.state, self.kind = "header", "content"

    @staticmethod
    def _written(marker: str) -> str:
        """The end marker as part of the message it ends (<|start|> belongs to the next one)."""
        return "" if marker == START else marker

    def _part(self) -> str:
        return "reasoning" if self.kind == "reasoning" else "content"

    def _call(self, out, body: str, marker: str):
        try:
            arguments = json.loads(body)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict) or not self.name:  # not a call after all: text, as it was written
            out.append(("content", self.header + body + self._written(marker)))
            return
        call = self.make_call(self.name, arguments)
        self.calls.append(call)
        out.append(("tool_call", call))
