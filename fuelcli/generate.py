"""Sampling and stopping, llama-cli / mlx_lm style: yields text as it is generated.

Order of the logit processors (transformers' order): repetition penalty over the last
`repeat_last_n` tokens, temperature, top-k, top-p, min-p; temperature 0 is greedy argmax.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .finite import check_engine_logits


@dataclass
class SamplerParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # as llama.cpp: 0 = penalty off, -1 = the whole context (prompt included)
    seed: int | None = None

    def __post_init__(self):
        # Checked here, not in the CLI, so every caller gets a one-line error instead of NaN
        # probabilities or a numpy traceback. `not (x >= lo)` also rejects NaN; infinities are refused
        # too (--temp inf would divide every logit to 0 and keep the k lowest ids, not the k likeliest).
        checks = [
            (0 <= self.temp < math.inf, "--temp must be a finite number >= 0 (0 = greedy)", self.temp),
            (self.top_k >= 0, "--top-k must be >= 0 (0 = off)", self.top_k),
            (0 < self.top_p <= 1, "--top-p must be in (0, 1] (1 = off)", self.top_p),
            (0 <= self.min_p <= 1, "--min-p must be in [0, 1] (0 = off)", self.min_p),
            (0 < self.repeat_penalty < math.inf, "--repeat-penalty must be a finite number > 0 (1 = off)",
             self.repeat_penalty),
            (self.repeat_last_n >= -1, "--repeat-last-n must be >= -1 (-1 = whole context, 0 = off)",
             self.repeat_last_n),
            (self.seed is None or self.seed >= 0, "--seed must be >= 0", self.seed),
        ]
        for ok, msg, value in checks:
            if not ok:
                raise InputError(f"{msg}, got {value}")


class Sampler:
    def __init__(self, params: SamplerParams):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def penalize(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Repetition penalty (CTRL / llama.cpp): makes every recently seen token less likely."""
        p, logits = self.p, logits.astype(np.float64)
        if p.repeat_penalty == 1.0 or p.repeat_last_n == 0 or not history:
            return logits
        recent = np.unique(np.asarray(history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]))
        scores = logits[recent]
        # dividing a negative logit would raise it, so negatives are multiplied instead
        logits[recent] = np.where(scores > 0, scores / p.repeat_penalty, scores * p.repeat_penalty)
        return logits

    def probs(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """The distribution a token is drawn from (temp > 0), after every processor."""
        p = self.p
        logits = self.penalize(logits, history) / p.temp
        if 0 < p.top_k < logits.size:
            # exactly k survive (as llama.cpp; transformers keeps every tie of the k-th value):
            # ties at the k-th logit go to the lower token ids, so the result is deterministic
            kth = np.partition(logits, -p.top_k)[-p.top_k]
            keep = logits > kth
            keep[np.flatnonzero(logits == kth)[: p.top_k - keep.sum()]] = True
            logits = np.where(keep, logits, -np.inf)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (at least one token); the 1e-9 lets a
            # prefix that reaches it exactly count despite rounding in the cumulative sum
            probs[order[int(np.searchsorted(cum, p.top_p - 1e-9)) + 1 :]] = 0.0
        if p.min_p > 0.0:
            # relative to the top probability, so no renormalisation after top-p is needed first
            probs[probs < p.min_p * probs.max()] = 0.0
        return probs / probs.sum()

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        if self.p.temp == 0:
            return int(np.argmax(self.penalize(logits, history)))
        probs = self.probs(logits, history)
        return int(self.rng.choice(probs.size, p=probs))


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_steps: int = 0  # engine.decode calls; counted, not derived from `generated` (EOS, stops)
    decode_s: float = 0.0
    stop_reason: str = ""
    tokens: list = field(default_factory=list)

    def line(self, peak_bytes: int) -> str:
        pp = self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0
        tg = self.decode_steps / self.decode_s if self.decode_s else 0.0
        return (f"prompt: {self.prompt_tokens} tokens, {pp:.1f} tok/s | generated: {self.generated} tokens, "
                f"{tg:.1f} tok/s | peak memory: {peak_bytes / 2**20:.0f} MiB"
                + (f" | stop: {self.stop_reason}" if self.stop_reason else ""))


class StopMatcher:
    """Holds back text that may be the start of a stop string; reports a complete match.

    Of the stops complete in the text so far, the one that starts earliest wins. A longer stop that
    starts even earlier but is not complete yet does not delay the match.
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def generate(engine, tokenizer, prompt_ids: list[int], max_tokens: int, sampler: Sampler,
             eos_ids: set, stops: list[str], stats: Stats):
    """Yields text pieces; fills `stats` as it goes (so an interrupted run still reports)."""
    stats.prompt_tokens = len(prompt_ids)
    t0 = time.perf_counter()
    logits = engine.prefill(prompt_ids)[0]
    stats.prefill_s = time.perf_counter() - t0
    history = list(prompt_ids)
    check_engine_logits(engine, logits, history, "prefill", len(history) - 1)
    stream, matcher = tokenizer.stream(skip_special_tokens=True), StopMatcher(stops)
    t0 = time.perf_counter()
    while True:
        token = sampler(logits, history)
        if token in eos_ids:
            stats.stop_reason = "eos"
            break
        history.append(token)
        stats.tokens.append(token)
        stats.generated += 1
        text, hit = matcher.feed(stream.push(token))
        if text:
            yield text
        if hit:
            stats.stop_reason = "stop string"
            break
        if stats.generated >= max_tokens:
            stats.stop_reason = "max tokens"
            break
        if engine.pos >= engine.n_ctx:
            stats.stop_reason = "context full"
            break
        logits = engine.decode(token)
        stats.decode_steps += 1
        stats.decode_s = time.perf_counter() - t0
        check_engine_logits(engine, logits, history, "decode", len(history) - 1)
    if stats.stop_reason != "stop string":
        tail, _ = matcher.feed(stream.flush())
        tail += matcher.flush()
        if tail:
            yield tail
    stats.decode_s = time.perf_counter() - t0
