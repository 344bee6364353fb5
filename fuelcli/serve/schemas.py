"""The request bodies of /v1/chat/completions and /v1/completions, checked strictly.

Types are strict (a string is not a number, 1 is not true), unknown fields are refused as OpenAI
refuses them, and OpenAI fields fuel cannot honour (logit_bias, n > 1, audio, ...) are refused by
name unless they hold their neutral value: a request never silently gets less than it asked for.
OpenAI's bookkeeping fields (store, metadata, service_tier) are checked and accepted without
effect; so is prediction, a latency hint that never changes the text, unless the server runs
lookup decoding, whose proposals it then feeds. Sampling fields left out take `fuel run`'s
defaults, as llama-server does; top_k, min_p, repeat_penalty, repeat_last_n, chat_template_kwargs
and reasoning_format are accepted as extensions under llama-server's names.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import APIError, bad_request

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class Strict(BaseModel):
    """Strict types, unknown fields refused: every API's request bodies."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _text(v):
    """A string, or a list of text parts joined."""
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise ValueError("must be a string or a list of text parts")
    for i, part in enumerate(v):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ValueError(f"part {i}: only text parts are supported" + (f" (got type {kind!r})" if kind else ""))
        if not isinstance(part.get("text"), str):
            raise ValueError(f"part {i}: text must be a string")
        if set(part) - {"type", "text"}:
            raise ValueError(f"part {i}: unrecognized field {sorted(set(part) - {'type', 'text'})[0]!r}")
    return "".join(part["text"] for part in v)


class FunctionCall(Strict):
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as OpenAI sends it

    @field_validator("arguments")
    @classmethod
    def _json(cls, v):
        try:
            json.loads(v)
        except ValueError as e:
            raise ValueError(f"must be a JSON text ({e})") from None
        return v


