"""Sampler, stop strings and generate() on hand-made logits, a fake engine and a fake tokenizer."""

import numpy as np
import pytest

from fuelcli.errors import InputError
from fuelcli.text.generate import Sampler, SamplerParams, Stats, StopMatcher, generate

OFF = dict(top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)  # every processor off


def dist(probs=None, logits=None, history=(), **kw):
    """The sampler's final distribution for `logits` (or log `probs`) with only the given processors."""
    logits = np.log(np.asarray(probs, dtype=np.float64)) if logits is None else np.asarray(logits, float)
    return Sampler(SamplerParams(**{"temp": 1.0, **OFF, **kw})).probs(logits, list(history))


def kept(**kw):
    return set(np.flatnonzero(dist(**kw)).tolist())


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, flag", [
    ("temp", -0.1, "--temp"), ("temp", float("nan"), "--temp"), ("top_k", -1, "--top-k"),
    ("top_p", 0.0, "--top-p"), ("top_p", 1.5, "--top-p"), ("min_p", -0.1, "--min-p"),
    ("min_p", 2.0, "--min-p"), ("repeat_penalty", 0.0, "--repeat-penalty"),
    ("repeat_penalty", -1.0, "--repeat-penalty"), ("repeat_last_n", -2, "--repeat-last-n"),
    ("seed", -1, "--seed"),
])
def test_invalid_params_raise_input_error_naming_the_flag(field, value, flag):
    with pytest.raises(InputError) as e:
        SamplerParams(**{field: value})
    assert str(e.value).startswith(flag + " ") and "\n" not in str(e.value)


def test_boundary_params_are_valid():
    SamplerParams(temp=0, top_k=0, top_p=1.0, min_p=0.0, repeat_last_n=-1, seed=0)
    SamplerParams(min_p=1.0, repeat_last_n=0, seed=None, repeat_penalty=0.5)


# --- processors -------------------------------------------------------------------------------

def test_greedy_is_argmax_whatever_the_other_processors():
    logits = np.array([0.1, 3.0, -2.0, 2.9])
    s = Sampler(SamplerParams(temp=0, top_k=1, top_p=0.1, min_p=0.9, seed=0))
    assert all(s(logits, []) == 1 for _ in range(5))


def test_temperature_scales_logits():
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    for t in (0.5, 1.0, 2.0):
        want = np.exp(logits / t) / np.exp(logits / t).sum()
        np.testing.assert_allclose(dist(logits=logits, temp=t), want, rtol=1e-12)


def test_top_k_keeps_exactly_k_even_with_ties():
    assert kept(logits=[0.0, 5.0, 3.0, 4.0, 1.0], top_k=2) == {1, 3}
    # four-way tie at the 2nd value: exactly 2 survive, the tie going to the lowest ids
    assert kept(logits=[1.0, 2.0, 1.0, 1.0, 1.0], top_k=2) == {0, 1}
    assert kept(logits=[1.0, 2.0, 3.0], top_k=3) == {0, 1, 2}  # k >= vocab: off
    p = dist(logits=[0.0, 5.0, 3.0, 4.0, 1.0], top_k=2)
    np.testing.assert_allclose(p[[1, 3]], np.exp([5.0, 4.0]) / np.exp([5.0, 4.0]).sum())


def test_top_p_keeps_smallest_prefix_reaching_the_mass():
    probs = [0.2, 0.5, 0.3]
    assert kept(probs=probs, top_p=0.5) == {1}          # exact boundary: 0.5 alone reaches 0.5
    assert kept(probs=probs, top_p=0.8) == {1, 2}       # exact boundary: 0.5 + 0.3 reaches 0.8
    assert kept(probs=probs, top_p=0.81) == {0, 1, 2}
    assert kept(probs=probs, top_p=0.01) == {1}         # always at least one token
    np.testing.assert_allclose(dist(probs=probs, top_p=0.8)[[1, 2]], [0.625, 0.375])
    # 0.7 + 0.2 sums to 0.8999999999999999 in floats; it still reaches 0.9
    assert kept(probs=[0.7, 0.2, 0.1], top_p=0.9) == {0, 1}


