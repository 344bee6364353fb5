"""The request bodies of /v1/chat/completions and /v1/completions, checked strictly.

Types are strict (a string is not a number, 1 is not true), unknown fields are refused as OpenAI
refuses them, and OpenAI fields fuel cannot honour (tools, logit_bias, n > 1, ...) are refused by
name unless they hold their neutral value: a request never silently gets less than it asked for.
Sampling fields left out take `fuel run`'s defaults, as llama-server does; top_k, min_p,
repeat_penalty and repeat_last_n are accepted as extensions under llama-server's names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import APIError, bad_request

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v):
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

    def as_template_message(self) -> dict:
        # "developer" is OpenAI's newer name for the system role; chat templates know "system"
        msg = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        return msg | ({"name": self.name} if self.name is not None else {})


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields both endpoints share."""

    model: str
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
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None  # meaningless without tools: accepted
    response_format: Any = None
    modalities: Any = None
    audio: Any = None
    reasoning_effort: Any = None

    UNSUPPORTED: ClassVar[dict] = _Sampling.UNSUPPORTED | {
        "tools": (lambda v: not v, "tools are not supported by fuel serve"),
        "tool_choice": (lambda v: v in (None, "none"), "tool_choice is not supported by fuel serve"),
        "functions": (lambda v: not v, "functions are not supported by fuel serve"),
        "function_call": (lambda v: v in (None, "none"), "function_call is not supported by fuel serve"),
        "response_format": (lambda v: v in (None, {"type": "text"}), "response_format other than text is not supported"),
        "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
        "audio": (lambda v: v is None, "audio output is not supported"),
        "reasoning_effort": (lambda v: v is None, "reasoning_effort is not supported"),
    }

    def check(self):
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", param="top_logprobs")
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


def _api_error(e: ValidationError) -> APIError:
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


def parse(cls: type[_Sampling], body: bytes) -> _Sampling:
    """The checked request, or APIError (400) naming the first problem."""
    try:
        req = cls.model_validate_json(body)
    except ValidationError as e:
        raise _api_error(e) from None
    return req.check()