class ToolCall(Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall

    def as_template_call(self) -> dict:
        # templates write the arguments with `| tojson`: they want the object, as transformers passes it
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": json.loads(self.function.arguments)}}


_NOT_SET = object()


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = Field(default_factory=lambda: _NOT_SET)
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    reasoning_content: str | None = None  # assistant (llama-server's; templates drop or keep it)
    refusal: str | None = None  # assistant, echoed back by clients: kept out of the prompt

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return None if v is None else _text(v)

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) across fields, or None."""
        if self.content is _NOT_SET:
            return "content", "Missing required parameter"
        # an assistant turn with content null and tool_calls [] is empty content, as some client
        # libraries write a turn without calls (llama-server reads it so)
        if self.content is None and not (self.role == "assistant"
                                         and (self.tool_calls is not None or self.refusal is not None)):
            return "content", "must be a string or a list of text parts (null only in an assistant turn with tool_calls)"
        if self.tool_calls is not None and self.role != "assistant":
            return "tool_calls", "only an assistant message has tool_calls"
        if (self.role == "tool") != (self.tool_call_id is not None):
            return "tool_call_id", ("a tool message needs the tool_call_id it answers" if self.role == "tool"
                                    else "only a tool message has a tool_call_id")
        if self.role != "assistant" and (self.reasoning_content is not None or self.refusal is not None):
            return ("reasoning_content" if self.reasoning_content is not None else "refusal"), \
                "only an assistant message has it"
        return None

    def as_template_message(self) -> dict:
        # "developer" is OpenAI's newer name for the system role; chat templates know "system"
        msg = {"role": "system" if self.role == "developer" else self.role,
               "content": "" if self.content is None else self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_template_call() for c in self.tool_calls]
        extra = {"name": self.name, "tool_call_id": self.tool_call_id, "reasoning_content": self.reasoning_content}
        return msg | {k: v for k, v in extra.items() if v is not None}


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Prediction(Strict):
    type: Literal["content"]
    content: Any

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return _text(v)


class StreamOptions(Strict):
    include_usage: bool = False


class _Sampling(Strict):
    """Fields both endpoints share."""

    model: str | None = None  # any name, or none: the server has one model, as llama-server
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0)
    stop: Any = Field(None, validate_default=True)
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Any = None
    user: str | None = None  # an end-user id for the caller's own records: accepted, not used
    # extensions (llama-server's names)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0)
    repeat_last_n: int | None = Field(None, ge=-1)
    ignore_eos: bool = False  # generate to max_tokens past EOS (llama-server's and vLLM's name): load tests

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None or isinstance(v, str):
            return [] if v is None else [v]
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return v
        raise ValueError("must be a string or a list of strings")

    # field -> (is the value neutral?, what to say) for OpenAI fields fuel does not implement
    UNSUPPORTED: ClassVar[dict] = {
        "n": (lambda v: v in (None, 1), "n must be 1: fuel serve returns one choice per request"),
        "presence_penalty": (lambda v: not v, "presence_penalty is not supported (use repeat_penalty)"),
        "frequency_penalty": (lambda v: not v, "frequency_penalty is not supported (use repeat_penalty)"),
        "logit_bias": (lambda v: not v, "logit_bias is not supported"),
    }

    def check(self):
        """Checks that span fields, and the unsupported fields; raises APIError."""
        for name, (neutral, message) in self.UNSUPPORTED.items():
            if not neutral(getattr(self, name)):
                raise bad_request(message, param=name)
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
        return self


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # to templates that take it (jobs.py)
    # OpenAI's bookkeeping: checked, then without effect (fuel keeps no logs, has one tier)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prediction: Prediction | None = None  # proposals for --lookup-decoding; without it, unused
    # extensions (llama-server's and vLLM's names)
    chat_template_kwargs: dict | None = None
    reasoning_format: Literal["none", "auto", "deepseek"] | None = None

    UNSUPPORTED: ClassVar[dict] = _Sampling.UNSUPPORTED | {
        "functions": (lambda v: not v, "functions are not supported by fuel serve (use tools)"),
        "function_call": (lambda v: v in (None, "none"), "function_call is not supported by fuel serve (use tool_choice)"),
        "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
        "audio": (lambda v: v is None, "audio output is not supported"),
    }

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        # OpenAI's limits: 16 pairs, keys of at most 64 characters, values of at most 512
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
            raise ValueError("at most 16 pairs, keys of at most 64 characters and values of at most 512")
        return v

    def check(self):
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", param="top_logprobs")
        for i, m in enumerate(self.messages):
            problem = m.problem()
            if problem is not None:
                field, what = problem
                where = f"messages[{i}].{field}"
                raise bad_request(f"{what}: '{where}'." if what.startswith("Missing") else f"{where}: {what}",
                                  param=where)
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise bad_request("tools: two functions have the same name", param="tools")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise bad_request(f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                              param="tool_choice")
        if choice in ("required",) and not names:
            raise bad_request("tool_choice required needs tools", param="tool_choice")
        rf = self.response_format
        if rf is not None and (rf.type == "json_schema") != (rf.json_schema is not None):
            raise bad_request("response_format.json_schema goes with type json_schema (and only there)",
                              param="response_format.json_schema")
        return self

    @property
    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def n_logprobs(self) -> int | None:
        """None: no logprobs; k: the chosen token's and k alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: Any
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    UNSUPPORTED: ClassVar[dict] = _Sampling.UNSUPPORTED | {
        "echo": (lambda v: not v, "echo is not supported by fuel serve"),
        "best_of": (lambda v: v in (None, 1), "best_of must be 1: fuel serve returns one choice per request"),
        "suffix": (lambda v: v is None, "suffix is not supported by fuel serve"),
    }

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        """A string or a list of token ids, or a list holding one of those (OpenAI's batch form)."""
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v and all(type(t) is int for t in v):
            return v
        raise ValueError("must be a string or a non-empty list of token ids (one prompt per request)")

    @property
    def max_new(self) -> int | None:
        return self.max_tokens

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def api_error(e: ValidationError) -> APIError:
    err = e.errors(include_url=False)[0]
    kind, param = err["type"], _where(err["loc"]) or None
    if kind == "json_invalid":
        return bad_request(f"the body is not valid JSON: {err['msg'].removeprefix('Invalid JSON: ')}")
    if kind == "model_type" and not err["loc"]:
        return bad_request("the body must be a JSON object")
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param=param)
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param=param)
    msg = err["msg"].removeprefix("Value error, ")
    return bad_request(f"{param}: {msg}" if param else msg, param=param)


def parse(cls: type[Strict], body: bytes):
    """The checked request (cls with a check() method), or APIError (400) naming the first problem."""
    try:
        req = cls.model_validate_json(body)
    except ValidationError as e:
        raise api_error(e) from None
    return req.check()
