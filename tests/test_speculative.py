"""Speculative decoding (fuelcli/text/speculative.py): greedy output token for token the plain decoding's,
sampled output of the target's distribution, vocabularies checked, the draft length's choice.

Two tiny random checkpoints of one byte vocabulary (tests/tiny_models.py) serve as target and draft;
the real pair is SmolLM2's Q4_1 demo drafting for its bf16 directory. Every identity test has a
negative control: a verification that takes every proposal must break it."""

from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fuelcli.backends import make_engine
from fuelcli.cli import app
from fuelcli.errors import InputError
from fuelcli.assembly.loader import open_model
from fuelcli.text import speculative as S
from fuelcli.text.generate import Sampler, SamplerParams, Stats, sample_steps

sys.path.insert(0, str(Path(__file__).parent))
from test_bench import bench  # noqa: E402
from tiny_models import VOCAB, write_byte_tokenizer  # noqa: E402

GREEDY = dict(temp=0.0, top_k=0, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def pair(tiny):
    """(target, draft) tiny models of one byte vocabulary, their weights unrelated."""
    return tuple(open_model(str(write_byte_tokenizer(tiny(case)))) for case in ("llama2", "llama31"))


def engine_of(m, n_ctx=256):
    return make_engine(m.cfg, m.weights, n_ctx=n_ctx)


def generate_ids(engine, prompt, n, params, spec=None, eos=frozenset()):
    """(token ids, stats) of n tokens after prompt, plain (spec None) or speculative."""
    engine.reset()
    stats = Stats()
    steps = sample_steps if spec is None else spec.steps
    return [s.token for s in steps(engine, prompt, n, Sampler(SamplerParams(**params)), set(eos), stats)], stats


REAL_VERIFY = S.verify


def accept_all(sampler, rows, drafts, q, history, eos_ids, limit):
    """A broken verification: every proposal taken, then the target's choice after the last."""
    for d in drafts:
        sampler.accept(d)
        history.append(d)
    steps, eos = [S.Step(d, rows[i]) for i, d in enumerate(drafts)], False
    if len(steps) < limit:
        more, eos, _ = REAL_VERIFY(sampler, rows[len(drafts):], [], None, history, eos_ids, 1)
        steps += more
    return steps, eos, len(drafts)


PROMPT = [7, 8, 9, 10, 11, 12, 7, 8, 9, 10, 13, 14, 15, 7, 8, 9] * 3  # repeats: the lookup finds n-grams


def speculations(target, draft, params=GREEDY):
    p = SamplerParams(**params)
    return {
        "lookup fixed 4": S.lookup(4),
        "lookup adaptive": S.lookup(),
        "draft fixed 1": S.draft_model(engine_of(draft), VOCAB, p, 1, p_min=0.0),
        "draft fixed 5": S.draft_model(engine_of(draft), VOCAB, p, 5, p_min=0.0),
        "self-draft fixed 8": S.draft_model(engine_of(target), VOCAB, p, 8, p_min=0.0),
        "draft adaptive": S.draft_model(engine_of(draft), VOCAB, p),
    }


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_is_plain_decoding_token_for_token(pair, penalty):
    target, draft = pair
    engine, params = engine_of(target), {**GREEDY, "repeat_penalty": penalty}
    plain, plain_stats = generate_ids(engine, PROMPT, 120, params)
    took = {}
    for name, spec in speculations(target, draft, params).items():
        ids, stats = generate_ids(engine, PROMPT, 120, params, spec)
        assert ids == plain, name
        assert stats.decode_steps == plain_stats.decode_steps and stats.stop_reason == "max tokens", name
        assert stats.speculation == spec.name and 0 <= stats.accepted <= stats.drafted
        took[name] = stats.accepted
    assert took["self-draft fixed 8"] >= 100  # the target drafting for itself: every proposal taken
    if penalty == 1.0:  # a penalised model shuns the repeats the lookup proposes
        assert took["lookup fixed 4"] > 0


def test_negative_control_a_verification_that_takes_wrong_tokens_differs(pair, monkeypatch):
    target, draft = pair
    engine = engine_of(target)
    plain, _ = generate_ids(engine, PROMPT, 120, GREEDY)
    monkeypatch.setattr(S, "verify", accept_all)
    for name, spec in speculations(target, draft).items():
        if name.startswith("self-draft") or name.endswith("adaptive"):
            continue  # a self-draft's proposals are all right; adaptive lengths may verify none
        ids, _ = generate_ids(engine, PROMPT, 120, GREEDY, spec)
        assert ids != plain, name


def test_eos_context_full_and_the_cache_left_behind(pair):
    """Stops as plain decoding stops; the cache then holds a prefix of prompt + tokens yielded."""
    target, draft = pair
    plain_engine = engine_of(target, n_ctx=len(PROMPT) + 20)
    plain, plain_stats = generate_ids(plain_engine, PROMPT, 100, GREEDY)
    assert plain_stats.stop_reason == "context full" and len(plain) == 21
    eos = {plain[10]}
    plain_eos, eos_stats = generate_ids(plain_engine, PROMPT, 100, GREEDY, eos=eos)
    assert eos_stats.stop_reason == "eos"
    for spec in (S.lookup(6), S.draft_model(engine_of(target), VOCAB, SamplerParams(**GREEDY), 6, p_min=0.0)):
        engine = engine_of(target, n_ctx=len(PROMPT) + 20)
        ids, stats = generate_ids(engine, PROMPT, 100, GREEDY, spec)
        assert (ids, stats.stop_reason, stats.decode_steps) == (plain, "context full", plain_stats.decode_steps)
        ids, stats = generate_ids(engine, PROMPT, 100, GREEDY, spec, eos=eos)
        assert (ids, stats.stop_reason, stats.decode_steps) == (plain_eos, "eos", eos_stats.decode_steps)
        assert engine.pos <= len(PROMPT) + len(ids)
        # a consumer that stops after 3 tokens: the engine holds no more than prompt + those 3
        engine.reset()
        st = Stats()
        gen = spec.steps(engine, PROMPT, 100, Sampler(SamplerParams(**GREEDY)), set(), st)
        got = [next(gen).token for _ in range(3)]
        gen.close()
        assert got == plain[:3] and engine.pos <= len(PROMPT) + 3 and st.tokens == got


def test_chat_with_speculation_replies_as_without(pair):
    from fuelcli.text.chat import ChatSession

    target, _ = pair
    target.tokenizer.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
                                      "{% if add_generation_prompt %}a:{% endif %}")
    replies = {}
    for name, spec in (("plain", None), ("lookup", S.lookup(4))):
        engine = engine_of(target)
        session = ChatSession(engine, target.tokenizer, Sampler(SamplerParams(**GREEDY)), set(), max_tokens=30,
                              speculation=spec)
        out = []
        for text in ("hello there", "and again, hello there", "hello"):
            turn = session.prepare(text)
            st = Stats()
            out.append("".join(session.reply(turn, st)))
            assert session.held == (turn.ids + st.tokens)[: engine.pos]
        replies[name] = out
    assert replies["lookup"] == replies["plain"]


