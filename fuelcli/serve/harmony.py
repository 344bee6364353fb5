"""gpt-oss's harmony replies in the server: the parser (text/harmony.py) with OpenAI's call dicts,
and the tool-call format of a harmony template.

Why not OpenAI's own parser (openai-harmony 0.0.8 on PyPI): its encoding is built only from the
o200k_base.tiktoken file, which it downloads at run time or reads from TIKTOKEN_ENCODINGS_BASE after a
SHA-256 check against OpenAI's file; fuel serves without network, from the model's own vocabulary (a
GGUF or tokenizer.json), and a vocabulary that is not byte for byte o200k_base (any test or tiny
model's) is refused. Its parser also takes o200k token ids, where fuel's reply parsers read text.
"""

from __future__ import annotations

from ..errors import InputError
from ..text.harmony import HarmonyParser
from .tools import openai_call


def parser(reasoning: bool = True) -> HarmonyParser:
    return HarmonyParser(reasoning, call=openai_call)


class HarmonyTools:
    """The tool-call format of a harmony template (jobs.chat_prompt's `fmt`): calls are read from the
    reply by HarmonyParser; none is forced by a grammar yet."""

    name = "harmony"

    def grammar(self, functions, parallel: bool, lazy: bool, strict: bool, after: str | None = None):
        raise InputError("tool_choice required or naming a function, and strict tools, are not supported for a "
                         "harmony (gpt-oss) model yet: its calls are read from the reply (tool_choice auto)")