def test_min_p_is_relative_to_the_top_probability():
    probs = [0.5, 0.3, 0.15, 0.05]
    assert kept(probs=probs, min_p=0.3) == {0, 1, 2}    # threshold 0.15: 0.15 itself survives
    assert kept(probs=probs, min_p=0.31) == {0, 1}
    assert kept(probs=[0.1] * 10, min_p=0.9) == set(range(10))  # flat: nothing is below 0.9 x top


def test_processor_order():
    """llama.cpp's chain: penalty -> top-k -> top-p -> min-p -> temperature; each case changes if
    two steps swap (test_sampling_chain.py pins whole distributions)."""
    # penalty before top-k: the penalised token 0 drops out of the top 2
    assert kept(logits=[3.0, 2.0, 1.0], history=[0], repeat_penalty=4.0, top_k=2) == {1, 2}
    # top-p before temperature: token 0 alone (0.6 at t=1) covers 0.6 whatever the temperature;
    # transformers' order (t=3 first flattens it to 0.44) would keep {0, 1}
    probs = [0.6, 0.3, 0.1]
    assert kept(probs=probs, top_p=0.6) == kept(probs=probs, top_p=0.6, temp=3.0) == {0}
    # min-p before temperature: 0.2 < 0.5 x 0.5 is dropped at any temperature; at t=3 first it would survive
    assert kept(probs=[0.5, 0.3, 0.2], min_p=0.5, temp=3.0) == {0, 1}
    # top-k before top-p: top-p sees the renormalised top 2 (4/7 >= 0.5), not 0.4 < 0.5
    assert kept(probs=[0.4, 0.3, 0.2, 0.1], top_k=2, top_p=0.5) == {0}
    # top-p before min-p: top-p keeps {0, 1}; min-p first would drop 2 and renormalise, and then
    # top-p would keep {0} alone (0.625 >= 0.6)
    assert kept(probs=[0.5, 0.3, 0.2], top_p=0.6, min_p=0.5) == {0, 1}


def test_min_keep():
    """As llama.cpp: top-p and min-p keep at least min_keep tokens, the most likely ones."""
    probs = [0.7, 0.2, 0.06, 0.04]
    assert kept(probs=probs, top_p=0.5) == {0} and kept(probs=probs, top_p=0.5, min_keep=3) == {0, 1, 2}
    assert kept(probs=probs, min_p=0.5) == {0} and kept(probs=probs, min_p=0.5, min_keep=2) == {0, 1}
    assert kept(probs=probs, top_p=0.5, min_keep=9) == {0, 1, 2, 3}  # more than there are: all


def test_repetition_penalty():
    logits = np.array([4.0, -4.0, 4.0, -4.0, 1.0])

    def pen(last_n, history):
        return Sampler(SamplerParams(repeat_penalty=2.0, repeat_last_n=last_n)).penalize(logits, history)

    # positive divided, negative multiplied; tokens 0 and 2 are older than the last 3 and untouched;
    # token 3 is penalised once although it occurs twice
    np.testing.assert_array_equal(pen(3, [0, 2, 3, 1, 3]), [4.0, -8.0, 4.0, -8.0, 1.0])
    np.testing.assert_array_equal(pen(-1, [0, 1, 1]), [2.0, -8.0, 4.0, -4.0, 1.0])  # -1: whole context
    np.testing.assert_array_equal(pen(0, [0, 1]), logits)                             # 0: off
    assert logits[0] == 4.0  # the caller's array is not modified


