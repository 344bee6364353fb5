"""The backend seam: what every engine offers the commands (run, chat, logits, diff, bench, serve).

An engine is built once per model and context size (`make_engine`): it prepares the weights in the
form its kernels read, allocates its activations and its KV cache, and then runs forwards. The
checks on what goes in (token ids, context room) live here, once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..sizes import check_engine_fits


class Engine(ABC):
    device = "?"  # what --device names
    backend = "?"  # how bench reports it

    def __init__(self, cfg: ModelConfig, n_ctx: int | None, kv_value_bytes: int = 4):
        if n_ctx is not None and n_ctx < 1:
            raise InputError(f"context size must be at least 1, got {n_ctx}")
        self.cfg = cfg
        self.n_ctx = min(n_ctx or cfg.max_position, cfg.max_position)
        self.pos = 0  # tokens in the KV cache
        self.kv_value_bytes = kv_value_bytes  # 4: an f32 KV cache, 2: f16
        self.check_fits()  # before a backend allocates its cache and activations

    def check_fits(self):
        """Refuse a context whose KV cache and activations exceed the memory they would live in: the
        host's here; a device backend checks its device's instead."""
        check_engine_fits(self.cfg, self.n_ctx, self.kv_value_bytes)

    @property
    @abstractmethod
    def kv_bytes(self) -> int:
        """Bytes held by the KV cache."""

    def reset(self):
        """Forget the cached tokens."""
        self.pos = 0

    def rewind(self, pos: int):
        """Keep only the first `pos` cached tokens (a shared prompt prefix), forget the rest."""
        if not 0 <= pos <= self.pos:
            raise InputError(f"cannot rewind to {pos}: the cache holds {self.pos} tokens")
        self.pos = pos

    def warm_up(self):
        """One token through the model, then forgotten: the one-time costs of a first forward (a JIT
        compile or loading compiled kernels, paging in the weights) are paid here, before any timing.
        A backend that can compile or load its code without a forward does only that (cpu)."""
        pos = self.pos
        if pos < self.n_ctx:
            self.prefill([0])
            self.rewind(pos)

    def check(self, tokens) -> np.ndarray:
        """Token ids this engine can take after what it holds, as int64."""
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if len(tokens) == 0:
            raise InputError("no tokens to run")
        if self.pos + len(tokens) > self.n_ctx:
            raise InputError(f"{self.pos + len(tokens)} tokens exceed the context of {self.n_ctx}")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise InputError(f"token id out of range 0..{self.cfg.vocab_size - 1}")
        return tokens

    @abstractmethod
    def prefill(self, tokens, all_logits: bool = False, hidden: bool = False):
        """Run the tokens after what the cache holds; logits [1 or T, vocab] float32 of the last (or
        every) token; with hidden=True also the residual stream [L+1, T, H]."""

    def decode(self, token: int, hidden: bool = False):
        """One token through the KV cache; logits [vocab] (and the residual stream [L+1, 1, H])."""
        out = self.prefill([token], hidden=hidden)
        return (out[0][0], out[1]) if hidden else out[0]

    def decode_argmax(self, token: int) -> int:
        """One token through the KV cache; the id of the largest logit (greedy decoding; a device
        backend returns only the id, not the logits)."""
        return int(np.argmax(self.decode(token)))
