"""A chat reply, as it streams, split into reasoning, content and tool calls.

Reasoning (Qwen3, DeepSeek-R1, QwQ): a reply that opens with <think> (or whose prompt ends with it,
as templates that start the model inside its thinking do) has its text up to </think> returned as
`reasoning_content`, llama-server's and DeepSeek's field; the whitespace after <think> and </think> is dropped.
Tool calls (tools.py): hermes blocks anywhere in the content, each reported once its closing tag is
in; a llama3_json reply is a call when the whole reply parses as one; with declared functions, a
reply that opens with `{` or a fence is held to its end, a call if it is one bare JSON call of them
(tools.bare_call). Text that could still become a tag is held back until it cannot (as stop strings
are), so what is streamed is what the whole reply says: feed() and finish() give the same parts
whichever way the text is cut.
"""

from __future__ import annotations

from ..text.stream_parser import StreamParser, held
from .tools import bare_call

THINK, END_THINK = "<think>", "</think>"


class ReplyParser(StreamParser):
    def __init__(self, tools=None, reasoning: bool = False, in_reasoning: bool = False, functions=None):
        self.tools = tools  # a tools.Hermes / Llama3Json, or None: no call parsing
        self.functions = functions or []  # the declared tools.Function: a bare JSON reply may call one
        self.phase = "reasoning" if in_reasoning else ("start" if reasoning else "content")
        self.buf = ""
        self.strip = in_reasoning  # drop the whitespace that opens the next part (after <think>, </think>, a call)
        self.opened = False  # content has begun (llama3_json decides at its first character)
        self.calls: list[dict] = []

    def _where(self):
        return self.phase

    def _step(self, out, final):
        getattr(self, f"_{self.phase}")(out, final)

    def _start(self, out, final):
        s = self.buf.lstrip()
        if s.startswith(THINK):
            self.phase, self.buf, self.strip = "reasoning", s[len(THINK):], True
        elif not final and THINK.startswith(s):
            return  # still possibly "<think>"
        else:
            self.phase = "content"

    def _lstrip(self, final) -> bool:
        """Drops the whitespace that opens a part; False while only whitespace has come."""
        if self.strip:
            self.buf = self.buf.lstrip()
            if not self.buf and not final:
                return False
            self.strip = False
        return True

    def _reasoning(self, out, final):
        if not self._lstrip(final):
            return
        at = self.buf.find(END_THINK)
        if at >= 0:
            out.append(("reasoning", self.buf[:at]))
            self.buf, self.phase, self.strip = self.buf[at + len(END_THINK):], "content", True
            return
        keep = 0 if final else held(self.buf, (END_THINK,))
        out.append(("reasoning", self.buf[: len(self.buf) - keep]))
        self.buf = self.buf[len(self.buf) - keep:]

    def _content(self, out, final):
        if not self._lstrip(final):
            return
        tools = self.tools
        if tools is not None and tools.name == "llama3_json" and not self.opened:
            s = self.buf.lstrip()
            if not final and (not s or tools.python_tag.startswith(s)):
                return  # undecided: a call opens with `{` or the python tag
            if s.startswith("{") or s.startswith(tools.python_tag):
                self.phase = "llama3_call"
                return
        if self.functions and not self.opened and not self.calls:
            s = self.buf.lstrip()
            if not final and (not s or "```".startswith(s)):
                return  # undecided: a bare call opens with `{` or a fence
            if s.startswith(("{", "```")):
                self.phase = "bare_call"
                return
        if tools is not None and tools.name == "llama3_json":
            self.opened = True
        if tools is not None and tools.name == "hermes":
            at = self.buf.find(tools.open)
            if at >= 0:
                out.append(("content", self.buf[:at]))
                self.buf, self.phase = self.buf[at:], "hermes_call"
                return
            keep = 0 if final else held(self.buf, (tools.open,))
        else:
            keep = 0
        self.opened = self.opened or bool(self.buf)
        out.append(("content", self.buf[: len(self.buf) - keep]))
        self.buf = self.buf[len(self.buf) - keep:]

    def _hermes_call(self, out, final):
        t = self.tools
        end = self.buf.find(t.close)
        if end < 0 and not final:
            return
        block = self.buf[len(t.open): end if end >= 0 else len(self.buf)]
        call = t.parse_call(block.strip())
        if call is None:  # not a call after all: it stays text, as it was written
            out.append(("content", self.buf[: end + len(t.close)] if end >= 0 else self.buf))
        else:
            self.calls.append(call)
            out.append(("tool_call", call))
        self.buf = self.buf[end + len(t.close):] if end >= 0 else ""
        self.phase, self.strip = "content", call is not None

    def _bare_call(self, out, final):
        """The reply so far opens like a bare JSON call: held to its end, then a call if it is one
        whole, else read again as content (it may hold tagged calls)."""
        if not final:
            return
        call = bare_call(self.buf, self.functions)
        if call is None:
            self.phase, self.opened = "content", True
            return
        self.calls.append(call)
        out.append(("tool_call", call))
        self.buf, self.phase, self.opened = "", "content", True

    def _llama3_call(self, out, final):
        if not final:
            return
        call = self.tools.parse_reply(self.buf)
        if call is None:
            out.append(("content", self.buf))
        else:
            self.calls.append(call)
            out.append(("tool_call", call))
        self.buf, self.phase, self.opened = "", "content", True


def whole(parser: ReplyParser, text: str) -> tuple[str | None, str | None, list[dict]]:
    """(content, reasoning_content, tool_calls) of a whole reply; content is None when the reply is
    only calls, as OpenAI's; reasoning None when there was none."""
    parts = parser.feed(text) + parser.finish()
    content = "".join(t for k, t in parts if k == "content")
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    calls = [c for k, c in parts if k == "tool_call"]
    started_reasoning = any(k == "reasoning" for k, _ in parts) or parser.phase == "reasoning"
    return (None if calls and not content else content), (reasoning if started_reasoning else None), calls
