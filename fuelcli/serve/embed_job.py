"""An embeddings request's job for the engine worker: its texts' token ids, run whole between engine
steps on slot 0, where the engine's prefill returns the hidden states (worker.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from .jobs import _send
from .pooling import Embedder


@dataclass
class Embedded:
    vectors: list  # np.ndarray [H] float32 per input, normalised
    prompt_tokens: int


@dataclass
class EmbedJob:
    """Texts' token ids for the worker, which runs them whole between engine steps (worker.py)."""

    inputs: list[list[int]]
    embedder: Embedder
    loop: asyncio.AbstractEventLoop
    kind: str = "embeddings"  # the /metrics endpoint label
    arrived: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event) -> None:
        _send(self.loop, [(self, event)])

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def run(self, engine) -> Embedded:
        """Each input from an empty slot 0 (where the engine's prefill returns the hidden states)."""
        vectors = []
        for ids in self.inputs:
            engine.reset(0)
            _, states = engine.prefill(ids, hidden=True)
            vectors.append(self.embedder.vector(states[-1]))
        engine.reset(0)
        return Embedded(vectors, sum(len(ids) for ids in self.inputs))
