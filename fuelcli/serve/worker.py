"""The engine worker: one thread owns the engine and runs the jobs on its sequence slots together
(continuous batching, llama-server's -np): each engine step carries the next token of every job
that is generating and a chunk of the prompt of a job that is starting, so a new request joins at
the next step instead of after the others, and a step that serves four sequences costs little more
than one (decode reads the weights once per step). With one slot (--parallel 1) jobs run one at a
time, in arrival order, each step on the single-sequence kernels.

Requests wait in a queue for a slot, at most `queue_size` of them (--queue) beyond the slots that
are free; past that submit() refuses with 503 and a Retry-After estimated from recent jobs. A
cancelled job (client gone, server stopping) stops at its next step and frees its slot at once.

Prompt cache (llama-server's), per slot: each slot keeps the KV of its last job's tokens, and a new
job takes a free slot by what it can reuse there (_slot_for: the slot of its own conversation's
earlier turns first), rewinds it to the prefix they share and prefills only the rest; a multi-turn
conversation lands on its own slot's cache. At least one prompt token is always prefilled, since its
logits start the generation.

A step takes at most `prefill_chunk` tokens: the generating jobs' one each first, then prompt
chunks, oldest job first; a long prompt thus enters over several steps while the others keep
generating. Every row of a step runs the same kernels whatever the rows beside it (the engine's
tiles with several slots), so a request's reply does not depend on the requests it was served with.

An embeddings job (embed_job.py) takes free slots as a generation does, and runs whole between two
steps while the other slots' jobs wait: its inputs packed several to a forward, one per free slot
(the engine's step returns each one's hidden states), each from an empty cache. It takes as many
free slots as it has inputs, empty ones first, then the least recently used, whose prompt caches it
drops. With every slot held it waits for one, and the jobs queued behind it wait too (arrival order).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time

from ..text.generate import Sampler, Stats, StopMatcher, TokenLoop, common_prefix
from ..text.token_bytes import TokenBytes
from .embed_job import EmbedJob
from .errors import APIError
from .jobs import Delta, Done, Failed, Job, Outbox
from .logprobs import logprobs_of
from .metrics import Metrics

log = logging.getLogger("fuel.serve")

PREFILL_CHUNK = 256  # tokens a step takes at most: a long prompt enters over several steps

FINISH = {"eos": "stop", "stop string": "stop", "max tokens": "length", "context full": "length"}


class Running:
    """One job on one slot: its prompt's progress, then its tokens, text and logprobs as they come."""

    def __init__(self, worker: "EngineWorker", job: Job, slot: int, held: int):
        self.worker, self.job, self.slot = worker, job, slot
        self.ids = job.prompt_ids
        self.fed = held  # prompt tokens the slot holds
        self.stats = Stats(cached_tokens=held)
        if worker.speculation is not None:
            self.stats.speculation = worker.speculation.name
            worker.speculation.start(job.params, job.prediction)
        constraint = None
        if job.grammar is not None:
            from ..text.grammar import Constraint

            constraint = Constraint(job.grammar, worker.tokenizer, worker.vocab_size, worker.eos_ids)
        self.eos_ids = set() if job.ignore_eos else worker.eos_ids
        self.loop = TokenLoop(worker.engine, self.ids, job.max_tokens, Sampler(job.params, constraint),
                              self.eos_ids, self.stats)
        self.next: int | None = None  # the token to feed next, once generating
        # a harmony or Gemma 4 reply's markers are special tokens, which its parser reads
        self.stream = worker.tokenizer.stream(skip_special_tokens=job.read_by is None)
        self.matcher = StopMatcher(job.stops)
        self.stop_string: str | None = None  # the stop string that ended the reply
        self.pending, self.sent, self.entries_len = [], 0, 0  # logprobs not yet sent; characters sent; their tokens' length
        self.started = time.perf_counter()
        self.decode_from: float | None = None

    @property
    def prefilling(self) -> bool:
        return self.next is None

    def feed(self, budget: int) -> list[int]:
        """This step's tokens: the next prompt chunk (at most budget), or the last token drawn."""
        if self.prefilling:
            return self.ids[self.fed: self.fed + budget]
        return [self.next]

    def stepped(self, n: int, logits) -> str | None:
        """The step ran n of its tokens; logits of the last one. Returns a finish reason when done."""
        if self.prefilling:
            self.fed += n
            if self.fed < len(self.ids):
                return None
            self.stats.prefill_s = time.perf_counter() - self.started
            self.decode_from = time.perf_counter()
        else:
            self.stats.decode_steps += 1
            self.stats.decode_s = time.perf_counter() - self.decode_from
        held = self.worker.engine.positions[self.slot]
        step = self.loop.take(logits, held, "prefill" if self.stats.generated == 0 else "decode")
        if step is None:
            return self._finish()
        return self.emitted(step)

    def speculate(self, spec) -> str | None:
        """One speculative round (speculative.Speculation) in place of a decode step: the drafter's
        proposals after the last token drawn, verified in one forward, the slot rewound to the
        accepted prefix; each token then sent as a decode step's. Returns a finish reason when done."""
        engine, loop, slot, stats = self.worker.engine, self.loop, self.slot, self.stats
        drafts, q, shadow = spec.propose(engine, loop.history, loop.sampler, self.job.max_tokens - stats.generated,
                                         slot)
        rows = spec.forward(engine, loop.history, drafts, slot)
        fed = self.worker.cached[slot] + [self.next] + drafts
        steps, eos = spec.settle(engine, loop.sampler, rows, drafts, q, shadow, loop.history, self.eos_ids,
                                 self.job.max_tokens - stats.generated, stats, slot)
        held = engine.positions[slot]
        self.worker.cached[slot] = fed[:held]
        stats.decode_s = time.perf_counter() - self.decode_from
        for i, step in enumerate(steps):
            finish = self.emitted(loop.taken(step, held - (len(steps) - 1 - i)))
            if finish is not None:
                return finish
        if eos:
            stats.stop_reason = "eos"
            return self._finish()
        return None

    def emitted(self, step) -> str | None:
        """A token drawn (the sampler and stats have it): its text and logprobs sent, or the finish."""
        if self.stats.generated == 1:
            self.worker.metrics.first_token(time.perf_counter() - self.job.arrived)
        job = self.job
        if job.n_logprobs is not None:
            self.pending.append(logprobs_of(step.logits, step.token, job.n_logprobs, self.worker.token_bytes))
        piece = self.stream.push(step.token)
        seen = self.matcher.pending + piece
        text, stopped = self.matcher.feed(piece)
        if stopped:
            self.stop_string = min((s for s in self.matcher.stops if s in seen), key=seen.find)
            # report the tokens that start before the cut (not those wholly inside the stop string)
            keep = []
            for lp in self.pending:
                if self.entries_len >= self.sent + len(text):
                    break
                keep.append(lp)
                self.entries_len += lp.shown
            if text or keep:
                job.emit(Delta(text, keep))
            self.stats.stop_reason = "stop string"
            return "stop"
        if text:
            job.emit(Delta(text, self.pending))
            self.sent += len(text)
            self.entries_len += sum(lp.shown for lp in self.pending)
            self.pending = []
        if self.loop.done:
            return self._finish()
        self.next = step.token
        return None

    def _finish(self) -> str:
        tail, _ = self.matcher.feed(self.stream.flush())
        tail += self.matcher.flush()
        if tail or self.pending:
            self.job.emit(Delta(tail, self.pending))
        return FINISH[self.stats.stop_reason]


