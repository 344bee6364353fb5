"""Constrained decoding: a JSON schema, a GBNF or Lark grammar as a token mask in the sampler chain.

The grammar engine is llguidance (an Earley parser over a derivative-based lexer, walking the
vocabulary as a byte trie; the engine behind llama.cpp's `%llguidance` grammars, vLLM's and
SGLang's `guidance` backend). On Qwen2.5-Coder's 151,936-token vocabulary one mask costs tens to a
few hundred microseconds (tests/test_grammar.py; the README's figures), against ~16 ms a decode step.

Each step the matcher writes a bitmask (one bit per token id) and `apply_mask` sets the disallowed
scores to -inf in place, in the float64 scores the chain already copies from the logits once; the
engine's logits (the logprobs' source) are untouched. llguidance allows EOS only where the grammar
may end, so generation ends when the grammar is complete (or at -n tokens, cut short).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import InputError, MissingDependency
from ..process.extras import pip_install

INSTALL = pip_install("grammar")
# llama.cpp's json-schema-to-grammar `space` rule: a space, or one or two newlines and some indent.
# Bounded, so a model cannot pad forever, yet loose enough for the way models lay JSON out.
WHITESPACE = r"( |\n{1,2}[ \t]{0,20})?"


def require():
    """The llguidance module, or MissingDependency (exit 4 / HTTP 400) naming it."""
    try:
        import llguidance
    except ImportError:
        raise MissingDependency(f"constrained decoding (JSON schema, grammar, tool calls) needs llguidance: "
                                f"{INSTALL}") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A grammar in llguidance's serialized form. With `trigger`, the grammar is lazy: nothing is masked
    until the generated text contains the trigger, and the grammar (which starts with it) holds from there."""

    spec: str
    what: str  # for messages: "the JSON schema", "the grammar"
    trigger: str | None = None


def _one_line(message) -> str:
    """llguidance's messages can span lines (a regex error, a caret under the source): one line."""
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip()) or "invalid"


def _check(spec: str, what: str) -> str:
    error = require().LLMatcher.validate_grammar(spec)
    if error:
        raise InputError(f"{what}: {_one_line(error)}")
    return spec


def schema_options(strict: bool = True) -> dict:
    """JsonCompileOptions: bounded whitespace; `strict` refuses keywords llguidance cannot enforce
    (lenient ignores them, as OpenAI's non-strict mode does not promise the schema either)."""
    return {"whitespace_pattern": WHITESPACE, "lenient": not strict}


def json_schema(schema, strict: bool = True, what: str = "the JSON schema", after: str | None = None) -> Grammar:
    """`after`: the grammar holds only once this text has come (a reasoning model's </think>)."""
    if not isinstance(schema, (dict, bool)):
        raise InputError(f"{what} must be a JSON object (or true/false), got {type(schema).__name__}")
    llg = require()
    if after is not None:
        body = schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
        return lark(f"start: {json.dumps(after)} /[ \t\n]*/ body\nbody: %json "
                    f"{json.dumps({**body, 'x-guidance': schema_options(strict)})}\n", what, trigger=after)
    try:
        spec = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=schema_options(strict))
    except (ValueError, TypeError) as e:
        raise InputError(f"{what}: {_one_line(e)}") from None
    return Grammar(_check(spec, what), what)


def json_object(after: str | None = None) -> Grammar:
    """OpenAI's JSON mode: any JSON object."""
    return json_schema({"type": "object"}, what="response_format json_object", after=after)


def gbnf(text: str, what: str = "the grammar") -> Grammar:
    """A GBNF grammar (llama.cpp's format; llguidance's Lark syntax is accepted too)."""
    llg = require()
    try:
        spec = llg.grammar_from("gbnf", text)
    except (ValueError, TypeError, KeyError, IndexError) as e:  # its GBNF converter is Python: parse errors vary
        raise InputError(f"{what}: {_one_line(e)}") from None
    return Grammar(_check(spec, what), what)


def lark(text: str, what: str, trigger: str | None = None) -> Grammar:
    spec = require().LLMatcher.grammar_from_lark(text)
    return Grammar(_check(spec, what), what, trigger)


# --- the vocabulary ------------------------------------------------------------------------------

_TOKENIZERS: dict = {}  # (id(tokenizer), n_vocab, eos ids) -> (tokenizer, LLTokenizer): built once (~1.5 s on 150k)


