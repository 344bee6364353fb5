"""Sampling and stopping, llama-cli / mlx_lm style: yields text as it is generated.

The sampler chain is llama.cpp's default (common/sampling.cpp), restricted to the samplers fuel
offers: a grammar's mask (fuelcli/text/grammar.py: JSON schema, GBNF, tool calls; tokens it refuses get
-inf) -> repetition penalty over the last `repeat_last_n` tokens -> top-k -> top-p -> min-p ->
temperature -> a draw. So top-p and min-p see the distribution at temperature 1, and the
temperature only reshapes what survives them; transformers divides by the temperature first, and
the same flags then keep a different set of tokens. Temperature 0 is greedy: argmax after the penalty.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..model.finite import check_engine_logits


@dataclass
class SamplerParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # as llama.cpp: 0 = penalty off, -1 = the whole context (prompt included)
    seed: int | None = None
    min_keep: int = 0  # as llama.cpp: top-p and min-p keep at least this many tokens (0 = at least one)

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
            (self.min_keep >= 0, "--min-keep must be >= 0", self.min_keep),
        ]
        for ok, msg, value in checks:
            if not ok:
                raise InputError(f"{msg}, got {value}")


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, in id order. Exactly k survive (as llama.cpp; transformers keeps
    every tie of the k-th value); ties at the k-th value go to the lower ids, where llama.cpp's
    partial sort leaves the choice unspecified."""
    kth = np.partition(logits, -k)[-k]
    above = np.flatnonzero(logits > kth)
    ties = np.flatnonzero(logits == kth)[: k - above.size]
    return np.sort(np.concatenate([above, ties]))


