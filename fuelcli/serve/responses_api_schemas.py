"""The request body of OpenAI's Responses API (POST /v1/responses), checked strictly, and its
translation to a ChatRequest, so that the chat-completions machinery serves it.

    instructions                          -> a system turn first (not carried by previous_response_id)
    input: a string                       -> a user turn
    input items: message (user, system, developer: input_text; assistant: output_text),
                 reasoning, function_call  -> turns; an assistant's reasoning and calls join its turn
                 function_call_output      -> a `tool` turn answering its call_id
    tools (function), tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p
    text.format (text, json_object, json_schema) -> response_format

Items are checked by hand so that a refusal names the item's field (input[2].call_id); image and
file parts, and items of other types, are refused by name.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from .errors import bad_request
from .schemas import ChatRequest, Strict, api_error

TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=TOOL_NAME)
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None


class Reasoning(Strict):
    effort: Any = None
    summary: Any = None


class ResponsesRequest(Strict):
    model: str | None = None  # any name, or none: the server has one model
    input: Any  # a string or items: checked in to_chat, which names the item's field
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # false: the response is not kept for previous_response_id
    stream: bool = False
    reasoning: Reasoning | None = None
    truncation: Literal["disabled"] | None = None
    # OpenAI's bookkeeping: checked, without effect
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    chat_template_kwargs: dict | None = None  # the extension /v1/chat/completions takes (llama-server's)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
            raise ValueError("at most 16 pairs, keys of at most 64 characters and values of at most 512")
        return v

    def check(self):
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema" and fmt.name is None:
            raise bad_request("Missing required parameter: 'text.format.name'.", param="text.format.name")
        return self


def _need(item: dict, at: str, name: str, ok, what: str, required: bool = True):
    if name not in item:
        if required:
            raise bad_request(f"Missing required parameter: '{at}.{name}'.", param=f"{at}.{name}")
        return None
    if not ok(item[name]):
        raise bad_request(f"{at}.{name}: must be {what}", param=f"{at}.{name}")
    return item[name]


def _only(item: dict, at: str, fields: set) -> None:
    for name in item:
        if name not in fields:
            raise bad_request(f"Unrecognized field: {at}.{name}", param=f"{at}.{name}")


def _is_str(v) -> bool:
    return isinstance(v, str)


def _parts_text(content, at: str, kinds: tuple) -> str:
    """A message's content: a string, or parts of the given types (their text joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{at}: must be a string or a list of content parts", param=at)
    out = []
    for j, part in enumerate(content):
        where = f"{at}[{j}]"
        if not isinstance(part, dict):
            raise bad_request(f"{where}: must be a content part (an object with a type)", param=where)
        if part.get("type") not in kinds:
            raise bad_request(f"{where}.type: {json.dumps(part.get('type'))} is not a part fuel serve takes here "
                              f"({', '.join(kinds)})", param=f"{where}.type")
        _only(part, where, {"type", "text", "annotations", "logprobs"})
        out.append(_need(part, where, "text", _is_str, "a string"))
    return "".join(out)


ROLES = ("user", "system", "developer", "assistant")


def turns(items, known_calls: set, base: str = "input") -> list[dict]:
    """Input items as chat-completions messages; known_calls (the call ids so far) grows."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request(f"{base}: must be a string or a non-empty list of items", param=base)
    out: list[dict] = []
    turn = None  # the assistant turn that reasoning and calls join

    def assistant() -> dict:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
        return turn

    for i, item in enumerate(items):
        at = f"{base}[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{at}: must be an item (an object)", param=at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _only(item, at, {"type", "role", "content", "id", "status"})
            role = _need(item, at, "role", lambda v: v in ROLES, "one of " + ", ".join(ROLES))
            kinds = ("output_text",) if role == "assistant" else ("input_text",)
            text = _parts_text(_need(item, at, "content", lambda v: True, ""), f"{at}.content", kinds)
            if role == "assistant":
                t = assistant()
                if t.get("tool_calls"):  # text after calls opens a new turn
                    turn = None
                    t = assistant()
                t["content"] += text
            else:
                turn = None
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "reasoning":
            _only(item, at, {"type", "id", "summary", "content", "encrypted_content", "status"})
            _need(item, at, "summary", lambda v: isinstance(v, list), "a list", required=False)
            content = _need(item, at, "content", lambda v: isinstance(v, list), "a list", required=False) or []
            text = _parts_text(content, f"{at}.content", ("reasoning_text",))
            t = assistant()
            t["reasoning_content"] = t.get("reasoning_content", "") + text
        elif kind == "function_call":
            _only(item, at, {"type", "id", "call_id", "name", "arguments", "status"})
            call_id = _need(item, at, "call_id", _is_str, "a string")
            name = _need(item, at, "name", _is_str, "a string")
            arguments = _need(item, at, "arguments", _is_str, "a string (JSON text)")
            try:
                json.loads(arguments)
            except ValueError as e:
                raise bad_request(f"{at}.arguments: must be a JSON text ({e})", param=f"{at}.arguments") from None
            assistant().setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            known_calls.add(call_id)
        elif kind == "function_call_output":
            _only(item, at, {"type", "id", "call_id", "output", "status"})
            call_id = _need(item, at, "call_id", _is_str, "a string")
            if call_id not in known_calls:
                raise bad_request(f"{at}.call_id: no earlier function_call has the call_id {call_id!r}",
                                  param=f"{at}.call_id")
            output = _need(item, at, "output", lambda v: isinstance(v, (str, list)), "a string or a list of parts")
            turn = None
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _parts_text(output, f"{at}.output", ("input_text",))})
        else:
            raise bad_request(f"{at}.type: {json.dumps(kind)} is not an item fuel serve takes (message, "
                              "reasoning, function_call, function_call_output)", param=f"{at}.type")
    return out


def to_chat(req: ResponsesRequest, history: list[dict]) -> tuple[ChatRequest, list[dict]]:
    """The ChatRequest that serves a request after `history` (the turns of previous_response_id's
    conversation), and the conversation's turns without the instructions (what a later request
    continues)."""
    known = {c["id"] for t in history for c in t.get("tool_calls", [])}
    conversation = history + turns(req.input, known)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions is not None else []) + conversation
    body: dict = {"model": req.model, "messages": messages, "stream": req.stream,
                  "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                               if isinstance(choice, NamedFunction) else choice)
    if req.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = req.chat_template_kwargs
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.reasoning is not None and req.reasoning.effort is not None:  # for templates that take it (jobs.py)
        body["reasoning_effort"] = req.reasoning.effort
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = {"type": fmt.type} if fmt.type == "json_object" else {
            "type": "json_schema", "json_schema": fmt.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)}
    try:
        return ChatRequest.model_validate(body).check(), conversation
    except ValidationError as e:
        raise api_error(e) from None
