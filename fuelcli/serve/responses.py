"""OpenAI response bodies: chat.completion / text_completion objects and their stream chunks.

One formatter per endpoint with the same methods, so the routes and the SSE stream treat both alike.
"""

from __future__ import annotations

import time
import uuid

from ..generate import Stats
from .logprobs import TokenLogprob


def usage(s: Stats) -> dict:
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}


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
    object, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model_id: str, n_logprobs: int | None):
        super().__init__(model_id)
        self.logprobs = n_logprobs is not None

    @staticmethod
    def _entry(lp: TokenLogprob) -> dict:
        return {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
                "top_logprobs": [{"token": t, "logprob": p, "bytes": b} for t, b, p in lp.top]}

    def _logprobs(self, lps: list[TokenLogprob]) -> dict | None:
        return {"content": [self._entry(lp) for lp in lps], "refusal": None} if self.logprobs else None

    def response(self, text: str, lps: list[TokenLogprob], finish: str, s: Stats) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": self._logprobs(lps), "finish_reason": finish}
        return self._body(self.object, [choice], usage=usage(s))

    def start_chunk(self) -> dict | None:
        return self._chunk({"role": "assistant", "content": ""}, None, None)

    def delta_chunk(self, text: str, lps: list[TokenLogprob]) -> dict:
        return self._chunk({"content": text}, self._logprobs(lps), None)

    def finish_chunk(self, finish: str) -> dict:
        return self._chunk({}, None, finish)

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

    def response(self, text: str, lps: list[TokenLogprob], finish: str, s: Stats) -> dict:
        return self._body(self.object, [self._choice(text, lps, finish)], usage=usage(s))

    def start_chunk(self) -> dict | None:
        return None

    def delta_chunk(self, text: str, lps: list[TokenLogprob]) -> dict:
        return self._body(self.chunk_object, [self._choice(text, lps, None)])

    def finish_chunk(self, finish: str) -> dict:
        return self._body(self.chunk_object, [self._choice("", [], finish)])

    def _choice(self, text: str, lps: list[TokenLogprob], finish) -> dict:
        return {"index": 0, "text": text, "logprobs": self._logprobs(lps), "finish_reason": finish}