class Sampler:
    def __init__(self, params: SamplerParams, constraint=None):
        self.p = params
        self.rng = np.random.default_rng(params.seed)
        self.constraint = constraint  # a grammar.Constraint, or None

    def scores(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """The chain's one copy of the logits (float64): the grammar's mask, then the penalty, in place."""
        x = logits.astype(np.float64)
        if self.constraint is not None:
            self.constraint.mask(x)
        return self._penalize(x, history)

    def penalize(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Repetition penalty (CTRL / llama.cpp): makes every recently seen token less likely."""
        return self._penalize(logits.astype(np.float64), history)

    def _penalty_off(self, history: list[int]) -> bool:
        p = self.p
        return p.repeat_penalty == 1.0 or p.repeat_last_n == 0 or not history

    def _penalize(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        p = self.p
        if self._penalty_off(history):
            return logits
        recent = np.unique(np.asarray(history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]))
        scores = logits[recent]
        # dividing a negative logit would raise it, so negatives are multiplied instead
        logits[recent] = np.where(scores > 0, scores / p.repeat_penalty, scores * p.repeat_penalty)
        return logits

    def probs(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """The distribution a token is drawn from (temp > 0), after the whole chain."""
        p = self.p
        logits = self.scores(logits, history)
        n = logits.size
        ids = _top_k_ids(logits, p.top_k) if 0 < p.top_k < n else np.arange(n)
        cand = logits[ids]  # the candidates' logits, at temperature 1 until the last step
        if p.top_p < 1.0:
            # the smallest prefix, by probability (ties: lower id first), whose mass reaches top_p,
            # and at least min_keep tokens; the 1e-9 lets a prefix that reaches top_p exactly count
            # despite rounding in the cumulative sum
            order = np.argsort(-cand, kind="stable")
            mass = np.exp(cand[order] - cand[order[0]])
            cum = np.cumsum(mass / mass.sum())
            n_keep = max(int(np.searchsorted(cum, p.top_p - 1e-9)) + 1, p.min_keep)
            keep = np.sort(order[:n_keep])
            ids, cand = ids[keep], cand[keep]
        if p.min_p > 0.0:
            # p_i >= min_p * p_max, i.e. logit_i >= max logit + log(min_p): relative to the top, so
            # it needs no normalisation; at least min_keep tokens (the most likely) survive
            keep = cand >= cand.max() + np.log(p.min_p)
            if keep.sum() < p.min_keep:
                keep = np.zeros_like(keep)
                keep[np.argsort(-cand, kind="stable")[: p.min_keep]] = True
            ids, cand = ids[keep], cand[keep]
        # the top logit subtracted before dividing: a tiny temperature gives 0 and -inf (greedy), not
        # inf - inf = NaN; an infinite one gives 0 everywhere (uniform over the survivors)
        with np.errstate(over="ignore"):
            scaled = (cand - cand.max()) / p.temp
        probs = np.zeros(n)
        probs[ids] = np.exp(scaled)
        return probs / probs.sum()

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        if self.p.temp == 0:
            if self.constraint is None and self._penalty_off(history):  # the logits as they are (widening
                # to float64 keeps their order: the same argmax, without a copy of the vocabulary)
                return int(np.argmax(logits))
            return int(np.argmax(self.scores(logits, history)))
        probs = self.probs(logits, history)
        return int(self.rng.choice(probs.size, p=probs))

    def accept(self, token: int) -> None:
        """The drawn token, kept (not EOS): the grammar advances."""
        if self.constraint is not None:
            self.constraint.accept(token)


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


@dataclass
class Stats:
    prompt_tokens: int = 0  # the whole prompt, cached tokens included
    prefill_s: float = 0.0
    generated: int = 0
    decode_steps: int = 0  # engine.decode calls; counted, not derived from `generated` (EOS, stops)
    decode_s: float = 0.0
    stop_reason: str = ""
    tokens: list = field(default_factory=list)
    cached_tokens: int = 0  # leading prompt tokens the KV cache already held (a chat's earlier turns)
    compile_s: float = 0.0  # one-time kernel compile before the clock started (0: none)
    speculation: str = ""  # speculative decoding's drafter ("lookup", "draft model"), "" without
    drafted: int = 0  # proposals verified by the model
    accepted: int = 0  # of them, taken

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def line(self, peak_bytes: int) -> str:
        pp = self.prefilled / self.prefill_s if self.prefill_s else 0.0
        tg = self.decode_steps / self.decode_s if self.decode_s else 0.0
        cached = f" (+{self.cached_tokens} cached)" if self.cached_tokens else ""
        return (f"prompt: {_tokens(self.prefilled)}{cached}, {pp:.1f} tok/s | generated: {_tokens(self.generated)}, "
                f"{tg:.1f} tok/s | peak memory: {peak_bytes / 2**20:.0f} MiB"
                + (f" | {self.speculation}: {self.accepted}/{self.drafted} drafted accepted"
                   + (f" ({self.acceptance:.0%})" if self.drafted else "") if self.speculation else "")
                + (f" | stop: {self.stop_reason}" if self.stop_reason else "")
                + (f" | kernels compiled first: {self.compile_s:.1f} s, not counted" if self.compile_s else ""))

    def to_json(self, peak_bytes: int) -> dict:
        out = {
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "prefill_s": self.prefill_s,
            "prefill_tok_s": self.prefilled / self.prefill_s if self.prefill_s else None,
            "generated_tokens": self.generated, "decode_steps": self.decode_steps, "decode_s": self.decode_s,
            "decode_tok_s": self.decode_steps / self.decode_s if self.decode_s else None,
            "stop_reason": self.stop_reason, "peak_memory_bytes": peak_bytes, "compile_s": self.compile_s,
        }
        if self.speculation:
            out["speculation"] = {"method": self.speculation, "drafted": self.drafted, "accepted": self.accepted,
                                  "acceptance_rate": self.acceptance}
        return out


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


def common_prefix(a, b) -> int:
    """How many leading ids two token sequences share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def stopped(stats: Stats, max_tokens: int, held: int, n_ctx: int, eos: bool = False) -> bool:
    """The stop rule of every generation loop (plain, speculative, the server's): a generation ends
    on an EOS id drawn (`eos`; it is not emitted), on max_tokens generated, or on a full context (the
    KV cache holds `held` of its n_ctx positions: none is left for the last token drawn). Sets
    stats.stop_reason when it ends; a stop string is the caller's, found in the text."""
    reason = ("eos" if eos else "max tokens" if stats.generated >= max_tokens
              else "context full" if held >= n_ctx else "")
    if reason:
        stats.stop_reason = reason
    return bool(reason)


@dataclass
class Step:
    token: int  # the sampled token (never an EOS id)
    logits: np.ndarray  # [vocab] the model's logits it was drawn from, before any processor


def sample_steps(engine, prompt_ids: list[int], max_tokens: int, sampler: Sampler, eos_ids: set,
                 stats: Stats, cached: int = 0):
    """Yields one Step per generated token, the token-level half of generate(); fills `stats`.

    The engine already holds the first `cached` prompt ids (a prefix kept from an earlier call: a
    chat's earlier turns, the server's prompt cache; the caller rewound it there); only the rest is
    prefilled, at least one id, whose logits start the reply. A Step is yielded before its token is
    fed back, so a caller that stops consuming leaves the engine holding prompt + earlier tokens.
    """
    stats.prompt_tokens, stats.cached_tokens = len(prompt_ids), cached
    t0 = time.perf_counter()
    logits = engine.prefill(prompt_ids[cached:])[0]
    stats.prefill_s = time.perf_counter() - t0
    history = list(prompt_ids)
    check_engine_logits(engine, logits, history, "prefill", len(history) - 1)
    t0 = time.perf_counter()
    try:
        while True:
            token = sampler(logits, history)
            eos = token in eos_ids
            if not eos:
                sampler.accept(token)
                history.append(token)
                stats.tokens.append(token)
                stats.generated += 1
                yield Step(token, logits)
            if stopped(stats, max_tokens, engine.pos, engine.n_ctx, eos):
                break
            logits = engine.decode(token)
            stats.decode_steps += 1
            stats.decode_s = time.perf_counter() - t0
            check_engine_logits(engine, logits, history, "decode", len(history) - 1)
    finally:  # also when the caller closes the generator early (a stop string, a cancelled request)
        stats.decode_s = time.perf_counter() - t0


def generate(engine, tokenizer, prompt_ids: list[int], max_tokens: int, sampler: Sampler,
             eos_ids: set, stops: list[str], stats: Stats, cached: int = 0, speculation=None, reader=None):
    """Yields text pieces; fills `stats` as it goes (so an interrupted run still reports).
    `cached` as in sample_steps; speculation: a speculative.Speculation, whose steps replace
    sample_steps'. reader: a reply_formats.Readable, for a reply read from its special tokens
    (harmony, Gemma 4): the text is decoded with them and goes through it (feed, then finish)."""
    steps = (speculation.steps if speculation is not None else sample_steps)(
        engine, prompt_ids, max_tokens, sampler, eos_ids, stats, cached)
    stream, matcher = tokenizer.stream(skip_special_tokens=reader is None), StopMatcher(stops)
    shown = reader.feed if reader is not None else str
    for step in steps:
        text, hit = matcher.feed(stream.push(step.token))
        text = shown(text)
        if text:
            yield text
        if hit:
            stats.stop_reason = "stop string"
            steps.close()
            break
    tail = ""
    if stats.stop_reason != "stop string":
        tail, _ = matcher.feed(stream.flush())
        tail = shown(tail + matcher.flush())
    tail += reader.finish() if reader is not None else ""
    if tail:
        yield tail


class TokenLoop:
    """sample_steps' token-level half for a caller that runs the engine itself (the server's batched
    worker: one step of the engine serves many sequences): give it each step's logits of its
    sequence; it samples, stops on EOS, max tokens or a full context (the same rules and stats), and
    says what to feed the engine next."""

    def __init__(self, engine, prompt_ids: list[int], max_tokens: int, sampler: Sampler, eos_ids: set,
                 stats: Stats):
        self.engine, self.history, self.max_tokens = engine, list(prompt_ids), max_tokens
        self.sampler, self.eos_ids, self.stats = sampler, eos_ids, stats
        stats.prompt_tokens = len(prompt_ids)

    def take(self, logits: np.ndarray, held: int, where: str) -> Step | None:
        """The next token drawn from the logits of the last token fed (the engine's slot holds `held`
        tokens; `where`: prefill or decode, for a NaN's message, whose diagnosis resets the engine);
        None once generation is over (stats.stop_reason says why). After a Step, feed step.token
        unless `done`."""
        check_engine_logits(self.engine, logits, self.history, where, len(self.history) - 1)
        token = self.sampler(logits, self.history)
        if token in self.eos_ids:
            stopped(self.stats, self.max_tokens, held, self.engine.n_ctx, eos=True)
            return None
        self.sampler.accept(token)
        self.history.append(token)
        return self.taken(Step(token, logits), held)

    def taken(self, step: Step, held: int) -> Step:
        """A token drawn elsewhere, already fed to the sampler and appended to the history (a
        speculative round's: speculative.Speculation.settle), counted as take counts its own."""
        self.stats.tokens.append(step.token)
        self.stats.generated += 1
        stopped(self.stats, self.max_tokens, held, self.engine.n_ctx)
        return step

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)
