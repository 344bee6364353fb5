"""A `tokenizers.Tokenizer` built from GGUF `tokenizer.ggml.*` metadata.

Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is built: it is what the Llama-3, Qwen and
SmolLM families ship. The split regex is not in the file; `tokenizer.ggml.pre` names it, so the
regexes below are llama.cpp's (llama-vocab.cpp) for the names fuel knows.
"""

from __future__ import annotations

from functools import lru_cache

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from .errors import InputError
from .tokenizer import Tokenizer
from .native import call_quietly
from .weights.gguf_meta import check_merges

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(regex: str):
    return lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


# tokenizer.ggml.pre -> pre-tokenizer factory
PRE_TOKENIZERS = {
    "qwen2": _split(_QWEN2_SPLIT),
    "deepseek-r1-qwen": _split(_QWEN2_SPLIT),
    "llama-bpe": _split(_LLAMA3_SPLIT),
    "llama3": _split(_LLAMA3_SPLIT),
    "smaug-bpe": _split(_LLAMA3_SPLIT),
    # SmolLM (StarCoder style): every digit alone, then GPT-2's own split (SmolLM2's tokenizer.json).
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    ),
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}

CONTROL, USER_DEFINED = 3, 4


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict:
    """GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise InputError(f"unsupported GGUF tokenizer model {model!r} (supported: gpt2 = byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise InputError(f"unsupported GGUF tokenizer.ggml.pre {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise InputError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")

    # Byte-level vocabularies spell every token in the byte alphabet; respell any that is not
    # (as transformers does) so BPE can reach it.
    alpha = set(_byte_alphabet().values())
    spell = _byte_alphabet()
    vocab = {}
    for i, t in enumerate(tokens):
        if not set(t) <= alpha:
            t = "".join(spell[b] for b in t.encode("utf-8"))
        vocab.setdefault(t, i)
    try:  # tokenizers panics on a merge whose result is no token: diagnose after, not on every start
        bpe = call_quietly(models.BPE, vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], dropout=None,
                           continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    except RuntimeError as e:
        check_merges(vocab, merges)
        raise InputError(f"GGUF tokenizer metadata cannot be built into a BPE tokenizer: {e}") from None
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|>, ...) are matched whole and skipped on decode; user-defined
    # ones are matched whole but kept. A "control" token outside the byte alphabet is a
    # llama.cpp mislabel and is left alone (as transformers does).
    types = meta.get("tokenizer.ggml.token_type") or []
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty == CONTROL and set(t) <= alpha]
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    tok.add_special_tokens(control)
    tok.add_tokens(user)

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return Tokenizer.from_parts(
        tok,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