class EngineWorker:
    def __init__(self, engine, tokenizer, eos_ids: set, queue_size: int, threads: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, metrics: Metrics | None = None, speculation=None):
        if speculation is not None and engine.slots != 1:
            raise ValueError("speculative decoding runs on one slot")
        self.engine, self.tokenizer, self.eos_ids, self.threads = engine, tokenizer, set(eos_ids), threads
        self.speculation = speculation  # a speculative.Speculation (one slot), or None
        self.prefill_chunk = max(prefill_chunk, engine.slots)  # room for every slot's next token
        self.vocab_size = engine.cfg.vocab_size
        self.metrics = metrics or Metrics()
        self.queue_size = queue_size
        self.jobs: queue.Queue = queue.Queue()  # bounded by submit(): queue_size beyond the free slots
        self.cached: list[list[int]] = [[] for _ in range(engine.slots)]  # each slot's held tokens
        self.running: dict[int, Running] = {}  # slot -> its job
        self._used = [0.0] * engine.slots  # when each slot last took a job (the least recent goes first)
        self.token_bytes = TokenBytes(tokenizer)
        self.stopping = False
        self.outbox = Outbox()  # the running jobs' events, sent once a step
        self._job_seconds = 1.0  # running mean of a job's duration, for Retry-After
        self._thread = threading.Thread(target=self._run, name="fuel-engine", daemon=True)

    # --- the event loop's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self.stopping:
            raise APIError(503, "the server is shutting down", type="server_error")
        # the queue holds the jobs a free slot is about to take too (the engine thread takes them
        # between steps): they are not waiting, so the bound is --queue beyond the free slots. Only
        # the event loop submits, so the check and the put are not interleaved.
        free = max(self.engine.slots - len(self.running), 0)
        if self.jobs.qsize() >= self.queue_size + free:
            wait = math.ceil(self._job_seconds * (self.jobs.qsize() + 1) / self.engine.slots)
            raise APIError(503, f"the server is busy: {self.queue_size} requests are already waiting "
                           "(fuel serve --queue); retry later", type="server_error", code="queue_full",
                           headers={"Retry-After": str(min(max(wait, 1), 600))})
        self.jobs.put_nowait(job)

    def stop(self) -> None:
        """Refuse new jobs, cancel the running ones and every waiting one; the thread then exits."""
        if self.stopping:
            return
        self.stopping = True
        for r in list(self.running.values()):
            r.job.cancel()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(Failed(APIError(503, "the server is shutting down", type="server_error")))
        self.jobs.put(None)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # --- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        if self.threads is not None:
            import numba

            numba.set_num_threads(self.threads)  # per thread in numba: set here, where the forwards run
        while self._admit():
            self._drop_cancelled()
            self.outbox.flush()
            if not self.running:
                continue
            try:
                self._step()
                self.outbox.flush()
            except Exception as e:  # never kill the thread; the engine state is unknown: start afresh
                log.error("generation failed: %s: %s", type(e).__name__, e)
                log.debug("the failure in full", exc_info=True)  # only at --log-level debug
                self.engine.reset()
                self.cached = [[] for _ in range(self.engine.slots)]
                for r in list(self.running.values()):
                    self.metrics.finished(r.job.kind, "error", Stats(), time.perf_counter() - r.job.arrived)
                    r.job.emit(Failed(APIError(500, f"generation failed: {type(e).__name__}: {e}",
                                               type="server_error")))
                self.running.clear()
                self.outbox.flush()
        for r in list(self.running.values()):  # stopping: the jobs left end as cancelled
            self._end(r, "cancelled")
        self.outbox.flush()

    def _admit(self) -> bool:
        """Takes waiting jobs into free slots (waits for one when nothing runs); False once stopped."""
        while len(self.running) < self.engine.slots:
            try:
                job = self.jobs.get(block=not self.running)
            except queue.Empty:
                return True
            if job is None:
                return False
            if job.cancelled:
                self.metrics.finished(job.kind, "cancelled", Stats(), time.perf_counter() - job.arrived)
                job.emit(Done("cancelled", Stats()))
                continue
            if isinstance(job, EmbedJob):
                self._embed(job)
                continue
            slot = self._slot_for(job.prompt_ids)
            held = min(common_prefix(self.cached[slot], job.prompt_ids), len(job.prompt_ids) - 1)
            held = self.engine.rewind(held, slot)  # fewer where a recurrent state keeps a checkpoint
            self.cached[slot] = self.cached[slot][:held]
            self._used[slot] = time.perf_counter()
            job.outbox = self.outbox
            self.running[slot] = Running(self, job, slot, held)
        return True

    def _embed(self, job: EmbedJob) -> None:
        started = time.perf_counter()
        free = [s for s in range(self.engine.slots) if s not in self.running]
        slots = sorted(free, key=lambda s: (bool(self.cached[s]), self._used[s]))[:len(job.inputs)]
        for s in slots:
            self.cached[s] = []
        try:
            out = job.run(self.engine, slots, self.prefill_chunk)
        except Exception as e:  # as a failed step; the job left its slots empty
            log.error("embeddings failed: %s: %s", type(e).__name__, e)
            log.debug("the failure in full", exc_info=True)
            self.metrics.finished(job.kind, "error", Stats(), time.perf_counter() - job.arrived)
            job.emit(Failed(APIError(500, f"embeddings failed: {type(e).__name__}: {e}", type="server_error")))
            return
        if out is None:  # the client went away
            self.metrics.finished(job.kind, "cancelled", Stats(), time.perf_counter() - job.arrived)
            job.emit(Done("cancelled", Stats()))
            return
        seconds = time.perf_counter() - started
        self.metrics.finished(job.kind, "stop", Stats(prompt_tokens=out.prompt_tokens, prefill_s=seconds),
                              time.perf_counter() - job.arrived)
        job.emit(out)
        log.info("embeddings: %d inputs on %d slots in %d forwards, %d tokens at %.1f tok/s", len(job.inputs),
                 len(slots), out.forwards, out.prompt_tokens, out.prompt_tokens / seconds if seconds else 0.0)

    def _slot_for(self, ids: list[int]) -> int:
        """A free slot for a prompt: one whose tokens the prompt continues (its conversation's earlier
        turns: all but the last few tokens shared), the longest such; else an empty one; else the one
        sharing the most of the prompt if that is at least half of it (a common system prompt), else
        the least recently used: a conversation keeps its slot while others come and go."""
        free = [s for s in range(self.engine.slots) if s not in self.running]
        shared = {s: common_prefix(self.cached[s], ids) for s in free}
        own = [s for s in free if self.cached[s] and shared[s] >= 0.9 * len(self.cached[s])]
        if own:
            return max(own, key=lambda s: shared[s])
        empty = [s for s in free if not self.cached[s]]
        if empty:
            return empty[0]
        best = max(free, key=lambda s: (shared[s], -self._used[s]))
        return best if 2 * shared[best] >= len(ids) else min(free, key=lambda s: self._used[s])

    def _drop_cancelled(self) -> None:
        for r in [r for r in self.running.values() if r.job.cancelled]:
            self._end(r, "cancelled")

    def _step(self) -> None:
        """One engine step: the generating jobs' next tokens, then prompt chunks while the budget lasts
        (with speculative decoding, on one slot: a generating job's step is a speculative round)."""
        if self.speculation is not None:
            (r,) = self.running.values()
            if not r.prefilling:
                finish = r.speculate(self.speculation)
                if finish is not None:
                    self._end(r, finish)
                return
        order = sorted(self.running.values(), key=lambda r: (r.prefilling, r.job.arrived))
        batch, budget = [], self.prefill_chunk
        for r in order:
            tokens = r.feed(budget) if budget > 0 else []
            if tokens:
                batch.append((r, tokens))
                budget -= len(tokens)
        outs = self.engine.step([(r.slot, tokens) for r, tokens in batch])
        for (r, tokens), logits in zip(batch, outs):
            self.cached[r.slot].extend(tokens)
            finish = r.stepped(len(tokens), logits)
            if finish is not None:
                self._end(r, finish)

    def _end(self, r: Running, finish: str) -> None:
        self.running.pop(r.slot, None)
        s = r.stats
        s.prefill_s = s.prefill_s or time.perf_counter() - r.started  # a job cancelled in its prompt
        # counted before the reply ends: a client that has its answer finds it in /metrics
        self.metrics.finished(r.job.kind, finish, s, time.perf_counter() - r.job.arrived)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.perf_counter() - r.started)
        r.job.emit(Done(finish, s, r.stop_string))
        fresh = s.prompt_tokens - s.cached_tokens
        pp = fresh / s.prefill_s if s.prefill_s else 0.0
        tg = s.decode_steps / s.decode_s if s.decode_s else 0.0
        why = "cancelled (client gone or server stopping)" if finish == "cancelled" else s.stop_reason
        spec = (f" | {s.speculation}: {s.accepted}/{s.drafted} drafted accepted" if s.speculation else "")
        log.info("%s: prompt %d tokens (%d cached, %d prefilled at %.1f tok/s) | generated %d tokens, %.1f tok/s%s "
                 "| stop: %s", r.job.kind, s.prompt_tokens, s.cached_tokens, fresh, pp, s.generated, tg, spec, why)
