"""Anthropic's response shapes: the `message` object, its stream events, and the error object.

The reply is read by the same ReplyParser as a chat completion's; its parts become content blocks:
reasoning a `thinking` block, content a `text` block, each call a `tool_use` block (its input whole,
in one input_json_delta, once the call is complete). Streamed: message_start, then per block
content_block_start / content_block_delta... / content_block_stop, then message_delta (stop_reason,
usage) and message_stop.
"""

from __future__ import annotations

import json
import uuid

from .errors import APIError
from .jobs import Done
from .reply import ReplyParser, whole

# status -> Anthropic's error type (the statuses stay fuel's)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(e: APIError) -> dict:
    kind = ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _frame(data: dict) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class AnthropicFrames:
    """Server-sent events as Anthropic writes them: each names its type; no [DONE]."""

    end = ""
    frame = staticmethod(_frame)

    @staticmethod
    def error(e: APIError) -> str:
        return _frame(error_body(e))


def _tool_use(call: dict) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


class MessagesFormat:
    def __init__(self, model_id: str, parser: ReplyParser, prompt_tokens: int):
        self.id, self.model = f"msg_{uuid.uuid4().hex[:24]}", model_id
        self.parser, self.prompt_tokens = parser, prompt_tokens
        self.index, self.open = -1, None  # the current block and its kind ("thinking" | "text"), if open

    @staticmethod
    def usage(done: Done) -> dict:
        s = done.stats
        return {"input_tokens": s.prompt_tokens - s.cached_tokens, "output_tokens": s.generated,
                "cache_read_input_tokens": s.cached_tokens, "cache_creation_input_tokens": 0}

    @staticmethod
    def stop_reason(done: Done, calls) -> str:
        if done.finish_reason == "length":
            return "max_tokens"
        if calls:
            return "tool_use"
        return "stop_sequence" if done.stop is not None else "end_turn"

    def response(self, text: str, lps, done: Done) -> dict:
        content, reasoning, calls = whole(self.parser, text)
        blocks = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
        blocks += [{"type": "text", "text": content}] if content else []
        blocks += [_tool_use(c) for c in calls]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": blocks,
                "stop_reason": self.stop_reason(done, calls), "stop_sequence": done.stop, "usage": self.usage(done)}

    def start_chunk(self) -> dict:
        return {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}}

    def delta_chunks(self, text: str, lps) -> list[dict]:
        return self._events(self.parser.feed(text))

    def finish_chunks(self, done: Done) -> list[dict]:
        events = self._events(self.parser.finish()) + self._close()
        stop = self.stop_reason(done, self.parser.calls)
        return events + [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": done.stop},
                          "usage": self.usage(done)},
                         {"type": "message_stop"}]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _start(self, block: dict) -> list[dict]:
        events = self._close()
        self.index += 1
        return events + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _events(self, parts) -> list[dict]:
        out = []
        for kind, value in parts:
            if kind == "tool_call":
                block = _tool_use(value)
                out += self._start({**block, "input": {}})
                out.append({"type": "content_block_delta", "index": self.index,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
                self.open = "tool_use"
                out += self._close()
                continue
            kind = "thinking" if kind == "reasoning" else "text"
            if self.open != kind:
                out += self._start({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
                self.open = kind
            out.append({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": f"{kind}_delta", kind: value}})
        return out
