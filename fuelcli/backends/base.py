"""The backend seam: what every engine offers the commands (run, chat, logits, diff, bench, serve).

An engine is built once per model and context size (`make_engine`): it prepares the weights in the
form its kernels read, allocates its activations and its KV cache, and then runs forwards. The
checks on what goes in (token ids, context room) live here, once for every backend.

Sequences are a dimension: an engine holds `slots` sequences (1 unless asked), each with its own
n_ctx positions of cache and its own position. `step` runs one forward over rows of several of them
(each slot's new tokens after what it holds: a decode step of many, a prompt chunk beside them);
prefill / decode / rewind / reset without a slot are slot 0's, the single-sequence commands' case.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..errors import InputError
from ..model.config import ModelConfig
from ..model.sizes import check_engine_fits


VERIFY_ROWS = 17  # the most tokens one verify step takes: the pending token and 16 proposals


class Engine(ABC):
    device = "?"  # what --device names
    backend = "?"  # how bench reports it
    free_cpus = None  # the CPU engine's thread count that follows the free CPUs; None: a fixed count

    def __init__(self, cfg: ModelConfig, n_ctx: int | None, kv_value_bytes: int = 4, slots: int = 1):
        if n_ctx is not None and n_ctx < 1:
            raise InputError(f"context size must be at least 1, got {n_ctx}")
        if slots < 1:
            raise InputError(f"an engine holds at least one sequence, got {slots}")
        self.cfg = cfg
        self.n_ctx = min(n_ctx or cfg.max_position, cfg.max_position)  # per sequence
        self.slots = slots
        self.positions = [0] * slots  # tokens in each sequence's KV cache
        self.kv_value_bytes = kv_value_bytes  # 4: an f32 KV cache, 2: f16
        self.check_fits()  # before a backend allocates its cache and activations

    @property
    def pos(self) -> int:
        """Tokens in slot 0's cache (the one sequence of run, chat, logits, diff, bench)."""
        return self.positions[0]

    @pos.setter
    def pos(self, value: int):
        self.positions[0] = value

    def check_fits(self):
        """Refuse a context whose KV cache and activations exceed the memory they would live in: the
        host's here; a device backend checks its device's instead."""
        check_engine_fits(self.cfg, self.n_ctx, self.kv_value_bytes, self.slots)

    @property
    @abstractmethod
    def kv_bytes(self) -> int:
        """Bytes held by the KV cache."""

    def reset(self, slot: int | None = None):
        """Forget the cached tokens (of one slot; of every slot when None)."""
        for s in range(self.slots) if slot is None else [self._slot(slot)]:
            self.positions[s] = 0

    def rewind(self, pos: int, slot: int = 0) -> int:
        """Keep only the first `pos` cached tokens of a slot (a shared prompt prefix), forget the rest.
        Returns the tokens kept: `pos`, or fewer where the sequence's state can only go back to a
        checkpoint (linear-attention layers, recurrent_state.py); the caller feeds the rest again."""
        held = self.positions[self._slot(slot)]
        if not 0 <= pos <= held:
            raise InputError(f"cannot rewind to {pos}: the cache holds {held} tokens")
        self.positions[slot] = pos
        return pos

    def _slot(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise InputError(f"no sequence slot {slot}: the engine holds {self.slots}")
        return slot

    def compiled(self) -> bool:
        """Whether warm_up finds this engine's code compiled already (False: it compiles first, which
        a command says before it starts). A backend that cannot tell says True."""
        return True

    def warm_up_rows(self):
        """Compiles or loads what a forward of several decode rows runs (a verify, a step of several
        sequences), so that no timing pays it; nothing where there is no such code."""

    def warm_up(self):
        """One token through the model, then forgotten: the one-time costs of a first forward (a JIT
        compile or loading compiled kernels, paging in the weights) are paid here, before any timing.
        A backend that can compile or load its code without a forward does only that (cpu)."""
        pos = self.pos
        if pos < self.n_ctx:
            self.prefill([0])
            self.rewind(pos)

    def check(self, tokens, slot: int = 0) -> np.ndarray:
        """Token ids this engine can take after what the slot holds, as int64."""
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if len(tokens) == 0:
            raise InputError("no tokens to run")
        held = self.positions[self._slot(slot)]
        if held + len(tokens) > self.n_ctx:
            raise InputError(f"{held + len(tokens)} tokens exceed the context of {self.n_ctx}")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise InputError(f"token id out of range 0..{self.cfg.vocab_size - 1}")
        return tokens

    @abstractmethod
    def prefill(self, tokens, all_logits: bool = False, hidden: bool = False):
        """Run the tokens after what slot 0's cache holds; logits [1 or T, vocab] float32 of the last
        (or every) token; with hidden=True also the residual stream [L+1, T, H]."""

    def step(self, batch: list, hidden: bool = False) -> list:
        """One forward over several sequences: batch is [(slot, token ids)], each slot at most once,
        each continuing what its slot holds; the logits [vocab] of each entry's last token, in order
        (with hidden=True, per entry (logits, its rows' residual stream [L+1, tokens, H]), as
        prefill's). A backend without sequences as a dimension runs slot 0 alone."""
        if len(batch) != 1 or batch[0][0] != 0:
            raise InputError(f"the {self.device} backend runs one sequence at a time")
        if hidden:
            logits, states = self.prefill(batch[0][1], hidden=True)
            return [(logits[0], states)]
        return [self.prefill(batch[0][1])[0]]

    def verify(self, tokens, slot: int = 0) -> np.ndarray:
        """Speculative decoding's check: the tokens after what the slot holds, each as the decode step
        of that token would run it; logits [T, vocab] of every token, bit for bit those of T decode
        steps (a greedy choice among them is plain decoding's), at most VERIFY_ROWS tokens. Here T
        decode steps; a backend with sequences as a dimension runs them as one forward."""
        tokens = self.check(tokens, slot)
        if len(tokens) > VERIFY_ROWS:
            raise InputError(f"a verify step takes at most {VERIFY_ROWS} tokens, got {len(tokens)}")
        return np.stack([self.decode(int(t)) if slot == 0 else self.step([(slot, [int(t)])])[0] for t in tokens])

    def decode(self, token: int, hidden: bool = False):
        """One token through the KV cache; logits [vocab] (and the residual stream [L+1, 1, H])."""
        out = self.prefill([token], hidden=hidden)
        return (out[0][0], out[1]) if hidden else out[0]

    def decode_argmax(self, token: int) -> int:
        """One token through the KV cache; the id of the largest logit (greedy decoding; a device
        backend returns only the id, not the logits)."""
        return int(np.argmax(self.decode(token)))
