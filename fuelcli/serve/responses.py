"""OpenAI response bodies: chat.completion / text_completion objects and their stream chunks.

One formatter per endpoint with the same methods (response, start_chunk, delta_chunks, finish_chunks,
usage_chunk), so the routes and the SSE stream treat every API alike.
"""

from __future__ import annotations

import time
import uuid

from ..text.generate import Stats
from .jobs import Done
from .logprobs import TokenLogprob
from .reply import ReplyParser, whole


def usage(s: Stats) -> dict:
    out = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
           "total_tokens": s.prompt_tokens + s.generated,
           "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}
    if s.speculation:  # speculative decoding's proposals, in OpenAI's fields for predicted outputs
        out["completion_tokens_details"] = {"accepted_prediction_tokens": s.accepted,
                                            "rejected_prediction_tokens": s.drafted - s.accepted}
    return out


class _Format:
    object = chunk_object = prefix = "?"

    def __init__(self, model_id: str):
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created, self.model = int(time.time()), model_id

    def _body(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def usage_chunk(self, s: Stats) -> dict:
        """The last chunk when stream_options.include_usage is set: no choices, the usage."""
        return self._body(self.chunk_object, [], usage=usage(s))


class ChatFormat(_Format):
    """The reply goes through a ReplyParser: reasoning as `reasoning_content`, tool calls as
    `tool_calls` (finish_reason "tool_calls"), the rest as `content`; streamed the same way, each
    call in one delta once it is complete (OpenAI's clients join deltas by the call's index)."""

    object, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model_id: str, n_logprobs: int | None, parser: ReplyParser | None = None):
        super().__init__(model_id)
        self.logprobs = n_logprobs is not None
        self.parser = parser or ReplyParser()
        self.n_calls = 0
        self.pending: list[TokenLogprob] = []  # logprobs of text held back by the parser

    @staticmethod
    def _entry(lp: TokenLogprob) -> dict:
        return {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
                "top_logprobs": [{"token": t, "logprob": p, "bytes": b} for t, b, p in lp.top]}

    def _logprobs(self, lps: list[TokenLogprob]) -> dict | None:
        return {"content": [self._entry(lp) for lp in lps], "refusal": None} if self.logprobs else None

    @staticmethod
    def _finish(finish: str, calls) -> str:
        return "tool_calls" if calls and finish == "stop" else finish

    def response(self, text: str, lps: list[TokenLogprob], done: Done) -> dict:
        finish, s = done.finish_reason, done.stats
        content, reasoning, calls = whole(self.parser, text)
        message = {"role": "assistant", "content": content, "refusal": None}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(lps),
                  "finish_reason": self._finish(finish, calls)}
        return self._body(self.object, [choice], usage=usage(s))

    def start_chunk(self) -> dict | None:
        return self._chunk({"role": "assistant", "content": ""}, None, None)

    def delta_chunks(self, text: str, lps: list[TokenLogprob]) -> list[dict]:
        self.pending += lps
        return self._parts(self.parser.feed(text))

    def finish_chunks(self, done: Done) -> list[dict]:
        finish = done.finish_reason
        chunks = self._parts(self.parser.finish())
        rest, self.pending = self.pending, []
        return chunks + [self._chunk({}, self._logprobs(rest) if rest else None,
                                     self._finish(finish, self.parser.calls))]

    def _parts(self, parts) -> list[dict]:
        out = []
        for kind, value in parts:
            if kind == "tool_call":
                delta = {"tool_calls": [{"index": self.n_calls, **value}]}
                self.n_calls += 1
            else:
                delta = {"content" if kind == "content" else "reasoning_content": value}
            lps, self.pending = self.pending, []
            out.append(self._chunk(delta, self._logprobs(lps), None))
        return out

    def _chunk(self, delta: dict, logprobs, finish) -> dict:
        return self._body(self.chunk_object, [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])


class CompletionFormat(_Format):
    object = chunk_object = "text_completion"
    prefix = "cmpl"

    def __init__(self, model_id: str, n_logprobs: int | None):
        super().__init__(model_id)
        self.logprobs = n_logprobs is not None
        self.offset = 0  # text_offset of the next token, in characters of the generated text

    def _logprobs(self, lps: list[TokenLogprob]) -> dict | None:
        if not self.logprobs:
            return None
        offsets = []
        for lp in lps:
            offsets.append(self.offset)
            self.offset += lp.shown
        return {"tokens": [lp.token for lp in lps], "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": [{t: p for t, _, p in lp.top} for lp in lps], "text_offset": offsets}

    def response(self, text: str, lps: list[TokenLogprob], done: Done) -> dict:
        return self._body(self.object, [self._choice(text, lps, done.finish_reason)], usage=usage(done.stats))

    def start_chunk(self) -> dict | None:
        return None

    def delta_chunks(self, text: str, lps: list[TokenLogprob]) -> list[dict]:
        return [self._body(self.chunk_object, [self._choice(text, lps, None)])]

    def finish_chunks(self, done: Done) -> list[dict]:
        return [self._body(self.chunk_object, [self._choice("", [], done.finish_reason)])]

    def _choice(self, text: str, lps: list[TokenLogprob], finish) -> dict:
        return {"index": 0, "text": text, "logprobs": self._logprobs(lps), "finish_reason": finish}
