"""Sampling and stopping, llama-cli / mlx_lm style: yields text as it is generated.

Order of the logit processors (transformers' order): repetition penalty over the last
`repeat_last_n` tokens, temperature, top-k, top-p, min-p; temperature 0 is greedy argmax.
"""

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplerParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None


class Sampler:
    def __init__(self, params: SamplerParams):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        p = self.p
        logits = logits.astype(np.float64)
        if p.repeat_penalty != 1.0 and history:
            recent = np.unique(np.asarray(history[-p.repeat_last_n:] if p.repeat_last_n > 0 else history))
            scores = logits[recent]
            logits[recent] = np.where(scores > 0, scores / p.repeat_penalty, scores * p.repeat_penalty)
        if p.temp <= 0:
            return int(np.argmax(logits))
        logits = logits / p.temp
        if 0 < p.top_k < logits.size:
            kth = np.partition(logits, -p.top_k)[-p.top_k]
            logits = np.where(logits < kth, -np.inf, logits)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            cut = order[int(np.searchsorted(cum, p.top_p)) + 1 :]
            probs[cut] = 0.0
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    stop_reason: str = ""
    tokens: list = field(default_factory=list)

    def line(self, peak_bytes: int) -> str:
        pp = self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0
        # the first generated token comes from the prefill logits; decode steps are the rest
        steps = max(self.generated - 1, 0)
        tg = steps / self.decode_s if self.decode_s else 0.0
        return (f"prompt: {self.prompt_tokens} tokens, {pp:.1f} tok/s | generated: {self.generated} tokens, "
                f"{tg:.1f} tok/s | peak memory: {peak_bytes / 2**20:.0f} MiB")


class StopMatcher:
    """Holds back text that may be the start of a stop string; reports a complete match."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                out, self.pending = self.pending[:i], ""
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
        stats.decode_s = time.perf_counter() - t0
    if stats.stop_reason != "stop string":
        tail, _ = matcher.feed(stream.flush())
        tail += matcher.flush()
        if tail:
            yield tail
    stats.decode_s = time.perf_counter() - t0
