"""A checked request -> a Job for the engine worker: prompt ids, sampler settings, stops, logprobs.

The prompt is built exactly as `fuel run` builds it: the model's chat template rendered with
add_generation_prompt and encoded without added special tokens (the template writes BOS where the
model wants one); a completions prompt is encoded with them, as `fuel run --no-chat-template`.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from ..errors import InputError
from ..generate import SamplerParams, Stats
from .errors import APIError, bad_request
from .schemas import ChatRequest, CompletionRequest

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs until EOS or the context


@dataclass
class ServedModel:
    """What the routes need to know of the one model this process serves."""

    id: str
    names: set[str]  # model ids a request may use: the id and the MODEL argument as typed
    tokenizer: object
    n_ctx: int
    vocab_size: int
    eos_ids: set
    created: int


@dataclass
class Delta:
    text: str
    logprobs: list = field(default_factory=list)  # TokenLogprob of the tokens behind `text`


@dataclass
class Done:
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: Stats


@dataclass
class Failed:
    error: APIError


@dataclass
class Job:
    kind: str  # "chat" | "completion": for the log
    prompt_ids: list[int]
    max_tokens: int
    params: SamplerParams
    stops: list[str]
    n_logprobs: int | None  # None: no logprobs; k: the chosen token's and k alternatives
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event) -> None:
        """From the worker thread: hand an event to the request's handler on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop has closed (the server is gone): nobody is listening
            self.cancel()

    def cancel(self) -> None:
        """The client went away (or the server is stopping): the worker stops at the next token."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


def _sampler_params(req) -> SamplerParams:
    d = SamplerParams()
    pick = lambda value, default: default if value is None else value  # noqa: E731
    try:
        return SamplerParams(
            temp=pick(req.temperature, d.temp), top_k=pick(req.top_k, d.top_k), top_p=pick(req.top_p, d.top_p),
            min_p=pick(req.min_p, d.min_p), repeat_penalty=pick(req.repeat_penalty, d.repeat_penalty),
            repeat_last_n=pick(req.repeat_last_n, d.repeat_last_n), seed=req.seed)
    except InputError as e:  # the schema checks the same ranges; this is the backstop
        raise bad_request(str(e)) from None


def _check_length(ids: list[int], model: ServedModel, param: str) -> None:
    if not ids:
        raise bad_request("the prompt is empty (no tokens)", param=param)
    if len(ids) >= model.n_ctx:
        raise bad_request(f"the prompt has {len(ids)} tokens; the context is {model.n_ctx} tokens (fuel serve -c) "
                          "and must leave room for at least one new token", param=param,
                          code="context_length_exceeded")


def chat_job(req: ChatRequest, model: ServedModel, loop) -> Job:
    tok = model.tokenizer
    if tok.chat_template is None:
        raise bad_request("this model has no chat template; use /v1/completions with a raw prompt", param="messages")
    try:
        text = tok.render_chat([m.as_template_message() for m in req.messages], add_generation_prompt=True)
    except InputError as e:  # the template refused the conversation (raise_exception) or failed
        raise bad_request(str(e), param="messages") from None
    ids = tok.encode(text, add_special_tokens=False)
    _check_length(ids, model, "messages")
    return Job("chat", ids, req.max_new or model.n_ctx, _sampler_params(req), req.stop, req.n_logprobs, loop)


def completion_job(req: CompletionRequest, model: ServedModel, loop) -> Job:
    if isinstance(req.prompt, str):
        ids = model.tokenizer.encode(req.prompt, add_special_tokens=True)
    else:
        ids = req.prompt
        bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise bad_request(f"prompt: token id {bad} is out of range 0..{model.vocab_size - 1}", param="prompt")
    _check_length(ids, model, "prompt")
    max_new = req.max_new if req.max_new is not None else COMPLETION_MAX_TOKENS
    return Job("completion", ids, max_new, _sampler_params(req), req.stop, req.n_logprobs, loop)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist; this server serves one model (see /v1/models).",
                    param="model", code="model_not_found")
