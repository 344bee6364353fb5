"""gpt-oss's harmony replies in the server: the parser (text/harmony.py) with OpenAI's call dicts,
and the tool-call format of a harmony template.

Why not OpenAI's own parser (openai-harmony 0.0.8 on PyPI): its encoding is built only from the
o200k_base.tiktoken file, which it downloads at run time or reads from TIKTOKEN_ENCODINGS_BASE after a
SHA-256 check against OpenAI's file; fuel serves without network, from the model's own vocabulary (a
GGUF or tokenizer.json), and a vocabulary that is not byte for byte o200k_base (any test or tiny
model's) is refused. Its parser also takes o200k token ids, where fuel's reply parsers read text.
"""

from __future__ import annotations

import json

from ..text import grammar as g
from ..text.harmony import HarmonyParser
from .tools import openai_call


def parser(reasoning: bool = True) -> HarmonyParser:
    return HarmonyParser(reasoning, call=openai_call)


# the messages a constrained reply may open with: analysis, or a preamble to the user, each ended
# and followed by the next assistant message (special tokens by name: llguidance's Lark matches them)
_MESSAGES = ('message: <|channel|> ("analysis" | "commentary") <|message|> TEXT <|end|> <|start|> "assistant"\n'
             "TEXT: /(.|\\n)*/\n")


def _body(schema, strict: bool) -> str:
    schema = schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
    return json.dumps({**schema, "x-guidance": g.schema_options(strict)})


def final_json(schema, strict: bool, what: str) -> g.Grammar:
    """response_format for a harmony reply: analysis as the model likes, then a final message that is
    the schema's JSON."""
    return g.lark(f"start: message* <|channel|> \"final\" <|message|> body\n{_MESSAGES}"
                  f"body: %json {_body(schema, strict)}\n", what)


class HarmonyTools:
    """The tool-call format of a harmony template (jobs.chat_prompt's `fmt`): a call is the message
    `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`, one per turn (the
    model stops at <|call|> for its result)."""

    name = "harmony"

    def grammar(self, functions, parallel: bool, lazy: bool, strict: bool, after: str | None = None) -> g.Grammar:
        """Demanded (not lazy): analysis as the model likes, then a call of one of `functions`, its
        arguments held to their schema. `lazy` (a strict tool under tool_choice auto): from the
        recipient's `to=functions.` on. The recipient may also come before the channel, after the
        next message's `<|start|>assistant` (the form the template writes earlier calls in)."""
        calls = "\n".join(
            f'c{i}: {json.dumps(f.name)} (" " <|constrain|> "json" | <|channel|> "commentary json") <|message|> b{i}\n'
            f"b{i}: %json {_body(f.parameters, strict)}" for i, f in enumerate(functions))
        names = " | ".join(f"c{i}" for i in range(len(functions)))
        if lazy:
            return g.lark(f'start: "to=functions." ({names})\n{calls}\n', "the tools' parameter schemas",
                          trigger="to=functions.")
        return g.lark(f'start: message* (<|channel|> "commentary to=functions." | " to=functions.") ({names})\n'
                      f"{_MESSAGES}{calls}\n", "the tools' parameter schemas")
