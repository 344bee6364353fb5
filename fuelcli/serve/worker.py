"""The engine worker: one thread owns the engine and runs the jobs one at a time, in arrival order.

Requests wait in a bounded queue; when it is full, submit() refuses with 503 and a Retry-After
estimated from recent jobs. A cancelled job (client gone, server stopping) stops at its next token.

Prompt cache (llama-server's): the engine keeps the KV of the last job's tokens. A new prompt that
shares a prefix with them rewinds the cache to the common prefix and prefills only the rest, so a
multi-turn conversation does not re-prefill its history. At least one prompt token is always
prefilled, since its logits start the generation.

A long prompt is prefilled a chunk per forward call, so a cancelled job (client gone, server
stopping) stops after the current chunk rather than after the whole prompt.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time

from ..generate import Sampler, Stats, StopMatcher, common_prefix, sample_steps
from ..token_bytes import TokenBytes
from .errors import APIError
from .jobs import Delta, Done, Failed, Job
from .logprobs import logprobs_of
from .metrics import Metrics

log = logging.getLogger("fuel.serve")

PREFILL_CHUNK = 256  # tokens per forward call of a long prompt

FINISH = {"eos": "stop", "stop string": "stop", "max tokens": "length", "context full": "length"}


class EngineWorker:
    def __init__(self, engine, tokenizer, eos_ids: set, queue_size: int, threads: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, metrics: Metrics | None = None):
        self.engine, self.tokenizer, self.eos_ids, self.threads = engine, tokenizer, set(eos_ids), threads
        self.prefill_chunk = prefill_chunk
        self.vocab_size = engine.cfg.vocab_size
        self.metrics = metrics or Metrics()
        self.jobs: queue.Queue = queue.Queue(maxsize=queue_size)
        self.cached: list[int] = []  # the tokens whose KV the engine holds; len == engine.pos
        self.token_bytes = TokenBytes(tokenizer)
        self.current: Job | None = None
        self.stopping = False
        self._job_seconds = 1.0  # running mean of a job's duration, for Retry-After
        self._thread = threading.Thread(target=self._run, name="fuel-engine", daemon=True)

    # --- the event loop's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self.stopping:
            raise APIError(503, "the server is shutting down", type="server_error")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            wait = math.ceil(self._job_seconds * (self.jobs.qsize() + 1))
            raise APIError(503, f"the server is busy: {self.jobs.maxsize} requests are already waiting "
                           "(fuel serve --queue); retry later", type="server_error", code="queue_full",
                           headers={"Retry-After": str(min(max(wait, 1), 600))}) from None

    def stop(self) -> None:
        """Refuse new jobs, cancel the running one and every waiting one; the thread then exits."""
        if self.stopping:
            return
        self.stopping = True
        if self.current is not None:
            self.current.cancel()
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
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled:
                job.emit(Done("cancelled", Stats()))
                self.metrics.finished(job.kind, "cancelled", Stats(), time.perf_counter() - job.arrived)
                continue
            self.current = job
            t0 = time.perf_counter()
            try:
                self._serve(job)
            except Exception as e:  # never kill the thread; the engine state is unknown: start afresh
                log.error("generation failed: %s: %s", type(e).__name__, e)
                log.debug("the failure in full", exc_info=True)  # only at --log-level debug
                self.engine.reset()
                self.cached = []
                job.emit(Failed(APIError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error")))
                self.metrics.finished(job.kind, "error", Stats(), time.perf_counter() - job.arrived)
            finally:
                self.current = None
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.perf_counter() - t0)

    def _reuse(self, ids: list[int]) -> int:
        """Rewinds the cache to the longest prefix it shares with `ids`; returns its length."""
        n = min(common_prefix(self.cached, ids), len(ids) - 1)
        self.engine.rewind(n)
        self.cached = self.cached[:n]
        return n

    def _prefill_ahead(self, job: Job, ids: list[int], pos: int) -> tuple[int, float]:
        """Feeds ids[pos:] a chunk per call, all but the last chunk (sample_steps prefills that one and
        takes its logits); stops early when the job is cancelled. Returns (tokens held, seconds)."""
        t0 = time.perf_counter()
        while len(ids) - pos > self.prefill_chunk and not job.cancelled:
            self.engine.prefill(ids[pos: pos + self.prefill_chunk])
            pos += self.prefill_chunk
            self.cached = ids[:pos]
        return pos, time.perf_counter() - t0

    def _serve(self, job: Job) -> None:
        ids, stats = job.prompt_ids, Stats()
        hit = self._reuse(ids)
        ahead, ahead_s = self._prefill_ahead(job, ids, hit)
        if job.cancelled:
            stats.prompt_tokens, stats.cached_tokens, stats.prefill_s = len(ids), hit, ahead_s
            job.emit(Done("cancelled", stats))
            self._finished(job, stats, "cancelled")
            return
        constraint = None
        if job.grammar is not None:
            from ..grammar import Constraint

            constraint = Constraint(job.grammar, self.tokenizer, self.vocab_size, self.eos_ids)
        steps = sample_steps(self.engine, ids, job.max_tokens, Sampler(job.params, constraint), self.eos_ids, stats,
                             ahead)
        stream, matcher = self.tokenizer.stream(skip_special_tokens=True), StopMatcher(job.stops)
        pending, sent, entries_len = [], 0, 0  # logprobs not yet sent; characters sent; their tokens' length
        finish = None
        try:
            for step in steps:
                if len(stats.tokens) == 1:
                    self.metrics.first_token(time.perf_counter() - job.arrived)
                if job.cancelled:
                    finish = "cancelled"
                    break
                if job.n_logprobs is not None:
                    pending.append(logprobs_of(step.logits, step.token, job.n_logprobs, self.token_bytes))
                text, stopped = matcher.feed(stream.push(step.token))
                if stopped:
                    # report the tokens that start before the cut (not those wholly inside the stop string)
                    keep = []
                    for lp in pending:
                        if entries_len >= sent + len(text):
                            break
                        keep.append(lp)
                        entries_len += lp.shown
                    if text or keep:
                        job.emit(Delta(text, keep))
                    finish, stats.stop_reason = "stop", "stop string"
                    break
                if text:
                    job.emit(Delta(text, pending))
                    sent += len(text)
                    entries_len += sum(lp.shown for lp in pending)
                    pending = []
        finally:
            steps.close()
            self.cached = (ids + stats.tokens)[: self.engine.pos]
            stats.cached_tokens, stats.prefill_s = hit, stats.prefill_s + ahead_s
        if finish is None:
            tail, _ = matcher.feed(stream.flush())
            tail += matcher.flush()
            if tail or pending:
                job.emit(Delta(tail, pending))
            finish = FINISH[stats.stop_reason]
        job.emit(Done(finish, stats))
        self._finished(job, stats, finish)

    def _finished(self, job: Job, s: Stats, finish: str) -> None:
        self.metrics.finished(job.kind, finish, s, time.perf_counter() - job.arrived)
        fresh = s.prompt_tokens - s.cached_tokens
        pp = fresh / s.prefill_s if s.prefill_s else 0.0
        tg = s.decode_steps / s.decode_s if s.decode_s else 0.0
        why = "cancelled (client gone or server stopping)" if finish == "cancelled" else s.stop_reason
        log.info("%s: prompt %d tokens (%d cached, %d prefilled at %.1f tok/s) | generated %d tokens, %.1f tok/s "
                 "| stop: %s", job.kind, s.prompt_tokens, s.cached_tokens, fresh, pp, s.generated, tg, why)