def ll_tokenizer(tokenizer, n_vocab: int, eos_ids):
    """llguidance's view of fuel's tokenizer: each id's bytes (token_bytes.py, so every tokenizer fuel
    builds works, not only those llguidance can read from tokenizer.json), the special ids, the EOS ids.
    Ids past the tokenizer's vocabulary (padded embedding rows) are never allowed."""
    eos = sorted(int(i) for i in eos_ids)
    key = (id(tokenizer), n_vocab, tuple(eos))
    if key not in _TOKENIZERS:
        from .token_bytes import TokenBytes

        llg = require()
        tb = TokenBytes(tokenizer)
        n = min(tokenizer.vocab_size, n_vocab)

        class Vocabulary:  # llguidance.TokenizerWrapper's protocol
            eos_token_id = eos[0] if eos else tokenizer.eos_token_id
            bos_token_id = tokenizer.bos_token_id
            tokens = [tb.bytes_of(i) for i in range(n)]
            special_token_ids = [i for i in range(n) if tokenizer.is_special(i)]

            def __call__(self, text: str) -> list[int]:
                return tokenizer.encode(text, add_special_tokens=False, parse_special=False)

        _TOKENIZERS[key] = (tokenizer, llg.LLTokenizer(llg.TokenizerWrapper(Vocabulary()), n_vocab=n_vocab,
                                                       eos_token=eos or None))
    return _TOKENIZERS[key][1]


# --- the mask ------------------------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def apply_mask(scores, bitmask):
    """scores[i] = -inf where bit i of the bitmask is clear, in place. A whole word allowed is
    skipped and a whole word refused is a straight run of stores, so a mask costs 12-30 us on 152k
    float64 scores here; numpy's unpackbits + boolean store costs 90-180 us."""
    n = scores.size
    full = n // 32
    for w in range(full):
        word = bitmask[w]
        if word == -1:
            continue
        base = w * 32
        if word == 0:
            for b in range(32):
                scores[base + b] = -np.inf
            continue
        for b in range(32):
            if not (word >> b) & 1:
                scores[base + b] = -np.inf
    for i in range(full * 32, n):
        if not (bitmask[i >> 5] >> (i & 31)) & 1:
            scores[i] = -np.inf


class Constraint:
    """One generation's matcher: mask() before a token is drawn, accept() after."""

    def __init__(self, grammar: Grammar, tokenizer, n_vocab: int, eos_ids):
        llg = require()
        self.grammar = grammar
        self._tok = ll_tokenizer(tokenizer, n_vocab, eos_ids)
        self.matcher = llg.LLMatcher(self._tok, grammar.spec, log_level=0)
        if self.matcher.is_error():
            raise InputError(f"{grammar.what}: {_one_line(self.matcher.get_error())}")
        self.bitmask = np.full((n_vocab + 31) // 32, -1, dtype=np.int32)
        self.active = grammar.trigger is None
        self._trigger = grammar.trigger.encode() if grammar.trigger else b""
        self._pending: list[int] = []  # lazy: the tokens not yet matched, at most a trigger's length back

    def mask(self, scores: np.ndarray) -> None:
        """Disallowed tokens' scores to -inf, in place (scores: float64 [n_vocab])."""
        if not self.active:
            return
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        if self.matcher.is_error():
            raise InputError(f"{self.grammar.what}: {_one_line(self.matcher.get_error())}")
        apply_mask(scores, self.bitmask)

    def accept(self, token: int) -> None:
        if self.active:
            if not self.matcher.consume_token(int(token)):
                raise InputError(f"{self.grammar.what}: {_one_line(self.matcher.get_error())}")
            return
        self._pending.append(int(token))
        text = self._tok.decode_bytes(self._pending)
        at = text.find(self._trigger)
        if at < 0:
            while len(self._pending) > 1 and len(self._tok.decode_bytes(self._pending[1:])) >= len(self._trigger):
                self._pending.pop(0)
            return
        # The trigger has appeared: the grammar holds from its first byte. The text from there is fed
        # as tokens of its own (a trigger inside a longer token leaves no token boundary to start at).
        self.active = True
        ids = self._tok.tokenize_bytes(text[at:])
        if not self.matcher.consume_tokens(ids):
            raise InputError(f"{self.grammar.what}: {_one_line(self.matcher.get_error())}")
