"""Tool calls in the two formats open chat models are trained on, found from the chat template.

The template renders the tools and the earlier calls and results itself (transformers'
apply_chat_template(tools=...)); this module knows how each format writes a call, so that the reply
can be parsed back into OpenAI's `tool_calls` and, when a call is demanded (`tool_choice` required or
a named function) or a tool is `strict`, constrained by a grammar to the functions' parameter schemas.

    hermes       Qwen2.5, Qwen3, Hermes: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one or more
    llama3_json  Llama 3.1-3.3: the whole reply is {"name": ..., "parameters": {...}}

With tool_choice auto, a reply in neither format that is one bare JSON call of a declared tool
(bare_call) is a call too.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..text import grammar as g
from .json_check import satisfies

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict
    strict: bool


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_call(name: str, arguments) -> dict:
    """A call as OpenAI returns it: arguments as a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def _parse_call(text: str, args_key: str) -> dict | None:
    """{"name": ..., args_key: {...}} (the other format's key is taken too) as an OpenAI call, or None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    other = "parameters" if args_key == "arguments" else "arguments"
    return openai_call(obj["name"], obj.get(args_key, obj.get(other, {})))


def bare_call(text: str, functions: list[Function]) -> dict | None:
    """A reply that is only one JSON object (or one fenced ```json block of it) naming a declared
    function, with arguments its parameters' schema accepts, as an OpenAI call; else None. Models
    answer so when they drop their format's tags (Qwen2.5-Coder); Ollama reads it as a call too."""
    s = text.strip()
    fence = re.fullmatch(r"```(?:json)?[ \t]*\n(.*?)\n?```", s, re.DOTALL)
    try:
        obj = json.loads(fence.group(1) if fence else s)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    keys = set(obj) - {"name"}
    if len(keys) > 1 or not keys <= {"arguments", "parameters"}:
        return None
    arguments = obj[keys.pop()] if keys else {}
    declared = {f.name: f for f in functions}
    if obj["name"] not in declared or not isinstance(arguments, dict) \
            or not satisfies(arguments, declared[obj["name"]].parameters):
        return None
    return openai_call(obj["name"], arguments)


def _call_schema(functions: list[Function], args_key: str, strict: bool) -> dict:
    one = [{"type": "object", "properties": {"name": {"const": f.name}, args_key: f.parameters},
            "required": ["name", args_key], "additionalProperties": False} for f in functions]
    schema = one[0] if len(one) == 1 else {"anyOf": one}
    return {**schema, "x-guidance": g.schema_options(strict)}


class Hermes:
    name = "hermes"
    open, close = "<tool_call>", "</tool_call>"
    args_key = "arguments"

    def grammar(self, functions: list[Function], parallel: bool, lazy: bool, strict: bool,
                after: str | None = None) -> g.Grammar:
        """`lazy`: from the first call's opening tag on (the model may answer in text instead); `after`:
        a call comes once this text has (a reasoning model's </think>)."""
        body = json.dumps(_call_schema(functions, self.args_key, strict))
        repeat = ' ("\\n" call)*' if parallel else ""
        lead = f'{json.dumps(after)} /[ \\t\\n]*/ ' if after is not None and not lazy else ""
        text = (f"start: {lead}call{repeat}\n"
                f'call: "{self.open}\\n" body "\\n{self.close}"\n'
                f"body: %json {body}\n")
        return g.lark(text, "the tools' parameter schemas", trigger=self.open if lazy else after)

    def parse_call(self, block: str) -> dict | None:
        """The JSON between <tool_call> and </tool_call>, or None when it is not a call."""
        return _parse_call(block, self.args_key)


class Llama3Json:
    name = "llama3_json"
    python_tag = "<|python_tag|>"
    args_key = "parameters"

    def grammar(self, functions: list[Function], parallel: bool, lazy: bool, strict: bool,
                after: str | None = None) -> g.Grammar:
        body = json.dumps(_call_schema(functions, self.args_key, strict))
        # lazy (tool_choice auto): a reply that does not open with `{` is free text, as llguidance's
        # own example of Llama 3.1's format; parallel calls are not part of the format
        lead = f'{json.dumps(after)} /[ \\t\\n]*/ ' if after is not None else ""
        text = (f"start: {lead}(TEXT | call)\nTEXT: /[^{{](.|\\n)*/\ncall: %json {body}\n" if lazy
                else f"start: {lead}call\ncall: %json {body}\n")
        return g.lark(text, "the tools' parameter schemas", trigger=after)

    def parse_reply(self, text: str) -> dict | None:
        """The whole reply as one call, or None when it is not one."""
        return _parse_call(text.strip().removeprefix(self.python_tag), self.args_key)


def detect(template: str | None):
    """The tool-call format a chat template writes, or None."""
    if not template or "tools" not in template:
        return None
    if Hermes.open in template:
        return Hermes()
    if "<|start_header_id|>" in template and ("<|python_tag|>" in template or '"parameters"' in template):
        return Llama3Json()
    return None
