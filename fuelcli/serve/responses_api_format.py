"""OpenAI's Responses API shapes: the `response` object, its output items, its stream events.

The reply is read by the same ReplyParser as a chat completion's; its parts become output items:
reasoning a `reasoning` item (reasoning_text content), content a `message` item (one output_text
part), each call a `function_call` item (its arguments whole, in one delta, once the call is
complete). Streamed: response.created, then per item response.output_item.added, its part and
deltas (response.output_text.delta, response.reasoning_text.delta,
response.function_call_arguments.delta) and their .done events, response.output_item.done, then
response.completed (or response.incomplete at max_output_tokens).
"""

from __future__ import annotations

import copy
import json
import time
import uuid

from .errors import APIError
from .jobs import Done
from .reply import ReplyParser, whole


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponsesFrames:
    """Server-sent events as the Responses API writes them: each names its type and carries a
    sequence number; an error is an `error` event; no [DONE]."""

    end = ""

    def __init__(self):
        self.n = 0

    def frame(self, data: dict) -> str:
        data = {**data, "sequence_number": self.n}
        self.n += 1
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def error(self, e: APIError) -> str:
        return self.frame({"type": "error", "code": e.code or e.type, "message": e.message, "param": e.param})


class ResponsesFormat:
    def __init__(self, model_id: str, parser: ReplyParser, echo: dict, remember):
        """echo: the request's fields a response repeats; remember(turn): keeps the reply's
        assistant turn for previous_response_id (a no-op with store false)."""
        self.id, self.created, self.model = _id("resp"), int(time.time()), model_id
        self.parser, self.echo, self.remember = parser, echo, remember
        self.output: list[dict] = []  # the items streamed so far
        self.open: dict | None = None  # the message or reasoning item being streamed

    def _body(self, status: str, output: list, done: Done | None = None) -> dict:
        usage = incomplete = None
        if done is not None:
            s = done.stats
            usage = {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_tokens},
                     "output_tokens": s.generated, "total_tokens": s.prompt_tokens + s.generated}
            if done.finish_reason == "length":
                incomplete = {"reason": "max_output_tokens"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "usage": usage, "error": None,
                "incomplete_details": incomplete, **self.echo}

    @staticmethod
    def _status(done: Done) -> str:
        return "incomplete" if done.finish_reason == "length" else "completed"

    def _turn(self, content: str, reasoning: str | None, calls: list[dict]) -> dict:
        turn = {"role": "assistant", "content": content}
        if reasoning:
            turn["reasoning_content"] = reasoning
        if calls:
            turn["tool_calls"] = calls
        return turn

    @staticmethod
    def _message(text: str, status: str = "completed") -> dict:
        return {"id": _id("msg"), "type": "message", "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    @staticmethod
    def _reasoning(text: str) -> dict:
        return {"id": _id("rs"), "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    @staticmethod
    def _call(call: dict) -> dict:
        return {"id": _id("fc"), "type": "function_call", "status": "completed", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"]}

    def response(self, text: str, lps, done: Done) -> dict:
        content, reasoning, calls = whole(self.parser, text)
        items = [self._reasoning(reasoning)] if reasoning else []
        items += [self._message(content)] if content else []
        items += [self._call(c) for c in calls]
        self.remember(self._turn(content or "", reasoning, calls))
        return self._body(self._status(done), items, done)

    def start_chunk(self) -> dict:
        return {"type": "response.created", "response": self._body("in_progress", [])}

    def delta_chunks(self, text: str, lps) -> list[dict]:
        return self._events(self.parser.feed(text))

    def finish_chunks(self, done: Done) -> list[dict]:
        events = self._events(self.parser.finish()) + self._close()
        kinds = {"message": "", "reasoning": ""}
        for item in self.output:
            if item["type"] in kinds:
                kinds[item["type"]] += item["content"][0]["text"]
        self.remember(self._turn(kinds["message"], kinds["reasoning"], self.parser.calls))
        status = self._status(done)
        return events + [{"type": f"response.{status}", "response": self._body(status, self.output, done)}]

    def _added(self, item: dict, shown: dict) -> dict:
        """The item joins the output; the event shows it as it starts (a copy: the item grows)."""
        self.output.append(item)
        return {"type": "response.output_item.added", "output_index": len(self.output) - 1,
                "item": copy.deepcopy(shown)}

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
        part = item["content"][0]
        if item["type"] == "message":
            item["status"] = "completed"
            events = [{"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
                      {"type": "response.content_part.done", **at, "part": dict(part)}]
        else:
            events = [{"type": "response.reasoning_text.done", **at, "text": part["text"]}]
        return events + [{"type": "response.output_item.done", "output_index": at["output_index"], "item": item}]

    def _events(self, parts) -> list[dict]:
        out = []
        for kind, value in parts:
            if kind == "tool_call":
                out += self._close()
                item = self._call(value)
                out.append(self._added(item, {**item, "arguments": "", "status": "in_progress"}))
                at = {"item_id": item["id"], "output_index": len(self.output) - 1}
                out += [{"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
                        {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"],
                         "name": item["name"]},
                        {"type": "response.output_item.done", "output_index": at["output_index"], "item": item}]
                continue
            kind = "reasoning" if kind == "reasoning" else "message"
            if self.open is None or self.open["type"] != kind:
                out += self._close()
                self.open = self._message("", "in_progress") if kind == "message" else self._reasoning("")
                out.append(self._added(self.open, {**self.open, "content": []}))
                if kind == "message":
                    out.append({"type": "response.content_part.added", "item_id": self.open["id"],
                                "output_index": len(self.output) - 1, "content_index": 0,
                                "part": dict(self.open["content"][0])})
            part = self.open["content"][0]
            part["text"] += value
            out.append({"type": f"response.{'output_text' if kind == 'message' else 'reasoning_text'}.delta",
                        "item_id": self.open["id"], "output_index": len(self.output) - 1, "content_index": 0,
                        "delta": value, **({"logprobs": []} if kind == "message" else {})})
        return out
