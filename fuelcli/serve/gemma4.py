"""Gemma 4's replies in the server: the parser (text/gemma4_reply.py) with OpenAI's call dicts, and
the grammars that constrain a reply in Gemma's call syntax.

The markers are written in the grammars by token id (`<[100]>`): a tokenizer.json makes them special
tokens, which llguidance's Lark names only in the `<|name|>` form Gemma's markers do not have, and a
GGUF makes them user-defined ones, whose text a free-text lexeme would swallow. A demanded call
(tool_choice required or a named function) is held to Gemma's syntax with the function's name, and
its arguments to Gemma's value syntax, not to the parameters' schema (llama.cpp's Gemma 4 grammar
does the same): a strict tool asks for the schema and is refused in one line.
"""

from __future__ import annotations

import json

from ..errors import InputError
from ..text import gemma4_reply as gr
from ..text import grammar as g
from .tools import openai_call

STRICT_REFUSED = ("strict tools are not supported with Gemma 4's call syntax: its arguments are not JSON, and "
                  "fuel holds them to Gemma's syntax, not to the parameters' schema (drop strict)")


def parser(reasoning: bool = True) -> gr.Gemma4Parser:
    return gr.Gemma4Parser(reasoning, call=openai_call)


def _ids(tokenizer) -> dict[str, str]:
    """Each marker as a Lark token id, or InputError where the vocabulary lacks it as one token."""
    out = {}
    for marker in (gr.CHANNEL, gr.CHANNEL_END, gr.CALL, gr.CALL_END, gr.QUOTE):
        i = tokenizer.backend.token_to_id(marker)
        if i is None:
            raise InputError(f"this Gemma 4 vocabulary has no {marker} token, which a constrained reply needs")
        out[marker] = f"<[{i}]>"
    return out


def _thought(ids: dict) -> str:
    """The reply may open with its reasoning (thinking on), as the model likes."""
    return f'thought: {ids[gr.CHANNEL]} "thought" TEXT {ids[gr.CHANNEL_END]}\nTEXT: /(.|\\n)*/\n'


# a string's text: anything but the closing <|"|> (as text; a special token is no text anyway)
_STRING = r'/([^<]|<([^|]|\|([^"]|"([^|]|\|[^>]))))*/'


def _values(ids: dict) -> str:
    """Gemma's argument syntax (the template's format_argument, keys bare)."""
    return ('dict: "{" (pair ("," pair)*)? "}"\npair: KEY ":" value\nKEY: /[^:{}<>,\\[\\]\\n]+/\n'
            'value: string | dict | array | NUMBER | "true" | "false" | "null"\n'
            f"string: {ids[gr.QUOTE]} STRING {ids[gr.QUOTE]}\nSTRING: {_STRING}\n"
            'array: "[" (value ("," value)*)? "]"\nNUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/\n')


def final_json(tokenizer, schema, strict: bool, what: str) -> g.Grammar:
    """response_format for a Gemma 4 reply: reasoning as the model likes, then the schema's JSON."""
    ids = _ids(tokenizer)
    body = schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
    return g.lark(f"start: thought? body\n{_thought(ids)}"
                  f"body: %json {json.dumps({**body, 'x-guidance': g.schema_options(strict)})}\n", what)


class Gemma4Tools:
    """The tool-call format of a Gemma 4 template (jobs.chat_prompt's `fmt`):
    `<|tool_call>call:NAME{key:value,...}<tool_call|>`, one or more."""

    name = "gemma4"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def grammar(self, functions, parallel: bool, lazy: bool, strict: bool, after: str | None = None) -> g.Grammar:
        """A demanded call (not lazy: a lazy grammar is only asked for by a strict tool): reasoning as
        the model likes, then calls of `functions`."""
        if strict or lazy:
            raise InputError(STRICT_REFUSED)
        ids = _ids(self.tokenizer)
        names = " | ".join(json.dumps(f.name) for f in functions)
        repeat = "+" if parallel else ""
        return g.lark(f"start: thought? call{repeat}\n{_thought(ids)}"
                      f'call: {ids[gr.CALL]} "call:" ({names}) dict {ids[gr.CALL_END]}\n{_values(ids)}',
                      "the tools' calls")
