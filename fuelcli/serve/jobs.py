"""A checked request -> a Job for the engine worker: prompt ids, sampler settings, stops, logprobs.

The prompt is built exactly as `fuel run` builds it: the model's chat template rendered with
add_generation_prompt and encoded without added special tokens (the template writes BOS where the
model wants one); a completions prompt is encoded with them, as `fuel run --no-chat-template`.
A chat job also says how its reply is read back (reasoning, tool calls: reply.py) and what grammar
constrains it: response_format's schema, or the tools' when a call is demanded or a tool is strict.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import FuelError, InputError
from ..text import grammar as g
from ..text.generate import SamplerParams, Stats
from ..text.reply_formats import reply_format
from . import gemma4, harmony
from . import tools as tool_formats
from .errors import APIError, bad_request
from .reply import END_THINK, THINK, ReplyParser
from .schemas import ChatRequest, CompletionRequest, NamedToolChoice

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs until EOS or the context


@dataclass(frozen=True)
class Special:
    """The server's side of a reply format read from its special tokens (text/reply_formats.py)."""

    parser: Callable  # (reasoning) -> the reply's parser
    tools: Callable  # (tokenizer) -> its tool-call format
    final_json: Callable  # (tokenizer, schema, strict, what) -> response_format's grammar on the answer


SERVED = {"harmony": Special(harmony.parser, lambda tok: harmony.HarmonyTools(),
                             lambda tok, *schema_strict_what: harmony.final_json(*schema_strict_what)),
          "gemma4": Special(gemma4.parser, gemma4.Gemma4Tools, gemma4.final_json)}


@dataclass
class ServedModel:
    """What the routes need to know of the one model this process serves."""

    id: str
    names: set[str]  # the ids GET /v1/models/ID knows: the id and the MODEL argument as typed (a request may name any)
    tokenizer: object
    n_ctx: int
    vocab_size: int
    eos_ids: set
    created: int
    template_kwargs: dict | None = None  # fuel serve --chat-template-kwargs: each request's defaults
    reasoning_format: str = "auto"  # fuel serve --reasoning-format: "auto" splits <think> out, "none" keeps it
    embedder: object = None  # pooling.Embedder: what /v1/embeddings pools the hidden states with


@dataclass
class Delta:
    text: str
    logprobs: list = field(default_factory=list)  # TokenLogprob of the tokens behind `text`