def test_same_seed_same_draws_different_seed_different_draws():
    logits = np.zeros(1000)  # uniform: every draw is up to the rng

    def draws(seed):
        s = Sampler(SamplerParams(temp=1.0, **OFF, seed=seed))
        return [s(logits, []) for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_samples_follow_the_distribution():
    s = Sampler(SamplerParams(temp=1.0, **OFF, seed=0))
    logits = np.log([0.7, 0.2, 0.1])
    counts = np.bincount([s(logits, []) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)


# --- stop strings -----------------------------------------------------------------------------

def run_matcher(stops, pieces):
    m, out = StopMatcher(stops), []
    for piece in pieces:
        text, hit = m.feed(piece)
        out.append(text)
        if hit:
            return out, True
    return out + [m.flush()], False


def test_stop_split_across_pieces():
    out, hit = run_matcher(["END"], ["abc E", "N", "D tail"])
    assert hit and "".join(out) == "abc "
    assert out[:2] == ["abc ", ""]  # "E" and "EN" were held back, not emitted


def test_held_back_text_is_flushed_without_a_match():
    out, hit = run_matcher(["END"], ["abc E", "N"])
    assert not hit and out == ["abc ", "", "EN"]
    out, hit = run_matcher(["END"], ["xEN", "d"])  # a near miss releases the held text
    assert not hit and "".join(out) == "xENd"


def test_earliest_of_several_stops_wins():
    assert StopMatcher(["b", "a"]).feed("xab") == ("x", True)
    assert StopMatcher(["a", "b"]).feed("xab") == ("x", True)
    assert StopMatcher(["world", "lo w"]).feed("hello world") == ("hel", True)


# --- generate() -------------------------------------------------------------------------------

class FakeEngine:
    """Emits a scripted token sequence as one-hot logits."""

    def __init__(self, script, vocab=8, n_ctx=100):
        self.script, self.vocab, self.n_ctx, self.pos, self.decodes = list(script), vocab, n_ctx, 0, 0

    def _next(self):
        logits = np.zeros(self.vocab, np.float32)
        logits[self.script.pop(0)] = 10.0
        return logits

    def prefill(self, ids):
        self.pos = len(ids)
        return self._next()[None]

    def decode(self, token):
        self.pos += 1
        self.decodes += 1
        return self._next()


class FakeTokenizer:
    pieces = ["<eos>", "a", "b", "E", "N", "D", " ", "c"]

    def stream(self, skip_special_tokens=False):
        tok = self

        class Stream:
            def push(self, t):
                return tok.pieces[t]

            def flush(self):
                return ""

        return Stream()


def run(script, max_tokens=50, stops=()):
    engine, stats = FakeEngine(script), Stats()
    greedy = Sampler(SamplerParams(temp=0))
    text = "".join(generate(engine, FakeTokenizer(), [1, 2], max_tokens, greedy, {0}, list(stops), stats))
    return text, stats, engine


def test_generate_counts_decode_steps_on_eos():
    text, stats, engine = run([1, 2, 7, 0])
    assert text == "abc" and stats.stop_reason == "eos"
    # the EOS came from the third decode call: 3 decode steps for 3 generated tokens
    assert stats.generated == 3 and stats.decode_steps == engine.decodes == 3


def test_generate_counts_decode_steps_on_max_tokens():
    text, stats, engine = run([1, 2, 7, 1, 2], max_tokens=3)
    assert text == "abc" and stats.stop_reason == "max tokens"
    assert stats.decode_steps == engine.decodes == 2


def test_stats_line_uses_decode_steps():
    stats = Stats(prompt_tokens=10, prefill_s=0.5, generated=3, decode_steps=3, decode_s=1.5)
    assert "prompt: 10 tokens, 20.0 tok/s" in stats.line(0)
    assert "generated: 3 tokens, 2.0 tok/s" in stats.line(0)


def test_generate_stop_string_across_tokens():
    text, stats, _ = run([1, 3, 4, 5, 6, 7, 0], stops=["END"])
    assert text == "a" and stats.stop_reason == "stop string"


def test_generate_flushes_held_text_at_eos():
    text, stats, _ = run([1, 3, 4, 0], stops=["END"])
    assert text == "aEN" and stats.stop_reason == "eos"


def test_stop_option_escapes_like_llama_cli():
    from fuelcli.cli.options import unescape as _unescape

    assert _unescape(r"\n\n") == "\n\n" and _unescape(r"a\tb\\n") == "a\tb\\n" and _unescape("日本\\") == "日本\\"


def test_extreme_temperatures_give_defined_distributions():
    """A temperature near 0 is greedy and the largest finite one uniform over the survivors: no
    overflow from dividing by a subnormal, no warning on stderr; an infinite one is refused."""
    import warnings

    logits = np.array([1.0, 3.0, 2.0, -1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = Sampler(SamplerParams(temp=1e-310, top_k=0, top_p=1.0, min_p=0.0)).probs(logits, [])
        flat = Sampler(SamplerParams(temp=1.7e308, top_k=2, top_p=1.0, min_p=0.0)).probs(logits, [])
    assert tiny.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert flat.tolist() == [0.0, 0.5, 0.5, 0.0]
    with pytest.raises(InputError, match="--temp"):
        SamplerParams(temp=float("inf"))
