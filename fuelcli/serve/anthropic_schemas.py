"""The request bodies of Anthropic's /v1/messages and /v1/messages/count_tokens, checked strictly,
and their translation to a ChatRequest, so that the chat-completions machinery (the template, the
tool formats, the grammar of a forced tool_choice, the sampler) serves them.

    system            a string or text blocks      -> a system turn
    user turn         text and tool_result blocks  -> user turns and `tool` turns (tool_call_id)
    assistant turn    text, tool_use, thinking     -> content, tool_calls, reasoning_content
    tools[].input_schema                           -> the function's parameters
    tool_choice       auto | any | tool | none     -> auto | required | the named function | none
    thinking          enabled | adaptive | disabled -> chat_template_kwargs enable_thinking
    stop_sequences, max_tokens, temperature, top_p, top_k -> their chat fields

Blocks are checked by hand so that a refusal names the block's field (messages[1].content[0].type);
image and document blocks are refused by name, as is a tool_result whose tool_use_id no earlier
tool_use block has.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from .errors import bad_request
from .schemas import ChatRequest, Strict, api_error

TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class AnthropicTool(Strict):
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict
    type: Literal["custom"] | None = None
    cache_control: dict | None = None  # fuel's prompt cache is automatic
    strict: bool | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)  # the template decides how long the model thinks
    display: str | None = None


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: Any  # a string or blocks: checked in to_chat, which names the block's field


class Metadata(Strict):
    user_id: str | None = None


class _Body(Strict):
    """The fields both routes take."""

    model: str  # any name (the server has one model); Anthropic's API requires the field
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Any = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    def check(self):
        choice = self.tool_choice
        if choice is not None and (choice.type == "tool") != (choice.name is not None):
            raise bad_request("tool_choice.name goes with type tool (and only there)", param="tool_choice.name")
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise bad_request(f"tool_choice {choice.type} needs tools", param="tool_choice")
        return self


class MessagesRequest(_Body):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: Metadata | None = None  # Anthropic's bookkeeping: checked, without effect
    service_tier: Literal["auto", "standard_only"] | None = None


class CountTokensRequest(_Body):
    pass


# block type -> its fields: name -> (required, check, what it must be)
_is_str = (lambda v: isinstance(v, str), "a string")
_optional_dict = (lambda v: v is None or isinstance(v, dict), "an object")
_BLOCKS = {
    "text": {"text": (True, *_is_str), "cache_control": (False, *_optional_dict),
             "citations": (False, lambda v: v is None or isinstance(v, list), "a list")},
    "tool_use": {"id": (True, *_is_str), "name": (True, *_is_str),
                 "input": (True, lambda v: isinstance(v, dict), "an object"), "cache_control": (False, *_optional_dict)},
    "tool_result": {"tool_use_id": (True, *_is_str),
                    "content": (False, lambda v: isinstance(v, (str, list)), "a string or a list of text blocks"),
                    "is_error": (False, lambda v: v is None or isinstance(v, bool), "a boolean"),
                    "cache_control": (False, *_optional_dict)},
    "thinking": {"thinking": (True, *_is_str), "signature": (False, *_is_str)},
    "redacted_thinking": {"data": (True, *_is_str)},
}
_TAKES = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
          "system": ("text",), "tool_result": ("text",)}


def blocks(content, where: str, takes: str) -> list[dict]:
    """The checked blocks of a content field (a string is one text block); a 400 naming the field."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise bad_request(f"{where}: must be a string or a non-empty list of content blocks", param=where)
    for j, b in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(b, dict):
            raise bad_request(f"{at}: must be a content block (an object with a type)", param=at)
        kind = b.get("type")
        if kind not in _TAKES[takes]:
            known = ", ".join(_TAKES[takes])
            raise bad_request(f"{at}.type: {json.dumps(kind)} is not a block fuel serve takes here ({known})",
                              param=f"{at}.type")
        fields = _BLOCKS[kind]
        for name in b:
            if name != "type" and name not in fields:
                raise bad_request(f"Unrecognized field: {at}.{name}", param=f"{at}.{name}")
        for name, (required, ok, what) in fields.items():
            if name not in b:
                if required:
                    raise bad_request(f"Missing required parameter: '{at}.{name}'.", param=f"{at}.{name}")
            elif not ok(b[name]):
                raise bad_request(f"{at}.{name}: must be {what}", param=f"{at}.{name}")
    return content


def _text(bs: list[dict], sep: str = "") -> str:
    return sep.join(b["text"] for b in bs if b["type"] == "text")


def _turns(req: _Body) -> list[dict]:
    """The conversation as chat-completions messages."""
    out = []
    if req.system is not None:
        system = _text(blocks(req.system, "system", "system"), "\n")
        out.append({"role": "system", "content": system})
    called: set[str] = set()
    for i, m in enumerate(req.messages):
        where = f"messages[{i}].content"
        bs = blocks(m.content, where, m.role)
        if m.role == "assistant":
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}}
                     for b in bs if b["type"] == "tool_use"]
            called.update(c["id"] for c in calls)
            turn = {"role": "assistant", "content": _text(bs)}
            thinking = "".join(b["thinking"] for b in bs if b["type"] == "thinking")
            if thinking:
                turn["reasoning_content"] = thinking
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
            continue
        text: list[str] = []
        for j, b in enumerate(bs):
            if b["type"] == "text":
                text.append(b["text"])
                continue
            if b["tool_use_id"] not in called:
                at = f"{where}[{j}].tool_use_id"
                raise bad_request(f"{at}: no earlier tool_use block has the id {b['tool_use_id']!r}", param=at)
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            result = b.get("content", "")
            if isinstance(result, list):
                result = _text(blocks(result, f"{where}[{j}].content", "tool_result"))
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        if text:
            out.append({"role": "user", "content": "".join(text)})
    last = len(req.messages) - 1
    if req.messages[last].role != "user":  # the template would close it and start a new turn
        raise bad_request(f"messages[{last}].role: the last turn must be the user's (fuel serve does not "
                          "continue a prefilled assistant turn)", param=f"messages[{last}].role")
    return out


def to_chat(req: _Body) -> ChatRequest:
    """The ChatRequest that serves an Anthropic request; a 400 naming the field where it cannot."""
    body: dict = {"model": req.model, "messages": _turns(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            k: v for k, v in {"name": t.name, "description": t.description, "parameters": t.input_schema,
                              "strict": t.strict}.items() if v is not None}} for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = ({"type": "function", "function": {"name": choice.name}} if choice.type == "tool"
                               else {"auto": "auto", "any": "required", "none": "none"}[choice.type])
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
    if isinstance(req, MessagesRequest):
        body |= {"max_tokens": req.max_tokens, "stream": req.stream, "stop": req.stop_sequences,
                 "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
    try:
        return ChatRequest.model_validate(body).check()
    except ValidationError as e:
        raise api_error(e) from None