@dataclass
class Done:
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: Stats
    stop: str | None = None  # the stop string that ended the reply (Anthropic's stop_sequence)


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
    grammar: g.Grammar | None = None  # the worker starts its matcher (building the vocabulary may take a second)
    reply: dict = field(default_factory=dict)  # ReplyParser's arguments (chat): how the text is read back
    # a reply read from its special tokens (harmony, Gemma 4: SERVED): its parser's maker; it is
    # decoded with them kept. None: plain text, read by ReplyParser
    read_by: Callable | None = None
    prediction: list[int] = field(default_factory=list)  # the predicted output's ids: lookup decoding's proposals
    ignore_eos: bool = False  # generate past the EOS ids, to max_tokens (stop strings still stop)
    arrived: float = field(default_factory=time.perf_counter)  # for the time to first token (/metrics)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    outbox: "Outbox | None" = None  # set by the worker once the job runs: its events go out a step at a time
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event) -> None:
        """From the worker thread: hand an event to the request's handler on the event loop (through
        the worker's outbox while the job runs)."""
        if self.outbox is not None:
            self.outbox.items.append((self, event))
        else:
            _send(self.loop, [(self, event)])

    def cancel(self) -> None:
        """The client went away (or the server is stopping): the worker stops at the next token."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def parser(self):
        """A reply.ReplyParser, or the parser of a format read from its special tokens: the same interface."""
        return self.read_by(**self.reply) if self.read_by is not None else ReplyParser(**self.reply)


class Outbox:
    """The events of a worker step's jobs, handed to the event loop together: one wake-up of the loop
    a step, not one a token (each call_soon_threadsafe writes to the loop's self-pipe and gives the
    loop its turn at the GIL: ~0.7 ms of a 4-sequence step's ~21 ms on the Qwen demo)."""

    def __init__(self):
        self.items: list = []

    def flush(self) -> None:
        items, self.items = self.items, []
        loops: dict = {}
        for job, event in items:
            loops.setdefault(job.loop, []).append((job, event))
        for loop, batch in loops.items():
            _send(loop, batch)


def _send(loop, batch: list) -> None:
    try:
        loop.call_soon_threadsafe(_deliver, batch)
    except RuntimeError:  # the loop has closed (the server is gone): nobody is listening
        for job, _ in batch:
            job.cancel()


def _deliver(batch: list) -> None:
    for job, event in batch:
        job.events.put_nowait(event)


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


def _compiled(build, param: str) -> g.Grammar:
    """A grammar, or a 400 naming the field: a bad schema, or llguidance missing (named with its extra)."""
    try:
        return build()
    except FuelError as e:
        raise bad_request(str(e), param=param) from None


def _output_grammar(req: ChatRequest, fmt, tools: list, after: str | None) -> g.Grammar | None:
    """What constrains the reply: the tools' schemas when a call is demanded (tool_choice required or
    a named function: from the first token) or a tool is strict (lazily, from the call's opening tag:
    the model may also answer in text); else response_format's schema. `after`: a reply that starts
    inside the reasoning is constrained once that has ended (</think>)."""
    choice = req.tool_choice or "auto"
    rf = req.response_format
    if tools and choice != "none":
        if isinstance(choice, NamedToolChoice):
            chosen, forced = [f for f in tools if f.name == choice.function.name], True
        else:
            chosen, forced = tools, choice == "required"
        strict = any(f.strict for f in chosen)
        if rf is not None and rf.type != "text":
            raise bad_request("response_format with tools is not supported: the reply is a call or text in the "
                              "tool format of the template", param="response_format")
        if forced or strict:
            parallel = req.parallel_tool_calls is not False and not isinstance(choice, NamedToolChoice)
            return _compiled(lambda: fmt.grammar(chosen, parallel, lazy=not forced, strict=strict, after=after),
                             "tools")
        return None
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return _compiled(lambda: g.json_object(after), "response_format")
    js = rf.json_schema
    schema = {"type": "object"} if js.schema_ is None else js.schema_
    return _compiled(lambda: g.json_schema(schema, strict=bool(js.strict),
                                           what="response_format.json_schema.schema", after=after),
                     "response_format.json_schema")


def chat_prompt(req: ChatRequest, model: ServedModel) -> tuple[str, list[int], object, list]:
    """The chat template rendered for a request: (text, its ids, the tool-call format or None, the
    declared tools.Function); the length is not checked (counting tokens needs no room)."""
    tok = model.tokenizer
    if tok.chat_template is None:
        raise bad_request("this model has no chat template; use /v1/completions with a raw prompt", param="messages")
    choice = req.tool_choice or "auto"
    special = reply_format(tok.chat_template)
    fmt, tools = None, []
    if req.tools and choice != "none":  # tool_choice none: the tools are left out of the prompt
        fmt = tool_formats.detect(tok.chat_template) or (SERVED[special.name].tools(tok) if special else None)
        if fmt is None:
            raise bad_request("this model's chat template has no tool-call format fuel knows (Qwen2.5/Qwen3 "
                              "<tool_call> blocks, Llama 3.1 JSON calls, harmony, Gemma 4)", param="tools")
        tools = [tool_formats.Function(t.function.name, t.function.parameters or tool_formats.EMPTY_PARAMETERS,
                                       bool(t.function.strict)) for t in req.tools]
    kwargs = {**(model.template_kwargs or {}), **_effort(req, model),
              **(req.chat_template_kwargs or {})} or None
    messages = [m.as_template_message() for m in req.messages]
    key = special.reasoning_key if special else "reasoning_content"
    if key != "reasoning_content":  # gpt-oss's template reads an assistant turn's reasoning as `thinking`
        messages = [{**m, key: m["reasoning_content"]} if "reasoning_content" in m else m for m in messages]
    try:
        text = tok.render_chat(messages, add_generation_prompt=True,
                               template_kwargs=kwargs,
                               tools=[t.model_dump(exclude_none=True) for t in req.tools] if tools else None)
    except InputError as e:  # the template refused the conversation (raise_exception) or failed
        raise bad_request(str(e), param="messages") from None
    return text, tok.encode(text, add_special_tokens=False), fmt, tools


def takes_effort(model: ServedModel) -> bool:
    """Whether the model's chat template reads a reasoning_effort (gpt-oss's "Reasoning: low|medium|high")."""
    return "reasoning_effort" in (model.tokenizer.chat_template or "")


def _effort(req: ChatRequest, model: ServedModel) -> dict:
    """The request's reasoning_effort as the template's variable, or a 400 where it has none."""
    if req.reasoning_effort is None:
        return {}
    if not takes_effort(model):
        raise bad_request("reasoning_effort is not supported by this model's chat template (chat_template_kwargs "
                          "{\"enable_thinking\": false} turns a Qwen3 model's thinking off)", param="reasoning_effort")
    return {"reasoning_effort": req.reasoning_effort}


def _special_grammar(req: ChatRequest, tok, fmt, tools: list, final_json) -> g.Grammar | None:
    """The grammar of a reply read from its special tokens: the tools' as for the other formats
    (HarmonyTools, Gemma4Tools), or response_format's on the answer, the reasoning before it free."""
    rf = req.response_format
    if fmt is not None or rf is None or rf.type == "text":
        return _output_grammar(req, fmt, tools, None)
    if rf.type == "json_object":
        return _compiled(lambda: final_json(tok, {"type": "object"}, False, "response_format json_object"),
                         "response_format")
    js = rf.json_schema
    schema = {"type": "object"} if js.schema_ is None else js.schema_
    return _compiled(lambda: final_json(tok, schema, bool(js.strict), "response_format.json_schema.schema"),
                     "response_format.json_schema")


def _special_job(req: ChatRequest, model: ServedModel, loop, ids: list[int], fmt, tools: list, name: str) -> Job:
    """A gpt-oss or Gemma 4 reply: reasoning, content and calls are read from its markers (SERVED)."""
    served = SERVED[name]
    grammar = _special_grammar(req, model.tokenizer, fmt, tools, served.final_json)
    reasoning = (req.reasoning_format or model.reasoning_format) != "none"
    prediction = model.tokenizer.encode(req.prediction.content, add_special_tokens=False) if req.prediction else []
    return Job("chat", ids, req.max_new or model.n_ctx, _sampler_params(req), req.stop, req.n_logprobs, loop,
               grammar=grammar, reply={"reasoning": reasoning}, read_by=served.parser, prediction=prediction,
               ignore_eos=req.ignore_eos)


def chat_job(req: ChatRequest, model: ServedModel, loop) -> Job:
    tok = model.tokenizer
    choice = req.tool_choice or "auto"
    text, ids, fmt, tools = chat_prompt(req, model)
    _check_length(ids, model, "messages")
    special = reply_format(tok.chat_template)
    if special is not None:
        return _special_job(req, model, loop, ids, fmt, tools, special.name)
    # reasoning is read out of the reply where the template knows <think> (Qwen3, DeepSeek-R1, QwQ);
    # a prompt that ends inside <think> (the template opened it) starts the reply in the reasoning,
    # and a grammar then holds from its end
    reasoning = (req.reasoning_format or model.reasoning_format) != "none" and THINK in tok.chat_template
    thinking = text.rstrip().endswith(THINK)
    grammar = _output_grammar(req, fmt, tools, END_THINK if thinking else None)
    # with tool_choice auto a reply may also be a bare JSON call (a forced one follows the grammar)
    reply = {"tools": fmt, "reasoning": reasoning, "in_reasoning": reasoning and thinking,
             "functions": tools if choice == "auto" else None}
    prediction = tok.encode(req.prediction.content, add_special_tokens=False) if req.prediction else []
    return Job("chat", ids, req.max_new or model.n_ctx, _sampler_params(req), req.stop, req.n_logprobs, loop,
               grammar=grammar, reply=reply, prediction=prediction, ignore_eos=req.ignore_eos)


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
    return Job("completion", ids, max_new, _sampler_params(req), req.stop, req.n_logprobs, loop,
               ignore_eos=req.ignore_eos)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist; this server serves one model (see /v1/models).",
                    param="model", code="model_not_found")
