"""Speculative decoding: cheap proposals, verified by the target model several tokens per forward.

A drafter proposes the next tokens: a small model of the same vocabulary (`DraftModel`, mlx-lm's
--draft-model, llama.cpp's -md) or n-grams of the prompt and the text so far (`PromptLookup`,
llama.cpp's lookup, transformers' prompt_lookup_num_tokens; in fuel serve also of a request's
predicted output, OpenAI's `prediction`). The target runs the pending token and
the k proposals in one forward (engine.verify): its logits at each of the k + 1 positions, each row
bit for bit what a decode step of that token gives. `verify` walks them in order through the sampler chain, exactly as plain decoding
would, and stops at the first proposal the target does not take; the target's KV cache is rewound
to the accepted prefix (engine.rewind). So one forward yields 1 to k + 1 tokens.

Greedy (temp 0): a proposal is taken when it is the chain's argmax, the token plain decoding picks;
since the verify rows are the decode steps' logits bit for bit, the text is the same token for
token. Sampled: the
rejection rule of Leviathan et al. (2023) / Chen et al. (2023): proposal d, drawn by the drafter
from q, is taken with probability min(1, p(d) / q(d)), p the target's distribution after the whole
chain; on a rejection the token is drawn from max(p - q, 0), normalised; after k taken proposals
one more comes from p. Each emitted token is then distributed as p: the target's distribution.
Lookup proposals are certain (q = 1 at d): taken with probability p(d), else drawn from p without d.

The grammar mask and the repetition penalty stay exact: `verify` feeds each taken token to the
sampler before it scores the next position.

How many proposals to verify (`DraftLength`): with --draft-max N, up to N. By default, adaptively,
the number whose expected tokens per second is best, from costs measured as the generation runs (a
decode step, a verify forward of T tokens, a drafted token) and the acceptance rate seen so far;
none at all (a plain decode step) when that is faster. A draft model also stops drafting where its
own top probability falls below --draft-p-min (llama.cpp's --draft-p-min).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import InputError
from ..model.finite import check_engine_logits
from ..backends.base import VERIFY_ROWS
from .generate import Sampler, SamplerParams, Step, common_prefix, stopped

DRAFT_MAX = VERIFY_ROWS - 1  # default cap on the proposals one step verifies (llama.cpp's --draft-max default, 16)
DRAFT_P_MIN = 0.75  # default --draft-p-min; measured in docs/performance.md
FOLLOW_ROWS = 4  # a draft model takes up to this many new tokens a round on its decode kernels, more on prefill's
NGRAM_MAX, NGRAM_MIN = 3, 1  # prompt lookup: the longest and shortest n-gram matched (longest first)


# ----------------------------------------------------------------------------------------------------
# the rule


def verify(sampler: Sampler, rows: np.ndarray, drafts: list[int], q: list | None, history: list[int],
           eos_ids: set, limit: int) -> tuple[list[Step], bool, int]:
    """Tokens the target emits from its logits `rows` [len(drafts) + 1, vocab] (row i: after the
    pending token and drafts[:i]), at most `limit`. q: the drafter's distribution row per proposal
    (None: proposals are certain). Each emitted token is fed to the sampler (its grammar) and
    appended to `history`, in order. Returns (steps, eos, proposals taken); eos: the chain drew an
    EOS id, which ends the generation and is not emitted."""
    steps, greedy = [], sampler.p.temp == 0
    for i, row in enumerate(rows):
        if greedy:
            y = sampler(row, history)
        else:
            p = sampler.probs(row, history)
            if i < len(drafts):
                y = _rejection_step(sampler.rng, p, drafts[i], None if q is None else q[i])
            else:
                y = int(sampler.rng.choice(p.size, p=p))
        if y in eos_ids:
            return steps, True, i
        sampler.accept(y)
        history.append(y)
        steps.append(Step(y, row))
        if len(steps) >= limit or i >= len(drafts) or y != drafts[i]:
            return steps, False, i + (i < len(drafts) and y == drafts[i])
    raise AssertionError("unreachable: the last row always returns")


def _rejection_step(rng, p: np.ndarray, d: int, q_row: np.ndarray | None) -> int:
    """d with probability min(1, p(d) / q(d)), else a draw from max(p - q, 0) normalised."""
    qd = 1.0 if q_row is None else float(q_row[d])
    if rng.random() * qd < p[d]:
        return d
    residual = p.copy()
    if q_row is None:
        residual[d] = 0.0
    else:
        n = min(residual.size, q_row.size)
        residual[:n] = np.maximum(residual[:n] - q_row[:n], 0.0)
    total = residual.sum()
    if not total > 0:  # p <= q everywhere yet d rejected: only rounding; p itself is the answer
        residual, total = p, p.sum()
    return int(rng.choice(residual.size, p=residual / total))


# ----------------------------------------------------------------------------------------------------
# drafters


class PromptLookup:
    """Proposals from the text so far (prompt included): the tokens that followed an earlier
    occurrence of its last n tokens, n from NGRAM_MAX down to NGRAM_MIN. A request's predicted
    output (OpenAI's `prediction`, given to `start`) is searched first at each n.

    A reply that quotes its input runs through it in order, so after a match the next is looked
    for past it (the first occurrence past the previous match's; with no previous match, the
    latest). And a reply that rewrites its input (a renamed variable, a changed constant) differs
    from it by a token here and there: where a proposal from a match of NGRAM_MAX tokens was
    refused, the token the model wrote instead is taken as a substitute for the quoted one
    (`subs`), so the tail is matched and the proposals are written with the substitution made; a
    substitution that is itself refused is dropped. Only the proposals change: the model still
    verifies every token."""

    name = "lookup"

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN):
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.draft_s = 0.0  # proposals cost nothing next to a forward
        self.start(None)

    def round(self, history: list[int], room: int, length: DraftLength, sampler: Sampler):
        """A round's proposals (Speculation.propose), at most room: found first, as they cost nothing,
        then cut to the number `length` chooses; when it chooses none, the first is the one not
        verified."""
        drafts, q = self.propose(history, min(room, length.cap), sampler)
        k = length.choose(len(drafts), 0.0)
        return drafts[:k], q, (drafts[0] if drafts and not k else None)

    def propose(self, history: list[int], k: int, sampler: Sampler) -> tuple[list[int], None]:
        self._learn(history)
        arr, pred = np.asarray(history, np.int64), self.prediction
        L = len(arr)
        inv = {out: src for src, out in self.subs.items()}
        for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            tails = [arr[L - n:]]
            if inv:  # the tail as the quoted text had it
                quoted = np.array([inv.get(int(t), int(t)) for t in tails[0]], np.int64)
                if not np.array_equal(quoted, tails[0]):
                    tails.append(quoted)
            for source, text, cursor in ((pred, pred, "pred"), (arr[: L - 1], arr, "text")):
                ends = np.unique(np.concatenate([_ends(source, t) for t in tails]))
                ends = ends[ends < text.size]  # a token must follow
                if not ends.size:
                    continue
                later = ends[ends > self.cursor[cursor]]
                at = int(later[0] if later.size else ends[-1]) if self.cursor[cursor] >= 0 else int(ends[-1])
                self.cursor[cursor] = at
                quoted = [int(t) for t in text[at: at + k]]
                drafts = [self.subs.get(t, t) for t in quoted]
                self.last = (L, drafts, quoted, n == self.ngram_max)
                return drafts, None
        self.last = None
        return [], None

    def _learn(self, history: list[int]):
        """The substitutions, from how the text went on after the last proposals: the first that
        the model did not write is either a substitution refused (dropped) or, after a match of
        NGRAM_MAX tokens, a quoted token the model replaced (learnt: what it wrote instead)."""
        if self.last is None:
            return
        L0, drafts, quoted, strong = self.last
        self.last = None
        for d, src, y in zip(drafts, quoted, history[L0:]):
            if y == d:
                continue
            if d != src:
                self.subs.pop(src, None)
            elif strong and y not in self.subs:
                self.subs[src] = y
            return

    def follow(self, history: list[int]):
        """Nothing to keep in step: the proposals are read from the history itself."""

    def start(self, params: SamplerParams | None, prediction: list[int] = ()):
        """A new generation: its predicted output's ids (none: the text so far alone); nothing
        depends on the sampling settings."""
        self.prediction = np.asarray(prediction, np.int64)
        self.cursor = {"pred": 0, "text": -1}  # the prediction is walked from its start
        self.subs: dict[int, int] = {}
        self.last = None


def _ends(arr: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """The index just past each occurrence of tail in arr, in order."""
    n = len(tail)
    if arr.size < n:
        return np.empty(0, np.int64)
    hit = arr[: arr.size - n + 1] == tail[0]
    for j in range(1, n):
        hit &= arr[j: arr.size - n + 1 + j] == tail[j]
    return np.flatnonzero(hit) + n


class DraftModel:
    """Proposals from a small model of the same vocabulary, drawn by the target's sampler chain
    (temperature, top-k, top-p, min-p, penalty; not the grammar) from the draft's logits: argmax
    when greedy, a draw when sampling (its distribution q goes to the rejection rule). Drafting
    stops where the draft's own top probability falls below p_min. The draft keeps its KV cache
    in step with the text (a common prefix, then the tokens after it)."""

    name = "draft model"

    def __init__(self, engine, target_vocab: int, params: SamplerParams, p_min: float = DRAFT_P_MIN):
        self.engine, self.target_vocab, self.p_min = engine, target_vocab, p_min
        self.params = None
        self.start(params)
        self.held: list[int] = []  # the ids in the draft's KV cache
        self.draft_s = 0.0  # mean seconds per drafted token (DraftLength's cost model)

    def round(self, history: list[int], room: int, length: DraftLength, sampler: Sampler):
        """A round's proposals (Speculation.propose), at most room: `length` chooses how many first,
        from what a drafted token costs, as each is a forward of the draft; none proposed, none
        left unverified."""
        k = length.choose(room, self.draft_s)
        return (*self.propose(history, k, sampler), None) if k else ([], None, None)

    def start(self, params: SamplerParams, prediction: list[int] = ()):
        """The sampler chain of a generation's settings (the server's differ per request), drawing
        from its own stream; kept while the settings stay (a fresh stream per generation with one
        seed would repeat the same proposals, which the rejection rule does not allow). A predicted
        output is not used: the draft proposes from its own logits."""
        if params != self.params:
            seed = None if params.seed is None else params.seed + 1  # its own stream, not the target's
            self.params, self.sampler = params, Sampler(SamplerParams(**{**params.__dict__, "seed": seed}))

    def follow(self, history: list[int]):
        """The draft's cache: the longest prefix it shares with history, minus one token at least
        (its logits are needed), then the rest of history fed; its logits, cut to the target's
        vocabulary (None: the draft cannot take the text, an id past its embeddings)."""
        n = self.engine.rewind(min(common_prefix(self.held, history), len(history) - 1))
        self.held = self.held[:n]
        if max(history[n:]) >= self.engine.cfg.vocab_size:
            return None
        new = history[n:]
        # the few tokens of a round (the last proposal, the model's own token) on the decode kernels:
        # prefill's tiles unpack every matrix for them (2 tokens: ~6 decode steps' time)
        logits = self.engine.verify(new)[-1] if len(new) <= FOLLOW_ROWS else self.engine.prefill(new)[0]
        self.held = list(history)
        return logits[: self.target_vocab]

    def propose(self, history: list[int], k: int, sampler: Sampler) -> tuple[list[int], list | None]:
        k = min(k, self.engine.n_ctx - len(history) + 1)  # the draft's context may be the shorter
        if k <= 0:
            return [], None
        t0 = time.perf_counter()
        fed = len(history) - min(common_prefix(self.held, history), len(history) - 1)
        logits, hist = self.follow(history), list(history)
        if logits is None:
            return [], None
        if fed > FOLLOW_ROWS:  # a prompt's prefill is paid once, not per drafted token
            t0 = time.perf_counter()
        greedy = sampler.p.temp == 0
        tokens, qs = [], []
        for i in range(k):
            if greedy:
                scores = self.sampler.scores(logits, hist)
                d = int(np.argmax(scores))
                top = 1.0 / np.exp(scores - scores[d]).sum()  # its softmax probability at temperature 1
                q = None
            else:
                q = self.sampler.probs(logits, hist)
                d = int(self.sampler.rng.choice(q.size, p=q))
                top = float(q.max())
            if top < self.p_min:
                break
            tokens.append(d)
            qs.append(q)
            hist.append(d)
            if i + 1 < k:
                logits = self.engine.decode(d)[: self.target_vocab]
                self.held.append(d)
        # a round that drafted nothing (p_min) still paid the draft's forward: it counts as one token's
        seconds = (time.perf_counter() - t0) / max(len(tokens), 1)
        self.draft_s = seconds if not self.draft_s else 0.8 * self.draft_s + 0.2 * seconds
        return tokens, (None if greedy else qs)


def check_vocabularies(target_tok, draft_tok, draft_name: str):
    """Refuse a draft whose vocabulary is not the target's: every id must spell the same token (a
    vocabulary of the same size with other tokens would propose nonsense). The models' embedding
    tables may still differ in padding rows past the vocabulary (Qwen2.5 0.5B and 7B do)."""
    t, d = target_tok.backend.get_vocab(with_added_tokens=True), draft_tok.backend.get_vocab(with_added_tokens=True)
    if t == d:
        return
    if len(t) != len(d):
        raise InputError(f"--draft-model {draft_name}: its vocabulary has {len(d)} tokens, the model's {len(t)}; "
                         "speculative decoding needs the same tokenizer")
    by_id = {i: s for s, i in t.items()}
    i, s = min((i, s) for s, i in d.items() if by_id.get(i) != s)
    raise InputError(f"--draft-model {draft_name}: its token {i} is {s!r}, the model's is {by_id.get(i)!r}; "
                     "speculative decoding needs the same tokenizer")


# ----------------------------------------------------------------------------------------------------
# how many proposals


class DraftLength:
    """How many proposals a step verifies: with `fixed`, as many as there are (up to cap);
    otherwise the k that maximises expected tokens / expected seconds,

        E(k) = 1 + a + a^2 + ... + a^k        (a: the rate at which proposals are taken)
        S(k) = k * draft_s + verify(k + 1)

    against one decode step's 1 / decode_s, with the costs measured as the generation runs:
    decode_s and draft_s are running means, verify(T) a least-squares line a + b T over recent
    verify forwards (two weak prior points, near a decode's cost, make the first steps try it).
    Proposals that were not verified still count towards the acceptance rate: the token plain
    decoding then emitted shows whether the first would have been taken. When the model advises
    against verifying, a probe still verifies every `probe` steps (doubling each time), so that a
    cost measured on a busy moment does not stay the last word."""

    PRIOR = 0.3  # weight of each prior point of the verify-cost line
    DECAY = 0.85  # weight an observation keeps per later one (verify costs, acceptance)
    PROBE = 16

    def __init__(self, cap: int = DRAFT_MAX, fixed: bool = False):
        self.cap, self.fixed = cap, fixed
        self.decode_s = 0.0
        self._sums = np.zeros(5)  # weighted w, wT, wT^2, wc, wTc of verify forwards
        self.taken, self.tried = 2.0, 2.5  # acceptance: prior 0.8
        self._idle, self._probe = 0, self.PROBE

    @property
    def rate(self) -> float:
        return self.taken / self.tried

    def observe_decode(self, seconds: float):
        self.decode_s = seconds if not self.decode_s else 0.8 * self.decode_s + 0.2 * seconds

    def observe_verify(self, T: int, seconds: float):
        self._sums = self.DECAY * self._sums + np.array([1.0, T, T * T, seconds, T * seconds])

    def observe(self, taken: int, tried: int):
        """Proposals taken out of those tried (a rejection is a try that was not taken)."""
        self.taken = self.DECAY ** tried * self.taken + taken
        self.tried = self.DECAY ** tried * self.tried + tried

    def verify_s(self, T: int) -> float:
        c1 = self.decode_s
        w, wt, wtt, wc, wtc = self._sums + self.PRIOR * np.array(
            [2, 2 + 17, 4 + 289, 1.1 * c1 + 2.0 * c1, 2 * 1.1 * c1 + 17 * 2.0 * c1])
        det = w * wtt - wt * wt
        b = (w * wtc - wt * wc) / det
        a = (wc - b * wt) / w
        return max(a + b * T, c1)

    def choose(self, available: int, draft_s: float) -> int:
        """How many of `available` proposals (a draft model: how many it may draft) to verify."""
        k_max = min(available, self.cap)
        if self.fixed or k_max <= 0:
            return max(k_max, 0)
        if not self.decode_s:
            return 0  # measure a decode step first
        a = min(self.rate, 0.999)
        ks = np.arange(1, k_max + 1)
        gain = (1 - a ** (ks + 1)) / (1 - a) / (ks * draft_s + np.array([self.verify_s(k + 1) for k in ks]))
        best = int(np.argmax(gain))
        if gain[best] * self.decode_s > 1.0:
            self._idle, self._probe = 0, self.PROBE
            return int(ks[best])
        self._idle += 1
        if self._idle >= self._probe:
            self._idle, self._probe = 0, min(2 * self._probe, 1024)
            return int(ks[best])
        return 0


# ----------------------------------------------------------------------------------------------------
# the loop


class Speculation:
    """A drafter (PromptLookup, DraftModel: a `name`, `start` per generation, `round` per round) and
    its DraftLength. `steps` is generate.sample_steps with proposals verified; a
    caller that runs the engine itself (the server's worker) goes round by round: `propose`, the
    target's `forward`, then `settle`."""

    def __init__(self, drafter, draft_max: int | None = None):
        self.drafter = drafter
        self.length = DraftLength(draft_max or DRAFT_MAX, fixed=draft_max is not None)

    @property
    def name(self) -> str:
        return self.drafter.name

    def fresh(self) -> "Speculation":
        """The same drafter (a draft model keeps its engine) with a draft length not yet learnt:
        another generation as `fuel run` starts one."""
        return Speculation(self.drafter, self.length.cap if self.length.fixed else None)

    def start(self, params: SamplerParams, prediction: list[int] = ()):
        """A generation's settings, and its predicted output's ids (the server's `prediction`): an
        n-gram source for a lookup; a draft model proposes from its own logits and does not use it."""
        self.drafter.start(params, prediction)

    def steps(self, engine, prompt_ids: list[int], max_tokens: int, sampler: Sampler, eos_ids: set, stats,
              cached: int = 0):
        """As generate.sample_steps (the same Steps, the same stats), each target forward verifying
        the drafter's proposals. Steps come after the round's rewind; a caller that stops consuming
        leaves the engine holding a prefix of prompt + the tokens yielded."""
        stats.prompt_tokens, stats.cached_tokens, stats.speculation = len(prompt_ids), cached, self.name
        self.start(sampler.p)
        t0 = time.perf_counter()
        rows = engine.prefill(prompt_ids[cached:])
        stats.prefill_s = time.perf_counter() - t0
        history = list(prompt_ids)
        check_engine_logits(engine, rows, history, "prefill", len(history) - 1)
        drafts, q, shadow = [], None, None
        t0 = time.perf_counter()
        try:
            while True:
                steps, eos = self.settle(engine, sampler, rows, drafts, q, shadow, history, eos_ids,
                                         max_tokens - stats.generated, stats)
                for step in steps:
                    stats.tokens.append(step.token)
                    stats.generated += 1
                    yield step
                if stopped(stats, max_tokens, engine.pos, engine.n_ctx, eos):
                    break
                drafts, q, shadow = self.propose(engine, history, sampler, max_tokens - stats.generated)
                rows = self.forward(engine, history, drafts)
                stats.decode_s = time.perf_counter() - t0
        finally:  # also when the caller closes the generator early (a stop string, a cancelled request)
            stats.decode_s = time.perf_counter() - t0
            keep = len(prompt_ids) + len(stats.tokens)
            if engine.pos > keep:
                engine.rewind(keep)

    def propose(self, engine, history: list[int], sampler: Sampler, left: int, slot: int = 0):
        """The proposals to verify after history (its last token pending, not in the slot's cache),
        `left` tokens still to generate. Returns (proposals, their q, the proposal not verified or
        None: DraftLength learns from it whether verifying would have paid)."""
        room = min(engine.n_ctx - engine.positions[slot] - 1, left - 1, VERIFY_ROWS - 1)
        if room <= 0:
            return [], None, None
        return self.drafter.round(history, room, self.length, sampler)

    def forward(self, engine, history: list[int], drafts: list[int], slot: int = 0) -> np.ndarray:
        """The target's forward over the pending token (history[-1]) and the proposals: logit rows
        [1 + len(drafts), vocab], each row as a decode step gives it (engine.verify)."""
        t0 = time.perf_counter()
        if drafts:
            rows = engine.verify([history[-1]] + drafts, slot)
            self.length.observe_verify(len(drafts) + 1, time.perf_counter() - t0)
        else:
            token = history[-1]  # slot 0: plain decoding's own call (a device backend's decode kernels)
            rows = (engine.decode(token) if slot == 0 else engine.step([(slot, [token])])[0])[None]
            self.length.observe_decode(time.perf_counter() - t0)
        check_engine_logits(engine, rows, history + drafts, "decode", len(history) - 1)
        return rows

    def settle(self, engine, sampler: Sampler, rows, drafts, q, shadow, history: list[int], eos_ids: set,
               limit: int, stats, slot: int = 0) -> tuple[list[Step], bool]:
        """The tokens of one round (verify's), the slot's cache rewound to the accepted prefix (the
        pending token and the proposals taken), the round counted in stats. Returns (steps, eos)."""
        steps, eos, taken = verify(sampler, rows, drafts, q, history, eos_ids, limit)
        if drafts:
            stats.drafted += len(drafts)
            stats.accepted += taken
            engine.rewind(engine.positions[slot] - len(drafts) + taken, slot)
            self.length.observe(taken, taken + (taken < len(drafts) and not eos and len(steps) > taken))
        elif shadow is not None and steps:  # the proposal not verified: would it have been taken?
            self.length.observe(int(steps[0].token == shadow), 1)
        if stats.generated:  # rows came from a decode or verify forward, not the prompt's prefill
            stats.decode_steps += len(steps) + eos
        return steps, eos


def lookup(draft_max: int | None = None) -> Speculation:
    return Speculation(PromptLookup(), draft_max)


def draft_model(engine, target_vocab: int, params: SamplerParams, draft_max: int | None = None,
                p_min: float = DRAFT_P_MIN) -> Speculation:
    return Speculation(DraftModel(engine, target_vocab, params, p_min), draft_max)
