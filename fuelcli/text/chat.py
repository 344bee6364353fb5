"""A conversation kept in the KV cache.

Each turn renders the whole conversation with the chat template (so what the model sees is what
the template says, whatever it does with earlier turns), finds how many leading ids it shares with
what the engine holds, rewinds the engine to them and prefills only the rest: a new turn costs its
own tokens. Where the template renders an earlier reply differently from how it was generated
(re-tokenised text, stripped reasoning), the shared prefix ends there and the rest is prefilled again.
When the conversation outgrows the context, its oldest exchanges are dropped (as ollama does).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .generate import Sampler, Stats, common_prefix, generate
from .reply_formats import readable


@dataclass
class Turn:
    """One user message, rendered: the ids of the whole conversation and how many are cached."""

    messages: list  # the user/assistant messages the ids render (oldest dropped to fit)
    ids: list
    cached: int  # leading ids the engine already holds
    dropped: int  # exchanges dropped from the start of the conversation to fit the context


class ChatSession:
    def __init__(self, engine, tokenizer, sampler: Sampler, eos_ids: set, system: str | None = None,
                 template_kwargs: dict | None = None, stops: list[str] | None = None, max_tokens: int | None = None,
                 speculation=None):
        if not tokenizer.chat_template:
            raise InputError("chat needs a chat template; this model has none (give --chat-template FILE)")
        self.engine, self.tokenizer, self.sampler, self.eos_ids = engine, tokenizer, sampler, eos_ids
        self.system, self.template_kwargs = system, template_kwargs
        self.stops, self.max_tokens = list(stops or []), max_tokens
        self.speculation = speculation  # a speculative.Speculation, or None: plain decoding
        self.messages: list[dict] = []  # user and assistant turns, alternating
        self.held: list[int] = []  # the ids in the engine's KV cache (its first engine.pos)

    def clear(self):
        """Forget the conversation (the cache keeps what it holds; the next turn reuses its prefix)."""
        self.messages = []

    def set_system(self, text: str | None):
        self.system = text or None

    def _ids(self, messages: list[dict]) -> list[int]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return self.tokenizer.encode_messages(system + messages, template_kwargs=self.template_kwargs)

    def prepare(self, text: str) -> Turn:
        """Render the conversation with a new user message, dropping the oldest exchanges until it
        leaves room for a reply (-n tokens, or a quarter of the context when -n is unlimited)."""
        n_ctx = self.engine.n_ctx
        room = min(self.max_tokens, n_ctx // 2) if self.max_tokens else n_ctx // 4
        messages = self.messages + [{"role": "user", "content": text}]
        ids, dropped = self._ids(messages), 0
        while len(ids) + room > n_ctx and len(messages) > 1:
            messages = messages[2:]  # the oldest user message and its reply
            ids, dropped = self._ids(messages), dropped + 1
        if len(ids) >= n_ctx:
            raise InputError(f"the message needs {len(ids)} tokens with the chat template; the context is {n_ctx} (-c)")
        return Turn(messages, ids, common_prefix(self.held, ids), dropped)

    def reply(self, turn: Turn, stats: Stats):
        """Generate the reply, yielding text; the conversation keeps what was yielded, also when
        the reply is cut short (Ctrl-C: the consumer closes this generator)."""
        # Rewound here, before anything can be interrupted: `held` stays a prefix of what the engine holds.
        # fewer tokens kept where a recurrent state goes back to its last checkpoint (the rest is fed again)
        n = self.engine.rewind(min(turn.cached, len(turn.ids) - 1))
        self.held = self.held[:n]
        pieces = []
        budget = self.max_tokens or self.engine.n_ctx
        # a harmony (gpt-oss) or Gemma 4 reply is kept as its template wants it back: the answer as the
        # content, the reasoning under the template's key (it drops it from earlier turns)
        reader = readable(self.tokenizer.chat_template)
        try:
            for piece in generate(self.engine, self.tokenizer, turn.ids, budget, self.sampler, self.eos_ids,
                                  self.stops, stats, cached=n, speculation=self.speculation, reader=reader):
                pieces.append(piece)
                yield piece
        finally:
            self.held = (turn.ids + stats.tokens)[: self.engine.pos]
            said = {"content": "".join(pieces)} if reader is None else reader.message()
            self.messages = turn.messages + [{"role": "assistant", **said}]