# --- sampled: the target's distribution -------------------------------------------------------

def exact_joint(engine, prompt, params, n):
    """{(t1..tn): probability} of plain sampling's first n tokens (the chain's distributions)."""
    sampler = Sampler(SamplerParams(**params))
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, p in out.items():
            engine.reset()
            logits = engine.prefill(prompt + list(seq))[0]
            probs = sampler.probs(logits, prompt + list(seq))
            for t in np.flatnonzero(probs):
                nxt[seq + (int(t),)] = p * probs[t]
        out = nxt
    return out


def chi_square(counts: dict, exact: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic over the outcomes (draws outside the support count as impossible)."""
    assert set(counts) <= set(exact), set(counts) - set(exact)
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    return stat, len(exact) - 1


SAMPLED = dict(temp=1.0, top_k=2, top_p=1.0, min_p=0.0)  # 8 outcomes of 3 tokens: few draws suffice
N_DRAWS = 1500
CHI2_LIMIT_P = 1e-4  # a correct rule fails once in 10,000 runs


class TargetsPicks(S.PromptLookup):
    """Certain proposals (q = 1, as the lookup's) that are always worth verifying: the target's own
    greedy continuation (a random tiny model's text seldom repeats a prompt n-gram). Taken with
    probability p(d) < 1 at temperature 1, so both branches of the rule run."""

    def __init__(self, engine):
        super().__init__()
        self.engine, self.known = engine, {}

    def propose(self, history, k, sampler):
        key = (tuple(history), k)
        if key not in self.known:
            self.engine.reset()
            logits, out = self.engine.prefill(history)[0], []
            for _ in range(k):
                out.append(int(np.argmax(logits)))
                logits = self.engine.decode(out[-1])
            self.known[key] = out
        return list(self.known[key]), None


@pytest.mark.parametrize("drafter", ["draft model", "lookup"])
def test_sampled_output_follows_the_targets_distribution(pair, drafter, monkeypatch):
    """The first three tokens of many sampled generations (the 1st from the prompt's logits, the
    2nd and 3rd from one verify of a proposal: its check, then the row after it when taken) against
    their exact distribution under plain sampling: chi-square at p = 1e-4. The draft model is the
    target itself drawing at another temperature and top-k (q overlaps p, with mass where p has
    none), so proposals are both taken and rejected. Negative control: taking every proposal gives
    the drafter's distribution, which the same test must reject."""
    from scipy.stats import chi2

    target, _ = pair
    prompt = [7, 8, 9, 7, 8]
    engine = engine_of(target, n_ctx=32)
    exact = exact_joint(engine, prompt, SAMPLED, 3)

    def draws(n, seed):
        params = SamplerParams(**SAMPLED, seed=seed)
        if drafter == "draft model":
            spec = S.draft_model(engine_of(target, 32), VOCAB, params, 2, p_min=0.0)
            spec.drafter.sampler = Sampler(SamplerParams(temp=1.6, top_k=5, top_p=1.0, min_p=0.0, seed=seed + 1))
        else:
            spec = S.Speculation(TargetsPicks(engine_of(target, 32)), 2)
        sampler, counts, total = Sampler(params), {}, Stats()
        for _ in range(n):
            engine.reset()
            stats = Stats()
            seq = tuple(s.token for s in spec.steps(engine, prompt, 3, sampler, set(), stats))
            counts[seq] = counts.get(seq, 0) + 1
            total.drafted += stats.drafted
            total.accepted += stats.accepted
        return counts, total

    counts, stats = draws(N_DRAWS, 0)
    assert stats.drafted == N_DRAWS  # every generation verified a proposal
    assert 0 < stats.accepted < stats.drafted
    stat, df = chi_square(counts, exact, N_DRAWS)
    assert stat < chi2.ppf(1 - CHI2_LIMIT_P, df), (stat, df)

    monkeypatch.setattr(S, "verify", accept_all)
    bad, _ = draws(N_DRAWS // 2, 1)
    impossible = sum(c for k, c in bad.items() if k not in exact)  # proposals the target's top-k never has
    bad_stat = sum((bad.get(k, 0) - N_DRAWS // 2 * p) ** 2 / (N_DRAWS // 2 * p) for k, p in exact.items())
    assert impossible or bad_stat > chi2.ppf(1 - CHI2_LIMIT_P, df), bad_stat


def test_rejection_step_draws_from_p_whatever_q():
    """The rule alone, on hand-made distributions: d ~ q then the rule's output is distributed as
    p (to within 4 standard errors in every cell); negative control: keeping d always gives q."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.2, 0.2, 0.1, 0.0])
    q = np.array([0.1, 0.6, 0.0, 0.1, 0.2])  # mass where p has none, none where p has some
    n = 40000
    out = np.bincount([S._rejection_step(rng, p, int(rng.choice(5, p=q)), q) for _ in range(n)], minlength=5) / n
    assert np.all(np.abs(out - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12), out
    certain = np.bincount([S._rejection_step(rng, p, 1, None) for _ in range(n)], minlength=5) / n
    assert np.all(np.abs(certain - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12), certain
    kept = np.bincount(rng.choice(5, size=n, p=q), minlength=5) / n  # the proposals themselves
    assert np.any(np.abs(kept - p) > 4 * np.sqrt(p * (1 - p) / n) + 1e-12)


# --- pieces -----------------------------------------------------------------------------------

def test_prompt_lookup_takes_the_latest_longest_match():
    look = S.PromptLookup()
    assert look.propose([1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3], 2, None) == ([4, 5], None)  # latest 3-gram
    assert look.propose([5, 1, 2, 7, 3, 2], 3, None) == ([7, 3, 2], None)  # only the 1-gram "2" recurs
    assert look.propose([1, 2, 3], 4, None) == ([], None)
    assert look.propose([4], 4, None) == ([], None)
    assert look.propose([1, 1, 1, 1], 5, None) == ([1], None)  # the continuation ends where the text does


def test_prompt_lookup_walks_the_prediction_in_order():
    look = S.PromptLookup()
    look.start(None, [5, 6, 1, 5, 6, 2, 5, 6, 3])
    assert look.propose([9, 5, 6], 2, None) == ([1, 5], None)  # the first "5 6", not the latest
    assert look.propose([9, 5, 6, 1, 5, 6], 9, None) == ([2, 5, 6, 3], None)  # the longest match, "1 5 6"
    assert look.propose([9, 5, 6, 1, 5, 6, 2, 4, 5, 6], 9, None) == ([3], None)  # past the last match
    look.start(None, [5, 6, 1])
    assert look.propose([5, 6, 8, 5, 6], 2, None) == ([1], None)  # the prediction before the text so far
    assert look.propose([7, 6, 1, 8, 6, 1], 2, None) == ([8, 6], None)  # nothing follows it there: the text's
    look.start(None)  # the next request predicts nothing
    assert look.propose([5, 6, 8, 5, 6], 2, None) == ([8, 5], None)


def test_prompt_lookup_walks_a_quoted_text_forward():
    text = [5, 1, 2, 3, 4, 6, 1, 2, 3, 7]  # "1 2 3" twice
    fresh = S.PromptLookup()
    assert fresh.propose(text + [8, 1, 2, 3], 2, None) == ([7, 8], None)  # no match before: the latest
    look = S.PromptLookup()
    assert look.propose(text + [5, 1, 2], 2, None) == ([3, 4], None)  # "5 1 2": the text's start
    # the reply quotes the text: the next "1 2 3" is the first past that match, not the latest
    assert look.propose(text + [5, 1, 2, 3], 2, None) == ([4, 6], None)


def test_prompt_lookup_learns_a_renamed_token():
    """A rewrite that renames token 7 to 70: the refused proposal after a 3-token match teaches the
    substitution; the tail is then matched as quoted and the proposals come renamed. A refused
    substitution is dropped; a refusal after a shorter match teaches nothing (the control)."""
    quoted = [1, 2, 3, 7, 4, 5, 6, 7, 8, 9]
    look = S.PromptLookup()
    history = quoted + [0, 1, 2, 3]
    assert look.propose(history, 3, None) == ([7, 4, 5], None)
    history += [70]  # the model wrote 70 where the text had 7
    assert look.propose(history, 4, None) == ([4, 5, 6, 70], None)  # "2 3 70" matched as "2 3 7"
    assert look.subs == {7: 70}
    history += [4, 5, 6, 7]  # here the model kept 7: the substitution is dropped
    look.propose(history, 2, None)
    assert look.subs == {}
    weak = S.PromptLookup()
    history = [1, 2, 3, 7, 4, 5, 0, 3]
    assert weak.propose(history, 2, None) == ([7, 4], None)  # a 1-gram match
    weak.propose(history + [70], 2, None)
    assert weak.subs == {}


def test_draft_model_costs_leave_the_prompt_out(pair, monkeypatch):
    """The draft's prompt prefill is paid once, not per drafted token (a slow prefill here: the
    cost per drafted token stays a decode step's); a round's few new tokens go through its decode
    kernels (engine.verify: the same logits as decode steps), not prefill's tiles."""
    engine = engine_of(pair[1], 128)
    drafter = S.DraftModel(engine, VOCAB, SamplerParams(**GREEDY), p_min=0.0)
    prefill = engine.prefill

    def slow_prefill(tokens, *a, **k):  # also each decode step's (one token)
        assert not 1 < len(tokens) <= S.FOLLOW_ROWS  # a round's tokens never come here
        if len(tokens) > S.FOLLOW_ROWS:
            time.sleep(0.3)
        return prefill(tokens, *a, **k)

    monkeypatch.setattr(engine, "prefill", slow_prefill)
    history = list(range(40, 80))
    drafts, _ = drafter.propose(history, 4, Sampler(SamplerParams(**GREEDY)))
    assert len(drafts) == 4 and drafter.draft_s < 0.1
    drafts2, _ = drafter.propose(history + drafts + [7], 3, Sampler(SamplerParams(**GREEDY)))  # 2 new tokens
    assert len(drafts2) == 3 and drafter.draft_s < 0.1


def test_speculation_loads_the_wide_kernels_before_timing(pair):
    """ready_engine(rows=True) (speculation on, several slots) loads the B-wide decode kernels before
    any timing; without it the first verify does (the control)."""
    from fuelcli.cli.textgen import ready_engine

    engine, _ = ready_engine(pair[0], 64, None, quiet=True, rows=True)
    assert engine._wide
    plain, _ = ready_engine(pair[0], 64, None, quiet=True)
    assert not plain._wide
    plain.prefill([1, 2, 3])
    plain.verify([4, 5])
    assert plain._wide


def test_draft_length_follows_the_costs():
    fixed = S.DraftLength(4, fixed=True)
    assert fixed.choose(10, 0.0) == 4 and fixed.choose(2, 0.0) == 2 and fixed.choose(0, 0.0) == 0
    cheap = S.DraftLength(16)
    assert cheap.choose(8, 0.0) == 0  # no decode step measured yet
    cheap.observe_decode(0.010)
    for T in (3, 9, 17):
        cheap.observe_verify(T, 0.010 + 0.0005 * T)  # verify costs about a decode step
    cheap.observe(97, 100)  # 97% taken: the longest verify pays best (at 90%, 14 would)
    assert cheap.choose(16, 0.0) == 16
    assert 0 < cheap.choose(16, 0.004) < 16  # drafting costs: fewer
    dear = S.DraftLength(16)
    dear.observe_decode(0.010)
    for T in (2, 5, 9, 17):
        dear.observe_verify(T, 0.050 + 0.002 * T)  # a verify of T tokens: 5 decode steps and more
    dear.observe(10, 40)  # 25% taken
    chosen = [dear.choose(16, 0.0) for _ in range(200)]
    assert sum(k > 0 for k in chosen) <= 4  # only probes, ever rarer: after 16, 32, 64, 128 refusals
    dear.observe(400, 401)  # now nearly every proposal is taken: long verifies pay
    assert dear.choose(16, 0.0) == 16


# --- the command line ---------------------------------------------------------------------------

runner = CliRunner()


def cli(*args):
    r = runner.invoke(app, list(args))
    return r.stdout, r.exception


# gpt-oss: sinks, windows, MoE; Gemma 4 E2B-style, shared KV (greedy, it repeats one token here: the
# serve test below gives it prompt-dependent answers)
@pytest.mark.parametrize("case", ["llama2", "gpt_oss", "gemma4_e2b"])
def test_run_json_carries_the_acceptance(tiny, case):
    path = str(write_byte_tokenizer(tiny(case)))
    base = ("run", path, "abcabcabcabcabc", "--no-chat-template", "--temp", "0", "-n", "24", "--json")
    plain, exc = cli(*base)
    assert exc is None
    for extra in (("--lookup-decoding", "--draft-max", "4"), ("--draft-model", path, "--draft-p-min", "0")):
        out, exc = cli(*base, *extra)
        assert exc is None, exc
        r = json.loads(out)
        assert r["tokens"] == json.loads(plain)["tokens"]
        s = r["stats"]["speculation"]
        assert s["method"] == ("lookup" if "--lookup-decoding" in extra else "draft model")
        assert s["drafted"] >= s["accepted"] and s["drafted"] > 0
        assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"])
        if s["method"] == "draft model":  # the model drafting for itself: every proposal taken
            assert s["accepted"] == s["drafted"]


@pytest.mark.parametrize("args, message", [
    (("--lookup-decoding", "--draft-model", "x"), "give --draft-model or --lookup-decoding, not both"),
    (("--lookup-decoding", "--draft-max", "0"), "--draft-max must be within 1..16, got 0"),
    (("--lookup-decoding", "--draft-max", "17"), "--draft-max must be within 1..16, got 17"),
    (("--draft-max", "4"), "--draft-max needs --draft-model or --lookup-decoding"),
    (("--lookup-decoding", "--draft-p-min", "0.5"), "--draft-p-min needs --draft-model"),
    (("--draft-model", "x", "--draft-p-min", "1.5"), "--draft-p-min must be within 0..1, got 1.5"),
    (("--draft-model", "x", "--draft-p-min", "nan"), "--draft-p-min must be within 0..1, got nan"),
])
@pytest.mark.parametrize("command", ["run", "chat"])
def test_bad_speculation_options_are_one_error(pair, command, args, message):
    path = str(pair[0].source.path)
    _, exc = cli(command, path, *(("hi",) if command == "run" else ()), *args)
    assert isinstance(exc, InputError) and message in str(exc) and "\n" not in str(exc), exc


def vocab_variant(src: Path, dst: Path, change) -> Path:
    """A copy of the tiny model src whose tokenizer.json vocabulary went through change(vocab)."""
    import shutil

    shutil.copytree(src, dst)
    tj = json.loads((dst / "tokenizer.json").read_text())
    tj["model"]["vocab"] = change(tj["model"]["vocab"])
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    return dst


def test_a_draft_of_another_vocabulary_is_refused(pair, tmp_path):
    target, draft = pair
    src = Path(draft.source.path)

    def swap(v):  # the same size, two tokens' ids exchanged
        a, b = sorted(v, key=v.get)[100:102]
        return {**v, a: v[b], b: v[a]}

    cases = {
        "swapped": (vocab_variant(src, tmp_path / "swapped", swap), "its token 100 is"),
        "smaller": (vocab_variant(src, tmp_path / "smaller", lambda v: {k: i for k, i in v.items() if i < 200}),
                    "its vocabulary has 200 tokens, the model's 256"),
    }
    for name, (d, message) in cases.items():
        _, exc = cli("run", str(target.source.path), "hi", "--draft-model", str(d))
        assert isinstance(exc, InputError) and message in str(exc) and "\n" not in str(exc), (name, exc)
    # the check compares tokens, not sizes: the swapped vocabulary has the target's size
    assert len(json.loads((cases["swapped"][0] / "tokenizer.json").read_text())["model"]["vocab"]) == VOCAB


def test_chat_speculates(pair):
    target, _ = pair
    target_dir = Path(target.source.path)
    (target_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }};{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    try:
        r = runner.invoke(app, ["chat", str(target_dir), "--temp", "0", "-n", "16", "--stats", "--lookup-decoding"],
                          input="abcabcabc\nabcabc\n")
        plain = runner.invoke(app, ["chat", str(target_dir), "--temp", "0", "-n", "16"], input="abcabcabc\nabcabc\n")
    finally:
        (target_dir / "chat_template.jinja").unlink()
    assert r.exception is None and plain.exception is None
    assert r.stdout == plain.stdout and "lookup:" in r.stderr


# --- serve ----------------------------------------------------------------------------------------

@contextmanager
def serving(m, spec):
    """An openai client of fuel serve's app and worker over m, in this process (spec None: plain)."""
    import openai

    from fuelcli.serve.jobs import ServedModel
    from fuelcli.serve.server import bind, make_server, url
    from fuelcli.serve.worker import EngineWorker

    engine = engine_of(m)
    worker = EngineWorker(engine, m.tokenizer, m.eos_ids(), queue_size=4, speculation=spec)
    served = ServedModel("tiny-chat", {"tiny-chat"}, m.tokenizer, engine.n_ctx, m.cfg.vocab_size, m.eos_ids(), 0)
    sock = bind("127.0.0.1", 0)
    server = make_server(served, worker, None, log_level="warning")
    worker.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield openai.OpenAI(base_url=url(sock) + "/v1", api_key="none", max_retries=0)
    finally:
        worker.stop()
        server.should_exit = True
        thread.join(10)
        worker.join(10)


@pytest.fixture(scope="module")
def chat_models(tiny, tmp_path_factory):
    """chat_models(case) -> the tiny checkpoint with a chat tokenizer, opened."""
    from serve_helpers import with_tokenizer

    return lambda case: open_model(str(with_tokenizer(tiny(case), tmp_path_factory.mktemp("spec") / "tiny-chat")))


@pytest.fixture(scope="module")
def chat_model(chat_models):
    return chat_models("qwen2_window")


def ask(client, text, max_tokens=24, **extra):
    return client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": text}],
                                          max_tokens=max_tokens, temperature=0, **extra)


# gpt-oss: sinks, windows, MoE; Gemma 4 E2B-style: shared KV, per-layer inputs (a rewind leaves both right)
@pytest.mark.parametrize("case", ["qwen2_window", "gpt_oss", "gemma4_e2b"])
def test_serve_speculates_and_answers_as_without(chat_models, case):
    """fuel serve's worker with a speculative round in place of each decode step: the greedy answers
    (a chat whose reply repeats its prompt's words) are the plain worker's, and usage reports the
    proposals in OpenAI's predicted-output fields."""
    m = chat_models(case)
    # the tiny Gemma 4 answers every prompt with one token repeated; penalised, its answers differ but
    # repeat no n-gram the lookup could find: it gets the plain answer as the request's prediction
    penalty = {"gemma4_e2b": 5.0}.get(case, 1.0)
    answers = {}
    drafter = S.draft_model(engine_of(m), m.cfg.vocab_size, SamplerParams(repeat_penalty=penalty), 3, p_min=0.0)
    for name, spec in (("plain", None), ("lookup", S.lookup(4)), ("self-draft", drafter)):
        with serving(m, spec) as client:
            got = []
            for i, text in enumerate(("abcabcabc", "hello hello hello")):
                extra = {}
                if penalty != 1.0:
                    extra["extra_body"] = {"repeat_penalty": penalty}
                    if name == "lookup":
                        extra["prediction"] = {"type": "content", "content": answers["plain"][i]}
                r = ask(client, text, **extra)
                got.append(r.choices[0].message.content)
                details = r.usage.completion_tokens_details
                if spec is None:
                    assert details is None
                else:
                    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
                    if name == "self-draft":
                        assert details.rejected_prediction_tokens == 0 and details.accepted_prediction_tokens > 0
            answers[name] = got
    assert answers["lookup"] == answers["plain"] and answers["self-draft"] == answers["plain"]
    assert len(set(answers["plain"])) == 2


def test_serve_takes_the_prediction_as_lookup_proposals(chat_model):
    """A request's `prediction` feeds the lookup's proposals: predicting the greedy answer leaves the
    text as it is and gets more proposals taken than no prediction or an unrelated one (the
    controls); a server without speculation accepts the field and answers alike."""
    question, n = "Name three colours.", 32
    with serving(chat_model, None) as client:
        answer = ask(client, question, n).choices[0].message.content
        unused = ask(client, question, n, prediction={"type": "content", "content": answer})
        assert unused.choices[0].message.content == answer and unused.usage.completion_tokens_details is None
    assert len(answer) == n  # one character a token: the whole answer is predicted
    with serving(chat_model, S.lookup(8)) as client:
        runs = {name: ask(client, question, n, **({"prediction": {"type": "content", "content": text}} if text else {}))
                for name, text in (("none", None), ("answer", answer), ("unrelated", "~|~|~ 0123456789 ~|~|~"))}
    assert {name: r.choices[0].message.content for name, r in runs.items()} == dict.fromkeys(runs, answer)
    accepted = {name: r.usage.completion_tokens_details.accepted_prediction_tokens for name, r in runs.items()}
    assert accepted["answer"] > max(accepted["none"], accepted["unrelated"]), accepted
    assert accepted["answer"] >= n // 2, accepted


def test_serve_refuses_speculation_on_several_slots(pair):
    _, exc = cli("serve", str(pair[0].source.path), "--lookup-decoding", "--parallel", "2")
    assert isinstance(exc, InputError) and "runs on one slot: drop --parallel 2" in str(exc), exc


# --- a real pair: SmolLM2-135M's bf16 directory, its Q4_1 GGUF drafting -----------------------------

# --- fuel bench --lookup-decoding -------------------------------------------------------------

def test_speculation_bench(pair):
    """--lookup-decoding: both sides decode -n tokens greedily, the same text, a rate each; drafted and
    accepted counted on the speculative side alone."""
    out = json.loads(bench(pair[0].source.path, "--lookup-decoding", "--prompt", "a b c a b c a b c a b", "-n", "12", "-r", "2",
                           "-o", "json", "-t", "1"))
    assert set(out["sides"]) == {"fuel", "fuel lookup"} and out["n"] == 12 and out["repetitions"] == 2
    plain, spec = out["sides"]["fuel"], out["sides"]["fuel lookup"]
    for s in (plain, spec):
        assert len(s["rates"]) == len(s["seconds"]) == 2 and all(r > 0 for r in s["rates"])
        assert s["same_text"] and 2 <= s["generated"] <= 12
        for r, sec in zip(s["rates"], s["seconds"]):
            assert r == pytest.approx((s["generated"] - 1) / sec)
    assert plain["drafted"] == 0 and spec["speedup"] == pytest.approx(spec["mean"] / plain["mean"])
    from fuelcli.measure.speculation import render_md

    md = render_md(out)
    assert "| fuel lookup |" in md and "same text as plain" in md


def test_speculation_bench_draft_model(pair):
    out = json.loads(bench(pair[0].source.path, "--draft-model", pair[1].source.path, "--draft-p-min", "0",
                           "--draft-max", "4", "--prompt", "hello there", "-n", "10", "-r", "1", "-o", "json", "-t", "1"))
    assert set(out["sides"]) == {"fuel", "fuel draft model"} and out["draft"] == str(pair[1].source.path)
    assert out["sides"]["fuel draft model"]["same_text"] and out["sides"]["fuel draft model"]["drafted"] > 0


def test_speculation_bench_reports_a_different_text(pair):
    """The control: a drafter whose verified text differs from plain decoding's is reported as such."""
    from fuelcli.measure import speculation as SB

    engine = engine_of(pair[0], 64)

    class Skewed(S.Speculation):  # its text loses the fourth token
        def steps(self, *a, **k):
            for i, step in enumerate(super().steps(*a, **k)):
                if i != 3:
                    yield step
                else:
                    a[5].tokens.pop()

    sides = SB.runs(engine, [1, 2, 3, 1, 2, 3], 8, set(), lambda: Skewed(S.PromptLookup()), "lookup", 1)
    assert sides["fuel"]["same_text"] and not sides["fuel lookup"]["same_text"]
    assert "| NO |" in SB.render_md({"model": "m", "prompt": "p", "prompt_tokens": 6, "n": 8, "threads": 1,
                                     "repetitions": 1, "sides": sides})


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_dir, smollm2_gguf):
    return open_model(str(smollm2_dir)), open_model(str(smollm2_gguf))


def test_verify_rows_are_decode_steps_bit_for_bit(smollm2_pair):
    """engine.verify's rows (bf16 and Q4_1 products, on the B-wide decode kernels) are the decode steps'
    logits exactly; the negative control: the same tokens through prefill's tiles differ in the last
    bits."""
    rng = np.random.default_rng(0)
    for m in smollm2_pair:
        engine = engine_of(m, 96)
        prompt, extra = rng.integers(0, m.cfg.vocab_size, 40).tolist(), rng.integers(0, m.cfg.vocab_size, 9).tolist()
        engine.prefill(prompt)
        decoded = np.stack([engine.decode(t) for t in extra])
        engine.rewind(len(prompt))
        assert np.array_equal(engine.verify(extra), decoded) and engine.pos == len(prompt) + len(extra)
        assert engine._wide  # 9 rows: on the B-wide decode kernels (4 + 4 + 1; bf16 2 + 2 + 2 + 2 + 1)
        engine.rewind(len(prompt))
        tiles = engine.prefill(extra, all_logits=True)
        assert not np.array_equal(tiles, decoded)
        assert float(np.abs(tiles - decoded).max()) < 0.1  # the same model, other rounding


def test_real_pair_greedy_is_plain_decoding(smollm2_pair, monkeypatch):
    """The Q4_1 file drafting for its bf16 directory (one tokenizer; near one model: most proposals
    taken), the lookup, and the Q4_1 draft under a repetition penalty (a drafter that disagrees: many
    proposals rejected): each the plain greedy text. Negative control: taking the disagreeing
    drafter's proposals unverified changes the text."""
    target, draft = smollm2_pair
    S.check_vocabularies(target.tokenizer, draft.tokenizer, "smollm2 q4_1")
    text = (Path(__file__).parents[1] / "examples" / "prompts" / "code-rewrite.txt").read_text()
    prompt = target.tokenizer.encode_prompt(text, chat=True)
    n_ctx, vocab, p = len(prompt) + 40, target.cfg.vocab_size, SamplerParams(**GREEDY)
    engine = engine_of(target, n_ctx)
    plain, _ = generate_ids(engine, prompt, 32, GREEDY)

    def contrary():
        spec = S.draft_model(engine_of(draft, n_ctx), vocab, p, 4, p_min=0.0)
        spec.drafter.sampler = Sampler(SamplerParams(**GREEDY, repeat_penalty=2.0, repeat_last_n=-1))
        return spec

    for name, spec in (("lookup", S.lookup()), ("draft", S.draft_model(engine_of(draft, n_ctx), vocab, p, 4)),
                       ("contrary draft", contrary())):
        ids, stats = generate_ids(engine, prompt, 32, GREEDY, spec)
        assert ids == plain, name
        assert stats.accepted > 0, name
        if name == "contrary draft":
            assert stats.accepted < stats.drafted
    monkeypatch.setattr(S, "verify", accept_all)
    ids, _ = generate_ids(engine, prompt, 32, GREEDY, contrary())
    assert ids != plain


def test_a_real_draft_of_another_tokenizer_is_refused(smollm2_pair, qwen_coder_gguf):
    qwen = open_model(str(qwen_coder_gguf))
    with pytest.raises(InputError, match=r"--draft-model qwen: its vocabulary has 151936 tokens, the model's 49152"):
        S.check_vocabularies(smollm2_pair[0].tokenizer, qwen.tokenizer, "qwen")
