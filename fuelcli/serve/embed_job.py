"""An embeddings request's job for the engine worker: its texts' token ids, run whole between engine
steps on the slots no generation holds (worker.py). The texts are packed several to a forward, one
per slot, each from an empty cache: engine.step(hidden=True) gives each its residual stream."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .jobs import _send
from .pooling import Embedder


@dataclass
class Embedded:
    vectors: list  # np.ndarray [H] float32 per input, normalised
    prompt_tokens: int
    forwards: int  # engine steps the inputs took (the log's measure of the batching)


@dataclass
class _Input:
    """One text on its slot: its tokens fed so far and their last-layer rows."""

    index: int
    ids: list[int]
    fed: int = 0
    rows: list = field(default_factory=list)


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

    def run(self, engine, slots: list[int], budget: int) -> Embedded | None:
        """The inputs through engine steps over `slots` (free, emptied here and left empty): each step
        takes the next chunk of the texts on the slots, at most `budget` tokens in all, the nearest done
        first, and a slot whose text is done takes the next text. A text's rows are those its one-by-one prefill would give
        (each row runs the same kernels whatever the rows beside it). None when cancelled."""
        waiting = [_Input(i, ids) for i, ids in enumerate(self.inputs)][::-1]
        on: dict[int, _Input] = {}
        vectors, forwards = [None] * len(self.inputs), 0
        try:
            while waiting or on:
                if self.cancelled:
                    return None
                for slot in slots:
                    if slot not in on and waiting:
                        engine.reset(slot)
                        on[slot] = waiting.pop()
                batch, room = [], budget
                for slot, x in sorted(on.items(), key=lambda sx: len(sx[1].ids) - sx[1].fed):
                    if room > 0:  # the nearest done first: their slots take the next texts sooner
                        batch.append((slot, x.ids[x.fed: x.fed + room]))
                        room -= len(batch[-1][1])
                outs = engine.step(batch, hidden=True)
                forwards += 1
                for (slot, tokens), (_, states) in zip(batch, outs):
                    x = on[slot]
                    x.fed += len(tokens)
                    x.rows.append(np.array(states[-1]))
                    if x.fed == len(x.ids):
                        vectors[x.index] = self.embedder.vector(np.concatenate(x.rows))
                        del on[slot]
        finally:
            for slot in slots:
                engine.reset(slot)
        return Embedded(vectors, sum(len(ids) for ids in self.inputs), forwards)
