"""The chat formats whose replies are read from their special tokens, found from the chat template:
harmony (gpt-oss: harmony.py) and Gemma 4 (gemma4_reply.py). Each has a streaming parser with serve's
reply.ReplyParser interface and tokens that end the model's turn; such a reply is decoded with its
special tokens kept (the serve worker, `fuel run` and `fuel chat`), and Readable shows it as run and
chat print it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from . import gemma4_reply, harmony


@dataclass(frozen=True)
class ReplyFormat:
    name: str
    parser: Callable  # (reasoning=True, call=...) -> a parser with ReplyParser's interface
    reasoning_key: str  # an assistant message's key the template reads its reasoning from


HARMONY = ReplyFormat("harmony", harmony.HarmonyParser, "thinking")
GEMMA4 = ReplyFormat("gemma4", gemma4_reply.Gemma4Parser, "reasoning_content")


def reply_format(template: str | None) -> ReplyFormat | None:
    """The format a chat template's replies are read in, or None (plain text: serve's ReplyParser)."""
    if harmony.is_harmony(template):
        return HARMONY
    if gemma4_reply.is_gemma4(template):
        return GEMMA4
    return None


def turn_end_ids(tokenizer) -> set[int]:
    """The ids of the tokens that end the model's turn in its template's format, where a GGUF names
    one EOS (llama.cpp adds these by their text)."""
    return harmony.turn_end_ids(tokenizer) | gemma4_reply.turn_end_ids(tokenizer)


def readable(template: str | None) -> Readable | None:
    """A Readable for a template whose replies are read from their special tokens, else None."""
    fmt = reply_format(template)
    return None if fmt is None else Readable(fmt)


class Readable:
    """A reply as `fuel run` and `fuel chat` print it, fed its text with the markers: the reasoning
    between <think> and </think> (as a Qwen3 reply reads there), then the content; a call as
    NAME(ARGUMENTS). `content` and `reasoning` keep what was read, for the next chat turn (message())."""

    def __init__(self, fmt: ReplyFormat):
        self.fmt, self.parser = fmt, fmt.parser()
        self.thinking = False
        self.content, self.reasoning = "", ""

    def message(self) -> dict:
        """The reply as an assistant message the template reads back."""
        return {"content": self.content, self.fmt.reasoning_key: self.reasoning}

    def feed(self, text: str) -> str:
        return self._shown(self.parser.feed(text))

    def finish(self) -> str:
        return self._shown(self.parser.finish()) + self._close()

    def _close(self) -> str:
        was, self.thinking = self.thinking, False
        return "\n</think>\n\n" if was else ""

    def _shown(self, parts) -> str:
        out = []
        for kind, value in parts:
            if kind == "reasoning":
                out.append("" if self.thinking else "<think>\n")
                self.thinking = True
                self.reasoning += value
                out.append(value)
                continue
            out.append(self._close())
            text = value if kind == "content" else \
                f"{value['name']}({json.dumps(value['arguments'], ensure_ascii=False)})"
            self.content += text
            out.append(text)
        return "".join(out)
